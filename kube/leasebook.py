"""This process's leases (`quota.accounting.headroom`), one per DeviceQuota it admits into while far from `hard`.

Neighbours: `kube.quotawriter.Reservations` owns one `LeaseBook`: `take` on a claim CREATE
(no write, no await), `writing`/`landed`/`unwritten`/`uncertain` around each status write
it makes of a quota (the plan is `quota.accounting.headroom.renew`'s), and `tend` writes each lease
when it is `due`: near the end of its window, so that its holder renews it (claims still
arriving) or shrinks it to what it admitted and has not settled (idle), releasing the
room it held for nothing; and, once shrunk near `hard`, as soon as part of it settles.
Everything here runs on the event loop between awaits, so a book never changes between a
decision and its record.

Keys: `lease.<holder>.<n>`, `holder` unique per process (the Pod's name and a random
nonce: a restarted process never adopts an old lease, which expires as an orphan); `n`
moves when a write's outcome is unknown (a timeout, a 5xx): the old entry is left to
expire rather than guessed at.

`LeaseStats` counts admissions by path and lease writes by outcome, plain integers that
`webhook.metrics` reads at each scrape (as `kube.watching.ReflectorStats`), with the room
the book holds (`LeaseBook.room`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from kube.apierror import ApiError
from kube.writegate import ungated
from quota.accounting.headroom import (LEASE_PREFIX, Lease, Plan, Sizing, SpecVersion, landed, leasable, newer, settleable, take,
                            untake, writing)
from quota.accounting.ledger import QuotaKey, shown
from quota.accounting.reservations import Caches
from quota.quotas.devicequota import DeviceQuota
from quota.values.model import ZERO, Charge
from quota.values.raw import Obj

__all__ = ["LeaseBook", "LeaseStats", "PATHS", "WRITE_OUTCOMES", "default_holder", "version_of"]

log = logging.getLogger(__name__)

# Seconds leases stay off after the DeviceQuota CRD refused one (`LeaseBook.refused_by_schema`).
SCHEMA_RETRY = 300.0

Path = Literal["lease", "exact"]
# What a status write did to this process's entry: granted (a new lease), renewed (a new
# window), shrunk (no window: what it admitted and has not settled), released (the entry
# removed), refused (the CRD's schema: `refused_by_schema`), uncertain (outcome unknown).
WriteOutcome = Literal["granted", "renewed", "shrunk", "released", "refused", "uncertain"]
PATHS: tuple[Path, ...] = ("lease", "exact")
WRITE_OUTCOMES: tuple[WriteOutcome, ...] = ("granted", "renewed", "shrunk", "released", "refused", "uncertain")


def default_holder() -> str:
    """The Pod's name (POD_NAME, else the host name) and a nonce unique to this process."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}-{secrets.token_hex(4)}"


@dataclass(slots=True)
class LeaseStats:
    """Plain counters, read by the metrics layer at each scrape (dryRun never counted)."""

    # Reservations admitted, one per quota: under the lease (no write) or by an entry of their own.
    admitted: dict[Path, int] = field(default_factory=lambda: dict.fromkeys(PATHS, 0))
    writes: dict[WriteOutcome, int] = field(default_factory=lambda: dict.fromkeys(WRITE_OUTCOMES, 0))


@dataclass(slots=True)
class LeaseBook:
    """This process's leases by quota, their keys, and the tasks that tend them."""

    sizing: Sizing = field(default_factory=lambda: Sizing(period=0.0))
    holder: str = field(default_factory=default_holder)
    leases: dict[QuotaKey, Lease] = field(default_factory=dict)
    serials: dict[QuotaKey, int] = field(default_factory=dict)
    tending: dict[QuotaKey, asyncio.Task[None]] = field(default_factory=dict)
    # Until when leases are off: the CRD refused one (`refused_by_schema`).
    refused_until: float = 0.0
    # The newest object and generation seen of each quota (watch, reads, our writes'
    # answers): a lease granted on an older one admits nothing (`quota.accounting.headroom.take`).
    versions: dict[QuotaKey, SpecVersion] = field(default_factory=dict)
    stats: LeaseStats = field(default_factory=LeaseStats)

    def key(self, quota: QuotaKey) -> str:
        return f"{LEASE_PREFIX}{self.holder}.{self.serials.get(quota, 0)}"

    def leasable(self, quota: DeviceQuota) -> bool:
        return leasable(quota, self.sizing) and time.monotonic() >= self.refused_until

    def take(self, quota: DeviceQuota, uid: str, charge: Charge, now: float, *, dry_run: bool = False) -> bool:
        """Admit claim `uid` under this process's lease on `quota` (recorded unless `dry_run`)."""
        if not self.leasable(quota):
            return False
        key = (quota.namespace, quota.name)
        taken = take(self.leases.get(key), quota, uid, charge, now, seen=self.versions.get(key))
        if taken is not None and not dry_run:
            self.leases[key] = taken
        return taken is not None

    def saw(self, quota: QuotaKey, obj: Obj) -> None:
        """This process has seen `obj`, an object of `quota` (from the watch, a read or a
        write's answer). Another uid than the one known: the old object's lease went with
        it (a quota deleted and created again holds none, and no other replica counts it)."""
        version = version_of(obj)
        known = self.versions.get(quota)
        if known is not None and known.uid != version.uid:
            self.uncertain(quota)
        self.versions[quota] = newer(known, version)

    def forget(self, quota: QuotaKey) -> None:
        """The quota was deleted: its lease went with it; a lease landed after this (a
        write answered late) matches no object seen, so it admits nothing either."""
        self.versions.pop(quota, None)
        self.uncertain(quota)

    def untake(self, quota: DeviceQuota, uid: str) -> None:
        key = (quota.namespace, quota.name)
        if (lease := self.leases.get(key)) is not None:
            self.leases[key] = untake(lease, uid)

    def writing(self, quota: QuotaKey, plan: Plan) -> None:
        if (lease := writing(self.leases.get(quota), plan)) is not None:
            self.leases[quota] = lease

    def landed(self, quota: QuotaKey, plan: Plan) -> None:
        if (lease := landed(self.leases.get(quota), plan)) is not None:
            self.leases[quota] = lease
        else:
            self.leases.pop(quota, None)

    def wrote(self, quota: QuotaKey, plan: Plan, before: Obj | None, after: Obj) -> None:
        """Count a landed status write of `quota` by what it did to this process's entry
        (`before`: the object it was built from; none changed: not a lease write)."""
        key = self.key(quota)
        old, new = _entry(before, key), _entry(after, key)
        if old == new:
            return
        outcome: WriteOutcome = ("released" if plan.lease is None else "shrunk" if plan.lease.until <= 0
                                 else "granted" if old is None else "renewed")
        self.stats.writes[outcome] += 1

    def room(self) -> Charge:
        """What this process's leases hold, summed over quotas, as written (a lease whose
        write's outcome was unknown has left the book: its entry expires as an orphan)."""
        return sum((lease.amount for lease in self.leases.values()), ZERO)

    def unwritten(self, quota: QuotaKey) -> None:
        """The write did not happen (a conflict, nothing to write): the book as it was."""
        if (lease := self.leases.get(quota)) is not None:
            self.leases[quota] = replace(lease, limit=None)

    def idle(self, quota: QuotaKey) -> None:
        """No more local admissions under the lease on `quota`: its next write shrinks it."""
        if (lease := self.leases.get(quota)) is not None:
            self.leases[quota] = replace(lease, until=0.0, taken=0)

    def refused_by_schema(self, quota: QuotaKey, err: ApiError) -> bool:
        """Whether `err` is the API server refusing a lease entry by the DeviceQuota CRD's
        schema (a 422 naming the `Lease` source): the CRD predates leases, its upgrade
        forgotten (Helm never upgrades a chart's `crds/`). Such a write did not land.
        Leases are then off for `SCHEMA_RETRY` seconds (said as an error with the fix),
        admissions going on with one entry each: slower, never refused for it; the next
        lease after that finds the CRD applied, or is refused and falls back again."""
        if err.status != 422 or '"Lease"' not in err.message:  # Unsupported value: "Lease": supported values: ...
            return False
        log.error("the DeviceQuota CRD refuses lease entries (%s): admitting with one entry each, leases tried again "
                  "in %gs; apply the CRDs of this release (kubectl apply --server-side -f deploy/crds/, "
                  "docs/install.md \"Upgrade and uninstall\")", err.message[:300], SCHEMA_RETRY)
        self.refused_until = time.monotonic() + SCHEMA_RETRY
        self.stats.writes["refused"] += 1
        self.unwritten(quota)
        return True

    def uncertain(self, quota: QuotaKey, plan: Plan | None = None) -> None:
        """The write may or may not have landed (`plan`: the one it carried; none, the quota
        went): stop admitting under this lease and take the next key; the entry, whichever
        it is, expires as an orphan."""
        held = self.leases.pop(quota, None)
        if plan is not None and (held is not None or plan.lease is not None):  # a write that carried a lease
            self.stats.writes["uncertain"] += 1
        self.serials[quota] = self.serials.get(quota, 0) + 1

    def due(self, quota: QuotaKey, caches: Caches, now: float, ttl: float) -> bool:
        """Whether the lease on `quota` wants its holder's write now: a fifth of a period
        before its window ends (claims still arriving find it renewed, an idle one is
        released, what can be settled is); once it was shrunk (near `hard`), as soon as
        part of it can be settled (`quota.accounting.headroom.settleable`): only there do the other
        replicas' denials depend on it. Far from `hard`, settling at each renewal keeps
        the writes to about one a period."""
        lease = self.leases.get(quota)
        if lease is None:
            return False
        if lease.expires <= now:  # every writer drops it now: nothing left to settle or admit
            del self.leases[quota]
            return False
        if lease.until > 0:
            return lease.until - self.margin <= now
        return settleable(lease, caches, now=now, ttl=ttl)

    @property
    def margin(self) -> float:
        return self.sizing.margin

    @property
    def poll(self) -> float:
        """How often a lease is looked at: writes of one lease come at most this often."""
        return min(self.sizing.period / 10, 0.5)

    def tend(self, quota: QuotaKey, write: Callable[[], Awaitable[object]], caches: Caches, *,
             clock: Callable[[], float], ttl: float) -> None:
        """Have `write` (a status write of `quota` with no admission) run whenever the lease
        on `quota` is `due`, until the lease is gone."""
        if quota not in self.tending and quota in self.leases:
            self.tending[quota] = asyncio.create_task(self._tend(quota, write, caches, clock, ttl),
                                                      name=f"lease {shown(quota)}", context=ungated())

    async def _tend(self, quota: QuotaKey, write: Callable[[], Awaitable[object]], caches: Caches,
                    clock: Callable[[], float], ttl: float) -> None:
        try:
            while quota in self.leases:
                await asyncio.sleep(self.poll)
                if not self.due(quota, caches, clock(), ttl):
                    continue
                try:
                    await write()
                except Exception as err:  # noqa: BLE001 - tried again when next due
                    log.warning("cannot renew the lease on %s: %s", shown(quota), err)
        finally:
            self.tending.pop(quota, None)

    async def close(self) -> None:
        """Stop tending (shutdown): each lease expires as an orphan, as after a SIGKILL."""
        tasks = list(self.tending.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def version_of(obj: Obj) -> SpecVersion:
    """The uid and `metadata.generation` of a quota object (0 where a fake API server sets none)."""
    meta = obj.get("metadata") or {}
    generation = meta.get("generation")
    return SpecVersion(str(meta.get("uid") or ""),
                       generation if isinstance(generation, int) and not isinstance(generation, bool) else 0)


def _entry(obj: Obj | None, key: str) -> object:
    return (((obj or {}).get("status") or {}).get("reservations") or {}).get(key)
