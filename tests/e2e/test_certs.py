"""`dra-quota serve --cert-mode self` against the real 1.37 API server.

The process mints its CA and serving certificate into a per-test Secret in
dra-quota-system, patches the caBundle of the shipped configurations (adapted as in
tests/e2e/harness.py, with their caBundle removed so only the process can make them work) and
serves `dra-quota-webhook.dra-quota-system.svc`, the name the API server verifies.
Proof that the API server trusts what is served, over both configurations: every
dry-run claim create that carries a forged `draquota.io/charge` comes back with the
charge our mutating webhook writes (/admit), and every dry-run template create carrying
it comes back refused with our own message (/validate), in a namespace a DeviceQuota
governs (failurePolicy Fail there, so a TLS failure is a "failed calling webhook" error,
never a silent skip).

Rotation under load uses validities of seconds (the NotBefore back-dating of an hour
in certs.authority does not matter): serving certificates live 10 s and are renewed
7 s ahead, the CA lives 60 s and rolls over 45 s ahead (so once, ~15 s in), and a new
CA must sit in every caBundle for 2 s before the leaf moves to it. Dry-run creates
run continuously meanwhile; each one goes through the webhook and writes nothing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from runtime.metricnames import CERTIFICATE_EXPIRATION

from .cluster import ControlPlane, free_ports
from .driver import RESOURCE_V1, Gpu, GpuFleet, claim_spec, exact_request
from .harness import (
    ADMISSION, DQ, PLURALS, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, governed, unique,
)
from .kube import ApiError, Kube, Obj, poll
from .webhook_recorder import WEBHOOKS

pytestmark = pytest.mark.e2e

NAMESPACE, SERVICE = "dra-quota-system", "dra-quota-webhook"
CHARGE = "draquota.io/charge"
# Our webhook's answer to a new template carrying our annotation: only it can say this.
OURS = f"annotation {CHARGE} is written by dra-quota once the claim exists"
ROTATION_FLAGS = ("--cert-check-period", "0.5s", "--ca-trust-delay", "2s", "--ca-validity", "60s",
                  "--ca-renew-before", "45s", "--cert-validity", "10s", "--cert-renew-before", "7s")


@dataclass
class CertSetup:
    kube: Kube
    namespace: str
    fleet: GpuFleet
    served: Served
    secret: str
    configs: list[tuple[str, str]] = field(default_factory=list)


async def _ensure_namespace(kube: Kube, name: str) -> None:
    try:
        await kube.create("v1", "namespaces", {"kind": "Namespace", "metadata": {"name": name}})
    except ApiError as err:
        if err.status != 409:
            raise


@pytest_asyncio.fixture(loop_scope="session")
async def cert_setup(request: pytest.FixtureRequest, cluster: ControlPlane, kube: Kube, crd: None,
                     make_namespace: MakeNamespace, make_fleet: MakeFleet,
                     tmp_path: Path) -> AsyncIterator[CertSetup]:
    """Configurations without caBundle, then the process; torn down in the reverse order."""
    flags = tuple(getattr(request, "param", ()))
    run = uuid.uuid4().hex[:8]
    fleet = await make_fleet("certs")
    await fleet.add_node("n1", [Gpu()])
    namespace = await make_namespace("certs", labels={RUN_LABEL: run})
    await _ensure_namespace(kube, NAMESPACE)
    port, metrics_port = free_ports(2)
    names = []
    secret = unique("tls")
    served = Served(cluster, port, tmp_path / "serve.log", self_managed=True, metrics_port=metrics_port)
    setup = CertSetup(kube, namespace, fleet, served, secret)
    try:
        for config in adapted_webhooks(run, port, cluster):
            for hook in config["webhooks"]:
                del hook["clientConfig"]["caBundle"]
            plural = PLURALS[config["kind"]]
            await kube.create(ADMISSION, plural, config)
            setup.configs.append((plural, config["metadata"]["name"]))
            names.append(f"{config['kind'].removesuffix('WebhookConfiguration').lower()}/{config['metadata']['name']}")
        served.args = ("--cert-mode", "self", "--namespace", NAMESPACE, "--service-name", SERVICE,
                       "--cert-secret", secret, "--webhook-configurations", ",".join(names), *flags)
        with setup.served.log_on_failure():
            await setup.served.start()
            # A quota, so that the namespace is governed: its webhooks fail closed.
            await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "all"},
                                                   "spec": {"hard": {"devices": 100}}}, namespace=namespace)
            await governed(kube, namespace)
        yield setup
    finally:
        for plural, name in reversed(setup.configs):
            await kube.delete(ADMISSION, plural, name)
        await setup.served.kill()
        with contextlib.suppress(ApiError):
            await kube.delete("v1", "secrets", setup.secret, namespace=NAMESPACE)


def _certs(b64: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(base64.b64decode(b64)) if b64 else []


async def _bundles(kube: Kube, setup: CertSetup) -> list[list[x509.Certificate]]:
    out = []
    for plural, name in setup.configs:
        config = await kube.get(ADMISSION, plural, name)
        out += [_certs(h["clientConfig"].get("caBundle", "")) for h in config["webhooks"]]
    return out


async def _judged(kube: Kube, setup: CertSetup) -> str:
    """A dry-run claim create whose forged charge only our mutating webhook replaces, and a
    dry-run template create only our validating webhook refuses; "ours" when both were
    answered so (the API server called both configurations over TLS it verified), else
    what happened (a TLS or connection failure is "failed calling webhook" under Fail)."""
    spec = claim_spec(exact_request("gpu", setup.fleet.device_class))
    claim = {"kind": "ResourceClaim", "metadata": {"name": unique("c"), "annotations": {CHARGE: "x"}}, "spec": spec}
    try:
        made = await kube.create(RESOURCE_V1, "resourceclaims", claim, namespace=setup.namespace, dry_run=True)
    except ApiError as err:
        return str(err)[:300]
    charge = (made["metadata"].get("annotations") or {}).get(CHARGE)
    if charge is None or '"devices":1' not in charge:
        return f"claim admitted with charge {charge!r}: the mutating webhook was not called"
    template = {"kind": "ResourceClaimTemplate", "metadata": {"name": unique("t")},
                "spec": {"metadata": {"annotations": {CHARGE: "x"}}, "spec": spec}}
    try:
        await kube.create(RESOURCE_V1, "resourceclaimtemplates", template, namespace=setup.namespace, dry_run=True)
    except ApiError as err:
        return "ours" if OURS in err.message else str(err)[:300]
    return "template admitted: the validating webhook was not called"


async def test_self_managed_certificate_is_stored_injected_and_trusted(kube: Kube, cert_setup: CertSetup) -> None:
    setup = cert_setup
    with setup.served.log_on_failure():
        secret = await kube.get("v1", "secrets", setup.secret, namespace=NAMESPACE)
        assert set(secret["data"]) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
        ca = _certs(secret["data"]["ca.crt"])
        leaf = _certs(secret["data"]["tls.crt"])[0]
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert f"{SERVICE}.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
        bundles = await _bundles(kube, setup)
        shipped = sum(len(c["webhooks"]) for c in WEBHOOKS)
        assert len(bundles) == shipped and all(b == ca for b in bundles), "every webhook of the configuration"
        # The API server calls the webhook over TLS it verified: our own refusal.
        assert await _judged(kube, setup) == "ours"
        log = setup.served.log_text()
        assert "PRIVATE KEY" not in log and secret["data"]["tls.key"] not in log
        # The expiry gauges follow what is served: the Secret's leaf, and its one CA.
        samples = await setup.served.metrics()
        assert samples[(CERTIFICATE_EXPIRATION, frozenset({("certificate", "serving")}))] == \
            leaf.not_valid_after_utc.timestamp()
        assert samples[(CERTIFICATE_EXPIRATION, frozenset({("certificate", "ca")}))] == \
            ca[0].not_valid_after_utc.timestamp()


@pytest.mark.parametrize("cert_setup", [ROTATION_FLAGS], indirect=True)
async def test_rotation_under_load_fails_no_request(kube: Kube, cert_setup: CertSetup) -> None:
    setup = cert_setup
    ok, failures, stop = [0], [], asyncio.Event()

    async def client() -> None:
        while not stop.is_set():
            outcome = await _judged(kube, setup)
            if outcome == "ours":
                ok[0] += 1
            else:
                failures.append(outcome)

    serials: set[int] = set()
    cas: set[bytes] = set()
    max_bundle = [0]

    async def rotated() -> bool:
        secret = await kube.get("v1", "secrets", setup.secret, namespace=NAMESPACE)
        leaf = _certs(secret["data"]["tls.crt"])[0]
        serials.add(leaf.serial_number)
        bundle = _certs(secret["data"]["ca.crt"])
        cas.update(c.fingerprint(hashes.SHA256()) for c in bundle)
        configured = await _bundles(kube, setup)
        max_bundle[0] = max(max_bundle[0], min(len(b) for b in configured))
        # Done once the leaf comes from the second CA and was renewed by it at least twice.
        on_new_ca = leaf.issuer == bundle[0].subject and len(cas) >= 2
        return on_new_ca and len(serials) >= 8

    with setup.served.log_on_failure():
        started = time.monotonic()
        clients = [asyncio.create_task(client()) for _ in range(2)]
        try:
            await poll(rotated, timeout=90, what="renewals and one CA rollover", interval=0.2, max_interval=0.2)
        finally:
            stop.set()
            await asyncio.gather(*clients)
        seconds = time.monotonic() - started
        log = setup.served.log_text()
        writes = log.count("certificate Secret written")
        moved = log.count("moved the serving certificate to the new CA")
        print(f"rotation under load: {ok[0]} creates in {seconds:.1f}s, {len(failures)} failed; "
              f"{writes} Secret writes, {len(serials)} leaves seen, {len(cas)} CAs, {moved} leaf move(s), "
              f"caBundle held up to {max_bundle[0]} CAs")
        assert not failures, failures[:5]
        assert moved == 1 and max_bundle[0] >= 2, "old and new CA side by side during the rollover"
        assert ok[0] >= 50
