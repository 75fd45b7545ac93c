"""The authoritative in-memory usage ledger: quotas, claims, and each quota's usage.

Neighbours: `quota.admission.admitter` prices a claim and, for `dra-quota check`, calls
`Ledger.admit` (the webhook checks against the reservations persisted on DeviceQuota
status instead, `kube.quotawriter`, with this ledger's usage); the claim cache
(`kube.claimstore`) and `dra-quota check` feed claims through `add_or_update_claim`, each
an `Entry` (`quota.accounting.ledgerentry`, which also adds entries up into a quota's usage). Shaped
like kueue's cache (pkg/cache): synchronous methods with no await inside, so on the
event loop each mutation is atomic without locks; each returns the quotas it touched.
Usage is kept incrementally: a claim event adjusts only the quotas of its namespace
(its DeviceQuotas and the ClusterDeviceQuotas selecting it, `quota.accounting.teams`), and a quota
event whose scope (pricing mode, device classes) did not change keeps its quota's usage,
so recomputing from scratch is never needed after the list. A ClusterDeviceQuota's key
is `(Namespace(""), name)`; the Namespaces' labels (`set_namespace`) say which
namespaces it selects, and a relabel moves one namespace's usage in or out at once.
With `defer_recounts` (`serve`), a team's part that no quota of the same scope already
counts is counted later, in slices (`quota.accounting.teams.Recount`, `kube.recounts`), and no
admission or allocation is decided on that team meanwhile (`recounting`).

A relist of the claims is built aside and swapped in with one synchronous step
(`quota.accounting.claimsrebuild.ClaimsRebuild`, which reaches into this ledger's tables).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from quota.accounting.ledgerentry import ClaimRef, Entry, add_usage, sum_usage, usage_scope
from quota.accounting.teams import Recount, Teams
from quota.quotas.devicequota import CLUSTER_KIND, KIND, Decision, DeviceQuota, QuotaCheck, Usage, check, in_force
from quota.quotas.windows import admission_change_after
from quota.values.model import ZERO, Charge, Mode, Namespace
from quota.values.work import paced

__all__ = ["RECOUNT_PAUSE_EVERY", "QuotaKey", "Ledger", "recounting_message", "shown"]

QuotaKey = tuple[Namespace, str]
# Claims counted between two pause points of a recount (`quota.values.work.paced`): ~0.5-1 ms, so
# that a slice (`runtime.slicing.SLICE`, 2 ms) ends near its time.
RECOUNT_PAUSE_EVERY = 64


class Ledger:
    def __init__(self, *, default_mode: Mode = "conservative") -> None:
        self.default_mode: Mode = default_mode
        self._quotas: dict[Namespace, dict[str, DeviceQuota]] = {}
        self._usage: dict[QuotaKey, Usage] = {}
        self._entries: dict[ClaimRef, Entry] = {}
        self._by_namespace: dict[Namespace, dict[ClaimRef, Entry]] = {}
        # Moves on every claim change of the namespace: readers deriving views from its
        # claims (the usage metrics) cache on it.
        self._namespace_generation: dict[Namespace, int] = {}
        # Admitted Kueue Workloads (`quota.accounting.workloads`): their price per ref (the Workload's
        # uid), which Pods are theirs (Pod uid -> Workload ref), and the claims per Pod.
        self._holdings: dict[Namespace, dict[ClaimRef, Entry]] = {}
        # The same holdings by ref: `holding` and `counts` are asked per reservation entry
        # and per admitted claim, so they must not walk every namespace.
        self._holding_by_ref: dict[ClaimRef, Entry] = {}
        self._pod_workload: dict[str, ClaimRef] = {}
        self._workload_pods: dict[ClaimRef, set[str]] = {}
        self._by_owner: dict[str, set[ClaimRef]] = {}
        # While a `ClaimsRebuild` is built: the claims changed in the live ledger since it began.
        self._touched: set[ClaimRef] | None = None
        # ClusterDeviceQuotas, the Namespaces' labels, and each team's usage per member.
        self._teams = Teams()
        # Told each time a team's part is left to a `Recount` (None: parts are counted at once).
        self._deferred: Callable[[], None] | None = None
        self._recount_every = RECOUNT_PAUSE_EVERY
        # Quotas with windows are checked against the `hard` in force (`in_force`) by this
        # clock (seconds since the epoch), allowing for replicas' clocks differing by up to
        # `clock_skew` seconds. None: `spec.hard` (`dra-quota check` applies windows itself).
        self.clock: Callable[[], float] | None = None
        self.clock_skew = 0.0
        # Per quota: (the quota as given, valid from, valid until, the quota in force):
        # computed again only when the spec or the limits in force change.
        self._in_force: dict[QuotaKey, tuple[DeviceQuota, float, float, DeviceQuota]] = {}
        # Told each claim counted in (+1) or out (-1), and when a relist replaced every
        # claim at once (`quota.accounting.claimsrebuild`): what derives a view over time from the
        # claims (`quota.accounting.showback`) follows them without walking the ledger.
        self.observer: Callable[[Entry, int], None] | None = None
        self.replaced: Callable[[], None] | None = None
        # Moves on every change to which quotas apply to some namespace, or to one of
        # them (`quotas`): readers deriving a per-namespace view of them cache on it.
        self.quotas_generation = 0

    # -- quotas -------------------------------------------------------------------

    def add_or_update_quota(self, quota: DeviceQuota) -> tuple[QuotaKey, ...]:
        """A DeviceQuota added or changed: its usage counted from the namespace's claims,
        unless what its usage depends on (`usage_scope`) is unchanged: every admission's status
        write comes back through the watch, and a recount costs every claim of the
        namespace (150,000 of them in the benchmarks' largest)."""
        self.quotas_generation += 1
        if quota.cluster:
            self._teams.put_quota(quota, self._count_in)
            return ((quota.namespace, quota.name),)
        per_ns = self._quotas.setdefault(quota.namespace, {})
        old = per_ns.get(quota.name)
        per_ns[quota.name] = quota
        key = (quota.namespace, quota.name)
        if old is None or usage_scope(old) != usage_scope(quota) or key not in self._usage:
            self._usage[key] = self._count(quota, self._by_namespace.get(quota.namespace, {}).values())
        return (key,)

    def _count(self, quota: DeviceQuota, entries: Iterable[Entry]) -> Usage:
        return sum_usage(entries, quota, self.default_mode)

    def _count_in(self, quota: DeviceQuota, namespace: Namespace) -> Usage | Recount:
        """Team `quota`'s part of `namespace` (a relabel into it, or the team created or
        reselecting). Any quota already counting the namespace's claims with the same
        `usage_scope` counts the same: its number is taken, not the claims walked again
        (a pass over a namespace of 150,000 claims holds the event loop ~2 s); else the
        claims are counted, at once or later (`defer_recounts`)."""
        scope = usage_scope(quota)
        for other in self._quotas.get(namespace, {}).values():
            if usage_scope(other) == scope and (key := (namespace, other.name)) in self._usage:
                return self._usage[key]
        for other in self._teams.selecting(namespace):
            if other.name != quota.name and usage_scope(other) == scope and \
                    not self._teams.recounting_part(other.name, namespace):
                return self._teams.part(other.name, namespace)
        return self._recount_of(quota, namespace, self._by_namespace.get(namespace, {}).values())

    def _recount_of(self, quota: DeviceQuota, namespace: Namespace, entries: Iterable[Entry]) -> Usage | Recount:
        """`quota`'s count of `entries` (a namespace's claims): now, or a `Recount` over
        them as they are now (a list of the same frozen entries: ~1 ms for 150,000)."""
        if self._deferred is None:
            return self._count(quota, entries)
        snapshot: Sequence[Entry] = list(entries)
        self._deferred()
        return Recount(quota, namespace, lambda: self._count(quota, paced(snapshot, self._recount_every)))

    def defer_recounts(self, due: Callable[[], None] | None, *, every: int = RECOUNT_PAUSE_EVERY) -> None:
        """From now on a team's part is counted by `recount` (a pause point every `every`
        claims), `due` told each time one is left to it (None: at once again)."""
        self._deferred, self._recount_every = due, every

    def recount(self) -> tuple[QuotaKey, ...]:
        """Count the teams' parts left to it (pausing, `quota.values.work`); the keys of the teams
        now counted whole."""
        return tuple((Namespace(""), name) for name in self._teams.recount())

    def recounts_due(self) -> bool:
        return bool(self._teams.recounts())

    def recounting(self, name: str) -> bool:
        """Whether team `name`'s usage is partial, a part still to be counted (module doc)."""
        return self._teams.recounting(name)

    def delete_quota(self, namespace: Namespace, name: str) -> tuple[QuotaKey, ...]:
        self._in_force.pop((namespace, name), None)
        self.quotas_generation += 1
        if not namespace:
            return ((namespace, name),) if self._teams.drop_quota(name) else ()
        if self._quotas.get(namespace, {}).pop(name, None) is None:
            return ()
        self._usage.pop((namespace, name), None)
        return ((namespace, name),)

    def quota(self, namespace: Namespace, name: str) -> DeviceQuota | None:
        if not namespace:
            return self._teams.quota(name)
        return self._quotas.get(namespace, {}).get(name)

    def keys(self, namespace: Namespace) -> tuple[QuotaKey, ...]:
        """The keys of the quotas of `namespace`: its own, then the teams selecting it."""
        return (*((namespace, name) for name in self._quotas.get(namespace, {})),
                *((q.namespace, q.name) for q in self._teams.selecting(namespace)))

    def quotas(self, namespace: Namespace | None = None) -> list[DeviceQuota]:
        """The quotas a claim of `namespace` must fit: its DeviceQuotas, then the
        ClusterDeviceQuotas selecting it, by name. None: every quota of both kinds."""
        if namespace is not None:
            return [*self._quotas.get(namespace, {}).values(), *self._teams.selecting(namespace)]
        return [*(q for per_ns in self._quotas.values() for q in per_ns.values()), *self._teams.quotas()]

    def usage(self, namespace: Namespace, name: str) -> Usage:
        """The claims' usage plus what admitted Workloads still hold (in `reserved`); a
        team's (`namespace` ""): the totals over its member namespaces."""
        if not namespace:
            quota = self._teams.quota(name)
            usage = self._teams.total(name)
            return usage if quota is None else self._held(usage, quota, [
                ns for ns, held in self._holdings.items() if held and self._teams.selects(name, ns)])
        usage = self._usage.get((namespace, name), Usage())
        quota = self._quotas.get(namespace, {}).get(name)
        return usage if quota is None else self._held(usage, quota, [namespace])

    def usage_in(self, name: str, namespace: Namespace) -> Usage:
        """One member namespace's part of team `name`'s usage (its Workloads' holdings included)."""
        quota = self._teams.quota(name)
        usage = self._teams.part(name, namespace)
        return usage if quota is None or not self._teams.selects(name, namespace) else \
            self._held(usage, quota, [namespace])

    def has_teams(self) -> bool:
        """Whether any ClusterDeviceQuota exists."""
        return self._teams.exist()

    def knows_namespace(self, namespace: Namespace) -> bool:
        """Whether `namespace`'s labels were set here: until they are, which teams select
        it is unknown (a namespace created a moment ago), and a decision must wait."""
        return self._teams.knows(namespace)

    def members(self, name: str) -> tuple[Namespace, ...]:
        """The namespaces team `name` selects, of those the ledger knows (sorted)."""
        return self._teams.members(name)

    def _held(self, usage: Usage, quota: DeviceQuota, namespaces: Iterable[Namespace]) -> Usage:
        held = sum((self._left(h, quota) for ns in namespaces for h in self._holdings.get(ns, {}).values()), ZERO)
        return usage if held.is_zero() else replace(usage, reserved=usage.reserved + held, workloads=held)

    # -- namespaces -----------------------------------------------------------------

    def set_namespace(self, namespace: Namespace, labels: Mapping[str, str]) -> tuple[QuotaKey, ...]:
        """`namespace` exists with `labels`: the keys of the teams it joined or left."""
        self.quotas_generation += 1
        moved = self._teams.set_namespace(namespace, dict(labels), self._count_in)
        return tuple((Namespace(""), name) for name in moved)

    def delete_namespace(self, namespace: Namespace) -> tuple[QuotaKey, ...]:
        self.quotas_generation += 1
        return tuple((Namespace(""), name) for name in self._teams.delete_namespace(namespace))

    # -- Kueue Workloads ------------------------------------------------------------

    def set_holding(self, entry: Entry) -> tuple[QuotaKey, ...]:
        """An admitted Workload holds `entry` (its price), keyed by the Workload's uid."""
        self._holdings.setdefault(entry.namespace, {})[entry.ref] = entry
        self._holding_by_ref[entry.ref] = entry
        return self._touch(entry.namespace)

    def drop_holding(self, ref: ClaimRef) -> tuple[QuotaKey, ...]:
        old = self._holding_by_ref.pop(ref, None)
        if old is None:
            return ()
        self._holdings.get(old.namespace, {}).pop(ref, None)
        return self._touch(old.namespace)

    def holding(self, ref: ClaimRef) -> Entry | None:
        return self._holding_by_ref.get(ref)

    def holdings_in(self, namespace: Namespace) -> Iterable[Entry]:
        return self._holdings.get(namespace, {}).values()

    def counts(self, ref: ClaimRef) -> bool:
        """Whether this ledger counts `ref`: a claim it holds, or an admitted Workload."""
        return ref in self._entries or self.holding(ref) is not None

    def set_pod(self, pod: str, workload: ClaimRef | None) -> tuple[QuotaKey, ...]:
        """Pod uid `pod` belongs to `workload` (None: to none, or the Pod is gone); the
        quotas of the holdings it left or joined (its claims draw on those)."""
        old = self._pod_workload.pop(pod, None)
        if old is not None:
            self._workload_pods.get(old, set()).discard(pod)
        if workload is not None:
            self._pod_workload[pod] = workload
            self._workload_pods.setdefault(workload, set()).add(pod)
        held = [h.namespace for ref in (old, workload) if ref is not None and (h := self.holding(ref)) is not None]
        return tuple(key for namespace in dict.fromkeys(held) for key in self.keys(namespace))

    def knows_pod(self, pod: str) -> bool:
        return pod in self._pod_workload

    def uncovered(self, entry: Entry, quota: DeviceQuota) -> Charge:
        """What `entry` adds to `quota`'s usage: its charge less what its Workload still
        holds for it (a claim of a Pod of an admitted Workload draws on that holding)."""
        charge = entry.charge_for(quota, self.default_mode)
        workload = self._pod_workload.get(entry.owner) if entry.owner else None
        holding = self.holding(workload) if workload is not None else None
        if holding is None:
            return charge
        left = self._left(holding, quota, without=entry.ref)
        return Charge(max(charge.memory - left.memory, 0), max(charge.devices - left.devices, 0))

    def _left(self, holding: Entry, quota: DeviceQuota, *, without: ClaimRef | None = None) -> Charge:
        """max(0, price - the charges of the Workload's matched claims), per resource."""
        price = holding.charge_for(quota, self.default_mode)
        drawn = ZERO
        for pod in self._workload_pods.get(holding.ref, ()):
            for ref in self._by_owner.get(pod, ()):
                if ref != without and (claim := self._entries.get(ref)) is not None:
                    drawn = drawn + claim.charge_for(quota, self.default_mode)
        return Charge(max(price.memory - drawn.memory, 0), max(price.devices - drawn.devices, 0))

    def _touch(self, namespace: Namespace) -> tuple[QuotaKey, ...]:
        self._namespace_generation[namespace] = self._namespace_generation.get(namespace, 0) + 1
        return self.keys(namespace)

    # -- claims -------------------------------------------------------------------

    def add_or_update_claim(self, entry: Entry) -> tuple[QuotaKey, ...]:
        if self._touched is not None:
            self._touched.add(entry.ref)
        old = self._entries.get(entry.ref)
        touched = self._apply(old, -1) if old is not None else ()
        self._entries[entry.ref] = entry
        self._by_namespace.setdefault(entry.namespace, {})[entry.ref] = entry
        if entry.owner:
            self._by_owner.setdefault(entry.owner, set()).add(entry.ref)
        return tuple(dict.fromkeys((*touched, *self._apply(entry, +1))))

    def delete_claim(self, ref: ClaimRef) -> tuple[QuotaKey, ...]:
        if self._touched is not None:
            self._touched.add(ref)
        old = self._entries.pop(ref, None)
        if old is None:
            return ()
        self._by_namespace.get(old.namespace, {}).pop(ref, None)
        if old.owner and (claims := self._by_owner.get(old.owner)) is not None:
            claims.discard(ref)
            if not claims:
                del self._by_owner[old.owner]
        return self._apply(old, -1)

    def release(self, ref: ClaimRef) -> tuple[QuotaKey, ...]:
        """Drop `ref`'s reservation; an allocated claim keeps counting until it is gone.

        A DELETE of an allocated claim only marks it for deletion: its devices stay in
        use until the pod stops and the claim is deallocated (the delete-protection
        finalizer, k/k pkg/controller/resourceclaim/controller.go), so only the
        controller's view of the claim disappearing may end its `used` charge.
        """
        old = self._entries.get(ref)
        if old is None or old.allocated:
            return ()
        return self.delete_claim(ref)

    def entry(self, ref: ClaimRef) -> Entry | None:
        return self._entries.get(ref)

    def entries(self) -> Iterable[Entry]:
        return self._entries.values()

    def counted(self, ref: ClaimRef, quota: DeviceQuota) -> tuple[Charge, Charge]:
        """What claim `ref` adds to `quota`'s usage, as (used, reserved): its entry's charge
        where the quota counts the claim's namespace (`_apply`), less the part of its
        Workload's holding it draws on, which `usage` would count again without the claim
        (`uncovered`; the reserved part may then be negative)."""
        entry = self._entries.get(ref)
        if entry is None:
            return ZERO, ZERO
        if quota.cluster:
            counts = any(q.name == quota.name for q in self._teams.selecting(entry.namespace))
        else:
            counts = quota.namespace == entry.namespace
        if not counts:
            return ZERO, ZERO
        charge = entry.charge_for(quota, self.default_mode)
        drawn = charge - self.uncovered(entry, quota)
        return (charge, ZERO - drawn) if entry.allocated else (ZERO, charge - drawn)

    def namespaces(self) -> Iterable[Namespace]:
        """The namespaces holding at least one claim."""
        return [ns for ns, entries in self._by_namespace.items() if entries]

    def entries_in(self, namespace: Namespace) -> Iterable[Entry]:
        return self._by_namespace.get(namespace, {}).values()

    def namespace_generation(self, namespace: Namespace) -> int:
        """Moves whenever a claim of `namespace` changes."""
        return self._namespace_generation.get(namespace, 0)

    def in_force(self, quota: DeviceQuota) -> DeviceQuota:
        """`quota` with the `hard` admission checks now (`quota.quotas.devicequota.in_force`): with
        windows and a clock, per resource the smallest `hard` in force within `clock_skew`
        of the clock; else `quota` itself. Give it a quota as parsed, not one it returned."""
        if not quota.windows or self.clock is None:
            return quota
        now = self.clock()
        key = (quota.namespace, quota.name)
        cached = self._in_force.get(key)
        if cached is not None and cached[1] <= now < cached[2] and cached[0] == quota:
            return cached[3]
        at, skew = datetime.fromtimestamp(now, UTC), timedelta(seconds=self.clock_skew)
        checked = in_force(quota, at, skew)
        change = admission_change_after(quota.hard, quota.windows, at, skew)
        # None: no change within 400 days: look again in a day (a schedule too dense to walk
        # that far gives the instant to look again instead, `admission_change_after`).
        self._in_force[key] = (quota, now, now + 86400 if change is None else change.timestamp(), checked)
        return checked

    def admit(self, entry: Entry, *, dry_run: bool = False) -> Decision:
        """Check `entry` against every quota of its namespace and reserve it if it fits.

        Check and reserve happen in one synchronous step: two admissions can never both
        see the same headroom. A retry for the same ref replaces its earlier reservation
        instead of counting twice.
        """
        previous = self._entries.get(entry.ref)
        checks = []
        for quota in self.quotas(entry.namespace):
            usage = self.usage(quota.namespace, quota.name)
            if previous is not None:
                usage = add_usage(usage, previous, quota, self.default_mode, -1)
            checks.append(QuotaCheck(self.in_force(quota), usage, self.uncovered(entry, quota)))
        decision = self._unsettled(checks) or check(checks, namespace=entry.namespace)
        if decision.allowed and not dry_run:
            self.add_or_update_claim(entry)
        return decision

    def allocate(self, entry: Entry, *, enforce: bool, dry_run: bool = False,
                 persisted: Collection[QuotaKey] = ()) -> Decision:
        """Replace `entry.ref`'s reservation with `entry`, its exact (allocated) charge.

        Only growth past what the claim holds is checked: per quota the excess of the
        exact charge over the reservation must fit (`used + reserved + excess <= hard`,
        the reservation being part of `reserved`). An allocation within its reservation
        always passes, even under a quota already over `hard`: blocking it would stall
        the scheduler on capacity the claim already holds. With `enforce` false the
        entry is accounted whatever the decision says (account-only). `persisted`: the
        quotas whose excess the webhook reserved in their persisted record
        (`quota.accounting.excess`): not checked again (the webhook accounts nothing here, `dry_run`:
        that record counts the excess until the claim watch brings the allocated claim).
        """
        excess = self.excess(entry, over=(self._entries.get(entry.ref),))
        checks = [QuotaCheck(self.in_force(q), self.usage(q.namespace, q.name), excess[q])
                  for q in self.quotas(entry.namespace) if (q.namespace, q.name) not in persisted]
        decision = self._unsettled(checks) or check(checks, namespace=entry.namespace)
        if (decision.allowed or not enforce) and not dry_run:
            self.add_or_update_claim(entry)
        return decision

    def excess(self, entry: Entry, *, over: Sequence[Entry | None]) -> dict[DeviceQuota, Charge]:
        """Per quota of `entry`'s namespace, what its exact charge adds to the least any of
        `over` holds for its claim (the ledger's entry for it, what the reviewed copy
        reserves, what its record says: `Admitter.excess_to_persist`; None holds nothing),
        per resource (never below zero)."""
        out = {}
        for quota in self.quotas(entry.namespace):
            held = [e.charge_for(quota, self.default_mode) if e is not None else ZERO for e in over]
            least = held[0]
            for charge in held[1:]:
                least = least.min(charge)
            out[quota] = (entry.charge_for(quota, self.default_mode) - least).max(ZERO)
        return out

    def _unsettled(self, checks: Iterable[QuotaCheck]) -> Decision | None:
        """A refusal while a team the charge counts against is still being recounted: its
        usage is partial, and a decision on it could pass `hard` (fail closed)."""
        busy = [c.quota.name for c in checks if c.quota.cluster and c.quota.enforcement != "Audit"
                and not c.charge.is_zero() and self._teams.recounting(c.quota.name)]
        return Decision(False, "; ".join(map(recounting_message, busy))) if busy else None

    def _apply(self, entry: Entry, sign: int) -> tuple[QuotaKey, ...]:
        # Every claim change passes here.
        self._namespace_generation[entry.namespace] = self._namespace_generation.get(entry.namespace, 0) + 1
        if self.observer is not None:
            self.observer(entry, sign)
        touched = []
        for quota in self._quotas.get(entry.namespace, {}).values():
            key = (entry.namespace, quota.name)
            self._usage[key] = add_usage(self._usage.get(key, Usage()), entry, quota, self.default_mode, sign)
            touched.append(key)
        for quota in self._teams.selecting(entry.namespace):
            self._teams.add(quota.name, entry.namespace, add_usage(Usage(), entry, quota, self.default_mode, sign))
            touched.append((quota.namespace, quota.name))
        return tuple(touched)


def shown(key: QuotaKey) -> str:
    """How logs and messages name a quota: `DeviceQuota team-a/gpus`, `ClusterDeviceQuota ml-team`."""
    return f"{KIND} {key[0]}/{key[1]}" if key[0] else f"{CLUSTER_KIND} {key[1]}"


def recounting_message(name: str) -> str:
    return (f'{CLUSTER_KIND} "{name}" is being recounted (its namespaceSelector, scope or members changed): '
            "no claim is decided against it until its usage is whole again; retry")
