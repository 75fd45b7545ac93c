"""certs.authority and certs.rotation: what is minted, and when the plan mints again."""

from __future__ import annotations

import ssl
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from certs.authority import CLOCK_SKEW, KeyPair, inspect, new_ca, new_serving, service_names
from certs.commands import CertsError, describe, generate
from certs.rotation import Material, Policy, plan

from .handshake import verify

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
DAY = timedelta(days=1)
POLICY = Policy(
    dns_names=service_names("dra-quota", "dra-quota-system"),
    ip_addresses=("127.0.0.1",),
    ca_validity=10 * DAY,
    ca_renew_before=2 * DAY,
    serving_validity=3 * DAY,
    serving_renew_before=1 * DAY,
)


def created() -> Material:
    first = plan(None, POLICY, now=T0, trusted=frozenset())
    assert first is not None
    return first.material


def signer(material: Material) -> str:
    return inspect(material.serving.cert_pem).issuer


def test_service_names_are_the_four_forms_the_design_lists() -> None:
    assert service_names("svc", "ns") == ("svc", "svc.ns", "svc.ns.svc", "svc.ns.svc.cluster.local")


def test_a_fresh_plan_mints_a_ca_and_a_serving_certificate_for_the_service() -> None:
    material = created()
    ca, serving = inspect(material.ca.cert_pem), inspect(material.serving.cert_pem)
    assert ca.is_ca and not serving.is_ca
    assert serving.dns_names == POLICY.dns_names and serving.ip_addresses == ("127.0.0.1",)
    assert serving.issuer == ca.subject
    assert serving.not_before == T0 - CLOCK_SKEW and serving.not_after == T0 + 3 * DAY
    assert material.bundle == (material.ca.cert_pem,)


def test_the_serving_certificate_verifies_against_the_bundle_with_the_service_name() -> None:
    fresh = plan(None, POLICY, now=datetime.now(timezone.utc), trusted=frozenset())
    assert fresh is not None
    client = ssl.create_default_context(cadata=b"".join(fresh.material.bundle).decode())
    assert verify(fresh.material.serving, client, "dra-quota.dra-quota-system.svc") is None
    assert "mismatch" in (verify(fresh.material.serving, client, "other.svc") or "")


def test_nothing_to_do_while_everything_is_fresh() -> None:
    assert plan(created(), POLICY, now=T0 + DAY, trusted=frozenset()) is None


def test_the_serving_certificate_is_renewed_ahead_of_expiry_by_the_same_ca() -> None:
    material = created()
    renewed = plan(material, POLICY, now=T0 + 2 * DAY + timedelta(seconds=1), trusted=frozenset())
    assert renewed is not None and renewed.reasons[0].endswith("renewed")
    assert renewed.material.ca == material.ca
    assert inspect(renewed.material.serving.cert_pem).serial != inspect(material.serving.cert_pem).serial


def test_ca_rollover_adds_the_new_ca_first_and_moves_the_leaf_only_once_it_is_trusted() -> None:
    material = created()
    now = T0 + 8 * DAY + timedelta(seconds=1)
    # Keep the serving certificate fresh so only the CA is due.
    material = Material(material.ca, material.bundle, new_serving(
        material.ca, dns_names=POLICY.dns_names, ip_addresses=POLICY.ip_addresses, now=now, validity=POLICY.serving_validity))
    step1 = plan(material, POLICY, now=now, trusted=material.fingerprints())
    assert step1 is not None and "added a new CA" in step1.reasons[0]
    rolled = step1.material
    assert len(rolled.bundle) == 2 and rolled.bundle[1] == material.ca.cert_pem
    assert rolled.serving == material.serving, "the leaf must not move before the API server trusts the new CA"
    assert plan(rolled, POLICY, now=now, trusted=material.fingerprints()) is None
    step2 = plan(rolled, POLICY, now=now, trusted=rolled.fingerprints())
    assert step2 is not None and step2.reasons == ("moved the serving certificate to the new CA",)
    assert signer(step2.material) == inspect(rolled.ca.cert_pem).subject
    assert step2.material.bundle == rolled.bundle, "the old CA stays while replicas may still serve its leaf"
    step3 = plan(step2.material, POLICY, now=T0 + 10 * DAY + timedelta(seconds=1), trusted=rolled.fingerprints())
    assert step3 is not None and "dropped expired CAs from the bundle" in step3.reasons
    assert step3.material.bundle == (rolled.ca.cert_pem,)


def test_a_serving_certificate_for_other_names_is_reissued() -> None:
    material = created()
    other = Policy(dns_names=service_names("renamed", "ns"), ca_validity=10 * DAY, ca_renew_before=2 * DAY,
                   serving_validity=3 * DAY, serving_renew_before=DAY)
    result = plan(material, other, now=T0 + DAY, trusted=frozenset())
    assert result is not None and result.reasons == ("the serving certificate named other hosts: re-issued",)
    assert inspect(result.material.serving.cert_pem).dns_names == other.dns_names


def test_an_unreadable_serving_certificate_is_reissued() -> None:
    material = created()
    broken = Material(material.ca, material.bundle, KeyPair(b"garbage", b"garbage"))
    result = plan(broken, POLICY, now=T0, trusted=frozenset())
    assert result is not None and result.reasons == ("the serving certificate was unreadable: re-issued",)


def test_secret_data_round_trips_and_missing_keys_are_named() -> None:
    material = created()
    assert Material.from_secret_data(material.secret_data()) == material
    data = material.secret_data()
    del data["tls.key"]
    with pytest.raises(ValueError, match="tls.key"):
        Material.from_secret_data(data)


def test_a_key_pair_never_prints_its_key() -> None:
    pair = new_ca("x", now=T0, validity=DAY)
    assert b"PRIVATE KEY" in pair.key_pem
    assert "PRIVATE" not in repr(pair) and "redacted" in repr(pair)


def test_a_serving_certificate_never_outlives_its_ca() -> None:
    ca = new_ca("x", now=T0, validity=DAY)
    leaf = new_serving(ca, dns_names=("a",), now=T0, validity=365 * DAY)
    assert inspect(leaf.cert_pem).not_after == inspect(ca.cert_pem).not_after
    with pytest.raises(ValueError, match="validity must be positive"):
        new_serving(ca, dns_names=("a",), now=T0 + 2 * DAY, validity=DAY)


def test_generate_writes_the_four_files_keys_private_and_refuses_to_overwrite(tmp_path: Path) -> None:
    written = generate(tmp_path, service="dra-quota", namespace="ops", ip_addresses=("127.0.0.1",), days=30)
    assert sorted(p.name for p in written) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert (tmp_path / "tls.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "ca.key").stat().st_mode & 0o777 == 0o600
    leaf = inspect((tmp_path / "tls.crt").read_bytes())
    assert leaf.dns_names == service_names("dra-quota", "ops") and leaf.ip_addresses == ("127.0.0.1",)
    assert (leaf.not_after - leaf.not_before) == 30 * DAY + CLOCK_SKEW
    with pytest.raises(CertsError, match="exists"):
        generate(tmp_path, service="dra-quota", namespace="ops")
    generate(tmp_path, service="other", namespace="ops", force=True)
    assert inspect((tmp_path / "tls.crt").read_bytes()).dns_names[0] == "other"


def test_describe_lists_every_certificate_of_a_bundle() -> None:
    material = created()
    text = describe(b"".join((material.serving.cert_pem, material.ca.cert_pem)), now=T0 + 4 * DAY)
    blocks = text.strip().split("\n\n")
    assert len(blocks) == 2
    assert "ca:          no" in blocks[0] and "dra-quota.dra-quota-system.svc" in blocks[0]
    assert "(EXPIRED 1 days ago)" in blocks[0]
    assert "ca:          yes" in blocks[1] and "(valid, 6 days left)" in blocks[1]
    for garbage in (b"hello", b"", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"):
        with pytest.raises(CertsError, match="no PEM certificate found"):
            describe(garbage)
