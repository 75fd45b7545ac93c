"""200 claims the real scheduler allocates over a mixed fleet, accounted by `dra-quota serve`.

The fleet is published as the NVIDIA driver would (tests/e2e/driver.py: fake nodes, no
kubelet): whole GPUs of three models, partitionable GPUs whose MIG devices draw on
per-GPU counter sets (one `memory-slice-<i>` counter per eighth of the GPU, as dynamic MIG
publishes them: the counters in one slice of the node's pool, the devices in another),
and shared GPUs whose memory is consumable capacity (`allowMultipleAllocations` with a
`requestPolicy` that rounds a request up to 4Gi steps). Pods get their claims from
templates (the real resourceclaim controller creates them, through our webhooks) and the
real scheduler allocates them; one standalone claim no pod uses stays pending.

What is checked, every expectation computed here from the allocations the API server
holds and the slices this test wrote, never through the product's pricing code: `used`
equals the sum of the allocated devices' charges (and each template's claims cost the
literal amount its slice definitions imply); the delay from an allocation, as this test's
claim watch receives it, to the first DeviceQuota status (from a second watch) covering
every allocation seen by then, recorded (the target is p99 <= 1 s on a quiet machine;
tests/e2e/timings.py, bench/e2e_timings.py: never asserted, a busy machine must not fail
the test), with one delay per allocation; deleting 148 of the pods frees their claims
and `used` drops to exactly the remaining claims' charges; and `/metrics`
(`draquota_quota`, `draquota_namespace_device_usage`), scraped over HTTP, agrees with the
DeviceQuota status at both converged states. The time of one scrape with the 200 claims
is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio

from devcluster.served import metrics_reader_token
from kube.api import Resource
from kube.watching import Reflector
from runtime.metricnames import NAMESPACE_USAGE, QUOTA

from .cluster import ControlPlane, free_ports
from .driver import (
    DRIVER, RESOURCE_V1, Gpu, GpuFleet, claim_spec, create_claim, create_claim_template, create_device_class,
    create_node, create_pod, exact_request, publish_node_slice,
)
from .harness import DQ, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, installed, running
from .kube import Kube, Obj, WaitTimeout, poll
from .timings import record

ORPHAN_TTL = 30.0  # seconds (serve --reservation-ttl)

pytestmark = pytest.mark.e2e

RUN = uuid.uuid4().hex[:8]
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40
_UNITS = {"Ki": KiB, "Mi": MiB, "Gi": GiB, "Ti": TiB, "Pi": 2**50, "Ei": 2**60}


def product(model: str) -> str:
    """Unique to this run, so this test's classes see only its own devices."""
    return f"{model} e2e-{RUN}"


H100, A100, H200 = product("NVIDIA H100 80GB HBM3"), product("NVIDIA A100-SXM4-40GB"), product("NVIDIA H200")
MIG_GPU, SHARED_GPU = product("NVIDIA A100-SXM4-80GB"), product("NVIDIA L40S")
# What the slices below publish (bytes): the literal numbers the checks are made of.
MIG_1G, MIG_3G = 9856 * MiB, 40192 * MiB
SHARED_MEMORY, SHARE_STEP = 48 * GiB, 4 * GiB
ALLOCATE_TIMEOUT = 180.0
P99_TARGET = 1.0  # seconds: recorded beside the measured p99, never asserted


def quantity(value: object) -> int:
    """Bytes of a binary-suffixed or plain quantity, as the API server and the controller write
    them here; anything else fails the test (deliberately not the product's parser)."""
    text = str(value)
    if text[-2:] in _UNITS:
        return int(text[:-2]) * _UNITS[text[-2:]]
    return int(text)


# -- the fleet ----------------------------------------------------------------------------------


def attrs(**values: str) -> Obj:
    return {k: {"string": v} for k, v in values.items()}


def mig_devices(node: str, gpus: int) -> tuple[Obj, list[Obj]]:
    """Counter sets and MIG devices of `gpus` partitionable A100-80GB: per GPU seven 1g.10gb
    (one memory slice each, at placements 0..6) and two 3g.40gb (slices 0-3 and 4-7), so a
    3g device and a 1g device on the same slices exclude each other."""
    counter_sets, devices = [], []
    for g in range(gpus):
        parent = f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{node}/{g}')}"
        counter_set = f"gpu-{g}-counter-set"
        counter_sets.append({"name": counter_set, "counters": {f"memory-slice-{i}": {"value": "1"} for i in range(8)}})
        for profile, profile_id, memory, starts, size in (("1g.10gb", 19, MIG_1G, range(7), 1),
                                                         ("3g.40gb", 9, MIG_3G, (0, 4), 4)):
            for start in starts:
                devices.append({
                    "name": f"gpu-{g}-mig-{profile_id}-{start}-{size}",
                    "attributes": attrs(type="mig", productName=MIG_GPU, profile=profile, parentUUID=parent,
                                        uuid=f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{node}/{g}/{start}/{size}')}"),
                    "capacity": {"memory": {"value": f"{memory // MiB}Mi"}},
                    "consumesCounters": [{"counterSet": counter_set, "counters": {
                        f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)}}],
                })
    return {"sharedCounters": counter_sets}, devices


def shared_devices(node: str, gpus: int) -> list[Obj]:
    """GPUs whose memory is shared out in 4Gi steps (4Gi when a claim asks for nothing)."""
    return [{
        "name": f"gpu-{g}",
        "attributes": attrs(type="gpu", productName=SHARED_GPU, uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{node}/{g}')}"),
        "allowMultipleAllocations": True,
        "capacity": {"memory": {"value": "48Gi", "requestPolicy": {
            "default": "4Gi", "validRange": {"min": "4Gi", "step": "4Gi"}}}},
    } for g in range(gpus)]


@dataclass(frozen=True)
class Template:
    """A ResourceClaimTemplate, how many pods use it, and what each claim must cost (literal)."""

    name: str
    kind: str  # whole | mig | shared: which of this test's classes
    pods: int
    memory: int
    devices: int = 1
    count: int = 1
    selector: str = ""
    request: str | None = None  # capacity.requests.memory


def attribute_is(name: str, value: str) -> str:
    return f'device.attributes["{DRIVER}"].{name} == "{value}"'


TEMPLATES = (
    Template("h100", "whole", 30, 80 * GiB, selector=attribute_is("productName", H100)),
    Template("a100-pair", "whole", 20, 2 * 40 * GiB, devices=2, count=2, selector=attribute_is("productName", A100)),
    Template("h200", "whole", 30, 141 * GiB, selector=attribute_is("productName", H200)),
    Template("mig-1g", "mig", 60, MIG_1G, selector=attribute_is("profile", "1g.10gb")),
    Template("mig-3g", "mig", 20, MIG_3G, selector=attribute_is("profile", "3g.40gb")),
    Template("share-6g", "shared", 20, 8 * GiB, request="6Gi"),  # rounded up to the next 4Gi step
    Template("share-10g", "shared", 15, 12 * GiB, request="10Gi"),
    Template("share-default", "shared", 5, 4 * GiB),  # nothing asked: the policy's default
)
PODS = sum(t.pods for t in TEMPLATES)
# Admitted and used by no pod: never allocated, reserved at the conservative estimate,
# two of the largest candidates (every H200 is 141Gi).
WAITING = Template("waiting", "whole", 0, 2 * 141 * GiB, devices=2, count=2, selector=attribute_is("productName", H200))


@dataclass
class Fleet:
    served: Served
    namespace: str
    gpus: GpuFleet
    classes: dict[str, str]
    devices: dict[tuple[str, str], Obj]  # (pool, device) -> as published

    def spec(self, template: Template) -> Obj:
        request = exact_request("gpu", self.classes[template.kind], count=template.count,
                                selectors=[template.selector] if template.selector else ())
        if template.request is not None:
            request["exactly"]["capacity"] = {"requests": {"memory": template.request}}
        return claim_spec(request)


async def publish(kube: Kube, gpus: GpuFleet, node: str, slices: list[Obj]) -> None:
    """A pool of several slices on `node` (only the MIG nodes need two: counters and devices)."""
    for i, spec in enumerate(slices):
        name = f"{node}-{DRIVER}-{i}"
        await kube.create(RESOURCE_V1, "resourceslices", {"kind": "ResourceSlice", "metadata": {"name": name}, "spec": {
            "driver": DRIVER, "pool": {"name": node, "generation": 1, "resourceSliceCount": len(slices)},
            "nodeName": node, **spec}})
        gpus.slices.append(name)


async def build_fleet(kube: Kube, gpus: GpuFleet) -> dict[tuple[str, str], Obj]:
    published: dict[tuple[str, str], Obj] = {}
    for model, memory, nodes in ((H100, "80Gi", 4), (A100, "40Gi", 5), (H200, "141Gi", 4)):
        for n in range(nodes):
            node = await gpus.add_node(f"{model.split()[1].lower()}-{n}", [Gpu(model, memory)] * 8)
            published.update(((node, d["name"]), d) for d in (await kube.get(
                RESOURCE_V1, "resourceslices", gpus.slices[-1]))["spec"]["devices"])
    for n in range(6):
        node = f"{gpus.prefix}-mig-{n}"
        await create_node(kube, node, labels=gpus.node_selector)
        gpus.nodes.append(node)
        counters, devices = mig_devices(node, 4)
        await publish(kube, gpus, node, [counters, {"devices": devices}])
        published.update(((node, d["name"]), d) for d in devices)
    for n in range(2):
        node = f"{gpus.prefix}-shared-{n}"
        await create_node(kube, node, labels=gpus.node_selector)
        gpus.nodes.append(node)
        devices = shared_devices(node, 6)
        gpus.slices.append((await publish_node_slice(kube, node, devices))["metadata"]["name"])
        published.update(((node, d["name"]), d) for d in devices)
    return published


@pytest_asyncio.fixture(loop_scope="session")
async def fleet(cluster: ControlPlane, kube: Kube, crd: None, tmp_path: Path,
                make_namespace: MakeNamespace, make_fleet: MakeFleet) -> AsyncIterator[Fleet]:
    """Fleet, classes, namespace and DeviceQuotas first, then the process: its readiness
    means all of them are in its caches."""
    gpus = await make_fleet("fleet")
    ours = f'device.attributes["{DRIVER}"].productName.endsWith("e2e-{RUN}")'
    classes = {kind: f"{gpus.prefix}-{kind}" for kind in ("whole", "mig", "shared")}
    try:
        await create_device_class(kube, classes["whole"], extra_cel=f"!device.allowMultipleAllocations && {ours}")
        await create_device_class(kube, classes["shared"], extra_cel=f"device.allowMultipleAllocations && {ours}")
        await kube.create(RESOURCE_V1, "deviceclasses", {"kind": "DeviceClass", "metadata": {"name": classes["mig"]},
                          "spec": {"selectors": [{"cel": {"expression": (
                              f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "mig" && {ours}')}}]}})
        published = await build_fleet(kube, gpus)
        namespace = await make_namespace("fleet", labels={RUN_LABEL: RUN})
        for name, spec in (("all", {"hard": {"memory": "100Ti", "devices": 1000}}),
                           ("mig", {"hard": {"memory": "10Ti"}, "deviceClassNames": [classes["mig"]]})):
            await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": name}, "spec": spec},
                              namespace=namespace)
        port, metrics_port = free_ports(2)
        # A TTL shorter than the convergence wait below: an admission whose create failed after
        # our answer (a busy API server) holds its room until then, as it should.
        async for served in running(Served(cluster, port, tmp_path / "serve.log", metrics_port=metrics_port,
                                           args=("--reservation-ttl", str(ORPHAN_TTL)))):
            async with installed(kube, adapted_webhooks(RUN, served.port, cluster)):
                yield Fleet(served, namespace, gpus, classes, published)
    finally:
        for cls in classes.values():
            await kube.delete(RESOURCE_V1, "deviceclasses", cls)


# -- watching, timestamped on receipt -----------------------------------------------------------


@dataclass
class Claims:
    """Claims of the namespace as a watch delivers them; when each was first seen allocated."""

    objects: dict[str, Obj] = field(default_factory=dict)
    allocated_at: dict[str, float] = field(default_factory=dict)

    def replace(self, objects: list[Obj]) -> None:
        self.objects.clear()
        for obj in objects:
            self.upsert(obj)

    def upsert(self, obj: Obj) -> None:
        uid = obj["metadata"]["uid"]
        self.objects[uid] = obj
        if is_allocated(obj):
            self.allocated_at.setdefault(uid, time.monotonic())

    def delete(self, obj: Obj) -> None:
        self.objects.pop(obj["metadata"]["uid"], None)


@dataclass
class Quotas:
    """Every status of each DeviceQuota the watch delivers: (received, used memory, used devices)."""

    objects: dict[str, Obj] = field(default_factory=dict)
    used: dict[str, list[tuple[float, int, int]]] = field(default_factory=dict)

    def replace(self, objects: list[Obj]) -> None:
        for obj in objects:
            self.upsert(obj)

    def upsert(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        self.objects[name] = obj
        used = (obj.get("status") or {}).get("used") or {}
        self.used.setdefault(name, []).append(
            (time.monotonic(), quantity(used.get("memory", 0)), int(used.get("devices", 0))))

    def delete(self, obj: Obj) -> None:
        self.objects.pop(obj["metadata"]["name"], None)


@contextlib.asynccontextmanager
async def watching(kube: Kube, namespace: str) -> AsyncIterator[tuple[Claims, Quotas]]:
    claims, quotas = Claims(), Quotas()
    reflectors = [Reflector(kube.api, Resource(RESOURCE_V1, "resourceclaims"), claims, namespace=namespace),
                  Reflector(kube.api, Resource(DQ, "devicequotas"), quotas, namespace=namespace)]
    tasks = [asyncio.create_task(r.run()) for r in reflectors]
    try:
        await asyncio.wait_for(asyncio.gather(*(r.synced.wait() for r in reflectors)), 30)
        yield claims, quotas
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- what the claims cost, computed here --------------------------------------------------------


def is_allocated(claim: Obj) -> bool:
    return bool((claim.get("status") or {}).get("allocation"))


def template_of(claim: Obj) -> Template:
    """By the owning pod's name (`<template>-<i>`), or the standalone claim's own."""
    owner = next((o["name"] for o in claim["metadata"].get("ownerReferences") or [] if o.get("kind") == "Pod"),
                 claim["metadata"]["name"])
    return next(t for t in (*TEMPLATES, WAITING) if owner.rsplit("-", 1)[0] == t.name or owner == t.name)


def device_charge(fleet: Fleet, result: Obj) -> tuple[int, int]:
    """A whole device costs its published memory; a share of a shared device what the
    scheduler set aside for it (consumedCapacity, already rounded by the requestPolicy)."""
    assert result["driver"] == DRIVER and not result.get("adminAccess"), result
    device = fleet.devices[(result["pool"], result["device"])]
    if device.get("allowMultipleAllocations"):
        consumed = result["consumedCapacity"]
        return quantity(consumed.get("memory", consumed.get(f"{DRIVER}/memory"))), 1
    return quantity(device["capacity"]["memory"]["value"]), 1


def claim_charge(fleet: Fleet, claim: Obj) -> tuple[int, int]:
    memory = devices = 0
    for result in claim["status"]["allocation"]["devices"]["results"]:
        m, d = device_charge(fleet, result)
        memory, devices = memory + m, devices + d
    return memory, devices


def class_of(fleet: Fleet, claim: Obj) -> str:
    return fleet.classes[template_of(claim).kind]


@dataclass(frozen=True)
class Expected:
    """What the DeviceQuotas and /metrics must say, from the claims as the API server holds them."""

    used: dict[str, tuple[int, int]]  # quota -> (memory, devices)
    reserved: dict[str, tuple[int, int]]
    claims: dict[str, dict[str, int]]
    by_class: dict[tuple[str, str, str], int]  # (class, resource, state) -> amount

    @classmethod
    def of(cls, fleet: Fleet, claims: list[Obj]) -> Expected:
        mig = fleet.classes["mig"]
        used = {"all": [0, 0], "mig": [0, 0]}
        reserved = {"all": [0, 0], "mig": [0, 0]}
        counts = {q: {"allocated": 0, "pending": 0} for q in used}
        by_class: dict[tuple[str, str, str], int] = {}
        for claim in claims:
            template, device_class = template_of(claim), class_of(fleet, claim)
            if is_allocated(claim):
                charge, into, state = claim_charge(fleet, claim), used, "allocated"
                assert charge == (template.memory, template.devices), (claim["metadata"]["name"], charge)
            else:
                charge, into, state = (template.memory, template.devices), reserved, "pending"
            for quota in ("all", "mig") if device_class == mig else ("all",):
                into[quota][0] += charge[0]
                into[quota][1] += charge[1]
                counts[quota][state] += 1
            for resource, amount in zip(("memory", "devices"), charge, strict=True):
                key = (device_class, resource, "allocated" if state == "allocated" else "reserved")
                by_class[key] = by_class.get(key, 0) + amount
        return cls({q: (m, d) for q, (m, d) in used.items()}, {q: (m, d) for q, (m, d) in reserved.items()},
                   counts, by_class)


def status_numbers(status: Obj, key: str) -> tuple[int, int]:
    amounts = status.get(key) or {}
    return quantity(amounts.get("memory", 0)), int(amounts.get("devices", 0))


async def converged(kube: Kube, fleet: Fleet, what: str) -> tuple[Expected, dict[str, Obj]]:
    """Poll until both DeviceQuotas' status equals what the claims listed now cost."""
    last: dict[str, object] = {}

    async def agrees() -> bool:
        claims = await kube.list(RESOURCE_V1, "resourceclaims", namespace=fleet.namespace)
        quotas = {q["metadata"]["name"]: q for q in await kube.list(DQ, "devicequotas", namespace=fleet.namespace)}
        want = Expected.of(fleet, claims)
        got = {name: (status_numbers(q.get("status") or {}, "used"), status_numbers(q.get("status") or {}, "reserved"),
                      (q.get("status") or {}).get("claims")) for name, q in quotas.items()}
        last.update(want=want, got=got, quotas=quotas)
        return got == {name: (want.used[name], want.reserved[name], want.claims[name]) for name in ("all", "mig")}

    try:
        await poll(agrees, timeout=60 + ORPHAN_TTL, what=what, interval=0.05, max_interval=0.25)
    except WaitTimeout:
        want = last["want"]
        assert isinstance(want, Expected)
        assert last["got"] == {n: (want.used[n], want.reserved[n], want.claims[n]) for n in ("all", "mig")}, what
    want, quotas = last["want"], last["quotas"]
    assert isinstance(want, Expected) and isinstance(quotas, dict)
    return want, quotas


# -- /metrics -----------------------------------------------------------------------------------


async def timed_scrape(served: Served) -> tuple[float, int]:
    """Seconds and bytes of one GET /metrics, over HTTPS with a token as Prometheus scrapes
    (its decision cached by serve after the first: the token is made before timing)."""
    if not served.metrics_token:
        served.metrics_token = await metrics_reader_token(served.cluster)
    started = time.perf_counter()
    body = await served.scrape()
    return time.perf_counter() - started, len(body.encode())


def expected_samples(fleet: Fleet, want: Expected, quotas: dict[str, Obj]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The DeviceQuota status in the metrics' shape (hard from the spec); usage by class from the claims."""
    ns, out = fleet.namespace, {}
    for name, obj in quotas.items():
        status, hard = obj["status"], obj["spec"]["hard"]
        for resource, i in (("memory", 0), ("devices", 1)):
            for kind in ("used", "reserved"):
                labels = {"namespace": ns, "quota": name, "resource": resource, "type": kind}
                out[(QUOTA, frozenset(labels.items()))] = float(status_numbers(status, kind)[i])
            if resource in hard:
                labels = {"namespace": ns, "quota": name, "resource": resource, "type": "hard"}
                out[(QUOTA, frozenset(labels.items()))] = float(quantity(hard[resource]))
    for (device_class, resource, state), amount in want.by_class.items():
        labels = {"namespace": ns, "device_class": device_class, "resource": resource, "state": state}
        out[(NAMESPACE_USAGE, frozenset(labels.items()))] = float(amount)
    return out


def shown(key: tuple[str, frozenset[tuple[str, str]]], value: float) -> bool:
    """Every quota sample counts, zeros too; a class's usage series may be left out at 0
    (whether a class that held nothing has a series is not what is checked here)."""
    return key[0] == QUOTA or value != 0


async def metrics_agree(fleet: Fleet, want: Expected, quotas: dict[str, Obj], what: str) -> None:
    expected = expected_samples(fleet, want, quotas)
    # The allocated usage by class adds up to the unscoped quota's status, as a dashboard reads it.
    for i, resource in enumerate(("memory", "devices")):
        total = sum(v for (name, labels), v in expected.items()
                    if name == NAMESPACE_USAGE and ("resource", resource) in labels and ("state", "allocated") in labels)
        assert total == status_numbers(quotas["all"]["status"], "used")[i], (resource, total)
    last: dict[str, object] = {}

    async def agrees() -> bool:
        scraped = await fleet.served.metrics()
        got = {k: v for k, v in scraped.items()
               if k[0] in (QUOTA, NAMESPACE_USAGE) and ("namespace", fleet.namespace) in k[1] and shown(k, v)}
        last["got"] = got
        return got == {k: v for k, v in expected.items() if shown(k, v)}

    try:
        await poll(agrees, timeout=15, what=what)
    except WaitTimeout:
        assert last["got"] == {k: v for k, v in expected.items() if shown(k, v)}, what


# -- the allocation-to-status delay ----------------------------------------------------------------


def delays(fleet: Fleet, claims: Claims, quotas: Quotas) -> list[float]:
    """For each allocation received at t: the first `all` status received covering every
    allocation received up to t, minus t (0 when one covering them arrived before t: the
    controller's watch beat the test's). Comparing sums is enough: both watches deliver the
    allocations in the API server's order, so what the controller counted and what the test
    has seen are both prefixes of one sequence of positive charges, and the larger sum holds
    the other."""
    allocations = sorted((at, uid) for uid, at in claims.allocated_at.items())
    statuses = quotas.used["all"]
    out, memory, devices = [], 0, 0
    for i, (at, uid) in enumerate(allocations):
        m, d = claim_charge(fleet, claims.objects[uid])
        memory, devices = memory + m, devices + d
        if i + 1 < len(allocations) and allocations[i + 1][0] == at:
            continue  # received together: judged with the last of them
        covering = next((t for t, m_, d_ in statuses if m_ >= memory and d_ >= devices), None)
        assert covering is not None, f"no status ever covered the first {i + 1} allocations"
        out.extend([max(0.0, covering - at)] * sum(1 for a, _ in allocations if a == at))
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def load() -> str:
    return f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}: noisy, shared machine"


# -- the test -----------------------------------------------------------------------------------


async def test_used_follows_200_allocations_by_the_real_scheduler(kube: Kube, fleet: Fleet) -> None:
    ns, gpus = fleet.namespace, fleet.gpus
    with fleet.served.log_on_failure():
        for template in TEMPLATES:
            await create_claim_template(kube, ns, template.name, fleet.spec(template))
        await create_claim(kube, ns, WAITING.name, fleet.spec(WAITING))
        # Round-robin over the templates, so the kinds interleave on the scheduler.
        names = [f"{t.name}-{i}" for i in range(max(t.pods for t in TEMPLATES)) for t in TEMPLATES if i < t.pods]
        assert len(names) == PODS == 200
        gate = asyncio.Semaphore(16)

        async def make(pod: str) -> None:
            async with gate:
                await create_pod(kube, ns, pod, template=pod.rsplit("-", 1)[0], node_selector=gpus.node_selector)

        async with watching(kube, ns) as (claims, quotas):
            started = time.monotonic()
            await asyncio.gather(*(make(p) for p in names))

            async def all_allocated() -> bool:
                return len(claims.allocated_at) == PODS

            try:
                await poll(all_allocated, timeout=ALLOCATE_TIMEOUT, what=f"{PODS} claims allocated", max_interval=0.25)
            except WaitTimeout as err:
                raise AssertionError(f"{err}: {len(claims.allocated_at)} allocated") from None
            allocating = time.monotonic() - started
            want, dq = await converged(kube, fleet, "used = the charges of the 200 allocations")

            async def watched() -> bool:  # the test's watch may trail its GET
                return quotas.used["all"][-1][1:] == want.used["all"]

            await poll(watched, timeout=30, what="the DeviceQuota watch to deliver the converged status")
            measured = delays(fleet, claims, quotas)

        # The literal numbers of the slices: every claim was checked against its
        # template's in Expected.of; the totals once more by hand.
        assert want.used["all"] == (30 * 80 * GiB + 20 * 80 * GiB + 30 * 141 * GiB + 60 * MIG_1G + 20 * MIG_3G
                                    + 20 * 8 * GiB + 15 * 12 * GiB + 5 * 4 * GiB, 30 + 40 + 30 + 60 + 20 + 40)
        assert want.used["mig"] == (60 * MIG_1G + 20 * MIG_3G, 80)
        assert want.reserved == {"all": (282 * GiB, 2), "mig": (0, 0)}
        assert want.claims["all"] == {"allocated": 200, "pending": 1}
        held = [claims.objects[uid] for uid in claims.allocated_at]
        assert_counters_respected(fleet, held)

        p50, p99 = percentile(measured, 0.5), percentile(measured, 0.99)
        print(f"\n{PODS} claims allocated by the scheduler in {allocating:.1f}s; allocation -> DeviceQuota status: "
              f"p50 {p50 * 1000:.0f}ms, p99 {p99 * 1000:.0f}ms, max {max(measured) * 1000:.0f}ms over "
              f"{len(measured)} allocations, {len(quotas.used['all'])} status events ({load()})")
        assert len(measured) == PODS
        record("200 allocations by the scheduler", allocating)
        record("allocation -> DeviceQuota status p50", p50)
        record("allocation -> DeviceQuota status p99", p99, target=P99_TARGET)
        record("allocation -> DeviceQuota status max", max(measured))

        await metrics_agree(fleet, want, dq, "/metrics to agree with the status of 200 allocations")
        scrapes = [await timed_scrape(fleet.served) for _ in range(5)]
        record(f"GET /metrics with {PODS + 1} claims, median of 5", sorted(s for s, _ in scrapes)[2])
        print(f"GET /metrics with {PODS + 1} claims: {scrapes[0][1] / 1024:.0f} KiB, "
              f"{', '.join(f'{s * 1000:.0f}' for s, _ in scrapes)} ms ({load()})")

        # Three quarters of each template's pods go (148): their claims are deallocated and
        # deleted, and `used` drops to the 52 left.
        gone = [f"{t.name}-{i}" for t in TEMPLATES for i in range(t.pods * 3 // 4)]
        assert len(gone) == 148

        async def remove(pod: str) -> None:
            async with gate:
                await kube.delete("v1", "pods", pod, namespace=ns, grace_period_seconds=0)

        await asyncio.gather(*(remove(p) for p in gone))

        async def freed() -> bool:
            listed = await kube.list(RESOURCE_V1, "resourceclaims", namespace=ns)
            return len(listed) == PODS - len(gone) + 1

        await poll(freed, timeout=120, what="the deleted pods' claims deleted", max_interval=0.5)
        want, dq = await converged(kube, fleet, "used = the charges of the claims left")
        kept = {t.name: t.pods - t.pods * 3 // 4 for t in TEMPLATES}
        assert want.used["all"] == (
            sum(n * t.memory for t in TEMPLATES for n in [kept[t.name]]),
            sum(n * t.devices for t in TEMPLATES for n in [kept[t.name]]))
        assert want.claims["all"] == {"allocated": 52, "pending": 1}
        await metrics_agree(fleet, want, dq, "/metrics to agree with the status after the deletions")


def assert_counters_respected(fleet: Fleet, claims: list[Obj]) -> None:
    """No two allocated MIG devices share a memory slice of one GPU: the counters were in
    effect (else the fleet would not model partitionable devices at all)."""
    taken: dict[tuple[str, str, str], str] = {}
    for claim in claims:
        for result in claim["status"]["allocation"]["devices"]["results"]:
            device = fleet.devices[(result["pool"], result["device"])]
            for consumption in device.get("consumesCounters") or []:
                for counter in consumption["counters"]:
                    key = (result["pool"], consumption["counterSet"], counter)
                    assert key not in taken, f"{result['device']} and {taken[key]} both hold {key}"
                    taken[key] = result["device"]
    assert len(taken) == 60 * 1 + 20 * 4
