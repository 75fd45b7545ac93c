"""Each attack of a hostile tenant a review can carry, apart: an honest review's p99 during it, the longest event loop stall, serve's peak RSS.

    python bench/attacks.py                 # every attack, 10 s of honest load each
    python bench/attacks.py --only cel      # one

The control plane with a small inventory and `serve` at its defaults (bench/admission.py's
`control_plane`). Honest reviews go open-loop at --rate a second for --seconds over a
pool of kept-alive connections (bench/connections.py's `honest`: the write-nothing mix,
and a new connection timed every 100 ms), first without an attack, then during each of:

- padded: claims with a 200 KB annotation, --workers back to back (bodies large to read and parse);
- slow: whole reviews sent chunked in 50 pieces 20 ms apart (a second each);
- oversized: 9 MiB reviews (refused with 413 after their first KiB);
- cel: claims of 32 requests x 8 subrequests, each selector salted (nothing cached helps;
  denied by the per-claim budget), --workers in flight;
- pods: dryRun Pods of 1,024 containers each asking 4 DeviceClasses' extended resources
  (allowed with a warning; read in slices, `webhook.pods`), --workers in flight;
- denials: dryRun claims of 32 x 8 subrequests naming missing DeviceClasses (each denied
  with ~90,000 characters), --workers in flight: what each costs serve's log.

Each attack's row also has serve's log bytes per attacking review (serve logs at info,
its default: denials, cut and sampled per namespace, `runtime.logbounds`) and the
longest stall of the loop's own CPU since serve started (`..._stall_cpu_max_seconds`).

The attack runs in a process of its own at --nice (19), as bench/connections.py's does,
posting straight to serve's port as the API server posts; its answers are counted by
HTTP status and review code. Idle and slow connections are
bench/connections.py's; stored claims bench/stored_claims.py's; Workload counts are
arithmetic (tests/unit/quota/accounting/test_workloads.py). The honest generator's own lateness is
printed beside its latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import ssl
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from admission import (  # noqa: E402
    GPU_CLASS, HEADERS, TIGHT, Bench, claim, control_plane, load_average, one_gpu, review, rss_of, warm,
    write_nothing_bodies,
)
from connections import Breakdown, honest, peak_rss, save, stalls_between  # noqa: E402

from runtime.metricnames import EVENT_LOOP_STALL_CPU_MAX  # noqa: E402
from tests.e2e.cluster import free_ports  # noqa: E402
from tests.e2e.tenants import expensive  # noqa: E402

JSON = dict[str, Any]
TIGHT_NS = "bench-tight"  # write_nothing_bodies' namespace whose DeviceQuota denies every claim
PAD = 200 * 1024
OVERSIZED = 9 * 2**20  # serve's limit is 8 MiB


def padded(_: int) -> bytes:
    body = claim(one_gpu(), TIGHT_NS)
    body["metadata"]["annotations"] = {"example.com/padding": "x" * PAD}
    return json.dumps(review(body, namespace=TIGHT_NS)).encode()


def oversized(_: int) -> bytes:
    body = claim(one_gpu(), TIGHT_NS)
    body["metadata"]["annotations"] = {"example.com/padding": "x" * OVERSIZED}
    return json.dumps(review(body, namespace=TIGHT_NS)).encode()


def salted(salt: int) -> bytes:
    body: JSON = {**expensive(GPU_CLASS, salt), "metadata": {
        "name": f"hostile-{salt}", "namespace": TIGHT_NS, "uid": f"00000000-0000-0000-0000-{salt:012d}"}}
    return json.dumps(review({"apiVersion": "resource.k8s.io/v1", **body}, namespace=TIGHT_NS, dry_run=True)).encode()


POD_GVR = {"group": "", "version": "v1", "resource": "pods"}
POD_CLASSES = [GPU_CLASS, "mig.nvidia.com", "shared.gpu.nvidia.com", "gpu.amd.com"]  # their implicit resource names
CONTAINERS = 1024


def huge_pod(n: int) -> bytes:
    asks = {f"deviceclass.resource.kubernetes.io/{c}": "1" for c in POD_CLASSES}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"huge-{n}", "namespace": TIGHT_NS},
            "spec": {"containers": [{"name": f"c{i}", "image": "pause", "resources": {"limits": asks, "requests": asks}}
                                    for i in range(CONTAINERS)]}}
    return json.dumps(review(body, gvr=POD_GVR, namespace=TIGHT_NS, dry_run=True)).encode()


def missing_classes(n: int) -> bytes:
    name = f"missing-{n}-" + "x" * 180
    body = claim({"devices": {"requests": [
        {"name": f"r{r}", "firstAvailable": [{"name": f"s{s}", "deviceClassName": f"{name}-{r}-{s}"} for s in range(8)]}
        for r in range(32)]}}, TIGHT_NS)
    return json.dumps(review(body, namespace=TIGHT_NS, dry_run=True)).encode()


async def pieces(body: bytes, count: int = 50, pause: float = 0.02) -> AsyncIterator[bytes]:
    size = -(-len(body) // count)
    for start in range(0, len(body), size):
        yield body[start:start + size]
        await asyncio.sleep(pause)  # a slow client: the point of this attack


def plain(_: int) -> bytes:
    return json.dumps(review(claim(one_gpu(), TIGHT_NS), namespace=TIGHT_NS)).encode()


# name: (the body of a worker's n-th review, whether it changes with n, whether it is sent
# slowly). A body that need not change is encoded once: encoding 9 MiB each time would
# make this process, which also sends the honest load, the bottleneck.
ATTACKS: dict[str, tuple[Callable[[int], bytes], bool, bool]] = {
    "padded": (padded, False, False),
    "slow": (plain, False, True),
    "oversized": (oversized, False, False),
    "cel": (salted, True, False),  # a new salt each time: no cache helps
    "pods": (huge_pod, False, False),
    "denials": (missing_classes, True, False),
}


def verdict(answer: JSON) -> str:
    """What a review's answer says, in a word: allowed, or denied with its code and why."""
    if answer.get("allowed"):
        return "allowed"
    status = answer.get("status") or {}
    message = status.get("message") or ""
    why = next((word for key, word in (("budget", "budget"), ("exceeded DeviceQuota", "quota"),
                                       ("larger than", "size"), ("within the webhook timeout", "timeout"),
                                       ("busy", "busy"), ("not found", "missing class")) if key in message), "other")
    return f"denied {status.get('code')} ({why})"


async def attacker(http: aiohttp.ClientSession, url: str, name: str, worker: int, stop: asyncio.Event,
                   answers: Counter[str]) -> None:
    make, varies, slow = ATTACKS[name]
    n, body = 0, make(worker * 100_000)
    while not stop.is_set():
        if varies:
            body = make(worker * 100_000 + n)
        n += 1
        try:
            async with http.post(url, data=pieces(body) if slow else body, headers=HEADERS) as resp:
                answer = (await resp.json()).get("response") or {} if resp.status == 200 else {}
                answers[f"HTTP {resp.status}, {verdict(answer)}"] += 1
        except (aiohttp.ClientError, OSError) as err:
            answers[f"connection {type(err).__name__}"] += 1


def client(ca_file: Path, limit: int) -> aiohttp.ClientSession:
    context = ssl.create_default_context(cafile=str(ca_file))
    context.check_hostname = False  # the certificate names the Service, we dial 127.0.0.1
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=limit),
                                 timeout=aiohttp.ClientTimeout(total=60))


async def attack_main(args: argparse.Namespace) -> None:
    """The attacking process: --workers reviews of --attack in flight until SIGTERM; then
    its answers, counted, to --output."""
    os.nice(args.nice)
    stop, answers = asyncio.Event(), Counter[str]()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    args.output.write_text("{}")  # ready: the parent starts its clock now (imports take seconds)
    async with client(args.ca, args.workers) as http:
        await asyncio.gather(*(attacker(http, f"https://127.0.0.1:{args.attack_port}/validate", args.attack, w, stop,
                                        answers) for w in range(args.workers)))
    args.output.write_text(json.dumps(answers))


async def one_attack(bench: Bench, args: argparse.Namespace, name: str, bodies: list[tuple[str, bytes]],
                     workdir: Path, breakdown: Breakdown) -> JSON:
    """The attack in a process of its own (at --nice, as bench/connections.py's: on this
    2-core machine its CPU would otherwise be taken from serve and from the honest load,
    where a real attacker's runs on other hosts), the honest load beside it."""
    report = workdir / f"{name}.json"
    before_rss, before = rss_of(bench.serve_pid), await bench.served.metrics()
    log_before = bench.served.log.stat().st_size
    async with peak_rss(bench.serve_pid) as peak:
        process = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--attack-port", str(bench.served.port), "--attack", name, "--workers",
            str(args.workers), "--nice", str(args.nice), "--ca", str(bench.cluster.ca_file), "--output", str(report))
        while not report.exists():  # the attacker's imports done, its SIGTERM handler installed
            assert process.returncode is None, "the attacker died"
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)  # the attack under way before the honest load starts
        row = await honest(bench, bodies, args.rate, args.seconds, f"honest reviews, attack: {name}", breakdown)
        after = await bench.served.metrics()
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=120)
    answers = json.loads(report.read_text()) if report.exists() else {}
    logged = bench.served.log.stat().st_size - log_before
    cpu_max = next((v for (sample, _), v in after.items() if sample == EVENT_LOOP_STALL_CPU_MAX), float("nan"))
    row.update({"stalls": stalls_between(before, after), "serve_rss_before_mib": round(before_rss),
                "serve_peak_rss_mib": round(peak[0]), "attack_answers": answers,
                "log_bytes_per_attack_review": round(logged / max(sum(answers.values()), 1)),
                "stall_cpu_max_s": cpu_max})
    print(f"    event loop stalls: {row['stalls']}; the loop's longest CPU stall since start {cpu_max:.3f} s; serve RSS "
          f"{row['serve_rss_before_mib']} -> peak {row['serve_peak_rss_mib']} MiB; log {logged:,} bytes, "
          f"{row['log_bytes_per_attack_review']:,} an attacking review; the attack's answers {answers}")
    return row


async def run(args: argparse.Namespace) -> JSON:
    results: JSON = {"rate": args.rate, "seconds": args.seconds, "workers": args.workers, "cores": os.cpu_count(),
                     "load_average_start": load_average()}
    with tempfile.TemporaryDirectory(prefix="bench-attacks-") as tmp:
        breakdown = Breakdown()
        async with control_plane(args, Path(tmp), metrics_port=args.metrics_port,
                                 trace=[breakdown.config()]) as bench:
            bodies = await write_nothing_bodies(bench)
            await warm(bench, bodies)
            quiet = await bench.served.metrics()
            results["none"] = await honest(bench, bodies, args.rate, args.seconds, "honest reviews, no attack",
                                           breakdown)
            results["none"]["stalls"] = stalls_between(quiet, await bench.served.metrics())
            print(f"    event loop stalls: {results['none']['stalls']}; serve RSS {rss_of(bench.serve_pid):.0f} MiB")
            for name in args.only or ATTACKS:
                results[name] = await one_attack(bench, args, name, bodies, Path(tmp), breakdown)
    results["load_average_end"] = load_average()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(ATTACKS), help="this attack only (repeatable)")
    parser.add_argument("--rate", type=float, default=100.0, help="honest reviews a second")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each honest load step")
    parser.add_argument("--workers", type=int, default=4, help="attacking reviews in flight")
    parser.add_argument("--nodes", type=int, default=50, help="inventory size (8 GPUs a node)")
    parser.add_argument("--nice", type=int, default=19, help="the attacking process's niceness (0: as serve)")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "attacks.json")
    parser.add_argument("--attack-port", type=int, help=argparse.SUPPRESS)  # the attacking process: its target,
    parser.add_argument("--attack", choices=sorted(ATTACKS), help=argparse.SUPPRESS)  # its attack
    parser.add_argument("--ca", type=Path, help=argparse.SUPPRESS)  # and the CA serve's certificate is from
    args = parser.parse_args()
    if args.attack_port:
        asyncio.run(attack_main(args))
        return
    args.reservation_ttl = None  # control_plane reads it: serve's default
    args.metrics_port = free_ports(1)[0]
    print(f"attacks benchmark: honest reviews at {args.rate:.0f}/s, {args.workers} attacking reviews in flight, "
          f"{os.cpu_count()} cores, load average {load_average()}")
    save(asyncio.run(run(args)), args.output)


if __name__ == "__main__":
    main()
