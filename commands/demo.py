"""`dra-quota demo`: the webhook and the quota controller live, on a throw-away local cluster.

Neighbours: `devcluster` starts the Go-built control plane (etcd, kube-apiserver,
kube-scheduler, kube-controller-manager on loopback) and provides the admin client, the
kubelet-less Nodes and the webhook routing the end-to-end tests use too: the demo shows
exactly what the tests prove. `commands.cli` parses the flags, prints the fallback (`check`
on examples/) when no control plane can be had (`DemoUnavailable`), and maps errors to
exit codes. `commands.demoplan` holds the scenario, the options and the run's state;
`commands.demosteps` publishes examples/ and plays each step.

This module runs it: it finds (or builds) the control plane's binary, starts the
cluster, installs the CRD, runs `dra-quota serve` as a subprocess with the tests' own
launcher, `devcluster.served.Served` (the control plane's test CA signs its serving
certificate; it is also the quota controller's leader), routes the shipped webhook
configurations to it, has the scenario played (`commands.demosteps`: Pods using the
claims are scheduled by the real kube-scheduler, a claim that does not fit is denied by
the live webhook with the message of docs/design.md ("Admission"), and `used` moves as
the controller counts allocations), then tears everything down or, with `--keep`,
leaves it running with a stop script.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shlex
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from commands.demoplan import DemoError, DemoOptions, DemoRun, DemoUnavailable, examples
from commands.demosteps import play_step, publish_examples
from devcluster.binary import DEFAULT_BINARY, NOT_A_CHECKOUT, ControlPlaneError, build, in_checkout
from devcluster.controlplane import ControlPlane
from devcluster.kube import ApiError, Kube, WaitTimeout
from devcluster.processes import free_ports
from devcluster.served import ServeExited, Served, metrics_reader_token
from quota.manifests import crds, documents, tenant_view_role

__all__ = ["locate_binary", "run"]

ADMISSION = "admissionregistration.k8s.io/v1"
LEASE = "dra-quota-demo"
# Measured on 2 shared cores (README, "Quick start"); shown before a cold build starts.
COLD_BUILD_MINUTES = "12-15"
# The Service the shipped configurations name (namespace, name): the test certificate
# `serve` runs with here is valid for it (devcluster.controlplane.WEBHOOK_SERVICES).
WEBHOOK_SERVICE = ("dra-quota-system", "dra-quota-webhook")

PLURALS = {"ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
           "MutatingWebhookConfiguration": "mutatingwebhookconfigurations"}


# -- the control plane binary -------------------------------------------------------------------


def locate_binary(say: Callable[[str], None]) -> Path:
    """`MINIK8S_BIN`, else tests/cluster/build.sh (a no-op when up to date) when Go is on PATH,
    else an already built `.cache/minik8s`; `DemoUnavailable` when there is none of these,
    or no source checkout to build in (an installed copy)."""
    if os.environ.get("MINIK8S_BIN"):
        try:
            return build()
        except ControlPlaneError as err:
            raise DemoError(str(err)) from err
    if not in_checkout():
        raise DemoUnavailable(f"no local control plane: {NOT_A_CHECKOUT}")
    if shutil.which("go"):
        if not os.access(DEFAULT_BINARY, os.X_OK):
            say(f"Building the local control plane (Kubernetes 1.37 from the k8s.io/kubernetes Go module, "
                f"tests/cluster/build.sh). A cold build takes about {COLD_BUILD_MINUTES} minutes on 2 cores; "
                "later runs reuse it.")
        return _build_with_progress(say)
    if os.access(DEFAULT_BINARY, os.X_OK):
        return DEFAULT_BINARY
    raise DemoUnavailable(
        "no local control plane: Go (>= 1.26, to build one with tests/cluster/build.sh) is not on PATH, "
        f"and there is no built binary at {DEFAULT_BINARY} (nor MINIK8S_BIN)")


def _build_with_progress(say: Callable[[str], None]) -> Path:
    started = time.monotonic()
    cancel = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(build, cancel=cancel)
        while True:
            try:
                return future.result(timeout=30)
            except KeyboardInterrupt:
                # Leaving the pool waits for the build's thread: stop the build (its own
                # process group, which a SIGINT to this pid alone never reaches) first.
                cancel.set()
                raise
            except concurrent.futures.TimeoutError:
                say(f"  still building ({time.monotonic() - started:.0f}s)...")
            except ControlPlaneError as err:
                if os.access(DEFAULT_BINARY, os.X_OK):
                    say(f"warning: rebuilding the control plane failed; using the existing {DEFAULT_BINARY}")
                    return DEFAULT_BINARY
                raise DemoUnavailable(f"the control plane could not be built: {err}") from err


# -- the whole run ------------------------------------------------------------------------------


def run(options: DemoOptions, out: TextIO) -> dict[str, Any]:
    """Build (if needed) and start everything, play the scenario, tear down (unless `keep`).

    Returns the summary (`--output json`). Raises `DemoUnavailable` before starting anything
    when no control plane can be had, `DemoError` when a step failed (all stopped, logs kept),
    `KeyboardInterrupt` after cleaning up on Ctrl-C.
    """
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="dra-quota-demo-"))
    state = DemoRun(options, out, workdir)
    state.say("dra-quota demo: a local Kubernetes 1.37 control plane, dra-quota's webhook and quota "
              "controller, fake GPU nodes from examples/, and two teams sharing them.")
    kept = False
    ok = False
    try:
        t0 = time.monotonic()
        binary = locate_binary(state.say)
        state.seconds["control_plane_build"] = round(time.monotonic() - t0, 1)
        state.say(f"[1/5] control plane binary: {binary} ({state.seconds['control_plane_build']}s)")
        _start_cluster(state, binary)
        summary = asyncio.run(_interruptible(state))
        if state.interrupted:
            raise KeyboardInterrupt
        ok = True
        if options.keep:
            kept = True
            summary["kept"] = _keep(state)
        return summary
    except KeyboardInterrupt:
        ok = True  # nothing failed: the logs are not worth keeping
        raise
    except (WaitTimeout, ApiError, ServeExited) as err:
        raise DemoError(f"{err}\nlogs: {workdir}") from err
    except ControlPlaneError as err:
        raise DemoError(f"the control plane failed: {err}\nlogs: {workdir}") from err
    finally:
        if not kept:
            _teardown(state, remove=ok)


def _start_cluster(state: DemoRun, binary: Path) -> None:
    t0 = time.monotonic()
    # With --keep the components must outlive this process; otherwise they die with it.
    for attempt in (1, 2):
        cluster = ControlPlane(binary=binary, workdir=state.workdir / "cluster", die_with_parent=not state.options.keep)
        state.cluster = cluster
        try:
            cluster.start(timeout=state.options.start_timeout)
            break
        except ControlPlaneError as err:
            cluster.stop()
            # free_ports() probes then releases: another process may take a port in between.
            if attempt == 2 or "address already in use" not in str(err):
                raise
    state.seconds["control_plane_start"] = round(time.monotonic() - t0, 1)
    state.say(f"[2/5] etcd, kube-apiserver, kube-scheduler, kube-controller-manager on {cluster.server} "
              f"({state.seconds['control_plane_start']}s)")


async def _interruptible(state: DemoRun) -> dict[str, Any]:
    """`_play`, which Ctrl-C ends for certain. asyncio.run's own handler cancels the task,
    but a cancellation can be lost (3.11's `wait_for` drops one that races its inner
    future's completion: under load the scenario then ran on to its end and exited 0).
    So Ctrl-C is also remembered, checked before each step, and said after the run."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def interrupt() -> None:
        state.interrupted = True
        task.cancel()

    loop.add_signal_handler(signal.SIGINT, interrupt)
    try:
        return await _play(state)
    except asyncio.CancelledError:
        if not state.interrupted:
            raise
        return {}
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def _play(state: DemoRun) -> dict[str, Any]:
    cluster = state.cluster
    assert cluster is not None
    async with cluster.client() as kube:
        t0 = time.monotonic()
        await _install_crd(kube)
        await _start_serve(state)
        await _route_webhooks(state, kube)
        state.seconds["serve_ready"] = round(time.monotonic() - t0, 1)
        pid = state.serve.process.pid if state.serve and state.serve.process else "?"
        state.say(f"[3/5] DeviceQuota CRD, dra-quota serve (pid {pid}, "
                  f"log {state.serve_log}) and its webhook configurations ({state.seconds['serve_ready']}s)")
        t0 = time.monotonic()
        counts = await publish_examples(state, kube)
        state.seconds["inventory"] = round(time.monotonic() - t0, 1)
        state.say(f"[4/5] examples/ published: {counts} ({state.seconds['inventory']}s)")
        t0 = time.monotonic()
        state.say(f"[5/5] the scenario ({len(state.options.scenario)} steps); usage is each DeviceQuota's "
                  "status as the quota controller writes it (what `dra-quota top` prints)")
        claims = {(d["metadata"]["namespace"], d["metadata"]["name"]): d
                  for d in documents(examples() / "40-claims.yaml") if d.get("kind") == "ResourceClaim"}
        for number, step in enumerate(state.options.scenario, 1):
            if state.interrupted:
                raise asyncio.CancelledError
            await play_step(state, kube, number, step, claims)
        state.seconds["scenario"] = round(time.monotonic() - t0, 1)
        if state.options.keep and state.serve is not None:
            # serve's metrics are served as a cluster's are (HTTPS, a token allowed to get
            # /metrics): one for whoever scrapes the kept demo.
            token = state.workdir / "metrics-token"
            token.write_text(await metrics_reader_token(cluster))
            token.chmod(0o600)
        state.seconds["total"] = round(time.monotonic() - state.started, 1)
        denied = sum(1 for s in state.steps if s["decision"] == "denied")
        state.say(f"\nDone in {state.seconds['total']}s: {len(state.steps)} steps, {denied} claim(s) denied "
                  "by the live webhook, usage counted from the scheduler's allocations.")
        return {"steps": state.steps, "seconds": state.seconds}


async def _install_crd(kube: Kube) -> None:
    for definition in crds():
        await kube.create("apiextensions.k8s.io/v1", "customresourcedefinitions", definition)
        await kube.wait_for_condition("apiextensions.k8s.io/v1", "customresourcedefinitions",
                                      definition["metadata"]["name"], "Established", timeout=60)
    # As the chart installs it: a tenant with view, edit or admin in a namespace reads its quotas.
    await kube.create("rbac.authorization.k8s.io/v1", "clusterroles", tenant_view_role())


async def _start_serve(state: DemoRun) -> None:
    cluster = state.cluster
    assert cluster is not None
    # The demo's Lease and identity; with --keep, serve outlives the demo as the cluster does,
    # and its metrics (on loopback, as everything the demo starts) are there to scrape.
    port, metrics_port = free_ports(2)
    state.serve = Served(cluster, port, state.serve_log, env={"POD_NAME": "dra-quota-demo"}, lease=LEASE,
                         log_level="info", die_with_parent=not state.options.keep, metrics_port=metrics_port)
    await state.serve.start()


async def _route_webhooks(state: DemoRun, kube: Kube) -> None:
    from devcluster.webhooks import adapted_webhooks

    assert state.cluster is not None
    # The demo's cluster has one user: the shipped selectors as they are, the names kept.
    assert state.serve is not None
    for config in adapted_webhooks("demo", state.serve.port, state.cluster, label=None, name_suffix=""):
        await kube.create(ADMISSION, PLURALS[config["kind"]], config)




# -- the end ------------------------------------------------------------------------------------


def _keep(state: DemoRun) -> dict[str, str]:
    """Leave everything running; write a stop script; tell how to use and stop it."""
    cluster = state.cluster
    assert cluster is not None and state.serve is not None and state.serve.process is not None
    etcd = [c.pid for c in cluster.components if c.name == "etcd" and c.pid]
    clients = [state.serve.process.pid, *(c.pid for c in reversed(cluster.components) if c.name != "etcd" and c.pid)]
    stop = state.workdir / "stop.sh"
    # Each process leads its own session and starts no children: signalling the pids is enough
    # (and portable: dash's kill takes no process-group operands). etcd last, as
    # ControlPlane.stop does: an apiserver without its etcd takes ~10 s to shut down.
    stop.write_text(
        "#!/bin/sh\n# Stops the cluster `dra-quota demo --keep` left running, and removes its files.\n"
        "stop() {\n  kill -TERM \"$@\" 2>/dev/null\n"
        # A zombie (exited, not reaped by an init that does not reap) counts as gone.
        "  for i in $(seq 75); do\n    alive=\n"
        "    for p in \"$@\"; do ps -o stat= -p \"$p\" | grep -q '^[^Z]' && alive=1; done\n"
        "    [ -z \"$alive\" ] && return; sleep 0.2\n  done\n  kill -KILL \"$@\" 2>/dev/null\n}\n"
        f"stop {' '.join(map(str, clients))}\n"
        f"stop {' '.join(map(str, etcd))}\n"
        f"rm -rf {shlex.quote(str(cluster.etcd_dir))} {shlex.quote(str(state.workdir))}\n")
    stop.chmod(0o755)
    kubeconfig = str(cluster.kubeconfig)
    # The serving certificate names the Service: curl resolves that name to loopback.
    host, port = f"{WEBHOOK_SERVICE[1]}.{WEBHOOK_SERVICE[0]}.svc", state.serve.metrics_port
    metrics = f"https://{host}:{port}/metrics"
    token = state.workdir / "metrics-token"
    scrape = (f"curl -s --cacert {shlex.quote(str(cluster.ca_file))} --resolve {host}:{port}:127.0.0.1 "
              f"-H \"Authorization: Bearer $(cat {shlex.quote(str(token))})\" {metrics}")
    state.say(f"\nStill running (--keep). The cluster's admin kubeconfig: {kubeconfig}\n"
              f"  export KUBECONFIG={shlex.quote(kubeconfig)}\n"
              "  kubectl get devicequotas -A; kubectl get resourceclaims -A; kubectl get pods -A -o wide\n"
              "  dra-quota top\n"
              "  kubectl create rolebinding tina-views --clusterrole=view --user=tina -n team-a; "
              "kubectl get devicequotas -n team-a --as=tina   # what a tenant sees\n"
              f"  dra-quota serve's metrics (Prometheus scrape target 127.0.0.1:{port}, HTTPS, a token allowed "
              f"to get /metrics): {scrape} | grep ^draquota_\n"
              f"  dra-quota serve's log: {state.serve_log}; the control plane's: {cluster.logs}\n"
              f"Stop it all: sh {shlex.quote(str(stop))}")
    return {"kubeconfig": kubeconfig, "metrics": metrics, "metrics_token": str(token), "ca": str(cluster.ca_file),
            "stop": str(stop), "workdir": str(state.workdir)}


def _teardown(state: DemoRun, *, remove: bool) -> None:
    """Stop serve, then the control plane; remove the files unless something failed (logs).

    A Ctrl-C while this runs (~2 s) is ignored: interrupting the clean-up would leave
    processes behind, and the clean-up is what Ctrl-C asked for.
    """
    if threading.current_thread() is not threading.main_thread():
        _stop(state, remove=remove)
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _stop(state, remove=remove)
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop(state: DemoRun, *, remove: bool) -> None:
    if state.serve is not None:
        state.serve.stop()
    if state.cluster is not None:
        state.cluster.stop()
    if (remove or state.cluster is None) and state.options.workdir is None:  # no logs before a cluster
        shutil.rmtree(state.workdir, ignore_errors=True)
