"""Plain-text tables of the command line: `check`'s and `top`'s, and `demo`'s live usage.

Neighbours: `commands.cli` and `commands.demo` print what these return or write; `quota.top`
gives the per-quota objects `usage_cells` reads. Every cell goes through
`quota.printable.for_terminal`, so one row stays one line whatever a name holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

from quota.devicequota import format_amount
from quota.printable import for_terminal

__all__ = ["USAGE_HEADERS", "print_rows", "usage_cells"]

USAGE_HEADERS = ("MEMORY used/reserved/hard", "DEVICES used/reserved/hard")


def usage_cells(quota: dict[str, Any]) -> tuple[str, str]:
    """`used / reserved / hard` per resource of one per-quota JSON object (check's or top's); "-" for none."""
    memory, devices = (
        " / ".join("-" if (v := quota[key].get(resource)) is None else format_amount(resource, v)
                   for key in ("used", "reserved", "hard"))
        for resource in ("memory", "devices")
    )
    return memory, devices


def print_rows(rows: Sequence[Sequence[str]], out: TextIO, *, indent: str = "") -> None:
    # The last column (details) is free text and is not padded. Every cell is escaped:
    # one row per object, whatever its name or reason holds.
    rows = [[for_terminal(cell) for cell in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        out.write(indent + "  ".join((*cells, row[-1])).rstrip() + "\n")
