"""What a flood of denials costs in Events, and whether another tenant's are still recorded.

    python bench/events.py                  # 300 quota denials + 300 adminAccess refusals
    python bench/events.py --flood 1500 --rate 200

The control plane and `serve` as bench/admission.py's `control_plane` runs them. One
tenant's reviews go straight to serve's port as the API server sends them (real, not
dryRun: dryRun makes no Event), open-loop at --rate a second: claims its DeviceQuota
denies (`ev-flood-quota`, 1Gi) and adminAccess claims the allowlist refuses
(`ev-flood-free`, no quota). Five times during the flood another tenant (`ev-other`) has a
claim denied. Printed: the tenant's requests, the Events written (creates and patches,
`draquota_events_written_total`) and dropped (`draquota_events_dropped_total`) per
request, the Events in each namespace and the occurrences they count once settled, the
Events in `default`, and the fraction of the other tenant's denials whose Event was
written within --settle seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from admission import ADMIT, HEADERS, TIGHT, Bench, claim, control_plane, device_quota, enforced, namespace, \
    one_gpu, review  # noqa: E402

from runtime.metricnames import EVENTS_DROPPED, EVENTS_WRITTEN  # noqa: E402

JSON = dict[str, Any]
QUOTA_NS, FREE_NS, OTHER_NS = "ev-flood-quota", "ev-flood-free", "ev-other"
OURS = "draquota.io/dra-quota"
OTHERS = 5


def admin_claim(ns: str, name: str) -> JSON:
    body = claim(one_gpu(), ns, name)
    body["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    return body


async def post(bench: Bench, body: JSON, ns: str) -> bool:
    """One review as the API server sends it; whether it was denied."""
    data = json.dumps(review(body, namespace=ns)).encode()
    async with bench.http.post(bench.base + ADMIT, data=data, headers=HEADERS) as resp:
        answer = await resp.json()
    return not answer["response"]["allowed"]


async def ours(bench: Bench, ns: str) -> list[JSON]:
    return [e for e in await bench.kube.list("events.k8s.io/v1", "events", namespace=ns)
            if e.get("reportingController") == OURS]


def counted(events: list[JSON]) -> int:
    return sum(int((e.get("series") or {}).get("count", 1)) for e in events)


def total(samples: dict[Any, float], name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


async def flood(bench: Bench, args: argparse.Namespace) -> JSON:
    for ns, hard in ((QUOTA_NS, TIGHT), (FREE_NS, None), (OTHER_NS, TIGHT)):
        await namespace(bench.kube, ns)
        if hard is not None:
            await device_quota(bench.kube, ns, hard)
            await enforced(bench, ns)
    before = await bench.served.metrics()
    bodies = [(claim(one_gpu(), QUOTA_NS, f"q{i}"), QUOTA_NS) if i % 2 == 0 else
              (admin_claim(FREE_NS, f"a{i}"), FREE_NS) for i in range(2 * args.flood)]
    others = {len(bodies) * (k + 1) // (OTHERS + 1): f"other-{k}" for k in range(OTHERS)}
    sent_at: dict[str, float] = {}
    tasks = []
    started = time.monotonic()
    for i, (body, ns) in enumerate(bodies):
        delay = started + i / args.rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # the open loop's pacing
        tasks.append(asyncio.ensure_future(post(bench, body, ns)))
        if i in others:
            sent_at[others[i]] = time.monotonic()
            tasks.append(asyncio.ensure_future(post(bench, claim(one_gpu(), OTHER_NS, others[i]), OTHER_NS)))
    denied = sum(await asyncio.gather(*tasks))  # the other tenant's included
    seconds = time.monotonic() - started
    recorded: dict[str, float] = {}
    deadline = time.monotonic() + args.settle
    while time.monotonic() < deadline:
        notes = [e["note"] for e in await ours(bench, OTHER_NS)]
        for name in sent_at:
            if name not in recorded and any(n.startswith(f"ResourceClaim {OTHER_NS}/{name}: ") for n in notes):
                recorded[name] = time.monotonic() - sent_at[name]
        settled = {ns: counted(await ours(bench, ns)) for ns in (QUOTA_NS, FREE_NS)}
        if len(recorded) == OTHERS and settled == {QUOTA_NS: args.flood, FREE_NS: args.flood}:
            break
        await asyncio.sleep(1.0)  # a poll's pacing
    after = await bench.served.metrics()
    requests = 2 * args.flood
    written = total(after, EVENTS_WRITTEN) - total(before, EVENTS_WRITTEN)
    dropped = total(after, EVENTS_DROPPED) - total(before, EVENTS_DROPPED)
    events = {ns: await ours(bench, ns) for ns in (QUOTA_NS, FREE_NS, OTHER_NS, "default")}
    return {
        "requests": requests, "denied": denied, "rate_per_s": round(requests / seconds),
        "events_written": written, "events_dropped": dropped,
        "written_per_request": round(written / requests, 3), "dropped_per_request": round(dropped / requests, 3),
        "events": {ns: len(found) for ns, found in events.items()},
        "occurrences_counted": {ns: counted(found) for ns, found in events.items()},
        "other_recorded_fraction": len(recorded) / OTHERS,
        "other_recorded_after_s": sorted(round(v, 1) for v in recorded.values()),
    }


async def run(args: argparse.Namespace) -> JSON:
    with tempfile.TemporaryDirectory(prefix="bench-events-") as tmp:
        async with control_plane(args, Path(tmp), metrics_port=args.metrics_port) as bench:
            return await flood(bench, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=300, help="denials of each kind (quota, adminAccess)")
    parser.add_argument("--rate", type=float, default=200.0, help="the tenant's reviews a second")
    parser.add_argument("--settle", type=float, default=60.0, help="seconds to wait for the Events after the flood")
    parser.add_argument("--nodes", type=int, default=2, help="inventory size (8 GPUs a node)")
    parser.add_argument("--metrics-port", type=int, default=0)
    args = parser.parse_args()
    args.reservation_ttl = None  # control_plane reads it: serve's default
    if not args.metrics_port:
        from tests.e2e.cluster import free_ports
        args.metrics_port = free_ports(1)[0]
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
