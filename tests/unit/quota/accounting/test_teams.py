"""quota.accounting.teams through quota.accounting.ledger: team quotas (ClusterDeviceQuotas) over labelled namespaces."""

from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quota.quotas.devicequota import RESOURCES, parse_cluster_device_quota, parse_device_quota
import quota.accounting.claimsrebuild as claimsrebuild
from quota.accounting.claimsrebuild import ClaimsRebuild
from quota.accounting.ledger import Ledger, recounting_message
from quota.accounting.ledgerentry import ClaimRef, Entry
from quota.pricing.priced import PricedRequest, Pricing
from quota.values.model import Charge, DeviceClassName, Namespace
from quota.values.work import pausing

from ...builders import GiB, advised, make_cluster_quota, make_quota
from .test_ledger import counting_adds

A, B, C = Namespace("team-a"), Namespace("team-b"), Namespace("team-c")
TEAM = Namespace("")
GPU, MIG = DeviceClassName("gpu"), DeviceClassName("mig")
ML = {"team.draquota.io/name": "ml"}


def entry(ref: str, memory: int, devices: int = 1, *, ns: Namespace = A, cls: DeviceClassName = GPU,
          allocated: bool = False, owner: str = "") -> Entry:
    charge = Charge(memory, devices)
    pricing = Pricing((PricedRequest("r", devices, charge, ((cls, charge),)),))
    return Entry(ns, ClaimRef(ref), {"conservative": pricing}, allocated, owner=owner)


def team(name: str = "ml", **fields: Any) -> Any:
    return parse_cluster_device_quota(make_cluster_quota(name, team="ml", **fields))


def ledger(*labelled: Namespace, quota: Any = None) -> Ledger:
    led = Ledger()
    for ns in (A, B, C):
        led.set_namespace(ns, ML if ns in labelled else {})
    led.add_or_update_quota(quota if quota is not None else team(memory="100Gi"))
    return led


def test_a_team_counts_the_claims_of_every_namespace_it_selects_and_no_other() -> None:
    led = ledger(A, B)
    led.add_or_update_claim(entry("a", 30 * GiB, allocated=True))
    led.add_or_update_claim(entry("b", 20 * GiB, ns=B))
    led.add_or_update_claim(entry("c", 50 * GiB, ns=C))
    usage = led.usage(TEAM, "ml")
    assert (usage.used, usage.reserved, usage.allocated_claims, usage.pending_claims) == (
        Charge(30 * GiB, 1), Charge(20 * GiB, 1), 1, 1)
    assert led.members("ml") == (A, B)
    assert led.usage_in("ml", A).used == Charge(30 * GiB, 1) and led.usage_in("ml", B).reserved == Charge(20 * GiB, 1)
    assert led.usage_in("ml", C) == led.usage_in("ml", Namespace("nowhere"))
    assert [q.name for q in led.quotas(A)] == ["ml"] and led.quotas(C) == []
    assert led.keys(A) == ((TEAM, "ml"),) and led.keys(C) == ()
    assert led.quota(TEAM, "ml") is not None


def test_a_namespace_with_its_own_quota_answers_to_both_own_first() -> None:
    led = ledger(A)
    led.add_or_update_quota(parse_device_quota(make_quota("gpus", memory="1Ti")))
    assert [q.kind for q in led.quotas(A)] == ["DeviceQuota", "ClusterDeviceQuota"]
    assert led.keys(A) == ((A, "gpus"), (TEAM, "ml"))
    assert {q.name for q in led.quotas()} == {"gpus", "ml"}
    assert led.add_or_update_claim(entry("a", GiB)) == ((A, "gpus"), (TEAM, "ml"))


def test_admission_is_all_or_nothing_across_the_namespaces_of_a_team() -> None:
    led = ledger(A, B)
    assert led.admit(entry("a", 60 * GiB)).allowed
    denied = led.admit(entry("b", 60 * GiB, ns=B))
    assert not denied.allowed and denied.denied_by == ("ClusterDeviceQuota/ml",)
    assert denied.message == advised('exceeded ClusterDeviceQuota "ml": requested memory=60Gi, used memory=0, '
                                     "reserved memory=60Gi, limited memory=100Gi", "reserved", namespace=B)
    assert led.entry(ClaimRef("b")) is None
    # A namespace outside the team is not limited by it.
    assert led.admit(entry("c", 60 * GiB, ns=C)).allowed


def test_a_relabel_moves_a_namespaces_usage_in_and_out_at_once() -> None:
    led = ledger(A)
    led.add_or_update_claim(entry("b", 40 * GiB, ns=B, allocated=True))
    assert led.set_namespace(B, ML) == ((TEAM, "ml"),)
    assert led.usage(TEAM, "ml").used == Charge(40 * GiB, 1) and led.members("ml") == (A, B)
    # Joining a team already full puts it over hard (no eviction): the next admission is denied.
    assert not led.admit(entry("a", 61 * GiB)).allowed
    assert led.set_namespace(B, {**ML, "other": "x"}) == ()  # still a member: nothing moved
    assert led.set_namespace(B, {}) == ((TEAM, "ml"),)
    assert led.usage(TEAM, "ml") == led.usage(TEAM, "empty-team") and led.members("ml") == (A,)
    assert led.admit(entry("a", 61 * GiB)).allowed
    assert led.delete_namespace(A) == ((TEAM, "ml"),)
    assert led.usage(TEAM, "ml").reserved == Charge() and led.members("ml") == ()
    assert led.delete_namespace(A) == ()


def test_the_name_label_selects_a_namespace_that_does_not_carry_it() -> None:
    # `dra-quota check` reads Namespaces without it; the API server always sets it.
    led = ledger(quota=team(selector={"matchLabels": {"kubernetes.io/metadata.name": "team-b"}}, memory="1Gi"))
    assert led.members("ml") == (B,)


def test_a_team_quota_created_later_counts_and_deleting_it_drops_everything() -> None:
    led = Ledger()
    led.set_namespace(A, ML)
    led.add_or_update_claim(entry("a", 10 * GiB))
    assert led.add_or_update_quota(team(memory="100Gi")) == ((TEAM, "ml"),)
    assert led.usage(TEAM, "ml").reserved == Charge(10 * GiB, 1)
    assert led.delete_quota(TEAM, "ml") == ((TEAM, "ml"),)
    assert led.quotas(A) == [] and led.quotas() == [] and led.members("ml") == ()
    assert led.usage(TEAM, "ml").reserved == Charge() and led.delete_quota(TEAM, "ml") == ()
    # The claim still counts where it belongs, and nothing of the team is left behind.
    assert led.add_or_update_claim(entry("a", 20 * GiB)) == ()


def test_a_team_seen_again_unchanged_is_not_recounted(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every status write comes back through the watch: it must not cost a pass over the
    # claims of every member namespace.
    led = ledger(A, B)
    for i in range(20):
        led.add_or_update_claim(entry(f"c{i}", GiB, ns=A if i % 2 else B))
    counted = counting_adds(monkeypatch)
    before = led.usage(TEAM, "ml")
    led.add_or_update_quota(team(memory="200Gi"))  # another hard
    assert counted == [] and led.usage(TEAM, "ml") == before
    assert led.quota(TEAM, "ml").hard.memory == 200 * GiB  # type: ignore[union-attr]
    assert not led.admit(entry("x", 181 * GiB)).allowed  # the new hard holds at once
    led.add_or_update_quota(team(memory="200Gi", classes=["mig"]))  # another scope
    assert len(counted) == 20 and led.usage(TEAM, "ml").reserved == Charge()
    led.add_or_update_quota(team(selector={"matchLabels": {"kubernetes.io/metadata.name": "team-c"}}, memory="1Gi"))
    assert led.members("ml") == (C,)


def test_a_workloads_holding_counts_in_its_teams_usage() -> None:
    led = ledger(A, B)
    led.set_holding(entry("w", 30 * GiB, ns=B))
    usage = led.usage(TEAM, "ml")
    assert (usage.reserved, usage.workloads) == (Charge(30 * GiB, 1), Charge(30 * GiB, 1))
    assert led.usage_in("ml", B).workloads == Charge(30 * GiB, 1) and led.usage_in("ml", A).workloads == Charge()
    assert not led.admit(entry("a", 71 * GiB)).allowed
    led.set_namespace(B, {})
    assert led.usage(TEAM, "ml").reserved == Charge()


# -- properties ---------------------------------------------------------------------------------

NAMESPACES = [A, B, C]
REFS = [f"c{i}" for i in range(8)]
TEAMS: dict[str, dict[str, Any]] = {
    "ml": {"team": "ml", "memory": "100Gi", "devices": 4},
    "mig": {"selector": {"matchExpressions": [{"key": "team.draquota.io/name", "operator": "In", "values": ["ml", "web"]}]},
            "memory": "60Gi", "classes": ["mig"]},
    "all": {"selector": {}, "devices": 6},
}
_memory = st.integers(1, 6).map(lambda n: n * 10 * GiB)
_op = st.one_of(
    st.tuples(st.just("admit"), st.sampled_from(REFS), st.sampled_from(NAMESPACES), _memory, st.sampled_from([GPU, MIG])),
    st.tuples(st.just("allocate"), st.sampled_from(REFS)),
    st.tuples(st.just("delete"), st.sampled_from(REFS)),
    st.tuples(st.just("label"), st.sampled_from(NAMESPACES), st.sampled_from([None, "ml", "web"])),
    st.tuples(st.just("forget"), st.sampled_from(NAMESPACES)),
    st.tuples(st.just("team"), st.sampled_from(sorted(TEAMS)), st.sampled_from([None, "40Gi", "100Gi"])),
)


def _labels(value: str | None) -> dict[str, str]:
    return {} if value is None else {"team.draquota.io/name": value}


def _team(name: str, memory: str | None) -> Any:
    fields = {**TEAMS[name], **({"memory": memory} if memory is not None else {})}
    return parse_cluster_device_quota(make_cluster_quota(name, **fields))


def _fresh(led: Ledger, labels: dict[Namespace, dict[str, str]]) -> Ledger:
    """The same quotas, labels and claims, counted from scratch at once."""
    fresh = Ledger()
    for ns, value in labels.items():
        fresh.set_namespace(ns, value)
    for quota in led.quotas():
        fresh.add_or_update_quota(quota)
    for e in led.entries():
        fresh.add_or_update_claim(e)
    return fresh


def _assert_counted(led: Ledger, labels: dict[Namespace, dict[str, str]]) -> None:
    """Every team's totals and parts are what counting the same claims from scratch gives
    (a team still being recounted: its members only, its usage is partial)."""
    fresh = _fresh(led, labels)
    for quota in led.quotas():
        assert led.members(quota.name) == fresh.members(quota.name)
        if led.recounting(quota.name):
            continue
        assert led.usage(quota.namespace, quota.name) == fresh.usage(quota.namespace, quota.name), quota.name
        assert led.members(quota.name) == fresh.members(quota.name)
        for ns in led.members(quota.name):
            assert led.usage_in(quota.name, ns) == fresh.usage_in(quota.name, ns)


def _apply(led: Ledger, labels: dict[Namespace, dict[str, str]], op: tuple[Any, ...]) -> None:
    if op[0] == "admit":
        new = entry(op[1], op[3], ns=op[2], cls=op[4])
        old = led.entry(new.ref)
        if old is not None and old.namespace != new.namespace:
            return  # a uid lives in one namespace
        decision = led.admit(new)
        if decision.allowed:
            # `admit` never lets a charged, Enforce quota's used + reserved past hard,
            # counted from scratch (a team whose count is partial refuses).
            fresh = _fresh(led, labels)
            for quota in led.quotas(new.namespace):
                usage = fresh.usage(quota.namespace, quota.name)
                charge = new.charge_for(quota, led.default_mode)
                for r in RESOURCES:
                    limit = quota.hard.get(r)
                    if limit is not None and charge.amount(r) > 0:
                        assert usage.used.amount(r) + usage.reserved.amount(r) <= limit, (quota.name, r)
    elif op[0] == "allocate":
        old = led.entry(ClaimRef(op[1]))
        if old is not None:
            led.add_or_update_claim(Entry(old.namespace, old.ref, old.pricing, True))
    elif op[0] == "delete":
        led.delete_claim(ClaimRef(op[1]))
    elif op[0] == "label":
        labels[op[1]] = _labels(op[2])
        led.set_namespace(op[1], labels[op[1]])
    elif op[0] == "forget":
        labels.pop(op[1], None)
        led.delete_namespace(op[1])
    elif op[2] is None:
        led.delete_quota(TEAM, op[1])
    else:
        led.add_or_update_quota(_team(op[1], op[2]))


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=40))
def test_incremental_team_usage_is_a_recount_and_admit_never_passes_hard(ops: list[tuple[Any, ...]]) -> None:
    led = Ledger()
    labels: dict[Namespace, dict[str, str]] = {}
    for op in ops:
        _apply(led, labels, op)
        _assert_counted(led, labels)


_recount = st.tuples(st.just("recount"), st.integers(0, 6))


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.one_of(_op, _recount), max_size=40))
def test_recounts_in_pauses_leave_every_team_counted_and_nothing_decides_on_a_partial_count(
        ops: list[tuple[Any, ...]]) -> None:
    """As `serve` runs it (`Ledger.defer_recounts`): a part no quota of the same scope
    counts is recounted later, pausing after every claim, and any op (claims, relabels,
    team changes) lands in those pauses. A team not being recounted is always a recount
    from scratch; an admission never passes `hard` counted from scratch (`_apply`)."""
    led = Ledger()
    led.defer_recounts(lambda: None, every=1)
    labels: dict[Namespace, dict[str, str]] = {}
    queue = list(ops)

    def between(budget: list[int]) -> None:
        if budget[0] > 0 and queue and queue[0][0] != "recount":
            budget[0] -= 1
            _apply(led, labels, queue.pop(0))

    while queue:
        op = queue.pop(0)
        if op[0] == "recount":
            budget = [op[1]]
            with pausing(lambda: between(budget)):
                led.recount()
        else:
            _apply(led, labels, op)
        _assert_counted(led, labels)
    led.recount()
    assert not any(led.recounting(q.name) for q in led.quotas())
    _assert_counted(led, labels)


def test_a_relabel_leaves_the_count_to_a_recount_that_refuses_the_team_until_it_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    due: list[int] = []
    led = ledger(B, quota=team(memory="100Gi", classes=["gpu"]))
    led.defer_recounts(lambda: due.append(1), every=2)
    for i in range(6):
        led.add_or_update_claim(entry(f"a{i}", 10 * GiB, ns=A, allocated=bool(i % 2)))
    counted = counting_adds(monkeypatch)
    assert led.set_namespace(A, ML) == ((TEAM, "ml"),)
    assert counted == [] and due == [1] and led.recounting("ml")  # no pass over A's claims here
    refused = led.admit(entry("new", GiB, ns=B))  # any namespace of the team: its total is partial
    assert (refused.allowed, refused.message) == (False, recounting_message("ml"))
    assert led.admit(entry("free", GiB, ns=B, cls=MIG)).allowed  # not charged to the team: decided
    events = [lambda: led.add_or_update_claim(entry("a6", 5 * GiB, ns=A)), lambda: led.delete_claim(ClaimRef("a0")),
              lambda: led.add_or_update_claim(entry("a2", 10 * GiB, ns=A, allocated=True))]

    def between() -> None:
        if events:
            events.pop(0)()

    with pausing(between):
        assert led.recount() == ((TEAM, "ml"),)
    assert events == [] and not led.recounting("ml") and len(counted) > 6
    _assert_counted(led, {A: ML, B: ML, C: {}})
    assert led.usage(TEAM, "ml").used == Charge(40 * GiB, 4)
    assert led.admit(entry("new", GiB, ns=B)).allowed


def test_a_recount_outdated_while_it_ran_is_dropped() -> None:
    led = ledger()
    led.defer_recounts(lambda: None, every=1)
    for i in range(3):
        led.add_or_update_claim(entry(f"a{i}", 10 * GiB, ns=A))
    led.set_namespace(A, ML)
    moves = [lambda: led.set_namespace(A, {}), lambda: led.set_namespace(A, ML)]  # left, and joined again

    def between() -> None:
        if moves:
            moves.pop(0)()

    with pausing(between):
        led.recount()  # the first recount's sum is stale: only the second one's counts
    assert not led.recounting("ml")
    assert led.usage(TEAM, "ml").reserved == Charge(30 * GiB, 3)
    led.add_or_update_quota(team(memory="100Gi", classes=["mig"]))  # the team's scope changed: counted again
    assert led.recounting("ml")
    led.delete_quota(TEAM, "ml")
    assert not led.recounting("ml") and led.recount() == ()


@pytest.mark.parametrize("moved_at_swap", [0, 2000], ids=["summed-again", "moved-at-swap"])
@pytest.mark.parametrize("deferred", [False, True])
@settings(max_examples=150, deadline=None)
@given(
    initial=st.lists(_op, max_size=15),
    listed=st.lists(st.tuples(st.sampled_from(REFS), st.sampled_from(NAMESPACES), _memory, st.booleans()),
                    unique_by=lambda t: t[0]),
    live=st.lists(st.tuples(st.integers(0, 30), _op), max_size=8),
)
def test_a_claims_rebuild_leaves_every_team_counted(initial: list[tuple[Any, ...]],
                                                    listed: list[tuple[str, Namespace, int, bool]],
                                                    live: list[tuple[int, tuple[Any, ...]]], deferred: bool,
                                                    moved_at_swap: int) -> None:
    """Relabels, team changes and claim events land between any two steps of the build and
    of the swap: after it, every team's usage and parts are a recount (`deferred`: once
    the recounts the swap left, if any, have run)."""
    led = Ledger()
    if deferred:
        led.defer_recounts(lambda: None, every=1)
    labels: dict[Namespace, dict[str, str]] = {}
    for op in initial:
        _apply(led, labels, op)
    pending = sorted(live, key=lambda t: t[0])
    steps = 0

    def step() -> None:
        nonlocal steps
        steps += 1
        while pending and pending[0][0] <= steps:
            _apply(led, labels, pending.pop(0)[1])

    rebuild = ClaimsRebuild(led)
    for ref, ns, memory, allocated in listed:
        step()
        if not rebuild.keep(ClaimRef(ref)):
            rebuild.put(entry(ref, memory, ns=ns, allocated=allocated))
    with pausing(step), mock.patch.object(claimsrebuild, "MOVED_AT_SWAP", moved_at_swap):
        rebuild.commit()
    rebuild.release()
    _assert_counted(led, labels)
    led.recount()
    _assert_counted(led, labels)
    for _, op in pending:
        _apply(led, labels, op)
    _assert_counted(led, labels)


def test_a_namespace_joining_a_team_takes_the_count_of_a_quota_of_the_same_scope(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Its own DeviceQuota (or another team) counting with the same pricing mode and scope
    # already holds the part: a relabel costs no pass over the namespace's claims.
    led = ledger(B)
    led.add_or_update_quota(parse_device_quota(make_quota("own", namespace="team-a", memory="1000Gi")))
    for i in range(20):
        led.add_or_update_claim(entry(f"c{i}", GiB, ns=A, allocated=bool(i % 2)))
    counted = counting_adds(monkeypatch)
    assert led.set_namespace(A, ML) == ((TEAM, "ml"),)
    assert counted == [] and led.usage_in("ml", A) == led.usage(A, "own")
    led.add_or_update_quota(team("other", memory="1Gi"))  # a second team over A, B: A's part from "ml"
    assert counted == [] and led.usage_in("other", A) == led.usage_in("ml", A)
    led.add_or_update_quota(team("mig", memory="1Gi", classes=["mig"]))  # another scope: counted
    assert len(counted) == 20
    _assert_counted(led, {A: ML, B: ML, C: {}})


CV = {"team.draquota.io/name": "cv"}
_MANY = 1_000


def _create(led: Ledger) -> None:
    led.add_or_update_quota(team(memory="10Ti"))


def _select_again(led: Ledger) -> None:
    """"ml" turns from the label only team-c carries to the one team-a and team-b carry."""
    led.add_or_update_quota(team(memory="10Ti"))


def _unlabel_then_create(led: Ledger) -> None:
    led.set_namespace(A, {})
    _create(led)


def _relabel(led: Ledger) -> None:
    led.set_namespace(A, ML)


@pytest.mark.parametrize(("before", "trigger"), [
    # The team created over team-a and team-b, labelled already.
    (lambda led: None, _create),
    # Its selector changed: from team-c's label to theirs.
    (lambda led: led.add_or_update_quota(parse_cluster_device_quota(
        make_cluster_quota("ml", team="cv", memory="10Ti"))), _select_again),
    # team-a relabelled into it (team-b a member already).
    (_unlabel_then_create, _relabel),
], ids=["created", "selector-changed", "relabelled"])
def test_each_trigger_recounts_many_claims_in_pauses_refusing_that_team_only(
        monkeypatch: pytest.MonkeyPatch, before: Any, trigger: Any) -> None:
    """A ClusterDeviceQuota created, its selector changed, a namespace relabelled into it:
    none counts team-a's claims in the event (no DeviceQuota of the team's scope counts
    them already), the recount pauses every `every` claims, and in those pauses only the
    claims charged to that team are refused; the other team and a namespace in no team
    are decided."""
    led = Ledger()
    led.defer_recounts(lambda: None, every=16)
    for ns, labels in ((A, ML), (B, ML), (C, CV)):
        led.set_namespace(ns, labels)
    led.add_or_update_quota(parse_cluster_device_quota(make_cluster_quota("cv", team="cv", memory="1Ti")))
    for i in range(_MANY):
        led.add_or_update_claim(entry(f"a{i}", GiB, ns=A, allocated=bool(i % 2)))
    before(led)
    led.recount()  # whatever `before` left due
    counted = counting_adds(monkeypatch)
    trigger(led)
    assert counted == [] and led.recounting("ml") and not led.recounting("cv")  # nothing summed in the event
    pauses: list[tuple[bool, bool, bool]] = []  # while ml is recounted: (ml admits, its retry message, cv admits)

    def between() -> None:
        if not led.recounting("ml"):
            return  # its last part swapped in: decided again
        ours, theirs = led.admit(entry("b", GiB, ns=B)), led.admit(entry("c", GiB, ns=C))
        pauses.append((ours.allowed, ours.message == recounting_message("ml"), theirs.allowed))
        led.delete_claim(ClaimRef("c"))

    with pausing(between):
        assert led.recount() == ((TEAM, "ml"),)
    assert len(pauses) >= _MANY // 16
    assert set(pauses) == {(False, True, True)}  # every pause: ml refuses with the retry message, cv decides
    assert not led.recounting("ml") and led.usage(TEAM, "ml").used == Charge(_MANY // 2 * GiB, _MANY // 2)
    assert led.admit(entry("b", GiB, ns=B)).allowed
