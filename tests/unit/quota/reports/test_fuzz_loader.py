"""Fuzzing quota.reports.loader: any file content loads or raises CheckInputError, within bounds.

Contents: random bytes, valid YAML/JSON documents with bytes mutated, deep nesting in
both syntaxes, long numbers, aliases. Every example runs under
`tests.unit.bounds.bounded`; what loads must be plain JSON values (json.dumps works).
`DRA_QUOTA_FUZZ_EXAMPLES` sets the example count (default 100) for a longer run.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quota.reports.loader import CheckInputError, load_documents

from ...bounds import bounded, fuzz_examples

EXAMPLES = fuzz_examples(100)
FUZZ = settings(max_examples=EXAMPLES, deadline=None)

SLICE_YAML = """\
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: node-1-gpu, uid: "1"}
spec:
  driver: gpu.nvidia.com
  pool: {name: node-1, generation: 1, resourceSliceCount: 1}
  nodeName: node-1
  devices:
  - name: gpu-0
    attributes:
      productName: {string: NVIDIA H100}
      cudaComputeCapability: {version: 9.0.0}
    capacity:
      memory: {value: 80Gi}
---
apiVersion: draquota.io/v1alpha1
kind: DeviceQuota
metadata: {name: q, namespace: team-a}
spec: {hard: {memory: 320Gi, devices: 8}}
"""
SLICE_JSON = json.dumps(
    {"apiVersion": "v1", "kind": "List", "metadata": {},
     "items": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a", "labels": {"x": "y"}}}]},
    indent=4, sort_keys=True,
)
SEEDS = [SLICE_YAML.encode(), SLICE_JSON.encode()]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid document with a few bytes replaced, inserted or deleted."""
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(("replace", "insert", "delete")))
        chunk = draw(st.binary(min_size=1, max_size=4) | st.sampled_from(
            [b"&a ", b"*a", b"<<: ", b"[", b"{", b"]", b"}", b'"', b"\\u", b"\\ud800", b"!!set ", b"\n- ", b"9" * 30]))
        if action == "delete":
            del data[at:at + len(chunk)]
        elif action == "insert":
            data[at:at] = chunk
        else:
            data[at:at + len(chunk)] = chunk
    return bytes(data)


@st.composite
def nested(draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(1, 20_000))
    shape = draw(st.sampled_from(("json", "flow", "block", "mixed", "unclosed")))
    if shape == "json":
        return b"[" * depth + b"]" * depth
    if shape == "flow":
        return b"a: " + b"{b: " * depth + b"}" * depth
    if shape == "block":
        return b"".join(b"  " * i + b"a:\n" for i in range(min(depth, 2_000)))
    if shape == "mixed":
        return b'{"a": [' * depth + b"1" + b"]}" * depth
    return b"[" * depth


numbers = st.builds(
    lambda sign, digits, json_file: (
        (b'{"kind": "X", "n": ' if json_file else b"kind: X\nn: ") + sign + b"7" * digits + (b"}" if json_file else b"")
    ),
    st.sampled_from((b"", b"-", b"+", b"0x", b"0b", b"1_")),
    st.integers(1, 6_000),
    st.booleans(),
)

contents = st.one_of(st.binary(max_size=2_000), mutated(), nested(), numbers)


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


def _load(path: Path) -> None:
    try:
        docs, _ = load_documents([str(path)])
    except CheckInputError:
        return
    for doc in docs:
        json.dumps(doc.obj)


@FUZZ
@given(content=contents, suffix=st.sampled_from((".yaml", ".json", ".yml")))
def test_any_content_loads_or_is_refused_within_bounds(folder: Path, content: bytes, suffix: str) -> None:
    path = folder / f"input{suffix}"
    path.write_bytes(content)
    with bounded(seconds=10, megabytes=256):
        _load(path)
