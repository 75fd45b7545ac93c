"""The leader's AdmissionCheck controller over the real caches: one Workload's failure
is that Workload's (a warning Event), never the decision loop's, which
would stop the leader and then each next one that meets the same Workload."""

from __future__ import annotations

from typing import Any

import pytest

from controllers.kueue import AdmissionCheckController, TemplateStore, WorkloadStore
from kube.events import EventKey, EventRecorder
from kube.quotawriter import Reservations
from quota.accounting.ledgerentry import ClaimRef
from quota.quotas.devicequota import parse_cluster_device_quota
from quota.values.model import Namespace

from ..builders import exactly, make_claim, make_cluster_quota, request
from ..quota.accounting.test_workloads import pod_set, state
from .test_kueue_caches import caches

FREE = "team-free"  # no DeviceQuota: deciding needs no status write, only the Workload's


def pending(uid: str, name: str, *, created: str) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": name, "namespace": FREE, "uid": uid, "creationTimestamp": created},
            "spec": {"podSets": [pod_set("main", 1, ["gpus"])]},
            "status": {"admissionChecks": [state("dq", "Pending")],
                       "conditions": [{"type": "QuotaReserved", "status": "True"}]}}


class Api:
    """The one write a decision makes here: our entry on the Workload's status."""

    def __init__(self) -> None:
        self.patched: list[tuple[str, str]] = []

    async def patch(self, resource: Any, name: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        if body["kind"] == "Workload":
            self.patched.append((name, body["status"]["admissionChecks"][0]["state"]))
        return body


class Recorder(EventRecorder):
    def __init__(self) -> None:
        super().__init__(sink=None, instance="test")  # type: ignore[arg-type]
        self.keys: list[EventKey] = []

    def record(self, key: EventKey) -> bool:
        self.keys.append(key)
        return True


@pytest.mark.parametrize("failure", [RuntimeError("a bug"), MemoryError()])
async def test_a_workload_whose_decision_raises_fails_alone_and_the_next_is_decided(
        failure: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    kc, _, _ = caches()
    TemplateStore(kc).upsert(make_claim("gpus", request("gpu", exactly("gpu")), kind="ResourceClaimTemplate",
                                        namespace=FREE))
    WorkloadStore(kc).replace([pending("w-bad", "first", created="2026-01-01T00:00:00Z"),
                               pending("w-good", "second", created="2026-01-01T00:00:01Z")])
    real = kc.admitter.workload_entry

    def workload_entry(namespace: Namespace, ref: ClaimRef, claims: Any) -> Any:
        if ref == "w-bad":
            raise failure
        return real(namespace, ref, claims)

    monkeypatch.setattr(kc.admitter, "workload_entry", workload_entry)
    api, recorder = Api(), Recorder()
    controller = AdmissionCheckController(api, kc, Reservations(api, kc.ledger, ttl=60),  # type: ignore[arg-type]
                                          recorder, leading=lambda: True)
    await controller.reconcile()
    assert api.patched == [("second", "Ready")]
    assert kc.ledger.holding(ClaimRef("w-good")) is not None and kc.ledger.holding(ClaimRef("w-bad")) is None
    assert [(k.regarding.name, k.reason) for k in recorder.keys if k.reason != "DeviceQuotaReserved"] == [
        ("first", "DeviceQuotaCheckFailed")]


def test_a_held_workload_whose_pricing_raises_keeps_its_holding(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the stores (every replica): the exception is logged and what it held stays
    counted, since counting less could over-commit."""
    kc, _, _ = caches()
    store = WorkloadStore(kc)
    ready = pending("w-1", "job", created="")
    ready["metadata"]["namespace"] = "team-a"
    ready["status"]["admissionChecks"] = [state("dq", "Ready")]
    store.upsert(ready)
    held = kc.ledger.holding(ClaimRef("w-1"))
    assert held is not None

    def broken(*_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(kc.admitter, "workload_entry", broken)
    ready["spec"]["podSets"][0]["count"] = 2
    store.upsert(ready)  # does not raise
    assert kc.ledger.holding(ClaimRef("w-1")) == held


async def test_a_workload_in_a_namespace_not_in_the_cache_yet_waits_while_team_quotas_exist() -> None:
    # Which ClusterDeviceQuotas select a namespace is in its labels: checked against its
    # DeviceQuotas alone, the Workload would be held without reserving on its team.
    kc, _, _ = caches()
    kc.ledger.add_or_update_quota(parse_cluster_device_quota(make_cluster_quota("ml", team="ml", memory="80Gi")))
    TemplateStore(kc).upsert(make_claim("gpus", request("gpu", exactly("gpu")), kind="ResourceClaimTemplate",
                                        namespace=FREE))
    WorkloadStore(kc).replace([pending("w-1", "job", created="2026-01-01T00:00:00Z")])
    api = Api()
    controller = AdmissionCheckController(api, kc, Reservations(api, kc.ledger, ttl=60),  # type: ignore[arg-type]
                                          Recorder(), leading=lambda: True)
    await controller.reconcile()
    assert api.patched == [("job", "Retry")] and kc.ledger.holding(ClaimRef("w-1")) is None
    kc.ledger.set_namespace(Namespace(FREE), {})  # its Namespace arrives: no team selects it
    await controller.reconcile()
    assert api.patched[-1] == ("job", "Ready")
