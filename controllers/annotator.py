"""The leader writes our annotations on each claim, once the claim exists.

Neighbours: the claim cache (`kube.claimstore.ClaimStore`) tells `Annotator.seen` every
claim it accounts (after the ledger counted it) and `gone` every claim deleted;
`quota.admission.annotating` (`Admitter.annotations_due`) says what the charge and quota
annotations should say (from the charge the ledger holds: nothing is priced again here) and
`quota.pricing.pricer.Pricer.allocation_record` what the allocation record should say;
`webhook.claimreview` refuses any of them on a new claim or template and any later change
by anyone else, so a tenant cannot lower them.

What is written, each key once it is due:
- `draquota.io/charge` and `draquota.io/quotas`, when the claim has no charge yet: its
  charge as admitted (JSON of bytes and devices) and the DeviceQuotas it draws on. Queue
  managers and dashboards read them; a claim priced again (a restart, a deallocation)
  never counts less than the charge recorded (`quota.pricing.priced.at_least_recorded`). The
  shipped configuration's mutating admission (`webhook.claimadmit`) writes them into the
  claim in its CREATE, so a claim it admitted has nothing due here; only a claim that
  arrived without a charge (created while no webhook of ours reached its namespace, or
  stripped by a later mutating webhook) is patched.
- the allocation record (`quota.objects.allocationrecord`: `draquota.io/allocated-charge`, and
  `draquota.io/allocation-results` where the claim needs it), once the claim is
  allocated: the exact charge of each device. A device can vanish while a claim holds it (a driver rewrites its
  ResourceSlice, a node goes away); its charge must stay what it was, in the process
  that saw the device and in a leader started afterwards, which never saw it.

How many patches are in flight: `concurrency` writers always, or one for every
`BACKLOG_PER_WRITER` claims waiting where that is more (16 writers until 128 claims
wait), up to `max_concurrency`; the extra ones stop once no claim waits. Each claim
without a charge needs one patch (in the validating design, before one write per create,
every create did), and the API server shares its time among the requests in flight: a
fixed pool of 16 against 64 creates in flight fell minutes behind a sustained 200
creates/s (bench/admission.py (f)), and each claim it had not reached kept its entry in
the quota's record, which filled to its 1,000 entries.
More patches in flight take a larger share, which slows the creates: the backlog, and
so the record, stays bounded by what the API server can do.

Only the leader writes (`leading`); every replica collects the claims still to write, so
a new leader starts from its own cache without a list. The first allocation record a
leader writes for a claim is also when it tells `allocated` how long the claim waited,
from its creation to when this replica's watch first saw it allocated
(`draquota_claim_allocation_wait_seconds`): once per claim, as a record already there
(an earlier leader's) is never written again. A claim whose annotations
already say what they should is not written: a restart that relists writes nothing.
Each write is a merge patch of the claim's metadata carrying its uid, which the API
server checks as a precondition: a claim deleted and recreated under the same name is
never written. RBAC: patch resourceclaims.

The claim is the tenant's object: its creator can leave no room for our annotations
(annotations padded to the API server's 256 KiB, the whole object to etcd's limit), and
every patch is then refused (422 or 413). Nothing is retried for such a claim until its
next event (a write per event, never a loop of them), and `unrecorded` names it (an Event
on the claim, a metric). No accounting depends on the record being there: a replica that
starts without it counts the claim at its reservation and checks its next allocation
whole (`kube.claimstore.ClaimStore.history_known`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

import aiohttp

from kube.api import KubeApi
from kube.apierror import ApiError
from kube.resources import CLAIMS
from kube.writegate import NotLeading
from quota.objects.allocationrecord import ALLOCATED_CHARGE_ANNOTATION
from quota.objects.claims import Claim
from runtime.guard import guarded

__all__ = ["Annotator", "refused_by_content", "unrecorded_note"]

log = logging.getLogger(__name__)

FIELD_MANAGER = "dra-quota"
# What is due on a claim, given the annotations it carries (`Admitter.annotations_due`),
# and whether anything may be (`annotations_may_be_due`: no CEL, asked on every event).
Due = Callable[[Claim, Mapping[str, str]], dict[str, str]]
MayBeDue = Callable[[Claim, Mapping[str, str]], bool]
# Claims waiting per writer past which another writer starts (`Annotator` doc).
BACKLOG_PER_WRITER = 8
# Runs a pricing call off the loop's critical path (`runtime.slicing.Slicer.run`, waiting
# its turn in a full slow lane: `wait=True`).
Run = Callable[[Callable[[], dict[str, str]]], Awaitable[dict[str, str]]]


async def _inline(fn: Callable[[], dict[str, str]]) -> dict[str, str]:
    return fn()


class Annotator:
    def __init__(self, api: KubeApi, due: Due, may_be_due: MayBeDue, *, leading: Callable[[], bool],
                 run: Run = _inline, concurrency: int = 16, max_concurrency: int = 64, backoff: float = 1.0,
                 attempts: int = 5) -> None:
        self._api = api
        self._due = due
        self._may_be_due = may_be_due
        self._run = run
        self._leading = leading
        self._concurrency = concurrency
        self._max_concurrency = max(max_concurrency, concurrency)
        self._extra: set[asyncio.Task[None]] = set()  # writers started for a backlog (`_grow`)
        self.most_writers = 0  # the most writers at once (tests and logs read it)
        self._running = False  # `run` is: writers may be started
        self._context = contextvars.copy_context()  # `run`'s, once it runs
        self._backoff = backoff
        self._attempts = attempts
        # uid -> the latest claim to annotate and the annotations it carried.
        self._pending: dict[str, tuple[Claim, Mapping[str, str]]] = {}
        self._failures: dict[str, int] = {}
        self._writing: set[str] = set()  # uids whose patch is in flight
        self._seen_at: dict[str, float] = {}  # uid -> when it was first seen allocated (wall clock)
        # Recorded and told `allocated`, until the record's own event arrives: an older event
        # delivered after the write must not count the claim twice.
        self._observed: set[str] = set()
        # Told (namespace, seconds from creation to allocation) once per recorded claim.
        self.allocated: Callable[[str, float], None] = lambda _namespace, _seconds: None
        # Told each claim whose patch its own content refused (module doc), and why.
        self.unrecorded: Callable[[Claim, str], None] = lambda _claim, _why: None
        self._wake = asyncio.Event()
        self.writes = 0  # patches that landed (tests and logs read it)

    # -- told by the claim cache (synchronous, never raises) -----------------------------

    def seen(self, claim: Claim, annotations: Mapping[str, str]) -> None:
        if not claim.uid or not self._may_be_due(claim, annotations):
            self._forget(claim.uid)
            return
        self._pending[claim.uid] = (claim, annotations)
        if claim.allocation is not None:
            self._seen_at.setdefault(claim.uid, time.time())
        self._wake.set()
        self._grow()  # the writers may all be waiting on patches

    def gone(self, uid: str) -> None:
        self._forget(uid)

    def _forget(self, uid: str) -> None:
        self._pending.pop(uid, None)
        self._seen_at.pop(uid, None)
        self._observed.discard(uid)
        self._failures.pop(uid, None)

    @property
    def pending(self) -> int:
        return len(self._pending)

    # -- the writer -----------------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled: while leading, write what is due, `concurrency` patches in
        flight (more while a backlog lasts, module doc), oldest claim first.

        A pool of writers, not rounds of a batch: each takes the next claim as soon as its
        patch is answered, so one slow patch holds up only its own writer. The entry a
        claim holds in its quota's `status.reservations` goes only once the claim carries
        its charge (`quota.accounting.reservations.settle`), so these writes must keep up with the
        creates: behind them, the record grows by every create they have not reached.
        """
        self._running = True
        # The extra writers run in `run`'s context, whoever starts them (`_grow`: also the
        # claim cache's callbacks): its Lease gate fences their writes (`controllers.leader`).
        self._context = contextvars.copy_context()
        try:
            await asyncio.gather(*(self._writer() for _ in range(self._concurrency)))
        finally:
            self._running = False
            extra = list(self._extra)
            for task in extra:
                task.cancel()
            await asyncio.gather(*extra, return_exceptions=True)

    @property
    def writers(self) -> int:
        return self._concurrency + len(self._extra)

    def _grow(self) -> None:
        """Start writers while the backlog outgrows those running (module doc); only
        where they would write (a replica that does not lead collects claims too)."""
        if not self._running or not self._leading():
            return
        while (self.writers < self._max_concurrency
               and len(self._pending) > BACKLOG_PER_WRITER * self.writers):
            task = asyncio.create_task(self._writer(extra=True), name="annotator writer", context=self._context)
            self._extra.add(task)
            task.add_done_callback(self._extra.discard)
        self.most_writers = max(self.most_writers, self.writers)

    async def _writer(self, *, extra: bool = False) -> None:
        while True:
            uid = self._next() if self._leading() else None
            if uid is None and extra:
                return  # the backlog is gone (or leadership): the pool shrinks back
            if uid is None:
                # Leadership is polled: the elector has no callback and a new leader
                # finds its pending claims at most a second late. asyncio.timeout, not
                # wait_for: 3.11's wait_for drops a cancellation that races the wake-up
                # (a failed patch wakes every idle writer), and a writer that lost its
                # cancellation kept serve from ever exiting after SIGTERM.
                self._wake.clear()
                try:
                    async with asyncio.timeout(1.0):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            claim, annotations = self._pending.pop(uid)
            self._grow()
            self._writing.add(uid)
            try:
                failed = await self._write(claim, annotations) is False
            except Exception as err:  # noqa: BLE001 - a writer lost is a pool that shrinks for good
                # Unforeseen (the API client's own errors are handled in `_write`): the
                # claim is tried again like a failed patch, and the writer goes on.
                log.exception("writing the annotations of ResourceClaim %s/%s failed", claim.namespace, claim.name)
                failed = self._failed(claim, annotations, repr(err))
            finally:
                self._writing.discard(uid)
                if uid in self._pending:  # a newer event while this patch was in flight
                    self._wake.set()
            if failed:
                await asyncio.sleep(self._backoff)

    def _next(self) -> str | None:
        """The oldest pending claim no writer is patching (one patch per claim at a time)."""
        return next((uid for uid in self._pending if uid not in self._writing), None)

    async def _write(self, claim: Claim, annotations: Mapping[str, str]) -> bool | None:
        """One patch; False: failed and put back to retry; None: written or not needed."""
        due = await self._run(lambda: guarded(f"the annotations of ResourceClaim {claim.namespace}/{claim.name}",
                                              lambda: self._due(claim, annotations)) or {})
        if not due:
            return None
        patch = {"metadata": {"uid": claim.uid, "annotations": due}}
        # Read before the write: the write's own event may arrive (and forget it) first.
        seen_at = self._seen_at.get(claim.uid) if ALLOCATED_CHARGE_ANNOTATION in due else None
        try:
            await self._api.patch(CLAIMS, claim.name, patch, namespace=claim.namespace, field_manager=FIELD_MANAGER)
        except NotLeading as err:
            # Lost the Lease while this patch waited (`controllers.leader`): not a failure of
            # the claim's; kept for when this replica leads again, with the newest event's claim.
            log.debug("ResourceClaim %s/%s left to the leader: %s", claim.namespace, claim.name, err)
            self._pending.setdefault(claim.uid, (claim, annotations))
            return None
        except ApiError as err:
            if err.status in (404, 409):
                return None  # deleted, or recreated under its name (the uid precondition)
            if refused_by_content(err):
                # The claim's own content refuses any patch that adds to it (module doc):
                # retrying writes again and again for nothing; its next event tries once more.
                self._failures.pop(claim.uid, None)
                log.warning("cannot write the annotations of ResourceClaim %s/%s: %s", claim.namespace, claim.name,
                            err.message[:200])
                self.unrecorded(claim, err.message)
                return None
            return self._failed(claim, annotations, str(err))
        except (aiohttp.ClientError, TimeoutError) as err:
            return self._failed(claim, annotations, str(err))
        self.writes += 1
        if seen_at is not None:
            self._seen_at.pop(claim.uid, None)
            if claim.created is not None and claim.uid not in self._observed:
                self._observed.add(claim.uid)
                self.allocated(claim.namespace, seen_at - claim.created)
        self._failures.pop(claim.uid, None)
        return None

    def _failed(self, claim: Claim, annotations: Mapping[str, str], why: str) -> bool:
        failures = self._failures.get(claim.uid, 0) + 1
        if failures >= self._attempts:
            # Its next event (or the next leader's) tries again; until then the running
            # ledger already charges it exactly.
            log.warning("cannot write the annotations of ResourceClaim %s/%s after %d attempts: %s",
                        claim.namespace, claim.name, failures, why)
            self._failures.pop(claim.uid, None)
            return True
        self._failures[claim.uid] = failures
        self._pending.setdefault(claim.uid, (claim, annotations))  # a newer event's claim wins
        return False


def refused_by_content(err: ApiError) -> bool:
    """Whether the API server refused a patch for what the object holds, which only its
    owner can change: 422 (annotations past 256 KiB, other validation) or 413, and etcd's
    "request is too large" (an object at its size limit), which the API server returns
    as a 500."""
    return err.status in (413, 422) or "too large" in err.message.lower()


def unrecorded_note(why: str) -> str:
    """The Event note on a claim whose annotations the leader could not write: what
    happened, what it means for the claim, and what its owner can do."""
    return (f"dra-quota could not write its annotations on this claim: {why[:200]}. Until it can, a dra-quota "
            "replica that starts counts this claim at its reservation and checks its next allocation whole against "
            "the quota, which may keep it waiting: remove some of the claim's own annotations so that ours fit "
            "(a few hundred bytes)")
