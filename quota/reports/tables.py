"""Plain-text tables of the command line: `check`'s and `top`'s, and `demo`'s live usage.

Neighbours: `commands.cli` and `commands.demo` print what these return or write; `quota.status.published`
gives the per-quota objects `usage_cells` and `top_tables` read. Every cell goes through
`quota.reports.printable.for_terminal`, so one row stays one line whatever a name holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from quota.reports.printable import for_terminal
from quota.values.quantity import format_quantities

__all__ = ["USAGE_HEADERS", "print_rows", "top_tables", "usage_cells"]

USAGE_HEADERS = ("MEMORY used/reserved/hard", "DEVICES used/reserved/hard")
Rows = list[tuple[str, ...]]


def usage_cells(quota: dict[str, Any], keys: Sequence[str] = ("used", "reserved", "hard")) -> tuple[str, str]:
    """`used / reserved / hard` per resource of one per-quota JSON object (check's or top's); "-" for none.
    The memory cell has one unit (`format_quantities`)."""
    values = [quota[key].get("memory") for key in keys]
    shown = iter(format_quantities([v for v in values if v is not None]))
    memory = " / ".join("-" if v is None else next(shown) for v in values)
    devices = " / ".join("-" if (v := quota[key].get("devices")) is None else str(v) for key in keys)
    return memory, devices


def top_tables(quotas: Sequence[dict[str, Any]], now: datetime | None = None) -> tuple[Rows, Rows]:
    """`top`'s two tables, headers included: the DeviceQuotas, then the ClusterDeviceQuotas,
    each a `(total)` row and one row per namespace of its breakdown (its part: used and
    reserved; the team's hard is on the total). A team read from its applied copy says, on
    its total, how long ago its totals were read (as of `now`)."""
    claims = "CLAIMS allocated/pending"
    namespaced: Rows = [("NAMESPACE", "QUOTA", *USAGE_HEADERS, claims, "STATUS")]
    teams: Rows = [("CLUSTERDEVICEQUOTA", "NAMESPACE", *USAGE_HEADERS, claims, "STATUS")]
    for q in quotas:
        if not q["namespace"]:
            state = ", ".join(filter(None, (_state(q), _as_of(q, now))))
            teams.append((q["name"], "(total)", *usage_cells(q), _claims(q), state))
            teams.extend((q["name"], part["namespace"], *usage_cells(part, ("used", "reserved")), _claims(part), "")
                         for part in q["namespaces"])
        else:
            namespaced.append((q["namespace"], q["name"], *usage_cells(q), _claims(q), _state(q)))
    return namespaced, teams


def _claims(row: dict[str, Any]) -> str:
    return " / ".join("-" if (n := row["claims"][k]) is None else str(n) for k in ("allocated", "pending"))


def _state(quota: dict[str, Any]) -> str:
    state = "Exceeded" if quota["exceeded"] else ""
    if quota.get("window"):
        state = ", ".join(filter(None, (state, f"window {quota['window']}")))
    if not quota["current"]:
        state = ", ".join(filter(None, (state, "not counted yet (no status for this spec generation)")))
    return state


def _as_of(quota: dict[str, Any], now: datetime | None) -> str:
    """"team totals as of 40s ago (refreshed within 60s of a change)" for an applied copy."""
    stamp = quota.get("observedAt")
    if now is None or not isinstance(stamp, str):
        return ""
    try:
        read = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return ""
    refresh = quota.get("refreshSeconds")
    within = f" (refreshed within {_age(refresh)} of a change)" if isinstance(refresh, int) else ""
    return f"team totals as of {_age((now - read).total_seconds())} ago{within}"


def _age(seconds: float) -> str:
    """kubectl's way: 40s, 3m, 2h, 5d."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def print_rows(rows: Sequence[Sequence[str]], out: TextIO, *, indent: str = "") -> None:
    # The last column (details) is free text and is not padded. Every cell is escaped:
    # one row per object, whatever its name or reason holds.
    rows = [[for_terminal(cell) for cell in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        out.write(indent + "  ".join((*cells, row[-1])).rstrip() + "\n")
