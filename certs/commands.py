"""`dra-quota certs generate` and `dra-quota certs inspect`: certificates by hand.

Neighbours: `commands.certscommand` parses the flags and calls these; `certs.rotation` mints with
the same policy the server uses, so hand-made files (for `--cert-mode files`, or to
see what the server would create) match what it manages itself.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

from certs.authority import inspect, service_names, split_pem
from certs.rotation import Policy, plan

__all__ = ["CertsError", "describe", "generate"]


class CertsError(Exception):
    """A certs command that cannot run; the message says why."""


def generate(
    out_dir: Path, *, service: str, namespace: str, ip_addresses: Sequence[str] = (), days: int = 365, force: bool = False
) -> list[Path]:
    """Write ca.crt, ca.key, tls.crt and tls.key (keys 0600) into `out_dir`."""
    if days < 1:
        raise CertsError("--days must be at least 1")
    policy = Policy(
        dns_names=service_names(service, namespace),
        ip_addresses=tuple(ip_addresses),
        serving_validity=timedelta(days=days),
        serving_renew_before=timedelta(days=days) / 4,
    )
    try:
        minted = plan(None, policy, now=datetime.now(timezone.utc), trusted=frozenset())
    except ValueError as err:
        raise CertsError(str(err)) from None
    assert minted is not None
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in minted.material.secret_data().items():
        path = out_dir / name
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
        try:
            fd = os.open(path, flags, 0o600 if name.endswith(".key") else 0o644)
        except FileExistsError:
            raise CertsError(f"{path} exists (use --force to overwrite)") from None
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        written.append(path)
    return written


def describe(pem: bytes, *, now: datetime | None = None) -> str:
    """Every certificate of a PEM file or bundle, one block each."""
    now = now or datetime.now(timezone.utc)
    try:
        blocks = split_pem(pem)
    except ValueError:
        blocks = []
    if not blocks:
        raise CertsError("no PEM certificate found (expected -----BEGIN CERTIFICATE----- blocks)")
    out = []
    for block in blocks:
        info = inspect(block)
        if info.valid_at(now):
            state = f"valid, {(info.not_after - now).days} days left"
        elif now < info.not_before:
            state = "not yet valid"
        else:
            state = f"EXPIRED {(now - info.not_after).days} days ago"
        names = ", ".join((*info.dns_names, *info.ip_addresses)) or "-"
        out.append("\n".join((
            f"subject:     {info.subject}",
            f"issuer:      {info.issuer}",
            f"ca:          {'yes' if info.is_ca else 'no'}",
            f"names:       {names}",
            f"not before:  {info.not_before:%Y-%m-%dT%H:%M:%SZ}",
            f"not after:   {info.not_after:%Y-%m-%dT%H:%M:%SZ} ({state})",
            f"sha256:      {info.fingerprint_sha256}",
        )))
    return "\n\n".join(out) + "\n"
