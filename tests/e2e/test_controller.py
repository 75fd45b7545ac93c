"""The quota controller in `dra-quota serve`, on the real 1.37 control plane.

The real scheduler allocates the claims (tests/e2e/driver.py's fake GPU nodes), the real
API server holds the DeviceQuota status both writers share (the webhook's
`status.reservations`, the controller's usage and conditions: quota.status.quotastatus), and
leader election runs on a real coordination.k8s.io/v1 Lease. The serve processes are
harness.py's `Served`, each with its own Lease identity (POD_NAME) and a Lease in a
namespace of this test, with short timings so take-overs are quick to observe.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from controllers.leader import LeaderElector
from kube.api import KubeApi
from quota.admission.admissiontoken import token_key
from quota.status.leases import Timing

from .cluster import ControlPlane, free_ports
from .driver import (RESOURCE_V1, Gpu, claim_spec, create_claim_template, create_pod, exact_request, free_pod,
                     wait_pod_allocated)
from .harness import (
    DQ, ROOT, MakeFleet, MakeNamespace, Served, Setup, amounts, annotated, create, review, running, top, wait_status,
)
from .kube import ApiError, Kube, Obj, poll, resource_path
from .timings import record
from .webhook_recorder import impersonated

pytestmark = pytest.mark.e2e

GiB = 1024**3
LEASES = "coordination.k8s.io/v1"
RBAC = "rbac.authorization.k8s.io/v1"
# Seconds: short, so that a take-over after SIGKILL is quick to see; the ratios are the
# defaults' (15/10/2 is what a Deployment gets).
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 6.0, 4.0, 1.0
TIMING = ("--leader-election-lease-duration", str(LEASE_DURATION),
          "--leader-election-renew-deadline", str(RENEW_DEADLINE),
          "--leader-election-retry-period", str(RETRY_PERIOD))

CONTENTION = "too much contention"  # kube.statuswriter.CONTENTION: denied, nothing reserved
LEASE = "dra-quota-controller"


def controller_args(lease_namespace: str, lease_name: str) -> tuple[str, ...]:
    # A long TTL: the race test checks every entry is still there afterwards.
    return ("--leader-election-namespace", lease_namespace, "--leader-election-lease-name", lease_name, *TIMING,
            "--reservation-ttl", "600")


@pytest_asyncio.fixture(loop_scope="session")
async def lease_namespace(make_namespace: MakeNamespace) -> str:
    return await make_namespace("lease")


@pytest_asyncio.fixture(loop_scope="session")
async def served(cluster: ControlPlane, crd: None, tmp_path: Path, lease_namespace: str) -> AsyncIterator[Served]:
    """Overrides conftest.py's: one replica, webhook and controller, leading its own Lease."""
    # --reuse-port: a second replica may join on the same port (the race test).
    handle = Served(cluster, free_ports(1)[0], tmp_path / "serve.log",
                    args=(*controller_args(lease_namespace, LEASE), "--reuse-port"), env={"POD_NAME": "replica-a"})
    async for running_handle in running(handle):
        yield running_handle


async def counted_quota(kube: Kube, setup: Setup, memory: str) -> Obj:
    """A DeviceQuota `gpus`, and its first status: the process holds it in its caches
    (the controller writes only quotas its ledger has, the ledger the webhook admits by)."""
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                           "spec": {"hard": {"memory": memory}}}, namespace=setup.namespace)
    return await wait_status(kube, setup.namespace, lambda s: s.get("observedGeneration") == 1, "the first status")


def condition(status: Obj, kind: str) -> Obj:
    found: Obj = next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})
    return found


# -- accounting ---------------------------------------------------------------------------------


async def test_used_is_exact_from_the_allocation_and_exceeded_follows_hard(kube: Kube, setup: Setup) -> None:
    ns, fleet = setup.namespace, setup.fleet
    with setup.served.log_on_failure():
        status = await counted_quota(kube, setup, "320Gi")
        assert (status["used"], status["reserved"], status["claims"]) == (amounts(0, 0), amounts(0, 0),
                                                                           {"allocated": 0, "pending": 0})
        assert condition(status, "Ready")["status"] == "True" and condition(status, "Exceeded")["status"] == "False"

        await create_claim_template(kube, ns, "pair", claim_spec(exact_request("gpu", fleet.device_class, count=2)))
        await create_pod(kube, ns, "p1", template="pair", node_selector=fleet.node_selector)
        _, claim = await wait_pod_allocated(kube, ns, "p1")
        # Exact: two 80Gi devices, as the scheduler chose them; the claim's reservation
        # entry left the status once a writer saw the claim (counted by it, not twice),
        # and the watermark says from which claim resourceVersion on.
        status = await wait_status(
            kube, ns, lambda s: s.get("used") == amounts(160, 2) and s.get("claims", {}).get("allocated") == 1
            and not s.get("reservations"), "used = the allocated devices")
        assert status["reserved"] == amounts(0, 0) and status["claims"] == {"allocated": 1, "pending": 0}
        assert int(status["claimsThrough"]) > 0 and claim["metadata"]["uid"]

        # Someone lowers hard below what is in use: Exceeded, for the new generation.
        patched = await kube.patch(DQ, "devicequotas", "gpus", {"spec": {"hard": {"memory": "100Gi"}}},
                                   namespace=ns)
        generation = patched["metadata"]["generation"]
        status = await wait_status(kube, ns, lambda s: s.get("observedGeneration") == generation
                                   and condition(s, "Exceeded").get("status") == "True", "Exceeded after lowering hard")
        assert condition(status, "Exceeded")["message"] == "used + reserved memory=160Gi is above hard memory=100Gi"
        # ... recorded as a Warning Event on the DeviceQuota.
        async def event() -> list[Obj]:
            events = await kube.list("events.k8s.io/v1", "events", namespace=ns)
            # With the quota's uid: `kubectl describe devicequota` selects Events by it.
            return [e for e in events if e.get("reason") == "QuotaExceeded" and e.get("action") == "Reconcile"
                    and e["regarding"] == {"apiVersion": DQ, "kind": "DeviceQuota", "name": "gpus", "namespace": ns,
                                           "uid": patched["metadata"]["uid"]}]

        (recorded,) = await poll(event, timeout=10, what="the QuotaExceeded Event")
        assert recorded["type"] == "Warning" and recorded["note"] == condition(status, "Exceeded")["message"]
        # `dra-quota top` reads what the controller wrote, as integers.
        code, out, err = await top("--kubeconfig", str(setup.served.cluster.kubeconfig), "-n", ns, "-o", "json")
        assert code == 0, err
        assert json.loads(out)["quotas"] == [{
            "kind": "DeviceQuota", "namespace": ns, "name": "gpus", "hard": {"memory": 100 * GiB},
            "used": {"memory": 160 * GiB, "devices": 2},
            "reserved": {"memory": 0, "devices": 0}, "claims": {"allocated": 1, "pending": 0}, "exceeded": True,
            "current": True}]

        # Deleting the pod frees the claim: used back to nothing, the entry dropped, not Exceeded.
        await free_pod(kube, ns, "p1")
        status = await wait_status(kube, ns, lambda s: s.get("used") == amounts(0, 0)
                                   and condition(s, "Exceeded").get("status") == "False", "used back to 0")
        assert status["claims"] == {"allocated": 0, "pending": 0} and status["reserved"] == amounts(0, 0)
        assert status["reservations"] == {}


async def test_the_controller_drops_an_entry_whose_claim_never_appeared(kube: Kube, setup: Setup) -> None:
    ns = setup.namespace
    with setup.served.log_on_failure():
        await counted_quota(kube, setup, "320Gi")
        # An admission whose claim was never persisted (another webhook denied the create):
        # an entry, keyed by a token no claim carries, expiring in 3 s. Nobody admits
        # anything afterwards.
        expires = datetime.fromtimestamp(time.time() + 3, timezone.utc).isoformat(timespec="milliseconds")
        obj = await kube.get(DQ, "devicequotas", "gpus", namespace=ns)
        obj["status"]["reservations"] = {token_key(secrets.token_hex(16)): {
            "claim": f"{ns}/never", "memory": 80 * GiB, "devices": 1, "expires": expires.replace("+00:00", "Z")}}
        await kube.replace(DQ, "devicequotas", obj, namespace=ns, subresource="status")
        await wait_status(kube, ns, lambda s: s.get("reserved") == amounts(80, 1), "the entry counted as reserved")
        status = await wait_status(kube, ns, lambda s: s.get("reservations") == {}, "the expired entry dropped",
                                   timeout=15)
        assert status["reserved"] == amounts(0, 0) and status["claims"] == {"allocated": 0, "pending": 0}


async def test_a_late_allocation_review_of_a_deleted_claim_never_counts_it(kube: Kube, setup: Setup) -> None:
    """The scheduler's allocation of a claim deleted meanwhile, validated on a stale copy
    (the API server's write then finds no claim), reaching serve after its watch saw the
    claim go: sent here as the API server sends it. Counted, it stayed in `used` for good,
    as no event ever came to release it (tests/e2e/test_crash_safety.py, CRASH_SEED=34108989,
    on a loaded machine: used 221Gi and 2 allocated claims against 141Gi and 1)."""
    ns, fleet = setup.namespace, setup.fleet
    with setup.served.log_on_failure():
        await counted_quota(kube, setup, "320Gi")
        stale = await create(kube, setup, "late")
        await wait_status(kube, ns, lambda s: s.get("claims") == {"allocated": 0, "pending": 1}, "the claim counted")
        await kube.delete(RESOURCE_V1, "resourceclaims", "late", namespace=ns)
        await wait_status(kube, ns, lambda s: s.get("claims") == {"allocated": 0, "pending": 0}
                          and s.get("reserved") == amounts(0, 0), "the claim gone")
        allocated = {**stale, "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": fleet.driver, "pool": fleet.nodes[0], "device": "gpu-0"}]}}}}
        assert await review(setup.served, {
            "uid": str(uuid.uuid4()), "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "subResource": "status", "name": "late", "namespace": ns, "operation": "UPDATE",
            "userInfo": {"username": "system:kube-scheduler", "groups": ["system:authenticated"]},
            "object": allocated, "oldObject": stale, "dryRun": False})
        # Any claim event of the namespace has the leader write the quota's status again.
        await create(kube, setup, "next")
        status = await wait_status(kube, ns, lambda s: s.get("claims", {}).get("pending") == 1, "the next claim counted")
        assert (status["used"], status["claims"]) == (amounts(0, 0), {"allocated": 0, "pending": 1})


async def test_reservations_written_while_the_controller_writes_are_never_lost(
        cluster: ControlPlane, kube: Kube, setup: Setup, lease_namespace: str, tmp_path: Path) -> None:
    """Both writers on one status at once: 40 concurrent admissions over two replicas on
    one port, each persisting its entry, while the leader's controller rewrites the
    status after those writes (the second replica's writes race it from another process,
    from its own, lagging, view of the object)."""
    ns, count = setup.namespace, 40
    second = Served(cluster, setup.served.port, tmp_path / "second.log",
                    args=(*controller_args(lease_namespace, LEASE), "--reuse-port"), env={"POD_NAME": "replica-b"})
    async for _ in running(second):  # ready itself, not only the port (--reuse-port: Served.start)
        await _race(kube, setup, second, count, lease_namespace)


async def _race(kube: Kube, setup: Setup, second: Served, count: int, lease_namespace: str) -> None:
    ns = setup.namespace
    with setup.served.log_on_failure(), second.log_on_failure():
        assert await holder(kube, lease_namespace, LEASE) == "replica-a"
        await counted_quota(kube, setup, f"{80 * count}Gi")
        uids: dict[str, str] = {}

        async def admitted(i: int) -> None:
            for _ in range(60):
                try:
                    created = await create(kube, setup, f"c{i}")
                except ApiError as err:
                    # Too much contention, or full counting another replica's lease (quota.accounting.headroom,
                    # part of it claims already counted): denied, reserving nothing; retry.
                    if CONTENTION in err.message or "leases other replicas hold" in err.message:
                        await asyncio.sleep(0.05)  # retry pacing, not synchronisation
                        continue
                    raise
                uids[created["metadata"]["uid"]] = f"c{i}"
                return
            raise AssertionError(f"claim c{i} denied for contention 60 times")

        await asyncio.gather(*(admitted(i) for i in range(count)))
        status = await wait_status(kube, ns, lambda s: s.get("claims", {}).get("pending") == count,
                                   f"{count} pending claims counted")
        # Nothing lost or counted twice: every claim is counted exactly once in reserved
        # (an entry the controller's write had erased before its claim was seen would have
        # let a replica over-admit; one kept besides its claim would count it twice).
        assert status["reserved"] == amounts(80 * count, count) and status["used"] == amounts(0, 0)
        # And the record holds only admissions in flight: once every claim is seen, none.
        await wait_status(kube, ns, lambda s: s.get("reservations") == {}, "the seen claims' entries dropped")
        leader, other = setup.served.log_text(), second.log_text()
        conflicts = sum(len(re.findall(r"conflict writing DeviceQuota \S+/gpus status", log)) for log in (leader, other))
        writes = len(re.findall(rf"DeviceQuota {ns}/gpus status: used", leader))
        served = [len(re.findall(r"/admit allowed CREATE \S+/c\d+ ", log)) for log in (leader, other)]
        print(f"{count} admissions (admitted by the replicas: {served}): {writes} controller status writes, "
              f"{conflicts} conflicts between the writers (noisy machine)")
        assert writes >= 2  # the controller did write during the burst, not only once after it
        assert "leading: Lease" not in other  # the second replica only admitted

        # The leader dies (SIGKILL) and half the claims go: the other replica takes over
        # and the numbers converge on what is left, the deleted claims' entries dropped.
        await setup.served.kill()
        gone = sorted(uids)[: count // 2]
        for uid in gone:
            await kube.delete(RESOURCE_V1, "resourceclaims", uids[uid], namespace=ns)
        await poll(lambda: _holder_is(kube, lease_namespace, LEASE, "replica-b"), timeout=LEASE_DURATION * 3,
                   what="replica-b to lead")
        left = count - len(gone)
        status = await wait_status(kube, ns, lambda s: s.get("claims", {}).get("pending") == left
                                   and not s.get("reservations"), "the new leader's count of what is left")
        assert status["reserved"] == amounts(80 * left, left) and status["used"] == amounts(0, 0)


async def test_a_controller_only_replica_needs_no_listener_and_no_certificate(
        cluster: ControlPlane, kube: Kube, crd: None, tmp_path: Path, lease_namespace: str,
        make_namespace: MakeNamespace, make_fleet: MakeFleet) -> None:
    fleet = await make_fleet("ctlonly")
    await fleet.add_node("n1", [Gpu()] * 2)
    ns = await make_namespace("ctlonly")
    port = free_ports(1)[0]
    # No --tls-* flags and --cert-mode self's default: with --no-webhook nothing is minted.
    only = Served(cluster, port, tmp_path / "controller.log", args=controller_args(lease_namespace, "ctl-only"),
                  env={"POD_NAME": "controller-only"}, webhook=False)
    async for _ in running(only):
        await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                               "spec": {"hard": {"memory": "80Gi"}}}, namespace=ns)
        await wait_status(kube, ns, lambda s: s.get("observedGeneration") == 1, "the first status")
        await create_claim_template(kube, ns, "one", claim_spec(exact_request("gpu", fleet.device_class)))
        await create_pod(kube, ns, "p1", template="one", node_selector=fleet.node_selector)
        await wait_pod_allocated(kube, ns, "p1")
        await wait_status(kube, ns, lambda s: s.get("used") == amounts(80, 1), "used from the allocation")
        log = only.log_text()
        assert "serving admission reviews" not in log and "leading: Lease" in log
        with pytest.raises(OSError):  # nothing listens on the port
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
        assert await kube.get_or_none("v1", "secrets", "dra-quota-webhook-tls", namespace="dra-quota-system") is None


# -- leader election ----------------------------------------------------------------------------


async def holder(kube: Kube, namespace: str, name: str) -> str:
    lease = await kube.get_or_none(LEASES, "leases", name, namespace=namespace)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


async def _holder_is(kube: Kube, namespace: str, name: str, who: str) -> bool:
    return await holder(kube, namespace, name) == who


def leading_lines(replica: Served) -> int:
    return replica.log_text().count("leading: Lease")


async def test_one_leader_a_fast_hand_over_on_sigterm_and_a_take_over_after_sigkill(
        cluster: ControlPlane, kube: Kube, crd: None, tmp_path: Path, lease_namespace: str) -> None:
    name = f"ctl-{uuid.uuid4().hex[:6]}"
    ports = free_ports(2)
    replicas = {who: Served(cluster, port, tmp_path / f"{who}.log", args=controller_args(lease_namespace, name),
                            env={"POD_NAME": who})
                for who, port in zip(("replica-a", "replica-b"), ports)}

    async def leads(who: str) -> bool:
        return await holder(kube, lease_namespace, name) == who and leading_lines(replicas[who]) > 0

    try:
        wall_started = time.time()
        await asyncio.gather(*(r.start() for r in replicas.values()))
        first = await poll(lambda: holder(kube, lease_namespace, name), timeout=30, what="a leader")
        other = next(w for w in replicas if w != first)
        await poll(lambda: leads(first), timeout=10, what=f"{first} to log that it leads")
        # Exactly one leads: the other has never said so, and the Lease names one holder.
        assert leading_lines(replicas[other]) == 0
        lease = await kube.get(LEASES, "leases", name, namespace=lease_namespace)
        renewed = datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00")).timestamp()
        # Real UTC, not local time: written between the replicas' start and this read (an
        # order, not a bound; local time would be hours off either way outside UTC).
        assert wall_started <= renewed <= time.time(), (wall_started, lease["spec"])
        assert lease["spec"]["leaseDurationSeconds"] == LEASE_DURATION

        # SIGTERM: the leader releases the Lease before it exits (no holder: the other
        # may take it at its next retry instead of waiting the lease duration out).
        started = time.monotonic()
        code, _ = await replicas[first].terminate()
        assert code == 0 and "released Lease" in replicas[first].log_text()
        after_exit = (await kube.get(LEASES, "leases", name, namespace=lease_namespace))["spec"]
        assert after_exit.get("holderIdentity") in (None, "", other), after_exit
        await poll(lambda: leads(other), timeout=LEASE_DURATION * 3, what=f"{other} to lead after SIGTERM")
        hand_over = time.monotonic() - started
        record("hand-over after SIGTERM", hand_over, target=LEASE_DURATION / 2)

        # The old leader comes back as a candidate and must not take the Lease from a
        # live leader; SIGKILL of the leader (no release) hands over once the lease
        # duration has passed (how long after: recorded).
        await replicas[first].start()
        await poll(lambda: holder(kube, lease_namespace, name), timeout=5, what="the Lease still held")
        assert await holder(kube, lease_namespace, name) == other
        before = leading_lines(replicas[first])
        started = time.monotonic()
        await replicas[other].kill()
        await poll(lambda: leads(first), timeout=LEASE_DURATION * 3, what=f"{first} to take over after SIGKILL")
        take_over = time.monotonic() - started
        assert leading_lines(replicas[first]) == before + 1
        record("take-over after SIGKILL", take_over, target=LEASE_DURATION + 2 * RETRY_PERIOD + 2.0)
        print(f"hand-over after SIGTERM {hand_over:.2f}s, take-over after SIGKILL {take_over:.2f}s "
              f"(lease {LEASE_DURATION:.0f}s, retry {RETRY_PERIOD:.0f}s; noisy machine)")
    finally:
        for replica in replicas.values():
            await replica.kill()


# -- RBAC ---------------------------------------------------------------------------------------

SHIPPED_RBAC = [d for d in yaml.safe_load_all((ROOT / "deploy/manifests/rbac-leader-election.yaml").read_text()) if d]
ACCOUNT = "system:serviceaccount:dra-quota-system:dra-quota"


class AsAccount(KubeApi):
    """The product's own client, every request impersonating the shipped service account
    (the API server adds its service-account groups)."""

    async def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = await super()._headers(content_type)
        headers["Impersonate-User"] = ACCOUNT
        return headers


async def test_the_shipped_rbac_lets_the_elector_lead_and_nothing_more(cluster: ControlPlane, kube: Kube) -> None:
    namespace, name = "dra-quota-system", "dra-quota-controller"
    created: list[tuple[str, str]] = []
    try:
        for kind, plural, body in [("Namespace", "namespaces", {"kind": "Namespace", "metadata": {"name": namespace}}),
                                   *((d["kind"], d["kind"].lower() + "s", d) for d in SHIPPED_RBAC)]:
            api_version = "v1" if kind == "Namespace" else RBAC
            try:
                await kube.create(api_version, plural, body, namespace=None if kind == "Namespace" else namespace)
                if kind != "Namespace":
                    created.append((plural, body["metadata"]["name"]))
            except ApiError as err:
                if err.status != 409:
                    raise
        api = await AsAccount.from_kubeconfig(str(cluster.kubeconfig))
        elector = LeaderElector(api, name=name, namespace=namespace, identity="rbac-test",
                                timing=Timing(LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD))
        leading = asyncio.Event()

        async def work() -> None:
            leading.set()
            await asyncio.Event().wait()

        task = asyncio.create_task(elector.run(work))
        try:
            # Created (first ever), then renewed: both as the account (RBAC caches may lag
            # the binding by a moment: the elector retries).
            await asyncio.wait_for(leading.wait(), 30)
            first = (await kube.get(LEASES, "leases", name, namespace=namespace))["spec"]["renewTime"]

            async def renewed() -> bool:
                lease = await kube.get(LEASES, "leases", name, namespace=namespace)
                return bool(lease["spec"]["renewTime"] != first)

            await poll(renewed, timeout=RENEW_DEADLINE, what="a renewal as the service account")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.close()
        # SIGTERM's release (an update) passed too.
        assert await holder(kube, namespace, name) == ""
        # And nothing more: another Lease, a list, a delete, a patch.
        for method, path in [("GET", resource_path(LEASES, "leases", "other", namespace)),
                             ("GET", resource_path(LEASES, "leases", namespace=namespace)),
                             ("DELETE", resource_path(LEASES, "leases", name, namespace)),
                             ("PATCH", resource_path(LEASES, "leases", name, namespace))]:
            with pytest.raises(ApiError) as refused:
                await impersonated(kube, method, path, user=ACCOUNT, body={} if method == "PATCH" else None)
            assert refused.value.status == 403, (method, path)
    finally:
        for plural, obj_name in created:
            await kube.delete(RBAC, plural, obj_name, namespace=namespace)
        await kube.delete(LEASES, "leases", name, namespace=namespace)


# -- the allocation record: a device that vanishes keeps its exact charge --------------------


RECORD = "draquota.io/allocated-charge"


async def test_a_vanished_device_keeps_its_exact_charge_across_a_restart(kube: Kube, setup: Setup) -> None:
    """Two GPUs of one node, 80Gi and 141Gi: admitted at the class's largest (2 x 141Gi),
    allocated 221Gi. The leader records each device's charge on the claim; the 141Gi GPU
    then leaves the slice. The running process and one restarted after a SIGKILL both
    charge 221Gi. Without the record they re-priced it from the admission charge:
    80 + (282 - 80) = 282Gi."""
    ns, fleet = setup.namespace, setup.fleet
    node = await fleet.add_node("mixed", [Gpu("NVIDIA H200", "141Gi"), Gpu()])
    with setup.served.log_on_failure():
        await counted_quota(kube, setup, "1Ti")
        await create_claim_template(kube, ns, "pair", claim_spec(exact_request("gpu", fleet.device_class, count=2)))
        await create_pod(kube, ns, "p1", template="pair", node_selector={"kubernetes.io/hostname": node})
        _, claim = await wait_pod_allocated(kube, ns, "p1")
        name = claim["metadata"]["name"]
        charge = (await annotated(kube, ns, name))["draquota.io/charge"]
        assert json.loads(charge) == {"memory": 282 * GiB, "devices": 2}
        devices = {f"{r['driver']}/{r['pool']}/{r['device']}": r["device"]
                   for r in claim["status"]["allocation"]["devices"]["results"]}
        expected = {key: (141 if device == "gpu-0" else 80) * GiB for key, device in devices.items()}

        async def recorded() -> Obj | None:
            got = await kube.get(RESOURCE_V1, "resourceclaims", name, namespace=ns)
            raw = (got["metadata"].get("annotations") or {}).get(RECORD)
            return got if raw is not None and json.loads(raw) == expected else None

        await poll(recorded, timeout=30, what="the leader's record of each device's charge")
        await wait_status(kube, ns, lambda s: s.get("used") == amounts(221, 2), "used = 80Gi + 141Gi")

        # Nobody else may lower it (the webhook refuses any value but the record).
        with pytest.raises(ApiError) as refused:
            await kube.patch(RESOURCE_V1, "resourceclaims", name,
                             {"metadata": {"annotations": {RECORD: json.dumps({k: 1 for k in expected})}}}, namespace=ns)
        assert f"annotation {RECORD} is written by dra-quota" in str(refused.value)

        # The 141Gi GPU leaves the node's slice (the driver republishes its pool).
        (obj,) = [s for s in await kube.list(RESOURCE_V1, "resourceslices") if s["spec"].get("nodeName") == node]
        obj["spec"]["devices"] = [d for d in obj["spec"]["devices"] if d["name"] != "gpu-0"]
        obj["spec"]["pool"]["generation"] += 1
        await kube.replace(RESOURCE_V1, "resourceslices", obj)
        # An event on the claim makes the running process price it again: still 221Gi.
        await kube.patch(RESOURCE_V1, "resourceclaims", name, {"metadata": {"labels": {"touched": "1"}}}, namespace=ns)
        quota = await kube.patch(DQ, "devicequotas", "gpus", {"spec": {"hard": {"memory": "2Ti"}}}, namespace=ns)
        status = await wait_status(kube, ns, lambda s: s.get("observedGeneration") == quota["metadata"]["generation"],
                                   "the running process's status after the device left")
        assert status["used"] == amounts(221, 2)

        # SIGKILL and restart: the new leader never saw the 141Gi GPU; it reads the record.
        await setup.served.kill()
        await setup.served.start()
        quota = await kube.patch(DQ, "devicequotas", "gpus", {"spec": {"hard": {"memory": "3Ti"}}}, namespace=ns)
        status = await wait_status(kube, ns, lambda s: s.get("observedGeneration") == quota["metadata"]["generation"],
                                   "the restarted leader's status")
        assert status["used"] == amounts(221, 2)
