"""Pricing over partitionable devices: nodes as dra-example-driver publishes them with
`--gpu-partitions 4` (per GPU a counter set, four partitions and the full GPU drawing on it;
`tests/unit/drivers.py`).

Prints, per claim shape, the first pricing (nothing cached: the matches and the counter
work) and the cached one, p50 over `--samples` fresh Pricers sharing one matcher (so CEL
verdicts are warm, as on a serving replica after its first claims), and the charge:
- All over every device (cannot fit: the most the counters allow together),
- All over the partitions only (fits),
- ExactCount 2 (two full GPUs fit: the fast path),
- ExactCount 9 (no 9 full GPUs on a node: every candidate read, the exact search).

Not a timed test: `python bench/counters.py [--nodes N]` (1,000 nodes = 40,000 devices).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quota.devices.inventory import Inventory  # noqa: E402
from quota.devices.selectors import SelectorMatcher  # noqa: E402
from quota.objects.claims import parse_device_class  # noqa: E402
from quota.objects.claimspec import ClaimSpec, parse_claim_spec  # noqa: E402
from quota.pricing.pricer import Pricer  # noqa: E402
from tests.unit.drivers import example_partitionable  # noqa: E402

D = "gpu.example.com"


def claim(*selectors: str, count: int | None = None) -> ClaimSpec:
    body: dict[str, Any] = {"deviceClassName": D}
    if count is None:
        body["allocationMode"] = "All"
    else:
        body["count"] = count
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return parse_claim_spec({"devices": {"requests": [{"name": "r", "exactly": body}]}})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    inv = Inventory()
    started = time.perf_counter()
    inv.replace_all(s for n in range(args.nodes) for s in example_partitionable(f"node-{n}"))
    print(f"inventory: {args.nodes} nodes, {len(inv.usable())} devices, loaded in {time.perf_counter() - started:.2f} s")
    classes = {c.name: c for c in [parse_device_class({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": D},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{D}'"}}]}})]}
    shapes = {
        "All, every device": claim(),
        "All, partitions only": claim(f"!has(device.attributes['{D}'].full)"),
        "ExactCount 2": claim(count=2),
        "ExactCount 9": claim(count=9),
    }
    matcher = SelectorMatcher(inv)
    Pricer(inv, classes, matcher=matcher).estimate(shapes["ExactCount 2"])  # partitions built once
    for name, spec in shapes.items():
        first, cached = [], []
        total = None
        for _ in range(args.samples):
            pricer = Pricer(inv, classes, matcher=matcher)
            started = time.perf_counter()
            total = pricer.estimate(spec).total
            first.append(time.perf_counter() - started)
            started = time.perf_counter()
            pricer.estimate(spec)
            cached.append(time.perf_counter() - started)
        assert total is not None
        print(f"{name:22} first p50 {statistics.median(first) * 1e3:8.2f} ms  max {max(first) * 1e3:8.2f} ms  "
              f"cached p50 {statistics.median(cached) * 1e3:6.3f} ms  charge memory={total.memory / 2**30:.0f}Gi "
              f"devices={total.devices}")


if __name__ == "__main__":
    main()
