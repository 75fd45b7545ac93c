"""The minik8s binary the control plane runs: `MINIK8S_BIN`, or built from a source checkout.

Neighbours: `devcluster.controlplane` runs what `build` returns; `commands.demo` locates
it with progress (and says when none can be had: `NOT_A_CHECKOUT`); tests/cluster/build.sh
builds it with Go. `ControlPlaneError` is every failure of the control plane, building
included.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from devcluster.processes import tail

# Where a source checkout (an editable install) keeps the Go build and its output. In an
# installed copy these name nothing that exists (site-packages holds no tests/ or .cache/):
# the control plane is built only from a checkout, the one thing here that needs one.
_CHECKOUT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = _CHECKOUT / "tests" / "cluster" / "build.sh"
DEFAULT_BINARY = _CHECKOUT / ".cache" / "minik8s"
NOT_A_CHECKOUT = (
    "this dra-quota is an installed copy, not a source checkout: the local control plane is built from "
    "a clone of the repository (`pip install -e .` there, then `dra-quota demo`: tests/cluster/build.sh "
    "builds it with Go >= 1.26), or set MINIK8S_BIN to a built minik8s binary"
)


class ControlPlaneError(RuntimeError):
    pass


def build(timeout: float = 3600, *, cancel: threading.Event | None = None) -> Path:
    """Run tests/cluster/build.sh (a fast no-op when up to date) and return the binary path.

    The build runs in a process group of its own, stopped (the script and every Go
    process under it) when `cancel` is set, on a timeout, or when this raises: a caller
    interrupted while a cold build runs (a SIGINT to its pid alone, which the build's
    processes never see) returns within seconds instead of when the build ends."""
    override = os.environ.get("MINIK8S_BIN")
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise ControlPlaneError(f"MINIK8S_BIN={override} is not an executable file")
        return path
    if not in_checkout():
        raise ControlPlaneError(NOT_A_CHECKOUT)
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: nobody reads while it runs
        proc = subprocess.Popen(["bash", str(BUILD_SCRIPT)], cwd=_CHECKOUT, stdout=log,
                                stderr=subprocess.STDOUT, text=True, process_group=0)
        try:
            while True:
                try:
                    code = proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    if cancel is not None and cancel.is_set():
                        raise ControlPlaneError(f"{BUILD_SCRIPT} was interrupted") from None
                    if time.monotonic() > deadline:
                        raise ControlPlaneError(f"{BUILD_SCRIPT} did not finish within {timeout:.0f}s") from None
        finally:
            _stop_build(proc)
        log.seek(0)
        output = log.read()
    if code != 0:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed with exit code {code}:\n{tail(output, 80)}")
    if not os.access(DEFAULT_BINARY, os.X_OK):
        raise ControlPlaneError(f"{BUILD_SCRIPT} succeeded but {DEFAULT_BINARY} is missing")
    return DEFAULT_BINARY


def _stop_build(proc: subprocess.Popen[str], grace: float = 5.0) -> None:
    """Stop the build's process group: SIGTERM (Go and bash exit on it), SIGKILL after `grace`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def in_checkout() -> bool:
    """Whether this module runs from a source checkout, where the control plane can be built."""
    return BUILD_SCRIPT.is_file()
