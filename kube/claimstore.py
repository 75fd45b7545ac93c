"""The webhook's claim cache: the reflector store that accounts ResourceClaims in the ledger, and its relist.

Neighbours: `kube.watching.Reflector` calls `ClaimStore` (synchronously, one event at a
time) and `commands.wiring` builds it beside the other stores (`kube.caches`: it parses
with their `parse_or_skip`, never raising, and tells `changed` as they do);
`quota.admission.admitter.Admitter` prices and `quota.accounting.ledger` counts; a relist is built aside
(`quota.accounting.claimsrebuild`) and swapped in at once; `kube.seen` reads its versions and is
told `deleted`; the leader's annotator (`controllers.annotator`), the stored claims'
refiner (`controllers.refine`) and `controllers.requeue` are told what they need.

Claims are accounted from what the API server holds, so a restart re-derives every
reservation: an allocated claim is charged exactly to `used` (`Admitter.account_allocated`);
an unallocated one keeps the reservation this process made when it admitted it, or,
when this process never saw its admission (it started later), is priced again and
reserved as admission would have; a deleted claim releases whatever it held, and only
then: the watch's DELETED event, never a DELETE's admission (another admission step
may still refuse the delete). With a `provisional` hook (`dra-quota serve`:
`controllers.refine`), that pricing happens after ready: the claim counts at once at its
upper bound (`Admitter.bound_entry`, no tenant CEL), and the hook prices it in the
background.

A claim admitted by the one-write admission (`webhook.claimadmit`) carries the token its
reservation is keyed by (`quota.admission.admissiontoken`): the store maps each token key to the
first claim carrying it, so `version`, `recorded_version` and `deleted` answer for the key
as for the uid, and the entry settles exactly as a uid-keyed one does.

Whether this cache can vouch for a claim's allocation history (`history_known`): it can
for a claim it met allocated (it sees the deallocation that follows, and what that
allocation charged), or met unallocated through the watch, which brings a claim's
creation before any later write. It cannot for a claim a list brought unallocated (at
start, or a relist that found it changed): that claim may have been allocated and
deallocated before, and what that allocation charged, which other replicas count it at,
is known here only from an allocation record that may be missing or stale (the record is
written into the tenant's own object, where the tenant can make the write fail). Its
next allocation is then checked whole (`webhook.claimreview.allocate_claim`).

The claim store tells `changed` the quotas whose status may have moved after each event:
the keys the ledger's mutation returned (as kueue's cache returns them), None after a
whole list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from kube.caches import QuotasChanged, parse_or_skip
from quota.accounting.claimsrebuild import ClaimsRebuild
from quota.accounting.ledger import QuotaKey
from quota.accounting.ledgerentry import ClaimRef, Entry
from quota.accounting.usage import Held, Holders
from quota.admission.admissiontoken import ADMISSION_ANNOTATION, is_token, is_token_key, token_key
from quota.admission.admitter import Admitter, claim_ref, object_ref
from quota.admission.annotating import read_annotations
from quota.objects.claims import Claim
from quota.objects.jsonclaims import parse_json_claim
from quota.quotas.scope import DeviceSelection
from quota.values.model import Namespace
from quota.values.raw import Obj, as_map, dig
from quota.values.work import drop, pause_point
from runtime.guard import guarded

__all__ = ["ClaimStore", "ClaimsSeen", "StagedRelist"]


class ClaimsSeen(Protocol):
    """Told each claim the watch delivers and each uid it saw go: the leader's annotator
    (`controllers.annotator.Annotator`, a floor above, so named here by what it is told)."""

    def seen(self, claim: Claim, annotations: Mapping[str, str]) -> None:
        """`annotations`: what the annotator reads of the claim's (`quota.admission.annotating.read_annotations`)."""

    def gone(self, uid: str) -> None: ...


class ClaimStore:
    """ResourceClaims into the ledger: exact when allocated, a reservation before (see module doc)."""

    def __init__(self, admitter: Admitter, *, deleted: Callable[[str, str | None], None] | None = None,
                 freed: Callable[[str], None] | None = None, holders: Holders | None = None,
                 recorder: ClaimsSeen | None = None,
                 provisional: Callable[[Claim, Entry], None] | None = None,
                 changed: QuotasChanged = lambda keys: None) -> None:
        self.admitter = admitter
        self.ledger = admitter.ledger
        # Who holds which device, for the usage metrics (`quota.accounting.usage`); charges nothing.
        self.holders = holders
        # Told the uid of each claim deleted from the cache and the resourceVersion of
        # its deletion (None: gone from a relist): a persisted entry of its
        # (`kube.quotawriter`) must not count again once the claim no longer does.
        self.deleted = deleted
        # Told the namespace of each deleted claim: quota may have freed there
        # (`controllers.requeue` retries the Pods waiting for it).
        self.freed = freed
        # Told every claim (the leader writes our annotations on them) and every
        # deleted uid (`controllers.annotator`).
        self.recorder = recorder
        # Told each stored claim entered at its upper bound, to price it later (module doc).
        self.provisional = provisional
        self.changed = changed
        # The resourceVersion each accounted claim had: a relist skips the claims that
        # did not change (parsing dominates a relist: 80 % of it, bench/controller.py).
        self._versions: dict[ClaimRef, str] = {}
        # The claims carrying the charge they were admitted at (`draquota.io/charge`).
        self._recorded: set[ClaimRef] = set()
        # One-write admissions (module doc): token key -> the first claim carrying its token.
        self._tokens = _Tokens()
        # Claims whose allocation history this cache cannot vouch for (module doc).
        self._unvouched: set[ClaimRef] = set()

    def replace(self, objects: list[Obj]) -> None:
        """A relist: built aside and swapped in with the ledger in one step (module doc).

        A claim missing from a fresh list was deleted while the watch was down. A
        reservation made by an admission whose claim is not persisted yet is dropped
        too: its ADDED event follows the list (the watch resumes from the list's
        resourceVersion) and reserves it again. A claim the ledger holds at the
        resourceVersion it was accounted at is the same object: it is not read again.
        """
        staged = self.relist()
        try:
            staged.add(objects)
        except BaseException:
            staged.cancel()
            raise
        staged.commit()

    def relist(self) -> StagedRelist:
        """`replace` in steps, for a list that arrives a piece at a time (a streamed list,
        `kube.watching`): each piece is staged as it arrives and let go, so the raw objects
        of a whole list are never held at once; `commit` swaps it in, as `replace` does."""
        return StagedRelist(self, _Relist(ClaimsRebuild(self.ledger)), self._selections())

    def _commit(self, relist: _Relist, selections: dict[Namespace, tuple[DeviceSelection, ...]]) -> None:
        gone = relist.rebuild.commit()
        # With the ledger, in the same step (no pause in between): the watermark reads
        # these (`version`).
        listed_before, self._versions = self._versions, relist.versions
        recorded_before, self._recorded = self._recorded, relist.recorded
        tokens_before, self._tokens = self._tokens, relist.tokens
        unvouched_before, self._unvouched = self._unvouched, relist.unvouched
        held_before = self.holders.replace(relist.held) if self.holders is not None else {}
        self._reprice_since(selections)
        # Told after the swap (in pauses: the reflector applies no event until they are done).
        for entry in gone:
            # Only a claim this cache had seen from the API server and the list no longer
            # holds was deleted. One known only from an admission here (the scheduler's
            # allocation of a claim created after the list's resourceVersion) is not: its
            # persisted reservation must keep counting it until the watch delivers it.
            if self.deleted is not None and entry.ref in listed_before:
                self.deleted(entry.ref, None)
                if (key := tokens_before.key_of.get(entry.ref)) is not None:
                    self.deleted(key, None)
            pause_point()
        if self.freed is not None:
            for namespace in dict.fromkeys(e.namespace for e in gone):
                self.freed(namespace)
        # Each told, then let go: what only the list held (every allocated claim parsed
        # again) freed a claim at a time, as the old tables below; in one piece at the
        # end of this call it was 0.2 s of the loop after a relist of 150,000 changed
        # claims (bench/stalls.py).
        told = relist.told
        told.reverse()
        while told:
            self._tell(*told.pop())
            pause_point()
        relist.rebuild.release()
        for table in (listed_before, recorded_before, held_before, tokens_before.ref_of, tokens_before.key_of,
                      unvouched_before):
            drop(table)
        self.changed(None)

    def _selections(self) -> dict[Namespace, tuple[DeviceSelection, ...]]:
        """Per namespace with a quota (its own, or a team's that selects it), what its claims are priced for."""
        namespaces = {ns for q in self.ledger.quotas()
                      for ns in (self.ledger.members(q.name) if q.cluster else (q.namespace,))}
        return {ns: self.admitter.selections(ns) for ns in namespaces}

    def _reprice_since(self, before: dict[Namespace, tuple[DeviceSelection, ...]]) -> None:
        """A quota selecting new devices arrived while the relist was built: the claims it
        priced were staged before it (`Admitter.price_for`, as `QuotaStore` does)."""
        for namespace, selections in self._selections().items():
            for selection in selections:
                if selection in before.get(namespace, ()):
                    continue
                for claim, entry in self.admitter.price_for(namespace, selection).stale:
                    if self.provisional is not None:
                        self.provisional(claim, entry)
                    else:
                        guarded(f"pricing ResourceClaim {claim.namespace}/{claim.name}",
                                lambda: self.admitter.reserve_existing(claim))

    def _stage(self, obj: Obj, relist: _Relist) -> None:
        meta = obj.get("metadata") or {}
        ref = _ref(str(meta.get("uid") or ""), meta)
        version = meta.get("resourceVersion")
        if version and self._versions.get(ref) == version and self._carry(ref, relist):
            return
        claim = parse_or_skip("ResourceClaim", obj, parse_json_claim)
        if claim is not None and guarded(f"accounting ResourceClaim {claim.namespace}/{claim.name} uid={claim.uid}",
                                         lambda: self._stage_one(claim, obj, relist, version)) is None:
            self._carry(claim_ref(claim), relist)  # what the ledger held stays, as after a failed event

    def _carry(self, ref: ClaimRef, relist: _Relist) -> bool:
        """The claim as the ledger counts it now, carried into the relist; False: not counted."""
        if not relist.rebuild.keep(ref):
            return False
        if (version := self._versions.get(ref)) is not None:
            relist.versions[ref] = version
        if ref in self._recorded:
            relist.recorded.add(ref)
        if ref in self._unvouched:
            relist.unvouched.add(ref)
        if (key := self._tokens.key_of.get(ref)) is not None:
            relist.tokens.add(key, ref)
        if self.holders is not None and (held := self.holders.mapping().get(ref)) is not None:
            relist.held[ref] = held
        return True

    def _stage_one(self, claim: Claim, obj: Obj, relist: _Relist, version: Any) -> bool:
        """`_account_one` into the rebuild: the same entry, the ledger left alone.
        `version`: the object's metadata.resourceVersion."""
        ref = claim_ref(claim)
        entry, bound = self._entry(claim, relisted=True)
        if entry is None:
            relist.rebuild.keep(ref)
        else:
            relist.rebuild.put(entry)
        if isinstance(version, str) and version:
            relist.versions[ref] = version
        if claim.recorded_charge is not None:
            relist.recorded.add(ref)
        if claim.allocation is None:
            relist.unvouched.add(ref)  # allocated and deallocated before, for all a list tells
        annotations = _annotations(obj)
        if (key := _token_key_in(annotations)) is not None:
            relist.tokens.add(key, ref, first=self._tokens.ref_of.get(key))
        if self.holders is not None and (held := Holders.of(claim, obj.get("status"))) is not None:
            relist.held[ref] = held
        relist.told.append((claim, read_annotations(annotations), entry if bound else None))
        return True

    def _entry(self, claim: Claim, *, relisted: bool = False) -> tuple[Entry | None, bool]:
        """What the ledger should count for `claim` (None: the entry it holds), and
        whether that is its upper bound, to be priced after ready (module doc).
        `relisted`: a relist brought it changed since this cache last held it."""
        if claim.allocation is not None:
            return self.admitter.allocated_entry(claim), False
        if relisted and (last := self.admitter.recorded_allocation(claim)) is not None:
            # Deallocated, and changed while the watch was down: it may have been allocated
            # and deallocated again meanwhile, so the last allocation this process saw may
            # be older than the one the leader recorded. The record wins: counted at the
            # older allocation, the claim could count less than it was charged, and admissions
            # over-commit.
            return last, False
        if (held := self.ledger.entry(claim_ref(claim))) is not None:
            if held.allocated:
                # Deallocated: it keeps counting what its last allocation charged, not its
                # reservation again (`Counting.deallocated_entry`).
                return self.admitter.deallocated_entry(held), False
            if (last := self.admitter.recorded_since(held, claim)) is not None:
                # Counted at its reservation, yet recorded as allocated since (this watch
                # missed the allocation: a relist after it and the deallocation), or at a
                # record the leader has rewritten: the replicas that saw the allocation
                # count it, and the record says the same.
                return last, False
            # Reserved at admission in this ledger (`dra-quota check`), or deallocated
            # before: the claim confirms it.
            return None, False
        if (last := self.admitter.recorded_allocation(claim)) is not None:
            return last, False  # deallocated before this process started: the same, from its record
        if self.provisional is None:
            return self.admitter.existing_entry(claim), False
        # Never counted by this process (it started later): priced at once when that is a
        # cache lookup (claims stamped from a known template, one this replica priced at
        # admission), else at its bound until priced after ready.
        return self.admitter.stored_entry(claim)

    def _tell(self, claim: Claim, annotations: Mapping[str, str], bound: Entry | None) -> None:
        if bound is not None and self.provisional is not None:
            self.provisional(claim, bound)
        if self.recorder is not None:
            self.recorder.seen(claim, annotations)

    def upsert(self, obj: Obj) -> None:
        claim = parse_or_skip("ResourceClaim", obj, parse_json_claim)
        keys = self._account(claim, obj) if claim is not None else None
        self._changed(keys, obj)

    def _changed(self, keys: tuple[QuotaKey, ...] | None, obj: Obj) -> None:
        """Tell `changed` the quotas the ledger's mutation moved. Where it moved none (the
        claim counted as before), the claim's own event may still let its persisted
        entries go (`quota.accounting.reservations.settle`: the charge recorded on it, its
        deletion): its namespace's quotas."""
        self.changed(keys or self.ledger.keys(Namespace(_namespace(obj))))

    def delete(self, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        uid = meta.get("uid")
        ref = _ref(uid if isinstance(uid, str) else "", meta)
        keys = self.ledger.delete_claim(ref)
        self._versions.pop(ref, None)
        self._recorded.discard(ref)
        self._unvouched.discard(ref)
        key = self._tokens.drop(ref)
        if self.holders is not None:
            self.holders.drop(ref)
        if self.recorder is not None and isinstance(uid, str):
            self.recorder.gone(uid)
        if self.deleted is not None and isinstance(uid, str) and uid:
            version = meta.get("resourceVersion")
            at = version if isinstance(version, str) else None
            self.deleted(uid, at)
            if key is not None:  # its one-write entry settles as its uid's does
                self.deleted(key, at)
        if self.freed is not None:
            self.freed(str(meta.get("namespace") or ""))
        self._changed(keys, obj)

    def version(self, uid: str) -> int | None:
        """The resourceVersion at which the ledger counts claim `uid` (None: it does not);
        `uid` may be a one-write admission's token key (module doc)."""
        version = self._versions.get(self._keyed(uid))
        return int(version) if version is not None and version.isdigit() else None

    def recorded_version(self, uid: str) -> int | None:
        """`version`, once the claim carries the charge it was admitted at: what lets a
        persisted reservation go, and the watermark it leaves (`quota.accounting.reservations`)."""
        return self.version(uid) if self._keyed(uid) in self._recorded else None

    def history_known(self, uid: str) -> bool:
        """Whether this cache can vouch for claim `uid`'s allocation history (module doc):
        what a deallocated claim's last allocation charged, or that it was never allocated."""
        return self._keyed(uid) not in self._unvouched

    def _keyed(self, uid: str) -> ClaimRef:
        """The claim a record key names: its uid, or the claim carrying a one-write token."""
        if is_token_key(uid):
            return self._tokens.ref_of.get(uid, ClaimRef(""))
        return ClaimRef(uid)

    def _account(self, claim: Claim, obj: Obj) -> tuple[QuotaKey, ...] | None:
        return guarded(f"accounting ResourceClaim {claim.namespace}/{claim.name} uid={claim.uid}",
                       lambda: self._account_one(claim, obj))

    def _account_one(self, claim: Claim, obj: Obj) -> tuple[QuotaKey, ...]:
        if self.holders is not None:
            self.holders.update(claim_ref(claim), claim, obj.get("status"))
        entry, bound = self._entry(claim)
        keys = self.ledger.add_or_update_claim(entry) if entry is not None else ()
        if claim.allocation is not None:
            # Its deallocation comes through this watch, after this event: this cache
            # knows what the last allocation charged from here on. (Unallocated and new to
            # this cache, it is vouched for as it is: the watch brought its creation.)
            self._unvouched.discard(claim_ref(claim))
        # The version only once the ledger counts this copy (as `_stage_one` does): a claim
        # whose pricing raised is not held by this cache, so its persisted reservation stays
        # (`quota.accounting.reservations.settle` drops an entry whose claim the cache holds).
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if isinstance(version, str) and version:
            self._versions[claim_ref(claim)] = version
        if (key := _token_key(obj)) is not None:
            self._tokens.add(key, claim_ref(claim))
        if claim.recorded_charge is not None:
            self._recorded.add(claim_ref(claim))
        else:
            self._recorded.discard(claim_ref(claim))
        # After the ledger counted it (the annotator reads what is due from it).
        self._tell(claim, read_annotations(_annotations(obj)), entry if bound else None)
        return keys


@dataclass(slots=True)
class _Tokens:
    """Token keys of one-write admissions and the claims carrying their tokens, both ways."""

    ref_of: dict[str, ClaimRef] = field(default_factory=dict)
    key_of: dict[ClaimRef, str] = field(default_factory=dict)

    def add(self, key: str, ref: ClaimRef, *, first: ClaimRef | None = None) -> None:
        """The first claim carrying a token keeps it: a later copy (a tenant who read the
        token off the persisted claim) never takes over its entry (`quota.admission.admissiontoken`).
        `first`: who held it before a relist, which reads claims in the list's order (by
        namespace and name), not in the order they were written. A copy can only be made
        once the original is stored, so its watch event came first; and every writer that
        reaches the watermark of any carrier holds the original too, counted by its uid."""
        if first is not None and first != ref:
            return
        if key not in self.ref_of and ref not in self.key_of:
            self.ref_of[key] = ref
            self.key_of[ref] = key

    def drop(self, ref: ClaimRef) -> str | None:
        key = self.key_of.pop(ref, None)
        if key is not None:
            self.ref_of.pop(key, None)
        return key


@dataclass(slots=True)
class _Relist:
    """What `ClaimStore.replace` builds aside before the swap."""

    rebuild: ClaimsRebuild
    versions: dict[ClaimRef, str] = field(default_factory=dict)
    recorded: set[ClaimRef] = field(default_factory=set)
    held: dict[ClaimRef, Held] = field(default_factory=dict)
    tokens: _Tokens = field(default_factory=_Tokens)
    unvouched: set[ClaimRef] = field(default_factory=set)
    # Each claim read again, with what the annotator reads of its annotations and its
    # bound when it counts at one: told after the swap. Not the object: a streamed list
    # lets each go once staged.
    told: list[tuple[Claim, Mapping[str, str], Entry | None]] = field(default_factory=list)


class StagedRelist:
    """A relist of `ClaimStore` built a piece at a time (`ClaimStore.relist`): `add` each
    piece, then `commit` (the swap) or `cancel` (the ledger left as it was)."""

    def __init__(self, store: ClaimStore, relist: _Relist,
                 selections: dict[Namespace, tuple[DeviceSelection, ...]]) -> None:
        self._store = store
        self._relist = relist
        # What each namespace's claims were priced for when the relist began (`_reprice_since`).
        self._selections = selections

    def add(self, objects: Iterable[Obj]) -> None:
        for obj in objects:
            self._store._stage(obj, self._relist)
            pause_point()

    def commit(self) -> None:
        self._store._commit(self._relist, self._selections)

    def cancel(self) -> None:
        self._relist.rebuild.cancel()


def _annotations(obj: Obj) -> Mapping[str, str]:
    return as_map(dig(obj, "metadata", "annotations"))


def _token_key(obj: Obj) -> str | None:
    """The record key of the one-write admission whose token `obj` carries, if any."""
    return _token_key_in(_annotations(obj))


def _token_key_in(annotations: Mapping[str, str]) -> str | None:
    """`_token_key` of a claim's annotations."""
    token = annotations.get(ADMISSION_ANNOTATION)
    return token_key(token) if is_token(token) else None


def _namespace(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("namespace") or "") if isinstance(meta, dict) else ""


def _ref(uid: str, meta: Mapping[str, Any]) -> ClaimRef:
    return object_ref(uid=uid, namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""))
