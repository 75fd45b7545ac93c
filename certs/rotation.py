"""When to mint: creation, serving-certificate renewal and CA rollover, as a pure plan.

Neighbours: `certs.authority` mints and reads certificates; the serving process stores
`Material` in a Secret (keys `ca.crt`, `ca.key`, `tls.crt`, `tls.key`, the layout
cert-controller and cert-manager use) and patches `ca.crt` into the webhook
configurations' `caBundle`; `certs.tls` serves `Material.serving`.

CA rollover without a failed call: cert-controller replaces CA and caBundle at once and
Kyverno drops the old CA before adding the new one (kueue.md §4), so for a moment the API
server can distrust what a replica serves. Here the order is:
1. the new CA joins the bundle (newest first); the serving certificate stays as it is;
2. only once every webhook configuration trusts the new CA (`trusted` holds the
   fingerprints found in their caBundles) is the serving certificate re-signed by it;
3. the old CA stays in the bundle until it expires, long after every replica reloaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from certs.authority import CertificateInfo, KeyPair, inspect, new_ca, new_serving, split_pem

__all__ = ["Material", "Plan", "Policy", "plan"]

_DAY = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Policy:
    """What the serving certificate must name and how long things live.

    Defaults follow cert-controller (CA 10 years, serving 1 year, renewed 90 days ahead);
    the CA is rolled a year before it expires so the overlap is long.
    """

    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...] = ()
    ca_name: str = "dra-quota-webhook-ca"
    ca_validity: timedelta = 3650 * _DAY
    ca_renew_before: timedelta = 365 * _DAY
    serving_validity: timedelta = 365 * _DAY
    serving_renew_before: timedelta = 90 * _DAY

    def __post_init__(self) -> None:
        if self.ca_renew_before >= self.ca_validity or self.serving_renew_before >= self.serving_validity:
            raise ValueError("renew-before must be shorter than the validity it is taken from")


@dataclass(frozen=True, slots=True)
class Material:
    """The signing CA (the newest), every CA clients should trust, the serving pair."""

    ca: KeyPair
    bundle: tuple[bytes, ...]
    serving: KeyPair

    def secret_data(self) -> dict[str, bytes]:
        return {
            "ca.crt": b"".join(self.bundle),
            "ca.key": self.ca.key_pem,
            "tls.crt": self.serving.cert_pem,
            "tls.key": self.serving.key_pem,
        }

    @classmethod
    def from_secret_data(cls, data: Mapping[str, bytes]) -> Material:
        """Read a Secret's data back; ValueError when anything is missing or unreadable."""
        try:
            bundle = tuple(split_pem(data["ca.crt"]))
            if not bundle:
                raise ValueError("ca.crt holds no certificate")
            return cls(KeyPair(bundle[0], data["ca.key"]), bundle, KeyPair(data["tls.crt"], data["tls.key"]))
        except KeyError as err:
            raise ValueError(f"key {err.args[0]} is missing") from None

    def fingerprints(self) -> frozenset[str]:
        return frozenset(inspect(pem).fingerprint_sha256 for pem in self.bundle)


@dataclass(frozen=True, slots=True)
class Plan:
    material: Material
    reasons: tuple[str, ...] = field(default=())


def plan(current: Material | None, policy: Policy, *, now: datetime, trusted: frozenset[str]) -> Plan | None:
    """The material to store next, or None when `current` needs nothing.

    `trusted`: fingerprints of the CAs every webhook configuration already trusts.
    """
    if current is None:
        ca = new_ca(_ca_name(policy, now), now=now, validity=policy.ca_validity)
        serving = _serving(ca, policy, now)
        return Plan(Material(ca, (ca.cert_pem,), serving), ("created a CA and a serving certificate",))
    reasons: list[str] = []
    material = current
    ca_info = inspect(material.ca.cert_pem)
    if ca_info.not_after - now <= policy.ca_renew_before:
        ca = new_ca(_ca_name(policy, now), now=now, validity=policy.ca_validity)
        material = replace(material, ca=ca, bundle=(ca.cert_pem, *material.bundle))
        ca_info = inspect(ca.cert_pem)
        reasons.append(f"CA expires {_date(inspect(current.ca.cert_pem).not_after)}: added a new CA to the bundle")
    kept = tuple(pem for pem in material.bundle if pem == material.ca.cert_pem or inspect(pem).valid_at(now))
    if kept != material.bundle:
        material = replace(material, bundle=kept)
        reasons.append("dropped expired CAs from the bundle")
    why = _serving_outdated(material, ca_info, policy, now, trusted)
    if why is not None:
        material = replace(material, serving=_serving(material.ca, policy, now))
        reasons.append(why)
    return Plan(material, tuple(reasons)) if reasons else None


def _serving_outdated(
    material: Material, ca_info: CertificateInfo, policy: Policy, now: datetime, trusted: frozenset[str]
) -> str | None:
    try:
        info = inspect(material.serving.cert_pem)
    except ValueError:
        return "the serving certificate was unreadable: re-issued"
    if not info.valid_at(now):
        return "the serving certificate was not valid now: re-issued"
    if not _signed_by(material.serving.cert_pem, material.ca.cert_pem):
        # Step 2 of the rollover: only once the API server trusts the new CA.
        if ca_info.fingerprint_sha256 in trusted:
            return "moved the serving certificate to the new CA"
        return None
    if info.not_after - now <= policy.serving_renew_before:
        return f"the serving certificate expires {_date(info.not_after)}: renewed"
    if set(info.dns_names) != set(policy.dns_names) or set(info.ip_addresses) != set(policy.ip_addresses):
        return "the serving certificate named other hosts: re-issued"
    return None


def _serving(ca: KeyPair, policy: Policy, now: datetime) -> KeyPair:
    return new_serving(
        ca, dns_names=policy.dns_names, ip_addresses=policy.ip_addresses, now=now, validity=policy.serving_validity
    )


def _signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    try:
        x509.load_pem_x509_certificate(cert_pem).verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _ca_name(policy: Policy, now: datetime) -> str:
    # kube's self-signed certificates name themselves "<name>@<unix time>": distinct
    # subjects let a reader tell the CAs of one bundle apart.
    return f"{policy.ca_name}@{int(now.timestamp())}"


def _date(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
