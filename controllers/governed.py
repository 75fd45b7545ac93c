"""The leader keeps the label `draquota.io/governed=true` on every namespace a quota governs:
one holding a DeviceQuota, or selected by a ClusterDeviceQuota (a team's namespace).

Neighbours: `commands.serve` runs `GovernedLabels.run` on the Lease holder, beside the
quota controller, and tells `changed` the namespace of every Namespace event and
`quotas_changed` the quotas each DeviceQuota or claim event moved (`kube.caches`, `kube.claimstore`); the
namespace cache (`kube.caches.NamespaceStore`) says what each namespace carries now and
`quota.accounting.ledger` which namespaces hold a DeviceQuota or belong to a team. A team's key
moves on every claim event of its namespaces; only a change of its members (a team
added, deleted or reselecting) changes which namespaces it governs, so only those are
looked at again. A ClusterDeviceQuota's selector can never key on the governed label
itself (its CRD allows only `kubernetes.io/metadata.name` and `team.draquota.io/*`):
labelling a namespace can never move it into or out of a team.

Why: the webhook configurations (deploy/manifests/webhooks.yaml)
hold each claim webhook twice, `failurePolicy: Fail` for namespaces with this label and
`Ignore` for the rest. So where a DeviceQuota governs, enforcement fails closed (while
the webhook is down its claims and allocations wait), and where nothing governs, our
failures block nobody. Only our ServiceAccount may set or remove the label: the
ValidatingAdmissionPolicy of deploy/manifests/governed-label-policy.yaml refuses
anyone else, in the API server, whether or not we run.

When it writes: on start (every namespace, after the caches synced), for each namespace
`changed` or `quotas_changed` names, and for every namespace each resync period (a
failed write, or a label edited by hand before the policy existed, is repaired without
any event). A write is a
merge patch of the one label (null removes it), sent only while leading and only when
the label differs from what it should be. RBAC: patch namespaces.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping

import aiohttp

from kube.api import KubeApi
from kube.apierror import ApiError
from kube.resources import NAMESPACES
from quota.accounting.ledger import Ledger, QuotaKey
from quota.quotas.devicequota import GOVERNED_LABEL
from quota.values.model import Namespace

__all__ = ["GOVERNED_LABEL", "GovernedLabels", "governed_value"]

log = logging.getLogger(__name__)

FIELD_MANAGER = "dra-quota"
_FAILURES = (ApiError, aiohttp.ClientError, TimeoutError, OSError)
_RETRY_AFTER_FAILURE = 2.0


def governed_value(ledger: Ledger, namespace: str) -> str | None:
    """The label's value `namespace` should carry: "true" while it holds a DeviceQuota or
    a ClusterDeviceQuota selects it (`Ledger.quotas`)."""
    return "true" if ledger.quotas(Namespace(namespace)) else None


class GovernedLabels:
    def __init__(self, api: KubeApi, ledger: Ledger, namespaces: Mapping[str, Mapping[str, str]], *,
                 leading: Callable[[], bool], resync: float = 300.0, concurrency: int = 4) -> None:
        self.api = api
        self.ledger = ledger
        self.namespaces = namespaces  # labels by namespace name, the namespace cache
        self.leading = leading
        self.resync = resync
        self.concurrency = concurrency
        self.writes = 0  # label writes that landed (tests and logs read it)
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        # Each team's members when last looked at (module doc).
        self._members: dict[str, frozenset[str]] = {}

    def changed(self, namespace: str | None) -> None:
        """A Namespace event of `namespace` (None: every namespace)."""
        self._dirty.update(self.namespaces if namespace is None else (namespace,))
        self._wake.set()

    def quotas_changed(self, keys: Iterable[QuotaKey] | None) -> None:
        """An event that moved these quotas (None: any): their namespaces, one added or
        deleted among them, may now be governed or not."""
        if keys is None:
            self._members = {q.name: frozenset(self.ledger.members(q.name)) for q in self.ledger.quotas() if q.cluster}
            self.changed(None)
            return
        for namespace, name in dict.fromkeys(keys):
            if namespace:
                self.changed(namespace)
                continue
            members = frozenset(self.ledger.members(name)) if self.ledger.quota(namespace, name) is not None \
                else frozenset()
            moved = members ^ self._members.get(name, frozenset())
            if members:
                self._members[name] = members
            else:
                self._members.pop(name, None)
            for member in moved:
                self.changed(member)

    async def run(self) -> None:
        """Label until cancelled. Start it only once the caches have synced."""
        self.quotas_changed(None)  # every namespace, and each team's members as they are now
        next_resync = time.monotonic() + self.resync
        while True:
            try:
                async with asyncio.timeout(max(next_resync - time.monotonic(), 0.0)):
                    await self._wake.wait()
            except TimeoutError:
                next_resync = time.monotonic() + self.resync
                self._dirty.update(self.namespaces)
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            failed = await self._pass(dirty)
            if failed:
                self._dirty.update(failed)
                await asyncio.sleep(_RETRY_AFTER_FAILURE)
                self._wake.set()

    async def _pass(self, names: Iterable[str]) -> list[str]:
        """Write the namespaces whose label is not what it should be; the ones that failed."""
        due = [(n, want) for n in sorted(names) if n in self.namespaces
               and (want := governed_value(self.ledger, n)) != self.namespaces[n].get(GOVERNED_LABEL)]
        semaphore = asyncio.Semaphore(self.concurrency)

        async def write(name: str, value: str | None) -> str | None:
            async with semaphore:
                return None if await self._write(name, value) else name

        return [n for n in await asyncio.gather(*(write(n, v) for n, v in due)) if n is not None]

    async def _write(self, name: str, value: str | None) -> bool:
        if not self.leading():
            return True  # the next leader's pass writes it
        patch = {"metadata": {"labels": {GOVERNED_LABEL: value}}}
        try:
            await self.api.patch(NAMESPACES, name, patch, field_manager=FIELD_MANAGER)
        except ApiError as err:
            if err.status == 404:
                return True  # gone
            log.warning("cannot %s namespace %s %s=true: %s", "label" if value else "unlabel", name,
                        GOVERNED_LABEL, err)
            return False
        except _FAILURES as err:
            log.warning("cannot label namespace %s: %s", name, err)
            return False
        self.writes += 1
        log.info("namespace %s: %s %s", name, "labelled" if value else "unlabelled", f"{GOVERNED_LABEL}=true")
        return True
