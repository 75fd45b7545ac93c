"""controllers.refine with the real claim store: stored claims count at their upper bound at
once (no tenant CEL before ready), then at their priced charge; a claim accounted by
its own event meanwhile keeps what that event said."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from controllers.refine import Refiner
from kube.claimstore import ClaimStore
from quota.accounting.ledger import Ledger, QuotaKey
from quota.accounting.ledgerentry import ClaimRef
from quota.admission.admitter import Admitter
from quota.devices.inventory import Inventory
from quota.objects.claims import parse_device_class
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import parse_device_quota
from quota.values.model import Charge, DeviceClassName, Namespace
from runtime.slicing import Slicer

from ..builders import GiB, exactly, make_class, make_claim, make_device, make_quota, make_slice, request, result

D = "gpu.example.com"
NS = Namespace("team-a")
SMALL = f"device.capacity['{D}'].memory.compareTo(quantity('50Gi')) < 0"


def world() -> tuple[Admitter, ClaimStore, Refiner, list[QuotaKey]]:
    inventory = Inventory()
    inventory.add_or_update_slice(make_slice("n1", [make_device("big", memory="80Gi"), make_device("small", memory="40Gi")]))
    classes = {DeviceClassName("gpu"): parse_device_class(make_class("gpu"))}
    admitter = Admitter(Pricer(inventory, classes), Ledger())
    admitter.ledger.add_or_update_quota(parse_device_quota(make_quota("gpus", memory="400Gi")))
    changed: list[QuotaKey] = []
    refiner = Refiner(admitter, Slicer(), changed=changed.extend)
    return admitter, ClaimStore(admitter, provisional=refiner.add), refiner, changed


def stored(name: str, *, allocated: bool = False) -> dict[str, Any]:
    obj = make_claim(name, request("gpu", exactly("gpu", SMALL)),
                     allocation=[result("gpu", "small")] if allocated else None)
    obj["metadata"]["uid"] = f"uid-{name}"
    obj["metadata"]["resourceVersion"] = "1" if not allocated else "2"
    return obj


def never_priced(count: int) -> list[dict[str, Any]]:
    """Stored claims each with a selector this replica has not priced: at their bound until refined."""
    claims = []
    for i in range(count):
        obj = make_claim(f"d{i}", request("gpu", exactly("gpu", SMALL.replace("50Gi", f"{60 + i}Gi"))))
        obj["metadata"] |= {"uid": f"uid-d{i}", "resourceVersion": "1"}
        claims.append(obj)
    return claims


async def refine(refiner: Refiner, admitter: Admitter) -> None:
    async def synced() -> None:
        return None

    task = asyncio.create_task(refiner.run(synced))
    try:
        while refiner.pending:
            await asyncio.sleep(0)
        for _ in range(50):  # the last one's pricing and replacement
            await asyncio.sleep(0)
    finally:
        task.cancel()


async def test_stored_claims_count_at_their_bound_then_at_their_price() -> None:
    admitter, store, refiner, changed = world()
    store.replace([stored("c1"), stored("c2")])
    usage = admitter.ledger.usage(NS, "gpus")
    assert usage.reserved == Charge(2 * 80 * GiB, 2)  # the class's largest device: never less than the truth
    assert refiner.pending == 2
    await refine(refiner, admitter)
    assert admitter.ledger.usage(NS, "gpus").reserved == Charge(2 * 40 * GiB, 2)  # only the 40Gi device matches
    assert refiner.refined == 2 and changed == [(NS, "gpus"), (NS, "gpus")]  # the ledger's keys


async def test_a_claim_allocated_before_it_is_priced_keeps_its_exact_charge() -> None:
    admitter, store, refiner, _ = world()
    store.replace([stored("c1")])
    store.upsert(stored("c1", allocated=True))
    await refine(refiner, admitter)
    entry = admitter.ledger.entry(ClaimRef("uid-c1"))
    assert entry is not None and entry.allocated
    assert admitter.ledger.usage(NS, "gpus").used == Charge(40 * GiB, 1) and refiner.refined == 0


def test_without_the_hook_a_stored_claim_is_priced_at_once() -> None:
    """`dra-quota check` and the unit tests: no background task to hand it to."""
    admitter, _, _, _ = world()
    ClaimStore(admitter).replace([stored("c1")])
    assert admitter.ledger.usage(NS, "gpus").reserved == Charge(40 * GiB, 1)


async def test_a_stored_claim_whose_pricing_is_cached_is_priced_at_once() -> None:
    """A claim stamped from a template this replica priced: a lookup, no bound needed."""
    admitter, store, refiner, _ = world()
    store.replace([stored("c1")])
    await refine(refiner, admitter)
    store.upsert(stored("c2"))
    assert refiner.pending == 0
    assert admitter.ledger.usage(NS, "gpus").reserved == Charge(2 * 40 * GiB, 2)


async def test_the_loop_runs_between_two_stored_claims() -> None:
    """Each claim's pricing ends in its first slice here and awaits nothing: the refiner
    must still give the loop a turn between claims, or a thousand would be one stall."""
    admitter, store, refiner, _ = world()
    store.replace([{**stored(f"c{i}"), "spec": {"devices": {"requests": [request("gpu", exactly(
        "gpu", f"{SMALL} && {i} >= 0"))]}}} for i in range(20)])
    assert refiner.pending == 20
    refiner.slicer = Slicer(first_slice=60.0)  # every claim's pricing ends in its first slice
    seen: set[int] = set()  # how many were refined, at each of the loop's turns

    async def ticker() -> None:
        while True:
            seen.add(refiner.refined)
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        await refine(refiner, admitter)
    finally:
        task.cancel()
    assert refiner.refined == 20 and len(seen) > 10  # one stretch would show 0 and 20 only


async def test_a_drain_of_many_stored_claims_is_a_rebuild_and_a_few_are_not(monkeypatch: Any) -> None:
    """A fresh replica's stored claims (125,000 in bench/stalls.py) replace as many entries
    of the ledger: full collections stay off meanwhile and what it built is frozen after
    (`kube.rebuilds`); a claim or two (a deallocation) freeze nothing."""
    import controllers.refine
    from kube.rebuilds import Rebuilds

    monkeypatch.setattr(controllers.refine, "FREEZE_AFTER", 3)
    admitter, store, _, _ = world()
    rebuilds = Rebuilds()
    refiner = Refiner(admitter, Slicer(), changed=lambda _: None, rebuilds=rebuilds)
    store.provisional = refiner.add
    store.replace([stored("c1"), stored("c2")])
    await refine(refiner, admitter)
    assert refiner.refined == 2 and rebuilds.freezes == 0
    store.replace(never_priced(3))
    assert refiner.pending == 3
    await refine(refiner, admitter)
    assert refiner.refined == 5 and rebuilds.freezes == 1
    gc.unfreeze()  # the rest of the session collects as ever


async def test_a_drain_that_met_a_full_slow_lane_waits_its_turn_and_freezes_nothing(monkeypatch: Any) -> None:
    """Under an attack the slow lane is full: the drain's pricing waits its turn (nobody
    would retry it) and still ends (only the claims that were waiting when it began),
    and what it built meanwhile, the attack's garbage among it, is not frozen (a frozen
    cycle is never collected)."""
    import controllers.refine
    from kube.rebuilds import Rebuilds

    from ..runtime.test_slicing import full_lane

    monkeypatch.setattr(controllers.refine, "FREEZE_AFTER", 3)
    admitter, store, _, _ = world()
    # Every pricing past its first pause point goes to the slow lane.
    slicer = Slicer(first_slice=0.0, slice_seconds=0.0, lane=1, queue=1)
    rebuilds = Rebuilds()
    refiner = Refiner(admitter, slicer, changed=lambda _: None, rebuilds=rebuilds)
    store.provisional = refiner.add
    store.replace(never_priced(3))
    task = asyncio.create_task(refine(refiner, admitter))
    async with full_lane(slicer), asyncio.timeout(5):  # a hang fails the test, it never paces it
        while not slicer.crowded:  # the first pricing waiting behind the full lane
            assert not task.done()
            await asyncio.sleep(0)
        assert refiner.refined == 0
    await task
    assert refiner.refined == 3 and slicer.crowded >= 1
    assert rebuilds.freezes == 0
