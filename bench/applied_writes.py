"""What a tenant's claims cost in AppliedClusterDeviceQuota writes, for a team of 500 namespaces.

    python bench/applied_writes.py                  # 500 members, 10 simulated minutes
    python bench/applied_writes.py --members 2000

In-process, on a simulated clock: `controllers.applied.AppliedQuotas` against a fake API
server that counts its applies and deletes. One tenant makes a claim event in one member
namespace every `--every` seconds (a create or a delete, its namespace's reserved moving by
80Gi and back, never reaching the team's hard) for `--minutes`, then the clock runs two
refresh periods more so that every copy converges. The rounds are scheduled as `run` does
(a team at most every 2 s, all rounds at most 50 writes a second on average), with no
network time.

Before and after, one scheduler: "before" is the old rule, every copy whose totals differ
written at each round (a refresh period of 0, all in one batch); "after" is the default
60 s, 100 refreshes a round. Prints, for
each: the copy writes by reason, writes per claim event (and of them, the claim's own
namespace's), the writes per second over the run, and the ratio. After, the events cost
their own copy's write (at most one per event); the other members' refresh costs at most
one write per member per period whatever the events, so its share per event falls as the
tenant goes faster (with one event a minute it is the old cost, M per event).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controllers.applied import AppliedQuotas  # noqa: E402

NAME = "big-team"
STEP = 0.1  # seconds of simulated time per tick of the scheduler


class CountingApi:
    def __init__(self) -> None:
        self.applies = 0
        self.deletes = 0

    async def list(self, resource: Any, **kwargs: Any) -> Any:
        return type("Listing", (), {"items": []})()

    async def patch(self, resource: Any, name: str, body: Any, **kwargs: Any) -> Any:
        self.applies += 1
        return body

    async def delete(self, resource: Any, name: str, **kwargs: Any) -> Any:
        self.deletes += 1
        return {}


def team(members: int, first_gi: int) -> dict[str, Any]:
    """A ClusterDeviceQuota as the quota controller publishes it: `members` namespaces, the
    first holding `first_gi` Gi reserved, each of the others 1Gi."""
    parts = [{"namespace": f"ns-{i:04d}", "used": {"memory": "0", "devices": 0},
              "reserved": {"memory": f"{first_gi if i == 0 else 1}Gi", "devices": 0},
              "claims": {"allocated": 0, "pending": 1}} for i in range(members)]
    return {"apiVersion": "draquota.io/v1alpha1", "kind": "ClusterDeviceQuota",
            "metadata": {"name": NAME, "uid": "u1", "generation": 1},
            "spec": {"namespaceSelector": {"matchLabels": {"team.draquota.io/name": NAME}},
                     "hard": {"memory": "100Ti"}},
            "status": {"observedGeneration": 1, "used": {"memory": "0", "devices": 0},
                       "reserved": {"memory": f"{first_gi + members - 1}Gi", "devices": 0},
                       "claims": {"allocated": 0, "pending": members}, "namespaces": parts}}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def simulate(members: int, refresh: float, every: float, minutes: float) -> dict[str, Any]:
    api, clock = CountingApi(), Clock()
    # Before: every stale copy at each round, in one batch, as the old rule wrote them.
    applied = AppliedQuotas(api, leading=lambda: True, refresh=refresh, clock=clock,  # type: ignore[arg-type]
                            batch=None if refresh else members)
    semaphore = asyncio.Semaphore(applied.concurrency)
    applied.published(NAME, team(members, 0))
    end_events, end = minutes * 60, minutes * 60 + 2 * 60.0 + 2 * members / applied.rate
    events, next_event, first_gi = 0, every, 0
    steady: list[int] = []  # writes once every copy exists: what the events cost
    budget = 0.0
    while clock.now < end:
        if clock.now >= next_event and clock.now < end_events:
            first_gi = 80 if first_gi == 0 else 0
            applied.published(NAME, team(members, first_gi))
            events += 1
            next_event += every
        # As AppliedQuotas.run: a team is ready when published or stale, and not before its
        # interval; rounds wait for the rate budget.
        due = max(applied._due.get(NAME, 0.0), 0.0 if NAME in applied._pending else applied._stale.get(NAME, end))
        if due <= clock.now and budget <= clock.now:
            written = await applied._round(NAME, semaphore)
            applied._due[NAME] = clock.now + applied.interval
            budget = max(budget, clock.now) + written / applied.rate
            if not steady:
                steady.append(sum(applied.writes.values()))
        clock.now = round(clock.now + STEP, 6)
    setup = steady[0] if steady else 0
    total = sum(applied.writes.values()) - setup
    return {"refresh": refresh, "events": events, "writes": total,
            "by_reason": {reason: n - (setup if reason == "spec" else 0) for reason, n in applied.writes.items()},
            "per_event": total / max(events, 1), "per_second": total / (end - 0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=500)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between two claim events (default 2)")
    parser.add_argument("--minutes", type=float, default=10.0, help="of claim events (default 10)")
    args = parser.parse_args()
    results = [asyncio.run(simulate(args.members, refresh, args.every, args.minutes)) for refresh in (0.0, 60.0)]
    print(f"team of {args.members} namespaces, one claim event every {args.every:g} s for {args.minutes:g} min "
          f"(+ convergence)")
    for label, r in zip(("before (totals with every event)", "after (refresh 60 s)"), results):
        reasons = r["by_reason"]
        print(f"  {label:34} {r['events']} events  {r['writes']:6d} writes  {r['per_event']:6.1f} per event "
              f"(own {reasons.get('own', 0) / max(r['events'], 1):.2f})  {r['per_second']:5.1f}/s overall  "
              f"{dict(sorted(reasons.items()))}")
    before, after = results
    print(f"  ratio before/after, writes per event: {before['per_event'] / max(after['per_event'], 1e-9):.1f}")

if __name__ == "__main__":
    main()
