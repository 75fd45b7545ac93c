"""A real Kueue for the end-to-end tests, run out of cluster against the test control plane.

Kueue's controller-manager (sigs.k8s.io/kueue, built from its Go module by
tests/tools/build-kueue.sh into .cache/kueue with the release's CRDs and webhook
manifests) runs as a local process beside the control plane of :mod:`tests.e2e.cluster`,
so what it does with a Job and its Workload (quota reservation, AdmissionChecks,
unsuspending) is Kueue's own behaviour. conftest.py's session fixture ``kueue`` starts it
only when a test asks for it.

How it is wired (each fact checked against the v0.19.2 source built):
- Configuration ``config.kueue.x-k8s.io/v1beta2`` (:func:`configuration`):
  ``internalCertManagement.enable: false`` (its cert-controller needs an in-cluster Secret
  volume), the webhook server on 127.0.0.1 with a certificate minted here (certs.authority)
  for ``kueue-webhook-service.kueue-system.svc``, health probes on a loopback port, no
  metrics listener (``bindAddress: "0"``), no leader election, only the ``batch/job``
  integration, the ``VisibilityOnDemand`` gate off (its API server would need
  ``/visibility/tls.*``), and ``deviceClassMappings`` for :data:`DEVICE_CLASS` (on 0.19 a
  DeviceClass without a mapping makes a Workload inadmissible).
- Metrics certificates: with internal cert management off, cmd/kueue/main.go always
  watches ``/etc/kueue/metrics/certs/tls.{crt,key}`` (a literal, no flag), even with the
  metrics listener off (the files only have to exist and parse: nothing is served with
  them). Nothing is written to the host's /etc: Kueue runs in a mount namespace of its own
  (:func:`with_private_etc`, util-linux ``unshare``) whose /etc is the host's with an
  overlay from the test's temporary directory, where :func:`write_metrics_certs` puts a
  throw-away pair.
- CRDs from the module's config/components/crd/bases (no conversion webhook stanza: the
  tests use v1beta2, the storage version, only).
- Webhooks: the module's config/components/webhook/manifests.yaml, kept to Kueue's own
  API and batch/v1 Jobs, routed like ours (:func:`adapted_webhooks`): the API server's
  ``--loopback-service`` resolver dials 127.0.0.1:<service port>, TLS checks the
  Service's name against our CA. Every hook requires :data:`NAMESPACE_LABEL` on the
  namespace, so other tests' Jobs never reach Kueue.
- Kueue talks to the API server with the admin kubeconfig (system:masters): its RBAC is
  not under test here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
import yaml

from certs import authority
from devcluster.processes import die_with_parent_process
from tests.tools import gobuild

from .cluster import REPO_ROOT, Component, ControlPlane, free_ports
from .driver import DRIVER, create_device_class
from .kube import Kube, Obj, WaitTimeout, poll

BUILD_SCRIPT = REPO_ROOT / "tests" / "tools" / "build-kueue.sh"
KUEUE_DIR = REPO_ROOT / ".cache" / "kueue"

API = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # pkg/controller/constants/constants.go QueueLabel
NAMESPACE = "kueue-system"
WEBHOOK_SERVICE = "kueue-webhook-service"
# Kueue's job webhooks only see namespaces with this label (tests create them with it).
NAMESPACE_LABEL = "e2e.draquota.io/kueue"
# The DeviceClass Kueue charges (count mode) as the ClusterQueue resource DEVICE_RESOURCE;
# the Configuration is read once at start, so the class has a fixed name for the session.
DEVICE_CLASS = "kueue-e2e-gpu"
DEVICE_RESOURCE = "kueue-e2e-gpu"
# A literal in cmd/kueue/main.go (v0.19.2), used whenever internalCertManagement is off.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")


class KueueError(RuntimeError):
    pass


def build() -> Path:
    """Run tests/tools/build-kueue.sh (a fast no-op when up to date); the binary's path."""
    try:
        return gobuild.build(BUILD_SCRIPT, binary=KUEUE_DIR / "kueue")
    except gobuild.BuildError as e:
        raise KueueError(str(e)) from None


def configuration(*, webhook_port: int, health_port: int, cert_dir: Path) -> Obj:
    """Kueue's Configuration for the test cluster (apis/config/v1beta2/configuration_types.go)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "internalCertManagement": {"enable": False},
        "leaderElection": {"leaderElect": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "integrations": {"frameworks": ["batch/job"]},
        "resources": {"deviceClassMappings": [{"name": DEVICE_RESOURCE, "deviceClassNames": [DEVICE_CLASS]}]},
        "featureGates": {"VisibilityOnDemand": False},
    }


def adapted_webhooks(manifests: Sequence[Obj], *, port: int, ca_pem: bytes) -> list[Obj]:
    """The release's webhook configurations for the test cluster: Kueue's own API and
    batch/v1 Jobs only (the other frameworks are off), the Service the loopback resolver
    dials on `port`, our CA, and :data:`NAMESPACE_LABEL` required on namespaced objects."""
    ca = base64.b64encode(ca_pem).decode()
    configs = []
    for config in copy.deepcopy(list(manifests)):
        config["metadata"]["name"] = f"kueue-{config['metadata']['name']}"
        hooks = []
        for hook in config["webhooks"]:
            groups = {g for rule in hook["rules"] for g in rule["apiGroups"]}
            resources = {r for rule in hook["rules"] for r in rule["resources"]}
            if groups != {"kueue.x-k8s.io"} and (groups, resources) != ({"batch"}, {"jobs"}):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "service": {"namespace": NAMESPACE, "name": WEBHOOK_SERVICE, "port": port, "path": path},
                "caBundle": ca,
            }
            # Ignored for cluster-scoped objects (ClusterQueues, ResourceFlavors, ...).
            hook["namespaceSelector"] = {"matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "Exists"}]}
            hooks.append(hook)
        config["webhooks"] = hooks
        configs.append(config)
    return configs


def write_metrics_certs(etc_upper: Path) -> None:
    """A pair (our throw-away CA's leaf) where Kueue's private /etc shows it at METRICS_CERT_DIR."""
    directory = etc_upper / METRICS_CERT_DIR.relative_to("/etc")
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    ca = authority.new_ca("dra-quota e2e kueue metrics", now=now, validity=timedelta(days=2))
    pair = authority.new_serving(ca, dns_names=["localhost"], now=now, validity=timedelta(days=2))
    for name, data in (("tls.key", pair.key_pem), ("tls.crt", pair.cert_pem)):
        (directory / name).write_bytes(data)
        (directory / name).chmod(0o600)


def with_private_etc(argv: Sequence[str], etc_upper: Path, etc_work: Path) -> list[str]:
    """argv run in a mount namespace of its own, its /etc the host's overlaid with etc_upper:
    what Kueue reads at its fixed paths comes from the test's directory, and nothing it (or
    the test) writes there reaches the host. Root (CI) needs only a new mount namespace;
    another user maps itself to root in a new user namespace first (Linux >= 5.11 for an
    overlay mounted there)."""
    if shutil.which("unshare") is None:
        raise KueueError("Kueue's private /etc needs util-linux's unshare, which is not on PATH")
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare[1:1] = ["--user", "--map-root-user"]
    script = 'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc && shift 2 && exec "$@"'
    return [*unshare, "--", "sh", "-c", script, "sh", str(etc_upper), str(etc_work), *argv]


@dataclass
class Kueue:
    """One Kueue process; :meth:`start` installs what it needs on the cluster first."""

    binary: Path
    workdir: Path
    cluster: ControlPlane
    startup_seconds: float = 0.0
    final_rss: int | None = None
    webhooks: list[Obj] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.webhook_port, self.health_port = free_ports(2)
        self.cert_dir = self.workdir / "webhook-certs"
        self.process = Component("kueue", [], self.workdir / "kueue.log")

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    async def start(self, kube: Kube, timeout: float = 120.0) -> None:
        t0 = time.monotonic()
        await self._install(kube)
        now = datetime.now(UTC)
        ca = authority.new_ca("dra-quota e2e kueue webhook CA", now=now, validity=timedelta(days=2))
        serving = authority.new_serving(ca, dns_names=authority.service_names(WEBHOOK_SERVICE, NAMESPACE),
                                        ip_addresses=["127.0.0.1"], now=now, validity=timedelta(days=2))
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        (self.cert_dir / "tls.crt").write_bytes(serving.cert_pem)
        (self.cert_dir / "tls.key").write_bytes(serving.key_pem)
        etc_upper, etc_work = self.workdir / "etc" / "upper", self.workdir / "etc" / "work"
        etc_work.mkdir(parents=True, exist_ok=True)
        write_metrics_certs(etc_upper)
        config = self.workdir / "kueue-config.yaml"
        config.write_text(yaml.safe_dump(configuration(
            webhook_port=self.webhook_port, health_port=self.health_port, cert_dir=self.cert_dir)))
        self.process.argv = with_private_etc(
            [str(self.binary), f"--config={config}", f"--kubeconfig={self.cluster.kubeconfig}",
             "--zap-log-level=2", "--zap-devel=false"], etc_upper, etc_work)
        env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
        with open(self.log_path, "wb") as log:
            self.process.proc = subprocess.Popen(
                self.process.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                env=env, start_new_session=True, preexec_fn=die_with_parent_process)
        ready = f"http://127.0.0.1:{self.health_port}/readyz"

        async def is_ready() -> bool:
            self.check_alive()
            return await asyncio.to_thread(_http_ok, ready)

        try:
            await poll(is_ready, timeout=max(1.0, timeout - (time.monotonic() - t0)), what="Kueue /readyz")
        except WaitTimeout as e:
            raise KueueError(f"{e}\n{self.log_tail()}") from None
        # Only now: until its webhook server listens, every Kueue object write would fail.
        manifests = [d for d in yaml.safe_load_all((KUEUE_DIR / "webhooks.yaml").read_text()) if d]
        self.webhooks = adapted_webhooks(manifests, port=self.webhook_port, ca_pem=ca.cert_pem)
        for hook_config in self.webhooks:
            await kube.create("admissionregistration.k8s.io/v1", _plural(hook_config), hook_config)
        self.startup_seconds = time.monotonic() - t0

    async def stop(self, kube: Kube) -> None:
        for hook_config in self.webhooks:
            await kube.delete("admissionregistration.k8s.io/v1", _plural(hook_config), hook_config["metadata"]["name"])
        proc = self.process.proc
        if proc is not None and proc.poll() is None:
            self.final_rss = self.process.rss_bytes()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def check_alive(self) -> None:
        """Raise if Kueue has exited (a crash would otherwise look like a test timeout)."""
        code = self.process.exited()
        if code is not None:
            raise KueueError(f"Kueue exited with code {code}\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        return f"===== kueue {self.log_path} =====\n{self.process.log_tail(lines)}"

    async def _install(self, kube: Kube) -> None:
        """Kueue's CRDs (Established), its namespace and the DeviceClass its Configuration maps."""
        names = []
        for path in sorted((KUEUE_DIR / "crd").glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            await kube.create("apiextensions.k8s.io/v1", "customresourcedefinitions", crd)
            names.append(crd["metadata"]["name"])
        for name in names:
            await kube.wait_for_condition("apiextensions.k8s.io/v1", "customresourcedefinitions", name,
                                          "Established", timeout=60)
        await kube.create("v1", "namespaces", {"kind": "Namespace", "metadata": {"name": NAMESPACE}})
        await create_device_class(kube, DEVICE_CLASS, driver=DRIVER)


def _plural(webhook_config: Obj) -> str:
    return {"MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
            "ValidatingWebhookConfiguration": "validatingwebhookconfigurations"}[webhook_config["kind"]]


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_ok(url: str) -> bool:
    try:
        with _NO_PROXY.open(url, timeout=5) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def condition(obj: Obj, kind: str) -> Obj | None:
    """``status.conditions[type == kind]`` or None."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None
