"""Minting the webhook's CA and serving certificates with `cryptography`.

Neighbours: `certs.rotation` decides when to mint (renewal, CA rollover) from what
this module reads back (`inspect`); `certs.tls` serves the pair. Pure: the clock is a
parameter, nothing is written anywhere.

Choices, after the webhook certificate managers Kubernetes operators run
(open-policy-agent/cert-controller pkg/rotator/rotator.go, kyverno pkg/tls/renewer.go):
ECDSA P-256 keys (as small and fast as RSA-2048 is common; the API server's Go TLS
client accepts both), `NotBefore` an hour in the past so a replica or API server whose
clock lags does not reject a fresh certificate, a CA with `pathlen:0` that can sign
only leaves, and serving certificates for exactly the Service names the API server
dials (`<svc>.<ns>.svc`, it verifies that ServerName: k8s.io/apiserver
pkg/util/webhook/client.go) plus the shorter and longer forms docs/design.md lists ("Certificates").
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CLOCK_SKEW",
    "SERVICE",
    "CertificateInfo",
    "KeyPair",
    "inspect",
    "new_ca",
    "new_serving",
    "service_names",
    "split_pem",
]

CLOCK_SKEW = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) private key."""

    cert_pem: bytes
    key_pem: bytes

    def __repr__(self) -> str:
        # Never let a private key reach a log line through a stray repr.
        return f"KeyPair({inspect(self.cert_pem).subject!r}, key=<redacted>)"


@dataclass(frozen=True, slots=True)
class CertificateInfo:
    subject: str
    issuer: str
    serial: int
    not_before: datetime
    not_after: datetime
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    is_ca: bool
    fingerprint_sha256: str

    def valid_at(self, when: datetime) -> bool:
        return self.not_before <= when < self.not_after


# The Service the chart creates and `serve` names in its certificate; `certs generate` mints
# for the same name so `--cert-mode files` works with both defaults.
SERVICE = "dra-quota-webhook"


def service_names(service: str, namespace: str) -> tuple[str, ...]:
    """The DNS SANs of a serving certificate for Service `service` in `namespace`."""
    base = f"{service}.{namespace}"
    return (service, base, f"{base}.svc", f"{base}.svc.cluster.local")


def new_ca(common_name: str, *, now: datetime, validity: timedelta) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    public = key.public_key()
    cert = (
        _base(name, name, public, now, validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _pair(cert, key)


def new_serving(
    ca: KeyPair,
    *,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    now: datetime,
    validity: timedelta,
) -> KeyPair:
    """A serving certificate signed by `ca`, never outliving it."""
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an ECDSA key minted by dra-quota")
    validity = min(validity, ca_cert.not_valid_after_utc - now)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (list(dns_names) or list(ip_addresses))[0])])
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    cert = (
        _base(subject, ca_cert.subject, key.public_key(), now, validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _pair(cert, key)


def inspect(pem: bytes) -> CertificateInfo:
    """The facts of the first certificate in `pem` (raises ValueError if there is none)."""
    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(san.get_values_for_type(x509.DNSName))
        ips = tuple(str(a) for a in san.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        dns, ips = (), ()
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    return CertificateInfo(
        subject=cert.subject.rfc4514_string(),
        issuer=cert.issuer.rfc4514_string(),
        serial=cert.serial_number,
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        dns_names=dns,
        ip_addresses=ips,
        is_ca=is_ca,
        fingerprint_sha256=cert.fingerprint(hashes.SHA256()).hex(),
    )


def split_pem(bundle: bytes) -> list[bytes]:
    """The certificates of a PEM bundle, each as its own PEM block."""
    return [c.public_bytes(serialization.Encoding.PEM) for c in x509.load_pem_x509_certificates(bundle)]


def _base(
    subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey, now: datetime, validity: timedelta
) -> x509.CertificateBuilder:
    if validity <= timedelta(0):
        raise ValueError("certificate validity must be positive (is the CA expired?)")
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + validity)
    )


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _pair(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> KeyPair:
    return KeyPair(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
