"""Hostile input, run as a user runs it: `dra-quota check` as a process on each case.

A corpus of inputs a tenant or a careless user could write (CEL that allocates or
recurses, numbers past Python's limits, deep nesting, wrong types, values the API server
refuses, unknown API versions, output forgery, odd paths, free claims), each run against
the bundled example cluster with a time limit and an address-space limit. Every case
must end with exit 0 or 2 and no traceback, inside the time limit, under 1 GiB of RSS;
cases with an `expect` also check the decision (a negative allocation must not make
room, a claim in a class without devices must not be free, ...).

    python bench/hostile.py            # prints one line per failure and a summary
    python bench/hostile.py -v         # every case
    python bench/hostile.py -k cel     # cases whose name contains "cel"

Not a test (it takes a minute or two); tests/unit holds the in-process fuzz suites.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STATE = [str(ROOT / "examples" / n) for n in ("00-deviceclasses.yaml", "10-nvidia-slices.yaml", "30-teams.yaml")]
TIME_LIMIT = 60.0
RSS_LIMIT = 1024 * 1024 * 1024
AS_LIMIT = 3 * 1024 * 1024 * 1024

Expect = Callable[[dict[str, Any]], str | None]


@dataclass(frozen=True)
class Case:
    name: str
    text: str | bytes | None = None  # the file's content; None: `args` say it all
    args: tuple[str, ...] = ()
    suffix: str = ".yaml"
    state: bool = True  # also load the example cluster
    expect: Expect | None = None  # on the JSON report (exit 0); returns a complaint
    exit_codes: tuple[int, ...] = (0, 2)


@dataclass
class Outcome:
    case: Case
    code: int | None
    seconds: float
    rss: int
    stderr: str
    problems: list[str] = field(default_factory=list)


def claim(name: str, expr: str | None = None, cls: str = "gpu.nvidia.com", ns: str = "team-a", **extra: Any) -> str:
    exactly: dict[str, Any] = {"deviceClassName": cls, **extra}
    if expr is not None:
        exactly["selectors"] = [{"cel": {"expression": expr}}]
    return json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    })


def cel(name: str, expr: str) -> Case:
    return Case(f"cel/{name}", claim("c", expr), expect=_not_allowed_if_error)


def _not_allowed_if_error(report: dict[str, Any]) -> str | None:
    obj = report["objects"][-1]
    if obj["allowed"] and obj["charge"]["memory"] == 0 and obj["charge"]["devices"] == 0:
        return "a claim was admitted free of charge"
    return None


def _objects(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for o in report["objects"] if o["kind"] in ("ResourceClaim", "ResourceClaimTemplate")]


def _quota(report: dict[str, Any], name: str = "gpus") -> dict[str, Any]:
    return next(q for q in report["quotas"] if q["name"] == name)


def _within_hard(report: dict[str, Any]) -> str | None:
    for q in report["quotas"]:
        for resource_name, hard in q["hard"].items():
            total = q["used"][resource_name] + q["reserved"][resource_name]
            if q["used"][resource_name] < 0 or q["reserved"][resource_name] < 0:
                return f"quota {q['name']}: negative usage {q['used']} {q['reserved']}"
            admitted = [o for o in _objects(report) if o["allowed"] and not o.get("allocated")]
            if total > hard and admitted:
                return f"quota {q['name']}: {resource_name} {total} > hard {hard} after admitting"
    return None


def _not_all_free(report: dict[str, Any]) -> str | None:
    allowed = [o for o in _objects(report) if o["allowed"]]
    if len(allowed) > 1:
        return f"{len(allowed)} of 20 claims admitted under a 100Gi memory-only quota"
    return None


def yaml_doc(obj: dict[str, Any]) -> str:
    return json.dumps(obj)


def slice_with(device: dict[str, Any], **pool: Any) -> str:
    return json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "evil"},
        "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "evil", "generation": 1, "resourceSliceCount": 1, **pool},
                 "nodeName": "evil", "devices": [device]},
    })


GPU = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}, "capacity": {"memory": {"value": "80Gi"}}}
BIG = "1" * 4301


def allocated(consumed: str) -> str:
    return json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "neg", "namespace": "team-a"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {"allocation": {"devices": {"results": [{
            "request": "gpu", "driver": "gpu.nvidia.com", "pool": "h100-node-1", "device": "gpu-0",
            "consumedCapacity": {"memory": consumed}}]}}},
    })


def allocated_on(result: dict[str, Any], name: str = "alloc") -> str:
    return json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {"allocation": {"devices": {"results": [{
            "request": "gpu", "driver": "gpu.nvidia.com", "pool": "h100-node-1", "device": "gpu-0", **result}]}}},
    })


def _charged_at_least(memory: int) -> Expect:
    def check(report: dict[str, Any]) -> str | None:
        obj = report["objects"][-1]
        if obj["allowed"] and obj["charge"]["memory"] < memory:
            return f"charged {obj['charge']['memory']} bytes of memory, expected at least {memory}"
        return None
    return check


def _refused(report: dict[str, Any]) -> str | None:
    return "accepted" if report["objects"][-1]["allowed"] else None


def cases(tmp: Path) -> list[Case]:
    out: list[Case] = []
    # -- 1. CEL work bounded by what it produces ----------------------------------
    for name, expr in {
        "format-precision-e": "'%.1000000000e'.format([1.0]).size() > 0",
        "format-precision-f": "'%.1000000000f'.format([1.0]).size() > 0",
        "format-big-f": "'%f'.format([1.0e308]).size() > 0",
        "format-width": "'%1000000000d'.format([1]).size() > 0",
        "format-many-args": "('%s' * 1).size() > 0",
        "join-range": "lists.range(1000000).map(i, 'aaaaaaaaaaaaaaaaaaaa').join('').size() > 0",
        "replace-empty": "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'.replace('', 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb').replace('a', 'cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc').size() > 0",
        "concat-in-comprehension": "lists.range(2000).map(i, lists.range(2000).map(j, 'xxxxxxxxxx').join('')).join('').size() > 0",
        "range-big": "lists.range(100000000).size() > 0",
        "nested-map": "lists.range(10000).map(i, lists.range(10000)).size() > 0",
        "flatten-big": "lists.range(3000).map(i, lists.range(3000)).flatten().size() > 0",
        "string-of-list": "string(lists.range(1000000)).size() > 0",
        "split-long": "'a,'.replace(',', ',,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,').split(',').size() > 0",
        "quote-long": "strings.quote('\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00').size() > 0",
        "bind-doubling": "cel.bind(a, 'xxxxxxxxxxxxxxxx', cel.bind(b, a + a + a + a + a + a + a + a, cel.bind(c, b + b + b + b + b + b + b + b, cel.bind(d, c + c + c + c + c + c + c + c, d + d + d + d + d + d + d + d)))).size() > 0",
        "list-concat-doubling": "cel.bind(a, lists.range(1000), cel.bind(b, a + a + a + a + a + a + a + a, cel.bind(c, b + b + b + b + b + b + b + b, c + c + c + c + c + c + c + c))).size() > 0",
        "sortBy-big": "lists.range(200000).sortBy(x, -x).size() > 0",
        "distinct-big": "lists.range(100000).distinct().size() > 0",
        "regex-bomb": "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!'.matches('^(a+)+$')",
        "transformMap": "lists.range(100000).transformMap(i, v, v).size() > 0",
        # -- 2. Python's limits --------------------------------------------------------
        "int-literal-4301": f"{BIG} > 0",
        "int-conv-4301": f"int('{BIG}') > 0",
        "uint-conv-4301": f"uint('{BIG}') > 0u",
        "double-conv-4301": f"double('{BIG}') > 0.0",
        "quantity-4301": f"quantity('{BIG}').isInteger()",
        "quantity-4301Gi": f"quantity('{BIG}Gi').isInteger()",
        "quantity-exp": "quantity('1e99999999').isInteger()",
        "double-literal-long": f"{BIG}.0 > 0.0",
        "semver-long": f"semver('{BIG}.0.0').major() > 0",
        "string-of-max-int": "string(9223372036854775807 + 0) != ''",
        "int-overflow": "9223372036854775807 + 1 > 0",
        "timestamp-far": "timestamp('9999-12-31T23:59:59Z') + duration('1000000000h') > timestamp('2020-01-01T00:00:00Z')",
        "duration-huge": "duration('99999999999999999999h') > duration('1h')",
        # -- 8. nesting -----------------------------------------------------------------
        "parens-5000": "(" * 5000 + "true" + ")" * 5000,
        "parens-300": "(" * 300 + "true" + ")" * 300,
        "not-3000": "!" * 3000 + "true",
        "neg-3000": "-" * 3000 + "1 < 0",
        "list-nest-2000": "[" * 2000 + "]" * 2000 + " != []",
        "map-nest-1000": "{'a': " * 1000 + "1" + "}" * 1000 + " != {}",
        "ternary-2000": "true ? " * 2000 + "true" + " : false" * 2000,
        "member-chain": "device" + ".attributes" * 3000 + " != null",
        "index-chain": "device.attributes" + "['x']" * 3000 + " != null",
        "and-chain": " && ".join(["true"] * 2500),
        "call-nest": "size(" * 2000 + "'x'" + ")" * 2000 + " > 0",
        "exists-nest": "[1].exists(x, " * 400 + "true" + ")" * 400,
        # -- 9. conformance edges -------------------------------------------------------
        "int-double-2^63": "9223372036854775807 < 9223372036854775808.0",
        "cidr-zone": "cidr('fe80::1%eth0/64').prefixLength() > 0",
        "ip-zone": "ip('fe80::1%eth0').family() == 6",
        "type-net-ip": "type(ip('10.0.0.1')) == net.IP",
        "format-hetero": "'%s %d'.format(['a', 1]) == 'a 1'",
    }.items():
        out.append(cel(name, expr))
    out.append(Case("cel/expression-11KiB", claim("c", "true || " * 1400 + "true")))
    # -- 2. numbers and nesting in YAML/JSON, annotations --------------------------------
    out += [
        Case("yaml/int-4301-count", claim("c", None, count=0).replace('"count": 0', '"count": ' + BIG)),
        Case("yaml/int-4301-raw", f"apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: c, namespace: team-a}}\nspec: {{devices: {{requests: [{{name: g, exactly: {{deviceClassName: gpu.nvidia.com, count: {BIG}}}}}]}}}}\n"),
        Case("yaml/int-4301-generation", slice_with(GPU, generation=0).replace('"generation": 0', '"generation": ' + BIG)),
        Case("yaml/quantity-4301", slice_with({**GPU, "capacity": {"memory": {"value": BIG + "Gi"}}})),
        Case("yaml/quantity-int-4301", slice_with({**GPU, "capacity": {"memory": {"value": 0}}}).replace('"value": 0', '"value": ' + BIG)),
        Case("yaml/quantity-float-inf", "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s}\nspec: {driver: d, pool: {name: p, generation: 1, resourceSliceCount: 1}, nodeName: n, devices: [{name: a, capacity: {memory: {value: .inf}}}]}\n"),
        Case("yaml/nested-500", "a: " + "[" * 500 + "]" * 500 + "\n"),
        Case("yaml/nested-5000-map", "a: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n"),
        Case("json/nested-100000", "[" * 100000 + "]" * 100000, suffix=".json"),
        Case("json/int-4301", '{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "uid": ' + BIG + "}}", suffix=".json"),
        Case("yaml/billion-laughs", "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nh: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\ni: [*h,*h,*h,*h,*h,*h,*h,*h,*h]\nkind: DeviceClass\napiVersion: resource.k8s.io/v1\nmetadata: {name: x}\n"),
        Case("yaml/python-tag", "!!python/object/apply:os.system ['echo pwned']\n"),
        Case("annotation/nested", claim_with_annotation("[" * 2000 + "]" * 2000)),
        Case("annotation/big-int", claim_with_annotation('{"memory": ' + BIG + ', "devices": 1}')),
        Case("annotation/negative", claim_with_annotation('{"memory": -1, "devices": -1}')),
        Case("annotation/huge", claim_with_annotation("x" * 5_000_000)),
        Case("yaml/long-name", claim("n" * 2_000_000)),
    ]
    # -- 3. wrong types in metadata ------------------------------------------------------
    out += [
        Case("types/labels-list", "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-x, labels: [a, b]}\n"),
        Case("types/metadata-string", "apiVersion: v1\nkind: Namespace\nmetadata: hello\n"),
        Case("types/claim-metadata-string", "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: hello\nspec: {devices: {requests: []}}\n"),
        Case("types/hard-int-keys", "apiVersion: draquota.io/v1alpha1\nkind: DeviceQuota\nmetadata: {name: q, namespace: team-a}\nspec: {hard: {1: 2, memory: 1Gi}}\n"),
        Case("types/hard-list-key", "apiVersion: draquota.io/v1alpha1\nkind: DeviceQuota\nmetadata: {name: q, namespace: team-a}\nspec: {hard: {? [a, b] : 2}}\n"),
        Case("types/name-date", "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: 2024-01-01}\n"),
        Case("types/name-int", "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: 12, namespace: team-a}\nspec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.nvidia.com}}]}}\n"),
        Case("types/label-value-int", "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a, labels: {resource.kubernetes.io/admin-access: true}}\n"),
        Case("types/annotations-list", "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c, namespace: team-a, annotations: [a]}\nspec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.nvidia.com}}]}}\n"),
        Case("types/namespace-list", "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c, namespace: [team-a]}\nspec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.nvidia.com}}]}}\n"),
        Case("types/kind-list", "apiVersion: v1\nkind: [Namespace]\nmetadata: {name: x}\n"),
        Case("types/items-not-list", "apiVersion: v1\nkind: List\nitems: {a: b}\n"),
        Case("types/list-in-list", "apiVersion: v1\nkind: List\nitems: [{apiVersion: v1, kind: List, items: [{apiVersion: v1, kind: Namespace, metadata: {name: x}}]}]\n"),
    ]
    # -- 4. values the API server refuses ----------------------------------------------
    out += [
        Case("values/negative-capacity", slice_with({**GPU, "capacity": {"memory": {"value": "-80Gi"}}}) + "\n---\n" + claim("c", "device.attributes['gpu.nvidia.com'].type == 'gpu'"), expect=_within_hard),
        Case("values/negative-consumed", allocated("-500Gi") + "\n---\n" + "\n---\n".join(claim(f"c{i}") for i in range(6)), expect=_within_hard),
        Case("values/negative-slice-count", slice_with(GPU, resourceSliceCount=-1)),
        Case("values/zero-slice-count", slice_with(GPU, resourceSliceCount=0)),
        Case("values/negative-generation", slice_with(GPU, generation=-5)),
        Case("values/duplicate-devices", json.dumps({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "dup"},
            "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "dup", "generation": 1, "resourceSliceCount": 1},
                     "nodeName": "dup", "devices": [GPU, {**GPU, "capacity": {"memory": {"value": "1Gi"}}}]}})),
        Case("values/duplicate-devices-across-slices", "\n---\n".join(json.dumps({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"dup-{i}"},
            "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "dup", "generation": 1, "resourceSliceCount": 2},
                     "nodeName": "dup", "devices": [{**GPU, "capacity": {"memory": {"value": mem}}}]}})
            for i, mem in enumerate(("1Gi", "1000Gi"))) + "\n---\n" + claim("c", "device.attributes['gpu.nvidia.com'].type == 'gpu' && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('1Gi')) == 0"),
             expect=_not_allowed_if_error),
        Case("values/duplicate-yaml-keys", "apiVersion: draquota.io/v1alpha1\nkind: DeviceQuota\nmetadata: {name: q, namespace: team-a}\nspec:\n  hard:\n    memory: 1Gi\n    memory: 1000Gi\n"),
        Case("values/duplicate-json-keys", '{"apiVersion": "draquota.io/v1alpha1", "kind": "DeviceQuota", "metadata": {"name": "q", "namespace": "team-a"}, "spec": {"hard": {"memory": "1Gi", "memory": "1000Gi"}}}', suffix=".json"),
        Case("values/negative-count", claim("c", None, count=-3)),
        Case("values/negative-capacity-request", claim("c", None, cls="shared.gpu.nvidia.com", capacity={"requests": {"memory": "-40Gi"}}), expect=_within_hard),
        Case("values/negative-hard", "apiVersion: draquota.io/v1alpha1\nkind: DeviceQuota\nmetadata: {name: q, namespace: team-a}\nspec: {hard: {memory: -1Gi}}\n"),
        Case("values/count-huge", claim("c", None, count=2**63)),
        # consumedCapacity and results the scheduler never writes must not lower a charge.
        Case("values/consumed-on-unshared-device", allocated_on({"consumedCapacity": {"memory": "0"}}),
             expect=_charged_at_least(80 * 2**30)),
        Case("values/consumed-both-names", allocated_on({"pool": "l40s-node-1", "shareID": "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
                                                         "consumedCapacity": {"memory": "48Gi", "gpu.nvidia.com/memory": "0"}}),
             expect=_charged_at_least(48 * 2**30)),
        Case("values/request-both-names", claim("c", None, cls="shared.gpu.nvidia.com", capacity={"requests": {
            "gpu.nvidia.com/memory": "1Mi", "memory": "48Gi"}}), expect=_charged_at_least(48 * 2**30)),
        Case("values/result-names-no-request", allocated_on({"request": "bogus"}), expect=_refused),
        Case("values/result-names-first-available-parent", json.dumps({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "fa", "namespace": "team-a"},
            "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [{"name": "h100", "deviceClassName": "gpu.nvidia.com"}]}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "h100-node-1", "device": "gpu-0"}]}}}}), expect=_refused),
        Case("values/quota-defined-twice", "apiVersion: draquota.io/v1alpha1\nkind: DeviceQuota\nmetadata: {name: gpus, namespace: team-a}\nspec: {hard: {memory: 1000Ti}}\n", exit_codes=(2,)),
        Case("values/namespace-redefined-with-label", "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a, labels: {resource.kubernetes.io/admin-access: 'true'}}\n---\n"
             + claim("admin", None, adminAccess=True), exit_codes=(2,)),
        Case("values/many-requests", json.dumps({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "many", "namespace": "team-a"},
            "spec": {"devices": {"requests": [{"name": f"r{i}", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": f"device.attributes['gpu.nvidia.com'].?x{i}.orValue('') == ''"}}]}} for i in range(5000)]}}})),
    ]
    # -- 5. API versions -----------------------------------------------------------------
    out += [
        # v1beta1 and v1beta2 are converted (quota.objects.conversion); other versions and mixed shapes refused.
        Case("version/v1beta1-slice", "apiVersion: resource.k8s.io/v1beta1\nkind: ResourceSlice\nmetadata: {name: b}\nspec: {driver: gpu.nvidia.com, pool: {name: b, generation: 1, resourceSliceCount: 1}, nodeName: b, devices: [{name: g, basic: {attributes: {type: {string: gpu}}, capacity: {memory: {value: 80Gi}}}}]}\n", exit_codes=(0,)),
        Case("version/v1beta2-claim", "apiVersion: resource.k8s.io/v1beta2\nkind: ResourceClaim\nmetadata: {name: c, namespace: team-a}\nspec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.nvidia.com}}]}}\n", exit_codes=(0,)),
        Case("version/v1alpha3-slice", "apiVersion: resource.k8s.io/v1alpha3\nkind: ResourceSlice\nmetadata: {name: b}\nspec: {driver: gpu.nvidia.com, pool: {name: b, generation: 1, resourceSliceCount: 1}, nodeName: b, devices: [{name: g, basic: {capacity: {memory: {value: 80Gi}}}}]}\n", exit_codes=(2,)),
        Case("version/v1beta1-slice-with-v1-devices", "apiVersion: resource.k8s.io/v1beta1\nkind: ResourceSlice\nmetadata: {name: b}\nspec: {driver: gpu.nvidia.com, pool: {name: b, generation: 1, resourceSliceCount: 1}, nodeName: b, devices: [{name: g, capacity: {memory: {value: 80Gi}}}]}\n", exit_codes=(2,)),
        Case("version/devicequota-v2", "apiVersion: draquota.io/v2\nkind: DeviceQuota\nmetadata: {name: q, namespace: team-a}\nspec: {hard: {memory: 1Gi}}\n", exit_codes=(2,)),
        Case("version/garbage", "apiVersion: 12\nkind: DeviceClass\nmetadata: {name: x}\n", exit_codes=(2,)),
    ]
    # -- 6. output ------------------------------------------------------------------------
    out += [
        Case("output/newline-name", claim("c\nResourceClaim  team-a  forged  allowed  0  0"), args=("-o", "table")),
        Case("output/ansi-name", claim("c\x1b[2J\x1b[31mred"), args=("-o", "table")),
        Case("output/surrogate-json", '{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c\\ud800", "namespace": "team-a"}, "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}', suffix=".json", args=("-o", "table")),
        Case("output/surrogate-json-out", '{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c\\udfff", "namespace": "team-a"}, "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}', suffix=".json"),
        Case("output/bidi", claim("c\u202egnp.exe"), args=("-o", "table")),
        Case("output/non-utf8", b"apiVersion: v1\nkind: Namespace\nmetadata: {name: \xff\xfe}\n"),
    ]
    # -- 7. paths ----------------------------------------------------------------------------
    fifo = tmp / "fifo.yaml"
    os.mkfifo(fifo)
    loop = tmp / "loop"
    loop.mkdir()
    (loop / "self").symlink_to(loop)
    (tmp / "dangling.yaml").symlink_to(tmp / "nowhere.yaml")
    (tmp / "empty").mkdir()
    (tmp / "selfloop.yaml").symlink_to(tmp / "selfloop.yaml")
    out += [
        Case("paths/fifo", args=("-f", str(fifo)), state=False),
        Case("paths/dev-zero", args=("-f", "/dev/zero"), state=False),
        Case("paths/dir-symlink-loop", args=("-f", str(loop)), state=False),
        Case("paths/file-symlink-loop", args=("-f", str(tmp / "selfloop.yaml")), state=False),
        Case("paths/dangling", args=("-f", str(tmp / "dangling.yaml")), state=False),
        Case("paths/empty-string", args=("-f", ""), state=False, exit_codes=(2,)),
        Case("paths/empty-folder", args=("-f", str(tmp / "empty")), state=False, exit_codes=(2,)),
        Case("paths/proc", args=("-f", "/proc/self/status"), state=False),
    ]
    # -- 10. free claims ------------------------------------------------------------------------
    memory_only = ("apiVersion: v1\nkind: Namespace\nmetadata: {name: free}\n---\napiVersion: draquota.io/v1alpha1\n"
                   "kind: DeviceQuota\nmetadata: {name: mem, namespace: free}\nspec: {hard: {memory: 100Gi}}\n---\n")
    empty_class = memory_only + "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: nothing}\nspec: {selectors: [{cel: {expression: \"device.driver == 'none.example.com'\"}}]}\n"
    out += [
        Case("free/class-without-devices", empty_class + "---\n" + "\n---\n".join(claim(f"c{i}", None, cls="nothing", ns="free") for i in range(20)), expect=_not_all_free),
        # Devices that publish no memory truly take none: admitting them is right.
        Case("free/class-without-memory", memory_only + "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: nomem}\nspec: {selectors: [{cel: {expression: \"device.driver == 'nomem.example.com'\"}}]}\n---\n"
             + json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "nm"},
                           "spec": {"driver": "nomem.example.com", "pool": {"name": "nm", "generation": 1, "resourceSliceCount": 1}, "nodeName": "nm",
                                    "devices": [{"name": "d0", "attributes": {"type": {"string": "gpu"}}}]}})
             + "\n---\n" + "\n---\n".join(claim(f"c{i}", None, cls="nomem", ns="free") for i in range(20))),
        Case("free/allocated-unknown-device", allocated_on({"device": "gpu-99"}), expect=_charged_at_least(80 * 2**30)),
        Case("free/allocated-other-drivers-pool", allocated_on({"driver": "gpu.amd.com"}), expect=_charged_at_least(80 * 2**30)),
        Case("free/first-available-optimistic", empty_class + "---\n" + "\n---\n".join(json.dumps({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": f"fa{i}", "namespace": "free"},
            "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
                {"name": "none", "deviceClassName": "nothing"}, {"name": "h100", "deviceClassName": "gpu.nvidia.com"}]}]}}})
            for i in range(20)), args=("--mode", "optimistic"), expect=_not_all_free),
    ]
    return out


def claim_with_annotation(value: str) -> str:
    obj = json.loads(claim("annotated"))
    obj["metadata"]["annotations"] = {"draquota.io/charge": value}
    obj["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gone", "device": "gpu-9"}]}}}
    return json.dumps(obj)


def _limit_child() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def run(case: Case, tmp: Path, index: int) -> Outcome:
    args = list(case.args)
    if case.text is not None:
        path = tmp / f"case{index}{case.suffix}"
        if isinstance(case.text, bytes):
            path.write_bytes(case.text)
        else:
            path.write_text(case.text, encoding="utf-8", errors="surrogatepass")
        args = [*args, "-f", str(path)]
    if "-o" not in args:
        args += ["-o", "json"]
    cmd = [sys.executable, "-m", "commands.cli", "check", *(a for s in (STATE if case.state else []) for a in ("-f", s)), *args]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            preexec_fn=_limit_child, cwd=ROOT)
    stdout, stderr, code, rss = _wait(proc)
    seconds = time.monotonic() - started
    out = Outcome(case, code, seconds, rss, stderr.decode("utf-8", "replace"))
    if code is None:
        out.problems.append(f"hang: killed after {TIME_LIMIT:.0f} s")
    elif code not in case.exit_codes:
        out.problems.append(f"exit {code}, expected one of {case.exit_codes}")
    if "Traceback" in out.stderr or "Error:" in out.stderr.split("\n")[-2:][0]:
        out.problems.append("traceback: " + out.stderr.strip().splitlines()[-1][:200])
    if rss > RSS_LIMIT:
        out.problems.append(f"peak RSS {rss // 2**20} MiB")
    if code == 0 and "-o" in args and args[args.index("-o") + 1] == "json":
        try:
            report = json.loads(stdout)
        except ValueError as err:
            out.problems.append(f"JSON output does not parse: {err}")
        else:
            if case.expect is not None and (complaint := case.expect(report)):
                out.problems.append(f"wrong: {complaint}")
    if code == 0 and "table" in args:
        text = stdout.decode("utf-8", "strict") if _utf8(stdout) else None
        if text is None:
            out.problems.append("table output is not UTF-8")
        elif "\x1b" in text or "forged" in text.split("\n", 1)[-1].split("  ")[0]:
            out.problems.append("table output carries control characters or a forged row")
        elif "\u202e" in text:
            out.problems.append("table output carries a bidi override")
    return out


def _wait(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes, int | None, int]:
    """Output, exit code (None: killed at the time limit) and the child's own peak RSS.

    os.wait4 gives the rusage of that one child; RUSAGE_CHILDREN would be the maximum
    over every child so far.
    """
    chunks: dict[str, bytes] = {}

    def drain(name: str, stream: Any) -> None:
        chunks[name] = stream.read()

    readers = [threading.Thread(target=drain, args=(n, s)) for n, s in (("out", proc.stdout), ("err", proc.stderr))]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + TIME_LIMIT
    killed = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline and not killed:
            proc.kill()
            killed = True
        time.sleep(0.02)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for reader in readers:
        reader.join()
    return chunks["out"], chunks["err"], None if killed else proc.returncode, usage.ru_maxrss * 1024


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="only cases whose name contains this")
    parser.add_argument("-v", action="store_true", help="print every case")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        selected = [c for c in cases(tmp) if args.k in c.name]
        failures = 0
        slowest = 0.0
        for index, case in enumerate(selected):
            outcome = run(case, tmp, index)
            slowest = max(slowest, outcome.seconds)
            if outcome.problems:
                failures += 1
            if outcome.problems or args.v:
                status = "FAIL" if outcome.problems else "ok"
                detail = "; ".join(outcome.problems) or (outcome.stderr.strip().splitlines() or [""])[-1][:160]
                print(f"{status:4} {case.name:32} exit={outcome.code} {outcome.seconds:5.1f}s  {detail}")
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"{len(selected)} cases, {failures} failed; slowest {slowest:.1f} s (load average {load})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
