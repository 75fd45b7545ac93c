"""quota.admission.admitter.charged_above: when an allocation charges more than its claim's recorded charge."""

from __future__ import annotations

import pytest

from quota.admission.admitter import charged_above
from quota.objects.claims import Claim, parse_claim
from quota.values.model import Charge

from ...builders import GiB, exactly, make_claim, request


def claim(recorded: str | None) -> Claim:
    annotations = {"draquota.io/charge": recorded} if recorded is not None else None
    return parse_claim(make_claim("c1", request("gpu", exactly("gpu")), annotations=annotations))


RECORDED = '{"memory": 85899345920, "devices": 1}'  # 80Gi, one device


@pytest.mark.parametrize(
    ("recorded", "exact", "expected"),
    [
        (RECORDED, Charge(80 * GiB, 1), ""),
        (RECORDED, Charge(40 * GiB, 1), ""),  # less is never worth an Event
        (RECORDED, Charge(141 * GiB, 1), "ResourceClaim team-a/c1: the allocated devices charge devices=1,"
                                         "memory=141Gi, more than the devices=1,memory=80Gi it was admitted at"),
        # more devices, less memory: above in one dimension is above
        (RECORDED, Charge(60 * GiB, 2), "ResourceClaim team-a/c1: the allocated devices charge devices=2,"
                                        "memory=60Gi, more than the devices=1,memory=80Gi it was admitted at"),
        (None, Charge(141 * GiB, 1), ""),  # nothing recorded: nothing to compare with
        ("not json", Charge(141 * GiB, 1), ""),
    ],
    ids=["equal", "less", "more-memory", "more-devices", "no-annotation", "unreadable-annotation"],
)
def test_charged_above(recorded: str | None, exact: Charge, expected: str) -> None:
    assert charged_above(claim(recorded), exact) == expected
