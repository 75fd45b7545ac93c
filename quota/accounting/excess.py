"""An allocation's excess over what its claim reserved, as an entry of the persisted record.

Neighbours: `webhook.claimreview.allocate_claim` reserves it through
`kube.quotawriter.Reservations.admit` (the record's protocol, `quota.accounting.reservations`) before
answering allowed; `quota.accounting.reservations` settles and counts these entries with the rule
here; `quota.accounting.ledger.Ledger.excess` says how large the excess is per quota. Pure.

Why it is persisted: the scheduler binds Pods in parallel and the API server spreads the
`resourceclaims/status` reviews over the webhook replicas. Two allocations that each charge
more than their claim reserved (an Optimistic quota prices the smallest candidate; the
scheduler may pick a bigger device), decided on two replicas from their own caches within
one watch lag, would both pass and leave `used` above `hard`. So the excess of each quota
whose `hard` it touches is an entry, written with the record's resourceVersion
precondition like a create's, and every writer counts it until its own claim cache counts
the allocated claim.

The entry, keyed `allocation.<claim uid>.<resourceVersion of the review's old object>`
(a key no claim or Workload uid can take; no CRD change: old replicas of a rolling upgrade
read it as a claim entry whose claim never appears, count it and let it expire):
- it goes once this replica's claim cache holds the claim at a resourceVersion newer than
  the old object (the allocated copy, or a later one: the allocation landed, or lost to
  another write and holds nothing), or saw it deleted; the watermark rises to that
  version, as for a create's entry. Never on the older, unallocated copy: that counts the
  reservation, not the excess;
- one whose allocation never landed (a later admission step or a conflict refused the
  scheduler's write) and whose claim was not written since is an orphan: it goes after
  the TTL, which outlasts the API server's request timeout and the watches' lag;
- a review of the same claim from a newer old object supersedes the older attempts' entries:
  the API server showed the claim unallocated at that newer version, so whatever those
  attempts allocated either never landed or was deallocated since. The scheduler's retries
  of one claim thus hold one entry, not one each until the TTL;
- two reviews from the same old object (a retried webhook call, or two allocators racing
  for the claim; at most one write lands) share the key: the entry holds the larger
  excess per dimension, so it covers whichever lands;
- so an attempt refused by another of the claim's quotas does not remove the entry when
  it takes its reserve back (`quota.accounting.reservations.Undo`): it restores what the key held
  before that reserve, and only while the entry is still the one it wrote. A reserve over
  an entry writes a later expiry (by a millisecond at least, as the status keeps it), so
  no two entries a key holds in turn read alike: the reserves and rollbacks of one key
  nest like a stack, and an allowed attempt's excess is never taken back by another's
  rollback, while a lone refused attempt leaves nothing (docs/development/reservations.md, Rollback).
"""

from __future__ import annotations

__all__ = ["ALLOCATION_PREFIX", "allocation_key", "excess_settled", "parse_allocation_key", "supersedes"]

ALLOCATION_PREFIX = "allocation."


def allocation_key(uid: str, before: int) -> str:
    """The entry of claim `uid`'s allocation reviewed on its copy at resourceVersion `before`."""
    return f"{ALLOCATION_PREFIX}{uid}.{before}"


def parse_allocation_key(key: str) -> tuple[str, int] | None:
    """(claim uid, old resourceVersion) of an allocation entry's key; None for any other key."""
    if not key.startswith(ALLOCATION_PREFIX):
        return None
    uid, dot, before = key[len(ALLOCATION_PREFIX):].rpartition(".")
    if not dot or not uid or not before.isdigit() or len(before) > 20:
        return None
    return uid, int(before)


def excess_settled(before: int, *, version: int | None, gone: int | None, expired: bool) -> tuple[bool, int | None]:
    """Whether an allocation entry may go, and the claim resourceVersion the watermark must
    rise to when it does (None: none), given the version at which this replica's cache
    holds the claim (`version`) or saw it deleted (`gone`).

    Held at `before` or older: the reservation's copy, which does not count the excess."""
    seen = version if version is not None and version > before else gone
    if seen is None:
        return expired, None  # an orphan once expired: the watermark stays
    return True, seen


def supersedes(key: str, other: str) -> bool:
    """Whether the allocation entry `key` replaces `other`: an attempt at the same claim
    reviewed on an older copy (module doc)."""
    new, old = parse_allocation_key(key), parse_allocation_key(other)
    return new is not None and old is not None and new[0] == old[0] and old[1] < new[1]
