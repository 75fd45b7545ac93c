"""Crash safety of the quota controller: killed at any point, it restarts to the exact usage.

`dra-quota serve` (webhook and controller, the leader; harness.py's `Served`) is
SIGKILLed at KILLS seeded-random points of a churn this test drives on the real 1.37
control plane, and restarted each time under the same Lease identity (POD_NAME), so it
retakes its own Lease at once (`quota.status.leases.may_acquire`) instead of waiting it out.
The churn: claims created through the webhook (its CREATE hook fails while the process
is down: a create is retried as a controller would), some given a Pod that the real
scheduler allocates them through, some left pending; Pods deleted (the resourceclaim
controller deallocates their claim, which is pending again), claims deleted, and once
the victim node's ResourceSlice rewritten without its two 141Gi GPUs, one of them held by
an allocated claim: that claim's charge must stay, priced from its `draquota.io/charge`
annotation (`quota.pricing.allocated`'s vanished-device share). They are the class's largest, so
the claims admitted before are recorded at 141Gi a GPU and those after at 80Gi: a
restarted process must reserve the earlier ones at what they were admitted at, not at
what it would estimate now (`quota.pricing.priced.at_least_recorded`; before it, a restart
after the change lowered `reserved`).

After each restart, once the churn of that stretch settled (every Pod's claim allocated,
every other claim deallocated, every deleted one gone), the DeviceQuota status must equal
a count the test makes from scratch from the API server's objects (`from_scratch`):
allocated claims priced exactly from the slices, pending ones at their annotation. So
every restart is also a quiescent check, and the last one is the final answer. The
resync period stays at its default (5 minutes): convergence must come from the start's
list and the watches, not from a periodic repair. The reservation TTL is short, so an
entry the killed process persisted for a create that then failed (its answer never
reached the API server) is dropped within the wait.

Then two replicas: the leader is SIGKILLed while the churn goes on; the other takes over
within lease duration + renew deadline and the numbers stay right.

The seed is printed; CRASH_SEED=<n> replays one run's choices (the timing of the cluster
is not replayed).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import sys
import time
import uuid
from datetime import datetime
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio

from quota.values.quantity import parse_quantity

from .cluster import ControlPlane, free_ports
from .driver import FLEET_LABEL, RESOURCE_V1, Gpu, GpuFleet, claim_spec, create_pod, exact_request
from .harness import DQ, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, installed
from .kube import ApiError, Kube, Obj, poll
from .timings import record

pytestmark = pytest.mark.e2e

GiB = 1024**3
LEASES = "coordination.k8s.io/v1"
KILLS = 20
OPS_PER_KILL = 4  # churn operations per stretch; one SIGKILL lands somewhere in each
MAX_CLAIMS = 16  # bounded, so every list stays small and each stretch quick
# GPUs held by Pods at most (the victim's aside): below the 8 that stay published, so
# every Pod is allocated once the claims of deleted Pods are deallocated.
MAX_POD_GPUS = 7
TTL = 2.0
# Short: the take-over is quick to see. A restart of the same identity does not wait.
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 3.0, 2.0, 0.5
TIMING = ("--leader-election-lease-duration", str(LEASE_DURATION),
          "--leader-election-renew-deadline", str(RENEW_DEADLINE),
          "--leader-election-retry-period", str(RETRY_PERIOD))
SEED = int(os.environ.get("CRASH_SEED") or random.SystemRandom().randrange(2**32))
CHARGE = "draquota.io/charge"
ALLOCATED_CHARGE = "draquota.io/allocated-charge"
# Seconds for a stretch's churn to settle: the scheduler's back-off, and the resourceclaim
# controller's. Its deallocation of a claim whose Pod went before binding conflicted twice
# with the leader's allocation-record PATCH and was retried 66 s later (CI, 2026-11-27:
# the controller-manager's log, "Work item failed ... the object has been modified").
SETTLE = 180.0
CONVERGE = 30.0  # seconds for the status to match once it settled and the process is ready

def serve_args(lease_namespace: str) -> tuple[str, ...]:
    return ("--leader-election-namespace", lease_namespace, "--leader-election-lease-name", "crash", *TIMING,
            "--reservation-ttl", str(TTL), "--reuse-port")


# -- the count from scratch ---------------------------------------------------------------------


@dataclass(frozen=True)
class Count:
    used_memory: int = 0
    used_devices: int = 0
    reserved_memory: int = 0
    reserved_devices: int = 0
    allocated: int = 0
    pending: int = 0


def from_scratch(claims: list[Obj], slices: list[Obj]) -> Count:
    """What the DeviceQuota (every class, no scope) must say, from the API server's objects.

    Allocated claims exactly: each device at the memory its slice publishes (none here is
    shared); a device no slice publishes any more at the claim's recorded charge less
    what its other devices cost, shared equally. Pending claims at their recorded charge,
    or, deallocated ones, at their last allocation as its record says (docs/development/reservations.md,
    "A deallocated claim keeps what its last allocation charged": the leader brings the
    record up to date).
    """
    published = {(s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"]):
                 int(parse_quantity(d["capacity"]["memory"]["value"]))
                 for s in slices for d in s["spec"].get("devices") or []}
    used_memory = used_devices = reserved_memory = reserved_devices = allocated = pending = 0
    for claim in claims:
        recorded = json.loads(claim["metadata"]["annotations"][CHARGE])
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation is None:
            pending += 1
            last = json.loads(claim["metadata"]["annotations"].get(ALLOCATED_CHARGE) or "{}")
            reserved_memory += sum(last.values()) if last else recorded["memory"]
            reserved_devices += len(last) if last else recorded["devices"]
            continue
        allocated += 1
        results = allocation["devices"]["results"]
        known = [published.get((r["driver"], r["pool"], r["device"])) for r in results]
        unknown = sum(1 for memory in known if memory is None)
        memory = sum(m for m in known if m is not None)
        if unknown:
            memory += max(recorded["memory"] - memory, 0) // unknown * unknown
        used_memory += memory
        used_devices += len(results)
    return Count(used_memory, used_devices, reserved_memory, reserved_devices, allocated, pending)


def as_count(status: Obj) -> Count:
    used, reserved, claims = status.get("used") or {}, status.get("reserved") or {}, status.get("claims") or {}
    return Count(int(parse_quantity(used.get("memory", 0))), int(used.get("devices", 0)),
                 int(parse_quantity(reserved.get("memory", 0))), int(reserved.get("devices", 0)),
                 int(claims.get("allocated", -1)), int(claims.get("pending", -1)))


# -- the churn ----------------------------------------------------------------------------------


@dataclass
class Churn:
    """The claims and Pods of one namespace, as the test made them (the model it settles to)."""

    kube: Kube
    namespace: str
    fleet: GpuFleet
    rng: random.Random
    claims: dict[str, int] = field(default_factory=dict)  # claim name -> GPUs
    pods: dict[str, str] = field(default_factory=dict)  # claim name -> its Pod
    pinned: dict[str, dict[str, str]] = field(default_factory=dict)  # claim name -> extra node selector
    serial: int = 0
    retried: int = 0  # creates refused while the webhook was down, then repeated
    ops: dict[str, int] = field(default_factory=dict)
    unsettled = ""  # what `settled` saw last time it said no

    def pod_gpus(self) -> int:
        return sum(self.claims[c] for c in self.pods if c not in self.pinned)

    async def create_claim(self, gpus: int) -> str:
        self.serial += 1
        name = f"c{self.serial}"
        body = {"kind": "ResourceClaim", "metadata": {"name": name},
                "spec": claim_spec(exact_request("gpu", self.fleet.device_class, count=gpus))}

        async def attempt() -> bool:
            try:
                await self.kube.create(RESOURCE_V1, "resourceclaims", body, namespace=self.namespace)
            except ApiError as err:
                if err.status == 409 and "already exists" in err.message:
                    return True  # an earlier attempt was persisted after all
                if "exceeded DeviceQuota" in err.message:
                    raise  # hard is far above what the churn holds: never expected
                self.retried += 1  # webhook down (SIGKILL) or too much contention: retry
                return False
            return True

        await poll(attempt, timeout=60, what=f"claim {name} created", interval=0.05, max_interval=0.3)
        self.claims[name] = gpus
        return name

    async def attach_pod(self, claim: str, node_selector: dict[str, str] | None = None) -> None:
        pod = f"p-{claim}-{self.serial}"
        self.serial += 1
        await create_pod(self.kube, self.namespace, pod, claim=claim,
                         node_selector={**self.fleet.node_selector, **(node_selector or {})})
        self.pods[claim] = pod
        if node_selector:
            self.pinned[claim] = node_selector

    async def free_pod(self, claim: str) -> None:
        pod = self.pods.pop(claim)
        self.pinned.pop(claim, None)
        await self.kube.delete("v1", "pods", pod, namespace=self.namespace, grace_period_seconds=0)

    async def delete_claim(self, claim: str) -> None:
        if claim in self.pods:
            await self.free_pod(claim)
        del self.claims[claim]
        await self.kube.delete(RESOURCE_V1, "resourceclaims", claim, namespace=self.namespace)

    async def step(self) -> None:
        """One random operation: create (pending, or with a Pod), free a Pod, give a pending
        claim a Pod, delete a claim; within MAX_CLAIMS and MAX_POD_GPUS."""
        rng = self.rng
        pending = sorted(c for c in self.claims if c not in self.pods)
        deletable = sorted(c for c in self.claims if c not in self.pinned)
        with_pods = sorted(c for c in self.pods if c not in self.pinned)
        choices = []
        if len(self.claims) < MAX_CLAIMS:
            choices += ["create pending", "create with pod", "create with pod"]
        if with_pods:
            choices.append("free pod")
        if pending and self.pod_gpus() < MAX_POD_GPUS:
            choices.append("give a pod")
        if deletable:
            choices += ["delete claim", "delete claim"]
        op = rng.choice(choices)
        self.ops[op] = self.ops.get(op, 0) + 1
        if op.startswith("create"):
            gpus = rng.choice((1, 1, 2))
            name = await self.create_claim(gpus)
            if op == "create with pod" and self.pod_gpus() + gpus <= MAX_POD_GPUS:
                await self.attach_pod(name)
        elif op == "free pod":
            # Only a Pod whose claim the scheduler has allocated and reserved for it: a Pod
            # deleted while the scheduler binds it can leave its claim allocated with no
            # consumer for a long while (the resourceclaim controller's business, not
            # ours), holding a device the churn's budget does not see.
            claims = await self.kube.list(RESOURCE_V1, "resourceclaims", namespace=self.namespace)
            bound = {c["metadata"]["name"] for c in claims if (c.get("status") or {}).get("reservedFor")}
            ready = [c for c in with_pods if c in bound]
            if ready:
                await self.free_pod(rng.choice(ready))
        elif op == "give a pod":
            fits = [c for c in pending if self.pod_gpus() + self.claims[c] <= MAX_POD_GPUS]
            if fits:
                await self.attach_pod(rng.choice(fits))
        else:
            await self.delete_claim(rng.choice(deletable))

    async def settled(self) -> tuple[list[Obj]] | None:
        """The claims (in a tuple: an empty list is an answer too), once the API server holds exactly the model: each claim with a Pod
        allocated, each without deallocated, every deleted one gone; else None."""
        claims = await self.kube.list(RESOURCE_V1, "resourceclaims", namespace=self.namespace)
        names = {c["metadata"]["name"] for c in claims}
        if names != set(self.claims):
            self.unsettled = f"claims {sorted(names)}, expected {sorted(self.claims)}"
            return None
        for claim in claims:
            allocated = bool((claim.get("status") or {}).get("allocation"))
            if claim["metadata"].get("deletionTimestamp") or allocated != (claim["metadata"]["name"] in self.pods):
                self.unsettled = f"claim {json.dumps({k: claim[k] for k in ('metadata', 'status') if k in claim})}"
                return None
        return (claims,)


# -- fixtures -----------------------------------------------------------------------------------


@dataclass
class World:
    kube: Kube
    cluster: ControlPlane
    namespace: str
    lease_namespace: str
    fleet: GpuFleet
    victim_node: str
    port: int
    tmp: Path

    def replica(self, who: str) -> Served:
        return Served(self.cluster, self.port, self.tmp / f"{who}.log", args=serve_args(self.lease_namespace),
                      env={"POD_NAME": who})

    async def count(self, claims: list[Obj]) -> Count:
        slices = await self.kube.list(RESOURCE_V1, "resourceslices")
        return from_scratch(claims, [s for s in slices if s["spec"].get("driver") == self.fleet.driver])

    async def status(self) -> Obj:
        obj = await self.kube.get(DQ, "devicequotas", "gpus", namespace=self.namespace)
        status: Obj = obj.get("status") or {}
        return status

    async def converged(self, churn: Churn, *, timeout: float = CONVERGE) -> tuple[Count, float]:
        """Wait for the churn to settle, then for the status to equal the count from scratch.
        The count and the seconds from settling to a matching status."""
        try:
            await poll(churn.settled, timeout=SETTLE, what="the churn to settle", max_interval=0.2)
        except AssertionError as err:
            err.add_note(f"not settled: {churn.unsettled}")
            raise
        started = time.monotonic()
        last: list[tuple[Count, Count]] = []

        async def matches() -> Count | None:
            settled = await churn.settled()
            if settled is None:
                return None  # moved again (a deallocation landing late): compare once it settles
            if any(CHARGE not in (c["metadata"].get("annotations") or {}) for c in settled[0]):
                return None  # one that arrived without a charge, until the leader charges it
            expected, seen = await self.count(settled[0]), as_count(await self.status())
            last[:] = [(expected, seen)]
            return expected if seen == expected else None

        try:
            expected = await poll(matches, timeout=timeout, what="the status to equal the count from scratch",
                                  interval=0.02, max_interval=0.1)
        except AssertionError as err:
            err.add_note(f"last (from scratch, status): {last}")
            raise
        return expected, time.monotonic() - started


@pytest_asyncio.fixture(loop_scope="session")
async def world(cluster: ControlPlane, kube: Kube, crd: None, make_namespace: MakeNamespace,
                make_fleet: MakeFleet, tmp_path: Path) -> AsyncIterator[World]:
    """A labelled namespace with a DeviceQuota far above the churn, a fleet of 8 80Gi
    GPUs (4+4) and the victim node's 2 141Gi ones (the class's largest: what a pending
    claim is estimated at until they go), and the webhook configurations on one port."""
    run = uuid.uuid4().hex[:8]
    fleet = await make_fleet("crash")
    for node in ("n1", "n2"):
        await fleet.add_node(node, [Gpu()] * 4)
    victim_node = await fleet.add_node("n3", [Gpu("NVIDIA H200", "141Gi")] * 2)
    namespace = await make_namespace("crash", labels={RUN_LABEL: run})
    lease_namespace = await make_namespace("crash-lease")
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                           "spec": {"hard": {"memory": "100Ti"}}}, namespace=namespace)
    port = free_ports(1)[0]
    async with installed(kube, adapted_webhooks(run, port, cluster)):
        yield World(kube, cluster, namespace, lease_namespace, fleet, victim_node, port, tmp_path)


def leading_lines(replica: Served) -> int:
    return replica.log_text().count("leading: Lease")


async def holder(kube: Kube, world: World) -> str:
    lease = await kube.get_or_none(LEASES, "leases", "crash", namespace=world.lease_namespace)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def to_leading(log: str) -> float:
    """Seconds from a process's first log line to its "leading" line (the log's asctime)."""
    lines = log.splitlines()
    stamp = [datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
             for line in (lines[0], next(x for x in lines if "leading: Lease" in x))]
    return stamp[1] - stamp[0]


def spread(values: list[float]) -> str:
    ordered = sorted(values)
    return f"p50 {ordered[len(ordered) // 2]:.2f}s max {ordered[-1]:.2f}s"


async def remove_devices(kube: Kube, world: World) -> None:
    """The driver republishes the victim node's pool empty (a new generation): the
    class's largest devices are gone, one or both of them allocated."""
    (obj,) = [s for s in await kube.list(RESOURCE_V1, "resourceslices")
              if s["spec"].get("nodeName") == world.victim_node]
    spec = obj["spec"]
    spec["devices"] = []
    spec["pool"]["generation"] += 1
    await kube.replace(RESOURCE_V1, "resourceslices", obj)


async def victim(churn: Churn, world: World) -> tuple[str, str]:
    """A claim allocated on the victim node (its Pod pinned there); its name and the device it holds."""
    name = await churn.create_claim(1)
    await churn.attach_pod(name, {"kubernetes.io/hostname": world.victim_node})
    claim = await churn.kube.wait_for(RESOURCE_V1, "resourceclaims", name,
                                      lambda c: bool((c.get("status") or {}).get("allocation")),
                                      namespace=churn.namespace, timeout=SETTLE, what="allocated")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == world.victim_node, result
    return name, str(result["device"])


# -- tests --------------------------------------------------------------------------------------


async def test_sigkill_at_20_random_points_of_the_churn_loses_and_double_counts_nothing(
        kube: Kube, world: World) -> None:
    rng = random.Random(SEED)
    print(f"\ncrash-safety seed {SEED} (CRASH_SEED={SEED} replays the choices)", file=sys.stderr)
    churn = Churn(kube, world.namespace, world.fleet, rng)
    served = world.replica("replica-a")
    try:
        with served.log_on_failure():
            await _killed_twenty_times(kube, world, churn, served, rng)
    finally:
        await served.kill()


async def _killed_twenty_times(kube: Kube, world: World, churn: Churn, served: Served, rng: random.Random) -> None:
    converge: list[float] = []
    retake: list[float] = []
    ready: list[float] = []
    await served.start()
    held_claim, held_device = await victim(churn, world)
    first, _ = await world.converged(churn)
    assert (first.used_memory, first.used_devices, first.allocated) == (141 * GiB, 1, 1), first
    slice_change = rng.randrange(KILLS // 2)  # in the first half: half the kills come after it
    kill_points = [(rng.randrange(OPS_PER_KILL), rng.uniform(0.0, 0.2)) for _ in range(KILLS)]

    for stretch, (after_op, delay) in enumerate(kill_points):
        done = asyncio.Event()
        restarted: list[asyncio.Task[None]] = []
        killed_at: list[int] = []
        before = leading_lines(served)

        async def killer() -> None:
            await done.wait()
            # A point in time after that operation: the scheduler, the resourceclaim
            # controller and the process's own writes are in flight.
            await asyncio.sleep(delay)
            await served.kill()
            killed_at.append(len(served.log_text()))  # the new process's log starts here
            restarted.append(asyncio.create_task(served.start()))

        kill = asyncio.create_task(killer())
        for op in range(OPS_PER_KILL):
            if stretch == slice_change and op == 0:
                await remove_devices(kube, world)
            else:
                await churn.step()
            if op == after_op:
                done.set()
        await kill
        await restarted[0]
        ready.append(served.ready_seconds)

        # It retook its own Lease at once (same identity), not after the lease duration.
        async def leads() -> bool:
            return leading_lines(served) > before

        await poll(leads, timeout=LEASE_DURATION * 3, what="the restarted process to lead")
        log = served.log_text()[killed_at[0]:]
        # Its first attempt took the Lease (a read, then the write): a process waiting out
        # its own lease would read it again every retry period first.
        attempts = re.findall(r"(GET|PUT|POST) /apis/coordination\.k8s\.io/v1/\S+/leases/crash -> (\d+)", log)
        assert attempts[:2] == [("GET", "200"), ("PUT", "200")], attempts[:6]
        seconds = to_leading(log)
        retake.append(seconds)
        count, seconds = await world.converged(churn)
        converge.append(seconds)

    # The last answer: the victim's claim still charged whole though its device is gone.
    final = as_count(await world.status())
    assert final == count
    assert served.log_text().count("leading: Lease") == KILLS + 1
    slices = [s for s in await kube.list(RESOURCE_V1, "resourceslices")
              if s["spec"].get("nodeName") == world.victim_node]
    assert held_device not in {d["name"] for d in slices[0]["spec"].get("devices") or []}
    victim_claim = await kube.get(RESOURCE_V1, "resourceclaims", held_claim, namespace=world.namespace)
    assert victim_claim["status"]["allocation"]["devices"]["results"][0]["device"] == held_device

    # Freeing the victim releases its charge once, too.
    await churn.delete_claim(held_claim)
    after, _ = await world.converged(churn)
    assert after.used_memory == count.used_memory - 141 * GiB and after.used_devices == count.used_devices - 1
    print(f"{KILLS} SIGKILLs over {sum(churn.ops.values())} churn operations {churn.ops}, "
          f"{churn.retried} creates retried; final {count}; restart to /readyz {spread(ready)}, "
          f"first log line to leading {spread(retake)}, settled to status correct {spread(converge)} "
          f"(noisy machine)", file=sys.stderr)


async def test_the_other_replica_takes_over_after_sigkill_and_the_numbers_stay_right(
        kube: Kube, world: World) -> None:
    churn = Churn(kube, world.namespace, world.fleet, random.Random(SEED))
    a, b = world.replica("replica-a"), world.replica("replica-b")
    try:
        with a.log_on_failure(), b.log_on_failure():
            await a.start()
            await poll(lambda: _holds(kube, world, "replica-a", a), timeout=LEASE_DURATION * 3,
                       what="replica-a to lead")
            await b.start()  # b's own readiness, not replica-a's /readyz (--reuse-port: Served.start)
            # Three claims allocated through Pods, two pending.
            held = [await churn.create_claim(gpus) for gpus in (1, 2, 1, 1, 2)]
            for claim in held[:3]:
                await churn.attach_pod(claim)
            before, _ = await world.converged(churn)
            assert (before.allocated, before.pending) == (3, 2), before

            started = time.monotonic()
            await a.kill()
            # While nobody leads: a claim deleted with its Pod, a Pod freed (its claim
            # deallocated), a pending claim given a Pod, a claim created. The new leader
            # must count all of it.
            await churn.delete_claim(held[0])
            await churn.free_pod(held[1])
            await churn.attach_pod(held[3])
            await churn.create_claim(1)
            await poll(lambda: _holds(kube, world, "replica-b", b), timeout=LEASE_DURATION * 4,
                       what="replica-b to take over", interval=0.05, max_interval=0.1)
            take_over = time.monotonic() - started
            after, seconds = await world.converged(churn)
            assert leading_lines(b) == 1
            assert (after.allocated, after.pending) == (2, 3), after
            print(f"take-over after SIGKILL of the leader {take_over:.2f}s (lease {LEASE_DURATION:.0f}s, "
                  f"renew deadline {RENEW_DEADLINE:.0f}s, retry {RETRY_PERIOD}s); status correct "
                  f"{seconds:.2f}s after the churn settled; before {before}, after {after} (noisy machine)",
                  file=sys.stderr)
            record("take-over after SIGKILL of the leader", take_over, target=LEASE_DURATION + RENEW_DEADLINE)
    finally:
        await a.kill()
        await b.kill()


async def _holds(kube: Kube, world: World, who: str, replica: Served) -> bool:
    return await holder(kube, world) == who and leading_lines(replica) > 0
