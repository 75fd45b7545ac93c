"""Text from user input made safe to print: the table, stderr and the JSON report.

Neighbours: the `commands` modules escape every table cell and every message they write to
a terminal with `for_terminal`; `quota.reports.check` cleans the JSON report with `for_json`.
Names are validated by the parsers, but reasons and warnings quote user input (CEL
messages, file paths, annotations), so output never trusts them: a newline or an ANSI
escape in a cell would forge a row or rewrite the screen, a bidi override would reorder
what the reader sees, and a lone surrogate (JSON "\\ud800") cannot be encoded at all.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["for_terminal", "for_json"]

# C0/C1 controls and DEL; bidi marks, embeddings, overrides and isolates; zero-width
# and other invisible format characters; line/paragraph separators; surrogates.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\u3164\ufe00-\ufe0f\ufeff\ufff9-\ufffb\ud800-\udfff]"
)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def for_terminal(text: str) -> str:
    """`text` with every control, invisible or unpaired character shown as an escape.

    A CEL issue (cel-go's format, which the API server's messages share: `ERROR:
    <input>:1:15: Syntax error: ...` then ` | <source line>` and ` | ....^`) is first
    folded onto its line as `... in 'device.driver == '`: its newlines would otherwise
    print as `\\x0a`, and a table row or warning must stay one line."""
    return _UNSAFE.sub(_escape, _CEL_SNIPPET.sub(_fold, text))


# The source line and caret that follow a CEL issue (`quota.cel.selector`): the
# position is already in the issue (`<input>:line:column`).
_CEL_SNIPPET = re.compile(r"\n \| ([^\n]*)\n \| \.*\^")


def _fold(match: re.Match[str]) -> str:
    return f" in {match.group(1).strip()!r}"


def for_json(value: Any) -> Any:
    """A JSON-ready value whose strings hold no lone surrogate (each becomes U+FFFD).

    `json.dumps` would write them as `\\ud800` escapes, which strict decoders refuse:
    the report must decode everywhere.
    """
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {for_json(k): for_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [for_json(v) for v in value]
    return value
