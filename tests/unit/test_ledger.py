"""quota.ledger: incremental usage, atomic reserve, no double counting."""

from hypothesis import given, settings
from hypothesis import strategies as st

from quota.devicequota import parse_device_quota
from quota.ledger import Entry, Ledger
from quota.model import Charge, DeviceClassName, Namespace
from quota.pricing import PricedRequest, Pricing

from .builders import GiB, make_quota

NS = Namespace("team-a")
GPU, MIG = DeviceClassName("gpu"), DeviceClassName("mig")


def entry(ref: str, memory: int, devices: int = 1, *, cls: DeviceClassName = GPU, allocated: bool = False,
          ns: Namespace = NS) -> Entry:
    charge = Charge(memory, devices)
    pricing = Pricing((PricedRequest("r", devices, charge, ((cls, charge),)),))
    return Entry(ns, ref, {"conservative": pricing}, allocated)


def ledger(*quotas: dict) -> Ledger:  # type: ignore[type-arg]
    led = Ledger()
    for q in quotas:
        led.add_or_update_quota(parse_device_quota(q))
    return led


def test_used_and_reserved_are_kept_apart_and_scoped() -> None:
    led = ledger(make_quota("all", memory="1Ti"), make_quota("mig", memory="100Gi", classes=["mig"]))
    led.add_or_update_claim(entry("a", 80 * GiB, allocated=True))
    led.add_or_update_claim(entry("b", 5 * GiB, cls=MIG))
    all_, mig = led.usage(NS, "all"), led.usage(NS, "mig")
    assert (all_.used, all_.reserved, all_.allocated_claims, all_.pending_claims) == (Charge(80 * GiB, 1), Charge(5 * GiB, 1), 1, 1)
    assert (mig.used, mig.reserved) == (Charge(), Charge(5 * GiB, 1))


def test_allocation_moves_a_reservation_to_used_without_double_counting() -> None:
    led = ledger(make_quota("q", memory="100Gi"))
    assert led.admit(entry("a", 40 * GiB)).allowed
    led.add_or_update_claim(entry("a", 30 * GiB, allocated=True))
    usage = led.usage(NS, "q")
    assert (usage.used, usage.reserved) == (Charge(30 * GiB, 1), Charge())
    led.delete_claim("a")
    assert led.usage(NS, "q") == led.usage(NS, "never-existed")


def test_admit_reserves_and_the_next_one_sees_it() -> None:
    led = ledger(make_quota("q", memory="100Gi"))
    assert led.admit(entry("a", 60 * GiB)).allowed
    second = led.admit(entry("b", 60 * GiB))
    assert not second.allowed and "reserved memory=60Gi" in second.message
    assert led.entry("b") is None


def test_retrying_the_same_claim_replaces_its_reservation() -> None:
    led = ledger(make_quota("q", memory="100Gi"))
    assert led.admit(entry("a", 60 * GiB)).allowed
    assert led.admit(entry("a", 60 * GiB)).allowed
    assert led.usage(NS, "q").reserved == Charge(60 * GiB, 1)


def test_dry_run_reserves_nothing() -> None:
    led = ledger(make_quota("q", memory="100Gi"))
    assert led.admit(entry("a", 60 * GiB), dry_run=True).allowed
    assert led.usage(NS, "q").reserved == Charge()


def test_a_quota_created_later_counts_existing_claims() -> None:
    led = Ledger()
    led.add_or_update_claim(entry("a", 80 * GiB, allocated=True))
    led.add_or_update_claim(entry("other", 80 * GiB, allocated=True, ns=Namespace("team-b")))
    led.add_or_update_quota(parse_device_quota(make_quota("q", memory="1Ti")))
    assert led.usage(NS, "q").used == Charge(80 * GiB, 1)
    assert led.delete_quota(NS, "q") == ((NS, "q"),)
    assert led.quotas(NS) == []


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 120), st.booleans()), max_size=40))
def test_no_sequence_of_admissions_exceeds_hard(ops: list[tuple[int, int, bool]]) -> None:
    led = ledger(make_quota("q", memory="200Gi", devices=5))
    for ref, gib, delete in ops:
        if delete:
            led.delete_claim(str(ref))
        else:
            led.admit(entry(str(ref), gib * GiB))
        usage = led.usage(NS, "q")
        assert usage.reserved.memory <= 200 * GiB and usage.reserved.devices <= 5
        # the incremental usage equals a recomputation from the entries
        total = sum((e.charge_for(led.quotas(NS)[0], "conservative") for e in led.entries()), Charge())
        assert usage.reserved == total
