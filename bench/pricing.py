"""Pricing benchmark: 5,000 nodes x 8 GPUs, claims priced as the webhook prices them.

Prints (and writes to bench/results/pricing.json):
- inventory load time (ResourceSlice dicts -> Inventory) and RSS after load;
- per-claim pricing latency p50/p99 for (a) selectors already seen, (b) selectors never
  seen before over attributes other selectors already used (new literals: the common
  case), (c) selectors reading a device field no selector read before (the first claim
  that looks at, say, `architecture`: once per field per process), (d) seen selectors
  right after a ResourceSlice changed (churn), (e) 200 selectors each reading a field
  no selector read before (existing attribute and capacity names, names that exist
  nowhere guarded with has(), other domains: what a tenant inventing names sends), (f)
  selectors reading `uuid`, one distinct value per device (CEL then runs per device: the
  floor of any grouping; the first also partitions by uuid), (g) selectors testing only
  the presence of per-device fields (grouped by presence), (h) 100 never-seen claims
  each pinning one device (`uuid == "GPU-..."`, or a PCI bus id), answered from the
  equality index (`quota.devices.equality`), and 100 others with the index off (what every
  such claim cost without the index), and the realistic generated claim mix;
- each against its target (docs/development/performance.md), as a ratio.

Not a timed test: run `python bench/pricing.py [--nodes N]`.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from unittest.mock import patch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inventory import generate_claims, generate_device_classes, generate_slices  # noqa: E402

from quota.devices.inventory import Inventory  # noqa: E402
from quota.objects.claims import parse_claim, parse_device_class  # noqa: E402
from quota.objects.claimspec import ClaimSpec, parse_claim_spec  # noqa: E402
from quota.pricing.pricer import Pricer  # noqa: E402
from quota.values.model import DeviceClassName  # noqa: E402

D = "gpu.nvidia.com"
PRODUCTS = ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-40GB", "NVIDIA L40S"]


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def spec(cls: str, *selectors: str, count: int = 1) -> ClaimSpec:
    body: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return parse_claim_spec({"devices": {"requests": [{"name": "gpu", "exactly": body}]}})


def seen_selectors() -> list[ClaimSpec]:
    return [
        *(spec("gpu.nvidia.com", f"device.attributes['{D}'].productName == '{p}'") for p in PRODUCTS),
        *(spec("gpu.nvidia.com", f"device.capacity['{D}'].memory.compareTo(quantity('{g}Gi')) >= 0") for g in (40, 80, 141)),
        spec("gpu.nvidia.com", count=2),
        spec("mig.nvidia.com", f"device.attributes['{D}'].profile == '1g.5gb'"),
        spec("gpu.nvidia.com", f"device.attributes['{D}'].cudaComputeCapability.isGreaterThan(semver('8.5.0'))"),
    ]


def new_literal_selectors(rng: random.Random, n: int) -> list[ClaimSpec]:
    """Unique expressions over fields earlier selectors already read (new literal values)."""
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            gib = rng.randint(1, 200) + i / 1000
            out.append(spec("gpu.nvidia.com", f"device.capacity['{D}'].memory.compareTo(quantity('{gib:.3f}Gi')) >= 0"))
        elif kind == 1:
            out.append(spec("gpu.nvidia.com", f"device.attributes['{D}'].productName == '{rng.choice(PRODUCTS)}' || "
                                              f"device.attributes['{D}'].productName == 'X{i}'"))
        else:
            out.append(spec("gpu.nvidia.com", f"device.attributes['{D}'].cudaComputeCapability.isGreaterThan("
                                              f"semver('{rng.randint(7, 9)}.{rng.randint(0, 9)}.{i}'))"))
    return out


NEW_FIELDS = ["architecture", "brand", "driverVersion", "cudaDriverVersion", "type", "productName"]


def new_field_selectors() -> list[ClaimSpec]:
    """Each reads a field (or field combination) no earlier selector read."""
    out = []
    for a, b in zip(NEW_FIELDS, NEW_FIELDS[1:] + NEW_FIELDS[:1]):
        out.append(spec("gpu.nvidia.com", f"has(device.attributes['{D}'].{a}) && has(device.attributes['{D}'].{b})"))
    return out


# Fields (e) reads that exist in the inventory and that no earlier case reads: GPU and MIG
# attributes, the qualified resource.kubernetes.io ones, and the MIG-only capacities.
_EXISTING_ATTRIBUTES = [
    (D, "profile"), (D, "parentUUID"), ("resource.kubernetes.io", "pciBusID"),
    ("resource.kubernetes.io", "pcieRoot"), ("resource.kubernetes.io", "numaNode"),
]
_EXISTING_CAPACITIES = ["multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines"]


def unread_field_selectors(n: int) -> list[ClaimSpec]:
    """Each reads a path no earlier selector read: one of the existing fields above (alone,
    then paired with an already-read one), or a name that exists nowhere, as an attribute
    or a capacity, in the driver's domain or another one."""
    existing = [f"has(device.attributes['{d}'].{a})" for d, a in _EXISTING_ATTRIBUTES]
    existing += [f"has(device.capacity['{D}'].{c})" for c in _EXISTING_CAPACITIES]
    existing += [f"device.attributes['{D}'].productName != 'X' && has(device.attributes['{d}'].{a})"
                 for d, a in _EXISTING_ATTRIBUTES]
    invented = [
        lambda i: f"!has(device.attributes['{D}'].invented{i}) || device.attributes['{D}'].invented{i} == 'x'",
        lambda i: f"!has(device.capacity['{D}'].units{i})",
        lambda i: f"!has(device.attributes['vendor{i}.example.com'].model)",
        lambda i: f"device.attributes['{D}'].architecture != 'Pascal' && !has(device.attributes['{D}'].extra{i})",
    ]
    out = []
    for i in range(n):
        # Spread the existing fields over the run rather than front-loading them.
        if i % 12 == 5 and existing:
            out.append(spec("gpu.nvidia.com", existing.pop(0)))
        else:
            out.append(spec("gpu.nvidia.com", invented[i % len(invented)](i)))
    return out


def uuid_selectors(slices: list[dict[str, Any]]) -> list[ClaimSpec]:
    """A tenant pinning one GPU, or a prefix of uuids: CEL must run on every device."""
    pinned = slices[len(slices) // 2]["spec"]["devices"][0]["attributes"]["uuid"]["string"]
    return [spec(cls, expression) for cls in ("gpu.nvidia.com", "mig.nvidia.com") for expression in (
        f"device.attributes['{D}'].uuid != 'GPU-0'",
        f"device.attributes['{D}'].uuid == '{pinned}'",
        f"device.attributes['{D}'].uuid.startsWith('GPU-3')",
    )]


def presence_selectors() -> list[ClaimSpec]:
    """Presence of per-device fields only: as cheap as a field every device has."""
    return [spec(cls, expression) for cls in ("gpu.nvidia.com", "mig.nvidia.com") for expression in (
        f"'uuid' in device.attributes['{D}']",
        f"has(device.attributes['{D}'].uuid) && !has(device.attributes['{D}'].parentUUID)",
        f"!('parentUUID' in device.attributes['{D}']) || has(device.attributes['{D}'].uuid)",
    )]


def pinning_selectors(slices: list[dict[str, Any]], n: int, salt: str) -> list[ClaimSpec]:
    """`n` claims each pinning one device, by uuid or (a GPU and its MIG slices share it)
    by PCI bus id, never seen before."""
    rng = random.Random(salt)
    out = []
    for _ in range(n):
        attributes = rng.choice(rng.choice(slices)["spec"]["devices"])["attributes"]
        cls = "mig.nvidia.com" if "profile" in attributes else "gpu.nvidia.com"
        bus = attributes.get("resource.kubernetes.io/pciBusID")
        if bus is not None and rng.random() < 0.3:
            expression = f"device.attributes['resource.kubernetes.io'].pciBusID == '{bus['string']}'"
        else:
            expression = f"device.attributes['{D}'].uuid == '{attributes['uuid']['string']}'"
        out.append(spec(cls, expression))
    return out


def pinned_without_index(pricer: Pricer, specs: Sequence[ClaimSpec]) -> list[float]:
    with patch("quota.devices.selectors.index_term", lambda stage: None):
        return measure(pricer, specs)


def measure(pricer: Pricer, specs: Sequence[ClaimSpec]) -> list[float]:
    times = []
    for s in specs:
        start = time.perf_counter()
        pricing = pricer.estimate(s)
        times.append((time.perf_counter() - start) * 1000)
        assert not pricing.errors, pricing.errors
    return times


def summary(name: str, times: list[float], target_ms: float | None) -> dict[str, Any]:
    times = sorted(times)
    p50 = statistics.median(times)
    p99 = times[min(len(times) - 1, int(round(0.99 * (len(times) - 1))))]
    row = {"name": name, "n": len(times), "p50_ms": round(p50, 4), "p99_ms": round(p99, 4), "max_ms": round(times[-1], 4)}
    ratio = f"  p99/target = {p99 / target_ms:.2f}" if target_ms else ""
    print(f"{name:<44} n={len(times):<5} p50={p50:8.3f} ms  p99={p99:8.3f} ms  max={times[-1]:8.3f} ms{ratio}")
    if target_ms:
        row["target_p99_ms"] = target_ms
    return row


def markdown(load_s: float, rss: float, rows: list[dict[str, Any]]) -> str:
    """The numbers as a docs/development/performance.md table row per case: p50 / p99 / max against the target."""
    lines = ["| what | p50 | p99 | max | target p99 |", "|---|---|---|---|---|",
             f"| inventory load | {load_s:.2f} s | | | 5 s |", f"| RSS after load | {rss:.0f} MiB | | | 400 MiB |"]
    for row in rows:
        target = f"{row['target_p99_ms']:g} ms" if "target_p99_ms" in row else ""
        lines.append(f"| {row['name']} (n={row['n']}) | {row['p50_ms']:.3g} ms | {row['p99_ms']:.3g} ms "
                     f"| {row['max_ms']:.3g} ms | {target} |")
    return "\n".join(lines)


def churn(pricer: Pricer, inventory: Inventory, slices: list[dict[str, Any]], seen: list[ClaimSpec],
          rng: random.Random, n: int) -> list[float]:
    """Each sample: one slice republished with a new pool generation, then a seen selector."""
    times = []
    for _ in range(n):
        updated = copy.deepcopy(slices[rng.randrange(len(slices))])
        updated["spec"]["pool"]["generation"] += 1
        inventory.add_or_update_slice(updated)
        times.extend(measure(pricer, [rng.choice(seen)]))
    return times


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--freeze", action=argparse.BooleanOptionalAction, default=True,
                        help="gc.freeze() after the initial load, as the server does (default on)")
    args = parser.parse_args()

    base_rss = rss_mib()
    slices, gen_s = timed(lambda: generate_slices(args.nodes, args.gpus_per_node))
    inventory = Inventory()
    _, load_s = timed(lambda: inventory.replace_all(slices))
    gc.collect()
    if args.freeze:
        # What a long-running server does after its initial list: the inventory is
        # long-lived, so later collections should not rescan its millions of objects.
        gc.freeze()
    devices = len(inventory.usable())
    rss = rss_mib()
    print(f"inventory: {args.nodes} nodes, {len(slices)} slices, {devices} devices "
          f"(generated in {gen_s:.2f} s)")
    print(f"inventory load: {load_s:.2f} s (target 5 s, ratio {load_s / 5:.2f}); "
          f"RSS {rss:.0f} MiB, {rss - base_rss:.0f} MiB above start (target 400 MiB, ratio {rss / 400:.2f})")

    classes = {DeviceClassName(c["metadata"]["name"]): parse_device_class(c) for c in generate_device_classes()}
    pricer = Pricer(inventory, classes)
    rng = random.Random(1)
    results: dict[str, Any] = {"nodes": args.nodes, "devices": devices, "load_s": round(load_s, 3), "rss_mib": round(rss)}

    seen = seen_selectors()
    first = measure(pricer, seen)  # warm-up: the first sight of each selector
    rows = [summary("first sight of the warm-up selectors", first, None)]
    rows.append(summary("(a) selector already seen", measure(pricer, [rng.choice(seen) for _ in range(args.samples * 10)]), 1.0))
    rows.append(summary("(b) never seen, fields already read", measure(pricer, new_literal_selectors(rng, args.samples)), 50.0))
    rows.append(summary("(c) never seen, reads a new field", measure(pricer, new_field_selectors()), 50.0))
    rows.append(summary("(e) never seen, reads a field never read", measure(pricer, unread_field_selectors(200)), 50.0))
    rows.append(summary("(f) never seen, reads uuid (CEL per device)", measure(pricer, uuid_selectors(slices)), 200.0))
    rows.append(summary("(g) never seen, presence of per-device fields", measure(pricer, presence_selectors()), 50.0))
    rows.append(summary("(d) seen, right after a slice update", churn(pricer, inventory, slices, seen, rng, args.samples), 1.0))
    before = pinned_without_index(pricer, pinning_selectors(slices, 100, "before"))
    after = measure(pricer, pinning_selectors(slices, 100, "after"))
    rows.append(summary("(h) 100 never seen, pin one device: no index", before, 50.0))
    rows.append(summary("(h) 100 never seen, pin one device: index", after, 50.0))
    print(f"(h) 100 claims pinning one device each: {sum(before) / 1000:.2f} s without the index, "
          f"{sum(after) / 1000:.3f} s with it (target 10 s; load average {os.getloadavg()[0]:.2f})")
    claims = [parse_claim(c) for c in generate_claims(args.samples * 4, 50, 7, slices, allocated_fraction=0.0)]
    mix = [c.spec for c in claims]
    rows.append(summary("generated claim mix (first pass)", measure(pricer, mix), None))
    rows.append(summary("generated claim mix (second pass)", measure(pricer, mix), 1.0))
    results["latency"] = rows
    print()
    print(markdown(load_s, rss, rows))

    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "pricing.json").write_text(json.dumps(results, indent=2))
    print(f"results written to {out / 'pricing.json'}")


if __name__ == "__main__":
    main()
