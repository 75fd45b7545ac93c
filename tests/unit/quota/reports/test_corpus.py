"""The real-driver corpus (tests/unit/quota/reports/corpus/): ResourceSlices shaped as the NVIDIA,
AMD, Intel, Google TPU, dra-example-driver and dranet drivers publish them, their own
example claims and GPU + NIC pairings, run through `dra-quota check -o json` as a
process: every claim charged as corpus-expected.yaml says, a GPU + NIC claim charged the GPU
alone, and no claim denied because a device publishes no memory unless it is an
accelerator nothing prices (docs/charging.md, "Devices without a memory")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from quota.values.quantity import parse_quantity

CORPUS = Path(__file__).parent / "corpus"
EXPECTED = Path(__file__).parent / "corpus-expected.yaml"
ROOT = Path(__file__).parents[4]


def check(*flags: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "commands.cli", "check", "-f", str(CORPUS), "-o", "json", *flags],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def amounts(pair: list[Any]) -> dict[str, int]:
    return {"memory": int(parse_quantity(pair[0])), "devices": int(pair[1])}


def test_every_claim_of_the_corpus_is_charged_as_the_rules_say() -> None:
    expected = yaml.safe_load(EXPECTED.read_text())
    report = check()
    claims = {f"{o['namespace']}/{o['name']}": o for o in report["objects"]}
    assert claims.keys() == expected["claims"].keys()
    for key, want in expected["claims"].items():
        got = claims[key]
        if "denied" in want:
            assert not got["allowed"] and want["denied"] in got["reason"], (key, got["reason"])
            continue
        assert got["allowed"], (key, got["reason"])
        assert got["charge"] == amounts(want["charge"]), key
        for fragment in want.get("warns", ()):
            assert any(fragment in w for w in got["warnings"]), (key, got["warnings"])
        if not want.get("warns"):
            assert not any("memory" in w for w in got["warnings"]), (key, got["warnings"])
    quotas = {f"{q['namespace']}/{q['name']}": q for q in report["quotas"]}
    for key, want in expected["quotas"].items():
        for field in ("used", "reserved"):
            if field in want:
                assert quotas[key][field] == amounts(want[field]), (key, field)


def test_no_claim_is_denied_for_a_device_without_memory_but_an_unpriced_accelerator() -> None:
    denied = [o for o in check()["objects"] if not o["allowed"]]
    unpriced = [o["name"] for o in denied if "cannot be priced" in o["reason"]]
    assert unpriced == ["gaudi-unknown-model"]
    assert all("Publish the devices" not in o["reason"] for o in denied)


def test_without_the_shipped_sources_vfio_gaudi_and_tpu_are_outside_the_quota() -> None:
    # The memory sources are what prices them: without, they are devices without a memory.
    claims = {o["name"]: o for o in check("--no-default-memory-sources")["objects"] if o["namespace"] == "ml"}
    for name in ("nvidia-vfio-gpu", "gaudi", "tpu-all-chips", "gaudi-unknown-model"):
        assert claims[name]["allowed"] and claims[name]["charge"] == {"memory": 0, "devices": 0}, name
