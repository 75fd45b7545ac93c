"""Scrape cost of the usage metrics: 5,000 nodes x 8 GPUs, 150,000 claims in the caches.

The claims (bench/inventory.py `generate_claims`, about 30 % allocated, each allocated
one reserved for a pod) go through the webhook's own `ClaimStore` into the ledger and
the holders, as a serve process's first list would; one DeviceQuota per namespace.
Then one scrape (`Metrics.exposition`, what `GET /metrics` serves) is timed cold, again
with nothing changed (the per-model and per-device families are cached on the
inventory generation and the holders' version), and after one claim changed. Then team
quotas: `--team-namespaces` more Namespaces and `--teams` ClusterDeviceQuotas,
first each selecting its share of them (a label per team), then each selecting every
namespace (`{}`: the worst case, teams x namespaces members); each scrape is timed with
the rest unchanged, so the difference is the team families' cost.

Not a timed test: run `python bench/usage_metrics.py [--nodes N] [--claims N]`.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inventory import generate_claims  # noqa: E402
from controller import NAMESPACES, caches  # noqa: E402
from pricing import rss_mib, timed  # noqa: E402

from kube.claimstore import ClaimStore  # noqa: E402
from quota.accounting.ledger import Ledger  # noqa: E402
from quota.accounting.usage import Holders  # noqa: E402
from quota.admission.admitter import Admitter  # noqa: E402
from quota.pricing.pricer import Pricer  # noqa: E402
from quota.quotas.devicequota import parse_cluster_device_quota  # noqa: E402
from quota.values.model import Namespace  # noqa: E402
from runtime.metricnames import CLAIM_DEVICE_INFO, CLUSTER_QUOTA_NAMESPACE  # noqa: E402
from webhook.metrics import Metrics  # noqa: E402
from webhook.usagemetrics import UsageMetrics  # noqa: E402

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=150_000)
    parser.add_argument("--teams", type=int, default=20)
    parser.add_argument("--team-namespaces", type=int, default=500)
    args = parser.parse_args()

    slices, inventory, classes, ledger, _ = caches(args.nodes)
    claims = generate_claims(args.claims, NAMESPACES, 7, slices)
    for i, claim in enumerate(claims):
        status = claim.get("status")
        if status and status.get("allocation"):
            status["reservedFor"] = [{"resource": "pods", "name": f"pod-{i}", "uid": f"pod-uid-{i}"}]
    holders = Holders()
    store = ClaimStore(Admitter(Pricer(inventory, classes), ledger), holders=holders)
    before = rss_mib()
    _, load_s = timed(lambda: store.replace(claims))
    gc.collect()
    gc.freeze()  # as a long-running server's caches: later collections skip them
    metrics = Metrics()
    UsageMetrics(ledger, inventory, holders).register(metrics)

    cold, cold_s = timed(metrics.exposition)
    _, warm_s = timed(metrics.exposition)
    changed = next(c for c in claims if (c.get("status") or {}).get("allocation"))
    changed["status"]["reservedFor"] = [{"resource": "pods", "name": "moved", "uid": "moved"}]
    store.upsert(changed)
    _, changed_s = timed(metrics.exposition)
    series = sum(1 for line in cold.splitlines() if line.startswith(CLAIM_DEVICE_INFO.encode()))
    print(f"{args.nodes} nodes, {len(inventory.usable())} devices, {len(claims)} claims "
          f"({len(holders)} allocated) accounted in {load_s:.1f} s; RSS +{rss_mib() - before:.0f} MiB")
    print(f"one scrape: {len(cold) / 1e6:.1f} MB, {len(cold.splitlines())} lines, {series} {CLAIM_DEVICE_INFO} series")
    print(f"  cold {cold_s:.2f} s; nothing changed {warm_s:.2f} s; one claim changed {changed_s:.2f} s")
    teams(ledger, metrics, args.teams, args.team_namespaces)


def teams(ledger: Ledger, metrics: Metrics, count: int, namespaces: int) -> None:
    """The team families' scrape cost: `count` teams over `namespaces` more Namespaces."""
    label = "team.draquota.io/name"
    for k in range(namespaces):
        ledger.set_namespace(Namespace(f"member-{k:04d}"), {label: f"t{k % count}"})
    _, before_s = timed(metrics.exposition)
    for selector in ("share", "every"):
        for t in range(count):
            ledger.add_or_update_quota(parse_cluster_device_quota({
                "apiVersion": "draquota.io/v1alpha1", "kind": "ClusterDeviceQuota", "metadata": {"name": f"t{t}"},
                "spec": {"hard": {"memory": "100Ti"},
                         "namespaceSelector": {"matchLabels": {label: f"t{t}"}} if selector == "share" else {}}}))
        text, team_s = timed(metrics.exposition)
        series = sum(1 for line in text.splitlines() if line.startswith(CLUSTER_QUOTA_NAMESPACE.encode()))
        print(f"{count} teams, each selecting {'its share' if selector == 'share' else 'every one'} of "
              f"{namespaces} more namespaces: {series} {CLUSTER_QUOTA_NAMESPACE} series; scrape {team_s:.2f} s "
              f"(+{team_s - before_s:.2f} s over the same scrape without teams)")


if __name__ == "__main__":
    main()
