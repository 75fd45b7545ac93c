"""The quota controller's recompute: 5,000 nodes x 8 GPUs, 150,000 claims.

What a leader does, through the code `serve` runs (not a model of it):
- decode: the claims as the API server's list pages carry them (JSON), decoded;
- full recompute: the webhook caches' `ClaimStore.replace` (a relist: every claim priced
  against the inventory, allocated ones charged exactly) into the one ledger, then
  `quota.status.quotastatus.desired_status` for every DeviceQuota, as the controller's full
  pass computes what to write;
- incremental: claim events (`ClaimStore.upsert`: allocations landing on claims seen
  pending, claims deleted and created again) each followed by the affected quota's `desired_status`, as the
  controller's debounced pass does per event at worst; events per second;
- relists where some claims changed (their resourceVersion moved: parsed and priced
  again), with the longest piece of work between two pause points (what one slice of
  `serve`'s event loop holds: the swap has none): up to `quota.accounting.claimsrebuild.MOVED_AT_SWAP`
  quota updates the swap moves the live usage by them, past it every quota is summed again;
- RSS after the claims are held.

Not a timed test: `python bench/controller.py [--nodes N] [--claims N] [--events N] [--changed N ...]`.
The claims are bench/inventory.py's `generate_claims` mix (about 30 % allocated).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inventory import generate_claims, generate_device_classes, generate_slices  # noqa: E402
from pricing import rss_mib, timed  # noqa: E402

from kube.claimstore import ClaimStore  # noqa: E402
from kube.rebuilds import Rebuilds  # noqa: E402
from quota.accounting.claimsrebuild import MOVED_AT_SWAP  # noqa: E402
from quota.accounting.ledger import Ledger  # noqa: E402
from quota.accounting.reservationrecord import parse_record  # noqa: E402
from quota.admission.admitter import Admitter  # noqa: E402
from quota.devices.inventory import Inventory  # noqa: E402
from quota.objects.claims import parse_claim, parse_device_class  # noqa: E402
from quota.pricing.pricer import Pricer  # noqa: E402
from quota.quotas.devicequota import DeviceQuotaStatus, parse_device_quota  # noqa: E402
from quota.status.quotastatus import desired_status  # noqa: E402
from quota.values.model import DeviceClass, DeviceClassName  # noqa: E402
from quota.values.work import pausing  # noqa: E402

NAMESPACES = 50


def quota_object(k: int) -> dict[str, Any]:
    return {"apiVersion": "draquota.io/v1alpha1", "kind": "DeviceQuota",
            "metadata": {"name": "gpus", "namespace": f"team-{k:03d}", "generation": 1},
            "spec": {"hard": {"memory": "100Ti", "devices": 100000}}}


class NoEntries:
    """`quota.accounting.reservations.Caches` for statuses without persisted entries (none here)."""

    def claim_version(self, uid: str) -> int | None:
        return None

    def claim_recorded(self, uid: str) -> int | None:
        return None

    def claim_gone(self, uid: str) -> int | None:
        return None

    def workload_counted(self, uid: str) -> bool:
        return False

    def workload_gone(self, uid: str) -> bool:
        return False


def statuses(ledger: Ledger, objects: list[dict[str, Any]], now: float) -> list[DeviceQuotaStatus]:
    out = []
    for obj in objects:
        quota = parse_device_quota(obj)
        out.append(desired_status(obj, quota, parse_record(obj.get("status")),
                                  usage=ledger.usage(quota.namespace, quota.name), caches=NoEntries(), now=now))
    return out


def caches(nodes: int) -> tuple[list[dict[str, Any]], Inventory, dict[DeviceClassName, DeviceClass], Ledger,
                                list[dict[str, Any]]]:
    """What a serve process holds before its claims: the inventory of `nodes` nodes, the
    classes, and one DeviceQuota per namespace in the ledger (also bench/usage_metrics.py)."""
    slices = generate_slices(nodes)
    inventory = Inventory()
    inventory.replace_all(slices)
    classes = {DeviceClassName(c["metadata"]["name"]): parse_device_class(c) for c in generate_device_classes()}
    ledger = Ledger()
    quotas = [quota_object(k) for k in range(NAMESPACES)]
    for obj in quotas:
        ledger.add_or_update_quota(parse_device_quota(obj))
    return slices, inventory, classes, ledger, quotas


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=150_000)
    parser.add_argument("--events", type=int, default=20_000)
    # One DeviceQuota a namespace here: a changed claim costs the swap two quota updates.
    parser.add_argument("--changed", type=int, nargs="*", default=[MOVED_AT_SWAP // 2, MOVED_AT_SWAP // 2 + 1, 20_000],
                        help="relists with this many claims changed")
    args = parser.parse_args()

    slices, inventory, classes, ledger, quotas = caches(args.nodes)
    generated = generate_claims(args.claims, NAMESPACES, 7, slices)
    for i, claim in enumerate(generated):
        claim["metadata"]["resourceVersion"] = str(1000 + i)  # as the API server lists them
    wire = json.dumps({"kind": "ResourceClaimList", "items": generated}).encode()
    del generated
    gc.collect()
    gc.freeze()  # the inventory, as serve freezes its caches once synced

    before = rss_mib()
    decoded, decode_s = timed(lambda: json.loads(wire)["items"])
    claims: list[dict[str, Any]] = decoded
    store = ClaimStore(Admitter(Pricer(inventory, classes), ledger))
    _, first_s = timed(lambda: store.replace(claims))
    held_rss = rss_mib() - before
    # The recompute a leader does on a resync or a relist, with the claims already held.
    _, replace_s = timed(lambda: store.replace(claims))
    now = time.time()
    written, status_s = timed(lambda: statuses(ledger, quotas, now))
    allocated = sum(s["claims"]["allocated"] for s in written)
    pending = sum(s["claims"]["pending"] for s in written)

    # Incremental: allocations landing (an allocated claim seen first without, then with
    # its allocation), and pending claims deleted and created again.
    events: list[tuple[str, dict[str, Any]]] = []
    for c in claims:
        if len(events) >= args.events:
            break
        if (c.get("status") or {}).get("allocation"):
            events += [("upsert", {k: v for k, v in c.items() if k != "status"}), ("upsert", c)]
        else:
            events += [("delete", c), ("upsert", c)]
    quota_of = {q["metadata"]["namespace"]: q for q in quotas}

    def replay() -> None:
        for op, obj in events:
            store.upsert(obj) if op == "upsert" else store.delete(obj)
            statuses(ledger, [quota_of[obj["metadata"]["namespace"]]], now)

    _, events_s = timed(replay)
    # Every replica also checks each claim it accounts against its allocation record
    # (controllers.annotator: Annotator.seen); measured alone, over every claim.
    parsed = [parse_claim(c) for c in claims if (c.get("status") or {}).get("allocation")]
    pricer = Pricer(inventory, classes)
    _, record_s = timed(lambda: [pricer.allocation_record(c) for c in parsed])
    print(f"{args.nodes} nodes, {len(inventory.usable())} devices; {len(claims)} claims "
          f"({allocated} allocated, {pending} pending as counted), {NAMESPACES} DeviceQuotas")
    print(f"decode the list JSON ({len(wire) / 1e6:.0f} MB): {decode_s:.2f} s")
    print(f"first accounting (a cold relist into the ledger): {first_s:.2f} s; RSS +{held_rss:.0f} MiB")
    print(f"full recompute with the claims held: relist {replace_s:.2f} s + {NAMESPACES} statuses "
          f"{status_s * 1000:.1f} ms = {replace_s + status_s:.2f} s (target <= 2 s)")
    print(f"incremental: {len(events)} claim events, each with its quota's status, in {events_s:.2f} s: "
          f"{len(events) / events_s:,.0f} events/s")
    print(f"allocation record check (what each allocated claim's draquota.io/allocated-charge should say): "
          f"{len(parsed)} claims in {record_s:.2f} s, {record_s / max(len(parsed), 1) * 1e6:.1f} us each")
    for changed in args.changed:
        claims = [changed_copy(c, k) if k < changed else c for k, c in enumerate(claims)]
        seconds, piece = relist_in_pieces(store, claims)
        print(f"relist with {changed} claims changed: {seconds:.2f} s, longest piece between two pause points "
              f"{piece * 1000:.1f} ms (the swap moves the usage for up to {MOVED_AT_SWAP} quota updates)")


def changed_copy(claim: dict[str, Any], k: int) -> dict[str, Any]:
    """`claim` as a relist after it changed brings it: a new resourceVersion."""
    return {**claim, "metadata": {**claim["metadata"], "resourceVersion": f"{claim['metadata']['resourceVersion']}{k % 10}"}}


def relist_in_pieces(store: ClaimStore, claims: list[dict[str, Any]]) -> tuple[float, float]:
    """`store.replace(claims)` and the longest stretch between two of its pause points, with
    full collections off meanwhile and what is alive frozen after, as `serve` relists
    (`kube.rebuilds.Rebuilds.rebuilding`)."""
    last = longest = 0.0

    def pause() -> None:
        nonlocal last, longest
        now = time.perf_counter()
        longest, last = max(longest, now - last), now

    start = last = time.perf_counter()
    with Rebuilds().rebuilding(), pausing(pause):
        store.replace(claims)
        pause()
    return time.perf_counter() - start, longest


if __name__ == "__main__":
    main()
