"""webhook.usagemetrics: the usage families as a scrape shows them, over caches fed by the stores.

The caches are the webhook's own (`kube.caches` stores into an `Admitter`'s ledger,
`quota.accounting.usage.Holders`, `kube.quotawriter.Reservations` observing DeviceQuotas), built
from plain dicts; every expectation is derived from the fixture's devices and claims.
The real process is scraped in tests/e2e/test_usage_metrics.py.
"""

from __future__ import annotations

import itertools

import copy
from datetime import datetime, timezone
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis import given
from prometheus_client.parser import text_string_to_metric_families

from kube.caches import ClassStore, QuotaStore, SliceStore
from kube.claimstore import ClaimStore
from kube.quotawriter import Reservations
from quota.accounting.ledger import Ledger
from quota.accounting.usage import Holders
from quota.admission.admitter import Admitter
from quota.devices.inventory import Inventory
from quota.objects.claims import parse_claim
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import parse_cluster_device_quota
from quota.status.breakdown import DEFAULT_SERIES, OTHER
from quota.values.model import DeviceClass, DeviceClassName, Namespace
from quota.values.work import pausing
from runtime.metricnames import (
    CLAIM_DEVICE_INFO,
    CLUSTER_QUOTA,
    CLUSTER_QUOTA_NAMESPACE,
    INVENTORY_ALLOCATED,
    INVENTORY_DEVICES,
    INVENTORY_MEMORY,
    LEADER,
    NAMES,
    NAMESPACE_USAGE,
    PENDING_CLAIMS,
    QUOTA,
    WORKLOADS_RESERVED,
)
from webhook.metrics import Metrics
from webhook.usagemetrics import DEVICE_INFO_LABELS, UsageMetrics

from ..builders import (
    GiB,
    exactly,
    make_class,
    make_claim,
    make_cluster_quota,
    make_device,
    make_quota,
    make_slice,
    request,
    result,
)

D = "gpu.nvidia.com"
A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
NOW = 1_000.0
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def devices(product: str = A100) -> list[dict[str, Any]]:
    gpus = [make_device(f"gpu-{i}", memory="80Gi", attrs={"type": "gpu", "productName": product,
                                                          "uuid": f"GPU-{i}"}) for i in range(3)]
    mig = make_device("gpu-3-mig-1", memory="10Gi", attrs={"type": "mig", "productName": product, "uuid": "MIG-31",
                                                           "parentUUID": "GPU-3", "profile": "1g.10gb"})
    return [*gpus, mig]


_VERSIONS = itertools.count(1)


def claim(name: str, uid: str, *allocated: str, pods: tuple[str, ...] = (), cls: str = "gpu",
          admin: bool = False, namespace: str = "team-a") -> dict[str, Any]:
    obj = make_claim(name, request("r", exactly(cls, admin=admin)), namespace=namespace,
                     allocation=[result("r", d, driver=D, admin=admin) for d in allocated] if allocated else None)
    obj["metadata"]["uid"] = uid
    obj["metadata"]["resourceVersion"] = str(next(_VERSIONS))  # as every claim the API server stores
    if pods:
        obj.setdefault("status", {})["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods]
    return obj


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


class World:
    def __init__(self, *, leading: bool = True, team_series: int = DEFAULT_SERIES) -> None:
        self.inventory = Inventory()
        self.classes: dict[DeviceClassName, DeviceClass] = {}
        self.admitter = Admitter(Pricer(self.inventory, self.classes), Ledger())
        # No API: only what the watch delivers (`observe`) is read, nothing is written.
        self.holders = Holders()
        self.claims = ClaimStore(self.admitter, holders=self.holders)
        self.reservations = Reservations(None, self.admitter.ledger, ttl=60.0,  # type: ignore[arg-type]
                                         clock=lambda: NOW, claim_version=self.claims.version)
        self.claims.deleted = self.reservations.claim_deleted
        self.slices = SliceStore(self.inventory)
        self.quotas = QuotaStore(self.admitter, observe=self.reservations.observe)
        self.slices.replace([make_slice("n1", devices(), driver=D)])
        ClassStore(self.classes).replace([make_class("gpu", f"device.attributes['{D}'].type == 'gpu'"),
                                          make_class("mig", f"device.attributes['{D}'].type == 'mig'")])
        self.leading = leading
        self.metrics = Metrics()
        UsageMetrics(self.admitter.ledger, self.inventory, self.holders, pending=self.reservations.pending,
                     leading=lambda: self.leading, team_series=team_series).register(self.metrics)

    def scrape(self) -> Samples:
        return scrape(self.metrics)


def scrape(metrics: Metrics) -> Samples:
    text = metrics.exposition().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def family(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def quota_sample(resource: str, kind: str, quota: str = "gpus") -> frozenset[tuple[str, str]]:
    return frozenset({"namespace": "team-a", "quota": quota, "resource": resource, "type": kind}.items())


def test_every_name_is_listed() -> None:
    for name in (LEADER, QUOTA, NAMESPACE_USAGE, INVENTORY_DEVICES, INVENTORY_MEMORY, INVENTORY_ALLOCATED,
                 CLAIM_DEVICE_INFO):
        assert name in NAMES


def test_quota_shows_hard_used_and_reserved_counting_each_claim_once() -> None:
    world = World()
    quota = make_quota("gpus", memory="400Gi", devices=8)
    held_uid, persisted_uid = "u-pending", "u-not-yet-seen"
    quota["status"] = {"reservations": {
        # The pending claim's own entry: the cache holds its claim, so it counts once, there.
        held_uid: {"claim": "team-a/pending", "memory": 80 * GiB, "devices": 1, "expires": stamp(NOW + 30)},
        # Admitted by some replica, its claim not in this cache yet: counts here.
        persisted_uid: {"claim": "team-a/new", "memory": 20 * GiB, "devices": 2, "expires": stamp(NOW + 30)},
        "u-expired": {"claim": "team-a/old", "memory": 80 * GiB, "devices": 1, "expires": stamp(NOW - 1)},
        "u-deleted": {"claim": "team-a/gone", "memory": 80 * GiB, "devices": 1, "expires": stamp(NOW + 30)},
    }}
    world.quotas.replace([quota, make_quota("migs", memory="1Ti", classes=["mig"])])
    world.claims.replace([claim("one", "u1", "gpu-0", pods=("p1",)), claim("mig", "u2", "gpu-3-mig-1", cls="mig"),
                          claim("pending", held_uid)])
    world.claims.delete(claim("gone", "u-deleted"))
    samples = family(world.scrape(), QUOTA)
    gpu, mig = 80 * GiB, 10 * GiB
    assert samples == {
        quota_sample("memory", "hard"): 400 * GiB,
        quota_sample("devices", "hard"): 8,
        quota_sample("memory", "used"): gpu + mig,
        quota_sample("devices", "used"): 2,
        quota_sample("memory", "reserved"): gpu + 20 * GiB,
        quota_sample("devices", "reserved"): 1 + 2,
        # Scoped to class mig: only the MIG claim; no devices limit, so no hard sample for it.
        quota_sample("memory", "hard", "migs"): 1024 * GiB,
        quota_sample("memory", "used", "migs"): mig,
        quota_sample("devices", "used", "migs"): 1,
        quota_sample("memory", "reserved", "migs"): 0,
        quota_sample("devices", "reserved", "migs"): 0,
    }
    # Once this cache holds the persisted claim, its entry stops counting: the claim does.
    world.claims.upsert(claim("new", persisted_uid))
    assert family(world.scrape(), QUOTA)[quota_sample("memory", "reserved")] == 2 * gpu


def test_namespace_usage_covers_namespaces_without_a_quota_and_follows_changes() -> None:
    world = World()
    world.claims.replace([claim("one", "u1", "gpu-0"), claim("two", "u2"),
                          claim("elsewhere", "u3", "gpu-1", namespace="team-b")])

    def usage() -> dict[tuple[str, str, str, str], float]:
        return {(d["namespace"], d["device_class"], d["resource"], d["state"]): v
                for labels, v in family(world.scrape(), NAMESPACE_USAGE).items() for d in [dict(labels)]}

    assert usage() == {
        ("team-a", "gpu", "memory", "allocated"): 80 * GiB, ("team-a", "gpu", "devices", "allocated"): 1,
        ("team-a", "gpu", "memory", "reserved"): 80 * GiB, ("team-a", "gpu", "devices", "reserved"): 1,
        ("team-b", "gpu", "memory", "allocated"): 80 * GiB, ("team-b", "gpu", "devices", "allocated"): 1,
    }
    pending = {dict(labels)["namespace"]: v for labels, v in family(world.scrape(), PENDING_CLAIMS).items()}
    assert pending == {"team-a": 1, "team-b": 0}  # "two" waits for the scheduler
    # A cached namespace must not keep stale samples: allocate "two", delete team-b's claim.
    world.claims.upsert(claim("two", "u2", "gpu-2"))
    world.claims.delete(claim("elsewhere", "u3", namespace="team-b"))
    assert usage() == {("team-a", "gpu", "memory", "allocated"): 2 * 80 * GiB,
                       ("team-a", "gpu", "devices", "allocated"): 2}
    assert family(world.scrape(), PENDING_CLAIMS) == {frozenset({("namespace", "team-a")}): 0}


def info(namespace: str, claim_name: str, pod: str, device: str, uuid: str, profile: str = "", *,
         model: str = A100) -> frozenset[tuple[str, str]]:
    values = (namespace, claim_name, pod, D, "node-1", device, model, uuid, profile)
    return frozenset(zip(DEVICE_INFO_LABELS, values, strict=True))


def test_device_info_names_each_held_device_its_claim_pod_and_dcgm_uuid() -> None:
    world = World()
    world.claims.replace([
        claim("two-pods", "u1", "gpu-0", pods=("a", "b")),
        claim("mig", "u2", "gpu-3-mig-1", cls="mig", pods=("m",)),
        claim("no-pod-yet", "u3", "gpu-1"),
        claim("monitor", "u4", "gpu-2", admin=True, pods=("watcher",)),  # adminAccess: left out
        claim("pending", "u5"),
    ])
    assert family(world.scrape(), CLAIM_DEVICE_INFO) == {
        info("team-a", "two-pods", "a", "gpu-0", "GPU-0"): 1,
        info("team-a", "two-pods", "b", "gpu-0", "GPU-0"): 1,
        info("team-a", "mig", "m", "gpu-3-mig-1", "GPU-3", "1g.10gb"): 1,
        info("team-a", "no-pod-yet", "", "gpu-1", "GPU-1"): 1,
    }
    # Changes re-render only what moved, and nothing stale stays.
    world.claims.upsert(claim("no-pod-yet", "u3", "gpu-1", pods=("late",)))
    world.claims.delete(claim("two-pods", "u1"))
    assert set(family(world.scrape(), CLAIM_DEVICE_INFO)) == {
        info("team-a", "mig", "m", "gpu-3-mig-1", "GPU-3", "1g.10gb"),
        info("team-a", "no-pod-yet", "late", "gpu-1", "GPU-1"),
    }
    # A driver republishing its devices (a new model, say) relabels the held ones.
    world.slices.upsert(make_slice("n1", devices(H100), driver=D, generation=2))
    scraped = world.scrape()
    assert info("team-a", "no-pod-yet", "late", "gpu-1", "GPU-1", model=H100) in family(scraped, CLAIM_DEVICE_INFO)
    assert {dict(k)["model"] for k in family(scraped, INVENTORY_DEVICES)} == {H100}


def test_inventory_by_model_and_profile() -> None:
    world = World()
    world.claims.replace([claim("one", "u1", "gpu-0"), claim("again", "u2", "gpu-0"),
                          claim("monitor", "u4", "gpu-2", admin=True)])
    scraped = world.scrape()

    def by_model(name: str) -> dict[str, float]:
        return {dict(k)["profile"]: v for k, v in family(scraped, name).items()
                if dict(k)["driver"] == D and dict(k)["model"] == A100}

    assert by_model(INVENTORY_DEVICES) == {"": 3, "1g.10gb": 1}
    assert by_model(INVENTORY_MEMORY) == {"": 3 * 80 * GiB, "1g.10gb": 10 * GiB}
    assert by_model(INVENTORY_ALLOCATED) == {"": 1, "1g.10gb": 0}  # gpu-0 once; adminAccess not taken
    # Kept incrementally: gpu-0 stays held while one of its two claims remains.
    world.claims.delete(claim("one", "u1"))
    scraped = world.scrape()
    assert by_model(INVENTORY_ALLOCATED) == {"": 1, "1g.10gb": 0}
    world.claims.upsert(claim("mig", "u5", "gpu-3-mig-1", cls="mig"))
    world.claims.delete(claim("again", "u2"))
    scraped = world.scrape()
    assert by_model(INVENTORY_ALLOCATED) == {"": 0, "1g.10gb": 1}


def test_only_the_leader_exports_usage() -> None:
    world = World(leading=False)
    world.quotas.replace([make_quota("gpus", memory="400Gi")])
    with_team(world)
    world.claims.replace([claim("one", "u1", "gpu-0", pods=("p",))])
    follower = world.scrape()
    assert family(follower, LEADER) == {frozenset(): 0}
    usage = (QUOTA, NAMESPACE_USAGE, INVENTORY_DEVICES, INVENTORY_MEMORY, INVENTORY_ALLOCATED, CLAIM_DEVICE_INFO,
             PENDING_CLAIMS, CLUSTER_QUOTA, CLUSTER_QUOTA_NAMESPACE)
    assert not [key for key in follower if key[0] in usage]
    world.leading = True
    leader = world.scrape()
    assert family(leader, LEADER) == {frozenset(): 1}
    assert {name for name, _ in leader} >= set(usage)


def test_label_values_are_escaped() -> None:
    world = World()
    odd = claim("c", "u1", "gpu-0")
    odd["status"]["reservedFor"] = [{"resource": "pods", "name": 'quote"back\\slash\nnewline'}]
    world.claims.replace([copy.deepcopy(odd)])
    [labels] = family(world.scrape(), CLAIM_DEVICE_INFO)
    assert dict(labels)["pod"] == 'quote"back\\slash\nnewline'


_DEVICES = ("gpu-0", "gpu-1", "gpu-2", "gpu-3-mig-1")
_step = st.tuples(
    st.sampled_from(["upsert", "delete", "republish"]),
    st.integers(0, 4),  # which claim
    st.lists(st.sampled_from(_DEVICES), max_size=2, unique=True),  # its devices (none: pending)
    st.lists(st.sampled_from(["p1", "p2"]), max_size=2, unique=True),  # its pods
    st.booleans(),  # adminAccess
)


def usage(samples: Samples) -> Samples:
    names = (LEADER, QUOTA, NAMESPACE_USAGE, INVENTORY_DEVICES, INVENTORY_MEMORY, INVENTORY_ALLOCATED,
             CLAIM_DEVICE_INFO, CLUSTER_QUOTA, CLUSTER_QUOTA_NAMESPACE)
    return {key: value for key, value in samples.items() if key[0] in names}


@settings(max_examples=40, deadline=None)
@given(st.lists(_step, max_size=12))
def test_the_kept_views_equal_a_fresh_scrape_after_any_changes(steps: list[tuple[str, int, list[str], list[str],
                                                                                  bool]]) -> None:
    """Caching per namespace, per claim and per inventory generation never serves a stale sample."""
    world = World()
    world.quotas.replace([make_quota("gpus", memory="1Ti")])
    with_team(world)
    generation = [1]
    for step in steps:
        _apply(world, generation, step)
        assert usage(world.scrape()) == usage(fresh_scrape(world))


def _apply(world: World, generation: list[int], step: tuple[str, int, list[str], list[str], bool]) -> None:
    """One claim or slice event of `_step` (`generation`: the slice's, counted up)."""
    op, index, held, pods, admin = step
    name, uid = f"c{index}", f"u{index}"
    namespace = "team-a" if index % 2 else "team-b"
    if op == "upsert":
        world.claims.upsert(claim(name, uid, *held, pods=tuple(pods), admin=admin, namespace=namespace))
    elif op == "delete":
        world.claims.delete(claim(name, uid, namespace=namespace))
    else:
        generation[0] += 1
        world.slices.upsert(make_slice("n1", devices(H100 if generation[0] % 2 else A100), driver=D,
                                       generation=generation[0]))


def fresh_scrape(world: World) -> Samples:
    fresh = Metrics()
    UsageMetrics(world.admitter.ledger, world.inventory, world.holders,
                 pending=world.reservations.pending).register(fresh)
    return scrape(fresh)


@settings(max_examples=40, deadline=None)
@given(st.lists(_step, max_size=6), st.lists(_step, min_size=1, max_size=12), st.integers(1, 5))
def test_events_between_the_slices_of_a_scrape_are_in_the_next_one(
        before: list[tuple[str, int, list[str], list[str], bool]],
        during: list[tuple[str, int, list[str], list[str], bool]], every: int) -> None:
    """`serve` renders a scrape in slices (`kube.rebuilds`) and claim and slice events
    land between them: the scrape still completes and parses, and the next one serves no
    stale sample."""
    world = World()
    world.quotas.replace([make_quota("gpus", memory="1Ti")])
    with_team(world)
    generation = [1]
    for step in before:
        _apply(world, generation, step)
    world.scrape()  # the kept views are built: the events below make them stale
    pending, pauses = list(during), [0]

    def pause() -> None:
        pauses[0] += 1
        if pending and pauses[0] % every == 0:
            _apply(world, generation, pending.pop(0))

    with pausing(pause):
        text = world.metrics.exposition().decode()
    assert pauses[0] > 0
    list(text_string_to_metric_families(text))  # well-formed
    for step in pending:
        _apply(world, generation, step)
    assert usage(world.scrape()) == usage(fresh_scrape(world))


def test_what_kueue_workloads_hold_is_its_own_series_and_part_of_reserved() -> None:
    world = World()
    world.quotas.replace([make_quota("gpus", memory="400Gi")])
    entry = world.admitter.workload_entry(
        "team-a", "w-1", [(parse_claim(make_claim("t", request("gpu", exactly("gpu", count=2)),  # type: ignore[arg-type]
                                                  kind="ResourceClaimTemplate")), 1)])
    assert not isinstance(entry, str)
    world.admitter.ledger.set_holding(entry)
    samples = world.scrape()
    held = family(samples, WORKLOADS_RESERVED)
    labels = frozenset({"namespace": "team-a", "quota": "gpus", "resource": "memory"}.items())
    assert held[labels] == 2 * 80 * GiB
    assert family(samples, QUOTA)[quota_sample("memory", "reserved")] == 2 * 80 * GiB


# -- team quotas (ClusterDeviceQuotas) --------------------------------------------------------

ML, CV = {"team.draquota.io/name": "ml"}, {"team.draquota.io/name": "cv"}


def with_team(world: World) -> None:
    """team-a and team-b in team "ml" (640Gi, 8 devices), team-c in "cv" (2 devices, no memory
    limit): told to the ledger directly, as the Namespace and ClusterDeviceQuota caches tell it."""
    for namespace, labels in (("team-a", ML), ("team-b", ML), ("team-c", CV)):
        world.admitter.ledger.set_namespace(Namespace(namespace), labels)
    for obj in (make_cluster_quota("ml", memory="640Gi", devices=8), make_cluster_quota("cv", devices=2)):
        world.admitter.add_or_update_quota(parse_cluster_device_quota(obj))


def teams_world(**kwargs: Any) -> World:
    """`with_team`, and team-a's own DeviceQuota. Claims: team-a one allocated GPU and one
    pending, team-b one allocated, team-c one pending."""
    world = World(**kwargs)
    world.quotas.replace([make_quota("gpus", memory="400Gi")])
    with_team(world)
    world.claims.replace([claim("one", "u1", "gpu-0"), claim("wait", "u2"),
                          claim("two", "u3", "gpu-1", namespace="team-b"), claim("three", "u4", namespace="team-c")])
    return world


def team_samples(samples: Samples, name: str) -> dict[tuple[str, ...], float]:
    keys = ("quota", "resource", "type") if name == CLUSTER_QUOTA else ("quota", "namespace", "resource", "type")
    return {tuple(dict(labels)[k] for k in keys): value for labels, value in family(samples, name).items()}


def test_a_team_quota_shows_its_totals_and_each_namespace_it_selects() -> None:
    samples = teams_world().scrape()
    gpu = 80 * GiB
    assert team_samples(samples, CLUSTER_QUOTA) == {
        ("ml", "memory", "hard"): 640 * GiB, ("ml", "devices", "hard"): 8,
        ("ml", "memory", "used"): 2 * gpu, ("ml", "devices", "used"): 2,
        ("ml", "memory", "reserved"): gpu, ("ml", "devices", "reserved"): 1,
        ("cv", "devices", "hard"): 2,  # no memory limit: no hard sample for it
        ("cv", "memory", "used"): 0, ("cv", "devices", "used"): 0,
        ("cv", "memory", "reserved"): gpu, ("cv", "devices", "reserved"): 1,
    }
    assert team_samples(samples, CLUSTER_QUOTA_NAMESPACE) == {
        ("ml", "team-a", "memory", "used"): gpu, ("ml", "team-a", "devices", "used"): 1,
        ("ml", "team-a", "memory", "reserved"): gpu, ("ml", "team-a", "devices", "reserved"): 1,
        ("ml", "team-b", "memory", "used"): gpu, ("ml", "team-b", "devices", "used"): 1,
        ("ml", "team-b", "memory", "reserved"): 0, ("ml", "team-b", "devices", "reserved"): 0,
        ("cv", "team-c", "memory", "used"): 0, ("cv", "team-c", "devices", "used"): 0,
        ("cv", "team-c", "memory", "reserved"): gpu, ("cv", "team-c", "devices", "reserved"): 1,
    }
    # draquota_quota stays per DeviceQuota: the teams are not in it under namespace "".
    assert {dict(labels)["namespace"] for labels in family(samples, QUOTA)} == {"team-a"}
    assert not [labels for labels in family(samples, WORKLOADS_RESERVED) if dict(labels)["namespace"] != "team-a"]


def test_a_team_past_the_series_cap_shows_its_largest_namespaces_and_the_rest_as_other() -> None:
    world = teams_world(team_series=1)
    samples = world.scrape()
    gpu = 80 * GiB
    parts = team_samples(samples, CLUSTER_QUOTA_NAMESPACE)
    # ml: team-a (1 used + 1 reserved) outranks team-b (1 used); cv's one member is within the cap.
    assert parts == {
        ("ml", "team-a", "memory", "used"): gpu, ("ml", "team-a", "devices", "used"): 1,
        ("ml", "team-a", "memory", "reserved"): gpu, ("ml", "team-a", "devices", "reserved"): 1,
        ("ml", OTHER, "memory", "used"): gpu, ("ml", OTHER, "devices", "used"): 1,
        ("ml", OTHER, "memory", "reserved"): 0, ("ml", OTHER, "devices", "reserved"): 0,
        ("cv", "team-c", "memory", "used"): 0, ("cv", "team-c", "devices", "used"): 0,
        ("cv", "team-c", "memory", "reserved"): gpu, ("cv", "team-c", "devices", "reserved"): 1,
    }
    totals = team_samples(samples, CLUSTER_QUOTA)
    for resource, kind in itertools.product(("memory", "devices"), ("used", "reserved")):
        assert sum(v for (q, _, r, t), v in parts.items() if (q, r, t) == ("ml", resource, kind)) == \
            totals[("ml", resource, kind)]
    # team-b grows past team-a (3 devices to 2): the two swap at the next scrape.
    world.claims.replace([claim("one", "u1", "gpu-0"), claim("wait", "u2"), claim("two", "u3", "gpu-1",
                          namespace="team-b"), claim("more", "u5", "gpu-2", namespace="team-b"),
                          claim("soon", "u6", namespace="team-b"), claim("three", "u4", namespace="team-c")])
    assert {ns for q, ns, _, _ in team_samples(world.scrape(), CLUSTER_QUOTA_NAMESPACE) if q == "ml"} == \
        {"team-b", OTHER}


def test_a_relabel_moves_a_namespaces_series_between_teams() -> None:
    world = teams_world()
    world.scrape()
    world.admitter.ledger.set_namespace(Namespace("team-b"), CV)
    samples = world.scrape()
    parts = team_samples(samples, CLUSTER_QUOTA_NAMESPACE)
    assert {(q, ns) for q, ns, _, _ in parts} == {("ml", "team-a"), ("cv", "team-b"), ("cv", "team-c")}
    assert parts[("cv", "team-b", "memory", "used")] == 80 * GiB
    totals = team_samples(samples, CLUSTER_QUOTA)
    assert (totals[("ml", "memory", "used")], totals[("cv", "memory", "used")]) == (80 * GiB, 80 * GiB)
    # Out of every team: no series left for it.
    world.admitter.ledger.set_namespace(Namespace("team-b"), {})
    assert {ns for _, ns, _, _ in team_samples(world.scrape(), CLUSTER_QUOTA_NAMESPACE)} == {"team-a", "team-c"}


def test_quota_hard_is_the_hard_in_force_of_its_windows() -> None:
    world = World()
    always = {"name": "always", "hard": {"memory": "800Gi"}, "start": "2000-01-01T00:00:00Z",
              "end": "2100-01-01T00:00:00Z"}  # open whenever this test runs: the metric reads the wall clock
    world.quotas.replace([make_quota("gpus", memory="400Gi", devices=8, windows=[always])])
    samples = family(world.scrape(), QUOTA)
    assert samples[quota_sample("memory", "hard")] == 800 * GiB
    assert samples[quota_sample("devices", "hard")] == 8  # the window leaves devices at spec.hard's
