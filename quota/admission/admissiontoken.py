"""One-write admission's token: how a claim admitted by the mutating webhook names its reservation.

Neighbours: `webhook.claimadmit` draws a fresh token per invocation, reserves the claim's
charge under `token_key(token)` (`kube.quotawriter`) and writes the token on the claim
(`ADMISSION_ANNOTATION`) with the charge, in the create itself; the claim cache
(`kube.claimstore`) maps each key back to the claim that carries its token, so the entry
settles as a uid-keyed one does (`quota.accounting.reservations.claim_settled`). Pure.

Why a token and not the uid: the mutating phase runs before the API server fills in
the uid and a `generateName` name (k/k staging/src/k8s.io/apiserver/pkg/endpoints/
handlers/create.go calls mutating admission before `rest.BeforeCreate`), so nothing in
the object names the claim yet. Nothing in the incoming object is trusted either: a
tenant may write the annotation, and a reinvocation sees our own first answer.

Why the record holds a hash of the token and not the token: the record is readable by
anyone who may read the DeviceQuota (a team's quota spans namespaces). Were the key the
token, a tenant could copy an in-flight key onto a claim of its own (through a path our
webhook does not rewrite) and settle that admission early, so it counted nowhere. The
token itself is visible only on the persisted claim, whose own watch event reaches every
cache before any copy of it (resourceVersion order), and the cache keeps the first claim
carrying a token.
"""

from __future__ import annotations

import hashlib
from typing import TypeGuard

__all__ = ["ADMISSION_ANNOTATION", "TOKEN_PREFIX", "is_token", "is_token_key", "token_key"]

ADMISSION_ANNOTATION = "draquota.io/admission"
# No claim or Workload uid (a UUID), lease (`lease.`) or allocation excess (`allocation.`)
# key starts so.
TOKEN_PREFIX = "admission."
TOKEN_HEX = 32  # 128 random bits, as `secrets.token_hex(16)` writes them


def is_token(value: object) -> TypeGuard[str]:
    """Whether `value` reads as a token `webhook.claimadmit` draws (anything else maps to nothing)."""
    return (isinstance(value, str) and len(value) == TOKEN_HEX
            and all(c in "0123456789abcdef" for c in value))


def token_key(token: str) -> str:
    """The record key of the admission that wrote `token` on its claim."""
    return TOKEN_PREFIX + hashlib.sha256(token.encode("ascii")).hexdigest()[:TOKEN_HEX]


def is_token_key(key: str) -> bool:
    return key.startswith(TOKEN_PREFIX)
