"""The shipped webhook configurations (deploy/manifests/webhooks.yaml, package data of
`quota.manifests`) routed to a local `dra-quota serve` on the loopback control plane.

The API server's `--loopback-service` resolver (devcluster.controlplane) dials
127.0.0.1:<service port> for every Service reference and still verifies the certificate
for `<name>.<namespace>.svc`, so only the port and the CA change. Used by the e2e tests
(tests/e2e/webhook_recorder.py re-exports it) and by `dra-quota demo`.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from devcluster.controlplane import WEBHOOK_SERVICES, ControlPlane
from quota.manifests import webhook_configurations
from quota.values.raw import Obj


def adapted_webhooks(
    run: str,
    port: int,
    cluster: ControlPlane,
    *,
    label: str | None,
    name_suffix: str,
    selector: Literal["objectSelector", "namespaceSelector"] = "namespaceSelector",
    path_per_hook: bool = False,
    shipped: Sequence[Obj] | None = None,
    test_ca: bool = True,
) -> list[Obj]:
    """The shipped configurations for one test on the shared cluster: unique names, the
    test CA, the Service port the loopback resolver dials, and `label: run` required by
    `selector`, so no other test's objects ever reach them (`label=None`: no such
    requirement, for a cluster of one user such as the demo's). `path_per_hook` appends the
    webhook's name to its path (the recorder then knows which webhook was called).
    `shipped`: other configurations of the same shape (test_chart.py: the chart's), by
    default `quota.manifests.webhook_configurations()`;
    `name_suffix=""` keeps their names and `test_ca=False` leaves caBundle to whoever
    manages it (`serve --cert-mode self`)."""
    ca = base64.b64encode(cluster.ca_file.read_bytes()).decode()
    configs = []
    for config in copy.deepcopy(list(webhook_configurations() if shipped is None else shipped)):
        if name_suffix:
            config["metadata"]["name"] = f"{config['metadata']['name']}-{name_suffix}-{run}"
        for hook in config["webhooks"]:
            service = hook["clientConfig"]["service"]
            assert (service["namespace"], service["name"]) in WEBHOOK_SERVICES
            assert service["port"] == 443
            service["port"] = port
            if path_per_hook:
                service["path"] = f"{service['path']}/{hook['name']}"
            if test_ca:
                hook["clientConfig"]["caBundle"] = ca
            if label is not None:
                required = hook.setdefault(selector, {})
                required.setdefault("matchExpressions", []).append({"key": label, "operator": "In", "values": [run]})
        configs.append(config)
    return configs


def json_patched(obj: Obj, patch: Sequence[Mapping[str, Any]]) -> Obj:
    """`obj` with a mutating webhook's JSON Patch applied, as the API server applies it:
    the `add` and `remove` operations our webhooks answer with (RFC 6902; paths RFC 6901)."""
    out = copy.deepcopy(obj)
    for op in patch:
        if op["op"] not in ("add", "remove"):
            raise ValueError(f"not a patch operation of ours: {op}")
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = out
        for part in parents:
            target = target[part]
        if op["op"] == "remove":
            del target[last]  # RFC 6902: the target must exist
        else:
            target[last] = copy.deepcopy(op["value"])
    return out
