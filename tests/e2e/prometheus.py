"""A real Prometheus on loopback for the end-to-end tests, and a stand-in for dcgm-exporter.

`Prometheus` runs Debian's `prometheus` binary (.ci/prometheus.sh installs it; a test
fails, never skips, without it) with its own config and TSDB in a temp dir, a 1 s scrape
and rule-evaluation interval, listening on 127.0.0.1:<free port>; `query` evaluates PromQL
through its HTTP API (/api/v1/query), as Grafana and the rule engine would.

`chart_reader_token` and `as_the_operator_scrapes` scrape `serve` as the Prometheus
Operator scrapes the chart's ServiceMonitor (HTTPS, a token of the chart's metrics-reader
role, honorLabels).

`dcgm_exporter` serves what NVIDIA dcgm-exporter serves for whole GPUs, by its metric
and label names (NVIDIA/dcgm-exporter: etc/default-counters.csv for the fields,
pkg/dcgmexporter/render_metrics.go for the labels gpu, UUID, device, modelName, Hostname,
then the pod-mapping labels container, namespace, pod, empty when no pod is mapped). No
GPU exists on this machine: its values are the test's, for the UUIDs the fake driver
publishes, so the dashboard's join can be checked, not the exporter.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from devcluster.served import Served, metrics_reader_token

from ..tools.chart import find, render
from .cluster import free_ports
from .kube import ApiError, Kube, poll

Sample = dict[str, Any]  # {"metric": {labels}, "value": [ts, "v"]}


@dataclass
class Prometheus:
    directory: Path
    targets: Mapping[str, str]  # job name -> host:port
    rule_files: tuple[Path, ...] = ()
    # job name -> more of its scrape config ("labels": target labels, anything else as is,
    # e.g. honor_labels)
    jobs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    port: int = 0
    process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _job(self, job: str, target: str) -> dict[str, Any]:
        extra = dict(self.jobs.get(job, {}))
        labels = extra.pop("labels", {})
        return {"job_name": job, "static_configs": [{"targets": [target], **({"labels": labels} if labels else {})}],
                **extra}

    async def start(self) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is not installed: run .ci/prometheus.sh (Debian's 'prometheus' package)")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_ports(1)[0]
        config = self.directory / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(f) for f in self.rule_files],
            "scrape_configs": [self._job(job, target) for job, target in self.targets.items()],
        }))
        with (self.directory / "prometheus.log").open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                binary, f"--config.file={config}", f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
                stdout=log, stderr=asyncio.subprocess.STDOUT, cwd=self.directory)
        process = self.process
        async with aiohttp.ClientSession() as http:
            async def ready() -> bool:
                if process.returncode is not None:
                    raise AssertionError(f"prometheus exited with {process.returncode}: {self.log_text()}")
                try:
                    async with http.get(f"{self.url}/-/ready") as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            await poll(ready, timeout=60, what="prometheus /-/ready")

    def log_text(self) -> str:
        log = self.directory / "prometheus.log"
        return log.read_text(errors="replace")[-5000:] if log.exists() else "(no log)"

    async def api(self, path: str, **params: str) -> Any:
        async with aiohttp.ClientSession() as http, http.get(f"{self.url}/api/v1/{path}", params=params) as resp:
            body = await resp.json()
        if body.get("status") != "success":
            raise AssertionError(f"prometheus /api/v1/{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    async def query(self, expr: str) -> list[Sample]:
        """An instant query at now; a query Prometheus refuses raises with its error."""
        data = await self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        result: list[Sample] = data["result"]
        return result

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


# -- scraping serve as the Prometheus Operator scrapes the chart's ServiceMonitor ------------


MONITORED = {"metrics": {"serviceMonitor": {"enabled": True}}}


async def chart_reader_token(kube: Kube, served: Served) -> str:
    """A token of a ServiceAccount bound to the chart's metrics-reader ClusterRole (what
    metrics.readers binds Prometheus' account to), the role created from the chart."""
    role = find(render(MONITORED, include_crds=False), "ClusterRole", "dra-quota-metrics-reader")
    try:
        await kube.create("rbac.authorization.k8s.io/v1", "clusterroles", role)
    except ApiError as err:
        if err.status != 409:
            raise
    return await metrics_reader_token(served.cluster, account="prometheus-e2e", role=role["metadata"]["name"])


def as_the_operator_scrapes(token_file: Path, ca_file: Path) -> dict[str, Any]:
    """The scrape the Prometheus Operator makes of the chart's ServiceMonitor: its endpoint's
    scheme, TLS server name (the CA: `ca_file`, standing in for the serving Secret's
    ca.crt), bearer token (Prometheus' own account token: `token_file`), honorLabels, and
    the target labels the operator's relabelling adds to every target (namespace,
    service, pod, container; prometheus-operator pkg/prometheus/promcfg.go). The
    per-namespace answers below hold only while honorLabels keeps our own `namespace` and
    `pod` (docs/install.md, "Monitoring")."""
    monitor = find(render(MONITORED, include_crds=False), "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "dra-quota-webhook-tls", "key": "ca.crt"}
    return {"honor_labels": endpoint["honorLabels"], "metrics_path": endpoint["path"], "scheme": endpoint["scheme"],
            "tls_config": {"ca_file": str(ca_file), "server_name": endpoint["tlsConfig"]["serverName"]},
            "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
            "labels": {"namespace": monitor["metadata"]["namespace"], "service": "dra-quota-webhook",
                       "pod": "dra-quota-5d8f7c9b6-x2x7q", "container": "dra-quota"}}


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    host: str
    model: str
    utilisation: float  # DCGM_FI_DEV_GPU_UTIL, %
    memory_used_mib: float  # DCGM_FI_DEV_FB_USED, MiB


def dcgm_exposition(gpus: list[Gpu]) -> str:
    lines = []
    series: tuple[tuple[str, str, Callable[[Gpu], float]], ...] = (
            ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.utilisation),
            ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: g.memory_used_mib))
    for field, help_text, value in series:
        lines += [f"# HELP {field} {help_text}", f"# TYPE {field} gauge"]
        for g in gpus:
            labels = (f'gpu="{g.index}",UUID="{g.uuid}",device="nvidia{g.index}",modelName="{g.model}",'
                      f'Hostname="{g.host}",container="",namespace="",pod=""')
            lines.append(f"{field}{{{labels}}} {value(g)}")
    return "\n".join(lines) + "\n"


@contextlib.asynccontextmanager
async def dcgm_exporter(gpus: list[Gpu]) -> AsyncIterator[str]:
    """Serve `gpus` at http://127.0.0.1:<port>/metrics; yields "127.0.0.1:<port>"."""
    body = dcgm_exposition(gpus)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        port = free_ports(1)[0]
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()
