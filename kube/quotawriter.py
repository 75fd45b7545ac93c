"""Reservations persisted on DeviceQuota and ClusterDeviceQuota status before a claim is admitted.

Neighbours: `webhook.claimreview` calls `Reservations.admit` on a claim CREATE and
`controllers.kueue` on a Workload's check; its base, `kube.statuswriter.QuotaStatusWriter`,
queues each quota's requests in a batch, decides them (`quota.accounting.reservationrecord`: the
record's format; `quota.accounting.reservations`: the watermark protocol, read its docstring
first) and writes them conditionally once this replica's watches reached the record's watermarks; the
`kube.caches` stores feed it every DeviceQuota, the claim store (`kube.claimstore`) its
versions and `claim_deleted` (claims the watch saw go); the quota controller
(`controllers.quotas`) writes through the same `write_status`.

Several quotas per claim (its namespace's DeviceQuotas and the ClusterDeviceQuotas
selecting it): Kubernetes has no multi-object transaction, so the quotas are reserved
one at a time in key order, team quotas (no namespace) first, then by name (a fixed
total order, so two claims never hold each other's first quota while waiting on the
second) and the ones already reserved
are released if a later one denies or fails (an allocation's excess is taken back by its
`quota.accounting.reservations.Undo`: its entry may be another attempt's too, `quota.accounting.excess`).
Until that release lands the claim holds
capacity it will not use: other claims may be denied meanwhile (never over-committed),
and a release that fails is repaired by the entry's expiry.

Leases (`quota.accounting.headroom`, `kube.leasebook`): while a DeviceQuota is far from `hard`, a
claim is admitted under this process's lease on it, with no write; every write of that
quota's status by this process settles and re-sizes the lease (`renew`), and the book
follows the write's fate (landed, not written, or unknown: the key is retired).

A claim's entry is never released when the claim is deleted at admission (a later
admission plugin may deny the DELETE): it goes once a cache saw the claim, and the
claim then stops counting when the watch delivers its deletion.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace

from kube.statuswriter import QuotaStatusWriter
from kube.writegate import ungated
from quota.accounting.excess import parse_allocation_key
from quota.accounting.ledger import QuotaKey, shown
from quota.accounting.reservationrecord import Source, parse_record
from quota.accounting.reservations import Request, Undo, in_flight, settle
from quota.quotas.devicequota import Decision, DeviceQuota
from quota.values.model import Charge, Namespace

__all__ = ["Reservations"]

log = logging.getLogger(__name__)


class Reservations(QuotaStatusWriter):
    """The persisted reservations of every DeviceQuota, written with optimistic concurrency
    (`kube.statuswriter`): a claim's across all its quotas, all or nothing (module doc)."""

    def pending(self, namespace: str, name: str) -> Charge:
        """What the quota's persisted entries add to this replica's ledger now, as the status
        shows it (`apply` also counts the leases, `quota.accounting.headroom`)."""
        obj = self._objects.get((Namespace(namespace), name))
        if obj is None:
            return Charge()
        return in_flight(settle(parse_record(obj.get("status")), self, now=self.clock()), self, leases=False)

    # -- admission --------------------------------------------------------------------

    async def admit(self, charges: Mapping[DeviceQuota, Charge], *, uid: str, claim: str,
                    dry_run: bool = False, series: str = "", source: Source = "Claim", own: str = "") -> Decision:
        """Reserve `charges` (quota -> charge) for `uid`: under this process's lease where one
        has room (`kube.leasebook`, no write), the rest in key order (module doc), all or
        nothing; `series` replaces earlier attempts (`quota.accounting.reservations.Request.series`);
        `own`: an allocation's claim, checked whole (`quota.accounting.reservations.Request.own`)."""
        local: list[DeviceQuota] = []
        # Workloads, the scheduler's attempts and allocations' excesses (`quota.accounting.excess`): one entry each.
        if source == "Claim" and not series and parse_allocation_key(uid) is None:
            now = self.clock()
            local = [q for q in charges if self.leases.take(q, uid, charges[q], now, dry_run=dry_run)]
        try:
            decision = await self._admit_exact({q: c for q, c in charges.items() if q not in local}, uid=uid,
                                               claim=claim, dry_run=dry_run, series=series, source=source, own=own)
        except BaseException:
            for quota in local if not dry_run else ():
                self.leases.untake(quota, uid)
            raise
        if not decision.allowed:
            for quota in local if not dry_run else ():
                self.leases.untake(quota, uid)
            return decision
        if not dry_run:
            self.leases.stats.admitted["lease"] += len(local)
            self.leases.stats.admitted["exact"] += len(charges) - len(local)
        charged = sorted({*decision.charged, *(q.ref for q in local)},
                         key=lambda ref: ("" if "/" in ref else "~", ref))
        return replace(decision, charged=tuple(charged))

    async def _admit_exact(self, charges: Mapping[DeviceQuota, Charge], *, uid: str, claim: str,
                           dry_run: bool, series: str, source: Source, own: str = "") -> Decision:
        done: list[tuple[DeviceQuota, Undo | None]] = []
        warnings: list[str] = []
        warned_by: list[str] = []
        try:
            for quota in sorted(charges, key=lambda q: (q.namespace, q.name)):
                request = Request("reserve", uid, claim, charges[quota], series, source, own=own)
                decision, undo = await (self._check(quota, request) if dry_run else self._submit(quota, request))
                if not decision.allowed:
                    await self._compensate(done, uid)
                    return Decision(False, decision.message, (*warnings, *decision.warnings),
                                    denied_by=decision.denied_by)
                done.append((quota, undo))
                warnings.extend(decision.warnings)
                warned_by.extend(decision.warned_by)
        except asyncio.CancelledError:
            if not dry_run:
                # The review ran out of time (`webhook.server`): it is answered denied, so its
                # object is never created, but a write of its batch may still land. Release
                # it everywhere it may be held, queued behind that write, rather than leave
                # an orphan holding room for a TTL. An allocation's excess only where its
                # reserve's outcome is known: its key may hold another attempt's excess too
                # (`quota.accounting.excess`), so the one in flight is left to settle or expire.
                excess = parse_allocation_key(uid) is not None
                self._release_soon(done if excess else [(q, None) for q in charges], uid)
            raise
        return Decision(True, "", tuple(warnings), tuple(q.ref for q, _ in done), warned_by=tuple(warned_by))

    def _release_soon(self, quotas: list[tuple[DeviceQuota, Undo | None]], uid: str) -> None:
        task = asyncio.create_task(self._compensate(quotas, uid), name=f"release {uid}", context=ungated())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def release(self, namespace: str, uid: str) -> None:
        """Remove `uid`'s entries from the quotas of `namespace` (and the team quotas) that
        hold one: only for an admission whose object will never be created (a Workload
        whose Ready could not be written), never for a claim DELETE (module doc)."""
        keys = [k for k, obj in self._objects.items()
                if k[0] in (namespace, "") and uid in ((obj.get("status") or {}).get("reservations") or {})]
        await asyncio.gather(*(self._release_one(k, uid) for k in keys))

    async def _compensate(self, quotas: list[tuple[DeviceQuota, Undo | None]], uid: str) -> None:
        """All or nothing: take `uid`'s reserves back from `quotas`; an allocation's excess by
        its `Undo`, so another attempt's on the same copy stays (`quota.accounting.excess`)."""
        await asyncio.gather(*(self._release_one((q.namespace, q.name), uid, undo) for q, undo in quotas))

    async def _release_one(self, key: QuotaKey, uid: str, undo: Undo | None = None) -> None:
        try:
            await self._submit_key(key, Request("release", uid, undo=undo))
        except Exception as err:  # noqa: BLE001 - the entry expires anyway
            log.warning("cannot release reservation %s on %s: %s; it expires after %ss",
                        uid, shown(key), err, self.ttl)

    async def close(self, *, patience: float = 2.0) -> None:
        """Shutdown, once no review is in flight: shrink each lease to what it admitted and
        has not settled (the rest of its room is not held idle until it expires), each
        write bounded by `patience`; then stop tending them."""
        for key in list(self.leases.leases):
            self.leases.idle(key)
            try:
                await asyncio.wait_for(self._write(key, []), patience)
            except Exception as err:  # noqa: BLE001 - it expires as an orphan, as after a SIGKILL
                log.warning("cannot release the lease on %s: %s", shown(key), err)
        await self.leases.close()
