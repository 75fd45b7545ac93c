"""What quotas scoped by `spec.devices` cost a claim: 5,000 nodes x 8 GPUs, the generated claim mix.

Prints (and writes to bench/results/scoped.json), for 0, 1 and 8 distinct selections in
the claim's namespace (`quota.admission.admitter.MAX_PRICED_SELECTIONS`: by model, by memory, by
architecture, by driver, mixed), each as its own process state (fresh pricer, warm
inventory):
- estimate latency p50/p99 over the mix, first pass (every selector and selection new)
  and second pass (cached), and the CEL units a claim is charged (p50/max, against the
  per-claim budget of `quota.values.work`);
- exact pricing of allocated claims (two GPUs each), first and second pass;
- each as a ratio to the unscoped figure of the same run.

Not a timed test: run `python bench/scoped.py [--nodes N]`; print `uptime` beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inventory import generate_claims, generate_device_classes, generate_slices  # noqa: E402

from quota.devices.inventory import Inventory  # noqa: E402
from quota.objects.claims import Claim, parse_claim, parse_device_class  # noqa: E402
from quota.pricing.pricer import Pricer  # noqa: E402
from quota.quotas.scope import DeviceSelection  # noqa: E402
from quota.values.model import DeviceClassName  # noqa: E402
from quota.values.work import CLAIM_COST_BUDGET, Budget  # noqa: E402

D = "gpu.nvidia.com"
SELECTIONS = [
    DeviceSelection(frozenset({D}), (f"device.attributes['{D}'].productName.startsWith('NVIDIA H')",)),
    DeviceSelection(expressions=(f"device.driver == '{D}' && device.capacity['{D}'].memory.compareTo("
                                 "quantity('80Gi')) >= 0",)),
    DeviceSelection(frozenset({D}), (f"device.attributes['{D}'].architecture == 'Hopper'",)),
    DeviceSelection(frozenset({D})),
    DeviceSelection(frozenset({D}), (f"device.attributes['{D}'].type == 'mig'",)),
    DeviceSelection(frozenset({D}), (f"device.attributes['{D}'].productName == 'NVIDIA A100-SXM4-40GB'",)),
    DeviceSelection(frozenset({D}), (f"device.attributes['{D}'].cudaComputeCapability.isGreaterThan("
                                     "semver('8.5.0'))",)),
    DeviceSelection(frozenset({D}), (f"device.attributes['{D}'].type == 'gpu'",
                                     f"device.capacity['{D}'].memory.compareTo(quantity('100Gi')) < 0")),
]


def percentiles(values: Sequence[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))], ordered[-1]


def timed_each(items: Sequence[Claim], fn: Callable[[Claim], Any]) -> list[float]:
    times = []
    for item in items:
        start = time.perf_counter()
        fn(item)
        times.append((time.perf_counter() - start) * 1000)
    return times


def run(inventory: Inventory, classes: dict[DeviceClassName, Any], pending: list[Claim], allocated: list[Claim],
        selections: list[DeviceSelection]) -> dict[str, Any]:
    pricer = Pricer(inventory, classes)
    spent: list[int] = []

    def estimate(claim: Claim) -> None:
        budget = Budget.claim()
        pricing = pricer.estimate(claim.spec, budget=budget, selections=selections)
        assert not pricing.errors, pricing.errors
        spent.append(budget.spent)

    row: dict[str, Any] = {"selections": len(selections)}
    for name, claims, fn in (("estimate", pending, estimate),
                             ("exact", allocated, lambda c: pricer.exact(c, selections=selections))):
        for phase in ("first", "second"):
            spent.clear()
            p50, p99, worst = percentiles(timed_each(claims, fn))
            row[f"{name} {phase}"] = {"p50_ms": round(p50, 4), "p99_ms": round(p99, 4), "max_ms": round(worst, 4)}
            if name == "estimate":
                row[f"{name} {phase}"]["units_p50"] = int(statistics.median(spent))
                row[f"{name} {phase}"]["units_max"] = max(spent)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=400)
    args = parser.parse_args()
    slices = generate_slices(args.nodes, 8)
    inventory = Inventory()
    inventory.replace_all(slices)
    classes = {DeviceClassName(c["metadata"]["name"]): parse_device_class(c) for c in generate_device_classes()}
    claims = [parse_claim(c) for c in generate_claims(args.claims * 2, 50, 7, slices, allocated_fraction=0.5)]
    pending = [c for c in claims if c.allocation is None][:args.claims]
    allocated = [c for c in claims if c.allocation is not None][:args.claims]
    print(f"{len(inventory.usable())} devices; {len(pending)} pending and {len(allocated)} allocated claims; "
          f"load average {os.getloadavg()[0]:.2f}")
    rows = [run(inventory, classes, pending, allocated, SELECTIONS[:n]) for n in (0, 1, 8)]
    base = rows[0]
    for row in rows:
        for what in ("estimate first", "estimate second", "exact first", "exact second"):
            got, ref = row[what], base[what]
            units = (f"  units p50 {got['units_p50']:,} max {got['units_max']:,} (budget {CLAIM_COST_BUDGET:,})"
                     if "units_p50" in got else "")
            print(f"{row['selections']} selection(s), {what:<16} p50 {got['p50_ms']:8.3f} ms  p99 {got['p99_ms']:8.3f} "
                  f"ms  (x{got['p99_ms'] / ref['p99_ms']:.2f} p99 of unscoped){units}")
    print(f"load average {os.getloadavg()[0]:.2f}")
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "scoped.json").write_text(json.dumps({"nodes": args.nodes, "rows": rows}, indent=2))
    print(f"results written to {out / 'scoped.json'}")


if __name__ == "__main__":
    main()
