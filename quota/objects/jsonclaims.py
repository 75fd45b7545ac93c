"""Claims decoded from JSON, parsed with their specs memoised by content.

Neighbours: `quota.objects.claims.parse_claim` parses (the spec: `quota.objects.claimspec`); the
webhook (`webhook.claimreview`) and the claim cache (`kube.claimstore`) read claims decoded from
JSON here, `dra-quota check` (YAML) reads them there. Pure: the memo only remembers what parsing
returned.

Why: a one-write claim is parsed at its admission and again at its watch event, and the
claims a template stamps share one spec; parsing the spec again was about a third of
`parse_claim` (9 of 20 us in bench/floor.py's one-write mode). The key is the spec
serialised by `marshal` in its version 0 (no references between objects, so equal values
give equal bytes), which tells apart every two values JSON decodes to (1, 1.0 and true;
"1" and 1; key order) as their JSON text did: 0.8 us a spec of bench/startup.py's
claims, against 2.6 for its `repr` and 5.4 for json.dumps.
"""

from __future__ import annotations

import marshal
from collections.abc import Mapping
from typing import Any

from quota.objects.claims import Claim, parse_claim
from quota.objects.claimspec import ClaimSpec, parse_claim_spec
from quota.values.lru import LRU

__all__ = ["parse_json_claim"]

# Least recently used out first. A spec whose text is longer is parsed each time (the
# memo's memory stays bounded); a tenant making every spec distinct only misses.
_SPECS_KEPT = 256
_SPECS: LRU[bytes, ClaimSpec] = LRU(_SPECS_KEPT)
_SPEC_KEY_BYTES = 8 * 1024


def parse_json_claim(obj: Mapping[str, Any]) -> Claim:
    """`parse_claim` of an object decoded from JSON (a review's, a watch event's)."""
    return parse_claim(obj, parse_spec=_memoised_spec)


def _memoised_spec(spec: Any, prefix: str) -> ClaimSpec:
    """`parse_claim_spec` by the spec's content (module doc): exact, as parsing is a
    function of the value alone (`prefix` only names fields in errors, which are not
    kept). A value marshal refuses (nested past its depth limit) is parsed each time."""
    try:
        key = marshal.dumps(spec, 0)
    except (ValueError, RecursionError):
        return parse_claim_spec(spec, prefix)
    if (found := _SPECS.lookup(key)) is not None:
        return found
    parsed = parse_claim_spec(spec, prefix)
    if len(key) <= _SPEC_KEY_BYTES:
        _SPECS.store(key, parsed)
    return parsed
