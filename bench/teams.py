"""Team quotas at scale: admission with 500 namespaces and 20 ClusterDeviceQuotas.

One control plane, one `dra-quota serve` as the chart runs it (bench/admission.py's
`control_plane`, its generated inventory), our webhooks installed, and two sets of 500
namespaces, each namespace with a DeviceQuota that has room:
- `solo`: nothing else (namespaced DeviceQuotas only);
- `team`: each namespace also labelled `team.draquota.io/name=team-<i mod 20>`, and 20
  ClusterDeviceQuotas with room, each selecting its 25 namespaces: every admission there
  persists its reservation on the namespace's DeviceQuota *and* on its team's.

Claims are created through the real API server, open loop (create i due at start + i/rate,
whatever is still in flight, so queueing is never hidden), round-robin over the set's
namespaces, in alternating phases of each set (`--rounds`). Prints, per phase and over all
phases of a set: creates, failures, p50/p99 from each create's due time, and serve's own
p50/p99 of those reviews (its log); then the team/solo ratios of the same run, with the
load average beside them. Writes bench/results/teams.json.

Not a timed test: run `python bench/teams.py [--quick]`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from admission import (  # noqa: E402
    ROOMY, Bench, control_plane, create_many, load_average, on_schedule, one_gpu, our_webhooks, percentile,
)

from tests.e2e.harness import DQ, RUN_LABEL, review_latencies  # noqa: E402
from tests.e2e.kube import ApiError, poll  # noqa: E402

JSON = dict[str, Any]
RESOURCE_V1 = "resource.k8s.io/v1"
TEAM_LABEL = "team.draquota.io/name"
CDQ_PLURAL = "clusterdevicequotas"


async def namespaces(bench: Bench, run: str, prefix: str, count: int, teams: int) -> list[str]:
    """`count` namespaces with a roomy DeviceQuota each; with `teams`, labelled into them."""
    names = [f"{prefix}-{i:03d}" for i in range(count)]

    def labels(i: int) -> dict[str, str]:
        return {RUN_LABEL: run, **({TEAM_LABEL: f"team-{i % teams:02d}"} if teams else {})}

    clients = [bench.cluster.client() for _ in range(4)]
    try:
        made, seconds = await create_many(
            clients, (("v1", "namespaces", {"kind": "Namespace", "metadata": {"name": n, "labels": labels(i)}}, None)
                      for i, n in enumerate(names)), workers=16)
        quotas, quota_seconds = await create_many(
            clients, ((DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                            "spec": {"hard": ROOMY}}, n) for n in names), workers=16)
    finally:
        for client in clients:
            await client.close()
    print(f"  {made} namespaces in {seconds:.1f} s, {quotas} DeviceQuotas in {quota_seconds:.1f} s ({prefix})")
    return names


async def team_quotas(bench: Bench, teams: int) -> list[str]:
    names = [f"team-{k:02d}" for k in range(teams)]
    for name in names:
        await bench.kube.create(DQ, CDQ_PLURAL, {
            "kind": "ClusterDeviceQuota", "metadata": {"name": name},
            "spec": {"namespaceSelector": {"matchLabels": {TEAM_LABEL: name}}, "hard": ROOMY}})
    # serve's leader writes each team's first status once it holds the team and its members.
    for name in names:
        await bench.kube.wait_for(DQ, CDQ_PLURAL, name,
                                  lambda q: (q.get("status") or {}).get("observedGeneration") == 1,
                                  timeout=120, what="the team's first status")
    return names


async def enforcing(bench: Bench, names: Sequence[str]) -> None:
    """Wait until serve denies a claim of 10^8 GPUs in each namespace (a dry run): it
    holds every namespace's quotas."""
    for ns in names:
        async def denied(ns: str = ns) -> bool:
            try:
                await bench.kube.create(RESOURCE_V1, "resourceclaims", {
                    "kind": "ResourceClaim", "metadata": {"name": "probe"}, "spec": one_gpu(count=100_000_000)},
                    namespace=ns, dry_run=True)
            except ApiError as err:
                return "exceeded" in err.message
            return False

        await poll(denied, timeout=120, what=f"serve to enforce the quotas of {ns}")


async def phase(bench: Bench, names: Sequence[str], rate: float, seconds: float, counter: list[int]) -> JSON:
    """Open-loop creates over `names`, round-robin; latencies from each create's due time."""
    loop = asyncio.get_running_loop()
    clients = [bench.cluster.client() for _ in range(8)]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    log_before = len(bench.served.log_text())
    n = int(rate * seconds)
    start = loop.time() + 0.05

    async def one(i: int, due: float) -> None:
        ns = names[i % len(names)]
        counter[0] += 1
        try:
            await clients[i % len(clients)].create(RESOURCE_V1, "resourceclaims", {
                "kind": "ResourceClaim", "metadata": {"name": f"c-{counter[0]:07d}"}, "spec": one_gpu()}, namespace=ns)
            latencies.append((loop.time() - due) * 1000)
        except ApiError as err:
            key = err.message[:300]
            errors[key] = errors.get(key, 0) + 1

    try:
        await on_schedule(n, rate, start, one)
    finally:
        for client in clients:
            await client.close()
    served = review_latencies(bench.served.log_text()[log_before:])
    return {"created": len(latencies), "failed": sum(errors.values()), "errors": errors,
            "latencies": latencies, "served": served, "load_average": load_average()}


def summary(rows: Sequence[JSON]) -> JSON:
    latencies = [x for r in rows for x in r["latencies"]]
    served = [x for r in rows for x in r["served"]]
    return {"created": sum(r["created"] for r in rows), "failed": sum(r["failed"] for r in rows),
            "p50_ms": round(percentile(latencies, 0.5), 1), "p99_ms": round(percentile(latencies, 0.99), 1),
            "serve_reviews": len(served), "serve_p50_ms": round(percentile(served, 0.5), 2),
            "serve_p99_ms": round(percentile(served, 0.99), 2)}


def line(name: str, row: JSON) -> str:
    return (f"{name:<5} {row['created']} created, {row['failed']} failed; create p50 {row['p50_ms']} ms "
            f"p99 {row['p99_ms']} ms; serve's reviews ({row['serve_reviews']}) p50 {row['serve_p50_ms']} ms "
            f"p99 {row['serve_p99_ms']} ms")


async def measure(args: argparse.Namespace) -> JSON:
    with tempfile.TemporaryDirectory(prefix="bench-teams-") as tmp:
        # debug: serve logs every review with its latency (both sets pay for it alike).
        async with control_plane(args, Path(tmp), log_level="debug") as bench:
            gc.collect()
            gc.freeze()  # the generator's own data: serve is what is measured
            async with our_webhooks(bench) as run:
                solo = await namespaces(bench, run, "solo", args.namespaces, 0)
                team = await namespaces(bench, run, "team", args.namespaces, args.teams)
                started = time.monotonic()
                await team_quotas(bench, args.teams)
                await enforcing(bench, [*solo[:5], *team[:args.teams]])
                print(f"  {args.teams} ClusterDeviceQuotas written and enforced in {time.monotonic() - started:.1f} s; "
                      f"load average {load_average()}")
                counter = [0]
                rows: dict[str, list[JSON]] = {"solo": [], "team": []}
                for number in range(args.rounds):
                    for name, names in (("solo", solo), ("team", team)):
                        row = await phase(bench, names, args.rate, args.seconds, counter)
                        rows[name].append(row)
                        print(f"  round {number + 1} " + line(name, summary([row])) + f"; load average "
                              f"{row['load_average']}" + (f"; errors {row['errors']}" if row["errors"] else ""))
                out = {name: summary(r) for name, r in rows.items()}
                for name in out:
                    print("  all   " + line(name, out[name]))
                ratio = out["team"]["p99_ms"] / out["solo"]["p99_ms"]
                serve_ratio = out["team"]["serve_p99_ms"] / out["solo"]["serve_p99_ms"]
                print(f"  team/solo p99: creates {ratio:.2f}x, serve's reviews {serve_ratio:.2f}x; "
                      f"load average {load_average()}")
                quota = await bench.kube.get(DQ, CDQ_PLURAL, "team-00")
                size = len(json.dumps(quota))
                print(f"  team-00 at the end: {len((quota.get('status') or {}).get('namespaces') or [])} namespaces in "
                      f"its breakdown, {size} bytes")
                return {**out, "p99_ratio": round(ratio, 2), "serve_p99_ratio": round(serve_ratio, 2),
                        "team_object_bytes": size, "cluster": bench.results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", type=int, default=500, help="namespaces in each set")
    parser.add_argument("--teams", type=int, default=20, help="ClusterDeviceQuotas over the team set")
    parser.add_argument("--nodes", type=int, default=500, help="inventory size (8 GPUs a node)")
    parser.add_argument("--rate", type=float, default=40.0, help="creates per second offered in a phase")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of a phase")
    parser.add_argument("--rounds", type=int, default=2, help="alternating phases per set")
    parser.add_argument("--reservation-ttl", type=float, default=None, help="serve's --reservation-ttl")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 50 namespaces, 5 teams, 5 s phases")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "teams.json")
    args = parser.parse_args()
    if args.quick:
        args.namespaces, args.teams, args.nodes, args.seconds, args.rounds = 50, 5, 50, 5.0, 1
    print(f"team quotas: {args.namespaces} namespaces a set, {args.teams} teams, {args.nodes} nodes, "
          f"{os.cpu_count()} cores, load average {load_average()}")
    results = {"args": {k: str(v) for k, v in vars(args).items()}, **asyncio.run(measure(args)),
               "load_average_end": load_average()}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results written to {args.output}")


if __name__ == "__main__":
    main()
