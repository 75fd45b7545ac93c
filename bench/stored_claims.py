"""Stored expensive claims and a fresh replica's readiness.

A replica becomes ready once its claim cache has listed and accounted every stored
claim (`kube.claimstore.ClaimStore.replace`). Pricing each one there let ten expensive
claims push readiness from 0.11 s to 16.4 s. This builds the caches' domain objects over
a generated inventory, lists N stored claims that each read every device with a loop
(salted: nothing cached helps), and prints:
- time to account them as `serve` now does (at their upper bound; `controllers.refine`
  prices them after ready), and as before (each priced inside the list: measured on a
  sample, extrapolated to N);
- how long the background pricing takes (through the real Slicer), and whether the
  ledger then holds exactly what pricing every claim says (it must).

    python bench/stored_claims.py [--nodes 1000] [--claims 1000]

Not a timed test. Prints the load average beside the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inventory import generate_device_classes, generate_slices  # noqa: E402

from controllers.refine import Refiner  # noqa: E402
from kube.claimstore import ClaimStore  # noqa: E402
from quota.accounting.ledger import Ledger  # noqa: E402
from quota.admission.admitter import Admitter  # noqa: E402
from quota.devices.inventory import Inventory  # noqa: E402
from quota.objects.claims import parse_claim, parse_device_class  # noqa: E402
from quota.pricing.pricer import Pricer  # noqa: E402
from quota.quotas.devicequota import parse_device_quota  # noqa: E402
from quota.values.model import ZERO, DeviceClassName, Namespace  # noqa: E402
from runtime.slicing import Slicer  # noqa: E402

D = "gpu.nvidia.com"
NS = "team-a"
JSON = dict[str, Any]


def stored_claim(i: int) -> JSON:
    """Two requests, each read per device (the whole attribute map) with a loop, taking
    the 40 GB A100s only (the class's largest GPU is a 141 GB H200: the upper bound is
    well above the price): about 50,000 CEL units a claim over 1,000 nodes."""
    selector = (f"size(device.attributes['{D}']) > 0 && lists.range(2).all(x, x + {i} >= 0) && "
                f"device.attributes['{D}'].productName == 'NVIDIA A100-SXM4-40GB'")
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"stored-{i}", "namespace": NS, "uid": f"uid-{i}", "resourceVersion": "1"},
            "spec": {"devices": {"requests": [
                {"name": f"r{r}", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                               "selectors": [{"cel": {"expression": f"{selector} && {r} >= 0"}}]}}
                for r in range(2)]}}}


def world(nodes: int) -> Admitter:
    inventory = Inventory()
    inventory.replace_all(generate_slices(nodes, 8))
    classes = {DeviceClassName(c["metadata"]["name"]): parse_device_class(c) for c in generate_device_classes()}
    admitter = Admitter(Pricer(inventory, classes), Ledger())
    admitter.ledger.add_or_update_quota(parse_device_quota({
        "apiVersion": "draquota.io/v1alpha1", "kind": "DeviceQuota", "metadata": {"name": "gpus", "namespace": NS},
        "spec": {"hard": {"memory": "100000Ti"}}}))
    gc.collect()
    gc.freeze()
    return admitter


async def refine_all(refiner: Refiner, count: int) -> float:
    started = time.perf_counter()
    ready = asyncio.Event()
    ready.set()
    task = asyncio.create_task(refiner.run(ready.wait))
    while refiner.refined < count:
        await asyncio.sleep(0.05)
    task.cancel()
    return time.perf_counter() - started


def load() -> str:
    return f"load average {os.getloadavg()[0]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--sample", type=int, default=50, help="claims priced the old way, to extrapolate from")
    args = parser.parse_args()
    objects = [stored_claim(i) for i in range(args.claims)]

    admitter = world(args.nodes)
    refiner = Refiner(admitter, Slicer(), changed=lambda namespace: None)
    store = ClaimStore(admitter, provisional=refiner.add)
    started = time.perf_counter()
    store.replace(objects)
    ready_s = time.perf_counter() - started
    bound = admitter.ledger.usage(Namespace(NS), "gpus").reserved
    print(f"{args.claims} stored claims over {args.nodes * 8} GPUs: accounted (ready) in {ready_s:.3f} s at their "
          f"upper bound ({bound.memory / 2**30:.0f} GiB reserved)  ({load()})")
    refine_s = asyncio.run(refine_all(refiner, refiner.pending))
    refined = admitter.ledger.usage(Namespace(NS), "gpus").reserved

    old = world(args.nodes)  # fresh caches: the old path priced every claim cold
    started = time.perf_counter()
    ClaimStore(old).replace(objects[: args.sample])
    per_claim = (time.perf_counter() - started) / args.sample
    # What pricing each claim says (cached by now: the background pricing did the work).
    exact = sum((admitter.existing_entry(parse_claim(o)).pricing["conservative"].total for o in objects), ZERO)
    print(f"priced in the background in {refine_s:.1f} s ({refiner.refined} claims); ledger then "
          f"{refined.memory / 2**30:.0f} GiB, pricing each claim says {exact.memory / 2**30:.0f} GiB: "
          f"{'exact' if refined == exact else 'MISMATCH'}  ({load()})")
    print(f"before (each priced inside the list): {per_claim * 1000:.1f} ms a claim on {args.sample} claims, "
          f"{per_claim * args.claims:.1f} s for {args.claims}  ({load()})")
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "stored_claims.json").write_text(json.dumps({
        "nodes": args.nodes, "claims": args.claims, "ready_s": round(ready_s, 3), "refine_s": round(refine_s, 2),
        "exact": refined == exact, "before_per_claim_ms": round(per_claim * 1000, 2),
        "before_ready_s_extrapolated": round(per_claim * args.claims, 1), "load_average": os.getloadavg()[0]},
        indent=2))


if __name__ == "__main__":
    main()
