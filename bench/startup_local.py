"""bench/startup.py's start-up, in-process: the same objects into `serve`'s caches, no control plane.

The fast loop for the start-up path: what a fresh replica's caches (`commands.wiring.Caches`,
the stores its reflectors feed) do with 5,000 nodes' ResourceSlices, 500 namespaces with a
DeviceQuota each, 20 ClusterDeviceQuotas and 150,000 ResourceClaims (bench/startup.py's
load: bench/inventory.py's mix, as many allocated as the inventory holds, each claim with
the annotations the leader writes). Each object is decoded from its JSON text as a watch
event's is, trimmed as the reflector trims it, and staged `STREAM_BATCH` at a time
(`kube.watching`'s streamed list); then the stored claims are priced as `controllers.refine`
prices them after ready. Printed: CPU seconds per phase, RSS after each, and the Python
heap the claims' accounting holds (tracemalloc, `--trace`: slower, run apart). `--digest`
prints a digest of every ledger entry once the claims are listed (each entry's `repr`: its
pricing in every mode and its claim, in the order of their refs): two versions of the code
that account every claim alike print the same one.

The generated objects are written once to `--data DIR` (about 200 MB) and read back by
later runs. `--profile FILE` writes a cProfile of the claims' list.

    python bench/startup_local.py [--data DIR] [--claims 150000] [--profile out.prof] [--trace] [--digest]

Not a timed test; prints the load average beside the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import hashlib
import json
import os
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from admission import rss_of  # noqa: E402
from inventory import generate_claims, generate_device_classes, generate_slices  # noqa: E402
from startup import annotated, cluster_quota, device_quota, namespaces  # noqa: E402

from commands.wiring import Caches  # noqa: E402
from kube.watching import STREAM_BATCH, Reflector  # noqa: E402

JSON = dict[str, Any]
KINDS = ("slices", "classes", "namespaces", "quotas", "claims")


def generate(data: Path, args: argparse.Namespace) -> None:
    """The objects of bench/startup.py's load, one JSON text a line per kind."""
    data.mkdir(parents=True, exist_ok=True)
    nss = namespaces(args.namespaces, args.teams)
    quotas = [device_quota(n["metadata"]["name"]) for n in nss] + [cluster_quota(k) for k in range(args.teams)]
    slices = generate_slices(args.nodes)
    claims = generate_claims(args.claims, args.namespaces, 11, slices, allocated_fraction=1.0)
    version = iter(range(1000, 10**9))

    def stamped(obj: JSON, i: int, kind: str) -> JSON:
        meta = obj["metadata"]
        meta.setdefault("uid", f"{kind}-{i}")
        meta["resourceVersion"] = str(next(version))
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        meta.setdefault("generation", 1)
        return obj

    objects = {"slices": slices, "classes": generate_device_classes(), "namespaces": nss, "quotas": quotas,
               "claims": list(annotated(claims, slices, nss, quotas))}
    for kind, items in objects.items():
        with (data / f"{kind}.jsonl").open("w") as out:
            for i, obj in enumerate(items):
                out.write(json.dumps(stamped(obj, i, kind), separators=(",", ":")) + "\n")


def lines(data: Path, kind: str) -> Iterator[str]:
    with (data / f"{kind}.jsonl").open() as f:
        yield from f


def cpu() -> float:
    return time.process_time()


def feed(reflector: Reflector, texts: Iterator[str]) -> int:
    """A streamed list into `reflector`'s store: each object decoded and trimmed as the
    reflector does, staged `STREAM_BATCH` at a time where the store stages, else whole."""
    store: Any = reflector.store
    count = 0
    if hasattr(store, "relist"):
        relist = store.relist()
        batch: list[JSON] = []
        for text in texts:
            batch.append(reflector.trim(json.loads(text)))
            count += 1
            if len(batch) >= STREAM_BATCH:
                relist.add(batch)
                batch = []
        relist.add(batch)
        relist.commit()
        return count
    items = [reflector.trim(json.loads(text)) for text in texts]
    store.replace(items)
    return len(items)


def phase(name: str, fn: Callable[[], object], results: JSON) -> None:
    started, wall = cpu(), time.perf_counter()
    out = fn()
    results[name] = {"cpu_s": round(cpu() - started, 2), "wall_s": round(time.perf_counter() - wall, 2),
                     "rss_mib": round(rss_of(os.getpid()))}
    print(f"{name}: {results[name]['cpu_s']} s CPU, RSS {results[name]['rss_mib']} MiB"
          + (f" ({out})" if out is not None else ""), flush=True)


async def refine(caches: Caches) -> int:
    """The stored claims priced as after ready (`controllers.refine`), until none waits."""
    ready = asyncio.Event()
    ready.set()
    refiner = caches.refiner
    task = asyncio.create_task(refiner.run(ready.wait))
    while refiner.pending:
        await asyncio.sleep(0.01)
    task.cancel()
    return refiner.refined


def usage(caches: Caches) -> JSON:
    """Every quota's usage summed (what two versions of the code must agree on)."""
    ledger = caches.admitter.ledger
    totals = [0] * 6
    for quota in ledger.quotas():
        u = ledger.usage(quota.namespace, quota.name)
        for i, n in enumerate((u.used.memory, u.used.devices, u.reserved.memory, u.reserved.devices,
                               u.allocated_claims, u.pending_claims)):
            totals[i] += n
    return dict(zip(("used_memory", "used_devices", "reserved_memory", "reserved_devices", "allocated", "pending"),
                    totals, strict=True))


def digest(caches: Caches) -> str:
    """A digest of every ledger entry, whole (`--digest`)."""
    hashed = hashlib.sha256()
    for entry in sorted(caches.admitter.ledger.entries(), key=lambda e: e.ref):
        hashed.update(repr(entry).encode())
    return hashed.hexdigest()


def run(data: Path, args: argparse.Namespace) -> JSON:
    results: JSON = {"load_average": os.getloadavg()}
    caches = Caches(None, "conservative", leading=lambda: True)  # type: ignore[arg-type]
    by_kind = {"slices": caches.first[0], "classes": caches.first[1], "namespaces": caches.first[2],
               "claims": caches.claims}
    quotas, teams = caches.first[3], caches.first[4]
    gc.freeze()
    results["rss_start_mib"] = round(rss_of(os.getpid()))
    # Full collections stay off while a list is built, and what it built is frozen after
    # (`kube.rebuilds`), as in `serve`.
    with caches.rebuilds.rebuilding():
        phase("slices", lambda: feed(by_kind["slices"], lines(data, "slices")), results)
    with caches.rebuilds.rebuilding():
        phase("classes", lambda: feed(by_kind["classes"], lines(data, "classes")), results)
        phase("namespaces", lambda: feed(by_kind["namespaces"], lines(data, "namespaces")), results)

        def both_quotas() -> int:
            texts = list(lines(data, "quotas"))
            return (feed(quotas, (t for t in texts if '"kind":"DeviceQuota"' in t)) +
                    feed(teams, (t for t in texts if '"kind":"ClusterDeviceQuota"' in t)))

        phase("quotas", both_quotas, results)
    if args.trace:
        tracemalloc.start()
    profile = cProfile.Profile() if args.profile else None
    with caches.rebuilds.rebuilding():
        if profile is not None:
            profile.enable()
        phase("claims", lambda: feed(by_kind["claims"], lines(data, "claims")), results)
        if profile is not None:
            profile.disable()
            profile.dump_stats(str(args.profile))
    if args.trace:
        held, peak = tracemalloc.get_traced_memory()
        results["claims"]["traced_mib"], results["claims"]["traced_peak_mib"] = round(held / 2**20, 1), round(peak / 2**20, 1)
        print(f"  the claims' accounting holds {results['claims']['traced_mib']} MiB of Python heap "
              f"({held / args.claims:.0f} B a claim), {results['claims']['traced_peak_mib']} MiB at its peak")
        snapshot = tracemalloc.take_snapshot()
        for stat in snapshot.statistics("lineno")[:args.trace_top]:
            print(f"    {stat.size / 2**20:7.1f} MiB {stat.count:8d}  {stat.traceback}")
        tracemalloc.stop()
    results["usage_at_ready"] = usage(caches)
    if args.digest:
        results["entries_digest"] = digest(caches)
        print(f"entries at ready: {results['entries_digest']}")
    phase("refine", lambda: asyncio.run(refine(caches)), results)
    results["usage_priced"] = usage(caches)
    print(f"usage at ready {results['usage_at_ready']}, once priced {results['usage_priced']}")
    gc.collect()
    results["rss_end_mib"] = round(rss_of(os.getpid()))
    results["ledger_claims"] = sum(1 for _ in caches.admitter.ledger.entries())
    print(f"RSS at the end {results['rss_end_mib']} MiB, {results['ledger_claims']} claims counted; "
          f"load average {os.getloadavg()}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("/tmp/startup-local"))
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=150_000)
    parser.add_argument("--namespaces", type=int, default=500)
    parser.add_argument("--teams", type=int, default=20)
    parser.add_argument("--profile", type=Path, default=None, help="cProfile of the claims' list into this file")
    parser.add_argument("--trace", action="store_true", help="tracemalloc over the claims' list")
    parser.add_argument("--trace-top", type=int, default=15)
    parser.add_argument("--digest", action="store_true", help="a digest of every ledger entry at ready (slower)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    marker = args.data / f"generated-{args.nodes}-{args.claims}-{args.namespaces}-{args.teams}"
    if not marker.exists():
        started = time.perf_counter()
        generate(args.data, args)
        marker.touch()
        print(f"generated into {args.data} in {time.perf_counter() - started:.0f} s")
    results = run(args.data, args)
    if args.output is not None:
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
