"""controllers.kueue's caches: holdings derived from the Workloads the stores see, the
leader's provisional holding kept through a stale event, released on finish."""

from __future__ import annotations

import asyncio
from typing import Any

from controllers.kueue import CheckStore, KueueCaches, PodLookup, TemplateStore, WorkloadStore
from quota.accounting.ledger import QuotaKey
from quota.accounting.ledgerentry import ClaimRef, Entry
from quota.accounting.workloads import WORKLOAD_LABEL
from quota.objects.claims import parse_claim
from quota.quotas.devicequota import DeviceQuota
from quota.values.model import Charge, Namespace

from ..builders import GiB, exactly, make_claim, request
from ..quota.accounting.test_workloads import admitter, pod_set, state

NS = Namespace("team-a")


def workload(check: str, **conditions: str) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": "job-a", "namespace": "team-a", "uid": "w-1"},
            "spec": {"podSets": [pod_set("main", 1, ["gpus"])]},
            "status": {"admissionChecks": [state("dq", check)],
                       "conditions": [{"type": t, "status": s} for t, s in {"QuotaReserved": "True", **conditions}.items()]}}


def caches() -> tuple[KueueCaches, list[str], list[tuple[QuotaKey, ...] | None]]:
    forgotten: list[str] = []
    changed: list[tuple[QuotaKey, ...] | None] = []
    kc = KueueCaches(admitter(), forget=forgotten.append,
                     changed=lambda keys: changed.append(None if keys is None else tuple(keys)))
    CheckStore(kc).replace([{"metadata": {"name": "dq"}, "spec": {"controllerName": "draquota.io/devicequota"}},
                            {"metadata": {"name": "other"}, "spec": {"controllerName": "example.com/x"}}])
    TemplateStore(kc).replace([make_claim("gpus", request("gpu", exactly("gpu", count=2)), kind="ResourceClaimTemplate")])
    return kc, forgotten, changed


def test_a_ready_workload_holds_its_price_until_it_finishes() -> None:
    kc, forgotten, changed = caches()
    store = WorkloadStore(kc)
    store.replace([workload("Pending")])
    assert kc.ledger.usage(NS, "gpus").workloads == Charge()
    store.upsert(workload("Ready", Admitted="True"))
    assert kc.ledger.usage(NS, "gpus").workloads == Charge(160 * GiB, 2)
    assert changed[-1] == ((NS, "gpus"),)  # the quota whose usage the holding moved
    store.upsert(workload("Ready", Admitted="True", Finished="True"))
    assert kc.ledger.usage(NS, "gpus").workloads == Charge()
    assert forgotten == ["w-1"]  # its persisted entry counts no more either


def test_the_leaders_holding_survives_a_stale_pending_event_and_becomes_the_derived_one() -> None:
    kc, forgotten, _ = caches()
    store = WorkloadStore(kc)
    store.replace([workload("Pending")])
    entry = kc.price(kc.workloads["w-1"])
    assert not isinstance(entry, str)
    kc.ledger.set_holding(entry)  # what AdmissionCheckController.decide does before its write
    kc.deciding.add("w-1")
    store.upsert(workload("Pending"))  # Kueue's write from before ours
    assert kc.ledger.holding(ClaimRef("w-1")) is not None and forgotten == []
    store.upsert(workload("Ready"))
    assert kc.deciding == set() and kc.ledger.holding(ClaimRef("w-1")) is not None
    store.delete(workload("Ready"))
    assert kc.ledger.holding(ClaimRef("w-1")) is None and forgotten == ["w-1"]


def test_a_workload_whose_template_is_missing_holds_nothing() -> None:
    kc, _, _ = caches()
    TemplateStore(kc).replace([])
    WorkloadStore(kc).replace([workload("Ready")])
    assert kc.ledger.usage(NS, "gpus").workloads == Charge()


class FakePods:
    """The one call PodLookup makes, answered from dicts; counts the calls."""

    def __init__(self, pods: dict[str, dict[str, Any]]) -> None:
        self.pods = pods
        self.gets = 0

    async def get(self, _resource: Any, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        self.gets += 1
        return self.pods[name]


def stamped(owner_uid: str) -> Any:
    obj = make_claim("c", request("gpu", exactly("gpu", count=2)))
    obj["metadata"]["uid"] = f"claim-of-{owner_uid}"
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner_uid, "uid": owner_uid,
                                           "controller": True}]
    return parse_claim(obj)


def charges(kc: KueueCaches, pod: str) -> dict[DeviceQuota, Charge]:
    """What the webhook would reserve for `pod`'s claim (`webhook.claimreview`: priced once)."""
    entry = kc.admitter.price_for_admission(stamped(pod), namespace_labels=None)
    assert isinstance(entry, Entry)
    return kc.admitter.charges(entry)


def test_a_pod_the_cache_has_not_seen_is_read_once_and_only_where_workloads_hold() -> None:
    kc, _, _ = caches()
    pods = FakePods({"p1": {"metadata": {"uid": "p1", "labels": {WORKLOAD_LABEL: "w-1"}}},
                     "p2": {"metadata": {"uid": "p2", "labels": {}}}})
    lookup = PodLookup(pods, kc.admitter)  # type: ignore[arg-type]
    asyncio.run(lookup(stamped("p1"), "p1"))
    assert pods.gets == 0  # no Workload holds quota in the namespace: nothing to draw on
    WorkloadStore(kc).replace([workload("Ready")])
    asyncio.run(lookup(stamped("p1"), "p1"))
    assert pods.gets == 1 and kc.ledger.knows_pod("p1")
    quota = kc.ledger.quotas(NS)[0]
    assert charges(kc, "p1")[quota] == Charge()  # the claim draws on the Workload's 160Gi
    asyncio.run(lookup(stamped("p1"), "p1"))
    asyncio.run(lookup(stamped("p2"), "p2"))
    asyncio.run(lookup(stamped("p2"), "p2"))
    assert pods.gets == 2  # p1 known, p2 read once and remembered unlabelled
    assert charges(kc, "p2")[quota] == Charge(160 * GiB, 2)
