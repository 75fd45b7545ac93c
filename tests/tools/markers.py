"""The generated section of a checked-in page: what lies between its two marker lines.

The reference pages (docs/api.md, docs/configuration.md, the chart's README) hold one
generated section each and prose around it; a test compares the section with what its tool
renders, and the tool rewrites it in place.
"""

from __future__ import annotations

from pathlib import Path


def section(page: Path, begin: str, end: str) -> str:
    """The markers and what lies between them."""
    text = page.read_text()
    start, stop = text.index(begin), text.index(end) + len(end)
    return text[start:stop]


def rewrite(page: Path, begin: str, end: str, rendered: str) -> None:
    """Replace the markers and what lies between them with `rendered` (which holds both)."""
    text = page.read_text()
    start, stop = text.index(begin), text.index(end) + len(end)
    page.write_text(text[:start] + rendered + text[stop:])


def cell(text: str) -> str:
    """`text` as one Markdown table cell: on one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")
