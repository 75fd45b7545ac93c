"""certs.manager over a fake Store: creation, races between replicas, trust before the leaf moves."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from certs.authority import KeyPair, inspect, service_names
from certs.manager import CertificateManager, Conflict, Secret, WebhookConfiguration
from certs.rotation import Material, Policy, plan

from ..clock import until

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
DAY = timedelta(days=1)
POLICY = Policy(dns_names=service_names("svc", "ns"), ca_validity=10 * DAY, ca_renew_before=2 * DAY,
                serving_validity=3 * DAY, serving_renew_before=1 * DAY)


class FakeStore:
    """One Secret and two configurations (two webhooks each) with resourceVersions."""

    def __init__(self) -> None:
        self.secret: Secret | None = None
        self.configs = {("validating", "v"): WebhookConfiguration("validating", "v", "1", {"a": b"", "b": b""}),
                        ("mutating", "m"): WebhookConfiguration("mutating", "m", "1", {"c": b""})}
        self.version = 0
        self.before_write: list[object] = []  # callables run once before the next Secret write

    def _bump(self) -> str:
        self.version += 1
        return str(self.version)

    def _race(self) -> None:
        while self.before_write:
            hook = self.before_write.pop(0)
            assert callable(hook)
            hook()

    async def read_secret(self) -> Secret | None:
        return self.secret

    async def create_secret(self, data: Mapping[str, bytes]) -> None:
        self._race()
        if self.secret is not None:
            raise Conflict("exists")
        self.secret = Secret(dict(data), self._bump())

    async def replace_secret(self, data: Mapping[str, bytes], resource_version: str) -> None:
        self._race()
        if self.secret is None or self.secret.resource_version != resource_version:
            raise Conflict("changed")
        self.secret = Secret(dict(data), self._bump())

    async def read_configurations(self) -> Sequence[WebhookConfiguration]:
        return list(self.configs.values())

    async def patch_bundle(self, configuration: WebhookConfiguration, bundle: bytes) -> None:
        key = (configuration.kind, configuration.name)
        if self.configs[key].resource_version != configuration.resource_version:
            raise Conflict("changed")
        self.configs[key] = replace(configuration, resource_version=self._bump(),
                                    bundles={n: bundle for n in configuration.bundles})


class Clock:
    def __init__(self) -> None:
        self.now, self.mono = T0, 0.0

    def advance(self, delta: timedelta) -> None:
        self.now += delta
        self.mono += delta.total_seconds()


def manager(store: FakeStore, clock: Clock, served: list[KeyPair] | None = None) -> CertificateManager:
    sink = served if served is not None else []
    return CertificateManager(store, POLICY, sink.append, trust_delay=timedelta(seconds=30),
                              clock=lambda: clock.now, monotonic=lambda: clock.mono)


def minted(current: Material | None, now: datetime = T0) -> Material:
    step = plan(current, POLICY, now=now, trusted=frozenset())
    assert step is not None
    return step.material


def rollover(m: CertificateManager, clock: Clock) -> Material:
    """Daily passes (renewing the leaf as due) until the CA is within renew-before."""
    for _ in range(7):
        clock.advance(DAY)
        asyncio.run(m.reconcile())
    clock.advance(DAY + timedelta(hours=1))
    return asyncio.run(m.reconcile())


def bundles(store: FakeStore) -> list[bytes]:
    return [b for c in store.configs.values() for b in c.bundles.values()]


def test_first_pass_creates_the_secret_injects_every_bundle_and_serves_the_leaf() -> None:
    store, clock, served = FakeStore(), Clock(), list[KeyPair]()
    m = manager(store, clock, served)
    material = asyncio.run(m.reconcile())
    assert store.secret is not None and set(store.secret.data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert bundles(store) == [store.secret.data["ca.crt"]] * 3
    assert served == [material.serving] and m.writes == 1
    assert m.expiry_seconds() == pytest.approx(3 * DAY.total_seconds())
    # Nothing changed: no write, no patch, nothing re-served.
    version = store.version
    asyncio.run(m.reconcile())
    assert store.version == version and len(served) == 1


def test_two_replicas_racing_to_create_converge_on_one_secret() -> None:
    store, clock = FakeStore(), Clock()
    a = manager(store, clock)
    # Another replica creates between a's read (absent) and a's create: a's create
    # conflicts, and a re-reads and adopts the other's material instead of its own.
    other = minted(None)
    store.before_write.append(lambda: setattr(store, "secret", Secret(other.secret_data(), "other")))
    adopted = asyncio.run(a.reconcile())
    assert adopted.serving == other.serving and a.writes == 0
    assert a.served_serial == inspect(other.serving.cert_pem).serial


def test_a_conflicting_replace_re_reads_and_re_plans() -> None:
    store, clock = FakeStore(), Clock()
    a = manager(store, clock)
    first = asyncio.run(a.reconcile())
    clock.advance(2 * DAY + timedelta(hours=1))  # the leaf is due for renewal
    # Another replica renews in between a's read and a's write.
    renewed = minted(first, clock.now)
    store.before_write.append(lambda: setattr(store, "secret", Secret(renewed.secret_data(), "other")))
    result = asyncio.run(a.reconcile())
    assert result.serving == renewed.serving and a.writes == 1, "only the creation was a's"


def test_the_leaf_moves_to_a_new_ca_only_after_every_bundle_trusted_it_for_the_delay() -> None:
    store, clock, served = FakeStore(), Clock(), list[KeyPair]()
    m = manager(store, clock, served)
    first = asyncio.run(m.reconcile())
    rolled = rollover(m, clock)
    assert len(rolled.bundle) == 2 and rolled.serving == served[-1]
    assert inspect(rolled.serving.cert_pem).issuer == inspect(first.ca.cert_pem).subject, "leaf not moved yet"
    assert bundles(store) == [b"".join(rolled.bundle)] * 3, "old and new CA in every bundle"
    assert 0 < m.next_wake() <= 30
    clock.advance(timedelta(seconds=10))
    assert asyncio.run(m.reconcile()).serving == rolled.serving, "trusted for 10 s only"
    clock.advance(timedelta(seconds=25))
    moved = asyncio.run(m.reconcile())
    assert inspect(moved.serving.cert_pem).issuer == inspect(rolled.ca.cert_pem).subject
    assert served[-1] == moved.serving and len(moved.bundle) == 2


def test_a_bundle_missing_the_new_ca_holds_the_leaf_back() -> None:
    store, clock = FakeStore(), Clock()
    m = manager(store, clock)
    asyncio.run(m.reconcile())
    rolled = rollover(m, clock)
    clock.advance(timedelta(minutes=5))
    # Someone (a Helm upgrade) reset one webhook's caBundle to the old CA only.
    config = store.configs[("mutating", "m")]
    store.configs[("mutating", "m")] = replace(config, bundles={"c": rolled.bundle[1]})
    again = asyncio.run(m.reconcile())
    assert again.serving == rolled.serving, "the reset bundle restarts the trust delay"
    assert bundles(store) == [b"".join(rolled.bundle)] * 3, "and is repaired"


def test_an_unusable_secret_is_replaced_and_no_key_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    store, clock = FakeStore(), Clock()
    store.secret = Secret({"tls.crt": b"junk"}, "7")
    with caplog.at_level(logging.DEBUG, logger="certs"):
        material = asyncio.run(manager(store, clock).reconcile())
    assert store.secret.resource_version != "7"
    assert b"PRIVATE KEY" not in caplog.text.encode() and material.serving.key_pem.decode() not in caplog.text
    assert "unusable" in caplog.text


def test_run_keeps_serving_through_api_failures() -> None:
    store, clock = FakeStore(), Clock()
    m = manager(store, clock)
    calls = [0]
    real = store.read_secret

    async def flaky() -> Secret | None:
        calls[0] += 1
        if calls[0] == 1:
            raise OSError("connection refused")
        return await real()

    store.read_secret = flaky  # type: ignore[method-assign]
    m.period = timedelta(milliseconds=10)

    async def main() -> None:
        task = asyncio.create_task(m.run())
        await until(lambda: m.material is not None, "the material, after the failed read")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert calls[0] >= 2 and m.material is not None


def test_flags_parse_durations_and_configuration_names() -> None:
    import argparse

    from webhook.certificates import _configurations, parse_duration

    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("2.5s") == parse_duration("2.5") == timedelta(seconds=2.5)
    assert parse_duration("90d") == 90 * DAY
    for bad in ("", "0s", "1x", "h"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_duration(bad)
    assert _configurations("dra-quota,mutating/x") == (
        ("validating", "dra-quota"), ("mutating", "dra-quota"), ("mutating", "x"))
    with pytest.raises(argparse.ArgumentTypeError):
        _configurations("other/x")
