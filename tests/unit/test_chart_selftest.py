"""The chart's `helm test` hook (templates/tests/selftest.yaml), rendered by the real helm:
a Pod running `dra-quota selftest` hardened as the Deployment's, with an account that may
create ResourceClaims in the test's namespace and nothing else, in a namespace the
webhooks are called for. That the rights suffice against a real API server and the
verdicts it gives: tests/e2e/test_selftest.py."""

from __future__ import annotations

import re
from typing import Any

import pytest

from commands.cli import _parser
from quota.values.raw import Obj

from ..tools.chart import NAMESPACE, HelmError, find, notes, render

HOOK = "templates/tests/selftest.yaml"


def hook(values: dict[str, Any] | None = None, **kwargs: Any) -> list[Obj]:
    return render(values, tests=True, include_crds=False, show_only=HOOK, **kwargs)


@pytest.fixture(scope="module")
def default() -> list[Obj]:
    return hook()


def test_an_install_creates_no_test_objects() -> None:
    """`helm template`/the shipped manifest leave the hook out (`helm test` creates it)."""
    installed = render()
    assert not [o for o in installed if "helm.sh/hook" in (o["metadata"].get("annotations") or {})]
    assert [o for o in installed if o["kind"] == "Pod"] == []


def test_every_object_is_a_test_hook(default: list[Obj]) -> None:
    assert sorted(o["kind"] for o in default) == ["Pod", "Role", "RoleBinding", "ServiceAccount"]
    for obj in default:
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "test"
        assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    # Its rights exist before the Pod starts (helm creates hooks by weight, Pod at 0)...
    assert all(int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0 for o in default if o["kind"] != "Pod")
    # ... and the Pod stays after it ran, for `helm test --logs`.
    assert find(default, "Pod")["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation"


def test_the_pod_runs_selftest_in_the_test_namespace_hardened_as_the_deployment(default: list[Obj]) -> None:
    pod = find(default, "Pod")["spec"]
    deployment = find(render(), "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = _parser().parse_args(container["args"])  # flags the CLI accepts (SystemExit otherwise)
    assert (args.command, args.namespace) == ("selftest", "default")
    assert pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == find(default, "ServiceAccount")["metadata"]["name"] == "dra-quota-selftest"
    assert pod["securityContext"] == deployment["securityContext"]
    assert container["securityContext"] == deployment["containers"][0]["securityContext"]
    assert container["image"] == deployment["containers"][0]["image"]
    assert container["resources"] == {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
    # Not the Deployment's Pods: the Service and the PDB never select it.
    selector = find(render(), "Service")["spec"]["selector"]
    assert not selector.items() <= find(default, "Pod")["metadata"]["labels"].items()


def test_the_account_may_create_claims_in_the_test_namespace_only() -> None:
    objects = hook({"selftest": {"namespace": "team-a"}}, release="gpu", namespace="platform")
    role, binding = find(objects, "Role"), find(objects, "RoleBinding")
    account = find(objects, "ServiceAccount")["metadata"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "team-a"
    assert role["rules"] == [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["create"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"], "namespace": "platform"}]
    assert account["namespace"] == find(objects, "Pod")["metadata"]["namespace"] == "platform"
    assert "--namespace=team-a" in find(objects, "Pod")["spec"]["containers"][0]["args"]
    # No ClusterRole, no binding of one: nothing cluster-wide.
    assert not [o for o in objects if o["kind"].startswith("Cluster")]


@pytest.mark.parametrize("values,namespace", [
    ({"selftest": {"namespace": NAMESPACE}}, NAMESPACE),
    ({"selftest": {"namespace": "kube-system"}}, "kube-system"),
    ({"selftest": {"namespace": "gpu"}, "webhooks": {"excludeNamespaces": ["gpu"]}}, "gpu"),
])
def test_a_namespace_the_webhooks_skip_is_refused(values: dict[str, Any], namespace: str) -> None:
    """By `helm install` too (it renders the hooks), not only once `helm test` runs."""
    for rendering in (hook, render):
        with pytest.raises(HelmError, match=re.escape(f'selftest.namespace "{namespace}" is never sent to the webhooks')):
            rendering(values)


def test_a_bad_namespace_name_is_refused_by_the_schema() -> None:
    with pytest.raises(HelmError, match="selftest/namespace"):
        hook({"selftest": {"namespace": "Team_A"}})


@pytest.mark.parametrize("opt_in", ["", "draquota.io/enabled"])
def test_the_notes_say_how_to_run_the_test(opt_in: str) -> None:
    text = " ".join(notes({"selftest": {"namespace": "team-a"}, "webhooks": {"optInLabel": opt_in}}).split())
    assert "helm test dra-quota -n dra-quota-system --logs" in text
    assert "a dry-run claim in namespace team-a" in text
    assert ("which must carry the label draquota.io/enabled" in text) == bool(opt_in), text
