"""Team quotas (ClusterDeviceQuotas): which namespaces each selects, and each one's part.

Neighbours: `quota.accounting.ledger.Ledger` owns one `Teams` and keeps it current as claims, quotas
and Namespaces come and go (it prices; this module only adds up); `quota.values.labelselector`
matches a Namespace's labels. Synchronous and pure, like the ledger.

A team's usage is kept per member namespace (its *part*: what the team's scope sees of
that namespace's claims) and as a total, both incrementally: a claim event adds its
delta to the part and the total of every team selecting its namespace; a Namespace
relabelled into a team adds its part (counted once by the ledger's `Count`, or taken
from a quota already counting it the same way), out of it takes
the part away. The parts are the per-namespace breakdown of the team's status.

A part may also be counted later (`Recount`): where `serve` runs, counting a namespace
of 150,000 claims at once held the event loop 1.2-2.1 s (bench/stalls.py), so the ledger
hands back a `Recount` over the namespace's claims as they were when it joined, which
`kube.recounts` runs in slices. Meanwhile the part starts at zero and every claim event
adds its delta as usual; the recount's sum, added once it ends, makes the part exact (a
part is a sum, and each event's delta is taken from a claim either in that snapshot or
added by an earlier event). Until then the team is `recounting`: its totals are partial,
and nothing may decide on them (`quota.accounting.ledger.Ledger.recounting`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from quota.quotas.devicequota import NAME_LABEL, DeviceQuota, Usage
from quota.values.model import Namespace
from quota.values.work import pause_point

__all__ = ["Count", "Recount", "Teams", "plus"]


@dataclass(frozen=True, eq=False, slots=True)
class Recount:
    """Team `quota`'s part of `namespace`, still to be counted: `count()` sums the
    namespace's claims as they were when it joined (it may pause, `quota.values.work`); compared
    by identity, so a recount started again replaces this one (module doc)."""

    quota: DeviceQuota
    namespace: Namespace
    count: Callable[[], Usage]


# The usage a team's quota sees of one namespace's claims, counted from scratch, or a
# `Recount` that will count it.
Count = Callable[[DeviceQuota, Namespace], Usage | Recount]


def plus(a: Usage, b: Usage, sign: int = 1) -> Usage:
    """`a + sign * b`, field by field."""
    return Usage(
        used=a.used + b.used if sign > 0 else a.used - b.used,
        reserved=a.reserved + b.reserved if sign > 0 else a.reserved - b.reserved,
        allocated_claims=a.allocated_claims + sign * b.allocated_claims,
        pending_claims=a.pending_claims + sign * b.pending_claims,
        workloads=a.workloads + b.workloads if sign > 0 else a.workloads - b.workloads,
        unmetered_claims=a.unmetered_claims + sign * b.unmetered_claims,
    )


class Teams:
    def __init__(self) -> None:
        self._quotas: dict[str, DeviceQuota] = {}
        # Every Namespace the ledger was told of, with its labels.
        self._labels: dict[Namespace, Mapping[str, str]] = {}
        # name -> member namespace -> part; a member with no claims has an empty part.
        self._parts: dict[str, dict[Namespace, Usage]] = {}
        self._totals: dict[str, Usage] = {}
        # namespace -> the teams selecting it (the reverse of `_parts`), by name.
        self._selecting: dict[Namespace, dict[str, DeviceQuota]] = {}
        # name -> member -> the recount its part waits for (module doc).
        self._recounts: dict[str, dict[Namespace, Recount]] = {}

    # -- reading ----------------------------------------------------------------------

    def quota(self, name: str) -> DeviceQuota | None:
        return self._quotas.get(name)

    def exist(self) -> bool:
        return bool(self._quotas)

    def quotas(self) -> list[DeviceQuota]:
        return [self._quotas[name] for name in sorted(self._quotas)]

    def selecting(self, namespace: Namespace) -> list[DeviceQuota]:
        """The team quotas selecting `namespace`, by name."""
        teams = self._selecting.get(namespace)
        return [teams[name] for name in sorted(teams)] if teams else []

    def knows(self, namespace: Namespace) -> bool:
        """Whether the ledger was told `namespace`'s labels (which teams select it)."""
        return namespace in self._labels

    def selects(self, name: str, namespace: Namespace) -> bool:
        return name in self._selecting.get(namespace, ())

    def members(self, name: str) -> tuple[Namespace, ...]:
        return tuple(sorted(self._parts.get(name, {})))

    def total(self, name: str) -> Usage:
        return self._totals.get(name, Usage())

    def part(self, name: str, namespace: Namespace) -> Usage:
        return self._parts.get(name, {}).get(namespace, Usage())

    # -- recounts (module doc) -----------------------------------------------------------

    def recounting(self, name: str) -> bool:
        """Whether some member's part of team `name` waits for its recount: the totals are partial."""
        return bool(self._recounts.get(name))

    def recounting_part(self, name: str, namespace: Namespace) -> bool:
        return namespace in self._recounts.get(name, ())

    def recounts(self) -> list[Recount]:
        """The recounts due, oldest team first."""
        return [job for jobs in self._recounts.values() for job in jobs.values()]

    def recount(self) -> list[str]:
        """Run the recounts due, those falling due meanwhile too (each may pause; what
        changes meanwhile is `settle`'s to sort out); the teams whose every part is
        counted now."""
        done = []
        while self._recounts:
            job = next(iter(next(iter(self._recounts.values())).values()))
            if self.settle(job, job.count()) and not self.recounting(job.quota.name):
                done.append(job.quota.name)
            pause_point()  # between two namespaces too: a team of many small ones
        return list(dict.fromkeys(done))

    def settle(self, job: Recount, counted: Usage) -> bool:
        """`job` counted `counted`: added to its part, unless the job was replaced or
        dropped meanwhile (the namespace left, the team changed or was counted again)."""
        jobs = self._recounts.get(job.quota.name, {})
        if jobs.get(job.namespace) is not job:
            return False
        del jobs[job.namespace]
        if not jobs:
            del self._recounts[job.quota.name]
        self.add(job.quota.name, job.namespace, counted)
        return True

    def _pend(self, quota: DeviceQuota, namespace: Namespace, part: Usage | Recount) -> Usage:
        """The part to start from: `part`, or zero while its `Recount` is due."""
        jobs = self._recounts.get(quota.name)
        if jobs is not None:
            jobs.pop(namespace, None)
        if isinstance(part, Usage):
            if jobs is not None and not jobs:
                del self._recounts[quota.name]
            return part
        self._recounts.setdefault(quota.name, {})[namespace] = part
        return Usage()

    # -- claims -----------------------------------------------------------------------

    def add(self, name: str, namespace: Namespace, delta: Usage) -> None:
        """A claim of member `namespace` changed the team's part by `delta`."""
        parts = self._parts[name]
        parts[namespace] = plus(parts[namespace], delta)
        self._totals[name] = plus(self._totals[name], delta)

    def replace_parts(self, parts: Mapping[str, Mapping[Namespace, Usage | Recount]]) -> None:
        """After a relist of the claims (`quota.accounting.claimsrebuild.ClaimsRebuild`): every member's part
        counted again, or to be recounted from the new claims; the totals follow."""
        for name, members in self._parts.items():
            quota = self._quotas[name]
            for namespace in members:
                members[namespace] = self._pend(quota, namespace, parts.get(name, {}).get(namespace, Usage()))
            self._totals[name] = sum_usage(members.values())

    # -- quotas and namespaces ----------------------------------------------------------

    def put_quota(self, quota: DeviceQuota, count: Count) -> None:
        """A team quota added or changed: its members and parts counted again (its
        selector or scope may have changed; status writes keep both, and skip this)."""
        old = self._quotas.get(quota.name)
        self._quotas[quota.name] = quota
        if old is not None and old.selector == quota.selector and (old.mode, old.scope) == (quota.mode, quota.scope):
            for namespace in self._parts[quota.name]:
                self._selecting[namespace][quota.name] = quota
            return
        self._leave_all(quota.name)
        self._parts[quota.name] = {}
        self._totals[quota.name] = Usage()
        for namespace, labels in self._labels.items():
            if self._selects(quota, namespace, labels):
                self._join(quota, namespace, count)

    def drop_quota(self, name: str) -> bool:
        if self._quotas.pop(name, None) is None:
            return False
        self._leave_all(name)
        del self._parts[name], self._totals[name]
        self._recounts.pop(name, None)
        return True

    def set_namespace(self, namespace: Namespace, labels: Mapping[str, str], count: Count) -> tuple[str, ...]:
        """`namespace` has `labels` now: the teams it joined or left."""
        self._labels[namespace] = labels
        before = self._selecting.get(namespace, {})
        moved = []
        for name, quota in self._quotas.items():
            selects = self._selects(quota, namespace, labels)
            if selects and name not in before:
                self._join(quota, namespace, count)
                moved.append(name)
            elif not selects and name in before:
                self._leave(name, namespace)
                moved.append(name)
        return tuple(sorted(moved))

    def delete_namespace(self, namespace: Namespace) -> tuple[str, ...]:
        if self._labels.pop(namespace, None) is None:
            return ()
        moved = sorted(self._selecting.get(namespace, {}))
        for name in moved:
            self._leave(name, namespace)
        return tuple(moved)

    @staticmethod
    def _selects(quota: DeviceQuota, namespace: Namespace, labels: Mapping[str, str]) -> bool:
        # The API server sets the name label on every Namespace; a Namespace read from a
        # file (`dra-quota check`) may not carry it.
        assert quota.selector is not None
        return quota.selector.matches(labels if NAME_LABEL in labels else {**labels, NAME_LABEL: namespace})

    def _join(self, quota: DeviceQuota, namespace: Namespace, count: Count) -> None:
        part = self._pend(quota, namespace, count(quota, namespace))
        self._parts[quota.name][namespace] = part
        self._totals[quota.name] = plus(self._totals[quota.name], part)
        self._selecting.setdefault(namespace, {})[quota.name] = quota

    def _leave(self, name: str, namespace: Namespace) -> None:
        part = self._parts[name].pop(namespace)
        jobs = self._recounts.get(name)
        if jobs is not None and jobs.pop(namespace, None) is not None and not jobs:
            del self._recounts[name]
        self._totals[name] = plus(self._totals[name], part, -1)
        teams = self._selecting[namespace]
        del teams[name]
        if not teams:
            del self._selecting[namespace]

    def _leave_all(self, name: str) -> None:
        for namespace in list(self._parts.get(name, ())):
            self._leave(name, namespace)


def sum_usage(usages: Iterable[Usage]) -> Usage:
    total = Usage()
    for usage in usages:
        total = plus(total, usage)
    return total
