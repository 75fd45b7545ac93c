"""Which of a team's AppliedClusterDeviceQuotas to write now, and why: the rule that makes a
tenant's claim cost one copy write, whatever the number of member namespaces. Pure.

Neighbours: `quota.status.applied` builds each member's copy; `controllers.applied` keeps what
is there (`Copy`), asks `plan` at each round of a team and sends what it returns.

A copy holds two things that move at different speeds. Its own part (`status.namespace`,
and its owner) moves only with this namespace's claims: written whenever it differs
(`own`), so one claim event writes one copy. The team's totals (`hard`, `used`,
`reserved`, `headroom`, `claims`, `exceeded`, `counted`) move with every member's claims:
were each copy written when they move, one claim in a team of M namespaces would cost M
writes. So they are written along with an own write, and otherwise refreshed:
- `spec`: at once, when what an admin did changed them: the team's generation (hard,
  selector, enforcement, scope) or whether it is counted, or its members (a namespace
  joined or left: the copies there are not the members, which also covers a new team and
  a copy deleted by hand);
- `refresh`: once `refresh` seconds have passed since the copy's totals were written; or
  sooner when the team flipped (became or stopped being exceeded, or a limit's headroom
  reached or left 0), but such an early refresh at most once per `refresh` seconds per
  team (`flip_allowed`), so a tenant moving a claim back and forth at the edge costs the
  team's members one write each per period at most, never per flip; and at most
  `max_refresh` refreshes a round, the longest stale first, the rest in the next rounds.
A copy whose content is what the team would write is never written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from quota.values.raw import Obj, as_map

__all__ = ["Copy", "Plan", "Reason", "REASONS", "copy_of", "plan"]

Reason = Literal["own", "refresh", "spec", "delete"]
REASONS: tuple[Reason, ...] = ("own", "refresh", "spec", "delete")

# Status fields that say when the totals were read, not what they are: a copy that
# differs only there is current.
_STAMPS = ("teamObservedAt",)
# Totals fields only an admin moves: a copy that differs there is refreshed at once.
_SPEC = ("teamGeneration", "counted")


@dataclass(frozen=True, slots=True)
class Copy:
    """One member's copy as it is on the API server."""
    owners: tuple[Any, ...]  # its ownerReferences' uids
    own: Any  # status.namespace
    totals: Any  # the rest of its status but the stamps (a dict, compared whole)
    refreshed: float  # when its totals were read, on the controller's clock


def copy_of(body: Obj, refreshed: float) -> Copy:
    owners = as_map(body.get("metadata")).get("ownerReferences") or []
    status = as_map(body.get("status"))
    totals = {k: v for k, v in status.items() if k != "namespace" and k not in _STAMPS}
    return Copy(tuple(as_map(o).get("uid") for o in owners), status.get("namespace"), totals, refreshed)


@dataclass(frozen=True, slots=True)
class Plan:
    writes: dict[str, Reason]  # member namespace -> why its copy is written now
    deletes: tuple[str, ...]  # namespaces whose copy goes (they left the team)
    flipped: bool  # an early refresh for a flip was spent (the caller starts its period)
    due: float | None  # when a copy left stale may be refreshed (None: none is stale)


def plan(desired: Mapping[str, Obj], have: Mapping[str, Copy], *, now: float, refresh: float,
         flip_allowed: bool, max_refresh: int) -> Plan:
    """What to write of one team, whose copies should be `desired` (member namespace ->
    body) and are `have` (namespace -> `Copy`); at most `max_refresh` refreshes, the
    longest stale first (the rest are due at once: the next round), so that a big team's
    refresh is spread over rounds and the own writes of every team get in between."""
    wanted = {ns: copy_of(body, now) for ns, body in desired.items()}
    membership_changed = wanted.keys() != have.keys()
    flip = flip_allowed and any(c.totals != wanted[ns].totals and _flips(c.totals) != _flips(wanted[ns].totals)
                                for ns, c in have.items() if ns in wanted)
    writes: dict[str, Reason] = {}
    refreshes: list[tuple[float, str]] = []
    due: float | None = None
    for ns, want in sorted(wanted.items()):
        there = have.get(ns)
        if there is None or there.owners != want.owners or there.own != want.own:
            writes[ns] = "spec" if membership_changed else "own"
        elif there.totals == want.totals:
            continue
        elif membership_changed or any(there.totals.get(k) != want.totals.get(k) for k in _SPEC):
            writes[ns] = "spec"
        elif flip or now >= there.refreshed + refresh:
            refreshes.append((there.refreshed, ns))
        else:
            due = min(due if due is not None else float("inf"), there.refreshed + refresh)
    refreshes.sort()
    writes.update((ns, "refresh") for _, ns in refreshes[:max_refresh])
    if len(refreshes) > max_refresh:
        due = now
    return Plan(writes, tuple(sorted(ns for ns in have if ns not in wanted)), flip, due)


def _flips(totals: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a flip changes: exceeded, and which limits have no headroom left."""
    headroom = as_map(totals.get("headroom"))
    return totals.get("exceeded"), tuple(sorted(r for r, v in headroom.items() if v in (0, "0")))
