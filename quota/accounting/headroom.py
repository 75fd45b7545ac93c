"""Leases: a chunk of a DeviceQuota's headroom one `serve` process admits claims against locally.

Neighbours: `quota.accounting.reservationrecord` holds the record, `quota.accounting.reservations`
the watermark protocol (a lease is one more entry of `status.reservations`, `source: Lease`);
`kube.quotawriter` keeps this process's leases, calls `take` on a claim CREATE and, through
`kube.statuswriter`, `renew` inside each status write it makes of a quota, and commits the plan
once the write landed.
Pure: no clock, no I/O. docs/development/reservations.md ("Leases") holds the safety argument; in short:

- A lease is written like any entry, by a conditional write that checked
  `used + reserved + in flight + amount <= hard`. Every writer counts every lease's
  whole amount as in flight (no other writer knows what its holder admitted under it),
  and drops one only once it expired (the orphan rule).
- Its holder admits a claim under it with no write iff what it admitted under it, not yet
  settled, plus the claim's charge fits the amount (`take`), and only until `until`
  (written at + period); the entry expires at written at + period + the reservation TTL,
  which outlasts any create admitted before `until` plus any replica's watch lag.
- Settling (`renew`, in the holder's next write of that quota): a claim admitted under
  it that the holder's claim cache holds with its charge recorded, or saw deleted,
  leaves the lease (amount minus its charge) and `claimsThrough` rises to the
  resourceVersion that showed it: the same watermark argument as a single entry's.
- Sizing: a chunk is a `share` of the free headroom, taken only while `keep_free` of
  `hard` stays free after it; nearer `hard`, the lease shrinks to what it admitted and
  not settled, and every admission takes the exact path (one entry per claim).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from quota.accounting.excess import parse_allocation_key
from quota.accounting.reservationrecord import MAX_ENTRIES, Record, Reservation
from quota.accounting.reservations import Caches, Outcome, Request, apply, claim_settled, in_flight
from quota.quotas.devicequota import RESOURCES, Decision, DeviceQuota, Usage
from quota.values.model import ZERO, Charge
from quota.values.quantity import format_quantity

__all__ = ["LEASE_PREFIX", "Lease", "Plan", "Sizing", "SpecVersion", "landed", "leasable", "newer", "renew",
           "settleable", "take", "untake", "writing"]

LEASE_PREFIX = "lease."


@dataclass(frozen=True, slots=True)
class Sizing:
    period: float = 5.0  # seconds a lease is admitted against after a write; 0: no leases
    share: float = 0.25  # of the free headroom one chunk takes
    keep_free: float = 0.5  # of `hard` that must stay free once the chunk is taken

    @property
    def margin(self) -> float:
        """How long before its window ends a live holder renews (or releases) its lease."""
        return self.period / 5


@dataclass(frozen=True, slots=True)
class SpecVersion:
    """Which quota object, and which of its specs: its uid and `metadata.generation`.

    The API server moves a CRD's generation on every change of its spec (the status
    subresource's writes leave it), so an edit undone is a new generation although its
    spec compares equal to the old one. A lease is good only on the version it was
    granted on: the room it holds was checked against that spec's `hard` by that
    object's record, and a spec in between (Audit, a wider scope, a higher `hard`) may
    have admitted claims that room never counted."""

    uid: str = ""
    generation: int = 0


def newer(known: SpecVersion | None, version: SpecVersion) -> SpecVersion:
    """What a replica has seen of a quota once it sees `version` too: the highest
    generation of one object; another uid (deleted, created again) replaces it."""
    if known is None or known.uid != version.uid:
        return version
    return known if known.generation >= version.generation else version


@dataclass(frozen=True, slots=True)
class Lease:
    """This process's lease on one quota, as its last landed write left it."""

    key: str  # the entry's key in status.reservations
    holder: str  # the process, for people reading the status
    quota: DeviceQuota  # the spec it was granted under: another spec stops local admissions
    amount: Charge = ZERO  # as written
    admitted: Mapping[str, tuple[Charge, float]] = field(default_factory=dict)  # uid -> (charge, at), unsettled
    until: float = 0.0  # local admissions end then
    expires: float = 0.0
    # While a write that shrinks the lease is in flight: the room it leaves (None: `amount`).
    limit: Charge | None = None
    taken: int = 0  # local admissions since the last landed write
    unit: Charge = ZERO  # the largest charge it was sized for: a chunk is whole multiples of it
    # The sum of `admitted`'s charges, kept beside it (`_admitting`): `take` runs on every
    # create's path, and summing a backlog of a thousand claims there cost 1-2 ms each.
    total: Charge = ZERO
    # The object it was granted on: once its holder has seen a later one, it admits nothing.
    version: SpecVersion = SpecVersion()

    def consumed(self, *, without: str = "") -> Charge:
        held = self.admitted.get(without)
        return self.total if held is None else self.total - held[0]


def _admitting(lease: Lease, admitted: Mapping[str, tuple[Charge, float]], *, taken: int = 0) -> Lease:
    """`lease` with `admitted` (and `taken`), its total summed afresh: once per write."""
    return replace(lease, admitted=admitted, total=sum((c for c, _ in admitted.values()), ZERO), taken=taken)


@dataclass(frozen=True, slots=True)
class Plan:
    """What a write of the quota's status does to the lease: the book once it lands."""

    lease: Lease | None
    settled: frozenset[str]  # uids that leave the lease with this write
    limit: Charge  # room for local admissions while the write is in flight
    stale: bool = False  # built on an object older than the book: it may land only by a write (it will not)
    fresh: bool = False  # a new lease, nothing of an old book in it


def leasable(quota: DeviceQuota, sizing: Sizing) -> bool:
    """DeviceQuotas that enforce; teams' quotas and Audit keep one entry per admission, and
    so do quotas with windows: a lease's room was sized on the `hard` in force when it was
    granted, which a window's boundary may lower while the lease is held."""
    return sizing.period > 0 and not quota.cluster and not quota.windows and quota.enforcement == "Enforce" and any(
        quota.hard.get(r) is not None for r in RESOURCES)


def _fits(quota: DeviceQuota, total: Charge, charge: Charge, room: Charge) -> bool:
    # As `quota.quotas.devicequota.check`: a dimension the charge does not touch, or the quota
    # does not limit, never refuses.
    return all(quota.hard.get(r) is None or charge.amount(r) <= 0 or total.amount(r) <= room.amount(r)
               for r in RESOURCES)


def take(lease: Lease | None, quota: DeviceQuota, uid: str, charge: Charge, now: float, *,
         seen: SpecVersion | None) -> Lease | None:
    """The lease with claim `uid` admitted under it; None when it does not fit (or is
    past its window, or was granted on another object or generation than `seen`, the
    newest this process has seen of the quota, or under another spec than `quota`, the
    one its ledger counts): the exact path decides then.

    Not the spec alone: an edit undone within the window (Audit and back, a class and
    back, `hard` raised and lowered) restores an equal spec, but what the edit admitted
    is not in this lease's room, so reviving it would admit that room on top of `hard`."""
    if lease is None or lease.version != seen or lease.quota != quota or now >= lease.until:
        return None
    room = lease.amount if lease.limit is None else lease.amount.min(lease.limit)
    total = lease.consumed(without=uid) + charge
    if not _fits(quota, total, charge, room):
        return None
    return replace(lease, admitted={**lease.admitted, uid: (charge, now)}, total=total, taken=lease.taken + 1)


def untake(lease: Lease, uid: str) -> Lease:
    """`take` undone: the claim's other quotas refused it, so it will not be created."""
    if uid not in lease.admitted:
        return lease
    return replace(lease, admitted={u: v for u, v in lease.admitted.items() if u != uid},
                   total=lease.consumed(without=uid))


def settleable(lease: Lease, caches: Caches, *, now: float, ttl: float) -> bool:
    """Whether a write now would settle part of `lease` (`renew`): the holder writes then,
    so that the other replicas stop counting those claims twice (by their caches and in
    the lease's amount) and deny less near `hard`."""
    return any(claim_settled(caches, uid, expired=at + ttl <= now)[0] for uid, (_, at) in lease.admitted.items())


def writing(lease: Lease | None, plan: Plan) -> Lease | None:
    """The book while the write that carries `plan` is in flight: local admissions keep
    within what both the old and the new amount leave (a shrink may land)."""
    return None if lease is None else replace(lease, limit=plan.limit)


def landed(lease: Lease | None, plan: Plan) -> Lease | None:
    """The book once the write that carries `plan` landed: the planned lease, with the
    claims admitted under it meanwhile (they fit within `plan.limit`, so within the new
    amount once the settled ones left)."""
    if plan.lease is None:
        return None
    if plan.fresh or lease is None:
        # An expired book's claims were never in this amount: carried over, their settling
        # would take their charges out of room they never held.
        return plan.lease
    admitted = {u: v for u, v in lease.admitted.items() if u not in plan.settled}
    return _admitting(plan.lease, admitted, taken=len(set(admitted) - set(plan.lease.admitted)))


def renew(
    lease: Lease | None,
    *,
    key: str,
    holder: str,
    quota: DeviceQuota,
    record: Record,
    requests: Sequence[Request],
    usage: Usage,
    caches: Caches,
    now: float,
    ttl: float,
    sizing: Sizing,
    version: SpecVersion,
    max_entries: int = MAX_ENTRIES,
) -> tuple[Outcome, Plan]:
    """`apply` for a quota this process may lease: settle its own lease, decide
    `requests` (counting the lease's unsettled part not in this cache as in flight), then
    size the lease again. `lease` is this process's book (None: none); `key` its entry;
    `version` the object `record` and `quota` were read from (the planned lease is good
    only while it is the newest seen: `take`)."""
    stored = record.held.get(key)
    # Only the holder changes its entry's amount, and only by writes whose outcome it
    # knows: an entry unlike the book (or none, for a book) is on an object older than the
    # holder's last write (the watch lags its answer). A write built on it conflicts; its
    # decisions count the book's amount, and it must not become the book (`Plan.stale`).
    stale = lease is not None and (stored is None or stored.charge != lease.amount)
    if lease is not None and stored is not None and stale:
        stored = replace(stored, charge=lease.amount)
    own = lease if lease is not None and stored is not None else None
    settled: dict[str, Charge] = {}
    through = record.through
    for uid, (charge, at) in (own.admitted.items() if own is not None else ()):
        goes, seen = claim_settled(caches, uid, expired=at + ttl <= now)
        if goes:
            settled[uid] = charge
        if seen is not None:
            through = seen if through is None else max(through, seen)
    unsettled = own.consumed() - sum(settled.values(), ZERO) if own is not None else ZERO
    cached = sum((c for uid, (c, _) in (own.admitted.items() if own is not None else ())
                  if uid not in settled and caches.claim_version(uid) is not None), ZERO)
    held = {uid: r for uid, r in record.held.items() if uid != key}
    if stored is not None and own is None:
        held[key] = stored  # not ours to change: an entry of this key with no book
    elif stored is not None:
        # In flight for this decision: the lease's claims this cache does not count. Not its
        # idle room: this write sizes the lease again from what it admits (`counted` below),
        # and local admissions keep within the new amount while it is in flight (`writing`).
        held[key] = replace(stored, charge=(unsettled - cached).max(ZERO))
    outcome = apply(quota, Record(held, through, record.namespaces), requests, usage=usage, caches=caches, now=now,
                    ttl=ttl, max_entries=max_entries)
    live_until = now + ttl + sizing.margin  # a lease expiring later has its window open past its renewal
    outcome = replace(outcome, decisions=_retryable(quota, held, key, live_until, outcome.decisions, lambda others: apply(
        quota, Record(others, through, record.namespaces), requests, usage=usage, caches=caches, now=now, ttl=ttl,
        max_entries=max_entries).decisions))
    live = {uid: r for uid, r in outcome.record.held.items() if uid != key}
    if stored is not None and own is None:
        if key in outcome.record.held:
            live[key] = stored
        return replace(outcome, record=replace(outcome.record, held=live)), Plan(None, frozenset(), ZERO)
    admitted = {uid: v for uid, v in (own.admitted.items() if own is not None else ()) if uid not in settled}
    # Claims' admissions call for a lease; Workloads', the scheduler's attempts and
    # allocations' excesses, which never take one (`kube.quotawriter.Reservations.admit`), do not.
    claims = [r.charge for r in requests if r.op == "reserve" and r.source == "Claim" and not r.series
              and parse_allocation_key(r.uid) is None]
    active = bool(claims) or (own is not None and own.taken > 0)
    unit = max(claims, key=_size, default=ZERO)
    unit = unit.max(own.unit) if own is not None else unit
    counted = usage.used + usage.reserved + in_flight(Record(live), caches) + (unsettled - cached).max(ZERO)
    # A new entry past the bound (the CRD's maxProperties) would have the whole write refused.
    room_for_entry = stored is not None or len(live) < max_entries
    chunk = _chunk(quota, counted, sizing, unit) if active and room_for_entry and leasable(quota, sizing) else None
    if chunk is not None:
        amount, until, expires = unsettled + chunk, now + sizing.period, now + sizing.period + ttl
    else:
        amount, until = unsettled, 0.0
        expires = stored.expires if stored is not None else now + ttl
    planned: Lease | None = None
    if not amount.is_zero() and (stored is not None or chunk is not None):
        live[key] = Reservation(key, holder, amount, expires, "Lease")
        planned = _admitting(Lease(key, holder, quota, amount, until=until, expires=expires, unit=unit,
                                   version=version), admitted)
    changed = outcome.changed or live.get(key) != stored or through != record.through
    limit = amount + sum(settled.values(), ZERO)
    return (replace(outcome, record=replace(outcome.record, held=live), changed=changed),
            Plan(planned, frozenset(settled), limit, stale, fresh=own is None))


def _retryable(quota: DeviceQuota, held: Mapping[str, Reservation], key: str, live_until: float,
               decisions: tuple[Decision, ...],
               decide: Callable[[dict[str, Reservation]], tuple[Decision, ...]]) -> tuple[Decision, ...]:
    """A denial that only other replicas' open leases cause is not the quota's answer: part
    of their amount may be claims this cache already counts, and each is renewed or
    released within a fifth of a period. Such a request is refused as one to retry (no
    quota named), not as exceeded. A lease past that point (`live_until`: its holder
    would have written it by now; a SIGKILLed holder's, or one shrunk near `hard`) holds
    its room like any entry until it expires or settles: a denial it causes is final."""
    leases = {uid: r for uid, r in held.items() if r.source == "Lease" and uid != key and r.expires > live_until}
    if not leases or all(d.allowed for d in decisions):
        return decisions
    without = decide({uid: r for uid, r in held.items() if uid not in leases})
    amount = sum((r.charge for r in leases.values()), ZERO)
    message = (f'{quota.kind} "{quota.name}" is full counting the leases other replicas hold '
               f"(memory={format_quantity(amount.memory)}, devices={amount.devices}), part of which may be claims "
               "already counted; retry in a few seconds")
    return tuple(Decision(False, message) if not d.allowed and w.allowed else d for d, w in zip(decisions, without))


def _size(charge: Charge) -> tuple[int, int]:
    return (charge.devices, charge.memory)


def _chunk(quota: DeviceQuota, counted: Charge, sizing: Sizing, unit: Charge) -> Charge | None:
    """Whole multiples of `unit` (the largest charge admitted lately), at most a `share` of
    the free headroom and leaving `keep_free` of hard free, in every dimension `quota`
    limits; None below two of them (a lease that saves at most one write is not worth the
    room it holds from the other replicas)."""
    count: int | None = None
    for r in RESOURCES:
        hard = quota.hard.get(r)
        if hard is None or unit.amount(r) <= 0:
            continue
        free = hard - counted.amount(r)
        room = min(free * sizing.share, free - hard * sizing.keep_free)
        fits = max(math.floor(room / unit.amount(r)), 0)
        count = fits if count is None else min(count, fits)
    if count is None or count < 2:
        return None
    return Charge(unit.memory * count if quota.hard.get("memory") is not None else 0,
                  unit.devices * count if quota.hard.get("devices") is not None else 0)
