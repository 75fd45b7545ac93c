"""`dra-quota serve`'s usage metrics, scraped while the real scheduler allocates claims.

`draquota_quota` (hard/used/reserved), `draquota_namespace_device_usage`,
`draquota_claim_device_info` and the inventory by model, against the real 1.37 API server, resourceclaim
controller and scheduler; a team's (ClusterDeviceQuota's) series, moved by a
relabel of the namespace as serve's Namespace watch delivers it. The fleet publishes whole GPUs and MIG devices with the
attributes the NVIDIA driver publishes (`uuid`; a MIG device's `parentUUID` and
`profile`); pods get their claims from templates and the scheduler allocates them; one
claim no pod uses stays pending (reserved). Every expectation is computed from what the
API server holds: each claim's `draquota.io/charge` annotation (written in the create by
our mutating webhook), whether it is allocated, the devices its allocation names and the pods in its
`status.reservedFor`, never hard-coded. The device and class products are unique to this
run, so the charge estimated at admission is the exact one too.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from runtime.metricnames import (

    ADMISSION_REQUESTS,

    ALLOCATION_WAIT,

    CLAIM_DEVICE_INFO,

    CLUSTER_QUOTA,

    CLUSTER_QUOTA_NAMESPACE,

    INVENTORY_ALLOCATED,

    INVENTORY_DEVICES,

    INVENTORY_MEMORY,

    LEADER,

    NAMESPACE_USAGE,

    PENDING_CLAIMS,

    QUOTA,

)
from webhook.usagemetrics import DEVICE_INFO_LABELS

from .cluster import ControlPlane, free_ports
from .driver import (
    DRIVER, RESOURCE_V1, GpuFleet, claim_spec, create_claim, create_claim_template, create_device_class, create_node,
    create_pod, exact_request, free_pod, publish_node_slice, wait_pod_allocated,
)
from .harness import DQ, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, installed, running
from .kube import ApiError, Kube, Obj, WaitTimeout, poll

pytestmark = pytest.mark.e2e

RUN = uuid.uuid4().hex[:8]
PRODUCT = f"E2E Usage GPU {RUN}"  # unique: no other test's device is priced in these classes
PROFILE = "1g.10gb"
CHARGE = "draquota.io/charge"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def devices(node: str) -> list[Obj]:
    """Three whole GPUs and two MIG instances of a fourth, as the NVIDIA driver names them."""
    def attrs(**values: str) -> Obj:
        return {k: {"string": v} for k, v in values.items()}

    parent = f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{node}/3')}"
    gpus = [{"name": f"gpu-{i}", "attributes": attrs(type="gpu", productName=PRODUCT,
                                                      uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{node}/{i}')}"),
             "capacity": {"memory": {"value": "80Gi"}}} for i in range(3)]
    migs = [{"name": f"gpu-3-mig-19-{start}-1", "attributes": attrs(
        type="mig", productName=PRODUCT, uuid=f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{node}/3/{start}')}",
        parentUUID=parent, profile=PROFILE), "capacity": {"memory": {"value": "10Gi"}}} for start in (0, 1)]
    return [*gpus, *migs]


class World:
    def __init__(self, served: Served, namespace: str, fleet: GpuFleet, node: str, published: list[Obj],
                 mig_class: str) -> None:
        self.served, self.namespace, self.fleet, self.node = served, namespace, fleet, node
        self.devices = {d["name"]: d for d in published}
        self.mig_class = mig_class


@pytest_asyncio.fixture(loop_scope="session")
async def world(cluster: ControlPlane, kube: Kube, crd: None, tmp_path: Path,
                make_namespace: MakeNamespace, make_fleet: MakeFleet) -> AsyncIterator[World]:
    port, metrics_port = free_ports(2)
    async for served in running(Served(cluster, port, tmp_path / "serve.log", metrics_port=metrics_port)):
        fleet = await make_fleet("usage")
        # The fleet's own class matches every fleet's GPUs: these classes see only this run's.
        gpu_class, mig_class = f"{fleet.prefix}-whole", f"{fleet.prefix}-mig"
        this_run = f'device.attributes["{DRIVER}"].productName == "{PRODUCT}"'
        await create_device_class(kube, gpu_class, extra_cel=this_run)
        await kube.create(RESOURCE_V1, "deviceclasses", {"kind": "DeviceClass", "metadata": {"name": mig_class},
                          "spec": {"selectors": [{"cel": {"expression": (
                              f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "mig" && '
                              f'{this_run}')}}]}})
        node = f"{fleet.prefix}-n1"
        await create_node(kube, node, labels=fleet.node_selector)
        fleet.nodes.append(node)
        published = devices(node)
        fleet.slices.append((await publish_node_slice(kube, node, published))["metadata"]["name"])
        namespace = await make_namespace("usage", labels={RUN_LABEL: RUN})
        try:
            async with installed(kube, adapted_webhooks(RUN, served.port, cluster)):
                world = World(served, namespace, fleet, node, published, mig_class)
                world.fleet.device_class = gpu_class  # the requests below ask for this run's GPUs
                yield world
        finally:
            for cls in (gpu_class, mig_class):
                await kube.delete(RESOURCE_V1, "deviceclasses", cls)


def charge(claim: Obj) -> dict[str, int]:
    annotations = claim["metadata"].get("annotations") or {}
    assert CHARGE in annotations, f"claim {claim['metadata']['name']} carries no charge"
    parsed: dict[str, int] = json.loads(annotations[CHARGE])
    return parsed


def allocated(claim: Obj) -> bool:
    return bool((claim.get("status") or {}).get("allocation"))


def class_of(claim: Obj) -> str:
    [req] = claim["spec"]["devices"]["requests"]
    cls: str = req["exactly"]["deviceClassName"]
    return cls


def expected(world: World, claims: list[Obj]) -> Samples:
    """What the scrape must show, from the claims as the API server holds them."""
    out: Samples = {}

    def add(name: str, labels: dict[str, str], value: float) -> None:
        key = (name, frozenset(labels.items()))
        out[key] = out.get(key, 0.0) + value

    ns = world.namespace
    quotas = {"all": (None, {"memory": 2**40, "devices": 10}), "migs": (world.mig_class, {"memory": 100 * 2**30})}
    for quota, (scope, hard) in quotas.items():
        for resource in ("memory", "devices"):
            if resource in hard:
                add(QUOTA, {"namespace": ns, "quota": quota, "resource": resource, "type": "hard"}, hard[resource])
            for kind in ("used", "reserved"):
                add(QUOTA, {"namespace": ns, "quota": quota, "resource": resource, "type": kind}, 0)
    held: set[str] = set()
    for device in world.devices.values():
        attributes = device["attributes"]
        labels = {"driver": DRIVER, "model": PRODUCT,
                  "profile": attributes["profile"]["string"] if "parentUUID" in attributes else ""}
        add(INVENTORY_DEVICES, labels, 1)
        add(INVENTORY_MEMORY, labels, {"80Gi": 80 * 2**30, "10Gi": 10 * 2**30}[device["capacity"]["memory"]["value"]])
        add(INVENTORY_ALLOCATED, labels, 0)
    add(PENDING_CLAIMS, {"namespace": ns}, sum(not allocated(c) for c in claims))
    for claim in claims:
        state = "allocated" if allocated(claim) else "reserved"
        for resource, amount in charge(claim).items():
            add(NAMESPACE_USAGE, {"namespace": ns, "device_class": class_of(claim), "resource": resource,
                                  "state": state}, amount)
            for quota, (scope, _) in quotas.items():
                if scope in (None, class_of(claim)):
                    add(QUOTA, {"namespace": ns, "quota": quota, "resource": resource,
                                "type": "used" if allocated(claim) else "reserved"}, amount)
        if not allocated(claim):
            continue
        pods = [r["name"] for r in claim["status"].get("reservedFor") or [] if r.get("resource") == "pods"]
        for result in claim["status"]["allocation"]["devices"]["results"]:
            attributes = world.devices[result["device"]]["attributes"]
            gpu_uuid = (attributes.get("parentUUID") or attributes["uuid"])["string"]
            profile = attributes["profile"]["string"] if "parentUUID" in attributes else ""
            if result["device"] not in held:
                held.add(result["device"])
                add(INVENTORY_ALLOCATED, {"driver": DRIVER, "model": PRODUCT, "profile": profile}, 1)
            for pod in pods or [""]:
                values = (ns, claim["metadata"]["name"], pod, result["driver"], result["pool"], result["device"],
                          PRODUCT, gpu_uuid, profile)
                add(CLAIM_DEVICE_INFO, dict(zip(DEVICE_INFO_LABELS, values, strict=True)), 1)
    return out


def shown(world: World, scraped: Samples) -> Samples:
    """The scrape's usage samples of this test's namespace, and of this run's device model."""
    return {key: value for key, value in scraped.items()
            if (key[0] in (QUOTA, NAMESPACE_USAGE, CLAIM_DEVICE_INFO, PENDING_CLAIMS)
                and ("namespace", world.namespace) in key[1])
            or (key[0] in (INVENTORY_DEVICES, INVENTORY_MEMORY, INVENTORY_ALLOCATED) and ("model", PRODUCT) in key[1])}


async def converge(kube: Kube, world: World, what: str) -> list[Obj]:
    """Poll until the scrape equals what the claims say; on timeout fail with the difference."""
    last: dict[str, Any] = {}

    async def agrees() -> bool:
        claims = await kube.list(RESOURCE_V1, "resourceclaims", namespace=world.namespace)
        last["claims"] = claims
        if any(CHARGE not in (c["metadata"].get("annotations") or {}) for c in claims):
            return False  # a claim that arrived without a charge, until the leader charges it
        last["want"] = expected(world, claims)
        last["got"] = shown(world, await world.served.metrics())
        return bool(last["got"] == last["want"])

    try:
        await poll(agrees, timeout=30, what=what)
    except WaitTimeout:
        assert last["got"] == last["want"], what
    claims: list[Obj] = last["claims"]
    return claims


async def test_scrape_equals_the_charges_of_the_claims_the_scheduler_allocated(kube: Kube, world: World) -> None:
    ns, fleet = world.namespace, world.fleet
    with world.served.log_on_failure():
        for name, hard, classes in (("all", {"memory": "1Ti", "devices": 10}, None),
                                    ("migs", {"memory": "100Gi"}, [world.mig_class])):
            spec: Obj = {"hard": hard, **({"deviceClassNames": classes} if classes else {})}
            await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": name}, "spec": spec},
                              namespace=ns)
        await create_claim_template(kube, ns, "whole", claim_spec(exact_request("gpu", fleet.device_class)))
        await create_claim_template(kube, ns, "mig", claim_spec(exact_request("gpu", world.mig_class)))
        pods = {"whole-a": "whole", "whole-b": "whole", "mig-a": "mig"}
        for pod, template in pods.items():
            await create_pod(kube, ns, pod, template=template, node_selector=fleet.node_selector)
        for pod in pods:
            await wait_pod_allocated(kube, ns, pod)
        # Admitted, used by no pod: never allocated, so reserved.
        await create_claim(kube, ns, "waiting", claim_spec(exact_request("gpu", fleet.device_class, count=2)))

        claims = await converge(kube, world, "the scrape to show the allocated and pending claims' charges")
        assert sum(allocated(c) for c in claims) == 3 and len(claims) == 4
        scraped = await world.served.metrics()
        assert scraped[(LEADER, frozenset())] == 1  # it holds its own Lease
        # Each pod's devices are named with the pod, the MIG one with its parent GPU's uuid.
        info = [dict(labels) for (name, labels) in shown(world, scraped) if name == CLAIM_DEVICE_INFO]
        assert sorted(i["pod"] for i in info) == sorted(pods)
        assert [i["GPU_I_PROFILE"] for i in info if i["pod"] == "mig-a"] == [PROFILE]

        # Each allocated claim's wait from creation to allocation, once, under its namespace
        # (it holds DeviceQuotas, so it is named); its admissions are counted under it too.
        waits: dict[frozenset[tuple[str, str]], float] = {}

        async def recorded() -> bool:
            waits.clear()
            waits.update({labels: v for (name, labels), v in (await world.served.metrics()).items()
                          if name == f"{ALLOCATION_WAIT}_count"})
            return waits.get(frozenset({("namespace", ns)})) == 3

        try:
            await poll(recorded, timeout=30, what="three allocation waits observed")
        except WaitTimeout:
            assert waits == {frozenset({("namespace", ns)}): 3}
        assert any(name == ADMISSION_REQUESTS and ("namespace", ns) in labels
                   for name, labels in await world.served.metrics())

        # A pod deleted: its claim is deallocated and deleted, and its charge leaves `used`.
        await free_pod(kube, ns, "whole-a")
        claims = await converge(kube, world, "the scrape to drop the deleted pod's claim")
        assert sum(allocated(c) for c in claims) == 2
        assert "whole-a" not in {dict(labels).get("pod") for (_, labels) in shown(world, await world.served.metrics())}


TEAM_LABEL = "team.draquota.io/name"


async def test_a_relabel_moves_the_namespaces_series_between_teams(kube: Kube, world: World) -> None:
    ns, fleet = world.namespace, world.fleet
    teams = (f"usage-{RUN}-a", f"usage-{RUN}-b")  # cluster-scoped: this run's own
    try:
        with world.served.log_on_failure():
            for team in teams:
                await kube.create(DQ, "clusterdevicequotas", {
                    "kind": "ClusterDeviceQuota", "metadata": {"name": team},
                    "spec": {"hard": {"memory": "1Ti"}, "namespaceSelector": {"matchLabels": {TEAM_LABEL: team}}}})
            await kube.patch("v1", "namespaces", ns, {"metadata": {"labels": {TEAM_LABEL: teams[0]}}})
            # Admitted, used by no pod: reserved, in the namespace's part of its team.
            spec = claim_spec(exact_request("gpu", fleet.device_class))

            async def admitted() -> bool:  # until serve's Namespace cache holds the new label
                try:
                    await create_claim(kube, ns, "waiting", spec)
                except ApiError as err:
                    if err.status != 403:  # a denial: told again below, once the label is seen
                        raise
                    return False
                return True

            await poll(admitted, timeout=30, what="the claim admitted in the team's namespace")
            for team, other in (teams, teams[::-1]):
                if team != teams[0]:
                    await kube.patch("v1", "namespaces", ns, {"metadata": {"labels": {TEAM_LABEL: team}}})
                await team_series(kube, world, team, other)
    finally:
        for team in teams:
            await kube.delete(DQ, "clusterdevicequotas", team)


async def team_series(kube: Kube, world: World, team: str, other: str) -> None:
    """The namespace's reserved claim shows in `team`'s part and total, and nowhere in `other`'s."""
    ns = world.namespace
    last: dict[str, dict[tuple[str, str], float]] = {}

    async def moved() -> bool:
        [claim] = await kube.list(RESOURCE_V1, "resourceclaims", namespace=ns)
        if CHARGE not in (claim["metadata"].get("annotations") or {}):
            return False
        memory = charge(claim)["memory"]
        scraped = await world.served.metrics()
        last["got"] = got = {
            (dict(labels)["quota"], dict(labels).get("namespace", "")): value
            for (name, labels), value in scraped.items()
            if name in (CLUSTER_QUOTA, CLUSTER_QUOTA_NAMESPACE) and dict(labels)["quota"] in (team, other)
            and ("resource", "memory") in labels and ("type", "reserved") in labels}
        last["want"] = want = {(team, ns): float(memory), (team, ""): float(memory), (other, ""): 0.0}
        return got == want

    try:
        await poll(moved, timeout=30, what=f"{ns}'s reserved memory in team {team}, not {other}")
    except WaitTimeout:
        assert last.get("got") == last.get("want"), f"{ns}'s reserved memory in team {team}, not {other}"
