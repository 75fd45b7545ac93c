"""Showback's costs: the counters per allocation and per scrape, and `dra-quota report` over 30 days.

Part 1, in process: `--nodes` nodes x 8 GPUs and `--claims` claims over `--namespaces`
namespaces (bench/inventory.py, about 30 % allocated) listed into the ledger through the
webhook's own `ClaimStore`, as serve's first list; then
- each allocated claim counted again (`Ledger.add_or_update_claim`: the claim out, then in)
  without and with the showback observer (`webhook.showbackmetrics.Showback`): the
  difference per event is the counters' cost; and the same for whole claim events (the
  claim deleted and listed again through `ClaimStore`: parse, exact pricing, ledger);
- the resync after a relist (every claim read again, in chunks);
- a scrape of the two families (`Metrics.exposition` of them alone) over the cells made.

Part 2, `--report`: a Prometheus TSDB holding 30 days of the counters for `--namespaces`
namespaces (one device model each, the leader changing mid-month so each namespace has
two series per counter) at one sample per `--spacing` seconds, written as OpenMetrics and
backfilled with `promtool tsdb create-blocks-from openmetrics`; a Prometheus on loopback
over it; `dra-quota report` (the installed command, a process: its start-up included) timed
by namespace, by team and by model.

Not a timed test: `python bench/showback.py [--report] [--spacing 300]`. Prints the numbers
with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from controller import caches  # noqa: E402
from inventory import generate_claims  # noqa: E402
from pricing import timed  # noqa: E402

from kube.claimstore import ClaimStore  # noqa: E402
from quota.accounting.usage import Holders  # noqa: E402
from quota.admission.admitter import Admitter  # noqa: E402
from quota.pricing.pricer import Pricer  # noqa: E402
from webhook.metrics import Metrics  # noqa: E402
from webhook.showbackmetrics import Showback  # noqa: E402

GIB = 2**30
MONTH = 30 * 86400


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def counters(nodes: int, claims_n: int, namespaces: int) -> None:
    slices, inventory, classes, ledger, _ = caches(nodes)
    claims = generate_claims(claims_n, namespaces, 7, slices)
    store = ClaimStore(Admitter(Pricer(inventory, classes), ledger), holders=Holders())
    _, listed = timed(lambda: store.replace(claims))
    gc.collect()
    gc.freeze()
    allocated = [e for e in ledger.entries() if e.allocated]
    devices = sum(len(next(iter(e.pricing.values())).held) for e in allocated)
    print(f"{claims_n} claims in {namespaces} namespaces listed in {listed:.2f}s; {len(allocated)} allocated "
          f"holding {devices} devices; load average {load()}")

    def recount() -> None:
        for entry in allocated:
            ledger.add_or_update_claim(entry)

    held = [c for c in claims if (c.get("status") or {}).get("allocation")]

    def events() -> None:
        for obj in held:
            store.delete(obj)
            store.upsert(obj)

    rounds = 3
    bare_events = min(timed(events)[1] for _ in range(rounds))
    bare = min(timed(recount)[1] for _ in range(rounds))
    clock = [0.0]
    showback = Showback(ledger, inventory, lambda: True, clock=lambda: clock[0])
    showback.attach()
    asyncio.run(showback.resync())  # what a relist's swap costs it
    _, resync = timed(lambda: asyncio.run(showback.resync()))
    showback.step()
    observed = min(timed(recount)[1] for _ in range(rounds))
    observed_events = min(timed(events)[1] for _ in range(rounds))
    print(f"an allocated claim deleted and listed again through the claim store (parse, exact price, ledger): "
          f"{bare_events / len(held) * 1e6:.0f} us without the counters, {observed_events / len(held) * 1e6:.0f} us "
          f"with them ({(observed_events - bare_events) / bare_events * 100:+.0f} %)")
    per_event = (observed - bare) / len(allocated)
    print(f"an allocated claim counted again (out, then in): {bare / len(allocated) * 1e6:.1f} us without the "
          f"counters, {observed / len(allocated) * 1e6:.1f} us with them: +{per_event * 1e6:.1f} us per event "
          f"({per_event / (bare / len(allocated)) * 100:.0f} %); {devices / len(allocated):.1f} devices a claim")
    print(f"resync of every claim after a relist: {resync:.3f}s ({resync / len(allocated) * 1e6:.1f} us a claim)")
    metrics = Metrics()
    showback.register(metrics)
    clock[0] = 60.0
    cells = len(showback.accrual.rates())
    _, scrape = timed(metrics.exposition)
    scrapes = min(timed(metrics.exposition)[1] for _ in range(5))
    print(f"{cells} cells (namespace, class, model): a scrape of /metrics with the two families "
          f"{scrapes * 1e3:.1f} ms (first {scrape * 1e3:.1f} ms), load average {load()}")


# -- report over 30 days ----------------------------------------------------------------------


def openmetrics(path: Path, namespaces: int, spacing: int, end: int) -> int:
    """30 days to `end`: each namespace holds 1-8 80 GiB GPUs of one model; replica a leads
    the first half, b the second (a's series stop growing, b's start). Returns samples."""
    start = end - MONTH
    half = start + MONTH // 2
    models = ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA L40S")
    samples = 0
    with path.open("w") as out:
        for metric, unit in (("draquota_allocated_memory_byte_seconds", 80 * GIB),
                             ("draquota_allocated_device_seconds", 1)):
            out.write(f"# TYPE {metric} counter\n")
            for k in range(namespaces):
                held = unit * (1 + k % 8)
                labels = f'namespace="ns-{k:03d}",device_class="gpu",model="{models[k % 3]}"'
                for replica, (low, high) in (("a", (start, half)), ("b", (half, end))):
                    for t in range(low, high + 1, spacing):
                        out.write(f'{metric}_total{{{labels},instance="{replica}"}} '
                                  f"{held * (t - low)} {t}\n")
                        samples += 1
        out.write("# TYPE draquota_leader gauge\n")
        for replica in ("a", "b"):
            for t in range(start, end + 1, spacing):
                out.write(f'draquota_leader{{instance="{replica}"}} {int((t < half) == (replica == "a"))} {t}\n')
                samples += 1
        out.write("# TYPE draquota_cluster_quota_namespace gauge\n")
        for k in range(namespaces):
            for t in range(end - 3600, end + 1, spacing):
                out.write(f'draquota_cluster_quota_namespace{{quota="team-{k % 20}",namespace="ns-{k:03d}",'
                          f'resource="memory",type="used",instance="b"}} {80 * GIB} {t}\n')
                samples += 1
        out.write("# EOF\n")
    return samples


def report(namespaces: int, spacing: int) -> None:
    promtool, prometheus = shutil.which("promtool"), shutil.which("prometheus")
    if promtool is None or prometheus is None:
        sys.exit("promtool and prometheus are needed (.ci/prometheus.sh)")
    end = (int(time.time()) // 3600) * 3600 - 3600
    with tempfile.TemporaryDirectory(prefix="showback-bench-") as tmp:
        directory = Path(tmp)
        data = directory / "data"
        source = directory / "month.om"
        samples, written = timed(lambda: openmetrics(source, namespaces, spacing, end))
        size = source.stat().st_size
        _, backfilled = timed(lambda: subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=768h", str(source),
             str(data)], check=True, capture_output=True))
        source.unlink()
        print(f"30 days for {namespaces} namespaces at one sample per {spacing}s: {samples:,} samples "
              f"({size / 2**20:.0f} MiB of OpenMetrics written in {written:.0f}s, backfilled in {backfilled:.0f}s)")
        port = free_port()
        (directory / "prometheus.yml").write_text("global: {scrape_interval: 1m}\n")
        with (directory / "prometheus.log").open("wb") as log:
            server = subprocess.Popen(
                [prometheus, f"--config.file={directory / 'prometheus.yml'}", f"--storage.tsdb.path={data}",
                 "--storage.tsdb.retention.time=400d", f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, server)
            for by in ("namespace", "team", "model"):
                runs = []
                for _ in range(2):
                    started = time.perf_counter()
                    done = subprocess.run([sys.executable, "-m", "commands.cli", "report", "--prometheus", url,
                                           "--from", iso(end - MONTH), "--to", iso(end), "--by", by, "-o", "json"],
                                          capture_output=True, text=True, check=False,
                                          cwd=Path(__file__).resolve().parents[1])
                    runs.append(time.perf_counter() - started)
                    if done.returncode != 0:
                        sys.exit(f"report --by {by} failed: {done.stderr}")
                body = json.loads(done.stdout)
                print(f"dra-quota report --by {by} over 30 days: {min(runs):.2f}s (first {runs[0]:.2f}s), "
                      f"{len(body['rows'])} rows, total {body['total']['gpuMemoryGiBHours']:,.0f} GiB-hours, "
                      f"load average {load()}")
        finally:
            server.terminate()
            server.wait(30)


def free_port() -> int:
    from devcluster.processes import free_ports

    return free_ports(1)[0]


def wait_ready(url: str, server: subprocess.Popen[bytes]) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"prometheus exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)  # a benchmark waiting for its server, not a test
    sys.exit("prometheus not ready within 300s")


def iso(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=150_000)
    parser.add_argument("--namespaces", type=int, default=500)
    parser.add_argument("--report", action="store_true", help="also time dra-quota report over 30 days")
    parser.add_argument("--spacing", type=int, default=300, help="seconds between the report data's samples")
    args = parser.parse_args()
    counters(args.nodes, args.claims, args.namespaces)
    if args.report:
        report(args.namespaces, args.spacing)


if __name__ == "__main__":
    main()
