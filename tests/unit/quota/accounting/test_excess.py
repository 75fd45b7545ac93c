"""quota.accounting.excess: an allocation's excess in the persisted record, and no interleaving of
replicas deciding allocations over-commits."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st

from quota.accounting.excess import allocation_key, excess_settled, parse_allocation_key, supersedes
from quota.accounting.reservationrecord import Record, Reservation, parse_record, status_fields
from quota.accounting.reservations import Outcome, Request, Undo, apply, in_flight, settle
from quota.quotas.devicequota import Usage, parse_device_quota
from quota.values.model import Charge

from ...builders import GiB, make_quota
from .test_reservations import TTL, Replica, Seen

UID = "3c1f5e2a-9b7d-4e61-8f0a-5d2c6b4e7a10"
KEY = allocation_key(UID, 40)  # reviewed on the claim's copy at resourceVersion 40
EXCESS = Charge(61 * GiB, 0)  # an h200 (141Gi) where an h100 (80Gi) was reserved
QUOTA = parse_device_quota(make_quota("gpus", memory="400Gi"))


def entry(key: str = KEY, charge: Charge = EXCESS, expires: float = 200.0) -> Reservation:
    return Reservation(key, "team-a/train", charge, expires)


def test_the_key_names_the_claim_and_the_copy_it_was_reviewed_on() -> None:
    assert KEY == f"allocation.{UID}.40" and parse_allocation_key(KEY) == (UID, 40)
    for other in (UID, "lease.dra-quota-x.0", "allocation.", "allocation.u.", "allocation.u.x1", "allocation.4"):
        assert parse_allocation_key(other) is None
    # As the status writes it: a plain claim entry (no `source`, no CRD change).
    record = Record({KEY: entry()}, 7)
    assert "source" not in status_fields(record)["reservations"][KEY] and parse_record(status_fields(record)) == record


def test_the_entry_stays_while_the_cache_holds_the_older_unallocated_copy() -> None:
    record = Record({KEY: entry()}, 30)
    for version in (12, 40):  # the copy the review saw, or older
        seen = Seen(claims={UID: version})
        assert settle(record, seen, now=100.0) is record
        assert in_flight(record, seen) == EXCESS  # the cache counts the reservation, not the excess
    assert in_flight(record, Seen()) == EXCESS
    assert excess_settled(40, version=40, gone=None, expired=False) == (False, None)


def test_it_goes_on_the_allocated_copy_or_the_deletion_raising_the_watermark() -> None:
    record = Record({KEY: entry()}, 30)
    allocated = Seen(claims={UID: 41})
    assert settle(record, allocated, now=100.0) == Record({}, 41)
    assert in_flight(record, allocated) == Charge()  # counted by the cache now, exactly
    assert settle(record, Seen(deleted={UID: 45}), now=100.0) == Record({}, 45)
    # Never lowered by what one cache saw.
    assert settle(Record({KEY: entry()}, 90), allocated, now=100.0) == Record({}, 90)


def test_an_orphan_goes_after_the_ttl_without_moving_the_watermark() -> None:
    # The scheduler's write failed after us: the claim stays at the reviewed copy.
    record = Record({KEY: entry(expires=150.0)}, 30)
    seen = Seen(claims={UID: 40})
    assert settle(record, seen, now=149.0) is record
    assert settle(record, seen, now=150.0) == Record({}, 30)
    assert settle(record, Seen(), now=150.0) == Record({}, 30)


def test_it_counts_against_hard_until_then() -> None:
    usage = Usage(reserved=Charge(320 * GiB, 4))  # four claims reserved at 80Gi
    out = apply(QUOTA, Record({KEY: entry()}), [Request("reserve", allocation_key("other", 9), "team-a/o", EXCESS)],
                usage=usage, caches=Seen(claims={UID: 40}), now=100.0, ttl=TTL)
    assert not out.decisions[0].allowed and "reserved memory=381Gi" in out.decisions[0].message


def test_a_newer_attempt_supersedes_older_ones_and_a_retry_holds_the_larger_excess() -> None:
    newer = allocation_key(UID, 52)
    assert supersedes(newer, KEY) and not supersedes(KEY, newer) and not supersedes(newer, newer)
    assert not supersedes(allocation_key("other", 99), KEY) and not supersedes(newer, UID)
    record = Record({KEY: entry(), UID: entry(UID, Charge(80 * GiB, 1)), "lease.x.0": entry("lease.x.0")})
    out = apply(QUOTA, record, [Request("reserve", newer, "team-a/train", EXCESS)], usage=Usage(), caches=Seen(),
                now=100.0, ttl=TTL)
    assert sorted(out.record.held) == sorted([newer, UID, "lease.x.0"])  # the claim's own entry stays
    # The same copy reviewed twice (a retried call, or two allocators racing: one write
    # lands): the entry covers either.
    small = Charge(20 * GiB, 1)
    out = apply(QUOTA, out.record, [Request("reserve", newer, "team-a/train", small)], usage=Usage(), caches=Seen(),
                now=100.0, ttl=TTL)
    assert out.record.held[newer].charge == Charge(61 * GiB, 1)


def test_a_release_takes_back_only_its_own_reserve_while_the_entry_is_as_it_left_it() -> None:
    """Two attempts on one copy, the same excess at the same clock: each release restores
    what the key held before its reserve if nothing rewrote the entry since, as the
    status stores it; else it leaves the entry (another attempt's, covering its own)."""
    def run(record: Record, request: Request, seen: Seen = Seen()) -> Outcome:
        return apply(QUOTA, record, [request], usage=Usage(), caches=seen, now=100.0, ttl=TTL)

    first = run(Record(), Request("reserve", KEY, "team-a/train", EXCESS))
    second = run(first.record, Request("reserve", KEY, "team-a/train", EXCESS))
    earlier, later = first.undos[0], second.undos[0]
    assert earlier == Undo(first.record.held[KEY], None) and later == Undo(second.record.held[KEY], earlier.wrote)
    assert status_fields(first.record) != status_fields(second.record)  # a later expiry, to the millisecond
    assert run(second.record, Request("release", KEY, undo=earlier)).record == second.record  # rewritten since
    stored = parse_record(status_fields(second.record))
    back = run(stored, Request("release", KEY, undo=later))
    assert status_fields(back.record) == status_fields(first.record) and back.changed
    assert run(back.record, Request("release", KEY, undo=earlier)).record == Record()
    # Without an undo (what a reserve that was not allowed gives) nothing is taken back.
    assert run(stored, Request("release", KEY)).record == stored
    # Superseded by a newer copy's attempt, or settled: nothing to restore, none resurrected.
    newer = run(second.record, Request("reserve", allocation_key(UID, 52), "team-a/train", EXCESS)).record
    assert run(newer, Request("release", KEY, undo=later)).record == newer
    assert run(second.record, Request("release", KEY, undo=later), Seen(claims={UID: 41})).record == Record({}, 41)


# -- replicas deciding allocations, any interleaving -------------------------------------------

# What each claim reserved: above some allocations (the room they free may go to another
# claim's excess), below others (an Optimistic price).
ESTIMATE = Charge(100 * GiB, 1)
EXACTS = (Charge(141 * GiB, 1), Charge(100 * GiB, 1), Charge(80 * GiB, 1))
CLAIMS = 4
HARD = parse_device_quota(make_quota("gpus", memory=f"{CLAIMS * 100 + 50}Gi"))  # room for one 41Gi excess


@dataclass
class Cluster:
    """The API server: the quota's record and version, and the claims' event log
    (resourceVersion = position + 1; every watch sees the same order)."""

    version: int = 0
    record: Record = field(default_factory=Record)
    # (uid, exact charge, or None: unallocated; "deleted" for a deletion)
    log: list[tuple[str, Charge | None | str]] = field(default_factory=list)
    writes: list[tuple[str, int, Charge, float]] = field(default_factory=list)  # allowed, not landed: uid, before, exact, at
    # Attempts allowed here and refused by another of the claim's quotas: their rollbacks to come.
    undos: list[tuple[str, Undo | None]] = field(default_factory=list)
    now: float = 0.0
    replicas: tuple[Replica, ...] = field(default_factory=lambda: tuple(Replica(watched=CLAIMS) for _ in range(3)))

    def __post_init__(self) -> None:
        self.log = [(f"c{i}", None) for i in range(CLAIMS)]

    def state(self, upto: int | None = None) -> dict[str, tuple[int, Charge | None | str]]:
        """uid -> (resourceVersion of its last event, what it holds), after `upto` events."""
        out: dict[str, tuple[int, Charge | None | str]] = {}
        for position, (uid, what) in enumerate(self.log[:upto], start=1):
            out[uid] = (position, what)
        return out

    def holds(self, upto: int | None = None, *, listed: int = 0) -> dict[str, Charge]:
        """What each claim counts after `upto` events (`kube.claimstore.ClaimStore`): its
        allocation; deallocated, its last one (`Counting.deallocated_entry`); else its
        reservation. `listed`: a replica (re)started with a list at that position, which
        knows no earlier history: each claim the list shows unallocated counts its
        reservation (no allocation record: the leader never wrote it)."""
        out: dict[str, Charge] = {}
        for position, (uid, what) in enumerate(self.log[:upto], start=1):
            if isinstance(what, Charge):
                out[uid] = what
            elif what is None:
                out.setdefault(uid, ESTIMATE)
            if position == listed:
                state = self.state(listed)
                out = {u: (w if isinstance(w, Charge) else ESTIMATE) for u, (_, w) in state.items() if w != "deleted"}
        return out

    def unvouched(self, r: Replica) -> set[str]:
        """The claims whose history replica `r` cannot vouch for (`ClaimStore.history_known`):
        unallocated in the list it started from, and not seen allocated since."""
        if not r.listed:
            return set()
        out = {u for u, (_, w) in self.state(r.listed).items() if w is None}
        for uid, what in self.log[r.listed:r.watched]:
            if isinstance(what, Charge):
                out.discard(uid)
        return out

    def seen(self, r: Replica) -> tuple[Seen, Usage, dict[str, Charge], set[str]]:
        """A replica's caches, its ledger's usage, what its ledger holds per claim, and
        which claims its ledger holds allocated."""
        state = self.state(r.watched)
        alive = {u: (v, w) for u, (v, w) in state.items() if w != "deleted"}
        deleted = {u: v for u, (v, w) in state.items() if w == "deleted"}
        holds = self.holds(r.watched, listed=r.listed)
        held = {u: holds[u] for u in alive}
        allocated = {u for u, (_, w) in alive.items() if isinstance(w, Charge)}
        used = sum((c for u, c in held.items() if u in allocated), Charge())
        reserved = sum((c for u, c in held.items() if u not in allocated), Charge())
        return (Seen(claims={u: v for u, (v, _) in alive.items()}, deleted=deleted), Usage(used, reserved), held,
                allocated)

    def committed(self) -> Charge:
        """What the claims take once every allowed write in flight lands (at most one per
        claim and copy: the one of the largest charge)."""
        total = Charge()
        holds = self.holds()
        for uid, (version, what) in self.state().items():
            if what == "deleted":
                continue
            charge = holds[uid]
            for w_uid, before, exact, _ in self.writes:
                if w_uid == uid and before == version and what is None:
                    charge = charge.max(exact)
            total = total + charge
        return total


def _decide(world: Cluster, r: Replica, requests: list[Request], use_stale: bool) -> Outcome | None:
    """A writer's turn (kube.statuswriter): wait for its watch to reach the watermark,
    decide on what it read, write only if nobody wrote since (None: it did not)."""
    if r.snapshot is None or not use_stale:
        r.snapshot = (world.version, world.record)
    version, record = r.snapshot
    r.snapshot = None
    if record.through is not None and r.watched < record.through:
        return None
    seen, usage, _, _ = world.seen(r)
    out = apply(HARD, record, requests, usage=usage, caches=seen, now=world.now, ttl=TTL)
    if version != world.version:
        return None
    if out.changed:
        world.version += 1
        world.record = out.record
    return out


def _step(world: Cluster, act: tuple[object, ...]) -> None:
    kind = act[0]
    if kind in ("allocate", "refuse"):  # "refuse": allowed here, refused by another of the claim's quotas
        _, who, which, size, use_stale = act
        r = world.replicas[int(who)]  # type: ignore[call-overload]
        uid = f"c{int(which) % CLAIMS}"  # type: ignore[call-overload]
        before, what = world.state()[uid]
        if what is not None:
            return  # allocated, or gone: not a review we decide
        exact = EXACTS[int(size)]  # type: ignore[call-overload]
        _, _, held, allocated = world.seen(r)
        # Over the smaller of what the reviewed (unallocated) copy holds on any replica
        # (`Admitter._reserved`: its reservation where this ledger still holds an
        # allocation) and what this replica's ledger holds (`Admitter.excess_to_persist`);
        # whole, beside the rest of the quota, where it cannot vouch for the claim's history.
        copy = ESTIMATE if uid in allocated else held.get(uid, Charge())
        whole = uid in world.unvouched(r)
        excess = exact if whole else (exact - held.get(uid, Charge()).min(copy)).max(Charge())
        key = allocation_key(uid, before)
        own = held.get(uid, Charge())
        credit = ((own, Charge()) if uid in allocated else (Charge(), own)) if whole else (Charge(), Charge())
        request = Request("reserve", key, uid, excess, own=uid if whole else "", credit=credit)
        out = None if excess.memory <= 0 else _decide(world, r, [request], bool(use_stale))
        if out is not None and out.decisions[0].allowed and kind == "refuse":
            world.undos.append((key, out.undos[0]))  # the all-or-nothing rollback, to come
        elif kind == "allocate" and (excess.memory <= 0 or (out is not None and out.decisions[0].allowed)):
            world.writes.append((uid, before, exact, world.now))  # within the reservation: no write
    elif kind == "undo" and world.undos:  # a rollback: on a conflict it reads again
        _, who, which, use_stale = act
        key, undo = world.undos[int(which) % len(world.undos)]  # type: ignore[call-overload]
        if _decide(world, world.replicas[int(who)], [Request("release", key, undo=undo)],  # type: ignore[call-overload]
                   bool(use_stale)) is not None:
            world.undos.remove((key, undo))
    elif kind == "land" and world.writes:
        uid, before, exact, _ = world.writes.pop(int(act[1]) % len(world.writes))  # type: ignore[call-overload]
        if world.state()[uid][0] == before:  # etcd's compare: the claim did not move
            world.log.append((uid, exact))
    elif kind == "fail" and world.writes:  # a later admission step refused the scheduler's write
        world.writes.pop(int(act[1]) % len(world.writes))  # type: ignore[call-overload]
    elif kind in ("touch", "free", "delete"):  # the leader's annotation; deallocation; deletion
        uid = f"c{int(act[1]) % CLAIMS}"  # type: ignore[call-overload]
        version, what = world.state()[uid]
        if what != "deleted" and (kind != "free" or isinstance(what, Charge)):
            world.log.append((uid, "deleted" if kind == "delete" else None if kind == "free" else what))
    elif kind == "restart":  # a list at the log's end, no history before it
        r = world.replicas[int(act[1])]  # type: ignore[call-overload]
        r.watched = r.listed = len(world.log)
        r.snapshot = None
    elif kind == "watch":
        r = world.replicas[int(act[1])]  # type: ignore[call-overload]
        r.watched = min(len(world.log), r.watched + int(act[2]))  # type: ignore[call-overload]
    elif kind == "read":
        r = world.replicas[int(act[1])]  # type: ignore[call-overload]
        r.snapshot = (world.version, world.record)
    elif kind == "settle":
        _decide(world, world.replicas[int(act[1])], [], bool(act[2]))  # type: ignore[call-overload]
    elif kind == "tick":
        world.now += float(act[1])  # type: ignore[arg-type]
        # The protocol's assumption: a write ends, and every watch delivers it, within the TTL.
        for w in [w for w in world.writes if w[3] + TTL <= world.now]:
            world.writes.remove(w)
            if world.state()[w[0]][0] == w[1]:
                world.log.append((w[0], w[2]))
        for r in world.replicas:
            r.watched = len(world.log)


replica = st.integers(0, 2)
action = st.one_of(
    st.tuples(st.sampled_from(["allocate", "refuse"]), replica, st.integers(0, CLAIMS - 1),
              st.integers(0, len(EXACTS) - 1), st.booleans()),
    st.tuples(st.just("undo"), replica, st.integers(0, 9), st.booleans()),
    st.tuples(st.just("land"), st.integers(0, 9)),
    st.tuples(st.just("fail"), st.integers(0, 9)),
    st.tuples(st.sampled_from(["touch", "free", "delete"]), st.integers(0, CLAIMS - 1)),
    st.tuples(st.just("watch"), replica, st.integers(1, 4)),
    st.tuples(st.just("restart"), replica),
    st.tuples(st.just("read"), replica),
    st.tuples(st.just("settle"), replica, st.booleans()),
    st.tuples(st.just("tick"), st.floats(1.0, 80.0)),
)


@settings(max_examples=1000, deadline=None)
@given(st.lists(action, min_size=6, max_size=50))
# Two replicas, one excess each (41Gi, 41Gi) into room for one: the second decides on the
# record the first wrote and counts its entry.
@example([("allocate", 0, 0, 0, False), ("allocate", 1, 1, 0, False), ("land", 0), ("land", 0)])
# Replica 0 sees c0's allocation land and drops its entry, raising the watermark; replica 1,
# whose watch has not delivered it, waits for it rather than count c0's excess nowhere.
@example([("allocate", 0, 0, 0, False), ("land", 0), ("watch", 0, 1), ("settle", 0, False),
          ("allocate", 1, 1, 0, False), ("land", 0)])
# The leader annotates c0 before the scheduler's write: the cache holds a copy newer than the
# review's, the write fails (the claim moved), the entry goes with nothing allocated.
@example([("allocate", 0, 0, 0, False), ("touch", 0), ("watch", 0, 1), ("settle", 0, False), ("land", 0),
          ("allocate", 1, 1, 0, False), ("land", 0)])
# Two allocations of c0 reviewed on one copy (141Gi, then 100Gi: one of the two writes
# lands): its entry keeps 41Gi, so c1's 41Gi does not fit.
@example([("allocate", 0, 0, 0, False), ("allocate", 1, 0, 1, False), ("allocate", 0, 1, 0, False)])
# c0 took an h200, landed, was deallocated; replica 1's watch brought that, replica 0's not.
# Replica 0 reviews c0's reallocation of an h200 on the deallocated copy: its excess is over
# what that copy holds (100Gi) on a replica that never saw the allocation, not over the
# allocation its ledger still holds (0).
@example([("allocate", 0, 0, 0, False), ("land", 0), ("tick", 1.0), ("free", 0), ("watch", 1, 1),
          ("allocate", 0, 0, 0, False), ("allocate", 1, 1, 0, False), ("land", 0), ("land", 0)])
# c0 and c1 take 80Gi each (20Gi under their reservations), and that room goes to c2's and
# c3's 41Gi excesses; c0 and c1 are deallocated. Counted at their reservations again they
# would put 482Gi on a hard of 450Gi, and their reallocations "within" them would make it
# real; counted at their last allocations, a reallocation of c0 at 141Gi is an excess of
# 61Gi, refused.
@example([("allocate", 0, 0, 2, False), ("land", 0), ("allocate", 0, 1, 2, False), ("land", 0), ("watch", 0, 4),
          ("allocate", 0, 2, 0, False), ("land", 0), ("watch", 0, 4), ("allocate", 0, 3, 0, False), ("land", 0),
          ("watch", 0, 4), ("free", 0), ("free", 1), ("watch", 0, 4), ("allocate", 0, 0, 0, False), ("land", 0)])
# Two attempts at c0 on one copy: the first allowed, the second refused by another quota.
# Its rollback takes back only its own reserve: c1's 41Gi still does not fit.
@example([("allocate", 0, 0, 0, False), ("refuse", 1, 0, 0, False), ("undo", 1, 0, False),
          ("allocate", 0, 1, 0, False), ("land", 0), ("land", 0)])
# The refused attempt reserved first; the allowed one rewrote the entry over it: the
# rollback leaves the entry (restoring "nothing", what it found, would drop c0's 41Gi).
@example([("refuse", 1, 0, 0, False), ("allocate", 0, 0, 0, False), ("undo", 1, 0, False),
          ("allocate", 0, 1, 0, False), ("land", 0), ("land", 0)])
# The same, then replica 0 restarts with no record of c0 and c1's last allocations: it
# counts them at their reservations again (482Gi on 450Gi), and a reallocation of c0 at
# 100Gi, "within" its reservation, would be 20Gi past hard; it cannot vouch for c0's history,
# so the whole 100Gi must fit beside the rest, and does not.
@example([("allocate", 0, 0, 2, False), ("land", 0), ("allocate", 0, 1, 2, False), ("land", 0), ("watch", 0, 4),
          ("allocate", 0, 2, 0, False), ("land", 0), ("watch", 0, 4), ("allocate", 0, 3, 0, False), ("land", 0),
          ("watch", 0, 4), ("free", 0), ("free", 1), ("restart", 0), ("allocate", 0, 0, 1, False), ("land", 0)])
# A restarted replica allocates c0 at 100Gi whole while replica 1, counting c0's last 80Gi,
# gives the 20Gi it freed to c1's excess: the persisted entry holds c0's 100Gi for replica 1.
@example([("allocate", 0, 0, 2, False), ("land", 0), ("tick", 1.0), ("free", 0), ("watch", 1, 4),
          ("restart", 0), ("allocate", 0, 0, 1, False), ("allocate", 1, 1, 0, False), ("land", 0), ("land", 0)])
def test_no_interleaving_of_replicas_deciding_allocations_over_commits(actions: list[tuple[object, ...]]) -> None:
    world = Cluster()
    for act in actions:
        _step(world, act)
        assert world.committed().memory <= (HARD.hard.memory or 0), (act, world)


@settings(max_examples=300, deadline=None)
@given(st.lists(action, min_size=6, max_size=50))
def test_an_entry_outlives_its_allocation_only_as_an_orphan(actions: list[tuple[object, ...]]) -> None:
    """Once every write in flight landed (or lost to a newer copy) and a writer whose watch
    caught up wrote, the only entries left are of allocations whose write never landed."""
    world = Cluster()
    for act in actions:
        _step(world, act)
    while world.writes:
        _step(world, ("land", 0))
    for r in world.replicas:
        r.watched = len(world.log)
    _decide(world, world.replicas[0], [], False)
    state = world.state()
    for key in world.record.held:
        uid, before = parse_allocation_key(key) or ("", -1)
        assert state[uid] == (before, None), (key, state)
