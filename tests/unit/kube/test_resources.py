"""kube/resources.py: the registry of what serve reads and writes, against the chart's RBAC.

Least privilege both ways: every verb the registry says serve uses is granted to its
ServiceAccount by the chart rendered with every optional part on (the defaults:
requeue, Kueue auto, --metrics-secure, --cert-mode self), and nothing more is. That the
grants are enough for the real code is tests/e2e/test_chart.py; that the code names its
collections from the registry is the registry's own point (no other `Resource(` in
quota, runtime, kube, controllers, webhook or commands; devcluster's string-keyed admin
client builds its own).
"""

from __future__ import annotations

from collections.abc import Sequence

from kube import resources
from kube.api import Resource
from kube.contact import PATH
from kube.resources import NON_RESOURCE_URLS, VERBS
from quota.values.raw import Obj

from ...tools.chart import find, render

# (API group, plural, subresource, verb): one grant, as RBAC spells it; a non-resource URL
# as ("", URL, "", verb).
Grant = tuple[str, str, str, str]


def used() -> set[Grant]:
    return ({(r.group, r.plural, sub, verb) for (r, sub), verbs in VERBS.items() for verb in verbs}
            | {("", url, "", verb) for url, verbs in NON_RESOURCE_URLS.items() for verb in verbs})


def granted(objects: Sequence[Obj]) -> set[Grant]:
    """What the chart grants the Deployment's ServiceAccount, through every binding to it."""
    account = find(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    bound = {(o["roleRef"]["kind"], o["roleRef"]["name"]) for o in objects
             if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and any(s.get("kind") == "ServiceAccount" and s.get("name") == account for s in o["subjects"])}
    out: set[Grant] = set()
    for kind, name in bound:
        for rule in find(objects, kind, name)["rules"]:
            if "nonResourceURLs" in rule:
                out |= {("", url, "", verb) for url in rule["nonResourceURLs"] for verb in rule["verbs"]}
                continue
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    plural, _, sub = resource.partition("/")
                    out |= {(group, plural, sub, verb) for verb in rule["verbs"]}
    return out


def test_the_chart_grants_serve_exactly_the_verbs_the_registry_uses() -> None:
    chart = granted(render())
    assert not used() - chart, f"serve uses, the chart does not grant: {sorted(used() - chart)}"
    assert not chart - used(), f"the chart grants, serve does not use: {sorted(chart - used())}"


def test_the_probe_reads_the_url_the_registry_names() -> None:
    assert PATH in NON_RESOURCE_URLS


def test_each_registered_collection_is_named_once_and_used() -> None:
    registered = {name: value for name, value in vars(resources).items() if isinstance(value, Resource)}
    assert sorted(registered) == sorted(n for n in resources.__all__ if isinstance(getattr(resources, n), Resource))
    coordinates = [(r.api_version, r.plural) for r in registered.values()]
    assert len(set(coordinates)) == len(coordinates), "two names for one collection"
    assert {r for r, _ in VERBS} == set(registered.values()), "a registered collection serve has no verb on"


def test_the_group_is_what_rbac_and_admission_reviews_call_it() -> None:
    assert (resources.PODS.group, resources.CLAIMS.group, resources.QUOTAS.group) == ("", "resource.k8s.io",
                                                                                      "draquota.io")
