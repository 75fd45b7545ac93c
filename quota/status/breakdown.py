"""The cap on a team's per-namespace series: its largest namespaces by name, the rest as one.

Neighbours: `webhook.usagemetrics` exports a ClusterDeviceQuota's breakdown
(`draquota_cluster_quota_namespace`) from what `quota.accounting.ledger` counts per member namespace
and calls `top_parts` to bound it; `quota.status.quotastatus` bounds the status breakdown its own
way (the first `MAX_NAMESPACES` by name, `NamespacesListed`). Pure.

The rule (docs/metrics.md): a team selecting more than `limit` namespaces exports the
`limit` whose part is largest (used + reserved devices, then used + reserved memory; a
tie goes to the name that sorts first, so equal parts never swap places from one scrape
to the next) and one `OTHER` part summing every other member, so the breakdown summed over
`namespace` stays the team's total. A team with at most `limit` members exports each one
and no `OTHER`. Uncapped, a `{}` selector over 10,000 namespaces was 40,000 series a team.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from quota.quotas.devicequota import Usage
from quota.values.model import ZERO

__all__ = ["DEFAULT_SERIES", "OTHER", "Breakdown", "top_parts"]

# Namespaces a team exports a series of (`--team-namespace-series`): 50 teams at the
# default are 50 x 51 x 4 = 10,200 series at most, whatever the selectors.
DEFAULT_SERIES = 50
# The namespace label of the rest: no namespace is called so (names are DNS-1123 labels),
# and `dra-quota top` labels its team rows "(total)" alike.
OTHER = "(other)"


@dataclass(frozen=True, slots=True)
class Breakdown:
    """The parts exported: `kept` sorted by namespace, `other` the rest summed (None when
    nothing was left out), `left_out` how many namespaces `other` sums."""

    kept: tuple[tuple[str, Usage], ...]
    other: Usage | None = None
    left_out: int = 0


def top_parts(parts: Sequence[tuple[str, Usage]], limit: int) -> Breakdown:
    """`parts` (namespace, its part of the team), capped at `limit` namespaces plus `OTHER`."""
    if len(parts) <= limit:
        return Breakdown(tuple(sorted(parts, key=_name)))
    kept = heapq.nsmallest(limit, parts, key=_rank)  # O(members x log limit): a scrape's cost
    names = {namespace for namespace, _ in kept}
    rest = [part for namespace, part in parts if namespace not in names]
    used, reserved = sum((p.used for p in rest), ZERO), sum((p.reserved for p in rest), ZERO)
    other = Usage(used=used, reserved=reserved, allocated_claims=sum(p.allocated_claims for p in rest),
                  pending_claims=sum(p.pending_claims for p in rest), workloads=sum((p.workloads for p in rest), ZERO))
    return Breakdown(tuple(sorted(kept, key=_name)), other, len(rest))


def _rank(item: tuple[str, Usage]) -> tuple[int, int, str]:
    """Largest first (negated for `nsmallest`), then by name."""
    namespace, part = item
    total = part.used + part.reserved
    return -total.devices, -total.memory, namespace


def _name(item: tuple[str, Usage]) -> str:
    return item[0]
