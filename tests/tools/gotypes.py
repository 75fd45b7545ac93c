"""The JSON field trees of Kubernetes Go API types, read from the k8s.io modules' sources.

tests/unit/quota/objects/test_knownfields.py compares `quota.objects.knownfields` (the fields `dra-quota check`
accepts, as the API server's strict decoding does) with what the Go types define, so the
hand-written trees cannot drift from the API the e2e control plane is built from. The
modules are the versions tests/cluster/go.mod pins, fetched by `go mod download` into
GOMODCACHE (a no-op once there; the e2e build has fetched them already). No Go: a
GoTypesError with the reason (the test fails, never skips).

The reader understands what the API types use: `type X struct { Field T \\`json:"name,..."\\` }`,
embedded structs with `json:",inline"`, pointers, slices, maps and named scalar types.
A struct without any json-tagged field marshals itself (metav1.Time, FieldsV1,
resource.Quantity, runtime.RawExtension) and reads as any value (None), as do types of
packages not read here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

GO_MOD = Path(__file__).resolve().parents[1] / "cluster" / "go.mod"
# Package import path -> the aliases the resource types use for it.
PACKAGES = {
    "k8s.io/api/resource/v1": "", "k8s.io/api/resource/v1beta1": "", "k8s.io/api/resource/v1beta2": "",
    "k8s.io/api/core/v1": "v1", "k8s.io/apimachinery/pkg/apis/meta/v1": "metav1",
}
_STRUCT = re.compile(r"^type (\w+) struct \{$")
_FIELD = re.compile(r'^(?:(\w+)\s+)?([\w.\[\]*]+)\s+`[^`]*json:"([^"]*)"')
Tree = Any  # None | dict[str, Tree] | list[Tree], as quota.objects.knownfields.Schema


class GoTypesError(RuntimeError):
    pass


def _pinned(module: str) -> str:
    found = re.search(rf"^replace {re.escape(module)} => {re.escape(module)} (\S+)$", GO_MOD.read_text(), re.M)
    if found is None:
        raise GoTypesError(f"{GO_MOD} pins no version of {module}")
    return found.group(1)


@cache
def module_dir(module: str) -> Path:
    go = shutil.which("go")
    if go is None:
        raise GoTypesError(f"go is not on PATH: it fetches {module} (the API types) into GOMODCACHE")
    version = _pinned(module)
    env = {**os.environ, "GOFLAGS": "", "GOTOOLCHAIN": "local"}
    proc = subprocess.run([go, "mod", "download", "-json", f"{module}@{version}"], env=env, capture_output=True,
                          text=True, timeout=600, check=False, cwd=GO_MOD.parent)
    try:
        answer = json.loads(proc.stdout)
    except json.JSONDecodeError:
        answer = {}
    if proc.returncode != 0 or "Dir" not in answer:
        raise GoTypesError(f"go mod download {module}@{version} failed: {answer.get('Error') or proc.stderr.strip()}")
    return Path(answer["Dir"])


def _package_dir(package: str) -> Path:
    module = "k8s.io/api" if package.startswith("k8s.io/api/") else "k8s.io/apimachinery"
    return module_dir(module) / package.removeprefix(module + "/")


@cache
def structs(package: str) -> dict[str, list[tuple[str, str]]]:
    """struct name -> [(json name, Go type)] of every non-test .go file of the package
    ("" as the name: an embedded struct inlined)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(_package_dir(package).glob("*.go")):
        if path.name.endswith("_test.go"):
            continue
        current: str | None = None
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if line.startswith("//"):
                continue
            if (start := _STRUCT.match(line)) is not None:
                current = start.group(1)
                found[current] = []
            elif current is not None and line == "}":
                current = None
            elif current is not None and (field := _FIELD.match(line)) is not None:
                _, go_type, tag = field.groups()
                name = tag.split(",")[0]
                if name != "-":
                    found[current].append((name, go_type))
    return found


def tree(package: str, go_type: str) -> Tree:
    """The JSON field tree of `go_type` as named inside `package`."""
    go_type = go_type.lstrip("*")
    if go_type.startswith("[]"):
        return [tree(package, go_type[2:])]
    if go_type.startswith("map["):
        return {"*": tree(package, go_type[go_type.index("]") + 1:])}
    alias, dot, name = go_type.rpartition(".")
    if dot:
        owner = next((p for p, a in PACKAGES.items() if a == alias), None)
        if owner is None:
            return None  # resource.Quantity, runtime.RawExtension, types.UID: their own JSON
        package, go_type = owner, name
    fields = structs(package).get(go_type)
    if not fields:
        return None  # a named scalar, or a struct that marshals itself
    out: dict[str, Tree] = {}
    for field_name, field_type in fields:
        if field_name == "":
            inlined = tree(package, field_type)
            out.update(inlined if isinstance(inlined, dict) else {})
        else:
            out[field_name] = tree(package, field_type)
    return out


def difference(ours: Tree, theirs: Tree, path: str = "") -> tuple[set[str], set[str]]:
    """(paths only in `ours`, paths only in `theirs`), descending where both have a field.

    `ours` None (any value) covers a list or map of anything; against a struct `theirs`
    it is reported (its fields would go unchecked)."""
    if ours is None:
        return set(), ({path} if isinstance(theirs, dict) and "*" not in theirs else set())
    if isinstance(ours, list) and isinstance(theirs, list):
        return difference(ours[0], theirs[0], path + "[]")
    if isinstance(ours, dict) and isinstance(theirs, dict):
        only_ours = {f"{path}.{k}" for k in ours.keys() - theirs.keys()}
        only_theirs = {f"{path}.{k}" for k in theirs.keys() - ours.keys()}
        for key in ours.keys() & theirs.keys():
            a, b = difference(ours[key], theirs[key], f"{path}.{key}")
            only_ours |= a
            only_theirs |= b
        return only_ours, only_theirs
    return {path}, {path}  # structure where the Go type has a scalar, or a list against an object
