"""webhook.showbackmetrics: the ledger's claim events accrued on a fake clock, exported only by the leader."""

from __future__ import annotations

import asyncio


from quota.accounting.ledger import Ledger
from quota.admission.admitter import Admitter, claim_ref
from quota.devices.inventory import Inventory
from quota.objects.claims import Claim, parse_claim, parse_device_class
from quota.pricing.pricer import Pricer
from quota.values.model import DeviceClassName
from runtime.metricnames import ALLOCATED_DEVICE_SECONDS, ALLOCATED_MEMORY_SECONDS
from webhook.metrics import Metrics
from webhook.showbackmetrics import Showback

from ..builders import GiB, exactly, make_claim, make_class, make_device, make_slice, request, result
from ..clock import FakeClock

D = "gpu.nvidia.com"
A100 = "NVIDIA A100-SXM4-80GB"


def setup(leading: list[bool]) -> tuple[Admitter, Showback, FakeClock, Metrics]:
    inv = Inventory()
    inv.replace_all([make_slice("n1", [make_device("gpu-0", memory="80Gi", attrs={"productName": A100})], driver=D)])
    adm = Admitter(Pricer(inv, {DeviceClassName("gpu"): parse_device_class(make_class("gpu"))}), Ledger())
    clock = FakeClock(1000.0)
    showback = Showback(adm.ledger, inv, lambda: leading[0], clock=clock)
    showback.attach()
    metrics = Metrics()
    showback.register(metrics)
    return adm, showback, clock, metrics


def one_gpu() -> Claim:
    return parse_claim(make_claim("c1", request("g", exactly("gpu")), allocation=[result("g", "gpu-0", driver=D)]))


def started(leading: bool) -> tuple[Admitter, Showback, FakeClock, Metrics, list[bool]]:
    """A Showback that has looked at leadership once, and the flag it reads."""
    flag = [leading]
    adm, showback, clock, metrics = setup(flag)
    showback.step()
    return adm, showback, clock, metrics, flag


def samples(metrics: Metrics) -> dict[str, float]:
    out = {}
    for line in metrics.exposition().decode().splitlines():
        if line.startswith(("draquota_allocated_memory", "draquota_allocated_device")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_an_allocation_held_for_a_minute_by_the_leader_is_exported_as_its_integral() -> None:
    adm, _, clock, metrics, _ = started(True)
    claim = one_gpu()
    adm.account_allocated(claim)
    clock.advance(60)
    adm.ledger.delete_claim(claim_ref(claim))
    clock.advance(60)
    labels = f'{{namespace="team-a",device_class="gpu",model="{A100}"}}'
    assert samples(metrics) == {f"{ALLOCATED_MEMORY_SECONDS}{labels}": 80 * GiB * 60.0,
                                f"{ALLOCATED_DEVICE_SECONDS}{labels}": 60.0}


def test_a_follower_follows_the_claims_and_exports_nothing_until_it_leads() -> None:
    adm, showback, clock, metrics, leading = started(False)
    adm.account_allocated(one_gpu())
    clock.advance(60)
    assert samples(metrics) == {}
    leading[0] = True
    showback.step()  # the tick that sees the Lease taken
    clock.advance(30)
    assert sorted(samples(metrics).values()) == [30.0, 80 * GiB * 30.0]


def test_a_relist_swapped_in_is_read_again() -> None:
    adm, showback, _, _, _ = started(True)
    claim = one_gpu()
    adm.account_allocated(claim)
    # As a relist's swap does: the claims replaced with no event per claim.
    adm.ledger.observer = None
    adm.ledger.delete_claim(claim_ref(claim))
    showback.attach()
    showback.replaced()
    asyncio.run(showback.resync())
    assert showback.accrual.rates() == {}


def test_the_text_is_what_prometheus_client_would_write_and_parses_back() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    adm, _, clock, metrics, _ = started(True)
    adm.account_allocated(one_gpu())
    clock.advance(1.5)
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    [memory] = families[ALLOCATED_MEMORY_SECONDS.removesuffix("_total")].samples
    assert families[ALLOCATED_MEMORY_SECONDS.removesuffix("_total")].type == "counter"
    assert memory.labels == {"namespace": "team-a", "device_class": "gpu", "model": A100}
    assert memory.value == 80 * GiB * 1.5
