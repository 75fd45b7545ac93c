"""A fresh replica's start-up at scale, on the path a user's replica takes.

A real control plane (tests/e2e/cluster.py's, on loopback) holding 5,000 nodes'
ResourceSlices (58,000 devices), 150,000 ResourceClaims (as many allocated as the
inventory holds: bench/inventory.py's mix with `allocated_fraction` 1), 500 namespaces
each with a DeviceQuota, and 20 ClusterDeviceQuotas selecting 25 namespaces each; then a
fresh `dra-quota serve` process, as the chart's Deployment runs it (its ServiceAccount,
RBAC and flags), listing everything over HTTPS. Prints, for each start:
- ready: from the process's start to `/readyz` answering 200 (every reflector listed,
  every claim accounted);
- the CPU seconds the process used until then;
- RSS at ready, the peak (VmHWM) at ready, and both again `--settle` seconds later
  (the stored claims priced after ready, `controllers.refine`);
- the longest event-loop stall since the process started, wall and the loop thread's
  CPU (serve's own `draquota_event_loop_stall_max_seconds` / `..._cpu_max_seconds`);
- the load average beside each.

Loading: creating 150,000 claims through the API server takes minutes (380 s in
bench/admission.py (e)), so the slices and claims are written straight into etcd
through its JSON gateway (`/v3/kv/txn`, 128 puts a transaction) as JSON objects, which
the API server decodes as it decodes its own (its storage codec recognises JSON); the
small kinds (classes, namespaces, quotas) are created through the API server. Each
claim carries the annotations the leader would have written on it
(`Admitter.annotations_due`: its charge, its quotas, its allocation record), so a fresh
leader has nothing to write, as on a cluster whose claims were admitted by dra-quota.

`--workdir DIR` keeps the loaded control plane running after the bench exits (state in
DIR/state.json) and reuses it on the next run, so the start-up can be measured again
(`--serve-path` runs another checkout's code: the before of an A/B) without loading
again; `--stop` ends it.

    python bench/startup.py [--workdir DIR] [--runs 2] [--serve-path /tmp/before] [--nodes 5000] [--claims 150000]

Not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from admission import ROOMY, create_many, deployment_flags, load_average, rss_of  # noqa: E402
from inventory import generate_claims, generate_device_classes, generate_namespaces, generate_slices  # noqa: E402

from devcluster.binary import build  # noqa: E402
from devcluster.controlplane import ControlPlane  # noqa: E402
from devcluster.processes import free_ports  # noqa: E402
from devcluster.served import Served  # noqa: E402
from tests.e2e.harness import CRDS, DQ  # noqa: E402
from tests.e2e.shipped import chart_kubeconfig  # noqa: E402
from kube.caches import NamespaceStore, QuotaStore  # noqa: E402
from quota.accounting.ledger import Ledger  # noqa: E402
from quota.admission.admitter import Admitter  # noqa: E402
from quota.devices.inventory import Inventory  # noqa: E402
from quota.objects.claims import parse_device_class  # noqa: E402
from quota.objects.jsonclaims import parse_json_claim  # noqa: E402
from quota.pricing.pricer import Pricer  # noqa: E402
from quota.values.model import DeviceClass, DeviceClassName  # noqa: E402
from runtime.metricnames import EVENT_LOOP_STALL_CPU_MAX, EVENT_LOOP_STALL_MAX  # noqa: E402

JSON = dict[str, Any]
RESOURCE_V1 = "resource.k8s.io/v1"
TEAM_LABEL = "team.draquota.io/name"
TXN_OPS = 128  # etcd's --max-txn-ops default
CREATED = "2026-01-01T00:00:00Z"


# -- loading ------------------------------------------------------------------------------------


def namespaces(count: int, teams: int) -> list[JSON]:
    """bench/inventory.py's namespaces (odd ones allow adminAccess), each in a team."""
    out = generate_namespaces(count)
    for i, ns in enumerate(out):
        ns["metadata"].setdefault("labels", {})[TEAM_LABEL] = f"team-{i % teams:02d}"
    return out


def device_quota(ns: str) -> JSON:
    return {"apiVersion": DQ, "kind": "DeviceQuota", "metadata": {"name": "gpus", "namespace": ns},
            "spec": {"hard": ROOMY}}


def cluster_quota(k: int) -> JSON:
    name = f"team-{k:02d}"
    return {"apiVersion": DQ, "kind": "ClusterDeviceQuota", "metadata": {"name": name},
            "spec": {"namespaceSelector": {"matchLabels": {TEAM_LABEL: name}}, "hard": ROOMY}}


def annotated(claims: list[JSON], slices: list[JSON], nss: list[JSON], quotas: list[JSON]) -> Iterator[JSON]:
    """Each claim with the annotations the leader writes on it (module doc), through the
    code `serve` runs: the inventory, classes, namespaces and quotas in its stores."""
    inventory = Inventory()
    inventory.replace_all(slices)
    classes: dict[DeviceClassName, DeviceClass] = {
        DeviceClassName(c["metadata"]["name"]): parse_device_class(c) for c in generate_device_classes()}
    admitter = Admitter(Pricer(inventory, classes), Ledger())
    NamespaceStore({}, admitter=admitter).replace([{**n, "metadata": {**n["metadata"], "uid": f"ns-{i}",
                                                                      "resourceVersion": "1"}}
                                                   for i, n in enumerate(nss)])
    for i, q in enumerate(quotas):
        store = QuotaStore(admitter, cluster=q["kind"] == "ClusterDeviceQuota")
        store.upsert({**q, "metadata": {**q["metadata"], "uid": f"q-{i}", "resourceVersion": "1", "generation": 1}})
    for claim in claims:
        due = admitter.annotations_due(parse_json_claim(claim), {})
        if due:
            claim["metadata"]["annotations"] = due
        yield claim


def stored(obj: JSON) -> bytes:
    """`obj` as the API server would store it (no resourceVersion: etcd's revision is it)."""
    meta = obj["metadata"]
    meta.pop("resourceVersion", None)
    meta.setdefault("creationTimestamp", CREATED)
    meta.setdefault("generation", 1)
    return json.dumps(obj, separators=(",", ":")).encode()


async def etcd_put(port: int, items: Iterable[tuple[str, bytes]], *, in_flight: int = 8) -> int:
    """Put every (key, value) through etcd's JSON gateway, TXN_OPS a transaction."""
    iterator = iter(items)
    done = 0

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    async with aiohttp.ClientSession() as http:
        async def work() -> None:
            nonlocal done
            while True:
                batch = [{"requestPut": {"key": b64(k.encode()), "value": b64(v)}}
                         for k, v in (next(iterator, (None, None)) for _ in range(TXN_OPS)) if k is not None and v]
                if not batch:
                    return
                async with http.post(f"http://127.0.0.1:{port}/v3/kv/txn", json={"success": batch}) as resp:
                    body = await resp.text()
                    if resp.status != 200:
                        raise RuntimeError(f"etcd txn: {resp.status} {body[:300]}")
                done += len(batch)

        await asyncio.gather(*(work() for _ in range(in_flight)))
    return done


async def load(cluster: ControlPlane, args: argparse.Namespace) -> JSON:
    kube = cluster.client()
    started = time.monotonic()
    try:
        for definition in CRDS:
            await kube.create("apiextensions.k8s.io/v1", "customresourcedefinitions", definition)
            await kube.wait_for_condition("apiextensions.k8s.io/v1", "customresourcedefinitions",
                                          definition["metadata"]["name"], "Established", timeout=60)
        for cls in generate_device_classes():
            await kube.create(RESOURCE_V1, "deviceclasses", cls)
        nss = namespaces(args.namespaces, args.teams)
        quotas = [device_quota(n["metadata"]["name"]) for n in nss] + [cluster_quota(k) for k in range(args.teams)]
        clients = [cluster.client() for _ in range(4)]
        try:
            await create_many(clients, (("v1", "namespaces", {"kind": "Namespace", "metadata": n["metadata"]}, None)
                                        for n in nss), workers=16)
            await create_many(clients, ((DQ, "devicequotas" if q["kind"] == "DeviceQuota" else "clusterdevicequotas",
                                         q, q["metadata"].get("namespace")) for q in quotas), workers=16)
        finally:
            for c in clients:
                await c.close()
        slices = generate_slices(args.nodes)
        claims = generate_claims(args.claims, args.namespaces, 11, slices, allocated_fraction=1.0)
        allocated = sum(1 for c in claims if "status" in c)
        t0 = time.monotonic()
        put = await etcd_put(cluster.etcd_port, (
            (f"/registry/resourceslices/{s['metadata']['name']}", stored(s)) for s in slices))
        claims_put = await etcd_put(cluster.etcd_port, (
            (f"/registry/resourceclaims/{c['metadata']['namespace']}/{c['metadata']['name']}",
             stored(c)) for c in annotated(claims, slices, nss, quotas)))
        print(f"{put} ResourceSlices and {claims_put} ResourceClaims ({allocated} allocated) written into etcd "
              f"in {time.monotonic() - t0:.0f} s")
        # The API server's watch cache holds them once a list at its newest version has them all.
        for plural, want in (("resourceslices", put), ("resourceclaims", claims_put)):
            while True:
                listed = await kube.request("GET", f"/apis/resource.k8s.io/v1/{plural}", params={"limit": 1})
                remaining = int((listed.get("metadata") or {}).get("remainingItemCount") or 0) + len(listed["items"])
                if remaining >= want:
                    break
                await asyncio.sleep(1)
        return {"slices": put, "claims": claims_put, "allocated": allocated, "namespaces": len(nss),
                "device_quotas": len(nss), "cluster_quotas": args.teams, "load_s": round(time.monotonic() - started)}
    finally:
        await kube.close()


# -- a kept control plane -----------------------------------------------------------------------


def attach(workdir: Path) -> ControlPlane | None:
    """The control plane a previous run kept in `workdir`, if it still answers."""
    state_file = workdir / "state.json"
    if not state_file.exists():
        return None
    state = json.loads(state_file.read_text())
    cluster = ControlPlane(binary=build(), workdir=workdir / "cluster", die_with_parent=False)
    with contextlib.suppress(OSError):
        cluster.etcd_dir.rmdir()  # __post_init__ made a fresh one: the kept one is in the state
    cluster.etcd_dir = Path(state["etcd_dir"])
    cluster.etcd_port, cluster.apiserver_port = state["etcd_port"], state["apiserver_port"]
    cluster.server = f"https://127.0.0.1:{cluster.apiserver_port}"
    if not all(_alive(pid) for pid in state["pids"].values()):
        print(f"the control plane kept in {workdir} is gone: loading again")
        stop_kept(workdir)
        return None
    return cluster


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def keep(cluster: ControlPlane, workdir: Path, loaded: JSON) -> None:
    (workdir / "state.json").write_text(json.dumps({
        "etcd_dir": str(cluster.etcd_dir), "etcd_port": cluster.etcd_port, "apiserver_port": cluster.apiserver_port,
        "pids": {c.name: c.pid for c in cluster.components}, "loaded": loaded}, indent=1))


def stop_kept(workdir: Path) -> None:
    state_file = workdir / "state.json"
    if not state_file.exists():
        return
    state = json.loads(state_file.read_text())
    for name, pid in state["pids"].items():
        if name != "etcd":
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
    time.sleep(3)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(state["pids"]["etcd"], signal.SIGTERM)
    time.sleep(1)
    shutil.rmtree(state["etcd_dir"], ignore_errors=True)
    state_file.unlink()
    print(f"stopped the control plane kept in {workdir}")


# -- measuring ----------------------------------------------------------------------------------


def cpu_of(pid: int) -> float:
    """CPU seconds (user and system) process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def sample_rss(pid: int, peak: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError, ValueError):
            peak[0] = max(peak[0], rss_of(pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


async def measure(cluster: ControlPlane, workdir: Path, args: argparse.Namespace, run: int) -> JSON:
    kube = cluster.client()
    try:
        kubeconfig = await chart_kubeconfig(cluster, kube, workdir / "chart.kubeconfig")
    finally:
        await kube.close()
    env = {"PYTHONPATH": str(args.serve_path)} if args.serve_path else {}
    served = Served(cluster, free_ports(1)[0], workdir / f"serve-{run}.log", kubeconfig=kubeconfig,
                    args=deployment_flags(), ready_timeout=900, metrics_port=free_ports(1)[0], log_level="info",
                    env=env)
    load_before = load_average()
    stop = asyncio.Event()
    peak = [0.0]
    start = asyncio.create_task(served.start())
    while served.process is None and not start.done():
        await asyncio.sleep(0.005)
    assert served.process is not None
    sampler = asyncio.create_task(sample_rss(served.process.pid, peak, stop))
    try:
        await start
        pid = served.process.pid
        at_ready = {"ready_s": round(served.ready_seconds, 2), "cpu_s": round(cpu_of(pid), 1), "rss_mib": round(rss_of(pid)),
                    "peak_rss_mib": round(max(peak[0], rss_of(pid, "VmHWM"))), "load": load_average()}
        await asyncio.sleep(args.settle)
        samples = await served.metrics()
        stop.set()
        await sampler

        def metric(name: str) -> float:
            return next((v for (n, _), v in samples.items() if n == name), float("nan"))

        out: JSON = {"run": run, "code": str(args.serve_path or ROOT), "load_before": load_before, "at_ready": at_ready,
               "settled": {"after_s": args.settle, "rss_mib": round(rss_of(pid)),
                           "peak_rss_mib": round(rss_of(pid, "VmHWM")), "load": load_average()},
               "stall_max_ms": round(metric(EVENT_LOOP_STALL_MAX) * 1000, 1),
               "stall_cpu_max_ms": round(metric(EVENT_LOOP_STALL_CPU_MAX) * 1000, 1),
               "ready_line": [line for line in served.log_text().splitlines() if "ready after" in line][-1]}
    finally:
        stop.set()
        await served.terminate()
    print(f"run {run} ({out['code']}): ready in {at_ready['ready_s']} s ({at_ready['cpu_s']} s of CPU), "
          f"RSS {at_ready['rss_mib']} MiB "
          f"(peak {at_ready['peak_rss_mib']} MiB) at ready; {args.settle:.0f} s later RSS "
          f"{out['settled']['rss_mib']} MiB (peak {out['settled']['peak_rss_mib']} MiB); longest loop stall "
          f"{out['stall_max_ms']} ms (CPU {out['stall_cpu_max_ms']} ms); load average {load_before} before, "
          f"{at_ready['load']} at ready")
    print(f"  {out['ready_line'].split(' ', 3)[-1]}")
    return out


async def main_async(args: argparse.Namespace) -> JSON:
    workdir: Path = args.workdir or Path(tempfile.mkdtemp(prefix="bench-startup-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = attach(workdir) if args.workdir else None
    results: JSON = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cores": os.cpu_count(),
                     "load_average_start": load_average()}
    fresh = cluster is None
    if cluster is None:
        cluster = ControlPlane(binary=build(), workdir=workdir / "cluster", die_with_parent=not args.workdir)
        cluster.start()
        results["loaded"] = await load(cluster, args)
        if args.workdir:
            keep(cluster, args.workdir, results["loaded"])
    else:
        results["loaded"] = json.loads((workdir / "state.json").read_text())["loaded"]
        print(f"reusing the control plane kept in {workdir}: {results['loaded']}")
    try:
        results["runs"] = [await measure(cluster, workdir, args, run) for run in range(args.runs)]
    finally:
        if fresh and not args.workdir:
            cluster.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=150_000)
    parser.add_argument("--namespaces", type=int, default=500)
    parser.add_argument("--teams", type=int, default=20)
    parser.add_argument("--runs", type=int, default=1, help="fresh serve processes started, one after the other")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after ready before the last sample")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the loaded control plane here (module doc)")
    parser.add_argument("--serve-path", type=Path, default=None, help="PYTHONPATH of the serve measured")
    parser.add_argument("--stop", action="store_true", help="stop the control plane kept in --workdir")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "startup.json")
    args = parser.parse_args()
    if args.stop:
        assert args.workdir is not None, "--stop needs --workdir"
        stop_kept(args.workdir)
        return
    print(f"start-up benchmark: {os.cpu_count()} cores, load average {load_average()}")
    results = asyncio.run(main_async(args))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"load average at the end {load_average()}; results written to {args.output}")


if __name__ == "__main__":
    main()
