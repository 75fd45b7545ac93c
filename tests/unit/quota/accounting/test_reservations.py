"""quota.accounting.reservations and quota.accounting.reservationrecord: the persisted record, the watermark, and no interleaving of replicas over-commits."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from quota.accounting.excess import allocation_key
from quota.accounting.headroom import (
    LEASE_PREFIX,
    Lease,
    Plan,
    Sizing,
    SpecVersion,
    landed,
    renew,
    take,
    untake,
    writing,
)
from quota.accounting.reservationrecord import Record, Reservation, parse_record, status_fields
from quota.accounting.reservations import Outcome, Request, apply, in_flight, settle
from quota.quotas.devicequota import DeviceQuota, Usage, parse_cluster_device_quota, parse_device_quota
from quota.values.model import Charge

from ...builders import GiB, make_cluster_quota, make_quota

GPU = Charge(80 * GiB, 1)
QUOTA = parse_device_quota(make_quota("gpus", memory="160Gi"))
AUDIT = parse_device_quota({**make_quota("gpus", memory="160Gi"),
                            "spec": {"hard": {"memory": "160Gi"}, "enforcement": "Audit"}})
TTL = 120.0


@dataclass(frozen=True)
class Seen:
    """What one replica's caches know (`quota.accounting.reservations.Caches`), as plain tables."""

    claims: dict[str, int] = field(default_factory=dict)  # uid -> resourceVersion held at
    unrecorded: frozenset[str] = frozenset()  # held, but without the charge annotation yet
    deleted: dict[str, int] = field(default_factory=dict)  # uid -> resourceVersion of its deletion
    workloads: frozenset[str] = frozenset()  # Workloads the ledger holds
    finished: frozenset[str] = frozenset()

    def claim_version(self, uid: str) -> int | None:
        return self.claims.get(uid)

    def claim_recorded(self, uid: str) -> int | None:
        return None if uid in self.unrecorded else self.claims.get(uid)

    def claim_gone(self, uid: str) -> int | None:
        return self.deleted.get(uid)

    def workload_counted(self, uid: str) -> bool:
        return uid in self.workloads

    def workload_gone(self, uid: str) -> bool:
        return uid in self.finished


def held(*entries: tuple[str, float], through: int | None = None) -> Record:
    return Record({uid: Reservation(uid, f"team-a/{uid}", GPU, expires) for uid, expires in entries}, through)


def run(requests: list[Request], record: Record, *, seen: Seen = Seen(), usage: Usage = Usage(), now: float = 100.0,
        quota: DeviceQuota = QUOTA, max_entries: int = 1000) -> tuple[list[bool], list[str], bool]:
    out = apply(quota, record, requests, usage=usage, caches=seen, now=now, ttl=TTL, max_entries=max_entries)
    return [d.allowed for d in out.decisions], sorted(out.record.held), out.changed


def reserve(uid: str, charge: Charge = GPU) -> Request:
    return Request("reserve", uid, f"team-a/{uid}", charge)


def test_requests_apply_in_order_until_hard() -> None:
    assert run([reserve("a"), reserve("b"), reserve("c")], Record()) == ([True, True, False], ["a", "b"], True)


def test_a_retried_uid_replaces_its_entry_instead_of_counting_twice() -> None:
    assert run([reserve("a"), reserve("a")], held(("b", 200.0))) == ([True, True], ["a", "b"], True)


def test_orphans_go_once_expired_and_deleted_claims_at_once() -> None:
    record = held(("old", 99.0), ("deleted", 200.0))
    seen = Seen(deleted={"deleted": 7})
    assert run([reserve("a"), reserve("b")], record, seen=seen) == ([True, True], ["a", "b"], True)
    assert settle(record, seen, now=100.0) == Record({}, 7)
    # Expired while its claim, seen here, still had no charge on it (the leader was away):
    # it goes, and the watermark says this cache holds the claim.
    unrecorded = Seen(claims={"old": 9}, unrecorded=frozenset({"old"}))
    assert settle(held(("old", 99.0)), unrecorded, now=100.0) == Record({}, 9)


def test_a_seen_claim_leaves_the_record_and_raises_the_watermark() -> None:
    # "a" is in the cache at resourceVersion 42 (usage counts it): its entry goes, and
    # claimsThrough says so, for every writer after this one.
    usage = Usage(reserved=GPU, pending_claims=1)
    seen = Seen(claims={"a": 42})
    out = apply(QUOTA, held(("a", 200.0), through=17), [reserve("b")], usage=usage, caches=seen, now=100.0, ttl=TTL)
    assert [d.allowed for d in out.decisions] == [True]
    assert sorted(out.record.held) == ["b"] and out.record.through == 42
    # Never lowered by a writer that saw less.
    assert settle(held(("a", 200.0), through=50), seen, now=100.0).through == 50
    # Seen without the charge it was admitted at recorded on it: kept (the one record of
    # that charge), but counted once, by the cache.
    unrecorded = Seen(claims={"a": 42}, unrecorded=frozenset({"a"}))
    record = held(("a", 200.0), through=17)
    assert settle(record, unrecorded, now=100.0) is record and in_flight(record, unrecorded) == Charge()
    # Unseen, the entry counts: no room for "b".
    assert run([reserve("b")], held(("a", 200.0)), usage=usage) == ([False], ["a"], False)


def test_a_teams_record_carries_the_newest_namespace_its_writers_saw_when_they_changed_it() -> None:
    # namespacesThrough (a ClusterDeviceQuota's): raised by an entry added or dropped,
    # never lowered, absent from a DeviceQuota's record (namespaces None).
    seen = Seen(claims={"a": 42})
    out = apply(QUOTA, held(("a", 200.0)), [reserve("b")], usage=Usage(), caches=seen, now=100.0, ttl=TTL,
                namespaces=30)
    assert out.record.namespaces == 30 and status_fields(out.record)["namespacesThrough"] == "30"
    assert parse_record(status_fields(out.record)).namespaces == 30
    assert settle(held(("a", 200.0)), seen, now=100.0, namespaces=31).namespaces == 31
    assert settle(Record(held(("a", 200.0)).held, 1, 50), seen, now=100.0, namespaces=31).namespaces == 50
    unchanged = held(("b", 200.0))
    assert settle(unchanged, seen, now=100.0, namespaces=31) is unchanged
    denied = apply(QUOTA, Record(), [reserve("c", Charge(999 * GiB, 1))], usage=Usage(), caches=seen, now=100.0,
                   ttl=TTL, namespaces=30)
    assert denied.record.namespaces is None
    plain = apply(QUOTA, Record(), [reserve("b")], usage=Usage(), caches=seen, now=100.0, ttl=TTL)
    assert plain.record.namespaces is None and "namespacesThrough" not in status_fields(plain.record)


def test_a_denied_retry_keeps_the_earlier_entry() -> None:
    bigger = reserve("a", Charge(200 * GiB, 2))
    assert run([bigger], held(("a", 200.0))) == ([False], ["a"], False)


def test_release_audit_and_a_full_record() -> None:
    assert run([Request("release", "a")], held(("a", 200.0), ("b", 200.0))) == ([True], ["b"], True)
    assert run([Request("release", "x")], held(("b", 200.0))) == ([True], ["b"], False)
    # Audit admits (with a warning) and still records the reservation.
    out = apply(AUDIT, held(("a", 200.0), ("b", 200.0)), [reserve("c")], usage=Usage(), caches=Seen(),
                now=100.0, ttl=TTL)
    assert [d.allowed for d in out.decisions] == [True] and "c" in out.record.held and out.decisions[0].warnings
    # The record is bounded: past max_entries nothing more is admitted into it, by name.
    big = parse_device_quota(make_quota("gpus", memory="10Ti"))
    out = apply(big, held(("a", 200.0), ("b", 200.0)), [reserve("c")], usage=Usage(), caches=Seen(), now=100.0,
                ttl=TTL, max_entries=2)
    assert not out.decisions[0].allowed and not out.changed
    assert out.decisions[0].message.startswith('DeviceQuota "gpus" has 2 admissions in flight')


def test_one_namespace_fills_at_most_its_part_of_a_teams_record() -> None:
    # A team's record is shared: one namespace's admissions in flight (a create failing
    # after a mutating admission leaves an orphan the tenant chose) may hold at most
    # `max_per_namespace` entries of it, and its teammates still admit.
    team = parse_cluster_device_quota(make_cluster_quota("ml-team", team="ml", memory="10Ti"))
    record = Record({f"o{i}": Reservation(f"o{i}", f"noisy/c{i}", GPU, 200.0) for i in range(3)})

    def one(quota: DeviceQuota, claim: str, *, max_per_namespace: int = 3) -> Outcome:
        return apply(quota, record, [Request("reserve", "new", claim, GPU)], usage=Usage(), caches=Seen(), now=100.0,
                     ttl=TTL, max_per_namespace=max_per_namespace)

    denied = one(team, "noisy/c9")
    assert not denied.decisions[0].allowed and not denied.changed
    assert denied.decisions[0].message.startswith(
        'ClusterDeviceQuota "ml-team" holds 3 admissions in flight from namespace "noisy"')
    assert one(team, "quiet/c1").decisions[0].allowed
    assert one(team, "noisy/c9", max_per_namespace=4).decisions[0].allowed
    # A retry of a held entry replaces it: it does not count against its own namespace.
    retry = apply(team, record, [Request("reserve", "o0", "noisy/c0", GPU)], usage=Usage(), caches=Seen(), now=100.0,
                  ttl=TTL, max_per_namespace=3)
    assert retry.decisions[0].allowed
    # A namespace's quota is its own record: no bound but the record's.
    assert one(parse_device_quota(make_quota("gpus", namespace="noisy", memory="10Ti")), "noisy/c9").decisions[0].allowed
    # Entries settled or expired leave their namespace's count in the same write.
    expired = apply(team, record, [Request("reserve", "new", "noisy/c9", GPU)], usage=Usage(), caches=Seen(),
                    now=300.0, ttl=TTL, max_per_namespace=3)
    assert expired.decisions[0].allowed and sorted(expired.record.held) == ["new"]
    # Kueue's Workload entries live until the TTL by design: neither counted nor bounded.
    workloads = Record({f"w{i}": Reservation(f"w{i}", f"noisy/job{i}", GPU, 200.0, "Workload") for i in range(3)})
    for request in (Request("reserve", "new", "noisy/c9", GPU), Request("reserve", "w9", "noisy/job9", GPU,
                                                                        source="Workload")):
        out = apply(team, workloads, [request], usage=Usage(), caches=Seen(), now=100.0, ttl=TTL,
                    max_per_namespace=3)
        assert out.decisions[0].allowed, request
    full = Request("reserve", "w9", "noisy/job9", GPU, source="Workload")
    assert apply(team, record, [full], usage=Usage(), caches=Seen(), now=100.0, ttl=TTL,
                 max_per_namespace=3).decisions[0].allowed


def test_workload_entries_follow_the_ttl_and_never_move_the_watermark() -> None:
    w = Reservation("w", "team-a/job", GPU, 200.0, "Workload")
    record = Record({"w": w}, 5)
    # Counted once: by the holding once the ledger has it, else by the entry; kept until
    # it expires or the Workload is gone, whatever the claim cache says.
    assert in_flight(record, Seen()) == GPU and in_flight(record, Seen(workloads=frozenset({"w"}))) == Charge()
    assert settle(record, Seen(claims={"w": 99}, workloads=frozenset({"w"})), now=100.0) is record
    assert settle(record, Seen(finished=frozenset({"w"})), now=100.0) == Record({}, 5)
    assert settle(record, Seen(), now=200.0) == Record({}, 5)


def test_the_status_fields_round_trip_and_leave_reserved_to_the_controller() -> None:
    record = Record({"u1": Reservation("u1", "team-a/c1", GPU, 1_800_000_000.5),
                     "u2": Reservation("u2", "team-a/c2", Charge(10 * GiB, 1), 1_800_000_001.0, "Workload")}, 12345)
    fields = status_fields(record)
    assert set(fields) == {"reservations", "claimsThrough"}  # status.reserved is quota.status.quotastatus's
    assert fields["claimsThrough"] == "12345"
    assert fields["reservations"]["u1"] == {"claim": "team-a/c1", "memory": "80Gi", "devices": 1,
                                            "expires": "2027-01-15T08:00:00.500Z"}
    assert fields["reservations"]["u2"]["source"] == "Workload"
    assert parse_record(fields) == record
    # Records written before 0.2 hold memory in bytes, as an integer.
    old = {**fields, "reservations": {**fields["reservations"], "u1": {**fields["reservations"]["u1"],
                                                                        "memory": 80 * GiB}}}
    assert parse_record(old) == record
    assert parse_record({"reservations": {"bad": {"memory": 1}}, "claimsThrough": "x1"}) == Record()
    assert parse_record(None) == Record()


# -- replicas, any interleaving ------------------------------------------------------------------


@dataclass
class Replica:
    watched: int = 0  # claim events its watch has delivered (the log's first `watched`)
    snapshot: tuple[int, Record] | None = None
    listed: int = 0  # where it (re)started from a list, knowing no history before (0: never)


@dataclass
class World:
    """The API server: the DeviceQuota's record and version, and the claim event log
    (resourceVersion = position + 1), in which every watch sees the same order."""

    version: int = 0
    record: Record = field(default_factory=Record)
    log: list[tuple[str, str]] = field(default_factory=list)  # (ADDED | RECORDED | DELETED, uid)
    charges: dict[str, Charge] = field(default_factory=dict)
    in_flight: list[tuple[str, float, bool]] = field(default_factory=list)  # admitted creates: uid, at, persists
    now: float = 0.0
    replicas: tuple[Replica, ...] = field(default_factory=lambda: (Replica(), Replica(), Replica()))

    def seen(self, replica: Replica) -> Seen:
        claims: dict[str, int] = {}
        deleted: dict[str, int] = {}
        recorded: set[str] = set()
        for position, (kind, uid) in enumerate(self.log[: replica.watched], start=1):
            if kind == "DELETED":
                claims.pop(uid, None)
                deleted[uid] = position
            else:  # ADDED, or RECORDED: the leader wrote the charge annotation (a MODIFIED)
                claims[uid] = position
                if kind == "RECORDED":
                    recorded.add(uid)
        return Seen(claims=claims, deleted=deleted, unrecorded=frozenset(set(claims) - recorded))

    def alive(self) -> list[str]:
        claims: dict[str, None] = {}
        for kind, uid in self.log:
            if kind == "DELETED":
                claims.pop(uid, None)
            else:
                claims[uid] = None
        return list(claims)

    def live(self) -> Charge:
        return sum((self.charges[u] for u in self.alive()), Charge())

    def persist(self, uid: str) -> None:
        self.log.append(("ADDED", uid))


SIZES = (Charge(80 * GiB, 1), Charge(40 * GiB, 1))
HARD = QUOTA
replica = st.integers(0, 2)
action = st.one_of(
    st.tuples(st.just("read"), replica),
    st.tuples(st.just("admit"), replica, st.integers(0, len(SIZES) - 1), st.booleans(), st.booleans()),
    st.tuples(st.just("settle"), replica, st.booleans()),  # the controller's write, or any writer's
    st.tuples(st.just("watch"), replica, st.integers(1, 4)),
    st.tuples(st.just("persist"),),
    st.tuples(st.just("delete"), st.integers(0, 50)),
    st.tuples(st.just("annotate"), st.integers(0, 50)),  # the leader records a claim's charge
    st.tuples(st.just("tick"), st.floats(1.0, 80.0)),
)


def _write(world: World, r: Replica, requests: list[Request], use_stale: bool) -> list[bool]:
    """A writer's turn (kube.statuswriter.QuotaStatusWriter.write_status): decide on the record it read,
    only once its own watch reached the record's watermark; the write lands only if
    nobody wrote since that read."""
    if r.snapshot is None or not use_stale:
        r.snapshot = (world.version, world.record)
    version, record = r.snapshot
    r.snapshot = None
    if record.through is not None and r.watched < record.through:
        return []  # it waits for its watch (here: the write does not happen now)
    seen = world.seen(r)
    usage = Usage(reserved=sum((world.charges[u] for u in seen.claims), Charge()))
    out = apply(HARD, record, requests, usage=usage, caches=seen, now=world.now, ttl=TTL)
    if version != world.version:
        return []  # a conflict: refused, nothing admitted
    if out.changed:
        world.version += 1
        world.record = out.record
    return [d.allowed for d in out.decisions]


def _step(world: World, act: tuple[object, ...], counter: list[int]) -> None:
    kind = act[0]
    if kind == "read":
        r = world.replicas[int(act[1])]  # type: ignore[call-overload]
        r.snapshot = (world.version, world.record)
    elif kind == "watch":
        r = world.replicas[int(act[1])]  # type: ignore[call-overload]
        r.watched = min(len(world.log), r.watched + int(act[2]))  # type: ignore[call-overload]
    elif kind == "persist":
        if world.in_flight:
            uid, _, persists = world.in_flight.pop(0)
            if persists:
                world.persist(uid)
    elif kind == "delete":
        alive = world.alive()
        if alive:
            world.log.append(("DELETED", alive[int(act[1]) % len(alive)]))  # type: ignore[call-overload]
    elif kind == "annotate":
        bare = [u for u in world.alive() if ("RECORDED", u) not in world.log]
        if bare:
            world.log.append(("RECORDED", bare[int(act[1]) % len(bare)]))  # type: ignore[call-overload]
    elif kind == "tick":
        world.now += float(act[1])  # type: ignore[arg-type]
        # The protocol's assumption: a create ends, and every watch delivers its claim,
        # within the TTL of its admission.
        due = [c for c in world.in_flight if c[1] + TTL <= world.now]
        world.in_flight = [c for c in world.in_flight if c[1] + TTL > world.now]
        for uid, _, persists in due:
            if persists:
                world.persist(uid)
        for r in world.replicas:
            r.watched = len(world.log)
    elif kind == "settle":
        _write(world, world.replicas[int(act[1])], [], bool(act[2]))  # type: ignore[call-overload]
    else:
        _, who, size, persisting, use_stale = act
        counter[0] += 1
        uid = f"u{counter[0]}"
        world.charges[uid] = SIZES[int(size)]  # type: ignore[call-overload]
        writer = world.replicas[int(who)]  # type: ignore[call-overload]
        if _write(world, writer, [reserve(uid, world.charges[uid])], bool(use_stale)) == [True]:
            world.in_flight.append((uid, world.now, bool(persisting)))


@settings(max_examples=800, deadline=None)
@given(st.lists(action, min_size=8, max_size=60))
# Why the watermark: replica 0 sees u1 and drops its entry; replica 1, whose watch has not
# delivered u1, must not decide before it has (else it counts u1 nowhere).
@example([("admit", 0, 0, True, False), ("persist",), ("annotate", 0), ("watch", 0, 2), ("settle", 0, False),
          ("admit", 1, 0, True, False), ("admit", 1, 0, True, False)])
def test_no_interleaving_of_replicas_over_commits(actions: list[tuple[object, ...]]) -> None:
    world, counter = World(), [0]
    for act in actions:
        _step(world, act, counter)
        admitted = world.live() + sum((world.charges[u] for u, _, p in world.in_flight if p), Charge())
        assert admitted.memory <= (HARD.hard.memory or 0), (act, world)


@settings(max_examples=300, deadline=None)
@given(st.lists(action, min_size=8, max_size=60))
def test_the_record_holds_only_admissions_in_flight(actions: list[tuple[object, ...]]) -> None:
    """Once every claim carries its charge, every watch caught up and any writer wrote, no
    entry of a created claim is left."""
    world, counter = World(), [0]
    for act in actions:
        _step(world, act, counter)
    for uid in world.alive():
        if ("RECORDED", uid) not in world.log:
            world.log.append(("RECORDED", uid))
    for r in world.replicas:
        r.watched = len(world.log)
    _write(world, world.replicas[0], [], False)
    created = {uid for _, uid in world.log}
    assert not set(world.record.held) & created


def attempt(uid: str, series: str = "team-a/train-extended-resources-") -> Request:
    """A reserve by the scheduler for a Pod's extended resources: one attempt of `series`."""
    return Request("reserve", uid, f"{series}{uid[-5:]:0>5}", GPU, series)


def test_an_attempt_replaces_the_unseen_entries_of_earlier_attempts_of_its_series() -> None:
    series = "team-a/train-extended-resources-"
    earlier = Record({uid: Reservation(uid, f"{series}{uid}", GPU, 200.0) for uid in ("aaaaa", "bbbbb")})
    # Two attempts the in-tree ResourceQuota refused after us: the quota would be full.
    assert run([reserve("x")], earlier) == ([False], ["aaaaa", "bbbbb"], False)
    assert run([attempt("ccccc")], earlier) == ([True], ["ccccc"], True)
    # One whose claim is seen exists: its entry goes by the watermark, and it counts once,
    # by the cache.
    usage = Usage(reserved=GPU, pending_claims=1)
    assert run([attempt("ccccc")], earlier, seen=Seen(claims={"aaaaa": 3}), usage=usage) == ([True], ["ccccc"], True)


def test_an_attempt_leaves_other_series_and_other_claims_alone() -> None:
    current = Record({
        # Another Pod whose name starts the same: a longer generated name.
        "other": Reservation("other", "team-a/train-extended-resources-x-extended-resources-abcde", GPU, 200.0),
        "plain": Reservation("plain", "team-a/train-extended-resources-abcd", GPU, 200.0),  # not 5 random
        "elsewhere": Reservation("elsewhere", "team-b/train-extended-resources-abcde", GPU, 200.0),
    })
    big = parse_device_quota(make_quota("gpus", memory="400Gi"))
    assert run([attempt("ccccc")], current, quota=big) == ([True], ["ccccc", "elsewhere", "other", "plain"], True)
    # A reserve without a series drops nothing.
    assert run([reserve("z")], current, quota=big)[1] == ["elsewhere", "other", "plain", "z"]


# -- leases (quota.accounting.headroom): any interleaving of three replicas, each holding one -----------------

LEASED = parse_device_quota(make_quota("gpus", memory="1280Gi"))
ONE = SpecVersion()  # the quota's one object and generation: no spec changes here (tests/unit/quota/accounting/test_headroom.py)
SIZING = Sizing(period=30.0, share=0.5, keep_free=0.25)


@dataclass
class Holder(Replica):
    """A replica that leases: its book, and the write it has built and not landed yet."""

    lease: Lease | None = None
    process: int = 0  # a restart is a new process: a new holder, a new key
    pending: tuple[int, Outcome, Plan, str] | None = None  # version read, outcome, plan, uid reserved

    @property
    def key(self) -> str:
        return f"{LEASE_PREFIX}{id(self)}-{self.process}"


def _build(world: World, r: Holder, uid: str, use_stale: bool, sizing: Sizing) -> None:
    """Build a write (kube.statuswriter.QuotaStatusWriter._decide): settle the lease, decide `uid`'s exact
    reservation (none: ""), size the lease again; it lands at a later step, or conflicts."""
    if r.pending is not None:
        return  # one write of a quota at a time in a process
    if r.snapshot is None or not use_stale:
        r.snapshot = (world.version, world.record)
    version, record = r.snapshot
    r.snapshot = None
    if record.through is not None and r.watched < record.through:
        return  # it waits for its watch
    seen = world.seen(r)
    usage = Usage(reserved=sum((world.charges[u] for u in seen.claims), Charge()))
    requests = [reserve(uid, world.charges[uid])] if uid else []
    outcome, plan = renew(r.lease, key=r.key, holder=r.key, quota=LEASED, record=record, requests=requests,
                          usage=usage, caches=seen, now=world.now, ttl=TTL, sizing=sizing, version=ONE)
    r.pending = (version, outcome, plan, uid)
    r.lease = writing(r.lease, plan)


def _land(world: World, r: Holder) -> None:
    if r.pending is None:
        return
    version, outcome, plan, uid = r.pending
    r.pending = None
    if version != world.version:  # a conflict: nothing written, nothing admitted
        r.lease = None if r.lease is None else replace(r.lease, limit=None)
        return
    if outcome.changed:
        world.version += 1
        world.record = outcome.record
    r.lease = landed(r.lease, plan)
    if uid and outcome.decisions[0].allowed:
        world.in_flight.append((uid, world.now, True))


lease_action = st.one_of(
    st.tuples(st.just("read"), replica),
    # The last flag: the write lands at once (else at a later "land", local admissions between).
    st.tuples(st.just("exact"), replica, st.integers(0, len(SIZES) - 1), st.booleans(), st.booleans()),
    st.tuples(st.just("local"), replica, st.integers(0, len(SIZES) - 1), st.booleans()),
    *[st.tuples(st.just("local"), replica, st.integers(0, len(SIZES) - 1), st.just(True))] * 4,
    st.tuples(st.just("exact"), replica, st.integers(0, len(SIZES) - 1), st.just(False), st.just(True)),
    st.tuples(st.just("renew"), replica, st.booleans(), st.booleans()),  # its timer's write, or any write
    st.tuples(st.just("land"), replica),
    st.tuples(st.just("crash"), replica, st.booleans()),  # SIGKILL: its write in flight lands, or not
    *[st.tuples(st.just("sync"), replica)] * 2,
    st.tuples(st.just("watch"), replica, st.integers(1, 4)),
    st.tuples(st.just("persist"),),
    st.tuples(st.just("delete"), st.integers(0, 50)),
    st.tuples(st.just("annotate"), st.integers(0, 50)),
    st.tuples(st.just("tick"), st.floats(1.0, 80.0)),
    # Every create in flight lands, the leader records every charge, one replica's watch
    # catches up: the common state in which a holder settles its lease.
    st.tuples(st.just("sync"), replica),
)


def _lease_step(world: World, act: tuple[object, ...], counter: list[int], sizing: Sizing) -> None:
    kind = act[0]
    acts_on = kind in ("read", "exact", "local", "renew", "land", "crash", "watch", "sync")
    r = world.replicas[int(act[1])] if acts_on else None  # type: ignore[call-overload]
    assert r is None or isinstance(r, Holder)
    if kind in ("exact", "local"):
        assert r is not None
        counter[0] += 1
        uid = f"u{counter[0]}"
        world.charges[uid] = SIZES[int(act[2])]  # type: ignore[call-overload]
        if kind == "exact":
            _build(world, r, uid, bool(act[3]), sizing)
            if act[4]:
                _land(world, r)
        elif (taken := take(r.lease, LEASED, uid, world.charges[uid], world.now, seen=ONE)) is not None:
            r.lease = taken
            # A claim admitted under the lease may also be refused later (another quota, a
            # later plugin): it is then never created, an orphan in the book.
            world.in_flight.append((uid, world.now, bool(act[3])))
    elif kind == "renew":
        assert r is not None
        _build(world, r, "", bool(act[2]), sizing)
        if act[3]:
            _land(world, r)
    elif kind == "land":
        assert r is not None
        _land(world, r)
    elif kind == "sync":
        assert r is not None
        for _ in range(len(world.in_flight)):
            _step(world, ("persist",), counter)
        world.log.extend(("RECORDED", u) for u in world.alive() if ("RECORDED", u) not in world.log)
        r.watched = len(world.log)
    elif kind == "crash":
        assert r is not None
        if act[2]:
            _land(world, r)
        r.pending, r.lease, r.snapshot, r.process = None, None, None, r.process + 1
    else:
        _step(world, act, counter)


def _committed(world: World) -> Charge:
    return world.live() + sum((world.charges[u] for u, _, p in world.in_flight if p), Charge())


@settings(max_examples=1500, deadline=None)
@given(st.lists(lease_action, min_size=8, max_size=80))
# Hard is 16 GPUs of 80Gi; replica 0's first write grants it a lease of 7.5 GPUs.
# Settling moves the watermark: replica 0 settles its lease's seven claims (u2-u8) and
# drops the lease; replica 1, whose watch has delivered u1 but not them, must wait until it
# has before deciding, or it counts them nowhere and admits 15 more.
@example([("exact", 0, 0, False, True), ("persist",), ("annotate", 0)] + [("local", 0, 0, True)] * 7
         + [("sync", 0), ("renew", 0, False, True), ("watch", 1, 2)] + [("exact", 1, 0, False, True)] * 15)
# A shrink in flight bounds local admissions: replica 0's idle lease is being released
# when seven claims arrive; admitted against the old amount, they would be counted by no
# lease once the release lands.
@example([("exact", 0, 0, False, True), ("renew", 0, False, False)] + [("local", 0, 0, True)] * 7
         + [("land", 0)] + [("exact", 1, 0, False, True)] * 15)
# Every other writer counts the whole lease: it cannot know what was admitted under it.
@example([("exact", 0, 0, False, True)] + [("exact", 1, 0, False, True)] * 15 + [("local", 0, 0, True)] * 7)
# The holder admits no more than the amount: replica 1 fills what the lease leaves.
@example([("exact", 0, 0, False, True)] + [("exact", 1, 0, False, True)] * 15 + [("local", 0, 0, True)] * 9)
# A lease admits only until its window ends: past its expiry every other writer dropped it.
@example([("exact", 0, 0, False, True), ("tick", 80.0), ("tick", 80.0)] + [("exact", 1, 0, False, True)] * 15
         + [("local", 0, 0, True)])
def test_no_interleaving_of_replicas_holding_leases_over_commits(actions: list[tuple[object, ...]]) -> None:
    world, counter = World(replicas=(Holder(), Holder(), Holder())), [0]
    for act in actions:
        _lease_step(world, act, counter, SIZING)
        assert _committed(world).memory <= (LEASED.hard.memory or 0), (act, world)


def test_what_a_lease_admitted_is_kept_as_claims_come_go_and_settle() -> None:
    """`take` reads the running total beside `admitted` (not a sum on every create)."""
    lease = Lease("lease.a.0", "a", LEASED, Charge(240 * GiB, 3), until=100.0, expires=300.0)
    for uid in ("a", "b", "c"):
        taken = take(lease, LEASED, uid, GPU, 10.0, seen=ONE)
        assert taken is not None
        lease = taken
    assert lease.consumed() == Charge(240 * GiB, 3) and take(lease, LEASED, "d", GPU, 10.0, seen=ONE) is None
    assert take(lease, LEASED, "c", GPU, 10.0, seen=ONE) is not None  # the same claim again: no more room taken
    lease = untake(lease, "b")
    assert lease.consumed() == Charge(160 * GiB, 2) and lease.consumed(without="a") == GPU
    taken = take(lease, LEASED, "d", GPU, 10.0, seen=ONE)
    assert taken is not None and take(taken, LEASED, "e", GPU, 10.0, seen=ONE) is None
    # A write settles "a": what is left is counted afresh from what stays.
    plan = Plan(replace(taken, admitted={}, total=Charge()), frozenset({"a"}), Charge(240 * GiB, 3))
    after = landed(taken, plan)
    assert after is not None and set(after.admitted) == {"c", "d"} and after.consumed() == Charge(160 * GiB, 2)


def test_a_denial_only_an_open_lease_of_another_replica_causes_is_one_to_retry() -> None:
    # 16 GPUs: 10 claims seen here, 5 GPUs in replica B's lease (some of it may be those claims).
    seen = Seen(claims={f"c{i}": i + 1 for i in range(10)})
    usage = Usage(reserved=Charge(800 * GiB, 10))

    def decide(expires: float) -> str:
        lease = Reservation("lease.b.0", "b", Charge(400 * GiB, 0), expires, "Lease")
        outcome, _ = renew(None, key="lease.a.0", holder="a", quota=LEASED, record=Record({"lease.b.0": lease}),
                           requests=[reserve("x", Charge(160 * GiB, 2))], usage=usage, caches=seen, now=100.0,
                           ttl=TTL, sizing=SIZING, version=ONE)
        assert not outcome.decisions[0].allowed and "lease.b.0" in outcome.record.held
        return outcome.decisions[0].message

    # Its window open (written at 95, 30 s): B renews or releases it within a fifth of a period.
    assert decide(95.0 + 30.0 + TTL).startswith('DeviceQuota "gpus" is full counting the leases other replicas hold')
    # Past its renewal point (B was SIGKILLed, or shrank it near hard): it holds room like any entry.
    assert decide(60.0 + 30.0 + TTL).startswith('exceeded DeviceQuota "gpus"')


def test_a_lease_never_takes_the_record_past_its_bound() -> None:
    # The CRD's maxProperties: a write with one entry more is refused whole (422), and
    # with it every admission and every settling this holder's writes carry.
    big = parse_device_quota(make_quota("gpus", memory="8000Gi"))
    record = Record({u: Reservation(u, f"team-a/{u}", GPU, 500.0) for u in ("a", "b")})
    outcome, plan = renew(None, key="lease.a.0", holder="a", quota=big, record=record, requests=[reserve("x")],
                          usage=Usage(), caches=Seen(), now=100.0, ttl=TTL, sizing=SIZING, version=ONE,
                          max_entries=3)
    assert outcome.decisions[0].allowed and len(outcome.record.held) <= 3, sorted(outcome.record.held)
    assert plan.lease is None


_UIDS = st.sampled_from(["u1", "u2", "u3", "u4", allocation_key("c1", 5), allocation_key("c1", 7), allocation_key("c2", 3)])
_CLAIMS = st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["p-abcde", "p-fghij", "x", "p"]))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_UIDS, _CLAIMS, max_size=5),
       st.lists(st.tuples(st.sampled_from(["reserve", "release"]), _UIDS, _CLAIMS, st.booleans()), max_size=8),
       st.integers(1, 3))
def test_a_batch_counts_each_namespaces_entries_as_one_write_a_request_would(
        entries: dict[str, tuple[str, str]], steps: list[tuple[Any, str, tuple[str, str], bool]], bound: int) -> None:
    # `apply` keeps each namespace's count as it goes (stale series and
    # allocation entries dropped, a previous entry put back after a refusal): a batch
    # decides what the same requests applied one write each would.
    team = parse_cluster_device_quota(make_cluster_quota("ml-team", team="ml", memory="10Ti"))
    record = Record({u: Reservation(u, f"{n}/{c}", GPU, 200.0) for u, (n, c) in entries.items()})
    requests = [Request(op, uid, f"{n}/{c}", GPU, f"{n}/p-" if series else "") for op, uid, (n, c), series in steps]
    kw: dict[str, Any] = {"usage": Usage(), "caches": Seen(), "now": 100.0, "ttl": TTL, "max_per_namespace": bound}
    batch = apply(team, record, requests, **kw)
    one_by_one = []
    for request in requests:
        out = apply(team, record, [request], **kw)
        record = out.record
        one_by_one.append(out.decisions[0].allowed)
    assert [d.allowed for d in batch.decisions] == one_by_one and batch.record.held == record.held
