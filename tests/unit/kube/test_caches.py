"""kube.caches and kube.claimstore: reflector stores that never raise, and claims accounted from the cluster's view."""

from __future__ import annotations

import copy
import gc
import logging
import weakref
from typing import Any

import pytest

from kube.caches import ClassStore, NamespaceStore, QuotaStore, SliceStore
from kube.claimstore import ClaimStore
from quota.accounting.ledger import Ledger
from quota.accounting.ledgerentry import ClaimRef, Entry
from quota.accounting.usage import Holders
from quota.admission.admitter import Admitter
from quota.devices.inventory import Inventory
from quota.objects.allocationrecord import record_annotations
from quota.objects.claims import CHARGE_ANNOTATION, parse_claim
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import Usage
from quota.values.model import ZERO, Charge, DeviceClass, DeviceClassName, Namespace
from quota.values.work import pausing

from ..builders import (GiB, exactly, make_class, make_claim, make_cluster_quota, make_device, make_quota, make_slice,
                        request, result)
from ..quota.accounting.test_ledger import entry as priced

D = "gpu.example.com"
NS = Namespace("team-a")
GPU_CLASS = make_class("gpu", f"device.attributes['{D}'].type == 'gpu'")


def with_uid(obj: dict[str, Any], uid: str) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"]["uid"] = uid
    return obj


def claim(name: str, uid: str, *, allocated: bool = False) -> dict[str, Any]:
    allocation = [result("gpu", "gpu-0")] if allocated else None
    return with_uid(make_claim(name, request("gpu", exactly("gpu")), allocation=allocation), uid)


class World:
    def __init__(self) -> None:
        self.inventory = Inventory()
        self.classes: dict[DeviceClassName, DeviceClass] = {}
        self.namespaces: dict[str, Any] = {}
        self.admitter = Admitter(Pricer(self.inventory, self.classes), Ledger())
        self.slices = SliceStore(self.inventory)
        self.class_store = ClassStore(self.classes)
        self.namespace_store = NamespaceStore(self.namespaces)
        self.quotas = QuotaStore(self.admitter)
        self.claims = ClaimStore(self.admitter)
        self.slices.replace([make_slice("n1", [make_device(f"gpu-{i}", memory="80Gi") for i in range(4)])])
        self.class_store.replace([GPU_CLASS])
        self.quotas.replace([make_quota("gpus", memory="160Gi")])

    def usage(self) -> Usage:
        return self.admitter.ledger.usage(NS, "gpus")


def test_malformed_objects_are_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    world = World()
    bad_slice = make_slice("bad", [make_device("x", memory="lots")], node="node-2")
    bad_class = {**make_class("broken"), "apiVersion": "resource.k8s.io/v1alpha3"}
    bad_quota = make_quota("bad", memory="-1")
    bad_claim = {**claim("bad", "u-bad"), "spec": {"devices": {"requests": "nope"}}}
    bad_namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns", "labels": "x"}}
    good_namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {"a": "b"}}}
    with caplog.at_level(logging.WARNING, logger="kube.caches"):
        world.slices.replace([make_slice("n1", [make_device("gpu-0")]), bad_slice])
        world.slices.upsert(bad_slice)
        world.class_store.replace([GPU_CLASS, bad_class])
        world.class_store.upsert(bad_class)
        world.namespace_store.replace([good_namespace, bad_namespace])
        world.quotas.replace([make_quota("gpus", memory="160Gi"), bad_quota])
        world.quotas.upsert(bad_quota)
        world.claims.replace([claim("c1", "u1"), bad_claim])
        world.claims.upsert(bad_claim)
    assert len(world.inventory.usable()) == 1
    assert list(world.classes) == ["gpu"]
    assert world.namespaces == {"team-a": {"a": "b"}}
    assert [q.name for q in world.admitter.ledger.quotas()] == ["gpus"]
    assert world.usage().reserved == Charge(80 * GiB, 1)
    skipped = [r.getMessage() for r in caplog.records]
    for described in ("ResourceSlice bad", "DeviceClass broken", "Namespace ns", "DeviceQuota team-a/bad",
                      "ResourceClaim team-a/bad"):
        assert any(m.startswith(f"skipping {described}: ") for m in skipped), (described, skipped)


def test_claims_reserve_confirm_charge_and_release() -> None:
    world = World()
    ledger = world.admitter.ledger
    # An admission reserved c1; its ADDED event confirms the same reservation (no double count).
    admitted = world.admitter.admit_claim(parse_claim(claim("c1", "u1")), namespace_labels={})
    assert admitted.allowed
    world.claims.upsert(claim("c1", "u1"))
    assert world.usage().reserved == Charge(80 * GiB, 1) and world.usage().pending_claims == 1
    # A claim this process never admitted (it started later) is reserved as admission would.
    world.claims.upsert(claim("c2", "u2"))
    assert world.usage().reserved == Charge(160 * GiB, 2)
    # Allocation: exact, moves from reserved to used.
    world.claims.upsert(claim("c2", "u2", allocated=True))
    assert (world.usage().used, world.usage().reserved) == (Charge(80 * GiB, 1), Charge(80 * GiB, 1))
    # Deallocated (status.allocation removed): pending again, at what its allocation charged.
    world.claims.upsert(claim("c2", "u2"))
    assert (world.usage().used, world.usage().reserved) == (ZERO, Charge(160 * GiB, 2))
    world.claims.delete(claim("c2", "u2"))
    world.claims.delete(claim("c1", "u1"))
    assert world.usage() == Usage()
    assert ledger.entry(ClaimRef("u1")) is None


def test_a_relist_drops_claims_that_disappeared_and_keeps_the_rest() -> None:
    world = World()
    world.claims.replace([claim("c1", "u1"), claim("c2", "u2", allocated=True)])
    assert (world.usage().used, world.usage().reserved) == (Charge(80 * GiB, 1), Charge(80 * GiB, 1))
    world.claims.replace([claim("c2", "u2", allocated=True)])
    assert (world.usage().used, world.usage().reserved) == (Charge(80 * GiB, 1), ZERO)


def versioned(obj: dict[str, Any], version: str) -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = version
    return obj


def test_a_relist_reads_again_only_the_claims_whose_resource_version_moved() -> None:
    world = World()
    world.claims.replace([versioned(claim("c1", "u1"), "10"), versioned(claim("c2", "u2"), "11")])
    assert world.usage().reserved == Charge(160 * GiB, 2)
    # Same resourceVersion: the same object, not read again (here it even claims to be
    # allocated, which a real API server could not serve under an unchanged version).
    world.claims.replace([versioned(claim("c1", "u1", allocated=True), "10"), versioned(claim("c2", "u2"), "11")])
    assert (world.usage().used, world.usage().reserved) == (ZERO, Charge(160 * GiB, 2))
    # A new resourceVersion is read: the allocation lands.
    world.claims.replace([versioned(claim("c1", "u1", allocated=True), "12"), versioned(claim("c2", "u2"), "11")])
    assert (world.usage().used, world.usage().reserved) == (Charge(80 * GiB, 1), Charge(80 * GiB, 1))
    # Deleted while the watch was down, then the same uid and version again: read again,
    # since the ledger no longer holds it.
    world.claims.replace([versioned(claim("c2", "u2"), "11")])
    world.claims.replace([versioned(claim("c1", "u1", allocated=True), "12"), versioned(claim("c2", "u2"), "11")])
    assert (world.usage().used, world.usage().reserved) == (Charge(80 * GiB, 1), Charge(80 * GiB, 1))


def test_a_relist_in_slices_swaps_in_whole_and_keeps_what_changed_meanwhile() -> None:
    """`serve` runs a relist in slices (`kube.rebuilds`): between two of them the ledger
    is the old one whole; a kept claim re-priced meanwhile (the refiner) keeps its new
    price; a claim gone from the list is told as deleted once swapped."""
    world = World()
    ledger = world.admitter.ledger
    deleted: list[str] = []
    world.claims.deleted = lambda ref, _: deleted.append(ref)
    world.claims.replace([versioned(claim("c1", "u1"), "10"), versioned(claim("c2", "u2", allocated=True), "11")])
    old = (Charge(80 * GiB, 1), Charge(80 * GiB, 1))
    seen: list[tuple[Charge, Charge]] = []

    def pause() -> None:
        seen.append((world.usage().used, world.usage().reserved))
        if len(seen) == 1:  # the refiner prices the stored c1 between two slices
            ledger.add_or_update_claim(priced("u1", 40 * GiB))
            old_now[0] = (world.usage().used, world.usage().reserved)

    old_now = [old]
    with pausing(pause):
        world.claims.replace([versioned(claim("c1", "u1"), "10"), versioned(claim("c3", "u3"), "20")])
    new = (ZERO, Charge(120 * GiB, 2))
    assert seen[0] == old and old_now[0] == (Charge(80 * GiB, 1), Charge(40 * GiB, 1))
    assert new in seen, "it paused after the swap too (what is told, what is freed)"
    swapped = seen.index(new)
    assert seen[1:swapped] == [old_now[0]] * (swapped - 1) and set(seen[swapped:]) == {new}
    assert (world.usage().used, world.usage().reserved) == new
    assert deleted == ["u2"]


def test_after_a_relist_swapped_in_what_it_replaced_is_freed_a_claim_at_a_time() -> None:
    """The old versions, charge records and holders, and each claim read again, go in
    pieces after the swap, a pause point between two: freed together at the end of the
    relist they held the loop 0.2 s at 150,000 claims (bench/stalls.py)."""
    world = World()
    world.claims.holders = Holders()
    listed = [versioned(claim(f"c{n}", f"u{n}", allocated=True), "10") for n in range(3)]
    world.claims.replace(listed)
    versions, held = world.claims._versions, world.claims.holders.mapping()
    assert len(versions) == len(held) == 3
    sizes: list[tuple[int, int]] = []
    with pausing(lambda: sizes.append((len(versions), len(held)))):
        world.claims.replace([versioned(claim(f"c{n}", f"u{n}", allocated=True), "11") for n in range(3)])
    assert (2, 3) in sizes and (0, 2) in sizes, sizes  # each table emptied one at a time, pausing
    assert not versions and not held
    assert len(world.claims._versions) == len(world.claims.holders.mapping()) == 3


class Listed(dict[str, Any]):
    """A listed object whose lifetime a test can watch (a plain dict takes no weak reference)."""


def test_a_relist_staged_in_pieces_counts_what_replace_counts_and_lets_each_object_go() -> None:
    """A streamed list (`kube.watching`) stages each piece as it arrives: the result is
    `replace`'s, the raw objects are not held until the swap (150,000 claims' objects
    were 0.5 GB at start-up), and the annotator is told each claim's annotations after
    the swap as before."""
    listed = [claim("c1", "u1"), claim("c2", "u2", allocated=True), claim("c3", "u3")]
    listed[1]["metadata"]["annotations"] = {"draquota.io/charge": '{"memory":"80Gi","devices":1}'}
    whole = World()
    whole.claims.replace(copy.deepcopy(listed))
    world = World()
    seen: list[tuple[str, dict[str, str]]] = []

    class Recorder:
        def seen(self, claim: Any, annotations: Any) -> None:
            seen.append((claim.uid, dict(annotations)))

        def gone(self, uid: str) -> None:
            pass

    world.claims.recorder = Recorder()
    staged = world.claims.relist()
    pieces = [[Listed(copy.deepcopy(o))] for o in listed]
    alive = [weakref.ref(piece[0]) for piece in pieces]
    for piece in pieces:
        staged.add(piece)
    assert world.usage() == Usage() and not seen, "nothing swapped in before the commit"
    del pieces, piece
    gc.collect()
    assert [ref() for ref in alive] == [None] * 3, "a staged object is let go"
    staged.commit()
    assert world.usage() == whole.usage() != Usage()
    assert {e.ref for e in world.admitter.ledger.entries()} == {e.ref for e in whole.admitter.ledger.entries()}
    assert [v for v in (world.claims.version(u) for u in ("u1", "u2", "u3"))] == [
        whole.claims.version(u) for u in ("u1", "u2", "u3")]
    assert seen == [("u1", {}), ("u2", listed[1]["metadata"]["annotations"]), ("u3", {})]


def test_slices_staged_in_pieces_make_replaces_inventory_skip_the_malformed_and_let_each_object_go(
        caplog: pytest.LogCaptureFixture) -> None:
    listed = [make_slice(f"n{i}", [make_device(f"gpu-{i}-{k}", memory="80Gi") for k in range(2)], node=f"n{i}")
              for i in range(3)]
    bad = make_slice("bad", [make_device("x", memory="lots")], node="node-2")
    whole = World()
    whole.slices.replace(copy.deepcopy([*listed, bad]))
    world = World()
    before = dict(world.inventory.usable())
    staged = world.slices.relist()
    pieces = [[Listed(copy.deepcopy(o))] for o in [*listed, bad]]
    alive = [weakref.ref(piece[0]) for piece in pieces]
    with caplog.at_level(logging.WARNING, logger="kube.caches"):
        for piece in pieces:
            staged.add(piece)
    assert world.inventory.usable() == before, "nothing swapped in before the commit"
    del pieces, piece
    gc.collect()
    # (the malformed one's log record, which caplog keeps, holds its traceback)
    assert [ref() for ref in alive[:3]] == [None] * 3, "a staged object is let go"
    staged.commit()
    assert shown(world.inventory) == shown(whole.inventory) and len(whole.inventory.usable()) == 6
    assert any(r.getMessage().startswith("skipping ResourceSlice bad: ") for r in caplog.records)
    cancelled = world.slices.relist()
    cancelled.add([make_slice("n9", [make_device("gpu-9")], node="n9")])
    cancelled.cancel()
    assert shown(world.inventory) == shown(whole.inventory)


def shown(inventory: Inventory) -> dict[Any, str]:
    """The usable devices, compared by what they hold (`Device` compares by identity)."""
    return {key: repr(device) for key, device in inventory.usable().items()}


def test_a_cancelled_staged_relist_leaves_the_ledger_as_it_was() -> None:
    world = World()
    world.claims.replace([claim("c1", "u1")])
    before = world.usage()
    staged = world.claims.relist()
    staged.add([claim("c2", "u2"), claim("c3", "u3")])
    staged.cancel()
    assert world.usage() == before
    world.claims.replace([claim("c1", "u1"), claim("c2", "u2")])  # the next relist works
    assert world.usage().reserved == Charge(160 * GiB, 2)


def test_a_relist_never_tells_as_deleted_a_claim_it_knows_only_from_an_admission() -> None:
    """A claim created after the list's resourceVersion, whose allocation this replica
    admitted while the relist was built, is not in the list; it was not deleted: its
    persisted reservation must keep counting it until the watch delivers it."""
    world = World()
    deleted: list[str] = []
    world.claims.deleted = lambda ref, _: deleted.append(ref)
    world.claims.replace([versioned(claim("c1", "u1"), "10"), versioned(claim("c2", "u2"), "11")])
    admitted: list[object] = []

    def pause() -> None:
        if not admitted:
            admitted.append(world.admitter.ledger.add_or_update_claim(priced("u9", 40 * GiB)))

    with pausing(pause):
        world.claims.replace([versioned(claim("c2", "u2"), "11")])
    assert admitted, "the admission landed while the relist was built"
    assert deleted == ["u1"]


def test_quotas_classes_namespaces_and_slices_follow_their_events() -> None:
    world = World()
    world.claims.upsert(claim("c1", "u1"))
    world.quotas.upsert(make_quota("more", memory="1Ti"))
    assert world.admitter.ledger.usage(NS, "more").reserved == Charge(80 * GiB, 1)
    world.quotas.delete(make_quota("more"))
    world.quotas.replace([])
    assert world.admitter.ledger.quotas() == []
    world.class_store.delete(GPU_CLASS)
    assert world.classes == {}
    world.namespace_store.upsert({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})
    world.namespace_store.delete({"metadata": {"name": "x"}})
    assert world.namespaces == {}
    world.slices.delete(make_slice("n1", []))
    world.slices.delete({"metadata": {}})
    assert world.inventory.usable() == {}


def test_a_claim_whose_accounting_raises_is_skipped_and_the_next_is_accounted(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that raises stops its reflector, and `serve` then stops; one
    claim's failure must cost that claim its accounting, nothing more."""
    world = World()
    real = world.admitter.existing_entry

    def existing_entry(parsed: Any, **kwargs: Any) -> Any:
        if parsed.name == "bad":
            raise MemoryError()
        return real(parsed, **kwargs)

    monkeypatch.setattr(world.admitter, "existing_entry", existing_entry)
    world.claims.replace([claim("bad", "u-bad"), claim("good", "u-good")])
    world.claims.upsert(claim("later", "u-later"))
    assert world.usage().reserved == Charge(160 * GiB, 2)
    assert "accounting ResourceClaim team-a/bad uid=u-bad failed" in caplog.text
    # Not held by this cache either, on an event as after a relist: a persisted
    # reservation of it must stay (quota.accounting.reservations.settle), not be settled away
    # while the ledger counts nothing for it.
    def at(obj: dict[str, Any], version: str) -> dict[str, Any]:
        return {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}}

    world.claims.upsert(at(claim("bad", "u-bad-2"), "7"))
    world.claims.upsert(at(claim("fine", "u-fine"), "8"))
    assert world.claims.version("u-bad-2") is None and world.claims.version("u-fine") == 8


def scoped_world() -> tuple[World, list[dict[str, Any]], dict[str, Any]]:
    """An H100 and an A100; a claim allocated the A100, one pending for an A100; a quota
    selecting H100s (it charges neither claim)."""
    world = World()
    world.slices.replace([make_slice("n1", [
        make_device("gpu-0", memory="80Gi", attrs={"type": "gpu", "model": "h100"}),
        make_device("gpu-1", memory="40Gi", attrs={"type": "gpu", "model": "a100"})])])
    a100 = f"device.attributes['{D}'].model == 'a100'"
    on_a100 = with_uid(make_claim("on-a100", request("gpu", exactly("gpu")), allocation=[result("gpu", "gpu-1")]), "u1")
    pending = with_uid(make_claim("pending", request("gpu", exactly("gpu", a100))), "u2")
    return world, [on_a100, pending], make_quota("h100", memory="1Ti",
                                                 selectors=[f"device.attributes['{D}'].model == 'h100'"])


def test_a_deallocated_claim_counts_what_its_last_allocation_charged_through_relists_and_new_selections() -> None:
    """Priced at the H100 it might get (80Gi), allocated the A100 (40Gi): the 40Gi freed may
    go to another claim. Deallocated, it counts 40Gi among the pending claims, not 80Gi
    again, so a reallocation is checked for what it adds (`Counting.deallocated_entry`);
    a relist keeps that, and a quota selecting other devices prices it from its devices
    (no tenant CEL, nothing handed to the stored-claim pricer)."""
    world, (on_a100, pending), h100 = scoped_world()
    handed: list[str] = []
    world.quotas.reprice = lambda c, e: handed.append(c.name)
    world.claims.replace([on_a100])
    freed = copy.deepcopy(on_a100)
    freed["status"] = {}
    world.claims.upsert(versioned(freed, "7"))
    assert (world.usage().used, world.usage().reserved, world.usage().pending_claims) == (ZERO, Charge(40 * GiB, 1), 1)
    # Deallocated before the leader recorded the allocation: the leader writes the record
    # (what a replica started from now on counts, `Counting.recorded_allocation`).
    current = {CHARGE_ANNOTATION: "{}"}
    assert world.admitter.annotations_may_be_due(parse_claim(freed), current)
    record = world.admitter.pricer.allocation_record(parse_claim(on_a100))
    assert world.admitter.annotations_due(parse_claim(freed), current) == record_annotations(parse_claim(freed), record)
    with_record = copy.deepcopy(freed)
    with_record["metadata"]["annotations"] = record_annotations(parse_claim(freed), record)
    assert not world.admitter.annotations_may_be_due(parse_claim(with_record), current)
    world.claims.replace([versioned(copy.deepcopy(freed), "8"), pending])
    assert world.usage().reserved == Charge(80 * GiB, 2)
    world.quotas.upsert(h100)
    assert handed == ["pending"]
    assert world.admitter.ledger.usage(NS, "h100").reserved == Charge(40 * GiB, 1)  # the pending A100 claim's bound


@pytest.mark.parametrize("hooked", [False, True])
def test_a_quota_selecting_devices_listed_after_the_claims_prices_them_for_it(hooked: bool) -> None:
    """The quota watch may list after the claim watch: the claims already counted are
    priced again for a selection new to their namespace, the unallocated ones through
    the hook (`controllers.refine` in serve) when there is one."""
    world, claims, h100 = scoped_world()
    handed: list[tuple[str, Entry]] = []
    world.quotas.reprice = (lambda c, e: handed.append((c.name, e))) if hooked else None
    world.claims.replace(claims)
    world.quotas.upsert(h100)
    usage = world.admitter.ledger.usage(NS, "h100")
    assert usage.used == ZERO  # the A100 allocation, priced again at once
    if hooked:
        assert [name for name, _ in handed] == ["pending"] and usage.reserved == Charge(40 * GiB, 1)
    else:
        assert usage.reserved == ZERO  # priced here


@pytest.mark.parametrize("hooked", [False, True])
def test_a_quota_selecting_devices_that_arrives_while_a_relist_is_built_prices_its_claims(hooked: bool) -> None:
    """The claims relist runs in slices and the quota watch applies events between them:
    the claims the relist staged before the quota arrived are priced for its selection
    once swapped in, as if the quota had come after (the test above)."""
    world, claims, h100 = scoped_world()
    handed: list[tuple[str, Entry]] = []
    world.claims.provisional = (lambda c, e: handed.append((c.name, e))) if hooked else None
    arrived: list[bool] = []

    def pause() -> None:  # the first pause comes after the first claim staged, before the swap
        if not arrived:
            world.quotas.upsert(h100)
            arrived.append(True)

    with pausing(pause):
        world.claims.replace(claims)
    assert arrived
    usage = world.admitter.ledger.usage(NS, "h100")
    assert usage.used == ZERO  # the A100 allocation, priced again once swapped in
    if hooked:
        # At its bound (the largest GPU) until the refiner prices it: handed for its bound
        # and for the selection (the refiner's queue holds a claim once).
        assert {name for name, _ in handed} == {"pending"} and usage.reserved == Charge(80 * GiB, 1)
    else:
        assert usage.reserved == ZERO  # priced here


def test_a_claim_deleted_while_a_new_selection_prices_it_does_not_come_back() -> None:
    """Pricing an allocated claim for a quota's new selection pauses (CEL, in a sliced
    relist of the quotas); a claim deleted in that pause stays deleted."""
    world, claims, h100 = scoped_world()
    world.claims.replace(claims)
    ledger = world.admitter.ledger
    deleted: list[str] = []

    def pause() -> None:
        if not deleted and ledger.entry(ClaimRef("u1")) is not None:
            world.claims.delete(claims[0])
            deleted.append("u1")

    with pausing(pause):
        world.quotas.upsert(h100)
    assert deleted, "the claim was deleted while the quota's selection was priced"
    assert ledger.entry(ClaimRef("u1")) is None


def test_the_stores_tell_the_quotas_each_event_moved_as_the_ledger_returns_them() -> None:
    world = World()
    world.quotas.upsert(make_quota("other", memory="1Ti"))
    told: list[list[tuple[str, str]] | None] = []
    world.quotas.changed = world.claims.changed = lambda keys: told.append(None if keys is None else sorted(keys))
    both = [(NS, "gpus"), (NS, "other")]
    world.claims.upsert(claim("c1", "u1"))  # counted: both quotas of its namespace
    world.claims.upsert(claim("c1", "u1", allocated=True))
    world.quotas.upsert(make_quota("gpus", memory="320Gi"))  # a quota: its own key
    world.quotas.delete(make_quota("other", memory="1Ti"))
    world.claims.delete(claim("c1", "u1", allocated=True))  # one quota left
    world.claims.replace([])
    world.quotas.replace([make_quota("gpus", memory="160Gi")])
    assert told == [both, both, [(NS, "gpus")], [(NS, "other")], [(NS, "gpus")], None, None]


def test_a_claim_event_the_ledger_counts_as_before_still_tells_its_namespaces_quotas() -> None:
    """The leader's charge landing on a claim changes nothing the ledger counts, but lets
    the claim's persisted entry go (`quota.accounting.reservations.settle`): the quota controller
    must look at its quotas again, or the entry would stay until its TTL."""
    world = World()
    ledger = world.admitter.ledger
    world.admitter.admit_claim(parse_claim(claim("c1", "u1")), namespace_labels={})  # held before its event
    told: list[list[tuple[str, str]] | None] = []
    world.claims.changed = lambda keys: told.append(None if keys is None else list(keys))
    before = ledger.entry(ClaimRef("u1"))
    world.claims.upsert(claim("c1", "u1"))
    assert ledger.entry(ClaimRef("u1")) is before  # the ledger counts it as before ...
    assert told == [[(NS, "gpus")]]  # ... its namespace's quotas are told all the same


def test_the_namespace_store_tells_each_events_namespace() -> None:
    told: list[str | None] = []
    store = NamespaceStore({}, changed=told.append)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    store.upsert(namespace)
    store.delete(namespace)
    store.replace([])
    assert told == ["team-a", "team-a", None]


def test_the_namespace_store_knows_the_newest_namespace_version_it_was_given() -> None:
    # A ClusterDeviceQuota's namespacesThrough is raised to it (quota.accounting.reservations): the
    # version of a real Namespace write (a deletion's too), never lowered by an older one.
    store = NamespaceStore({})
    def ns(name: str, version: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "resourceVersion": version}}
    assert store.newest is None
    store.replace([ns("a", "7"), ns("b", "12")])
    assert store.newest == 12
    store.upsert(ns("a", "9"))
    assert store.newest == 12
    store.delete(ns("b", "20"))
    assert store.newest == 20


# -- team quotas (ClusterDeviceQuotas) ------------------------------------------------------------


def namespace_obj(name: str, team: str | None = None) -> dict[str, Any]:
    labels = {"kubernetes.io/metadata.name": name, **({"team.draquota.io/name": team} if team else {})}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def team_world() -> tuple[World, QuotaStore, list[list[tuple[str, str]] | None]]:
    world = World()
    told: list[list[tuple[str, str]] | None] = []
    world.namespace_store = NamespaceStore(world.namespaces, admitter=world.admitter,
                                           quotas_changed=lambda keys: told.append(None if keys is None else list(keys)))
    teams = QuotaStore(world.admitter, cluster=True)
    world.namespace_store.replace([namespace_obj("team-a", "ml"), namespace_obj("team-b")])
    teams.replace([make_cluster_quota("ml", team="ml", memory="1Ti")])
    world.claims.upsert(claim("c1", "u1", allocated=True))
    told.clear()
    return world, teams, told


def test_namespace_labels_move_a_namespaces_usage_between_teams_at_once() -> None:
    world, _, told = team_world()
    ledger, team = world.admitter.ledger, (Namespace(""), "ml")
    assert ledger.usage(*team).used == Charge(80 * GiB, 1) and ledger.members("ml") == (NS,)
    world.namespace_store.upsert(namespace_obj("team-a"))  # relabelled out
    assert ledger.usage(*team).used == ZERO and ledger.members("ml") == ()
    world.namespace_store.upsert(namespace_obj("team-a", "ml"))  # and back
    assert ledger.usage(*team).used == Charge(80 * GiB, 1)
    world.namespace_store.upsert(namespace_obj("team-a", "ml"))  # unchanged: nothing moves
    world.namespace_store.delete(namespace_obj("team-a", "ml"))
    assert ledger.members("ml") == ()
    assert told == [[team], [team], [], [team]]
    world.namespace_store.replace([namespace_obj("team-b", "ml")])
    assert ledger.members("ml") == (Namespace("team-b"),) and told[-1] is None


def test_the_two_quota_stores_keep_to_their_own_kind() -> None:
    world, teams, _ = team_world()
    ledger = world.admitter.ledger
    assert {(q.kind, q.name) for q in ledger.quotas()} == {("DeviceQuota", "gpus"), ("ClusterDeviceQuota", "ml")}
    world.quotas.replace([make_quota("gpus", memory="160Gi")])  # a DeviceQuota relist keeps the team
    assert ledger.quota(Namespace(""), "ml") is not None
    teams.replace([])  # and a team relist the DeviceQuotas
    assert ledger.quota(Namespace(""), "ml") is None and ledger.quota(NS, "gpus") is not None
    teams.upsert(make_cluster_quota("ml", team="ml", memory="1Ti"))
    teams.delete(make_cluster_quota("ml", team="ml"))  # deleting a team drops what it counted
    assert ledger.quotas(NS) == [ledger.quota(NS, "gpus")] and ledger.usage(Namespace(""), "ml") == Usage()


def test_a_namespace_joining_a_team_selecting_devices_has_its_claims_priced_for_it() -> None:
    """As for a DeviceQuota selecting devices new to a namespace (above): its allocated
    claims priced again at once, its unallocated ones handed to the refiner."""
    world, claims, _ = scoped_world()
    handed: list[str] = []
    world.namespace_store = NamespaceStore(world.namespaces, admitter=world.admitter,
                                           reprice=lambda c, e: handed.append(c.name))
    world.namespace_store.replace([namespace_obj("team-a")])
    teams = QuotaStore(world.admitter, cluster=True)
    teams.replace([make_cluster_quota("ml", team="ml", memory="1Ti",
                                      selectors=[f"device.attributes['{D}'].model == 'h100'"])])
    world.claims.replace(claims)
    world.namespace_store.upsert(namespace_obj("team-a", "ml"))
    usage = world.admitter.ledger.usage(Namespace(""), "ml")
    assert usage.used == ZERO  # the A100 allocation, priced again for the H100 selection at once
    assert handed == ["pending"] and usage.reserved == Charge(40 * GiB, 1)  # at its unscoped charge meanwhile


def test_a_claims_quotas_annotation_names_its_team_by_kind() -> None:
    world, _, _ = team_world()
    due = world.admitter.annotations_due(parse_claim(claim("c2", "u2")), {})
    assert due["draquota.io/quotas"] == "ClusterDeviceQuota/ml,gpus"
