"""Start and stop the minik8s control plane (tests/cluster) on loopback.

One process per component (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler), each in its own process group, all bound to 127.0.0.1 on free
ports, each logging to ``<workdir>/logs/<component>.log``. Readiness is polled
with deadlines; a component that exits early fails the start-up at once with its log.

Flags follow tests/cluster/README.md (derived from envtest's
pkg/internal/testing/controlplane, kubeadm's static pod manifests and
k8s.io/kubernetes 1.37 cmd/*/app/options); the reasons are next to each flag.
Nothing here is pytest-specific: the e2e tests (tests/e2e/cluster.py re-exports it) and
`dra-quota demo` (commands/demo.py) start the same cluster. `devcluster.binary` builds or
finds the binary it runs; `devcluster.processes` has each component's process (`Component`),
the free ports and the parent-death signal.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devcluster.binary import ControlPlaneError
from devcluster.kube import Kube
from devcluster.processes import Component, die_with_parent_process, free_ports

# Webhook Service names the test certificate is valid for. The apiserver's
# webhook client verifies ServerName "<name>.<namespace>.svc"
# (k8s.io/apiserver/pkg/util/webhook/client.go) even though --loopback-service
# makes it dial 127.0.0.1, so a test webhook must use one of these references.
WEBHOOK_SERVICES = (
    ("minik8s-system", "test-webhook"),
    ("dra-quota-system", "dra-quota-webhook"),
)

# Keep the KCM to what a kubelet-less cluster can run and the tests need: no
# node-lifecycle / taint-eviction (the fake nodes never post heartbeats, so
# they would be tainted unreachable and their pods evicted), no pod-gc (it
# force-deletes pods of vanished nodes behind a test's back; the fixtures
# delete pods themselves), no node-ipam, endpoint or volume controllers.
# Names from k8s.io/kubernetes cmd/kube-controller-manager/names/controller_names.go (1.37).
KCM_CONTROLLERS = (
    "namespace-controller",
    "garbage-collector-controller",
    "resourcequota-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "resourceclaim-controller",  # ResourceClaimTemplate -> ResourceClaim, reservedFor clean-up
    "device-taint-eviction-controller",  # DRA device taints (GA in 1.37)
    "deployment-controller",
    "replicaset-controller",
    "job-controller",
)

# Audit only what tests assert on, at Metadata (annotations, user, verb, object, code;
# no bodies), once per request (ResponseComplete): writes of DRA claims and templates and
# of namespaces, where admission webhooks put their audit annotations. Reads, watches and
# everything else are not logged, so other tests do not pay for it.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Metadata",
            "verbs": ["create", "update", "patch"],
            "resources": [
                {"group": "resource.k8s.io", "resources": ["resourceclaims", "resourceclaimtemplates"]},
                {"group": "", "resources": ["namespaces", "namespaces/status", "namespaces/finalize"]},
            ],
        },
        {"level": "None"},
    ],
}

# Proxy settings must never route loopback traffic elsewhere (Go already
# bypasses proxies for loopback, but be explicit for every component).
_PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


@dataclass
class ControlPlane:
    binary: Path
    workdir: Path
    # Extra flags by component ("apiserver", "etcd", ...), after the standard ones: e.g.
    # --runtime-config for a test that needs beta APIs served (tests/e2e/test_conversion.py
    # runs a control plane of its own with them).
    extra_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # False: the components outlive the process that started them (`dra-quota demo --keep`);
    # by default they get SIGKILL when it dies, so no orphaned control plane survives a test run.
    die_with_parent: bool = True
    components: list[Component] = field(default_factory=list)
    startup_seconds: float = 0.0
    final_rss: dict[str, int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.certs = self.workdir / "pki"
        self.logs = self.workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        # etcd data on tmpfs when available: it is thrown away anyway and
        # --unsafe-no-fsync already trades durability for speed.
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
        self.etcd_dir = Path(tempfile.mkdtemp(prefix="minik8s-etcd-", dir=base))
        ports = free_ports(6)
        self.etcd_port, self.etcd_peer_port, self.apiserver_port = ports[:3]
        self.kcm_port, self.scheduler_port, self.etcd_metrics_port = ports[3:]
        self.server = f"https://127.0.0.1:{self.apiserver_port}"

    # -- paths ---------------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.certs / "admin.kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.certs / "ca.crt"

    @property
    def admin_cert(self) -> tuple[Path, Path]:
        return self.certs / "admin.crt", self.certs / "admin.key"

    @property
    def webhook_cert(self) -> tuple[Path, Path]:
        """Serving certificate for a test webhook, valid for every name in :data:`WEBHOOK_SERVICES`."""
        return self.certs / "webhook.crt", self.certs / "webhook.key"

    @property
    def audit_policy(self) -> Path:
        return self.workdir / "audit-policy.json"

    @property
    def audit_log(self) -> Path:
        """JSON lines, one audit.k8s.io/v1 Event each (AUDIT_POLICY says which requests)."""
        return self.logs / "audit.log"

    def audit_events(self) -> list[dict[str, Any]]:
        """Every complete event in the audit log so far (a line being written is skipped)."""
        try:
            text = self.audit_log.read_text(errors="replace")
        except FileNotFoundError:
            return []
        events = []
        for line in text.splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events

    def client(self) -> Kube:
        """A new admin (system:masters) :class:`~devcluster.kube.Kube` client; close it when done."""
        cert, key = self.admin_cert
        return Kube(self.server, ca_file=str(self.ca_file), cert_file=str(cert), key_file=str(key))

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> None:
        t0 = time.monotonic()
        deadline = t0 + timeout
        self._mint_certs()
        self._start_etcd(deadline)
        self._start_apiserver(deadline)
        self._start_controller_manager()
        self._start_scheduler()
        admin = self._ssl(client=True)
        self._wait(
            deadline,
            "kube-controller-manager /healthz",
            lambda: _https_ok(f"https://127.0.0.1:{self.kcm_port}/healthz", admin),
        )
        self._wait(
            deadline,
            "kube-scheduler /readyz",
            lambda: _https_ok(f"https://127.0.0.1:{self.scheduler_port}/readyz", admin),
        )
        # Functional readiness: the serviceaccount controller has populated
        # "default" (pods are rejected by the ServiceAccount admission plugin
        # until their namespace has a "default" SA).
        self._wait(
            deadline,
            "ServiceAccount default/default (kube-controller-manager working)",
            lambda: _https_ok(f"{self.server}/api/v1/namespaces/default/serviceaccounts/default", admin),
        )
        self.startup_seconds = time.monotonic() - t0

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every component's process group, SIGKILL stragglers; etcd last.

        etcd goes only after the others have exited: a kube-apiserver whose etcd is gone
        spends ~10 s of its graceful shutdown retrying it (measured), with etcd up it exits in ~1 s.
        """
        if not self.final_rss:
            self.final_rss = self.rss()
        clients = [c for c in reversed(self.components) if c.name != "etcd"]
        for wave in (clients, [c for c in self.components if c.name == "etcd"]):
            for comp in wave:
                if comp.proc is not None and comp.proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(comp.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for comp in wave:
                if comp.proc is None:
                    continue
                try:
                    comp.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(comp.proc.pid, signal.SIGKILL)
                    comp.proc.wait()
        shutil.rmtree(self.etcd_dir, ignore_errors=True)

    def restart_apiserver(self, timeout: float = 120.0, *, while_down: Callable[[], object] = lambda: None) -> float:
        """SIGKILL kube-apiserver (no graceful shutdown: its clients' connections just break),
        call `while_down`, and start it again with the same flags, on the same etcd and
        port, its log appended to; the seconds from the kill until its /readyz answers 200 again."""
        old = next(c for c in self.components if c.name == "apiserver")
        killed = time.monotonic()
        if old.proc is not None and old.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(old.proc.pid, signal.SIGKILL)
            old.proc.wait()
        self.components.remove(old)
        while_down()
        self._popen(Component(old.name, old.argv, old.log_path), mode="ab")
        ctx = self._ssl(client=True)
        self._wait(killed + timeout, "kube-apiserver /readyz after a restart",
                   lambda: _https_ok(f"{self.server}/readyz", ctx))
        return time.monotonic() - killed

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision, physically (as `etcdctl
        compaction --physical`, through etcd's JSON gateway): a watch or list from any older
        resourceVersion is answered 410 Gone from then on. Returns the revision."""
        base = f"http://127.0.0.1:{self.etcd_port}/v3/kv"

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            request = urllib.request.Request(f"{base}/{path}", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            with _NO_PROXY.open(request, timeout=30) as r:
                answer: dict[str, Any] = json.load(r)
                return answer

        revision = int(post("range", {"key": "Lw==", "limit": 1})["header"]["revision"])  # key "/"
        post("compaction", {"revision": revision, "physical": True})
        return revision

    def check_alive(self) -> None:
        """Raise if a component has exited (a crash would otherwise look like a test timeout)."""
        dead = [c for c in self.components if c.exited() is not None]
        if dead:
            raise ControlPlaneError(
                "control-plane component(s) exited: "
                + ", ".join(f"{c.name} (exit {c.exited()})" for c in dead)
                + "\n"
                + self.logs_report()
            )

    def rss(self) -> dict[str, int | None]:
        return {c.name: c.rss_bytes() for c in self.components}

    def logs_report(self, lines: int = 60) -> str:
        parts = []
        for c in self.components:
            state = "running" if c.exited() is None else f"exited {c.exited()}"
            parts.append(f"===== {c.name} (pid {c.pid}, {state}) {c.log_path} =====\n{c.log_tail(lines)}")
        return "\n".join(parts)

    # -- components ----------------------------------------------------------------------------

    def _mint_certs(self) -> None:
        sans = ["127.0.0.1", "localhost"]
        for ns, name in WEBHOOK_SERVICES:
            sans += [f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"]
        argv = [str(self.binary), "certs", "--dir", str(self.certs), "--server", self.server,
                "--webhook-san", ",".join(sans)]  # fmt: skip
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        if proc.returncode != 0:
            raise ControlPlaneError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}")

    def _start_etcd(self, deadline: float) -> None:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        self._spawn(
            "etcd",
            [
                "--name=minik8s",
                f"--data-dir={self.etcd_dir}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=minik8s={peer}",
                # /health and /metrics also on a separate plain-HTTP loopback
                # listener, which the readiness probe uses.
                f"--listen-metrics-urls=http://127.0.0.1:{self.etcd_metrics_port}",
                # Throw-away data: skip fsync as envtest and
                # k8s.io/apiserver/pkg/storage/etcd3/testserver do.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            try:
                with _NO_PROXY.open(f"http://127.0.0.1:{self.etcd_metrics_port}/health", timeout=2) as r:
                    return bool(json.load(r).get("health") == "true")
            except (OSError, ValueError):
                return False

        self._wait(deadline, "etcd /health", healthy)

    def _start_apiserver(self, deadline: float) -> None:
        c = self.certs
        self.audit_policy.write_text(json.dumps(AUDIT_POLICY, indent=1))
        self._spawn(
            "apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--tls-cert-file={c / 'apiserver.crt'}",
                f"--tls-private-key-file={c / 'apiserver.key'}",
                f"--client-ca-file={c / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={c / 'sa.pub'}",
                f"--service-account-signing-key-file={c / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                # RBAC only: no kubelets, so no Node authorizer; system:masters
                # (the test admin) bypasses RBAC, the scheduler and KCM do not.
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                # The default "lease" reconciler would write the advertise
                # address (the host's non-loopback IP) into the kubernetes
                # Service's endpoints; "none" writes nothing.
                "--endpoint-reconciler-type=none",
                # Without it the apiserver derives the advertise address from
                # the default route's interface (a non-loopback IP, and start-up
                # fails on hosts without a default route). 127.0.0.1 is only
                # invalid where it would be written into the kubernetes
                # Endpoints (loopback IPs fail validation,
                # pkg/apis/core/validation/validation.go), which reconciler
                # "none" never does.
                "--advertise-address=127.0.0.1",
                # APF adds queuing and periodic config writes that only cost
                # CPU on a single-client test cluster (envtest does the same).
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                # minik8s flag (tests/cluster/apiserver.go): every Service
                # reference (webhooks, APIServices) is dialled at
                # https://127.0.0.1:<service port>; TLS still verifies
                # "<name>.<namespace>.svc". Nothing is dialled at a ClusterIP.
                "--loopback-service=*/*:*",
                # Audit (AUDIT_POLICY): to prove the audit annotations admission
                # webhooks return land in the audit log. Blocking (the log backend's
                # default, explicit here): each event is written before the request's
                # handler returns, not batched; tests still poll, since the
                # ResponseComplete event may be written after the client read the answer.
                f"--audit-policy-file={self.audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-mode=blocking",
                "--audit-log-format=json",
                "--audit-log-maxsize=0",  # no rotation: audit_events reads one file
            ],
        )
        ctx = self._ssl(client=True)
        self._wait(deadline, "kube-apiserver /readyz", lambda: _https_ok(f"{self.server}/readyz", ctx))

    def _start_controller_manager(self) -> None:
        c = self.certs
        kubeconfig = c / "controller-manager.kubeconfig"
        self._spawn(
            "controller-manager",
            [
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                # Client CA comes from --client-ca-file; skip reading
                # kube-system/extension-apiserver-authentication, whose
                # requestheader CA (front proxy) this cluster does not have:
                # the lookup would log an error every few seconds.
                "--authentication-skip-lookup=true",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.kcm_port}",
                # Serve health checks with a cert the tests can verify (the
                # apiserver cert is valid for 127.0.0.1) instead of an
                # in-memory self-signed one.
                f"--tls-cert-file={c / 'apiserver.crt'}",
                f"--tls-private-key-file={c / 'apiserver.key'}",
                f"--client-ca-file={c / 'ca.crt'}",
                "--leader-elect=false",
                # As kubeadm: each controller runs as its own service account
                # (system:serviceaccount:kube-system:<controller>) with its
                # bootstrap RBAC role, so RBAC gaps surface here as they would
                # in a real cluster.
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={c / 'sa.key'}",
                f"--root-ca-file={c / 'ca.crt'}",
                # Default 5m: far too slow for tests that assert quota usage.
                "--resource-quota-sync-period=10s",
                "--controllers=" + ",".join(KCM_CONTROLLERS),
                "--v=2",
            ],
        )

    def _start_scheduler(self) -> None:
        c = self.certs
        kubeconfig = c / "scheduler.kubeconfig"
        self._spawn(
            "scheduler",
            [
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                # Client CA comes from --client-ca-file; skip reading
                # kube-system/extension-apiserver-authentication, whose
                # requestheader CA (front proxy) this cluster does not have:
                # the lookup would log an error every few seconds.
                "--authentication-skip-lookup=true",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.scheduler_port}",
                f"--tls-cert-file={c / 'apiserver.crt'}",
                f"--tls-private-key-file={c / 'apiserver.key'}",
                f"--client-ca-file={c / 'ca.crt'}",
                "--leader-elect=false",
                # DynamicResources is in the default profile; v=2 logs
                # scheduling attempts and bindings, which failing tests need.
                "--v=2",
            ],
        )

    # -- plumbing ------------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> Component:
        argv = [str(self.binary), name, *args, *self.extra_args.get(name, ())]
        return self._popen(Component(name, argv, self.logs / f"{name}.log"), mode="wb")

    def _popen(self, comp: Component, *, mode: str) -> Component:
        env = {k: v for k, v in os.environ.items() if k not in _PROXY_VARS}
        with open(comp.log_path, mode) as log:
            comp.proc = subprocess.Popen(
                comp.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
                # Own process group: stop() signals the whole group and a
                # Ctrl-C in the terminal does not race the orderly shutdown.
                start_new_session=True,
                preexec_fn=die_with_parent_process if self.die_with_parent else None,
            )
        self.components.append(comp)
        return comp

    def _wait(self, deadline: float, what: str, probe: Callable[[], bool]) -> None:
        interval = 0.05
        while True:
            self.check_alive()
            if probe():
                return
            now = time.monotonic()
            if now >= deadline:
                raise ControlPlaneError(f"timed out waiting for {what}\n{self.logs_report()}")
            time.sleep(min(interval, deadline - now))
            interval = min(interval * 2, 0.5)

    def _ssl(self, *, client: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if client:
            cert, key = self.admin_cert
            ctx.load_cert_chain(str(cert), str(key))
        return ctx


def audit_event(events: list[dict[str, Any]], *, resource: str, name: str, user: str,
                annotation: str) -> dict[str, Any] | None:
    """The first audit event of `user`'s (impersonated) write to `resource` `name` that
    carries `annotation`; dry runs (audited too) are skipped."""
    for event in events:
        ref = event.get("objectRef") or {}
        if (ref.get("resource") == resource and ref.get("name") == name
                and (event.get("impersonatedUser") or {}).get("username") == user
                and "dryRun" not in event.get("requestURI", "")
                and annotation in (event.get("annotations") or {})):
            return event
    return None


# urllib honours *_proxy variables; loopback probes must never go through a proxy.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _https_ok(url: str, ctx: ssl.SSLContext) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
    try:
        with opener.open(url, timeout=5) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False
