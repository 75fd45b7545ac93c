"""Persisted reservations on a DeviceQuota's status: the watermark protocol and the pure decision.

Neighbours: `quota.accounting.reservationrecord` is the record itself (its format on the status,
its bounds, parsing and writing it); `kube.statuswriter` reads a DeviceQuota, waits
until its own claim watch has reached the record's watermark, calls `apply` and writes
the result back through the status subresource with a resourceVersion precondition;
`quota.quotas.devicequota.check` is the check itself; `quota.accounting.ledger` supplies the usage this
replica's claim cache counts. Pure: no clock (`now` is passed in), no I/O.

An entry lives from the admission that wrote it until every replica that may decide
would count its claim itself, and no longer. The watermark says when that is.

The protocol (docs/development/reservations.md holds the full safety argument):
1. A writer (a replica's webhook batch, or the leader's quota controller) reads the
   DeviceQuota and, before deciding anything on it, waits until its own claim watch
   has delivered every claim event up to `claimsThrough`.
2. Deciding, it drops the entries whose claim its own cache holds with the charge
   it was admitted at recorded on it (the claim is counted from the cache now, never
   below that charge) or saw deleted, and raises `claimsThrough` to the highest claim
   resourceVersion that justified a drop. Then it adds the admissions
   that fit `used + reserved + in flight + charge <= hard`, where "in flight" is the
   entries still held.
3. It writes with the resourceVersion it read; a conflict (someone wrote in between)
   means read again and start over at 1.
Why nothing is ever counted nowhere: an entry for claim u dropped at watermark v (the
resourceVersion at which the dropping writer's cache held u) is gone only from
objects whose `claimsThrough` is at least v; any writer that decides on such an
object has first seen its own watch reach v, so its cache holds u (or saw it deleted,
and then u holds nothing). A writer that decided on an older object carries that
object's resourceVersion and is refused with a conflict. The watermark is the
resourceVersion of a real claim event, so every replica's watch reaches it within its
own lag: no bookmarks or progress requests are needed, and nothing is compared across
resources.

What the TTL is for now: orphans, entries whose claim never appears (a later admission
plugin denied the create, or the create failed). Any writer drops an entry whose claim
it has not seen once the entry expired. The TTL must outlast the API server's request
(`--request-timeout`, 60 s by default) plus any replica's watch lag: an entry dropped
while its create is still in flight would let that claim go uncounted.

Kueue Workloads (`controllers.kueue`): the leader's AdmissionCheck reserves a Workload's
price here too (`source: Workload`). Workloads are not claims and their
resourceVersions say nothing about the claim watch, so their entries follow the TTL
rule: counted once (by the holding when this replica's Workload cache has it, else by
the entry) until they expire or the Workload is gone.

Leases (`quota.accounting.headroom`, `source: Lease`): a chunk of headroom one `serve` process
admits claims against without a write. Every writer but its holder counts its whole
amount as in flight and drops it only once it expired; only the holder settles it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from quota.accounting.excess import excess_settled, parse_allocation_key, supersedes
from quota.accounting.reservationrecord import MAX_ENTRIES, MAX_ENTRIES_PER_NAMESPACE, Record, Reservation, Source
from quota.objects.extended import in_series
from quota.quotas.devicequota import Decision, DeviceQuota, QuotaCheck, Usage, check
from quota.values.model import ZERO, Charge

__all__ = ["Caches", "Outcome", "Request", "Undo", "apply", "claim_settled", "in_flight", "settle"]

@dataclass(frozen=True, slots=True)
class Undo:
    """How an attempt at an allocation takes its reserve back (`quota.accounting.excess`): the entry
    the reserve wrote, and what its key held before (None: nothing)."""

    wrote: Reservation
    before: Reservation | None


@dataclass(frozen=True, slots=True)
class Request:
    op: Literal["reserve", "release"]
    uid: str
    claim: str = ""
    charge: Charge = ZERO
    # A reserve for the scheduler's claim for a Pod's extended resources: the series of
    # that Pod's attempts (`quota.objects.extended.attempt_series`), whose unconfirmed entries
    # this one replaces.
    series: str = ""
    source: Source = "Claim"
    # A release of an allocation's excess: what its reserve's `Outcome.undos` gave (None:
    # the release takes nothing back; other releases remove the uid's entry).
    undo: Undo | None = None
    # An allocation checked whole (`quota.accounting.excess`, a claim whose history the deciding
    # replica cannot vouch for): the claim uid whose own count in `usage` is not counted
    # beside its charge, and that count, (used, reserved), read from the ledger when the
    # batch is decided (`kube.statuswriter`): the charge replaces it in the decision,
    # while the entry holds the whole charge for every other replica.
    own: str = ""
    credit: tuple[Charge, Charge] = (ZERO, ZERO)


@dataclass(frozen=True, slots=True)
class Outcome:
    record: Record
    # One per request, in order; a release is always allowed.
    decisions: tuple[Decision, ...]
    changed: bool
    # One per request, in order: for an allowed reserve of an allocation's excess, how
    # to take it back (`Request.undo`); None for every other request.
    undos: tuple[Undo | None, ...]


class Caches(Protocol):
    """What one replica's own caches say about the uids in a record."""

    def claim_version(self, uid: str) -> int | None:
        """The resourceVersion at which the claim cache holds claim `uid`; None if it does not."""

    def claim_recorded(self, uid: str) -> int | None:
        """The resourceVersion at which the claim cache holds claim `uid` carrying the charge
        it was admitted at (`draquota.io/charge`); None if it does not (yet)."""

    def claim_gone(self, uid: str) -> int | None:
        """The resourceVersion at which the claim cache saw `uid` deleted; None if it did not."""

    def workload_counted(self, uid: str) -> bool:
        """Whether the ledger counts Workload `uid`'s holding itself."""

    def workload_gone(self, uid: str) -> bool:
        """Whether the Workload cache saw Workload `uid` finish or go."""


def settle(record: Record, caches: Caches, *, now: float, namespaces: int | None = None) -> Record:
    """`record` without the entries no writer needs any more (module doc, step 2).

    A claim entry goes once this replica's cache holds its claim carrying the charge it
    was admitted at (the leader writes it, `controllers.annotator`), or saw it deleted, and
    the watermark rises to the resourceVersion that showed it; an entry that expired
    goes too (raising the watermark if this cache holds its claim, unannotated: the leader
    was away), an orphan (claim never seen) without raising it. Until the claim carries
    its charge the entry is the only
    persisted record of what was admitted: a replica that prices the claim afresh (a
    restart, after the largest candidate left the inventory) must not count it below
    that. A Workload entry goes once it expired or its Workload is gone; it never moves
    the watermark.
    """
    held: dict[str, Reservation] = {}
    through = record.through
    for uid, entry in record.held.items():
        if entry.source == "Workload":
            if entry.expires > now and not caches.workload_gone(uid):
                held[uid] = entry
            continue
        if entry.source == "Lease":
            # Only its holder knows which claims it admitted under it (`quota.accounting.headroom`):
            # every other writer counts all of it until it expires.
            if entry.expires > now:
                held[uid] = entry
            continue
        goes, seen = claim_settled(caches, uid, expired=entry.expires <= now)
        if seen is not None:
            through = seen if through is None else max(through, seen)
        if not goes:
            held[uid] = entry
    if len(held) == len(record.held) and through == record.through:
        return record
    return Record(held, through, _raised(record.namespaces, namespaces))


def claim_settled(caches: Caches, uid: str, *, expired: bool) -> tuple[bool, int | None]:
    """Whether an admission of claim `uid` (its entry, or its part of a lease) may go, and
    the claim resourceVersion the watermark must rise to when it does (None: none).

    It goes once this cache holds the claim carrying the charge it was admitted at, or
    saw it deleted; once expired, also when the cache holds it without its charge (no
    leader annotated it in time: the watermark still says so), or never saw it (an
    orphan: its create never succeeded, and the watermark stays). An allocation's excess
    (`quota.accounting.excess`, keyed by the claim and the copy it was reviewed on) has its own rule."""
    allocation = parse_allocation_key(uid)
    if allocation is not None:
        claim, before = allocation
        return excess_settled(before, version=caches.claim_version(claim), gone=caches.claim_gone(claim),
                              expired=expired)
    seen = caches.claim_recorded(uid)
    if seen is None:
        seen = caches.claim_gone(uid)
    if seen is None and expired:
        return True, caches.claim_version(uid)
    return seen is not None, seen


def _raised(through: int | None, seen: int | None) -> int | None:
    return through if seen is None or (through is not None and through >= seen) else seen


def in_flight(record: Record, caches: Caches, *, namespace: str | None = None, leases: bool = True) -> Charge:
    """What the entries add to this replica's ledger: each one whose claim (or Workload)
    the ledger does not count itself, and each lease whole; with `namespace`, only that
    namespace's (a team's breakdown: an entry names its claim `namespace/name`); without
    `leases`, what the status shows as reserved (leases are shown apart: part of their
    amount may be claims the ledger already counts, `quota.status.quotastatus`)."""
    total = ZERO
    for uid, entry in record.held.items():
        if (namespace is not None and entry.claim.partition("/")[0] != namespace) or (
                not leases and entry.source == "Lease"):
            continue
        if not _counted(uid, entry, caches):
            total = total + entry.charge
    return total


def _counted(uid: str, entry: Reservation, caches: Caches) -> bool:
    """Whether this replica's ledger counts what `entry` holds itself (a lease: never)."""
    if entry.source != "Claim":
        return entry.source == "Workload" and caches.workload_counted(uid)
    if parse_allocation_key(uid) is not None:  # once the cache holds the allocated copy
        return claim_settled(caches, uid, expired=False)[0]
    return caches.claim_version(uid) is not None


def _stale(uid: str, entry: Reservation, request: Request) -> bool:
    """Whether reserving `request` drops `entry`: an earlier attempt of its series (the
    scheduler's extended-resource claims) or of its claim's allocation (`quota.accounting.excess`)."""
    if uid == request.uid or entry.source != "Claim":
        return False
    return (bool(request.series) and in_series(entry.claim, request.series)) or supersedes(request.uid, uid)


def apply(
    quota: DeviceQuota,
    record: Record,
    requests: Sequence[Request],
    *,
    usage: Usage,
    caches: Caches,
    now: float,
    ttl: float,
    max_entries: int = MAX_ENTRIES,
    max_per_namespace: int = MAX_ENTRIES_PER_NAMESPACE,
    namespaces: int | None = None,
) -> Outcome:
    """Apply `requests` in order to `quota`'s record, after `settle`.

    `usage` is what this replica's claim cache counts for the quota. A reserve for a
    uid already held replaces that entry (a retried review never counts twice); a
    denied retry keeps the earlier entry, whose answer may have been delivered. A
    reserve with a `series` first drops the entries of earlier attempts of that series:
    the scheduler retries a Pod's extended-resource claim forever, and when an
    admission step after ours refuses each attempt, entries left to expire would fill
    the quota with claims that do not exist (one Pod asking 1 device held 4 of a quota
    of 4 on the e2e cluster). Only claims this replica has not seen are in the record
    after `settle`, so every such entry is an attempt that does not exist yet. An
    allocation's excess supersedes the entries of its claim's older attempts and, retried
    under its own key, holds the larger of the two excesses; its release takes back only
    its own reserve, by the `Undo` that reserve's outcome gave (`quota.accounting.excess`).
    `namespaces`: a team's (`settle`); an entry added raises `namespacesThrough` too.
    A reserve past `max_entries`, or in a team's record past `max_per_namespace` entries
    of its namespace, is refused with a message that names the quota (and the namespace).
    """
    settled = settle(record, caches, now=now, namespaces=namespaces)
    live = dict(settled.held)
    per_namespace = max_per_namespace if quota.cluster else None  # a team's record only
    held_by = Counter(_namespace(r) for r in live.values()) if per_namespace is not None else Counter[str]()
    changed = settled is not record
    decisions: list[Decision] = []
    undos: list[Undo | None] = []
    for request in requests:
        excess = parse_allocation_key(request.uid) is not None  # an allocation's (`quota.accounting.excess`)
        # Only a series or an allocation's excess replaces other entries: no scan for the rest.
        if request.op == "reserve" and (request.series or excess):
            stale = [uid for uid, r in live.items() if _stale(uid, r, request)]
            for uid in stale:
                held_by[_namespace(live.pop(uid))] -= 1
            changed = changed or bool(stale)
        previous = live.pop(request.uid, None)
        if previous is not None:
            held_by[_namespace(previous)] -= 1
        undos.append(None)
        if request.op == "release":
            kept = _undone(previous, request.undo) if excess else None
            if kept is not None:
                _hold(live, held_by, request.uid, kept)
            changed = changed or kept is not previous
            decisions.append(Decision(True))
            continue
        namespace = request.claim.partition("/")[0]
        full = _full(quota, max_entries) if len(live) >= max_entries else None
        if full is None and per_namespace is not None and request.source == "Claim" and (
                held_by[namespace] >= per_namespace):
            full = _namespace_full(quota, namespace, per_namespace, ttl)
        if full is not None:
            if previous is not None:
                _hold(live, held_by, request.uid, previous)
            decisions.append(full)
            continue
        entry = Reservation(request.uid, request.claim, request.charge, now + ttl, request.source)
        if previous is not None and excess:
            entry = _over(previous, entry)
        pending = in_flight(Record(live), caches)
        used, reserved = usage.used, usage.reserved + pending
        if request.own:
            used, reserved = (used - request.credit[0]).max(ZERO), (reserved - request.credit[1]).max(ZERO)
        decision = check([QuotaCheck(quota, replace(usage, used=used, reserved=reserved), entry.charge)], namespace=namespace)
        if decision.allowed:
            _hold(live, held_by, request.uid, entry)
            changed = True
            undos[-1] = Undo(entry, previous) if excess else None
        elif previous is not None:
            _hold(live, held_by, request.uid, previous)
        decisions.append(decision)
    added = any(uid not in settled.held or settled.held[uid] is not r for uid, r in live.items())
    through = _raised(settled.namespaces, namespaces) if added else settled.namespaces
    return Outcome(Record(live, settled.through, through), tuple(decisions), changed, tuple(undos))


def _over(previous: Reservation, entry: Reservation) -> Reservation:
    """Another attempt's reserve over an allocation entry of the same copy (`quota.accounting.excess`):
    the larger excess per dimension (either allocation may land), and an expiry later than
    the entry's by at least the millisecond the status keeps, so no two entries the key
    holds one after the other read alike and an `Undo` names exactly its own."""
    return replace(entry, charge=entry.charge.max(previous.charge),
                   expires=max(entry.expires, previous.expires + 0.001))


def _undone(current: Reservation | None, undo: Undo | None) -> Reservation | None:
    """An allocation entry once an attempt took its reserve back (`undo`): what the key held
    before that reserve if the entry is still the one it wrote; else as it is (another
    attempt wrote since, and its entry covers its own excess; or the key settled or was
    superseded, and holds nothing to restore). Compared as the status stores it."""
    if current is None or undo is None or current.as_json() != undo.wrote.as_json():
        return current
    return undo.before


def _namespace(entry: Reservation) -> str:
    """The namespace whose part of a team's record `entry` takes ("" for none): a claim's
    (its entries name it `namespace/name`). Not a Workload's: Kueue's check holds it until
    the TTL or its Workload goes, by design, and the Workload is a real object, not an
    orphan a failing create left; a namespace may run more than 250 of them in a TTL."""
    return entry.claim.partition("/")[0] if entry.source == "Claim" else ""


def _hold(live: dict[str, Reservation], held_by: Counter[str], uid: str, entry: Reservation) -> None:
    live[uid] = entry
    held_by[_namespace(entry)] += 1


def _namespace_full(quota: DeviceQuota, namespace: str, per_namespace: int, ttl: float) -> Decision:
    return Decision(False, f'{quota.kind} "{quota.name}" holds {per_namespace} admissions in flight from namespace '
                           f'"{namespace}", as many as one of the namespaces it spans may hold; retry once some of '
                           f"them are seen (usually within seconds; those of creates that failed after admission "
                           f"expire within {ttl:.0f} s)")


def _full(quota: DeviceQuota, max_entries: int) -> Decision:
    return Decision(False, f'{quota.kind} "{quota.name}" has {max_entries} admissions in flight, as many as its '
                           "status may hold; retry once some of them are seen (usually within seconds)")
