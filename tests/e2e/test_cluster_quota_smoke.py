"""ClusterDeviceQuota on the real 1.37 API server, one `serve`: the smoke test.

A team of two namespaces (labelled `team.draquota.io/name: <run>`) under one
ClusterDeviceQuota of two GPUs, a third namespace outside it: creates from both team
namespaces are denied once the team is full, naming the ClusterDeviceQuota; the status
holds the team's totals and each namespace's part; relabelling a namespace out frees
the team at once, relabelling it back in with its claim makes the team Exceeded (an
Event, nothing evicted); deleting the quota drops what it held. And the shipped
ValidatingAdmissionPolicy (deploy/manifests/team-label-policy.yaml): a tenant bound to
`edit`, and a user who may patch Namespaces but is not in `teamLabels`, cannot move a
namespace between teams. The concurrent, multi-replica, crash-safe proof is
test_team_quota.py's.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from quota.quotas.devicequota import SELECTOR_KEYS_MESSAGE

from .cluster import ControlPlane
from .driver import RESOURCE_V1, Gpu, GpuFleet, claim_spec, exact_request
from .harness import (
    ADMISSION, DQ, QUOTA_HOOK, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, advised, denial,
    edit_binding,
    governed, installed,
)
from .kube import ApiError, Kube, Obj, poll
from .webhook_recorder import impersonated

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
POLICY = [d for d in yaml.safe_load_all((ROOT / "deploy/manifests/team-label-policy.yaml").read_text())
          if d and d["kind"].startswith("ValidatingAdmissionPolicy")]
TEAM_LABEL = "team.draquota.io/name"
CDQ = "clusterdevicequotas"
RBAC = "rbac.authorization.k8s.io/v1"
POLICY_PLURALS = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies",
                  "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}


@dataclass
class Team:
    run: str
    name: str  # the ClusterDeviceQuota's, and the team label's value
    a: str  # team namespaces (a sorts before b)
    b: str
    outside: str  # a namespace the team does not select
    fleet: GpuFleet
    served: Served


@pytest_asyncio.fixture(loop_scope="session")
async def team(cluster: ControlPlane, kube: Kube, served: Served, make_namespace: MakeNamespace,
               make_fleet: MakeFleet) -> AsyncIterator[Team]:
    run = uuid.uuid4().hex[:8]
    name = f"team-{run}"
    fleet = await make_fleet("team")
    await fleet.add_node("n1", [Gpu()] * 4)  # 80Gi each
    labels = {RUN_LABEL: run, TEAM_LABEL: name}
    a = await make_namespace("team-a", labels=labels)
    b = await make_namespace("team-b", labels=labels)
    outside = await make_namespace("alone", labels={RUN_LABEL: run})
    async with installed(kube, adapted_webhooks(run, served.port, cluster)):
        await kube.create(DQ, CDQ, {"kind": "ClusterDeviceQuota", "metadata": {"name": name},
                                    "spec": {"namespaceSelector": {"matchLabels": {TEAM_LABEL: name}},
                                             "hard": {"memory": "160Gi"}}})
        try:
            for namespace in (a, b):
                await governed(kube, namespace)  # the leader marks a team's namespaces too
            t = Team(run, name, a, b, outside, fleet, served)

            async def enforced() -> bool:  # three GPUs never fit the team: once it is in the caches
                message = await denial(create(kube, t, a, "probe", count=3, dry_run=True))
                return f'exceeded ClusterDeviceQuota "{name}"' in message

            await poll(enforced, timeout=30, what="the webhook to enforce the ClusterDeviceQuota")
            yield t
        finally:
            await kube.delete(DQ, CDQ, name)


async def create(kube: Kube, team: Team, namespace: str, name: str, *, count: int = 1, dry_run: bool = False) -> Obj:
    body = {"kind": "ResourceClaim", "metadata": {"name": name},
            "spec": claim_spec(exact_request("gpu", team.fleet.device_class, count=count))}
    return await kube.create(RESOURCE_V1, "resourceclaims", body, namespace=namespace, dry_run=dry_run)


def full(team: Team, reserved: str, namespace: str) -> str:
    """Denied by the team quota from `namespace`: only claims not allocated yet hold the room."""
    return advised(f'admission webhook "{QUOTA_HOOK}" denied the request: exceeded ClusterDeviceQuota '
                   f'"{team.name}": requested memory=80Gi, used memory=0, reserved memory={reserved}, '
                   "limited memory=160Gi", "reserved", namespace=namespace)


async def team_status(kube: Kube, team: Team, holds: Callable[[Obj], bool], what: str) -> Obj:
    async def probe() -> Obj | None:
        status: Obj = (await kube.get(DQ, CDQ, team.name)).get("status") or {}
        return status if holds(status) else None

    result: Obj = await poll(probe, timeout=30, what=what)
    return result


def part(namespace: str, reserved: str, pending: int) -> Obj:
    return {"namespace": namespace, "used": {"memory": "0", "devices": 0},
            "reserved": {"memory": reserved, "devices": pending}, "claims": {"allocated": 0, "pending": pending}}


async def test_a_team_is_full_across_its_namespaces_and_a_relabel_frees_it(kube: Kube, team: Team) -> None:
    with team.served.log_on_failure():
        await create(kube, team, team.a, "c1")
        await create(kube, team, team.b, "c2")  # 160Gi: the team is full
        for namespace in (team.a, team.b):
            assert await denial(create(kube, team, namespace, "c3")) == full(team, "160Gi", namespace)
        await create(kube, team, team.outside, "free")  # not the team's
        status = await team_status(kube, team, lambda s: (s.get("claims") or {}).get("pending") == 2,
                                   "the team's status to count both claims")
        assert status["reserved"] == {"memory": "160Gi", "devices": 2}
        assert status["namespaces"] == [part(team.a, "80Gi", 1), part(team.b, "80Gi", 1)]
        # The team's second watermark (quota.accounting.reservations), kept by the API server (the CRD names it).
        assert str(status.get("namespacesThrough")).isdigit(), status
        # The CRD keeps the team-only condition that says the breakdown is whole.
        listed = {c["type"]: c for c in status["conditions"]}["NamespacesListed"]
        assert (listed["status"], listed["reason"]) == ("True", "AllListed"), listed

        # team-b leaves the team: its claim stops counting at once, team-a's create fits.
        await kube.patch("v1", "namespaces", team.b, {"metadata": {"labels": {TEAM_LABEL: None}}})

        async def admitted() -> bool:
            return not await denial(create(kube, team, team.a, "c4", dry_run=True))

        await poll(admitted, timeout=30, what="the relabel to free the team")
        await create(kube, team, team.a, "c4")
        status = await team_status(kube, team, lambda s: [n["namespace"] for n in s.get("namespaces") or []] == [team.a]
                                   and (s.get("claims") or {}).get("pending") == 2, "team-b gone from the breakdown")
        assert status["namespaces"] == [part(team.a, "160Gi", 2)]

        # team-b joins again with its claim: the team is over hard (nothing evicted), its
        # Exceeded condition turns True and a Warning Event regards it, in `default`.
        await kube.patch("v1", "namespaces", team.b, {"metadata": {"labels": {TEAM_LABEL: team.name}}})
        status = await team_status(kube, team, lambda s: any(
            c.get("type") == "Exceeded" and c.get("status") == "True" for c in s.get("conditions") or []),
            "the team to turn Exceeded")
        assert status["reserved"] == {"memory": "240Gi", "devices": 3}

        async def event() -> Obj | None:
            events = await kube.list("events.k8s.io/v1", "events", namespace="default")
            return next((e for e in events if e["regarding"].get("name") == team.name
                         and e["reason"] == "QuotaExceeded" and e.get("action") == "Reconcile"), None)

        found = await poll(event, timeout=30, what="the QuotaExceeded Event on the ClusterDeviceQuota")
        assert found["regarding"]["kind"] == "ClusterDeviceQuota" and found["type"] == "Warning"
        assert "used + reserved memory=240Gi is above hard memory=160Gi" in found["note"], found["note"]

        # Deleting the team quota drops what it held: nothing counts against it any more.
        await kube.delete(DQ, CDQ, team.name)

        async def unlimited() -> bool:
            return not await denial(create(kube, team, team.a, "c5", count=3, dry_run=True))

        await poll(unlimited, timeout=30, what="the deleted team quota to hold nothing")


# -- who may move a namespace between teams (the ValidatingAdmissionPolicy) -----------------------


@pytest_asyncio.fixture(loop_scope="session")
async def guard(kube: Kube, team: Team) -> AsyncIterator[tuple[str, str]]:
    """The shipped policy (a unique name: policies are cluster-wide), and two users: one
    bound to `edit` in team-a, one who may patch every Namespace but is in no `teamLabels`."""
    created: list[tuple[str, str, str, str | None]] = []
    tenant, operator = f"tenant-{team.run}", f"operator-{team.run}"

    async def make(api: str, plural: str, body: Obj, namespace: str | None = None) -> None:
        await kube.create(api, plural, body, namespace=namespace)
        created.append((api, plural, body["metadata"]["name"], namespace))

    try:
        policy = ""
        for obj in copy.deepcopy(POLICY):
            obj["metadata"]["name"] += f"-{team.run}"
            if obj["kind"] == "ValidatingAdmissionPolicy":
                policy = obj["metadata"]["name"]
            else:
                obj["spec"]["policyName"] = policy
            await make(ADMISSION, POLICY_PLURALS[obj["kind"]], obj)
        await make(RBAC, "rolebindings", edit_binding(tenant, f"edit-{team.run}"), team.a)
        role = f"namespace-patcher-{team.run}"
        await make(RBAC, "clusterroles", {"kind": "ClusterRole", "metadata": {"name": role}, "rules": [
            {"apiGroups": [""], "resources": ["namespaces", "namespaces/status"],
             "verbs": ["get", "create", "patch", "update"]}]})
        await make(RBAC, "clusterrolebindings", {"kind": "ClusterRoleBinding", "metadata": {"name": role},
                                                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                             "kind": "ClusterRole", "name": role},
                                                 "subjects": [{"kind": "User", "name": operator}]})
        yield tenant, operator
    finally:
        for api, plural, name, namespace in reversed(created):
            await kube.delete(api, plural, name, namespace=namespace)


async def relabel(kube: Kube, namespace: str, value: str | None, *, user: str, groups: tuple[str, ...] = (),
                  key: str = TEAM_LABEL, subresource: str = "") -> str:
    """Set (None: remove) label `key` on `namespace` (or through its `subresource`) as
    `user`, dry run: "" when allowed, else the API server's status and message."""
    path = f"/api/v1/namespaces/{namespace}" + (f"/{subresource}" if subresource else "")
    return await refusal_of(impersonated(kube, "PATCH", path, user=user, groups=groups,
                                         body={"metadata": {"labels": {key: value}}}, params={"dryRun": "All"}))


async def refusal_of(call: Awaitable[Any]) -> str:
    try:
        await call
    except ApiError as err:
        return f"{err.status}: {err.message}"
    return ""


async def test_only_team_label_principals_move_a_namespace_between_teams(kube: Kube, team: Team,
                                                                        guard: tuple[str, str]) -> None:
    tenant, operator = guard
    refusal = "and the principals of dra-quota's teamLabels.users and teamLabels.groups may add, change or remove"

    async def refused() -> str | None:
        # The policy and its binding take a moment to load, and so does the operator's
        # RBAC binding: until it does, RBAC refuses first ("cannot patch"), not the policy.
        message = await relabel(kube, team.a, None, user=operator)
        return message if refusal in message else None

    message = await poll(refused, timeout=60, what="the policy to refuse the operator's relabel")
    assert message.startswith("403: ") and refusal in message and f'"{operator}"' in message, message
    for namespace, value in ((team.a, "other-team"), (team.outside, team.name)):  # change; add
        message = await relabel(kube, namespace, value, user=operator)
        assert message.startswith("403: ") and refusal in message, message
    # Other labels stay the operator's to change: only team labels are guarded.
    assert await relabel(kube, team.a, "42", user=operator, key="example.com/cost-center") == ""
    # A tenant with `edit` may not write its Namespace at all (RBAC, before any policy).
    message = await relabel(kube, team.a, None, user=tenant)
    assert message.startswith("403: ") and 'cannot patch resource "namespaces"' in message, message
    # The status subresource writes a Namespace's labels too (pkg/registry/core/namespace/
    # strategy.go keeps only its spec): guarded the same.
    message = await relabel(kube, team.a, None, user=operator, subresource="status")
    assert message.startswith("403: ") and refusal in message, message
    # A Namespace created with a team label would join that team: refused; without one, not.
    def new_namespace(labels: dict[str, str]) -> Awaitable[Any]:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"new-{team.run}", "labels": labels}}
        return impersonated(kube, "POST", "/api/v1/namespaces", user=operator, body=body,
                            params={"dryRun": "All"}, content_type="application/json")

    message = await refusal_of(new_namespace({TEAM_LABEL: team.name}))
    assert message.startswith("403: ") and refusal in message, message
    assert await refusal_of(new_namespace({"example.com/cost-center": "42"})) == ""
    # A cluster admin (the default teamLabels.groups, system:masters) may.
    assert await relabel(kube, team.outside, team.name, user="platform-admin", groups=("system:masters",)) == ""


@pytest.mark.parametrize(("selector", "message"), [
    ({"matchLabels": {"team": "ml"}}, SELECTOR_KEYS_MESSAGE),
    # The prefix is matched whole: neither a longer domain nor a longer first label passes.
    ({"matchLabels": {"team.draquota.io.evil/name": "ml"}}, SELECTOR_KEYS_MESSAGE),
    ({"matchExpressions": [{"key": "xteam.draquota.io/name", "operator": "Exists"}]}, SELECTOR_KEYS_MESSAGE),
    ({"matchExpressions": [{"key": "draquota.io/governed", "operator": "Exists"}]}, SELECTOR_KEYS_MESSAGE),
    ({"matchExpressions": [{"key": "team.draquota.io/name", "operator": "In"}]},
     "values must be specified when operator is In or NotIn"),
])
async def test_the_crd_refuses_a_selector_a_tenant_could_escape(kube: Kube, crd: None, selector: Obj,
                                                                message: str) -> None:
    body = {"kind": "ClusterDeviceQuota", "metadata": {"name": f"bad-{uuid.uuid4().hex[:8]}"},
            "spec": {"namespaceSelector": selector, "hard": {"devices": 1}}}
    with pytest.raises(ApiError) as refused:
        await kube.create(DQ, CDQ, body, dry_run=True)
    assert refused.value.status == 422 and message in refused.value.message, refused.value.message
