"""Team quotas (ClusterDeviceQuotas): which namespaces each selects, and each one's part.

Neighbours: `quota.ledger.Ledger` owns one `Teams` and keeps it current as claims, quotas
and Namespaces come and go (it prices; this module only adds up); `quota.labelselector`
matches a Namespace's labels. Synchronous and pure, like the ledger.

A team's usage is kept per member namespace (its *part*: what the team's scope sees of
that namespace's claims) and as a total, both incrementally: a claim event adds its
delta to the part and the total of every team selecting its namespace; a Namespace
relabelled into a team adds its part (counted once by the ledger's `Count`, or taken
from a quota already counting it the same way), out of it takes
the part away. The parts are the per-namespace breakdown of the team's status.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from quota.devicequota import NAME_LABEL, DeviceQuota, Usage
from quota.model import Namespace

__all__ = ["Count", "Teams", "plus"]

# The usage a team's quota sees of one namespace's claims, counted from scratch.
Count = Callable[[DeviceQuota, Namespace], Usage]


def plus(a: Usage, b: Usage, sign: int = 1) -> Usage:
    """`a + sign * b`, field by field."""
    return Usage(
        used=a.used + b.used if sign > 0 else a.used - b.used,
        reserved=a.reserved + b.reserved if sign > 0 else a.reserved - b.reserved,
        allocated_claims=a.allocated_claims + sign * b.allocated_claims,
        pending_claims=a.pending_claims + sign * b.pending_claims,
        workloads=a.workloads + b.workloads if sign > 0 else a.workloads - b.workloads,
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

    # -- claims -----------------------------------------------------------------------

    def add(self, name: str, namespace: Namespace, delta: Usage) -> None:
        """A claim of member `namespace` changed the team's part by `delta`."""
        parts = self._parts[name]
        parts[namespace] = plus(parts[namespace], delta)
        self._totals[name] = plus(self._totals[name], delta)

    def replace_parts(self, parts: Mapping[str, Mapping[Namespace, Usage]]) -> None:
        """After a relist of the claims (`quota.claimsrebuild.ClaimsRebuild`): every member's part
        counted again; the totals follow."""
        for name, members in self._parts.items():
            for namespace in members:
                members[namespace] = parts.get(name, {}).get(namespace, Usage())
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
        part = count(quota, namespace)
        self._parts[quota.name][namespace] = part
        self._totals[quota.name] = plus(self._totals[quota.name], part)
        self._selecting.setdefault(namespace, {})[quota.name] = quota

    def _leave(self, name: str, namespace: Namespace) -> None:
        part = self._parts[name].pop(namespace)
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
