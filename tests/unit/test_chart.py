"""The Helm chart deploy/helm/dra-quota, rendered and linted by the real helm.

helm is built from the Go module proxy (tests/tools/build-helm.sh, via
tests.tools.chart.helm_binary); when it cannot be built these tests fail with the build
output, they never skip. What is checked here is what rendering can show: the shipped
manifest is the chart's default rendering, the CRD, webhook configurations and
adminAccess policy are the objects of deploy/ (one source each), values reach the
objects they name, every rendered `serve` flag is one the CLI accepts, and bad values
are refused with a reason. That the API server accepts the objects and that the RBAC
is enough for `serve` is tests/e2e/test_chart.py.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from commands.cli import _parser
from quota.admission.policy import ADMIN_ACCESS_GRANT, parse_policy
from quota.devices.memorysources import parse_memory_sources
from quota.manifests import tenant_view_role
from quota.values.raw import Obj

from ..tools.chart import (
    CHART, COPIES, MANIFEST, NAMESPACE, PROMETHEUS_RULE, ROOT, HelmError, documents, find, lint, render,
    shipped_manifest, shipped_prometheus_rule,
)

SOURCE_CRDS = [ROOT / "deploy" / "crds" / "devicequota.yaml", ROOT / "deploy" / "crds" / "clusterdevicequota.yaml",
               ROOT / "deploy" / "crds" / "appliedclusterdevicequota.yaml"]
SOURCE_WEBHOOKS = documents((ROOT / "deploy" / "manifests" / "webhooks.yaml").read_text())
SOURCE_POLICY = documents((ROOT / "deploy" / "manifests" / "admin-access-policy.yaml").read_text())
SOURCE_GOVERNED = documents((ROOT / "deploy" / "manifests" / "governed-label-policy.yaml").read_text())
SOURCE_TEAMS = documents((ROOT / "deploy" / "manifests" / "team-label-policy.yaml").read_text())
SOURCE_EVENTS = documents((ROOT / "deploy" / "manifests" / "rbac-events.yaml").read_text())
SOURCE_LEADER = documents((ROOT / "deploy" / "manifests" / "rbac-leader-election.yaml").read_text())
KINDS = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
# Each claim webhook, governed and ungoverned: (name prefix, resource).
CLAIM_HOOKS = (("quota", "resourceclaims"), ("quota", "resourceclaimtemplates"), ("allocation", "resourceclaims"),
               ("annotations", "resourceclaims"))
FAILURE_POLICY_KEYS = {
    **{f"{hook}.{resource}.draquota.io": "governed" for hook, resource in CLAIM_HOOKS},
    **{f"{hook}-ungoverned.{resource}.draquota.io": "ungoverned" for hook, resource in CLAIM_HOOKS},
    "extended-resources.pods.draquota.io": "extendedResources",
    "admin-access.namespaces.draquota.io": "adminAccess",
}
GOVERNED = {"key": "draquota.io/governed", "operator": "In", "values": ["true"]}
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
FILES = {"certificates": {"mode": "files", "files": {"caBundle": CA_PEM}}}
CERT_MANAGER = {"certificates": {"mode": "cert-manager"}}
MONITORING = {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                          "dashboard": {"enabled": True}},
              "networkPolicy": {"enabled": True, "webhookFrom": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]}}


@pytest.fixture(scope="module")
def default() -> list[Obj]:
    return render()


def without_labels(obj: Obj) -> Obj:
    out = copy.deepcopy(obj)
    out["metadata"].pop("labels", None)
    return out


def assert_labels_kept(source: Obj, rendered: Obj) -> None:
    """The chart may add the Helm labels, never drop or change the source's."""
    labels = rendered["metadata"].get("labels") or {}
    assert source["metadata"]["labels"].items() <= labels.items(), (source["metadata"]["name"], labels)


def container(objects: Sequence[Obj]) -> Obj:
    containers: list[Obj] = find(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def serve_args(objects: Sequence[Obj]) -> argparse.Namespace:
    """The Deployment's arguments parsed by the real `dra-quota` parser (SystemExit on an unknown flag)."""
    c = container(objects)
    assert c.get("command") is None, "the image's entrypoint is the console script"
    return _parser().parse_args(c["args"])


def rules_of(objects: Sequence[Obj], kind: str) -> list[Obj]:
    found = [o for o in objects if o["kind"] == kind]
    return [r for o in found for r in o["rules"]]


# -- helm itself --------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, CERT_MANAGER, FILES,
                                    {"podAntiAffinity": "hard", "replicaCount": 3},
                                    {"adminAccess": {"validatingAdmissionPolicy": {"enabled": False}},
                                     "podDisruptionBudget": {"enabled": False}},
                                    MONITORING],
                         ids=["defaults", "cert-manager", "files", "hard-anti-affinity", "no-policy-no-pdb",
                              "monitoring"])
def test_helm_lint_strict_passes(values: dict[str, Any] | None) -> None:
    proc = lint(values)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_the_shipped_manifest_is_the_chart_rendered_with_defaults() -> None:
    assert MANIFEST.read_text() == shipped_manifest(), (
        f"{MANIFEST.relative_to(ROOT)} differs from the chart's rendering: run `python -m tests.tools.chart`")


def value_paths(schema: Obj, prefix: str = "") -> list[str]:
    """Every value the schema declares, dotted; an object with free keys (labels, resources,
    ...) is one value."""
    paths = []
    for key, sub in schema.get("properties", {}).items():
        paths.extend(value_paths(sub, f"{prefix}{key}.") if "properties" in sub else [f"{prefix}{key}"])
    return paths


def test_the_install_page_names_every_value() -> None:
    """docs/install.md's Helm section lists every value (`a.{b,c}` names a.b and a.c)."""
    page = (ROOT / "docs" / "install.md").read_text()
    start = page.index("## Install on a cluster (Helm)")
    section = page[start:page.index("\n## ", start)]
    named = set()
    for code in re.findall(r"`([A-Za-z][\w.{},]*)`", section):
        braced = re.fullmatch(r"([\w.]*)\{([\w,]+)\}", code)
        named |= {braced[1] + key for key in braced[2].split(",")} if braced else {code}
    schema = json.loads((CHART / "values.schema.json").read_text())
    paths = value_paths(schema)
    assert len(paths) > 50 and "metrics.dashboard.folder" in paths
    assert [p for p in paths if p not in named] == [], "values missing from docs/install.md's Helm section"


def test_the_chart_version_is_the_distribution_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["version"] == chart["appVersion"] == version


# -- one source for the CRD, the webhook configurations and the policy --------------------------


@pytest.mark.parametrize("chart_file", list(COPIES), ids=[c.name for c in COPIES])
def test_the_charts_copies_are_their_sources_in_deploy(chart_file: Path) -> None:
    """Helm reads only files inside the chart: the CRD, the alert rules and the dashboard are
    copies there, and their sources (`COPIES`) stay the ones people edit."""
    source = COPIES[chart_file]
    assert chart_file.read_bytes() == source.read_bytes(), (
        f"{chart_file.relative_to(ROOT)} must be a copy of {source.relative_to(ROOT)}: "
        "run `python -m tests.tools.chart`")


@pytest.mark.parametrize("source", SOURCE_CRDS, ids=[s.name for s in SOURCE_CRDS])
def test_the_crds_are_those_of_deploy_crds(default: list[Obj], source: Path) -> None:
    crd = yaml.safe_load(source.read_text())
    assert find(default, "CustomResourceDefinition", crd["metadata"]["name"]) == crd


def test_the_webhook_configurations_are_those_of_deploy_manifests(default: list[Obj]) -> None:
    assert {o["kind"] for o in SOURCE_WEBHOOKS} == KINDS
    for source in SOURCE_WEBHOOKS:
        rendered = find(default, source["kind"], source["metadata"]["name"])
        assert_labels_kept(source, rendered)
        assert without_labels(rendered) == without_labels(source)


def test_each_failure_policy_comes_from_its_value(default: list[Obj]) -> None:
    flipped = {key: "Fail" if key in ("ungoverned", "extendedResources") else "Ignore"
               for key in FAILURE_POLICY_KEYS.values()}
    objects = render({"webhooks": {"failurePolicy": flipped}})
    for kind in KINDS:
        before, after = find(default, kind), find(objects, kind)
        for old, new in zip(before["webhooks"], after["webhooks"], strict=True):
            assert new["failurePolicy"] == flipped[FAILURE_POLICY_KEYS[new["name"]]] != old["failurePolicy"]
            assert {**new, "failurePolicy": None} == {**old, "failurePolicy": None}


def test_claim_webhooks_fail_closed_only_where_governed(default: list[Obj]) -> None:
    """Each claim webhook comes twice: Fail for namespaces the leader labelled governed,
    Ignore for every other one (NotIn also matches a namespace without the label)."""
    hooks = {h["name"]: h for kind in KINDS for h in find(default, kind)["webhooks"]}
    for hook, resource in CLAIM_HOOKS:
        closed, open_ = hooks[f"{hook}.{resource}.draquota.io"], hooks[f"{hook}-ungoverned.{resource}.draquota.io"]
        assert (closed["failurePolicy"], open_["failurePolicy"]) == ("Fail", "Ignore")
        assert GOVERNED in closed["namespaceSelector"]["matchExpressions"]
        assert {**GOVERNED, "operator": "NotIn"} in open_["namespaceSelector"]["matchExpressions"]
        assert {**closed, "name": "", "failurePolicy": "", "namespaceSelector": {}} == {
            **open_, "name": "", "failurePolicy": "", "namespaceSelector": {}}
    assert not [h for h in hooks.values() if "DELETE" in h["rules"][0]["operations"]]


def test_an_opt_in_label_narrows_every_webhook(default: list[Obj]) -> None:
    """A staged rollout: only namespaces carrying webhooks.optInLabel reach any webhook."""
    objects = render({"webhooks": {"optInLabel": "draquota.io/enabled"}})
    before = [h for kind in sorted(KINDS) for h in find(default, kind)["webhooks"]]
    after = [h for kind in sorted(KINDS) for h in find(objects, kind)["webhooks"]]
    for old, new in zip(before, after, strict=True):
        added = [e for e in new["namespaceSelector"]["matchExpressions"]
                 if e not in old["namespaceSelector"]["matchExpressions"]]
        assert added == [{"key": "draquota.io/enabled", "operator": "Exists"}], new["name"]


def test_the_chart_refuses_to_render_without_an_image() -> None:
    with pytest.raises(HelmError, match=re.escape("image.repository is required: no dra-quota image is published")):
        render(image=False)
    assert container(render({"image": {"repository": "r.example/dq", "tag": "1.2"}}))["image"] == "r.example/dq:1.2"


def test_the_admin_access_policy_events_and_lease_rbac_are_those_of_deploy_manifests(default: list[Obj]) -> None:
    # Each is proven on the real API server by its own e2e test (test_admin_access_policy,
    # test_fail_closed, test_observability, test_controller): the chart renders exactly those.
    for source in SOURCE_POLICY + SOURCE_GOVERNED + SOURCE_TEAMS + SOURCE_EVENTS + SOURCE_LEADER:
        rendered = find(default, source["kind"], source["metadata"]["name"])
        assert_labels_kept(source, rendered)
        assert without_labels(rendered) == without_labels(source)
    objects = render({"adminAccess": {"validatingAdmissionPolicy": {"enabled": False}}})
    assert [o["metadata"]["name"] for o in objects if o["kind"].startswith("ValidatingAdmissionPolicy")] == [
        "dra-quota-governed-label", "dra-quota-team-labels",
        "dra-quota-governed-label", "dra-quota-team-labels"]  # those are not optional
    find(objects, "ConfigMap", "dra-quota-admin-access")  # the allowlist stays: the webhook's too
    find(objects, "Role", "dra-quota-admin-access-reader")


def test_the_team_label_principals_come_from_values() -> None:
    policy = find(render({"teamLabels": {"users": ["alice"], "groups": ["platform-admins", "ops"]}}),
                  "ValidatingAdmissionPolicy", "dra-quota-team-labels")
    (validation,) = policy["spec"]["validations"]
    assert 'request.userInfo.username in ["alice"]' in validation["expression"]
    assert 'g in ["platform-admins","ops"]' in validation["expression"]
    nobody = find(render({"teamLabels": {"users": [], "groups": []}}), "ValidatingAdmissionPolicy",
                  "dra-quota-team-labels")
    assert "in []" in nobody["spec"]["validations"][0]["expression"]


def test_tenants_read_their_namespaces_device_quotas_through_view_edit_and_admin(default: list[Obj]) -> None:
    role = find(default, "ClusterRole", "dra-quota-view")
    aggregated = {k for k, v in role["metadata"]["labels"].items()
                  if k.startswith("rbac.authorization.k8s.io/aggregate-to-") and v == "true"}
    # Aggregation is not transitive: each built-in role selects its own label.
    assert aggregated == {f"rbac.authorization.k8s.io/aggregate-to-{r}" for r in ("view", "edit", "admin")}
    # Read only, as ResourceQuota for namespace edit/admin; no ClusterDeviceQuota (another team's data):
    # its AppliedClusterDeviceQuotas instead, the team's numbers with this namespace's part alone.
    assert role["rules"] == [{"apiGroups": ["draquota.io"], "resources": ["devicequotas", "appliedclusterdevicequotas"],
                              "verbs": ["get", "list", "watch"]}]
    # The demo installs the packaged copy: the same rules and aggregation.
    packaged = tenant_view_role()
    assert packaged["rules"] == role["rules"]
    assert {k: v for k, v in packaged["metadata"]["labels"].items() if k.startswith("rbac.")} == \
        {k: v for k, v in role["metadata"]["labels"].items() if k.startswith("rbac.")}


@pytest.mark.parametrize(("policy", "resource", "labeler"), [
    ("dra-quota-team-labels", "teams", "dra-quota-team-labeler"),
    ("dra-quota-admin-access-label", "adminaccess", "dra-quota-admin-access-labeler"),
])
def test_rbac_grants_the_label_policies_beside_their_lists(default: list[Obj], policy: str, resource: str,
                                                          labeler: str) -> None:
    """cluster-admin (`*` on `*`) passes the authorizer check; a ClusterRole grants the rest."""
    vap = find(default, "ValidatingAdmissionPolicy", policy)
    check = f"authorizer.group('draquota.io').resource('{resource}').check('label').allowed()"
    expressions = [v["expression"] for v in vap["spec"].get("variables", []) + vap["spec"]["validations"]]
    assert sum(check in e for e in expressions) == 1, expressions
    assert ".namespace(" not in " ".join(expressions)  # cluster-scoped: no RoleBinding grants it
    assert labeler in vap["spec"]["validations"][0]["messageExpression"]
    role = find(default, "ClusterRole", labeler)
    assert role["rules"] == [{"apiGroups": ["draquota.io"], "resources": [resource], "verbs": ["label"]}]
    assert not [k for k in role["metadata"]["labels"] if k.startswith("rbac.authorization.k8s.io/aggregate")]
    group, plural, verb = ADMIN_ACCESS_GRANT  # what the webhook's SubjectAccessReview asks
    assert (group, verb) == ("draquota.io", "label") and (resource != "adminaccess" or plural == resource)


def test_the_allowlist_reaches_the_policy_and_serve_alike() -> None:
    allow = {"users": ["alice", "bob@example.com"], "groups": ["platform-admins"],
             "serviceAccounts": ["gpu-ops:auditor", "monitoring:*"],
             "claimControllers": ["system:kube-controller-manager"]}
    objects = render({"adminAccess": allow})
    params = find(objects, "ConfigMap", "dra-quota-admin-access")["data"]
    assert params["users"] == "alice, bob@example.com" and params["serviceAccounts"] == "gpu-ops:auditor, monitoring:*"
    policy = parse_policy(params)  # as serve parses the ConfigMap it watches
    assert (policy.users, policy.service_accounts, policy.claim_controllers) == (
        frozenset(allow["users"]), frozenset(allow["serviceAccounts"]), frozenset(allow["claimControllers"]))
    # serve watches exactly that ConfigMap, and the reader Role names exactly it.
    assert serve_args(objects).admin_access_configmap == (NAMESPACE, "dra-quota-admin-access")
    reader = find(objects, "Role", "dra-quota-admin-access-reader")["rules"]
    assert reader == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["dra-quota-admin-access"],
                       "verbs": ["list", "watch"]}]
    # Defaults: nobody, and the resourceclaim controller as the claim controller.
    assert parse_policy(find(render(), "ConfigMap", "dra-quota-admin-access")["data"]) == parse_policy({})


# -- the Deployment -----------------------------------------------------------------------------


def test_the_pod_is_hardened(default: list[Obj]) -> None:
    deployment = find(default, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(default)["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["serviceAccountName"] == "dra-quota"
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container(default)["env"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    probes = {k: container(default)[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert [p["path"] for p in probes.values()] == ["/healthz", "/healthz", "/readyz"]
    assert all(p["port"] == "https" and p["scheme"] == "HTTPS" for p in probes.values())
    assert container(default)["ports"][0] == {"name": "https", "containerPort": 8443, "protocol": "TCP"}
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    hard = find(render({"podAntiAffinity": "hard"}), "Deployment")["spec"]["template"]["spec"]["affinity"]
    assert hard["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [term]


def test_values_reach_the_serve_flags(default: list[Obj]) -> None:
    args = serve_args(default)
    assert (args.command, args.port, args.cert_mode, args.default_pricing, args.allocation_check) == (
        "serve", 8443, "self", "conservative", "enforce")
    assert (args.log_format, args.log_level, args.reservation_ttl) == ("json", "info", 120.0)
    assert (args.requeue_waiting_pods, args.metrics_port) == (True, 8080)
    changed = serve_args(render({"serve": {"defaultPricing": "optimistic", "allocationCheck": "account-only",
                                           "reservationTTLSeconds": 90, "port": 9443, "logFormat": "text",
                                           "logLevel": "debug", "extraArgs": ["--cert-check-period=30m"]}}))
    assert (changed.port, changed.default_pricing, changed.allocation_check, changed.reservation_ttl) == (
        9443, "optimistic", "account-only", 90.0)
    assert (changed.log_format, changed.log_level, changed.cert_check_period.total_seconds()) == ("text", "debug", 1800)


def test_memory_sources_reach_serve_through_a_configmap(default: list[Obj]) -> None:
    # Default: the shipped sources built in, no ConfigMap, no flag.
    assert serve_args(default).memory_sources == [] and serve_args(default).default_memory_sources
    assert not [o for o in default if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("memory-sources")]
    entries = [{"name": "gaudi.intel.com", "sources": [
        {"selector": 'device.attributes["gaudi.intel.com"].model == "Gaudi4"', "memory": "192Gi"}]}]
    objects = render({"serve": {"memorySources": entries, "defaultMemorySources": False}})
    args = serve_args(objects)
    assert (args.memory_sources, args.default_memory_sources) == (
        ["/etc/dra-quota/memory-sources/memory-sources.yaml"], False)
    config = find(objects, "ConfigMap", "dra-quota-memory-sources")
    sources = parse_memory_sources(yaml.safe_load(config["data"]["memory-sources.yaml"]), "the ConfigMap")
    assert list(sources.drivers) == ["gaudi.intel.com"]
    pod = find(objects, "Deployment")["spec"]["template"]
    assert {"name": "memory-sources", "configMap": {"name": "dra-quota-memory-sources"}} in pod["spec"]["volumes"]
    assert "draquota.io/memory-sources-checksum" in pod["metadata"]["annotations"]


@pytest.mark.parametrize("release,namespace", [("dra-quota", NAMESPACE), ("gpu", "platform")])
def test_names_agree_across_objects(release: str, namespace: str) -> None:
    """What serve is told (Service, Secret, configurations) is what the chart creates and RBAC grants."""
    objects = render(release=release, namespace=namespace)
    args = serve_args(objects)
    service = find(objects, "Service")
    account = find(objects, "ServiceAccount")["metadata"]["name"]
    assert (args.namespace, args.service_name) == (namespace, service["metadata"]["name"])
    # Both get their caBundle from serve: the mutating one admits claims (/admit).
    validating = find(objects, "ValidatingWebhookConfiguration")["metadata"]["name"]
    mutating = find(objects, "MutatingWebhookConfiguration")["metadata"]["name"]
    assert args.webhook_configurations == (("validating", validating), ("mutating", mutating))
    granted = {n for r in rules_of(objects, "Role") if r["resources"] == ["secrets"] for n in r.get("resourceNames", [])}
    fullname = find(objects, "Deployment")["metadata"]["name"]
    assert args.admin_access_configmap == (namespace, find(objects, "ConfigMap", f"{fullname}-admin-access")[
        "metadata"]["name"])
    assert granted == {args.cert_secret}
    configs = [r for r in rules_of(objects, "ClusterRole") if r.get("apiGroups") == ["admissionregistration.k8s.io"]]
    assert [set(r["resourceNames"]) for r in configs] == [{name for _, name in args.webhook_configurations}]
    me = f"system:serviceaccount:{namespace}:{account}"
    for kind in KINDS:
        for hook in find(objects, kind)["webhooks"]:
            ref = hook["clientConfig"]["service"]
            assert (ref["namespace"], ref["name"], ref["port"]) == (namespace, service["metadata"]["name"], 443)
            assert namespace in hook["namespaceSelector"]["matchExpressions"][0]["values"]
            for condition in hook.get("matchConditions", []):
                if condition["name"] == "not-dra-quota-itself":
                    assert condition["expression"] == f"request.userInfo.username != '{me}'"
    assert service["spec"]["selector"] == find(objects, "Deployment")["spec"]["selector"]["matchLabels"]
    assert find(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    bindings = [o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert len(bindings) == 5
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]


# -- certificate modes and their RBAC -----------------------------------------------------------


def test_only_self_managed_certificates_get_secret_and_configuration_rights(default: list[Obj]) -> None:
    assert [r["verbs"] for r in find(default, "Role", "dra-quota")["rules"]] == [["get", "update"], ["create"]]
    for values in (CERT_MANAGER, FILES):
        objects = render(values)
        assert sorted(o["metadata"]["name"] for o in objects if o["kind"] in ("Role", "RoleBinding")) == [
            "dra-quota-admin-access-reader"] * 2 + ["dra-quota-leader-election"] * 2
        cluster_rules = rules_of(objects, "ClusterRole")
        assert all(r.get("apiGroups") != ["admissionregistration.k8s.io"] for r in cluster_rules)
        assert all("secrets" not in r.get("resources", []) for r in cluster_rules)
        args = serve_args(objects)
        assert args.cert_mode == "files" and (str(args.tls_cert_file), str(args.tls_key_file)) == (
            "/etc/dra-quota/tls/tls.crt", "/etc/dra-quota/tls/tls.key")
        pod = find(objects, "Deployment")["spec"]["template"]["spec"]
        tls = next(v for v in pod["volumes"] if v["name"] == "tls")
        assert tls["secret"]["secretName"] == "dra-quota-webhook-tls"
        assert {"name": "tls", "mountPath": "/etc/dra-quota/tls", "readOnly": True} in container(objects)["volumeMounts"]


def test_cert_manager_signs_the_service_name_and_injects_the_ca() -> None:
    objects = render(CERT_MANAGER)
    certificate = find(objects, "Certificate")
    assert certificate["spec"]["secretName"] == "dra-quota-webhook-tls"
    assert certificate["spec"]["dnsNames"][0] == f"dra-quota-webhook.{NAMESPACE}.svc"
    assert certificate["spec"]["issuerRef"]["name"] == find(objects, "Issuer")["metadata"]["name"]
    for kind in KINDS:
        config = find(objects, kind)
        assert config["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/dra-quota"}
        assert config["webhooks"] and all("caBundle" not in h["clientConfig"] for h in config["webhooks"])
    issuer = {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    objects = render({"certificates": {"mode": "cert-manager", "certManager": {"issuerRef": issuer}}})
    assert find(objects, "Certificate")["spec"]["issuerRef"] == issuer
    assert not [o for o in objects if o["kind"] == "Issuer"]


def test_files_mode_puts_the_given_ca_in_every_webhook() -> None:
    objects = render(FILES)
    for kind in KINDS:
        for hook in find(objects, kind)["webhooks"]:
            assert base64.b64decode(hook["clientConfig"]["caBundle"]).decode() == CA_PEM
    assert not [o for o in objects if o["kind"] in ("Certificate", "Issuer")]


# -- bad values get a reason --------------------------------------------------------------------


@pytest.mark.parametrize("values,reason", [
    ({"certificates": {"mode": "files"}}, "certificates.files.caBundle"),
    ({"certificates": {"mode": "vault"}}, "certificates/mode"),
    ({"webhooks": {"failurePolicy": {"governed": "fail"}}}, "failurePolicy/governed"),
    ({"webhooks": {"failurePolicy": {"quota": "Fail"}}}, "additional properties 'quota' not allowed"),
    ({"webhooks": {"optInLabel": "not a label"}}, "webhooks/optInLabel"),
    ({"serve": {"defaultPricing": "cheap"}}, "defaultPricing"),
    ({"replicas": 3}, "additional properties 'replicas' not allowed"),
    ({"adminAccess": {"serviceAccounts": ["no-colon"]}}, "adminAccess/serviceAccounts/0"),
    ({"adminAccess": {"users": ["alice, bob"]}}, "adminAccess/users/0"),
    ({"podAntiAffinity": "strict"}, "podAntiAffinity"),
    ({"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}}, "needs metrics.enabled"),
    ({"metrics": {"portName": "Metrics_Port"}}, "metrics/portName"),
    ({"metrics": {"serviceMonitor": {"interval": "half a minute"}}}, "serviceMonitor/interval"),
    ({"metrics": {"secure": False, "serviceMonitor": {"enabled": True}}}, "needs metrics.secure"),
    ({"networkPolicy": {"enabled": True}}, "networkPolicy.enabled needs networkPolicy.webhookFrom"),
    ({"serve": {"connections": {"maxConnections": 0}}}, "connections/maxConnections"),
    ({"serve": {"connections": {"idleTimeoutSeconds": 0}}}, "connections/idleTimeoutSeconds"),
    ({"metrics": {"readers": [{"kind": "ServiceAccount", "name": "p"}]}}, "a ServiceAccount needs its namespace"),
])
def test_bad_values_are_refused_with_the_reason(values: dict[str, Any], reason: str) -> None:
    with pytest.raises(HelmError, match=re.escape(reason)):
        render(values)


def test_the_pdb_can_be_switched_off_and_never_blocks_a_single_replica(default: list[Obj]) -> None:
    assert find(default, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert not [o for o in render({"podDisruptionBudget": {"enabled": False}}) if o["kind"] == "PodDisruptionBudget"]


def test_the_image_is_what_the_chart_expects(default: list[Obj]) -> None:
    """The Dockerfile (not built here) against the chart and the distribution: user, entrypoint, packages."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    final = dockerfile[dockerfile.rindex("\nFROM "):]
    pod = find(default, "Deployment")["spec"]["template"]["spec"]["securityContext"]
    user = re.search(r"^USER (\d+):(\d+)$", final, re.M)
    assert user is not None and user.groups() == (str(pod["runAsUser"]), str(pod["runAsGroup"]))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (script,) = project["project"]["scripts"]
    assert f'ENTRYPOINT ["{script}"]' in final
    assert container(default)["args"][0] == "serve"
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = set(re.findall(r"^COPY (\w+) \./\1$", dockerfile, re.M))
    assert copied == packages, "the build stage copies every package of the distribution, and only those"
    assert "gcc" not in final and "build-essential" not in final and "COPY --from" not in final


def test_metrics_port_and_service_monitor(default: list[Obj]) -> None:
    ports = {p["name"]: p for p in find(default, "Service")["spec"]["ports"]}
    assert ports["metrics"] == {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    assert {"name": "metrics", "containerPort": 8080, "protocol": "TCP"} in container(default)["ports"]
    assert not [o for o in default if o["kind"] in ("ServiceMonitor", "PrometheusRule")]
    assert [o["metadata"]["name"] for o in default if o["kind"] == "ConfigMap"] == ["dra-quota-admin-access"]
    monitored = render({"metrics": {"portName": "http-metrics", "serviceMonitor": {
        "enabled": True, "labels": {"release": "prom"}, "interval": "1m", "scrapeTimeout": "20s"}}})
    monitor = find(monitored, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    # The endpoint names the Service's metrics port, which targets the container's.
    service_port = next(p for p in find(monitored, "Service")["spec"]["ports"] if p["name"] == endpoint["port"])
    assert service_port["targetPort"] == "http-metrics"
    assert {"name": "http-metrics", "containerPort": 8080, "protocol": "TCP"} in container(monitored)["ports"]
    # honorLabels: the usage series' own `namespace` and the device info's `pod` must win
    # over the target labels the operator adds (values.yaml, templates/servicemonitor.yaml).
    # HTTPS, verified against the serving Secret's CA for the Service's name, with
    # Prometheus' own token (webhook/metricsserver.py asks the API server about it).
    assert endpoint == {"port": "http-metrics", "path": "/metrics", "scheme": "https", "interval": "1m",
                        "scrapeTimeout": "20s", "honorLabels": True,
                        "tlsConfig": {"serverName": "dra-quota-webhook.dra-quota-system.svc",
                                      "ca": {"secret": {"name": "dra-quota-webhook-tls", "key": "ca.crt"}}},
                        "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"] == find(monitored, "Service")["spec"]["selector"]
    off = render({"metrics": {"enabled": False}})
    assert serve_args(off).metrics_port == 0
    assert [p["name"] for p in find(off, "Service")["spec"]["ports"]] == ["https"]


def test_metrics_are_https_for_tokens_allowed_to_get_them(default: list[Obj]) -> None:
    assert serve_args(default).metrics_secure is True
    review_rules = [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]
    assert all(rule in rules_of(default, "ClusterRole") for rule in review_rules)
    # The reachability probe's GET /readyz is ours to grant (kube.contact).
    assert {"nonResourceURLs": ["/readyz"], "verbs": ["get"]} in rules_of(default, "ClusterRole")
    reader = find(default, "ClusterRole", "dra-quota-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert not [o for o in default if o["kind"] == "ClusterRoleBinding" and o["metadata"]["name"].endswith("reader")]
    readers = [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"},
               {"kind": "Group", "name": "sre"}]
    bound = find(render({"metrics": {"readers": readers}}), "ClusterRoleBinding", "dra-quota-metrics-reader")
    assert bound["roleRef"]["name"] == "dra-quota-metrics-reader"
    assert bound["subjects"] == [readers[0], {**readers[1], "apiGroup": "rbac.authorization.k8s.io"}]
    # The explicit opt-out: plain HTTP inside the Pod only; nothing to reach it by, nothing to grant.
    plain = render({"metrics": {"secure": False}})
    assert (serve_args(plain).metrics_secure, serve_args(plain).metrics_bind_address) == (False, None)
    assert [p["name"] for p in find(plain, "Service")["spec"]["ports"]] == ["https"]
    assert [p["name"] for p in container(plain)["ports"]] == ["https"]
    # TokenReview goes; SubjectAccessReview stays: the adminAccess label's RBAC check uses it too.
    assert review_rules[0] not in rules_of(plain, "ClusterRole") and review_rules[1] in rules_of(plain, "ClusterRole")
    assert not [o for o in plain if o["metadata"]["name"] == "dra-quota-metrics-reader"]


def test_the_service_monitor_follows_the_certificate_mode_and_token_source() -> None:
    files = render({**FILES, "metrics": {"serviceMonitor": {"enabled": True,
                                                            "bearerTokenSecret": {"name": "prom", "key": "token"}}}})
    (endpoint,) = find(files, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["tlsConfig"]["ca"] == {"configMap": {"name": "dra-quota-ca", "key": "ca.crt"}}
    assert find(files, "ConfigMap", "dra-quota-ca")["data"] == {"ca.crt": CA_PEM}
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": "prom", "key": "token"}}
    assert "bearerTokenFile" not in endpoint
    own = {"insecureSkipVerify": True}
    custom = render({"metrics": {"serviceMonitor": {"enabled": True, "tlsConfig": own}}})
    assert find(custom, "ServiceMonitor")["spec"]["endpoints"][0]["tlsConfig"] == own


def test_values_reach_the_connection_flags(default: list[Obj]) -> None:
    args = serve_args(default)
    assert (args.max_connections, args.tls_handshake_timeout, args.request_header_timeout,
            args.request_body_timeout, args.idle_timeout) == (1000, 10, 10, 10, 120)
    changed = serve_args(render({"serve": {"connections": {
        "maxConnections": 200, "tlsHandshakeTimeoutSeconds": 3, "requestHeaderTimeoutSeconds": 4,
        "requestBodyTimeoutSeconds": 5, "idleTimeoutSeconds": 95}}}))
    assert (changed.max_connections, changed.tls_handshake_timeout, changed.request_header_timeout,
            changed.request_body_timeout, changed.idle_timeout) == (200, 3, 4, 5, 95)


API_SERVER = [{"ipBlock": {"cidr": "10.0.0.0/24"}}]


def test_the_network_policy_admits_the_api_server_and_prometheus_only(default: list[Obj]) -> None:
    assert not [o for o in default if o["kind"] == "NetworkPolicy"]
    objects = render({"networkPolicy": {"enabled": True, "webhookFrom": API_SERVER}})
    policy = find(objects, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == find(objects, "Deployment")["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    webhook, metrics = policy["spec"]["ingress"]
    assert webhook == {"from": API_SERVER, "ports": [{"port": "https", "protocol": "TCP"}]}
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert metrics["from"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "prometheus"}}}]
    # Both ports are the container's, by name; an empty peer list would admit everyone,
    # so it drops the rule instead.
    names = {p["name"] for p in container(objects)["ports"]}
    assert {webhook["ports"][0]["port"], metrics["ports"][0]["port"]} <= names
    for values in ({"networkPolicy": {"enabled": True, "webhookFrom": API_SERVER, "metricsFrom": []}},
                   {"networkPolicy": {"enabled": True, "webhookFrom": API_SERVER}, "metrics": {"secure": False}}):
        assert [r["ports"][0]["port"] for r in find(render(values), "NetworkPolicy")["spec"]["ingress"]] == ["https"]


def test_the_prometheus_rule_is_the_alert_rules_file() -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "dra-quota-rules.yaml").read_text())
    rule = find(render({"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "prom"}}}}),
                "PrometheusRule")
    assert (rule["apiVersion"], rule["metadata"]["namespace"]) == ("monitoring.coreos.com/v1", NAMESPACE)
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"]["groups"] == rules["groups"]
    assert PROMETHEUS_RULE.read_text() == shipped_prometheus_rule(), (
        f"{PROMETHEUS_RULE.relative_to(ROOT)} differs from the chart's rendering: run `python -m tests.tools.chart`")


def test_promtool_accepts_the_rendered_rule_groups(tmp_path: Path) -> None:
    """What the Prometheus Operator hands Prometheus is the spec's groups: promtool checks them
    as rendered (YAML quoting by helm's toYaml included)."""
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is not installed: run .ci/prometheus.sh (Debian's 'prometheus' package)")
    rule = find(render({"metrics": {"prometheusRule": {"enabled": True}}}, include_crds=False), "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run([tool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True,
                            check=False, timeout=120)
    alerts = sum(len(g["rules"]) for g in rule["spec"]["groups"])
    assert result.returncode == 0 and f"SUCCESS: {alerts} rules found" in result.stdout, result.stdout + result.stderr


def test_runbook_urls_point_where_the_docs_are_published() -> None:
    def links(values: dict[str, Any]) -> set[str]:
        rule = find(render({"metrics": {"prometheusRule": {"enabled": True, **values}}}, include_crds=False),
                    "PrometheusRule")
        return {r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]
                if "alert" in r}

    assert "docs/troubleshooting.md#draquotanoleader" in links({})
    published = links({"runbookBaseURL": "https://git.example.com/dra-quota/blob/v1/"})
    assert "https://git.example.com/dra-quota/blob/v1/docs/troubleshooting.md#draquotanoleader" in published
    assert all(u.startswith("https://git.example.com/dra-quota/blob/v1/docs/troubleshooting.md#") for u in published)


def test_the_dashboard_configmap_is_the_dashboard_for_grafanas_sidecar() -> None:
    source = json.loads((ROOT / "deploy" / "grafana" / "dra-quota.json").read_text())
    config = find(render({"metrics": {"dashboard": {"enabled": True}}}), "ConfigMap", "dra-quota-dashboard")
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "annotations" not in config["metadata"]
    assert json.loads(config["data"]["dra-quota.json"]) == source
    filed = find(render({"metrics": {"dashboard": {"enabled": True, "folder": "GPU platform",
                                                   "labels": {"grafana_dashboard": None, "dashboards": "gpu"}}}}),
                 "ConfigMap", "dra-quota-dashboard")
    assert filed["metadata"]["annotations"] == {"k8s-sidecar-target-directory": "GPU platform"}
    assert filed["metadata"]["labels"]["dashboards"] == "gpu" and "grafana_dashboard" not in filed["metadata"]["labels"]


def test_requeue_rights_only_when_requeueing(default: list[Obj]) -> None:
    wanted = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
              {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"], "verbs": ["patch"]}]
    assert all(rule in rules_of(default, "ClusterRole") for rule in wanted)
    off = render({"serve": {"requeueWaitingPods": False}})
    assert serve_args(off).requeue_waiting_pods is False
    assert not any(rule in rules_of(off, "ClusterRole") for rule in wanted)
