"""Idle and slow connections against `dra-quota serve` (issue 15, item 5): its memory, and honest latency.

The control plane (tests/e2e/cluster.py) with a small generated inventory and `serve` at
its defaults (`--max-connections 1000`, 10 s handshake, header and body timeouts, 120 s
idle), started by bench/admission.py's `control_plane`. Then, with honest reviews posted
open-loop (bench/admission.py's write-nothing mix: a free claim, a claim a DeviceQuota
denies, a template, the mutating call; over a pool of kept-alive HTTPS connections, as the
API server posts them) at --rate a second for --seconds:

1. baseline: no attack;
2. attack: a second process (this script with --attack-port) holds --connections
   (10,000) idle and slow connections (tests/e2e/attack.py: TCP only, TLS only, slowloris
   headers, slow POST bodies; each re-opened --reopen s after serve dropped it); once it has
   opened them all, the honest load runs again.

Printed for each: honest p50/p99 (target p99 <= 50 ms) and failures; during the attack
also serve's peak RSS (sampled every 0.2 s), the longest event loop stall the attack
caused (the top bucket draquota_event_loop_stall_seconds gained meanwhile), serve's
connection counts and drops (draquota_connections*), and the load average beside every
number. Not a timed test: `python bench/connections.py [--connections N] [--seconds S]`;
results also in bench/results/connections.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from admission import (  # noqa: E402
    Bench, Load, control_plane, load_average, open_loop, rss_of, show, warm, write_nothing_bodies,
)

from tests.e2e.attack import Attack, attack  # noqa: E402
from tests.e2e.cluster import free_ports  # noqa: E402
from webhook.metrics import CONNECTIONS, CONNECTIONS_DROPPED, EVENT_LOOP_STALL, EVENT_LOOP_STALL_MAX  # noqa: E402

JSON = dict[str, Any]
TARGET_P99_MS = 50.0
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def stall_buckets(samples: Samples) -> dict[float, float]:
    return {float(dict(labels)["le"]): value for (name, labels), value in samples.items()
            if name == f"{EVENT_LOOP_STALL}_bucket"}


def longest_new_stall(before: Samples, after: Samples) -> str:
    """The bucket holding the longest stall observed between two scrapes: "(a, b] s"."""
    old, new = stall_buckets(before), stall_buckets(after)
    bounds = sorted(new)
    gained = [b for b in bounds if new[b] - old.get(b, 0.0) > 0]
    if not gained:
        return "none"
    # Cumulative buckets: the first bound whose count grew as much as +Inf's holds the longest.
    total = new[float("inf")] - old.get(float("inf"), 0.0)
    top = next(b for b in bounds if new[b] - old.get(b, 0.0) >= total)
    lower = max((b for b in bounds if b < top), default=0.0)
    return f"({lower:g}, {top:g}] s"


def connection_counts(samples: Samples) -> JSON:
    open_by_phase = {dict(labels)["phase"]: int(value) for (name, labels), value in samples.items()
                     if name == CONNECTIONS and dict(labels)["listener"] == "webhook"}
    dropped = {dict(labels)["reason"]: int(value) for (name, labels), value in samples.items()
               if name == CONNECTIONS_DROPPED and dict(labels)["listener"] == "webhook" and value}
    return {"open": open_by_phase, "dropped": dropped}


class Attacker:
    """This script as a second process (--attack-port): the attack, reported as JSON lines."""

    def __init__(self, port: int, args: argparse.Namespace) -> None:
        self.port, self.args = port, args
        self.report: JSON = {}
        self.process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--attack-port", str(self.port), "--connections", str(self.args.connections),
            "--reopen", str(self.args.reopen), "--ramp", str(self.args.ramp), stdout=asyncio.subprocess.PIPE)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        async for line in self.process.stdout:
            self.report = json.loads(line)

    async def stop(self) -> JSON:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        await self.process.wait()
        if self._reader is not None:
            await self._reader
        return self.report


async def honest(bench: Bench, bodies: list[tuple[str, bytes]], rate: float, seconds: float, name: str) -> JSON:
    load: Load = await open_loop(bench.http, bench.base, bodies, rate, seconds, bench.serve_pid)
    row = load.row(name)
    row["load_average"] = load_average()
    show(row, TARGET_P99_MS)
    print(f"    load average {row['load_average']}")
    return row


async def run(args: argparse.Namespace) -> JSON:
    results: JSON = {"connections": args.connections, "rate": args.rate, "seconds": args.seconds,
                     "cores": os.cpu_count(), "load_average_start": load_average()}
    with tempfile.TemporaryDirectory(prefix="bench-connections-") as tmp:
        async with control_plane(args, Path(tmp), metrics_port=args.metrics_port) as bench:
            bodies = await write_nothing_bodies(bench)
            await warm(bench, bodies)
            print(f"\nserve RSS {rss_of(bench.serve_pid):.0f} MiB before; load average {load_average()}")
            results["baseline"] = await honest(bench, bodies, args.rate, args.seconds, "honest reviews, no attack")
            before_rss, before = rss_of(bench.serve_pid), await bench.served.metrics()
            attacker = Attacker(bench.served.port, args)
            peak, sampling = before_rss, True

            async def sample() -> None:
                nonlocal peak
                while sampling:
                    peak = max(peak, rss_of(bench.serve_pid))
                    await asyncio.sleep(0.2)  # the sampling period

            sampler = asyncio.create_task(sample())
            await attacker.start()
            started = time.monotonic()
            while sum(attacker.report.get("opened", {}).values()) < args.connections:
                assert attacker.process is not None and attacker.process.returncode is None, "the attacker died"
                await asyncio.sleep(0.5)  # the attacker reports once a second
            print(f"  the attack opened {args.connections} connections in {time.monotonic() - started:.1f} s; "
                  f"load average {load_average()}")
            during = await honest(bench, bodies, args.rate, args.seconds,
                                  f"honest reviews, {args.connections} idle/slow connections")
            after = await bench.served.metrics()
            report = await attacker.stop()
            attack_seconds = time.monotonic() - started
            sampling = False
            await sampler
            results["attack"] = {
                "honest": during, "attack": report, "serve_rss_before_mib": round(before_rss),
                "serve_peak_rss_mib": round(peak), "serve_rss_after_mib": round(rss_of(bench.serve_pid)),
                "longest_stall": longest_new_stall(before, after),
                "longest_stall_since_start_s": after.get((EVENT_LOOP_STALL_MAX, frozenset()), float("nan")),
                "serve_connections": connection_counts(after), "load_average": load_average(),
                "attempts_per_s": round((sum(report.get("opened", {}).values()) + report.get("failed", 0))
                                        / attack_seconds)}
            a = results["attack"]
            print(f"  serve RSS {a['serve_rss_before_mib']} MiB before, peak {a['serve_peak_rss_mib']} MiB during, "
                  f"{a['serve_rss_after_mib']} MiB after; longest event loop stall during the attack "
                  f"{a['longest_stall']}; load average {a['load_average']}")
            print(f"  serve's webhook connections at the end: {a['serve_connections']}")
            print(f"  {Attack(**report).line() if report else 'attack: no report'}; "
                  f"{a['attempts_per_s']} connection attempts a second over {attack_seconds:.0f} s")
    results["load_average_end"] = load_average()
    return results


async def attack_main(args: argparse.Namespace) -> None:
    """The attacking process: hold the connections, print the report as a JSON line each second."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    stop, report = asyncio.Event(), Attack()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    task = asyncio.create_task(attack(args.attack_port, args.connections, stop, ramp=args.ramp, reopen=args.reopen,
                                      report=report))
    while not stop.is_set():
        print(json.dumps(report.__dict__), flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=1)
    await task
    print(json.dumps(report.__dict__), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=10_000, help="idle and slow connections held")
    parser.add_argument("--rate", type=float, default=100.0, help="honest reviews a second")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each honest load step")
    parser.add_argument("--ramp", type=float, default=1000.0, help="connections the attack opens a second")
    parser.add_argument("--reopen", type=float, default=5.0, help="seconds before the attack re-opens a dropped one")
    parser.add_argument("--nodes", type=int, default=50, help="inventory size (8 GPUs a node)")
    parser.add_argument("--attack-port", type=int, help=argparse.SUPPRESS)  # the attacking process
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "connections.json")
    args = parser.parse_args()
    if args.attack_port:
        asyncio.run(attack_main(args))
        return
    args.reservation_ttl = None  # control_plane reads it: serve's default
    args.metrics_port = free_ports(1)[0]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"connections benchmark: {args.connections} idle/slow connections, honest reviews at {args.rate:.0f}/s, "
          f"{os.cpu_count()} cores, load average {load_average()}; open files limit {soft}/{hard}")
    results = asyncio.run(run(args))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nload average at the end {load_average()}; results written to {args.output}")


if __name__ == "__main__":
    main()
