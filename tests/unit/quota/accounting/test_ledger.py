"""quota.accounting.ledger: incremental usage, atomic reserve, no double counting."""

from collections.abc import Iterable
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import quota.accounting.claimsrebuild as claimsrebuild
import quota.accounting.ledger as ledger_module
from quota.accounting.claimsrebuild import ClaimsRebuild
from quota.accounting.ledger import Ledger
from quota.accounting.ledgerentry import ClaimRef, Entry, add_usage, sum_usage
from quota.pricing.priced import PricedRequest, Pricing
from quota.quotas.devicequota import Usage, parse_cluster_device_quota, parse_device_quota
from quota.values.model import Charge, DeviceClassName, Namespace
from quota.values.work import pausing

from ...builders import GiB, make_cluster_quota, make_quota

NS = Namespace("team-a")
GPU, MIG = DeviceClassName("gpu"), DeviceClassName("mig")


def entry(ref: str, memory: int, devices: int = 1, *, cls: DeviceClassName = GPU, allocated: bool = False,
          ns: Namespace = NS) -> Entry:
    charge = Charge(memory, devices)
    pricing = Pricing((PricedRequest("r", devices, charge, ((cls, charge),)),))
    return Entry(ns, ClaimRef(ref), {"conservative": pricing}, allocated)


def ledger(*quotas: dict[str, Any]) -> Ledger:
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
    # The scoped quota counts only the claims it charges: not the GPU claim.
    assert (mig.allocated_claims, mig.pending_claims) == (0, 1)
    led.add_or_update_claim(entry("b", 5 * GiB, cls=MIG, allocated=True))
    led.delete_claim(ClaimRef("a"))
    all_, mig = led.usage(NS, "all"), led.usage(NS, "mig")
    assert (all_.allocated_claims, all_.pending_claims, mig.allocated_claims, mig.pending_claims) == (1, 0, 1, 0)


def test_allocation_moves_a_reservation_to_used_without_double_counting() -> None:
    led = ledger(make_quota("q", memory="100Gi"))
    assert led.admit(entry("a", 40 * GiB)).allowed
    led.add_or_update_claim(entry("a", 30 * GiB, allocated=True))
    usage = led.usage(NS, "q")
    assert (usage.used, usage.reserved) == (Charge(30 * GiB, 1), Charge())
    led.delete_claim(ClaimRef("a"))
    assert led.usage(NS, "q") == led.usage(NS, "never-existed")


def test_admit_reserves_and_the_next_one_sees_it() -> None:
    led = ledger(make_quota("q", memory="100Gi"))
    assert led.admit(entry("a", 60 * GiB)).allowed
    second = led.admit(entry("b", 60 * GiB))
    assert not second.allowed and "reserved memory=60Gi" in second.message
    assert led.entry(ClaimRef("b")) is None


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


def counting_adds(monkeypatch: pytest.MonkeyPatch) -> list[Entry]:
    """The entries the ledger counts into a quota's usage from now on, in order."""
    counted: list[Entry] = []
    real, real_sum = add_usage, sum_usage

    def counting(usage: Any, e: Entry, *args: Any) -> Any:
        counted.append(e)
        return real(usage, e, *args)

    def summing(entries: Iterable[Entry], *args: Any) -> Any:
        entries = list(entries)
        counted.extend(entries)
        return real_sum(entries, *args)

    # Patched where the ledger looks them up (it imports them from `quota.accounting.ledgerentry`).
    monkeypatch.setattr(ledger_module, "add_usage", counting)
    monkeypatch.setattr(ledger_module, "sum_usage", summing)
    return counted


def test_a_quota_seen_again_unchanged_is_not_recounted(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every status write of a DeviceQuota comes back through the watch: the same spec must
    # not cost a pass over every claim of its namespace (1,000s, in a burst of creates).
    led = ledger(make_quota("q", memory="1Ti"))
    for i in range(50):
        led.add_or_update_claim(entry(f"c{i}", GiB))
    counted = counting_adds(monkeypatch)
    before = led.usage(NS, "q")
    assert led.add_or_update_quota(parse_device_quota(make_quota("q", memory="1Ti"))) == ((NS, "q"),)
    assert counted == [] and led.usage(NS, "q") == before
    # So is a changed hard: what counts is the scope and pricing mode.
    led.add_or_update_quota(parse_device_quota(make_quota("q", memory="2Ti")))
    assert counted == [] and led.usage(NS, "q") == before
    # A changed spec is counted again (a scope decides which claims count).
    led.add_or_update_quota(parse_device_quota(make_quota("q", memory="1Ti", classes=["mig"])))
    assert len(counted) == 50 and led.usage(NS, "q").reserved == Charge()


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 120), st.booleans()), max_size=40))
def test_no_sequence_of_admissions_exceeds_hard(ops: list[tuple[int, int, bool]]) -> None:
    led = ledger(make_quota("q", memory="200Gi", devices=5))
    for ref, gib, delete in ops:
        if delete:
            led.delete_claim(ClaimRef(str(ref)))
        else:
            led.admit(entry(str(ref), gib * GiB))
        usage = led.usage(NS, "q")
        assert usage.reserved.memory <= 200 * GiB and usage.reserved.devices <= 5
        # the incremental usage equals a recomputation from the entries
        total = sum((e.charge_for(led.quotas(NS)[0], "conservative") for e in led.entries()), Charge())
        assert usage.reserved == total


UID_A, UID_B = "6f1c2a9e-0d4b-4c57-9a43-0e1f3b2a7c01", "b7d3e0c4-8a21-4f6e-9c55-2d7a1e9f4b02"


def test_uid_keys_a_retry_replaces_and_a_reused_name_does_not() -> None:
    led = ledger(make_quota("q", memory="100Gi"))
    assert led.admit(entry(UID_A, 40 * GiB)).allowed
    assert led.admit(entry(UID_A, 40 * GiB)).allowed  # the API server called again
    assert led.admit(entry(UID_B, 40 * GiB)).allowed  # same name, new object
    assert led.usage(NS, "q").reserved == Charge(80 * GiB, 2)
    led.release(ClaimRef(UID_A))  # a late DELETE of the old object
    assert led.usage(NS, "q").reserved == Charge(40 * GiB, 1)
    assert led.entry(ClaimRef(UID_B)) is not None


def test_release_drops_only_a_reservation() -> None:
    led = ledger(make_quota("q", memory="100Gi"))
    led.add_or_update_claim(entry(UID_A, 40 * GiB, allocated=True))
    assert led.release(ClaimRef(UID_A)) == ()
    assert led.usage(NS, "q").used == Charge(40 * GiB, 1)
    assert led.release(ClaimRef("never-admitted")) == ()


@pytest.mark.parametrize(
    ("reserved", "exact", "enforce", "allowed", "used"),
    [
        (40, 30, True, True, 30),     # within the reservation: the reservation shrinks to the exact charge
        (40, 60, True, True, 60),     # more than reserved, but the excess fits
        (40, 90, True, False, 0),     # the excess breaks hard: denied, the reservation stays
        (40, 90, False, False, 90),   # account-only: accounted anyway (the decision still says why)
        (None, 50, True, True, 50),   # never reserved (admitted before this process): the whole charge is checked
    ],
)
def test_allocate_checks_only_the_excess_over_the_reservation(
    reserved: int | None, exact: int, enforce: bool, allowed: bool, used: int
) -> None:
    led = ledger(make_quota("q", memory="100Gi"), make_quota("other", memory="1Gi", classes=["mig"]))
    assert led.admit(entry("someone-else", 30 * GiB)).allowed
    if reserved is not None:
        assert led.admit(entry(UID_A, reserved * GiB)).allowed
    decision = led.allocate(entry(UID_A, exact * GiB, allocated=True), enforce=enforce)
    assert decision.allowed is allowed
    usage = led.usage(NS, "q")
    assert usage.used == (Charge(used * GiB, 1) if used else Charge())
    if not allowed:
        assert 'exceeded DeviceQuota "q": requested memory=' in decision.message
    if used == 0:
        assert usage.reserved == Charge((30 + (reserved or 0)) * GiB, 2)


def test_allocate_within_the_reservation_passes_a_quota_already_over_hard() -> None:
    led = ledger(make_quota("q", memory="100Gi"))
    assert led.admit(entry(UID_A, 60 * GiB)).allowed
    led.add_or_update_claim(entry("existing", 80 * GiB, allocated=True))  # accounted, not admitted
    assert led.allocate(entry(UID_A, 60 * GiB, allocated=True), enforce=True).allowed
    assert led.allocate(entry(UID_A, 60 * GiB, allocated=True), enforce=True).allowed  # repeated: no double count
    assert led.usage(NS, "q").used == Charge(140 * GiB, 2)


def test_allocate_dry_run_changes_nothing() -> None:
    led = ledger(make_quota("q", memory="100Gi"))
    assert led.admit(entry(UID_A, 40 * GiB)).allowed
    assert led.allocate(entry(UID_A, 30 * GiB, allocated=True), enforce=True, dry_run=True).allowed
    assert led.usage(NS, "q").reserved == Charge(40 * GiB, 1)


# -- a relist built aside (ClaimsRebuild) ------------------------------------------------------------

REFS = [f"c{i}" for i in range(6)]
_memory = st.integers(1, 4).map(lambda n: n * 10 * GiB)
_live_op = st.one_of(
    st.tuples(st.just("upsert"), st.sampled_from(REFS), _memory, st.booleans(), st.sampled_from([GPU, MIG])),
    st.tuples(st.just("delete"), st.sampled_from(REFS)),
    st.tuples(st.just("scope"), st.sampled_from([None, ["mig"], ["gpu"]])),
)


def _apply_live(led: Ledger, shadow: dict[ClaimRef, Entry], op: tuple[Any, ...]) -> None:
    """`op` on the live ledger, and on `shadow` (what the live ledger's claims should be)."""
    if op[0] == "upsert":
        e = entry(op[1], op[2], allocated=op[3], cls=op[4])
        led.add_or_update_claim(e)
        shadow[e.ref] = e
    elif op[0] == "delete":
        led.delete_claim(ClaimRef(op[1]))
        shadow.pop(ClaimRef(op[1]), None)
    else:
        led.add_or_update_quota(parse_device_quota(make_quota("scoped", memory="1Ti", classes=op[1])))


def _assert_counted(led: Ledger) -> None:
    """Every quota's usage is what counting the same claims from scratch gives."""
    fresh = Ledger()
    for quota in led.quotas():
        fresh.add_or_update_quota(quota)
    for e in led.entries():
        fresh.add_or_update_claim(e)
    for q in led.quotas():
        assert led.usage(q.namespace, q.name) == fresh.usage(q.namespace, q.name), q.name


@pytest.mark.parametrize("moved_at_swap", [0, 2000], ids=["summed-again", "moved-at-swap"])
@settings(max_examples=300, deadline=None)
@given(
    initial=st.dictionaries(st.sampled_from(REFS), st.tuples(_memory, st.booleans())),
    listed=st.lists(st.tuples(st.sampled_from(REFS),
                              st.one_of(st.just("keep"), st.tuples(_memory, st.booleans(), st.sampled_from([GPU, MIG])))),
                    unique_by=lambda t: t[0]),
    live=st.lists(st.tuples(st.integers(0, 40), _live_op), max_size=8),
)
def test_a_claims_rebuild_is_what_the_list_says_with_live_changes_to_kept_claims(
        initial: dict[str, tuple[int, bool]], listed: list[tuple[str, Any]],
        live: list[tuple[int, tuple[Any, ...]]], moved_at_swap: int) -> None:
    """Live changes land between any two steps of the build (as the refiner and the webhook
    change the ledger between the slices of a relist): after the swap, a kept claim is as
    the live ledger holds it, a claim the list priced is the list's, any other is gone, and
    every quota's usage is what counting from scratch gives."""
    led = ledger(make_quota("all", memory="1Ti"), make_quota("scoped", memory="1Ti", classes=["mig"]))
    for ref, (memory, allocated) in initial.items():
        led.add_or_update_claim(entry(ref, memory, allocated=allocated))
    shadow = {e.ref: e for e in led.entries()}
    pending = sorted(live, key=lambda t: t[0])
    steps = 0

    def step() -> None:  # a pause of the build: the live ops due now
        nonlocal steps
        steps += 1
        while pending and pending[0][0] <= steps:
            _apply_live(led, shadow, pending.pop(0)[1])

    rebuild = ClaimsRebuild(led)
    kept, expected = set(), {}
    for ref, what in listed:
        step()
        if what == "keep":
            assert rebuild.keep(ClaimRef(ref)) == (ClaimRef(ref) in shadow)
            if ClaimRef(ref) in shadow:
                kept.add(ClaimRef(ref))
        else:
            expected[ClaimRef(ref)] = entry(ref, what[0], allocated=what[1], cls=what[2])
            rebuild.put(expected[ClaimRef(ref)])
        # Between two steps the live ledger is whole and nothing of the list shows.
        assert {e.ref: e for e in led.entries()} == shadow
        _assert_counted(led)
    with pausing(step), mock.patch.object(claimsrebuild, "MOVED_AT_SWAP", moved_at_swap):
        gone = rebuild.commit()
    rebuild.release()
    expected |= {ref: shadow[ref] for ref in kept if ref in shadow}
    assert {e.ref: e for e in led.entries()} == expected
    # Told as deleted: what the live ledger held at the swap and the list does not.
    assert {e.ref: e for e in gone} == {ref: e for ref, e in shadow.items() if ref not in expected}
    _assert_counted(led)
    for _, op in pending:  # after the swap, events apply as ever
        _apply_live(led, shadow, op)
    _assert_counted(led)


def test_a_swap_moves_the_usage_only_within_its_budget_of_quota_updates() -> None:
    """The swap holds the loop for one quota update per DeviceQuota of a changed claim's
    namespace, for its old entry and its new one; a bound on claims alone would let 2,000
    claims in a namespace of 5 DeviceQuotas and 5 teams hold it 0.75 s."""
    led = ledger(*(make_quota(f"q{i}", memory="1Ti") for i in range(5)))
    for i in range(300):
        led.add_or_update_claim(entry(f"c{i}", 10 * GiB))
    few = ClaimsRebuild(led)
    for i in range(100):
        few.put(entry(f"c{i}", 20 * GiB))
    assert few._move_cost([]) == 100 * 2 * 5 <= claimsrebuild.MOVED_AT_SWAP
    few.cancel()
    many = ClaimsRebuild(led)
    for i in range(300):
        many.put(entry(f"c{i}", 20 * GiB))
    assert many._move_cost([]) > claimsrebuild.MOVED_AT_SWAP  # 3,000 updates: summed again, in pauses
    assert many._move_cost([]) < 300 * 2 * 5  # counted only until past the bound
    gone = many.commit()
    assert gone == [] and all(led.usage(NS, f"q{i}").reserved == Charge(300 * 20 * GiB, 300) for i in range(5))


def test_a_cancelled_claims_rebuild_leaves_the_ledger_alone_and_a_second_one_waits() -> None:
    led = ledger(make_quota("q", memory="1Ti"))
    led.add_or_update_claim(entry("a", 10 * GiB))
    rebuild = ClaimsRebuild(led)
    with pytest.raises(RuntimeError, match="already under way"):
        ClaimsRebuild(led)
    rebuild.put(entry("b", 20 * GiB))
    rebuild.cancel()
    with pytest.raises(RuntimeError, match="cancelled"):
        rebuild.commit()
    assert [e.ref for e in led.entries()] == [ClaimRef("a")]
    assert led.usage(NS, "q").reserved == Charge(10 * GiB, 1)
    ClaimsRebuild(led).commit()  # the next one may start
    assert list(led.entries()) == []
    assert led.usage(NS, "q").reserved == Charge()


def test_release_frees_each_old_namespace_table_a_claim_at_a_time() -> None:
    """After a relist, what the ledger held before goes in pieces, a pause point between
    two claims: one namespace's thousands of claims freed in one piece held the loop."""
    led = ledger(make_quota("q", memory="1Ti"))
    for n in range(4):
        led.add_or_update_claim(entry(f"c{n}", GiB))
    old_namespace = led._by_namespace[NS]
    rebuild = ClaimsRebuild(led)
    rebuild.put(entry("new", GiB))
    rebuild.commit()
    sizes: list[int] = []
    with pausing(lambda: sizes.append(len(old_namespace))):
        rebuild.release()
    assert [size for size in sizes if size < 4][:4] == [3, 2, 1, 0] and not old_namespace
    assert [e.ref for e in led.entries()] == [ClaimRef("new")]


_scoped_quota = st.sampled_from([make_quota("q", memory="1Ti"), make_quota("q", devices=9),
                                 make_quota("q", memory="1Ti", classes=["mig"]), make_quota("q", classes=["gpu"]),
                                 make_quota("q", memory="1Ti", pricing="Optimistic")])


@given(st.lists(st.tuples(st.integers(0, 120), st.integers(0, 8), st.booleans(), st.sampled_from([GPU, MIG])),
                max_size=30), _scoped_quota)
@settings(max_examples=60, deadline=None)
def test_summing_a_quotas_claims_is_adding_them_one_by_one(claims: list[tuple[int, int, bool, DeviceClassName]],
                                                           raw: dict[str, Any]) -> None:
    # A relist sums every claim per quota in plain integers (`sum_usage`): exactly what
    # adding each to an empty usage (`add_usage`, every claim event) comes to.
    quota = parse_device_quota(raw)
    entries = [entry(f"c{i}", memory * GiB, devices, cls=cls, allocated=allocated)
               for i, (memory, devices, allocated, cls) in enumerate(claims)]
    one_by_one = Usage()
    for e in entries:
        one_by_one = add_usage(one_by_one, e, quota, "conservative", +1)
    assert sum_usage(entries, quota, "conservative") == one_by_one


def test_a_relist_counts_a_namespace_once_for_its_quota_and_the_team_counting_alike() -> None:
    led = ledger(make_quota("q", memory="1Ti"), make_quota("mig", memory="1Ti", classes=["mig"]))
    led.add_or_update_quota(parse_cluster_device_quota(make_cluster_quota("team", memory="2Ti")))
    led.set_namespace(NS, {"team.draquota.io/name": "team"})
    rebuild = ClaimsRebuild(led)
    for i in range(5):
        rebuild.put(entry(f"c{i}", 10 * GiB, cls=MIG if i % 2 else GPU))
    # Summed again whole, as a relist of many changed claims is (not moved by each).
    with mock.patch.object(claimsrebuild, "MOVED_AT_SWAP", 0), \
            mock.patch.object(claimsrebuild, "sum_usage", wraps=sum_usage) as summed:
        rebuild.commit()
    assert summed.call_count == 2  # "q" and the team alike, "mig" apart
    assert led.usage(NS, "q").reserved == led.usage(Namespace(""), "team").reserved == Charge(50 * GiB, 5)
    assert led.usage(NS, "mig").reserved == Charge(20 * GiB, 2)
