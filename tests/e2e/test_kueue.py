"""dra-quota's Kueue AdmissionCheck controller against a real Kueue, API server and scheduler.

A namespace with a DeviceQuota of two H100s' memory (160Gi), a ClusterQueue with room for
six devices that lists our AdmissionCheck (controllerName ``draquota.io/devicequota``), and
Jobs asking 2 H100s each through a ResourceClaimTemplate. Kueue alone would admit three;
our check admits what the DeviceQuota holds and holds the rest with a claim's denial text.
Each step asserts the DeviceQuota status, so nothing is counted twice: the admitted
Workload's holding, then its Pod's claim drawing on it, then the claim's exact use.

There is no kubelet: a Job "finishes" by its Pod's status being set Succeeded (what a
kubelet would write); the Job controller completes the Job, Kueue marks the Workload
Finished, and the resourceclaim controller deallocates and deletes the Pod's claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from quota.values.quantity import parse_quantity

from ..tools.chart import NAMESPACE
from .cluster import ControlPlane, free_ports
from .driver import POD_IMAGE, RESOURCE_V1, Gpu, GpuFleet, claim_spec, create_claim_template, exact_request
from .harness import DQ, RUN_LABEL, Served, adapted_webhooks, advised, installed, running, unique
from .kube import Kube, Obj, poll
from .kueue import API, DEVICE_CLASS, DEVICE_RESOURCE, NAMESPACE_LABEL, QUEUE_LABEL, Kueue
from .queues import BATCH, CONTROLLER, holds, queues, workload_of
from .shipped import LEASE, chart_kubeconfig

pytestmark = pytest.mark.e2e

GiB = 2**30
H100 = Gpu("NVIDIA H100-SXM5-80GB", "80Gi")
WORKLOAD_LABEL = "draquota.io/workload"
RETRY_SECONDS = 2
class Env:
    def __init__(self, kube: Kube, namespace: str, queue: str, check: str, served: Served) -> None:
        self.kube, self.namespace, self.queue, self.check, self.served = kube, namespace, queue, check, served

    async def job(self, name: str) -> Obj:
        """A suspended Job for the queue: one Pod stamping a claim for 2 devices (the template "gpus")."""
        pod: Obj = {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpus"}],
            "containers": [{"name": "main", "image": POD_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}],
        }
        return await self.kube.create(BATCH, "jobs", {
            "kind": "Job", "metadata": {"name": name, "labels": {QUEUE_LABEL: self.queue}},
            "spec": {"suspend": True, "parallelism": 1, "completions": 1, "template": {"spec": pod}},
        }, namespace=self.namespace)

    async def workload(self, job: str, predicate: Callable[[Obj], bool], what: str, timeout: float = 60) -> Obj:
        obj = await self.kube.get(BATCH, "jobs", job, namespace=self.namespace)
        return await workload_of(self.kube, obj, predicate, what, timeout)

    async def quota(self, predicate: Callable[[dict[str, Any]], bool], what: str, timeout: float = 60) -> Obj:
        found: Obj = await self.kube.wait_for(DQ, "devicequotas", "gpus", lambda q: predicate(q.get("status") or {}),
                                              namespace=self.namespace, what=what, timeout=timeout)
        return found

    async def sample(self, seen: list[tuple[int, int, int]], stop: asyncio.Event) -> None:
        """Record (used, reserved, reserved by workloads) memory bytes of DeviceQuota "gpus"
        until `stop`: a sampler, not synchronisation (the asserts on it say "never above
        hard"); checks on each sample that reservedBy adds up to reserved."""
        while not stop.is_set():
            status = (await self.kube.get(DQ, "devicequotas", "gpus", namespace=self.namespace)).get("status") or {}
            # Absent while no Workload holds anything: all of reserved is claims'.
            by = status.get("reservedBy") or {"claims": status.get("reserved") or {}}
            seen.append((memory(status, "used"), memory(status, "reserved"), memory(by, "workloads")))
            assert memory(by, "claims") + memory(by, "workloads") == memory(status, "reserved"), status
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    async def events(self, reason: str) -> list[Obj]:
        return [e for e in await self.kube.list("events.k8s.io/v1", "events", namespace=self.namespace)
                if e.get("reason") == reason]

    async def finish(self, job: str) -> None:
        """What a kubelet would write when the Job's one container exits 0."""
        pods = [p for p in await self.kube.list("v1", "pods", namespace=self.namespace)
                if (p["metadata"].get("labels") or {}).get("job-name") == job]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        await self.kube.patch("v1", "pods", pods[0]["metadata"]["name"], {"status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": "main", "image": POD_IMAGE, "imageID": "", "ready": False,
                                   "restartCount": 0,
                                   "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}],
        }}, namespace=self.namespace, subresource="status")


def memory(status: dict[str, Any], field: str) -> int:
    return int(parse_quantity((status.get(field) or {}).get("memory") or 0))


def amounts(status: dict[str, Any], field: str) -> tuple[str, int]:
    value = status.get(field) or {}
    return str(value.get("memory")), int(value.get("devices") or 0)


def check_state(workload: Obj, check: str) -> dict[str, Any]:
    return next((c for c in (workload.get("status") or {}).get("admissionChecks") or [] if c["name"] == check), {})


def ready(check: str) -> Callable[[Obj], bool]:
    return lambda w: check_state(w, check).get("state") == "Ready"


@pytest_asyncio.fixture(loop_scope="session")
async def env(cluster: ControlPlane, kube: Kube, kueue: Kueue, crd: None, tmp_path: Path,
              make_namespace: Callable[..., Awaitable[str]], make_fleet: Callable[..., Awaitable[GpuFleet]],
              queue_objects: Callable[..., Awaitable[Obj]]) -> AsyncIterator[Env]:
    """Four H100s, the namespace (Kueue's and our webhooks' labels), DeviceQuota "gpus" of
    160Gi, our AdmissionCheck, a ClusterQueue of 6 devices listing it, the template, and
    `dra-quota serve --kueue on` with our webhooks installed."""
    run = uuid.uuid4().hex[:8]
    fleet = await make_fleet("kq")
    await fleet.add_node("n1", [H100] * 4)
    namespace = await make_namespace("kq", labels={NAMESPACE_LABEL: "true", RUN_LABEL: run})
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                           "spec": {"hard": {"memory": "160Gi"}}}, namespace=namespace)
    check = (await queue_objects("admissionchecks", {
        "kind": "AdmissionCheck", "metadata": {"name": unique("ac")}, "spec": {"controllerName": CONTROLLER},
    }))["metadata"]["name"]
    cq, lq = await queues(kube, queue_objects, namespace, devices=6, checks=(check,))
    kubeconfig = await chart_kubeconfig(cluster, kube, tmp_path / "chart.kubeconfig")
    handle = Served(cluster, free_ports(1)[0], tmp_path / "serve.log", kubeconfig=kubeconfig,
                    args=("--kueue", "auto", "--kueue-retry-seconds", str(RETRY_SECONDS),
                          "--leader-election-namespace", NAMESPACE, "--leader-election-lease-name", LEASE))
    async for served in running(handle):
        async with installed(kube, adapted_webhooks(run, served.port, cluster)):
            with served.log_on_failure():
                # Our controller marks the check Active; only then is the ClusterQueue active.
                await kube.wait_for_condition(API, "clusterqueues", cq, "Active")
                await create_claim_template(kube, namespace, "gpus",
                                            claim_spec(exact_request("gpu", DEVICE_CLASS, count=2)))
                yield Env(kube, namespace, lq, check, served)
                # Nothing serve did was refused with the chart's RBAC.
                assert "HTTP 403" not in served.log_text()
                assert "Kueue AdmissionCheck controller: on (--kueue auto)" in served.log_text()


async def test_the_check_admits_what_the_device_quota_holds_and_the_next_when_it_frees(env: Env) -> None:
    seen: list[tuple[int, int, int]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(env.sample(seen, stop))
    try:
        await _admits_and_frees(env)
    finally:
        stop.set()
        await sampler
    # Never counted twice: at no sample did used + reserved pass the 160Gi one Job takes
    # (the holding, then its claim drawing on it, then the claim's exact use).
    assert max(u + r for u, r, _ in seen) == 160 * GiB, sorted(set(seen))
    print(f"KUEUE: DeviceQuota samples (used, reserved, reservedBy.workloads) in GiB: "
          f"{sorted({(u // GiB, r // GiB, w // GiB) for u, r, w in seen})}")


async def _admits_and_frees(env: Env) -> None:
    kube, check = env.kube, env.check
    jobs = [(await env.job(f"train-{i}"))["metadata"]["name"] for i in range(3)]

    # Kueue reserves its quota for the Workloads (6 devices fit its ClusterQueue); ours
    # admits one, whose 2 H100s (160Gi) fill the DeviceQuota.
    admitted: list[Obj] = []

    async def one_admitted() -> bool:
        workloads = await kube.list(API, "workloads", namespace=env.namespace)
        admitted[:] = [w for w in workloads if holds("Admitted")(w)]
        return len(admitted) == 1 and len(await env.events("DeviceQuotaExceeded")) >= 2

    await poll(one_admitted, timeout=60, what="one Workload Admitted, two held by our check")
    first = admitted[0]
    first_job = first["metadata"]["ownerReferences"][0]["name"]
    entry = check_state(first, check)
    assert entry["state"] == "Ready" and 'DeviceQuota "gpus": memory=160Gi' in entry["message"], entry
    assert entry["podSetUpdates"][0]["labels"] == {WORKLOAD_LABEL: first["metadata"]["uid"]}
    # The others were held with the text a claim gets, and Kueue sees no more than 1 admitted.
    held = await env.events("DeviceQuotaExceeded")
    notes = {e["regarding"]["name"]: e["note"] for e in held}
    assert first["metadata"]["name"] not in notes
    for note in notes.values():
        assert 'exceeded DeviceQuota "gpus": requested memory=160Gi, used memory=0, reserved memory=160Gi, ' \
               'limited memory=160Gi' in note, note
    # What the Workload holds counts as reserved (nothing allocated yet, or its claim drawing on it).
    status = (await env.quota(lambda s: amounts(s, "reserved")[0] == "160Gi" or amounts(s, "used")[0] == "160Gi",
                              "the admitted Workload counted"))["status"]
    assert amounts(status, "used")[0] in ("0", "160Gi") and status["reserved"]["memory"] in ("0", "160Gi")

    # Kueue unsuspends the Job; its Pod carries our label; the scheduler allocates the Pod's
    # claim: used 160Gi, reserved 0 (the claim drew on the holding, never counted twice).
    await kube.wait_for(BATCH, "jobs", first_job, lambda j: j["spec"].get("suspend") is False,
                        namespace=env.namespace, what="unsuspended")
    status = (await env.quota(lambda s: amounts(s, "used")[0] == "160Gi", "the admitted Job's claim allocated",
                              timeout=90))["status"]
    assert amounts(status, "reserved")[0] == "0", status
    pods = [p for p in await kube.list("v1", "pods", namespace=env.namespace)
            if (p["metadata"].get("labels") or {}).get("job-name") == first_job]
    assert [p["metadata"]["labels"].get(WORKLOAD_LABEL) for p in pods] == [first["metadata"]["uid"]]
    assert pods[0]["spec"].get("nodeName"), pods[0]["spec"]
    claims = await kube.list(RESOURCE_V1, "resourceclaims", namespace=env.namespace)
    assert len(claims) == 1 and (claims[0].get("status") or {}).get("allocation"), claims
    others = [w for w in await kube.list(API, "workloads", namespace=env.namespace) if holds("Admitted")(w)]
    assert len(others) == 1, "a second Workload was admitted while the quota was full"

    # The Job finishes: the Workload releases its holding, the claim its use; the next
    # Workload's check turns Ready once Kueue requeues it.
    freed_at = time.monotonic()
    await env.finish(first_job)
    await env.workload(first_job, holds("Finished"), "Finished", timeout=60)
    # The first claim goes, and `used` follows what is allocated now: 0, or already the
    # next Job's claim (its Workload can be admitted, and its claim allocated, within a
    # second, so a wait for "0" alone may miss it: the cold CI run did).
    first_claim = claims[0]["metadata"]["name"]

    async def released() -> Obj | None:
        now = await kube.list(RESOURCE_V1, "resourceclaims", namespace=env.namespace)
        if any(c["metadata"]["name"] == first_claim for c in now):
            return None
        allocated = [c for c in now if (c.get("status") or {}).get("allocation")]
        status = (await kube.get(DQ, "devicequotas", "gpus", namespace=env.namespace)).get("status") or {}
        expected = f"{160 * len(allocated)}Gi" if allocated else "0"
        return status if amounts(status, "used")[0] == expected else None

    await poll(released, timeout=90, what="the first Job's claim released and used = what is allocated now")

    def next_ready(w: Obj) -> bool:
        return w["metadata"]["name"] != first["metadata"]["name"] and ready(check)(w)

    second = await _any_workload(env, next_ready, "the next Workload Ready")
    ready_after = time.monotonic() - freed_at
    ready_seen = time.monotonic()
    await _any_workload(env, lambda w: w["metadata"]["uid"] == second["metadata"]["uid"] and holds("Admitted")(w),
                        "the next Workload Admitted")
    admitted_after = time.monotonic() - ready_seen
    # Measured, not asserted (a shared machine): printed for the report, polled every <=50 ms.
    print(f"\nKUEUE: Job finished -> next Workload's check Ready: {ready_after:.2f}s "
          f"(requeueAfterSeconds {RETRY_SECONDS}); our Ready seen -> Admitted seen: {admitted_after:.3f}s")
    status = (await env.quota(lambda s: amounts(s, "used")[0] == "160Gi", "the second Job's claim allocated",
                              timeout=90))["status"]
    assert amounts(status, "reserved")[0] == "0", status
    admitted_now = [w for w in await kube.list(API, "workloads", namespace=env.namespace)
                    if holds("Admitted")(w) and not holds("Finished")(w)]
    assert len(admitted_now) == 1, [w["metadata"]["name"] for w in admitted_now]
    assert {w["metadata"]["name"] for w in admitted_now} != {first["metadata"]["name"]}
    assert set(jobs) >= {first_job}


async def _any_workload(env: Env, predicate: Callable[[Obj], bool], what: str, timeout: float = 90) -> Obj:
    async def probe() -> Obj | None:
        return next((w for w in await env.kube.list(API, "workloads", namespace=env.namespace) if predicate(w)), None)

    found: Obj = await poll(probe, timeout=timeout, what=what, interval=0.02, max_interval=0.05)
    return found



async def held_with(env: Env, job: str, text: str) -> Obj:
    """Our Warning Event on `job`'s Workload, once it says `text`."""
    workload = await env.workload(job, lambda w: True, "made by Kueue")
    name = workload["metadata"]["name"]

    async def probe() -> Obj | None:
        return next((e for e in await env.events("DeviceQuotaExceeded")
                     if e["regarding"]["name"] == name and text in e["note"]), None)

    found: Obj = await poll(probe, timeout=60, what=f"our DeviceQuotaExceeded Event on {name} saying {text!r}")
    return found


async def test_a_claim_made_outside_kueue_takes_quota_and_the_next_workload_is_held(env: Env) -> None:
    kube = env.kube
    # 1 H100 asked directly (no Pod, no Kueue): admitted by our webhook, reserved 80Gi.
    await kube.create(RESOURCE_V1, "resourceclaims", {
        "kind": "ResourceClaim", "metadata": {"name": "direct"},
        "spec": claim_spec(exact_request("gpu", DEVICE_CLASS, count=1))}, namespace=env.namespace)
    status = (await env.quota(lambda s: memory(s, "reserved") == 80 * GiB, "the direct claim reserved"))["status"]
    assert "reservedBy" not in status, status  # no Workload holds anything: reserved is all claims'

    # Kueue's ClusterQueue has room for 6 devices: Kueue alone admits the Job. Our check
    # holds it with the text a claim gets, naming the direct claim's 80Gi.
    job = (await env.job("after-direct"))["metadata"]["name"]
    reserved = await env.workload(job, holds("QuotaReserved"), "Kueue reserved its quota")
    assert reserved["status"]["admission"]["podSetAssignments"][0]["resourceUsage"] == {DEVICE_RESOURCE: "2"}
    # With what the tenant can do: the direct claim, not allocated yet, holds the room.
    event = await held_with(env, job, advised('exceeded DeviceQuota "gpus": requested memory=160Gi, used memory=0, '
                                              'reserved memory=80Gi, limited memory=160Gi', "reserved",
                                              namespace=env.namespace))
    assert event["type"] == "Warning" and event["regarding"]["kind"] == "Workload", event
    suspended = await kube.get(BATCH, "jobs", job, namespace=env.namespace)
    assert suspended["spec"]["suspend"] is True
    assert not holds("Admitted")(await env.workload(job, lambda w: True, "still there"))

    # The direct claim goes: the Workload is admitted when Kueue asks again.
    await kube.delete(RESOURCE_V1, "resourceclaims", "direct", namespace=env.namespace)
    admitted = await env.workload(job, holds("Admitted"), "Admitted once the direct claim is gone", timeout=90)
    assert check_state(admitted, env.check)["state"] == "Ready"
    await env.quota(lambda s: memory(s, "used") + memory(s, "reserved") == 160 * GiB and memory(s, "used") in (0, 160 * GiB),
                    "the Workload (then its claim) counted once")


async def test_while_dra_quota_is_down_workloads_wait_and_a_restart_rebuilds_the_holdings(env: Env) -> None:
    kube = env.kube
    first = (await env.job("before-stop"))["metadata"]["name"]
    await env.workload(first, holds("Admitted"), "Admitted")
    await env.quota(lambda s: memory(s, "used") == 160 * GiB and memory(s, "reserved") == 0, "its claim allocated",
                    timeout=90)

    await env.served.kill()  # SIGKILL: no goodbye writes
    # Kueue reserves its quota for a new Job and lists our check Pending; nothing decides
    # it, so the Job stays suspended (Kueue does not admit around a check).
    second = (await env.job("while-down"))["metadata"]["name"]
    waiting = await env.workload(second, lambda w: holds("QuotaReserved")(w)
                                 and check_state(w, env.check).get("state") == "Pending", "QuotaReserved, check Pending")
    assert not holds("Admitted")(waiting)
    assert (await kube.get(BATCH, "jobs", second, namespace=env.namespace))["spec"]["suspend"] is True
    # The admitted Job keeps running: its check stays Ready, nothing evicts it.
    assert holds("Admitted")(await env.workload(first, lambda w: True, "still there"))

    # Restarted, serve rebuilds the first Workload's holding from the list (its claim draws
    # on it: still used 160Gi, reserved 0) and holds the second.
    await env.served.start()
    await held_with(env, second, advised('exceeded DeviceQuota "gpus": requested memory=160Gi, used memory=160Gi, '
                                         'reserved memory=0, limited memory=160Gi', "full", namespace=env.namespace))
    status = (await kube.get(DQ, "devicequotas", "gpus", namespace=env.namespace))["status"]
    assert (memory(status, "used"), memory(status, "reserved")) == (160 * GiB, 0), status


async def test_a_deactivated_workload_releases_its_holding_and_the_next_is_admitted(env: Env) -> None:
    """Release on eviction: the admitted Workload is deactivated (`spec.active: false`,
    which Kueue turns into an eviction); its holding goes with it, so the Workload our
    check held is admitted. Never above the 160Gi one Job takes at any sample."""
    kube = env.kube
    seen: list[tuple[int, int, int]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(env.sample(seen, stop))
    try:
        for i in range(2):
            await env.job(f"evict-{i}")
        admitted: list[Obj] = []

        async def one_admitted() -> bool:
            admitted[:] = [w for w in await kube.list(API, "workloads", namespace=env.namespace)
                           if holds("Admitted")(w)]
            return len(admitted) == 1 and len(await env.events("DeviceQuotaExceeded")) >= 1

        await poll(one_admitted, timeout=60, what="one Workload Admitted, the other held by our check")
        first = admitted[0]
        await env.quota(lambda s: amounts(s, "used")[0] == "160Gi", "the admitted Job's claim allocated", timeout=90)

        await kube.patch(API, "workloads", first["metadata"]["name"], {"spec": {"active": False}},
                         namespace=env.namespace)
        other = await _any_workload(env, lambda w: w["metadata"]["uid"] != first["metadata"]["uid"]
                                    and holds("Admitted")(w), "the held Workload Admitted")
        assert check_state(other, env.check)["state"] == "Ready"
        evicted = await kube.get(API, "workloads", first["metadata"]["name"], namespace=env.namespace)
        assert not holds("Admitted")(evicted), evicted.get("status")
        assert check_state(evicted, env.check).get("state") != "Ready", evicted.get("status")
        # The other Job's claim now takes the quota, the evicted one's is gone.
        await env.quota(lambda s: amounts(s, "used")[0] == "160Gi" and amounts(s, "reserved")[0] == "0",
                        "the other Job's claim allocated", timeout=90)
        claims = await kube.list(RESOURCE_V1, "resourceclaims", namespace=env.namespace)
        assert len(claims) == 1, [c["metadata"]["name"] for c in claims]
    finally:
        stop.set()
        await sampler
    assert max(u + r for u, r, _ in seen) == 160 * GiB, sorted(set(seen))
