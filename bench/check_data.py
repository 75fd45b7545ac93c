"""Input files for bench/check.py, as a user would hand them to `dra-quota check`.

- the inventory of bench/inventory.py as `kubectl get resourceslices -o json` prints it:
  a `v1` `List` (4-space indent, keys sorted, as Go marshals maps) whose items carry the
  metadata the API server adds (generateName, creationTimestamp, generation,
  ownerReferences to the Node, managedFields of the kubelet plugin);
- the same List as `-o yaml` prints it;
- `claims.yaml`: DeviceClasses, Namespaces, one DeviceQuota per namespace and claims
  whose CEL selectors no earlier selector resembles: each reads an attribute name, or
  compares with a literal, that no other selector uses (some names exist on the
  devices, some do not and are guarded with has(), so nothing errors).

Deterministic for a given node count; files are written once into a cache folder and
reused (`dra-quota check` only reads them).
"""

from __future__ import annotations

import copy
import json
import random
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inventory import (  # noqa: E402
    NVIDIA_DRIVER,
    generate_device_classes,
    generate_namespaces,
    generate_slices,
)

__all__ = ["novel_selector", "write_inputs"]

JSON = dict[str, Any]
# Bump when the files' content changes so stale caches are not reused.
_FORMAT = 1
_NAMESPACES = 10
D = NVIDIA_DRIVER
K8S = "resource.kubernetes.io"


def _uid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _as_served(item: JSON, rng: random.Random, index: int) -> JSON:
    """A generated slice with the metadata the API server and the kubelet plugin add."""
    served = copy.deepcopy(item)
    meta = served["metadata"]
    node = served["spec"]["nodeName"]
    node_uid = _uid(rng)
    stamp = f"2026-11-{20 + index % 3:02d}T{index % 24:02d}:{index % 60:02d}:{(index * 7) % 60:02d}Z"
    meta.update(
        creationTimestamp=stamp,
        generateName=f"{node}-{D}-",
        generation=1,
        resourceVersion=str(1_000_000 + index),
        ownerReferences=[{"apiVersion": "v1", "controller": True, "kind": "Node", "name": node, "uid": node_uid}],
        managedFields=[{
            "apiVersion": "resource.k8s.io/v1",
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {"f:generateName": {}, "f:ownerReferences": {
                    ".": {}, f'k:{{"uid":"{node_uid}"}}': {}}},
                "f:spec": {"f:devices": {}, "f:driver": {}, "f:nodeName": {},
                           "f:pool": {".": {}, "f:generation": {}, "f:name": {}, "f:resourceSliceCount": {}}},
            },
            "manager": "gpu-kubelet-plugin",
            "operation": "Update",
            "time": stamp,
        }],
    )
    return served


def _slice_list(nodes: int) -> JSON:
    rng = random.Random(1)
    items = [_as_served(s, rng, i) for i, s in enumerate(generate_slices(nodes))]
    return {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}


# Attribute names the devices publish (qualified by domain), string-valued ones first.
_EXISTING_STRINGS = [(D, "productName"), (D, "architecture"), (D, "brand"), (D, "uuid"), (D, "type"),
                     (D, "profile"), (D, "parentUUID"), (K8S, "pciBusID"), (K8S, "pcieRoot")]
_EXISTING_VERSIONS = [(D, "driverVersion"), (D, "cudaDriverVersion"), (D, "cudaComputeCapability")]


def novel_selector(i: int) -> str:
    """Claim i's selector: a field or a literal no other claim's selector uses."""
    shape = i % 4
    if shape == 0:  # an attribute no device has, in a domain of its own
        attr = f"device.attributes['vendor{i}.example.com'].feature{i}"
        return f"!has({attr}) || {attr} == 'v{i}'"
    if shape == 1:  # an attribute no device has, in the driver's domain
        attr = f"device.attributes['{D}'].invented{i}"
        return f"!has({attr}) || {attr} >= {i}"
    if shape == 2:  # a string attribute devices have, against a literal never used
        domain, name = _EXISTING_STRINGS[(i // 4) % len(_EXISTING_STRINGS)]
        attr = f"device.attributes['{domain}'].{name}"
        return f"!has({attr}) || {attr} != 'never-{i}'"
    domain, name = _EXISTING_VERSIONS[(i // 4) % len(_EXISTING_VERSIONS)]
    attr = f"device.attributes['{domain}'].{name}"
    return f"!has({attr}) || {attr}.isGreaterThan(semver('1.{i}.0'))"


def _claims(n: int) -> list[JSON]:
    claims = []
    for i in range(n):
        cls = "mig.nvidia.com" if i % 10 == 9 else "gpu.nvidia.com"
        claims.append({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"novel-{i:03d}", "namespace": f"team-{i % _NAMESPACES:03d}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": cls, "count": 1 + i % 2,
                "selectors": [{"cel": {"expression": novel_selector(i)}}],
            }}]}},
        })
    return claims


def _quotas() -> list[JSON]:
    return [{
        "apiVersion": "draquota.io/v1alpha1",
        "kind": "DeviceQuota",
        "metadata": {"name": "gpus", "namespace": f"team-{k:03d}"},
        "spec": {"hard": {"memory": "1Ti", "devices": 16}},
    } for k in range(_NAMESPACES)]


def write_inputs(folder: Path, nodes: int, claims: int) -> dict[str, Path]:
    """Paths of the dump as 'json' and 'yaml', of the 'cluster' objects (DeviceClasses,
    Namespaces, DeviceQuotas) and of those plus the 'claims'; written unless cached."""
    base = folder / f"v{_FORMAT}-{nodes}-nodes"
    paths = {"json": base / "resourceslices.json", "yaml": base / "resourceslices.yaml",
             "cluster": base / "cluster.yaml", "claims": base / f"claims-{claims}.yaml"}
    base.mkdir(parents=True, exist_ok=True)
    if not (paths["json"].exists() and paths["yaml"].exists()):
        dump = _slice_list(nodes)
        _write(paths["json"], json.dumps(dump, indent=4, sort_keys=True) + "\n")
        # kubectl -o yaml: block style, sequences not indented under their key.
        _write(paths["yaml"], yaml.dump(dump, Dumper=yaml.CSafeDumper, default_flow_style=False, width=1 << 20))
    cluster = [*generate_device_classes(), *generate_namespaces(_NAMESPACES), *_quotas()]
    if not paths["cluster"].exists():
        _write(paths["cluster"], yaml.safe_dump_all(cluster, sort_keys=False))
    if not paths["claims"].exists():
        _write(paths["claims"], yaml.safe_dump_all([*cluster, *_claims(claims)], sort_keys=False))
    return paths


def _write(path: Path, text: str) -> None:
    # Write then rename: an interrupted run never leaves a truncated file in the cache.
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
