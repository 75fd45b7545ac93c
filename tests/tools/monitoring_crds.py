"""The Prometheus Operator's CRDs (monitoring.coreos.com/v1), for the chart's monitoring objects.

The chart's ServiceMonitor and PrometheusRule (metrics.serviceMonitor/prometheusRule) are
custom resources: the API server validates them only against the operator's CRD schemas.
Those come from the operator's own Go module, as Kueue's CRDs come from Kueue's
(tests/tools/build-kueue.sh): `go mod download` fetches the release from the Go module
proxy, checked against the checksum database, into GOMODCACHE (a no-op once there), and
the CRDs are read from the module's example/prometheus-operator-crd/. Nothing of it is
committed. No Go: a MonitoringCrdError with the reason (the tests fail, never skip).

Why v0.85.0: the newest release the module proxy serves here (`go list -m ...@latest`);
its CRDs serve monitoring.coreos.com/v1, the version the chart renders.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

MODULE = "github.com/prometheus-operator/prometheus-operator"
VERSION = "v0.85.0"
# The CRDs the chart's objects need, as named in the module.
NAMES = ("monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml")


class MonitoringCrdError(RuntimeError):
    pass


@cache
def monitoring_crds(timeout: float = 600) -> tuple[Path, ...]:
    """The ServiceMonitor and PrometheusRule CRD files of the operator's module (fetched now if needed)."""
    go = shutil.which("go")
    if go is None:
        raise MonitoringCrdError(f"go is not on PATH: it fetches {MODULE}@{VERSION} (the CRDs) from the module proxy")
    # GOFLAGS from the environment (e.g. -mod=vendor) must not apply; no toolchain download.
    env = {**os.environ, "GOFLAGS": "", "GOTOOLCHAIN": "local"}
    try:
        proc = subprocess.run([go, "mod", "download", "-json", f"{MODULE}@{VERSION}"], env=env, capture_output=True,
                              text=True, timeout=timeout, check=False, cwd=Path(__file__).parent)
    except subprocess.TimeoutExpired as err:
        raise MonitoringCrdError(f"go mod download {MODULE}@{VERSION} did not finish within {timeout:.0f}s") from err
    try:
        answer = json.loads(proc.stdout)
    except json.JSONDecodeError:
        answer = {}
    if proc.returncode != 0 or "Dir" not in answer:
        raise MonitoringCrdError(f"go mod download {MODULE}@{VERSION} failed ({proc.returncode}): "
                                 f"{answer.get('Error') or proc.stderr.strip() or proc.stdout.strip()}")
    paths = tuple(Path(answer["Dir"]) / "example" / "prometheus-operator-crd" / name for name in NAMES)
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise MonitoringCrdError(f"{MODULE}@{VERSION} has no {', '.join(map(str, missing))}")
    return paths
