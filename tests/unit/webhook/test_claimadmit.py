"""webhook.claimadmit: one-write admission, a claim CREATE reserved and annotated by the mutating call.

The replica is test_claimreview's `World` (a scripted API server persisting the record,
the claim cache counting what the watch delivers); the API server's part is played here:
it applies the answer's patch, then fills in the name and uid (`stored`).
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from typing import Any

from devcluster.webhooks import json_patched
from kube.admissionreview import AdmissionRequest, Verdict
from kube.leasebook import LeaseBook
from kube.quotawriter import Reservations
from quota.accounting.headroom import Sizing
from quota.admission.admissiontoken import ADMISSION_ANNOTATION, token_key
from quota.objects.claims import CHARGE_ANNOTATION, QUOTAS_ANNOTATION, parse_claim
from quota.values.model import Charge
from webhook.claimadmit import admit_claim
from webhook.claimreview import update_claim

from ..builders import GiB, make_quota
from ..kube.test_quotawriter import scheduler_attempt
from .test_claimreview import GPUS, NS, UID, UID2, World, gpu_claim, reserved, review_request, run, stored


def mutate(world: World, obj: dict[str, Any], *, dry_run: bool = False) -> Verdict:
    return asyncio.run(admit_claim(world.ctx, review_request(obj, name="", dry_run=dry_run)))


def incoming(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the mutating phase of a generateName CREATE sees it: no name, no uid."""
    out = copy.deepcopy(obj)
    out["metadata"]["generateName"] = "train-gpu-"
    return out


def patched(obj: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
    """`obj` with the answer's JSON Patch applied, as the API server applies it (adds and removes)."""
    return json_patched(obj, verdict.patch)


def notes(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def held(world: World) -> dict[str, Any]:
    return dict(world.api.objects["gpus"]["status"].get("reservations") or {})


def test_the_create_carries_the_charge_the_leader_would_write_and_a_token_its_entry_is_keyed_by() -> None:
    world = World(GPUS)
    verdict = mutate(world, incoming(gpu_claim()))
    assert verdict.allowed
    claim = patched(incoming(gpu_claim()), verdict)
    token = notes(claim)[ADMISSION_ANNOTATION]
    due = world.ctx.admitter.annotations_due(parse_claim(stored(gpu_claim())), {})
    assert {k: notes(claim)[k] for k in (CHARGE_ANNOTATION, QUOTAS_ANNOTATION)} == due
    assert list(held(world)) == [token_key(token)]
    assert reserved(world.ctx) == Charge(80 * GiB, 1)
    # Stored under its generated name and uid; the watch delivers it: counted once, from the cache.
    world.created(stored(claim))
    assert reserved(world.ctx) == Charge(80 * GiB, 1)
    assert world.reservations.claim_recorded(token_key(token)) is not None
    # The next write settles the entry, as a uid-keyed one (and raises the watermark).
    assert mutate(world, incoming(gpu_claim())).allowed
    assert token_key(token) not in held(world)
    assert reserved(world.ctx) == Charge(160 * GiB, 2)


def test_a_reinvocation_reserves_again_under_a_new_token_and_the_first_is_an_orphan() -> None:
    world = World(make_quota("gpus", memory="400Gi"))
    first = patched(incoming(gpu_claim()), mutate(world, incoming(gpu_claim())))
    again = patched(first, mutate(world, first))  # a later webhook changed something: called again
    tokens = notes(first)[ADMISSION_ANNOTATION], notes(again)[ADMISSION_ANNOTATION]
    assert tokens[0] != tokens[1]
    assert set(held(world)) == {token_key(t) for t in tokens}
    world.created(stored(again))
    assert mutate(world, incoming(gpu_claim())).allowed
    # The claim's own entry settled; the first invocation's stays until its TTL: the
    # reinvocation costs its charge twice meanwhile (fails closed).
    assert token_key(tokens[1]) not in held(world) and token_key(tokens[0]) in held(world)
    assert reserved(world.ctx) == Charge(240 * GiB, 3)


def test_a_dry_run_patches_the_charge_and_reserves_nothing() -> None:
    world = World(GPUS)
    verdict = mutate(world, incoming(gpu_claim()), dry_run=True)
    claim = patched(incoming(gpu_claim()), verdict)
    assert CHARGE_ANNOTATION in notes(claim) and ADMISSION_ANNOTATION not in notes(claim)
    assert world.api.writes == 0 and reserved(world.ctx) == Charge()


def test_what_the_creator_wrote_is_overwritten_and_a_denial_patches_nothing() -> None:
    world = World(GPUS)
    forged = incoming(gpu_claim())
    forged["metadata"]["annotations"] = {CHARGE_ANNOTATION: '{"memory":0,"devices":0}', ADMISSION_ANNOTATION: "0" * 32}
    claim = patched(forged, mutate(world, forged))
    assert notes(claim)[CHARGE_ANNOTATION] != '{"memory":0,"devices":0}'
    assert notes(claim)[ADMISSION_ANNOTATION] != "0" * 32
    denied = mutate(world, incoming(gpu_claim(count=3)))
    assert not denied.allowed and not denied.patch


def test_a_copied_token_never_takes_over_the_entry_of_the_claim_that_carried_it_first() -> None:
    world = World(GPUS)
    claim = patched(incoming(gpu_claim()), mutate(world, incoming(gpu_claim())))
    key = token_key(notes(claim)[ADMISSION_ANNOTATION])
    world.created(stored(claim, uid=UID))
    version = world.claims.version(key)
    world.created(stored(claim, uid=UID2, name="copy"))
    assert world.claims.version(key) == version
    world.deleted(stored(claim, uid=UID))
    assert world.reservations.claim_gone(key) is not None and world.claims.version(key) is None


def test_the_token_may_not_be_added_changed_or_removed_later() -> None:
    world = World(GPUS)
    old = stored(gpu_claim())
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {ADMISSION_ANNOTATION: "1" * 32}
    for before, after in ((old, new), (new, old)):
        verdict = update_claim(world.ctx, review_request(after, operation="UPDATE", old=before))
        assert not verdict.allowed and ADMISSION_ANNOTATION in verdict.message


def test_the_admit_endpoint_routes_claim_creates_here_and_mutate_does_not() -> None:
    world = World(GPUS)
    request: AdmissionRequest = review_request(incoming(gpu_claim()), name="")
    # `/mutate` is an earlier release's configuration's: it allows untouched, reserving nothing.
    untouched = run("/mutate", world.ctx, request)
    assert untouched.allowed and not untouched.patch and reserved(world.ctx) == Charge(0, 0)
    assert run("/admit", world.ctx, request).patch
    assert reserved(world.ctx) == Charge(80 * GiB, 1)
    assert NS == "team-a"


def test_the_schedulers_attempts_at_one_pods_claim_replace_each_others_entries() -> None:
    """The mutating phase sees the scheduler's claim before its name is generated: its entry
    is named by the generateName, and the next attempt of the series still replaces it."""
    world = World(make_quota("gpus", devices=2))
    scheduler = {"username": "system:kube-scheduler", "uid": "s", "groups": ["system:authenticated"]}
    attempt = scheduler_attempt("", "")
    del attempt["metadata"]["name"], attempt["metadata"]["uid"]
    for _ in range(4):
        verdict = asyncio.run(admit_claim(world.ctx, review_request(attempt, user=scheduler, name="")))
        assert verdict.allowed
        entries = held(world)
        assert len(entries) == 1
        assert [e["claim"] for e in entries.values()] == ["team-a/train-extended-resources-"]


def test_admissions_under_a_lease_settle_by_their_token() -> None:
    """Far from `hard`, a claim is admitted under this process's lease with no write
    (`kube.leasebook`); its part of the lease settles, by its token, as a uid's does."""
    now = [1_000.0]
    world = World(make_quota("gpus", memory="8000Gi"))  # 100 GPUs
    reservations = Reservations(world.api, world.reservations.ledger, ttl=60.0, progress=world.progress,  # type: ignore[arg-type]
                                clock=lambda: now[0], claim_version=world.claims.version,
                                claim_recorded=world.claims.recorded_version,
                                leases=LeaseBook(Sizing(period=5.0), holder="serve-a"))
    world.claims.deleted = reservations.claim_deleted
    world.ctx = replace(world.ctx, reservations=reservations)

    def create() -> dict[str, Any]:
        claim = patched(incoming(gpu_claim()), mutate(world, incoming(gpu_claim())))
        assert ADMISSION_ANNOTATION in notes(claim)
        return claim

    claims = [create() for _ in range(3)]  # the first is exact (its write grants the lease)
    keys = [token_key(notes(c)[ADMISSION_ANNOTATION]) for c in claims]
    assert set(reservations.leases.leases[(NS, "gpus")].admitted) == set(keys[1:])  # no entries of their own
    world.created(stored(claims[1]))
    now[0] += 10.0  # past the lease's window: the next admission writes, and renewing settles
    create()
    # The claim the cache holds with its charge settled; the one not seen yet still holds its part.
    assert set(reservations.leases.leases[(NS, "gpus")].admitted) == {keys[2]}
    asyncio.run(reservations.close())


SCHEDULER = {"username": "system:kube-scheduler", "uid": "s", "groups": ["system:authenticated"]}


def long_pod_attempt(pod: str) -> dict[str, Any]:
    """The scheduler's claim for Pod `pod`'s extended resources, as the mutating phase sees it."""
    attempt = scheduler_attempt("", "")
    del attempt["metadata"]["name"], attempt["metadata"]["uid"]
    attempt["metadata"]["generateName"] = f"{pod}-extended-resources-"
    attempt["metadata"]["ownerReferences"][0]["name"] = pod
    return attempt


def test_a_long_pod_names_attempts_still_replace_each_other() -> None:
    """A Pod name over 38 characters (a Deployment's `<deployment>-<hash>-<5>` easily is)
    makes a generateName over 58, which the API server and `attempt_series` truncate to 58.
    Were the one-write entry named by the whole generateName, `in_series` would match only
    when the generateName is exactly 63 characters long (len(series) + 5): every attempt
    refused after us would leave its entry until the TTL, the problem `series` solves."""
    pod = "inference-server-llama-70b-q4-7d9f8c6b5d-x2k4p"  # 46 characters
    assert len(f"{pod}-extended-resources-") > 58
    world = World(make_quota("gpus", devices=2))
    for _ in range(3):
        verdict = asyncio.run(admit_claim(world.ctx, review_request(long_pod_attempt(pod), user=SCHEDULER, name="")))
        assert verdict.allowed, verdict.message
    assert len(held(world)) == 1, [e["claim"] for e in held(world).values()]


def test_a_relist_keeps_the_first_claim_carrying_a_token_not_the_first_listed() -> None:
    """"The cache keeps the first claim carrying a token" (docs/development/one-write.md).
    A relist (or a replica starting) reads changed claims' tokens in list order (etcd key
    order: namespace, then name), so a copy that sorts first and changed while the watch was
    down must not take the key from the original. (Benign as far as is known: every carrier
    of a token has a resourceVersion above the original's create, so the original is in any
    cache that reaches the watermark; but the invariant the docs state is the one kept.)"""
    world = World(GPUS)
    claim = patched(incoming(gpu_claim()), mutate(world, incoming(gpu_claim())))
    key = token_key(notes(claim)[ADMISSION_ANNOTATION])
    original = stored(claim, uid=UID, name="zz-original")
    world.created(original)
    version = int(original["metadata"]["resourceVersion"])
    copied = stored(claim, uid=UID2, name="aa-copy")  # written where the Ignore hook was down
    world.created(copied)
    assert world.claims.version(key) == version  # the watch: the copy settles nothing
    relisted = copy.deepcopy(copied)
    relisted["metadata"]["resourceVersion"] = "900"  # the copy changed while the watch was down (a label)
    world.claims.replace([relisted, copy.deepcopy(original)])  # a relist, in etcd's key order
    assert world.claims.version(key) == version


def test_a_claim_no_quota_charges_is_annotated_with_its_charge_but_no_token() -> None:
    """Nothing was reserved, so nothing is to settle: no token for the claim cache to map
    on each of its events."""
    world = World()  # no DeviceQuota anywhere
    claim = patched(incoming(gpu_claim()), mutate(world, incoming(gpu_claim())))
    assert CHARGE_ANNOTATION in notes(claim) and ADMISSION_ANNOTATION not in notes(claim)


def test_a_token_the_creator_wrote_never_survives_an_admission_that_reserved_nothing() -> None:
    """The module doc says every invocation overwrites whatever the object carries, also
    where nothing was reserved (no quota charges the claim, a dry run): a token the creator
    wrote and left in place would be kept there by the annotations guard, a copy of another
    claim's token made without waiting for the Ignore hook to be down."""
    for world, dry_run in ((World(), False), (World(GPUS), True)):
        forged = incoming(gpu_claim())
        forged["metadata"]["annotations"] = {ADMISSION_ANNOTATION: "0" * 32, "keep": "me"}
        verdict = mutate(world, forged, dry_run=dry_run)
        assert verdict.allowed
        claim = patched(forged, verdict)
        assert ADMISSION_ANNOTATION not in notes(claim) and notes(claim)["keep"] == "me"
