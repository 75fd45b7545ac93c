"""One `dra-quota serve` process against the loopback control plane, started and stopped.

The one launcher of `serve` as a process: the e2e tests (tests/e2e/harness.py re-exports
`Served`, and conftest.py's fixtures start one per test) and `dra-quota demo` (commands/demo.py) use it,
so the demo runs serve exactly as the tests prove it. `devcluster.controlplane` provides
the cluster it talks to (admin kubeconfig, the test CA and the webhook certificate for the
Service name the shipped configurations use); `devcluster.webhooks` routes those
configurations to `port`. Readiness is polled (`devcluster.kube.poll`), never slept for.

`start` returns once the process is ready as a kubelet's readiness probe sees it: its
`/readyz` answers 200 over HTTPS (the test CA). That means every reflector listed once
and shutdown has not begun (commands/serve.py: `caches.synced and not stop`); not that
this replica leads (only the leader runs the controller: tests that need it wait for the
Lease or the namespace's governed label). Two cases where `/readyz` cannot say it of
*this* process, and its own log line does (serve writes "ready after" as it announces
that same condition, `_announce_ready`): `--no-webhook` (no listener to ask) and
`--reuse-port` (the kernel hands each new connection to any replica on the port, so a
200 may be another replica's).

A plain `subprocess.Popen`, not an asyncio subprocess: asyncio kills a child whose
transport is closed with its event loop, and the demo's `--keep` must leave serve running
after its loop ended. In its own session (a Ctrl-C in the terminal reaches only the
caller, which stops serve in order) and, unless `die_with_parent` is off, killed when the
caller dies, as the control plane's components are.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from devcluster.controlplane import ControlPlane
from devcluster.kube import ApiError, Kube, poll
from devcluster.processes import die_with_parent_process

__all__ = ["METRICS_READER", "ServeExited", "Served", "metrics_reader_token", "service_account_token"]

# The ServiceAccount (in `default`) and ClusterRole `Served.scrape` uses: what a Prometheus
# needs to scrape serve (the chart's <fullname>-metrics-reader ClusterRole is the same rule).
METRICS_READER = "dra-quota-e2e-metrics-reader"


class ServeExited(RuntimeError):
    """The process ended while it was awaited to become ready."""


@dataclass
class Served:
    """One `dra-quota serve` process on `port`, logging to `log`; `start` again after it stopped."""

    cluster: ControlPlane
    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = None
    ready_seconds: float = 0.0
    args: tuple[str, ...] = ()  # extra `dra-quota serve` flags
    # True: `args` choose --cert-mode self, so serve mints its own certificate.
    self_managed: bool = False
    # --metrics-port: 0 (off) unless a test scrapes, so processes never contend for a port.
    metrics_port: int = 0
    # The bearer token `scrape` sends (HTTPS, TokenReview + SubjectAccessReview in serve):
    # "" makes one for a ServiceAccount allowed to get /metrics (`metrics_reader_token`).
    metrics_token: str = ""
    # Another identity than the cluster admin (test_chart.py: the chart's ServiceAccount).
    kubeconfig: Path | None = None
    # True: name the kubeconfig through $KUBECONFIG, not --kubeconfig (how a user's shell does).
    kubeconfig_from_env: bool = False
    # On top of the caller's environment (POD_NAME: the Lease identity, default the log's name).
    env: dict[str, str] = field(default_factory=dict)
    # The Lease it campaigns for unless `args` choose one; replicas share one by sharing this.
    lease: str = field(default_factory=lambda: f"serve-{uuid.uuid4().hex[:8]}")
    # False: --no-webhook (the controller only): no listener, so readiness is its log line (module doc).
    webhook: bool = True
    # How long the first sync may take (bench/admission.py lists 150,000 claims).
    ready_timeout: float = 60.0
    log_level: str = "debug"
    # False: serve outlives the caller (`dra-quota demo --keep`).
    die_with_parent: bool = True

    async def start(self) -> None:
        cert, key = self.cluster.webhook_cert
        tls = () if self.self_managed or not self.webhook else ("--tls-cert-file", str(cert), "--tls-key-file", str(key))
        started = time.monotonic()
        earlier = self.log_text().count("ready after")  # the log is appended to across restarts
        kubeconfig = str(self.kubeconfig or self.cluster.kubeconfig)
        credentials = {"KUBECONFIG": kubeconfig} if self.kubeconfig_from_env else {}
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "commands.cli", "serve",
                 *(() if self.kubeconfig_from_env else ("--kubeconfig", kubeconfig)), *tls,
                 "--bind-address", "127.0.0.1", "--port", str(self.port), "--log-level", self.log_level,
                 "--metrics-bind-address", "127.0.0.1", "--metrics-port", str(self.metrics_port),
                 *self._own_lease(), *self.args, *(() if self.webhook else ("--no-webhook",))],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.log.parent,
                env={**os.environ, "POD_NAME": self.log.stem, **credentials, **self.env}, start_new_session=True,
                preexec_fn=die_with_parent_process if self.die_with_parent else None,
            )
        if self.webhook:
            await self._readyz()
        if not self.webhook or "--reuse-port" in self.args:
            async def logged_ready() -> bool:
                self._check_alive()
                return self.log_text().count("ready after") > earlier

            await poll(logged_ready, timeout=self.ready_timeout, what=f"dra-quota serve ({self.log.name}) ready")
        self.ready_seconds = time.monotonic() - started

    async def _readyz(self) -> None:
        """Poll `/readyz` over HTTPS until it answers 200, as a kubelet's readiness probe would."""
        if self.self_managed:
            # Readiness only: whether the certificate is right is the API server's to judge.
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        else:
            # Verify the chain against the test CA; the certificate names the Service, not 127.0.0.1.
            ctx = ssl.create_default_context(cafile=str(self.cluster.ca_file))
            ctx.check_hostname = False
        async with aiohttp.ClientSession() as http:
            async def ready() -> bool:
                self._check_alive()
                try:
                    async with http.get(f"https://127.0.0.1:{self.port}/readyz", ssl=ctx) as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            await poll(ready, timeout=self.ready_timeout, what="dra-quota serve /readyz")

    def exited(self) -> int | None:
        """The exit code, None while it runs (or before it started)."""
        return None if self.process is None else self.process.poll()

    def _check_alive(self) -> None:
        code = self.exited()
        if code is not None:
            raise ServeExited(f"dra-quota serve exited with {code}; its log: {self.log}")

    async def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """One scrape of `--metrics-port`: (sample name, labels) -> value."""
        text = await self.scrape()
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    async def scrape(self) -> str:
        """`GET /metrics` as Prometheus does with the chart's ServiceMonitor: HTTPS (the test
        CA; the certificate names the Service, not 127.0.0.1) and a bearer token."""
        if not self.metrics_token:
            self.metrics_token = await metrics_reader_token(self.cluster)
        ctx = ssl.create_default_context(cafile=str(self.cluster.ca_file))
        ctx.check_hostname = False
        if self.self_managed:
            ctx.verify_mode = ssl.CERT_NONE  # serve's own CA, not the test one
        headers = {"Authorization": f"Bearer {self.metrics_token}"}
        async with aiohttp.ClientSession() as http, http.get(f"https://127.0.0.1:{self.metrics_port}/metrics",
                                                             ssl=ctx, headers=headers) as resp:
            text = await resp.text()
            assert resp.status == 200, (resp.status, text)
        return text

    def _own_lease(self) -> tuple[str, ...]:
        """Unless `args` choose a Lease, `lease` in `default` (which always exists): not
        shared with other processes, so this one leads at once and its controller,
        requeueing and usage metrics run."""
        if any(a.startswith("--leader-election-") for a in self.args):
            return ()
        return ("--leader-election-namespace", "default", "--leader-election-lease-name", self.lease)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else "(no log)"

    @contextlib.contextmanager
    def log_on_failure(self) -> Iterator[None]:
        """Attach the process's log to any failure inside (it shows in a test report)."""
        try:
            yield
        except BaseException as err:
            err.add_note(f"--- dra-quota serve log ({self.log}) ---\n{self.log_text()[-20000:]}")
            raise

    async def terminate(self, timeout: float = 60.0) -> tuple[int, float]:
        """SIGTERM; the exit code and how long the process took to exit
        (subprocess.TimeoutExpired when it did not within `timeout`: a hang, not a slow
        exit; serve's own grace for reviews in flight is 10 s, and on a busy machine the
        exit is recorded, never bounded, by the tests)."""
        assert self.process is not None
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.to_thread(self.process.wait, timeout)
        except subprocess.TimeoutExpired:
            # Where it hangs, in its log (serve dumps its stacks on SIGUSR1), before the
            # failure shows that log.
            self.process.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(self.process.wait, 2.0)
            raise
        return code, time.monotonic() - started

    async def kill(self) -> None:
        """SIGKILL (no clean shutdown) and reap it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            await asyncio.to_thread(self.process.wait)

    def stop(self, timeout: float = 10.0) -> None:
        """Outside an event loop: SIGTERM, then SIGKILL after `timeout`; reaped either way."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def metrics_reader_token(cluster: ControlPlane, *, account: str = METRICS_READER, namespace: str = "default",
                               role: str = METRICS_READER) -> str:
    """A token of ServiceAccount `account` bound to ClusterRole `role`, which (unless it
    exists already) gets only `get` on the non-resource URL /metrics."""
    rbac = "rbac.authorization.k8s.io/v1"
    async with cluster.client() as kube:
        for plural, body in (
            ("clusterroles", {"kind": "ClusterRole", "metadata": {"name": role},
                              "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}),
            ("clusterrolebindings", {"kind": "ClusterRoleBinding", "metadata": {"name": f"{role}-{account}"},
                                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                 "name": role},
                                     "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}),
        ):
            await _create_once(kube, rbac, plural, body)
    return await service_account_token(cluster, account=account, namespace=namespace)


async def service_account_token(cluster: ControlPlane, *, account: str, namespace: str = "default") -> str:
    """A TokenRequest token (1 h) of ServiceAccount `account`, made if missing."""
    async with cluster.client() as kube:
        await _create_once(kube, "v1", "serviceaccounts", {"kind": "ServiceAccount", "metadata": {"name": account}},
                           namespace=namespace)
        answer = await kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                                    body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                          "spec": {"expirationSeconds": 3600}})
    return str(answer["status"]["token"])


async def _create_once(kube: Kube, api_version: str, plural: str, body: dict[str, Any],
                       namespace: str | None = None) -> None:
    try:
        await kube.create(api_version, plural, body, namespace=namespace)
    except ApiError as err:
        if err.status != 409:  # made by an earlier call: shared, never deleted
            raise
