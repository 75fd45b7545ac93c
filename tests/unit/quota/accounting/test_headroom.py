"""quota.accounting.headroom: a lease is good only on the quota object and generation it was granted on.

An admin edit undone within a lease window (Audit and back, another device class and
back, `hard` raised and lowered, the quota deleted and created again) restores a spec
equal to the one a lease was granted under; what the edit admitted is not in that
lease's room. The model is tests/unit/quota/accounting/test_reservations.py's (three replicas,
the API server's record and claim log), with the quota's spec as an object of its own:
each edit moves its generation and resourceVersion, each replica's quota watch delivers
it when it does, and a write reads the object it is built on (as after a conflict, the
read may be ahead of that replica's watch).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from quota.accounting.headroom import Lease, Plan, SpecVersion, landed, leasable, newer, renew, take
from quota.accounting.reservationrecord import Record
from quota.accounting.reservations import Outcome, apply
from quota.quotas.devicequota import DeviceQuota, Usage, parse_device_quota
from quota.values.model import Charge

from ...builders import GiB, make_quota
from .test_reservations import (LEASED, SIZES, SIZING, TTL, Holder, Seen, World, _lease_step, lease_action, replica,
                                reserve)

AUDIT = replace(LEASED, enforcement="Audit")
RAISED = parse_device_quota(make_quota("gpus", memory="2560Gi"))
SCOPED = parse_device_quota({**make_quota("gpus", memory="1280Gi"),
                             "spec": {"hard": {"memory": "1280Gi"}, "deviceClassNames": ["other.example.com"]}})
SPECS = (LEASED, AUDIT, RAISED, SCOPED)
RECREATE = len(SPECS)


@dataclass
class Editor(Holder):
    """A replica whose quota watch lags the object: the spec its ledger counts, and the
    newest object it has seen (by its watch or by a write's read)."""

    watched_spec: DeviceQuota = LEASED
    watched_version: SpecVersion = SpecVersion("q0", 1)
    newest: SpecVersion = SpecVersion("q0", 1)
    plan_read: tuple[int, Outcome, Plan | None, str] | None = None


@dataclass
class Quota(World):
    """The API server, with the DeviceQuota's spec, uid and generation."""

    spec: DeviceQuota = LEASED
    object: SpecVersion = SpecVersion("q0", 1)
    uids: int = 0
    replicas: tuple[Editor, ...] = field(default_factory=lambda: (Editor(), Editor(), Editor()))

    def watches_current(self) -> bool:
        return all(r.watched_version == self.object for r in self.replicas)


def _sync_all(world: Quota, counter: list[int]) -> None:
    for r in world.replicas:
        _lease_step(world, ("sync", world.replicas.index(r)), counter, SIZING)


def _edit(world: Quota, to: int, counter: list[int]) -> None:
    if to == RECREATE:
        # Deleted and created again under its name: a new uid, an empty record. Claims in
        # flight are first created and seen (the record of the old object no longer counts
        # them, which is the deletion's gap, not the lease's), and every watch sees the new
        # object at once, so that only a lease of the old object could admit past hard.
        _sync_all(world, counter)
        world.uids += 1
        world.object, world.spec, world.record = SpecVersion(f"q{world.uids}", 1), LEASED, Record()
        for r in world.replicas:
            _watch_quota(world, r)
    else:
        world.object = replace(world.object, generation=world.object.generation + 1)
        world.spec = SPECS[to]
    world.version += 1  # the object's resourceVersion: a write built before conflicts


def _watch_quota(world: Quota, r: Editor) -> None:
    r.watched_spec, r.watched_version = world.spec, world.object
    r.newest = newer(r.newest, world.object)


def _build(world: Quota, r: Editor, uid: str) -> None:
    """kube.statuswriter.QuotaStatusWriter._decide on the object read now: the lease
    settled and sized again where the spec read leases, one entry per admission else."""
    if r.plan_read is not None:
        return
    record = world.record
    if record.through is not None and r.watched < record.through:
        return
    r.newest = newer(r.newest, world.object)
    seen = world.seen(r)
    usage = Usage(reserved=sum((world.charges[u] for u in seen.claims), Charge()))
    requests = [reserve(uid, world.charges[uid])] if uid else []
    if leasable(world.spec, SIZING):
        outcome, plan = renew(r.lease, key=r.key, holder=r.key, quota=world.spec, record=record, requests=requests,
                              usage=usage, caches=seen, now=world.now, ttl=TTL, sizing=SIZING, version=world.object)
        r.lease = None if r.lease is None else replace(r.lease, limit=plan.limit)
        r.plan_read = (world.version, outcome, plan, uid)
    else:
        outcome = apply(world.spec, record, requests, usage=usage, caches=seen, now=world.now, ttl=TTL)
        r.plan_read = (world.version, outcome, None, uid)


def _land(world: Quota, r: Editor, past: list[str]) -> None:
    if r.plan_read is None:
        return
    version, outcome, plan, uid = r.plan_read
    r.plan_read = None
    if version != world.version:
        r.lease = None if r.lease is None else replace(r.lease, limit=None)
        return
    if uid and outcome.decisions[0].allowed:
        _admitted(world, uid, past)
    if outcome.changed:
        world.version += 1
        world.record = outcome.record
    if plan is None:  # the spec read does not lease (Audit): the book as it was
        r.lease = None if r.lease is None else replace(r.lease, limit=None)
    else:
        r.lease = landed(r.lease, plan)
    if uid and outcome.decisions[0].allowed:
        world.in_flight.append((uid, world.now, True))


def _committed(world: Quota) -> Charge:
    return world.live() + sum((world.charges[u] for u, _, p in world.in_flight if p), Charge())


def _admitted(world: Quota, uid: str, past: list[str]) -> None:
    """An admission: past `hard` is what must not happen once every watch has the spec."""
    hard = world.spec.hard.memory or 0
    if (world.spec.enforcement == "Enforce" and world.watches_current()
            and (_committed(world) + world.charges[uid]).memory > hard):
        past.append(uid)


edit_action = st.one_of(
    st.tuples(st.just("edit"), st.integers(0, RECREATE)),
    st.tuples(st.just("edit"), st.just(0)),  # the undo
    *[st.tuples(st.just("qwatch"), replica)] * 3,
)
action = st.one_of(lease_action, edit_action)
sizes = st.integers(0, len(SIZES) - 1)
admit = st.tuples(st.just("exact"), replica, sizes, st.just(False), st.just(True))
local = st.tuples(st.just("local"), replica, sizes, st.just(True))


@st.composite
def edit_and_undo(draw: st.DrawFn) -> list[tuple[object, ...]]:
    """Leases granted, an edit under which claims are admitted (up to `hard` and past
    it in Audit or with `hard` raised), the undo, every quota watch delivering it, then no
    more edits: local admissions first. (A watch that has not delivered the undo yet: the
    plain lists of `action`.)"""
    before = draw(st.lists(st.one_of(admit, local, action), min_size=1, max_size=12))
    edit = draw(st.integers(1, RECREATE))
    during = [*draw(st.lists(admit, min_size=16, max_size=24)), *draw(st.lists(action, max_size=10))]
    undo: list[tuple[object, ...]] = [("edit", 0)] if edit != RECREATE else []
    after = [*draw(st.lists(local, min_size=1, max_size=6)),
             *draw(st.lists(st.one_of(local, lease_action), max_size=14))]
    return [*before, ("edit", edit), *during, *undo, ("qwatch", 0), ("qwatch", 1), ("qwatch", 2), *after]


def _step(world: Quota, act: tuple[object, ...], counter: list[int], past: list[str]) -> None:
    kind = act[0]
    if kind == "edit":
        _edit(world, int(act[1]), counter)  # type: ignore[call-overload]
        return
    on_replica = kind not in ("persist", "delete", "annotate", "tick")
    r = world.replicas[int(act[1])] if on_replica else None  # type: ignore[call-overload]
    assert r is None or isinstance(r, Editor)
    if kind == "qwatch":
        assert r is not None
        _watch_quota(world, r)
    elif kind in ("exact", "renew"):
        assert r is not None
        uid = ""
        if kind == "exact":
            counter[0] += 1
            uid = f"u{counter[0]}"
            world.charges[uid] = SIZES[int(act[2])]  # type: ignore[call-overload]
        _build(world, r, uid)
        if act[4 if kind == "exact" else 3]:
            _land(world, r, past)
    elif kind == "land":
        assert r is not None
        _land(world, r, past)
    elif kind == "local":
        assert r is not None
        counter[0] += 1
        uid = f"u{counter[0]}"
        world.charges[uid] = SIZES[int(act[2])]  # type: ignore[call-overload]
        # kube.leasebook.LeaseBook.take: the spec its ledger counts, the newest object it saw.
        if leasable(r.watched_spec, SIZING) and (
                taken := take(r.lease, r.watched_spec, uid, world.charges[uid], world.now, seen=r.newest)) is not None:
            r.lease = taken
            _admitted(world, uid, past)
            world.in_flight.append((uid, world.now, bool(act[3])))
    elif kind == "crash":
        assert r is not None
        if act[2]:
            _land(world, r, past)
        r.plan_read, r.lease, r.process = None, None, r.process + 1
    elif kind == "read":
        pass  # every write here reads the object it is built on
    else:
        _lease_step(world, act, counter, SIZING)


def run(actions: list[tuple[object, ...]]) -> list[str]:
    world, counter, past = Quota(), [0], list[str]()
    for act in actions:
        _step(world, act, counter, past)
    return past


FILL = [("exact", 0, 0, False, True)]  # replica 0's first write: a lease of 7.5 GPUs (hard 16)


@settings(max_examples=1500, deadline=None)
@given(st.one_of(st.lists(action, min_size=8, max_size=80), edit_and_undo()))
# Audit and back: 16 claims admitted by replica 1 under Audit, then replica 0's lease,
# its spec equal to the restored one, would admit its room (7) on top of 17.
@example(FILL + [("edit", 1), ("qwatch", 1)] + [("exact", 1, 0, False, True)] * 16
         + [("edit", 0), ("qwatch", 0), ("qwatch", 1), ("qwatch", 2)] + [("local", 0, 0, True)] * 7)
# Another device class and back.
@example(FILL + [("edit", 3), ("qwatch", 1)] + [("exact", 1, 0, False, True)] * 16
         + [("edit", 0), ("qwatch", 0), ("qwatch", 1), ("qwatch", 2)] + [("local", 0, 0, True)] * 7)
# hard raised, a renewal granting a lease under it (a larger one), then lowered.
@example(FILL + [("edit", 2), ("qwatch", 0), ("qwatch", 1), ("renew", 0, False, True)]
         + [("exact", 1, 0, False, True)] * 16 + [("edit", 0), ("qwatch", 0), ("qwatch", 1), ("qwatch", 2)]
         + [("local", 0, 0, True)] * 7)
# Deleted and created again with the same spec: the new object's record holds no lease.
@example(FILL + [("edit", RECREATE)] + [("exact", 1, 0, False, True)] * 16 + [("local", 0, 0, True)] * 7)
def test_no_lease_admits_past_hard_once_every_watch_has_the_spec_an_edit_restored(
        actions: list[tuple[object, ...]]) -> None:
    assert run(actions) == []


def test_a_lease_admits_only_on_the_object_and_generation_it_was_granted_on() -> None:
    lease = Lease("lease.a.0", "a", LEASED, Charge(240 * GiB, 3), until=100.0, expires=300.0,
                  version=SpecVersion("q0", 4))
    assert take(lease, LEASED, "x", SIZES[0], 10.0, seen=SpecVersion("q0", 4)) is not None
    # An edit and its undo: an equal spec, a later generation.
    assert take(lease, LEASED, "x", SIZES[0], 10.0, seen=SpecVersion("q0", 6)) is None
    assert take(lease, LEASED, "x", SIZES[0], 10.0, seen=SpecVersion("q1", 4)) is None  # created again
    assert take(lease, LEASED, "x", SIZES[0], 10.0, seen=None) is None  # deleted
    # The spec the ledger counts must be the one granted under too (a read ahead of the watch).
    assert take(lease, RAISED, "x", SIZES[0], 10.0, seen=SpecVersion("q0", 4)) is None
    # What a replica has seen only moves forward on one object; another uid replaces it.
    assert newer(SpecVersion("q0", 6), SpecVersion("q0", 4)) == SpecVersion("q0", 6)
    assert newer(SpecVersion("q0", 6), SpecVersion("q1", 1)) == SpecVersion("q1", 1)
    assert newer(None, SpecVersion("q0", 2)) == SpecVersion("q0", 2)


def test_a_renewal_on_a_later_generation_grants_a_lease_of_that_generation() -> None:
    outcome, plan = renew(None, key="lease.a.0", holder="a", quota=LEASED, record=Record(),
                          requests=[reserve("x")], usage=Usage(), caches=Seen(), now=100.0, ttl=TTL,
                          sizing=SIZING, version=SpecVersion("q0", 9))
    assert outcome.decisions[0].allowed and plan.lease is not None and plan.lease.version == SpecVersion("q0", 9)

