"""Self-managed certificates: keep the Secret, the caBundles and the served pair in step.

Neighbours: `certs.rotation.plan` decides what to mint; `certs.tls.ReloadingContext` is
handed each new serving pair (`on_serving`); the Kubernetes side is the `Store`
protocol, implemented over `kube.api` by `webhook.certificates`. The I/O is
injected rather than imported so `certs` stays free of `quota` and `webhook` (the
import-linter contract "certs stands alone") and this loop is unit-tested with a fake.

One pass (`reconcile`):
1. read the Secret (absent: it is created; two replicas racing get a conflict, and the
   loser re-reads the winner's material instead of minting its own);
2. read every configured webhook configuration; a CA counts as trusted once it is in
   the caBundle of every webhook of every configuration *and* has been seen there for
   `trust_delay` (the API server picks a changed configuration up through an informer:
   a leaf moved to a new CA the instant the patch returned could meet an API server
   still holding the old bundle);
3. `plan(...)`; a new material is written with the read resourceVersion as
   precondition (conflict: re-read and re-plan, the other replica's write wins);
4. patch the Secret's bundle into every configuration whose caBundles differ;
5. serve the Secret's leaf (`on_serving`) when it changed.
Replicas converge on the one Secret; none serves a leaf whose CA the configurations do
not trust yet (rotation.py's order, plus the delay above).

Nothing here logs key material: only subjects, serials, dates and reasons.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Protocol

from certs.authority import KeyPair, inspect, split_pem
from certs.rotation import Material, Policy, plan

__all__ = ["CertificateManager", "Conflict", "Secret", "Store", "WebhookConfiguration"]

log = logging.getLogger(__name__)

# A pass that keeps losing write races gives up after this many tries and is retried
# on the next wake-up; two or three replicas settle within one or two.
_MAX_CONFLICTS = 5
_MIN_WAKE = 0.2  # seconds: never spin, even when a deadline has just passed


class Conflict(Exception):
    """A write lost a race (HTTP 409, or the object vanished under a precondition)."""


@dataclass(frozen=True, slots=True)
class Secret:
    data: Mapping[str, bytes]
    resource_version: str


@dataclass(frozen=True, slots=True)
class WebhookConfiguration:
    """One Validating/MutatingWebhookConfiguration: its webhooks' decoded caBundles (b"" when unset)."""

    kind: str
    name: str
    resource_version: str
    bundles: Mapping[str, bytes]


class Store(Protocol):
    async def read_secret(self) -> Secret | None: ...

    async def create_secret(self, data: Mapping[str, bytes]) -> None:
        """Raise `Conflict` when it already exists."""

    async def replace_secret(self, data: Mapping[str, bytes], resource_version: str) -> None:
        """Raise `Conflict` when the Secret changed since `resource_version` (or is gone)."""

    async def read_configurations(self) -> Sequence[WebhookConfiguration]:
        """The configurations that exist (a missing one is left out)."""

    async def patch_bundle(self, configuration: WebhookConfiguration, bundle: bytes) -> None:
        """Set every webhook's caBundle; raise `Conflict` if it changed since it was read."""


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _fingerprints(bundle: bytes) -> frozenset[str]:
    try:
        return frozenset(inspect(pem).fingerprint_sha256 for pem in split_pem(bundle))
    except ValueError:
        return frozenset()  # unset or garbage: trusts nothing of ours


class CertificateManager:
    def __init__(
        self,
        store: Store,
        policy: Policy,
        on_serving: Callable[[KeyPair], object],
        *,
        period: timedelta = timedelta(hours=1),
        trust_delay: timedelta = timedelta(seconds=60),
        clock: Callable[[], datetime] = _utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.policy, self.on_serving = store, policy, on_serving
        self.period, self.trust_delay = period, trust_delay
        self.clock, self.monotonic = clock, monotonic
        # fingerprint -> when it was first seen in every configuration (monotonic)
        self._trusted_since: dict[str, float] = {}
        self.material: Material | None = None
        self.served_serial: int | None = None
        self.writes = 0  # Secret writes this process made (creation, renewals, rollovers)

    # -- one pass ----------------------------------------------------------------------------

    async def reconcile(self) -> Material:
        """One pass (module doc); returns the material now in the Secret and served."""
        for _ in range(_MAX_CONFLICTS):
            secret = await self.store.read_secret()
            current = self._parse(secret)
            configurations = await self.store.read_configurations()
            trusted = self._trusted(configurations, current)
            step = plan(current, self.policy, now=self.clock(), trusted=trusted)
            if step is None:
                assert current is not None  # plan(None, ...) always mints
                material = current
            else:
                data = step.material.secret_data()
                try:
                    if secret is None:
                        await self.store.create_secret(data)
                    else:
                        await self.store.replace_secret(data, secret.resource_version)
                except Conflict:
                    log.info("the certificate Secret changed under us (another replica?): re-reading")
                    continue
                self.writes += 1
                material = step.material
                log.info("certificate Secret written: %s; serving %s", "; ".join(step.reasons),
                         self._describe(material.serving))
            if await self._inject(material, configurations):
                self._serve(material)
                return material
            # A configuration changed between read and patch: start over from the reads.
        raise Conflict(f"gave up after {_MAX_CONFLICTS} write conflicts; retrying later")

    def _parse(self, secret: Secret | None) -> Material | None:
        if secret is None:
            return None
        try:
            return Material.from_secret_data(secret.data)
        except ValueError as err:
            # Written by hand or truncated: replaced by fresh material (under the precondition).
            log.warning("the certificate Secret is unusable (%s): minting new material", err)
            return None

    def _trusted(self, configurations: Sequence[WebhookConfiguration], current: Material | None) -> frozenset[str]:
        sets = [_fingerprints(b) for c in configurations for b in c.bundles.values()]
        if not sets:
            # No configuration exists: no API server calls us, so no leaf can be distrusted.
            return current.fingerprints() if current is not None else frozenset()
        now = self.monotonic()
        everywhere = frozenset.intersection(*sets)
        for fingerprint in [f for f in self._trusted_since if f not in everywhere]:
            del self._trusted_since[fingerprint]
        for fingerprint in everywhere:
            self._trusted_since.setdefault(fingerprint, now)
        delay = self.trust_delay.total_seconds()
        return frozenset(f for f, since in self._trusted_since.items() if now - since >= delay)

    async def _inject(self, material: Material, configurations: Sequence[WebhookConfiguration]) -> bool:
        bundle = b"".join(material.bundle)
        for configuration in configurations:
            if all(b == bundle for b in configuration.bundles.values()):
                continue
            try:
                await self.store.patch_bundle(configuration, bundle)
            except Conflict:
                return False
            log.info("caBundle of %s %s set to %d CA(s)", configuration.kind, configuration.name,
                     len(material.bundle))
        if configurations:
            # Every configuration now holds the bundle: the trust delay runs from here,
            # not from the next pass's read.
            now = self.monotonic()
            for fingerprint in material.fingerprints():
                self._trusted_since.setdefault(fingerprint, now)
        return True

    def _serve(self, material: Material) -> None:
        self.material = material
        serial = inspect(material.serving.cert_pem).serial
        if serial != self.served_serial:
            self.on_serving(material.serving)
            self.served_serial = serial
            log.info("serving %s", self._describe(material.serving))

    @staticmethod
    def _describe(pair: KeyPair) -> str:
        info = inspect(pair.cert_pem)
        return f"serial {info.serial:x} issued by {info.issuer}, valid until {info.not_after:%Y-%m-%dT%H:%M:%SZ}"

    # -- for metrics and the loop ----------------------------------------------------------

    def expiry_seconds(self) -> float | None:
        """Seconds until the served certificate expires (None before the first pass): the
        value for a `dra_quota_certificate_expiry_seconds` gauge."""
        if self.material is None:
            return None
        return (inspect(self.material.serving.cert_pem).not_after - self.clock()).total_seconds()

    def next_wake(self) -> float:
        """Seconds until the next pass: the check period, or sooner when a renewal falls due
        or a rollover waits for the trust delay (so the period never delays a renewal)."""
        wake = self.period.total_seconds()
        material = self.material
        if material is None:
            return wake
        now, policy = self.clock(), self.policy
        serving = inspect(material.serving.cert_pem)
        ca = inspect(material.ca.cert_pem)
        for due in (serving.not_after - policy.serving_renew_before, ca.not_after - policy.ca_renew_before):
            ahead = (due - now).total_seconds()
            if ahead > 0:
                wake = min(wake, ahead)
        if serving.issuer != ca.subject:  # a rollover waits for the new CA to be trusted
            since = self._trusted_since.get(ca.fingerprint_sha256)
            left = self.trust_delay.total_seconds() - (self.monotonic() - since if since is not None else 0.0)
            wake = min(wake, max(left, 0.0))
        return max(wake, _MIN_WAKE)

    async def run(self) -> None:
        """`reconcile` at every wake-up until cancelled; failures are logged and retried
        with backoff (the pair being served stays valid for `serving_renew_before`)."""
        failures = 0
        while True:
            try:
                await self.reconcile()
                failures = 0
                delay = self.next_wake()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - any API failure: keep serving, retry
                failures += 1
                delay = min(2.0 ** failures, 60.0, self.period.total_seconds())
                log.warning("certificate check failed (%s: %s); retrying in %.0fs",
                            type(err).__name__, err, delay)
            await asyncio.sleep(delay)
