"""Expensive claims do not hold `serve` hostage on the real control plane, neither while
they are admitted nor once they are stored.

A tenant's dryRun claims of 32 requests x 8 subrequests, each subrequest with its own
salted selector read per device with a loop (nothing cached helps, nothing groups),
used to hold the event loop for about a minute. Here they are sent through the real
API server to `serve` while honest creates go to the same namespace: the honest creates
are answered, allowed and denied exactly as the quota says, and every expensive claim
is denied with the per-claim budget's message (by the mutating webhook, the first to
price it). No time is asserted; the latencies are bench/slicing.py's.
"""

from __future__ import annotations

import asyncio

import pytest

from quota.values.work import CLAIM_COST_BUDGET

from .driver import RESOURCE_V1, Gpu
from .harness import Setup, amounts, create, denial, exceeded, make_quota, wait_status
from .kube import Kube, poll
from .tenants import expensive

pytestmark = pytest.mark.e2e


async def test_honest_claims_are_decided_while_expensive_ones_are_in_flight_and_denied_by_budget(
        kube: Kube, setup: Setup) -> None:
    with setup.served.log_on_failure():
        await make_quota(kube, setup, "gpus", "160Gi")  # two 80Gi GPUs' worth
        # An honest tenant's selectors are usually known: priced once before the attack (a
        # first sight costs more than the first slice on a loaded machine).
        assert await denial(create(kube, setup, "honest-0", dry_run=True)) == ""
        before = len(setup.served.log_text())
        attackers = [asyncio.create_task(denial(kube.create(RESOURCE_V1, "resourceclaims",
                                                            expensive(setup.fleet.device_class, salt),
                                                            namespace=setup.namespace, dry_run=True)))
                     for salt in range(1, 3)]

        async def in_the_slow_lane() -> bool:
            return "slow lane" in setup.served.log_text()[before:]

        await poll(in_the_slow_lane, timeout=60, what="an expensive claim in serve's slow lane")
        # Meanwhile an honest tenant's creates: allowed while they fit, then denied.
        assert await denial(create(kube, setup, "honest-1")) == ""
        assert await denial(create(kube, setup, "honest-2")) == ""
        assert await denial(create(kube, setup, "honest-3")) == exceeded(
            "gpus", used="0", reserved="160Gi", limited="160Gi", namespace=setup.namespace, case="reserved")

        for message in await asyncio.gather(*attackers):
            assert message.startswith('admission webhook "'), message
            assert f"exceeded the per-claim budget of {CLAIM_COST_BUDGET:,} CEL cost units" in message, message


async def test_stored_claims_do_not_hold_readiness_and_end_at_their_exact_charge(kube: Kube, setup: Setup) -> None:
    """Claims a fresh `serve` did not admit count at once at their upper bound (the
    class's largest device: 80Gi) and are priced after ready (40Gi: their selector
    takes the small GPUs only); the DeviceQuota's status ends at the exact charges."""
    stored = 3
    with setup.served.log_on_failure():
        await setup.fleet.add_node("small", [Gpu(product="small", memory="40Gi")] * 2)
        await make_quota(kube, setup, "gpus", "300Gi")  # 3 x 80Gi fit, and the probe (4 x 80Gi) does not
        driver = setup.fleet.driver
        small = (f"size(device.attributes) >= 0 && lists.range(200).all(x, x >= 0) && "
                 f"device.capacity['{driver}'].memory.compareTo(quantity('50Gi')) < 0")
        for i in range(stored):
            await kube.create(RESOURCE_V1, "resourceclaims", {"kind": "ResourceClaim", "metadata": {"name": f"s{i}"},
                              "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                                  "deviceClassName": setup.fleet.device_class,
                                  "selectors": [{"cel": {"expression": small}}]}}]}}}, namespace=setup.namespace)
        code, _ = await setup.served.terminate()
        assert code == 0
        before = len(setup.served.log_text())
        await setup.served.start()
        ready = [line for line in setup.served.log_text()[before:].splitlines() if "ready after" in line][-1]
        # Ready with the stored claims counted but not priced yet: readiness did not wait.
        # (Other tests' claims share the cluster: only these are counted at their bound.)
        assert f" claims ({stored} counted at their upper bound until priced)" in ready, ready
        await wait_status(kube, setup.namespace, lambda s: s.get("reserved") == amounts(40 * stored, stored),
                          "the stored claims priced exactly", timeout=60)
        # Priced in the background (the first; claims of one spec after it are cache hits).
        assert setup.served.log_text()[before:].count("stored ResourceClaim") >= 1
