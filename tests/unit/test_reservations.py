"""quota.reservations: the persisted record, and no interleaving of replicas over-commits."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st

from quota.devicequota import DeviceQuota, Usage, parse_device_quota
from quota.model import Charge
from quota.reservations import Request, Reservation, apply, parse_reservations, status_fields

from .builders import GiB, make_quota

GPU = Charge(80 * GiB, 1)
QUOTA = parse_device_quota(make_quota("gpus", memory="160Gi"))
AUDIT = parse_device_quota({**make_quota("gpus", memory="160Gi"),
                            "spec": {"hard": {"memory": "160Gi"}, "enforcement": "Audit"}})
TTL = 60.0


def held(*entries: tuple[str, float]) -> dict[str, Reservation]:
    return {uid: Reservation(uid, f"team-a/{uid}", GPU, expires) for uid, expires in entries}


def run(requests: list[Request], current: dict[str, Reservation], *, cached: frozenset[str] = frozenset(),
        gone: frozenset[str] = frozenset(), usage: Usage = Usage(), now: float = 100.0,
        quota: DeviceQuota = QUOTA) -> tuple[list[bool], list[str], bool]:
    out = apply(quota, current, requests, usage=usage, cached=cached.__contains__, gone=gone.__contains__,
                now=now, ttl=TTL)
    return [d.allowed for d in out.decisions], sorted(out.held), out.changed


def reserve(uid: str, charge: Charge = GPU) -> Request:
    return Request("reserve", uid, f"team-a/{uid}", charge)


def test_requests_apply_in_order_until_hard() -> None:
    assert run([reserve("a"), reserve("b"), reserve("c")], {}) == ([True, True, False], ["a", "b"], True)


def test_a_retried_uid_replaces_its_entry_instead_of_counting_twice() -> None:
    assert run([reserve("a"), reserve("a")], held(("b", 200.0))) == ([True, True], ["a", "b"], True)


def test_expired_and_gone_entries_are_dropped_and_count_nothing() -> None:
    current = held(("old", 99.0), ("deleted", 200.0))
    assert run([reserve("a"), reserve("b")], current, gone=frozenset({"deleted"})) == ([True, True], ["a", "b"], True)


def test_a_confirmed_entry_is_kept_but_counted_once_through_the_cache() -> None:
    # "a" is in the cache (usage counts it) and still on the status: counted once, kept
    # for replicas whose watch has not delivered it yet.
    usage = Usage(reserved=GPU, pending_claims=1)
    assert run([reserve("b")], held(("a", 200.0)), cached=frozenset({"a"}), usage=usage) == ([True], ["a", "b"], True)
    assert run([reserve("b")], held(("a", 200.0)), usage=usage) == ([False], ["a"], False)


def test_a_denied_retry_keeps_the_earlier_entry() -> None:
    bigger = reserve("a", Charge(200 * GiB, 2))
    assert run([bigger], held(("a", 200.0))) == ([False], ["a"], False)


def test_release_and_audit() -> None:
    assert run([Request("release", "a")], held(("a", 200.0), ("b", 200.0))) == ([True], ["b"], True)
    assert run([Request("release", "x")], held(("b", 200.0))) == ([True], ["b"], False)
    # Audit admits (with a warning) and still records the reservation.
    out = apply(AUDIT, held(("a", 200.0), ("b", 200.0)), [reserve("c")], usage=Usage(),
                cached=lambda _: False, gone=lambda _: False, now=100.0, ttl=TTL)
    assert [d.allowed for d in out.decisions] == [True] and "c" in out.held and out.decisions[0].warnings


def test_the_status_fields_round_trip_and_leave_reserved_to_the_controller() -> None:
    current = {"u1": Reservation("u1", "team-a/c1", GPU, 1_800_000_000.5),
               "u2": Reservation("u2", "team-a/c2", Charge(10 * GiB, 1), 1_800_000_001.0)}
    fields = status_fields(current)
    assert set(fields) == {"reservations"}  # status.reserved is quota.quotastatus's
    assert fields["reservations"]["u1"] == {"claim": "team-a/c1", "memory": 80 * GiB, "devices": 1,
                                            "expires": "2027-01-15T08:00:00.500Z"}
    assert parse_reservations(fields) == current
    assert parse_reservations({"reservations": {"bad": {"memory": 1}}}) == {}
    assert parse_reservations(None) == {}


# -- two replicas, any interleaving --------------------------------------------------------


@dataclass
class Replica:
    cache: set[str] = field(default_factory=set)
    snapshot: tuple[int, dict[str, Reservation]] | None = None


@dataclass
class World:
    """The API server's status (a version and the entries) and the claims it persisted."""

    version: int = 0
    held: dict[str, Reservation] = field(default_factory=dict)
    claims: dict[str, tuple[Charge, float]] = field(default_factory=dict)  # uid -> charge, admitted at
    now: float = 0.0
    replicas: tuple[Replica, Replica] = field(default_factory=lambda: (Replica(), Replica()))


SIZES = (Charge(80 * GiB, 1), Charge(40 * GiB, 1))
HARD = parse_device_quota(make_quota("gpus", memory="160Gi"))
action = st.one_of(
    st.tuples(st.just("read"), st.integers(0, 1)),
    st.tuples(st.just("admit"), st.integers(0, 1), st.integers(0, len(SIZES) - 1), st.booleans(), st.booleans()),
    st.tuples(st.just("sync"), st.integers(0, 1)),
    st.tuples(st.just("tick"), st.floats(0.5, 40.0)),
)


def _step(world: World, act: tuple[object, ...], counter: list[int]) -> None:
    kind = act[0]
    if kind == "read":
        world.replicas[int(act[1])].snapshot = (world.version, dict(world.held))  # type: ignore[call-overload]
    elif kind == "sync":
        world.replicas[int(act[1])].cache |= set(world.claims)  # type: ignore[call-overload]
    elif kind == "tick":
        world.now += float(act[1])  # type: ignore[arg-type]
        # The protocol's assumption: a watch delivers a claim within the TTL of its admission.
        for replica in world.replicas:
            replica.cache |= {uid for uid, (_, at) in world.claims.items() if at + TTL <= world.now}
    else:
        _, r, size, persists, use_stale = act
        replica = world.replicas[int(r)]  # type: ignore[call-overload]
        if replica.snapshot is None or not use_stale:
            replica.snapshot = (world.version, dict(world.held))
        version, current = replica.snapshot
        counter[0] += 1
        uid = f"u{counter[0]}"
        cache = {u: world.claims[u][0] for u in replica.cache}
        usage = Usage(reserved=sum(cache.values(), Charge()))
        out = apply(HARD, current, [reserve(uid, SIZES[int(size)])], usage=usage,  # type: ignore[call-overload]
                    cached=cache.__contains__, gone=lambda _: False, now=world.now, ttl=TTL)
        replica.snapshot = None
        if not out.decisions[0].allowed or version != world.version:
            return  # denied, or a conflict: the API server refused the write, nothing admitted
        world.version += 1
        world.held = out.held
        if persists:  # the API server then persists the claim (unless a later webhook denied it)
            world.claims[uid] = (SIZES[int(size)], world.now)  # type: ignore[call-overload]


@settings(max_examples=1000, deadline=None)
@given(st.lists(action, min_size=8, max_size=40))
# Why a confirmed entry is kept until it expires: replica 0 holds u1 in its cache, so
# dropping u1's entry at its next write would leave replica 1 counting u1 nowhere.
@example([("admit", 0, 0, True, False), ("sync", 0), ("admit", 0, 0, True, False), ("admit", 1, 0, True, False)])
def test_no_interleaving_of_two_replicas_over_commits(actions: list[tuple[object, ...]]) -> None:
    world, counter = World(), [0]
    for act in actions:
        _step(world, act, counter)
        persisted = sum((c for c, _ in world.claims.values()), Charge())
        assert persisted.memory <= (HARD.hard.memory or 0), (act, world)


def attempt(uid: str, series: str = "team-a/train-extended-resources-") -> Request:
    """A reserve by the scheduler for a Pod's extended resources: one attempt of `series`."""
    return Request("reserve", uid, f"{series}{uid[-5:]:0>5}", GPU, series)


def test_an_attempt_replaces_the_unconfirmed_entries_of_earlier_attempts_of_its_series() -> None:
    series = "team-a/train-extended-resources-"
    earlier = {uid: Reservation(uid, f"{series}{uid}", GPU, 200.0) for uid in ("aaaaa", "bbbbb")}
    # Two attempts the in-tree ResourceQuota refused after us: the quota would be full.
    assert run([reserve("x")], dict(earlier)) == ([False], ["aaaaa", "bbbbb"], False)
    assert run([attempt("ccccc")], dict(earlier)) == ([True], ["ccccc"], True)
    # One whose claim is cached exists: kept (and counted once, by the cache).
    usage = Usage(reserved=GPU, pending_claims=1)
    assert run([attempt("ccccc")], dict(earlier), cached=frozenset({"aaaaa"}), usage=usage) == (
        [True], ["aaaaa", "ccccc"], True)


def test_an_attempt_leaves_other_series_and_other_claims_alone() -> None:
    current = {
        # Another Pod whose name starts the same: a longer generated name.
        "other": Reservation("other", "team-a/train-extended-resources-x-extended-resources-abcde", GPU, 200.0),
        "plain": Reservation("plain", "team-a/train-extended-resources-abcd", GPU, 200.0),  # not 5 random
        "elsewhere": Reservation("elsewhere", "team-b/train-extended-resources-abcde", GPU, 200.0),
    }
    big = parse_device_quota(make_quota("gpus", memory="400Gi"))
    assert run([attempt("ccccc")], current, quota=big) == ([True], ["ccccc", "elsewhere", "other", "plain"], True)
    # A reserve without a series drops nothing.
    assert run([reserve("z")], dict(current), quota=big)[1] == ["elsewhere", "other", "plain", "z"]
