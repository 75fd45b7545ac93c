"""How fast every `dra-quota` command starts: wall and CPU time of whole processes.

Each case runs as a process of the installed console script, as a user's shell starts
it, several times; the table prints the median and the minimum of wall time and of CPU
time (user + system of the child, from os.wait4), the target (on an idle core, in
docs/development/performance.md), and the load average before and after (other work on
the machine inflates wall time first; CPU time moves less).

Cases:
- `python -c pass`: the interpreter alone, the floor (and a gauge of how busy the
  machine is: about 0.02 s of CPU on an idle core);
- `--help`: parsing only (no subcommand's imports);
- `check -f examples/`: loading the examples, compiling their CEL selectors, admission;
- `top`: one list of DeviceQuotas from an API server. By default a loopback stand-in
  answers it (plain HTTP on 127.0.0.1, one DeviceQuota), so what is measured is the
  client's start-up, not a cluster; `--kubeconfig FILE` measures against a real one.

Bytecode: the children run with PYTHONDONTWRITEBYTECODE unset, so the warm-up run of
each case writes the `.pyc` files an installed package has (pip compiles them at
install, also in the image); a source checkout run with PYTHONDONTWRITEBYTECODE=1
compiles every module on every start instead (about twice the time).

Not a test: run `python bench/cli.py [--repeat N] [--kubeconfig FILE]`.
Writes bench/results/cli.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Seconds on an idle core (docs/development/performance.md): every command starts at once.
TARGETS = {"--help": 0.3, "check -f examples/": 0.6, "top": 1.0}
_QUOTAS = {
    "kind": "DeviceQuotaList", "apiVersion": "draquota.io/v1alpha1", "metadata": {"resourceVersion": "1"},
    "items": [{
        "kind": "DeviceQuota", "apiVersion": "draquota.io/v1alpha1",
        "metadata": {"name": "gpus", "namespace": "team-a", "generation": 1, "uid": "u1"},
        "spec": {"hard": {"memory": "320Gi", "devices": 8}},
        "status": {"observedGeneration": 1, "used": {"memory": "160Gi", "devices": 2},
                   "reserved": {"memory": "0", "devices": 0}, "claims": {"allocated": 1, "pending": 0}},
    }],
}


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _command() -> list[str]:
    """The console script next to this interpreter, as a user's shell would find it."""
    script = Path(sys.executable).parent / "dra-quota"
    found = str(script) if script.exists() else shutil.which("dra-quota")
    return [found] if found else [sys.executable, "-m", "commands.cli"]


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one child; fails loudly on exit != 0."""
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=out, cwd=ROOT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            out.seek(0)
            raise SystemExit(f"{' '.join(argv)} failed:\n{out.read().decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


class _Api(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps(_QUOTAS).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def stand_in(folder: Path) -> Iterator[Path]:
    """A kubeconfig naming a loopback API server that lists one DeviceQuota."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
    }))
    try:
        yield kubeconfig
    finally:
        server.shutdown()
        server.server_close()


def measure(repeat: int, kubeconfig: Path) -> dict[str, dict[str, float]]:
    command = _command()  # the console script, as a user's shell starts it
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"KUBECONFIG": str(kubeconfig)}
    cases = {"python -c pass": [sys.executable, "-c", "pass"], "--help": [*command, "--help"],
             "check -f examples/": [*command, "check", "-f", "examples/"], "top": [*command, "top"]}
    results: dict[str, dict[str, float]] = {}
    for name, args in cases.items():
        _run(args, env)  # warm the page cache and the .pyc files
        runs = [_run(args, env) for _ in range(repeat)]
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        results[name] = {"wall_median_s": statistics.median(walls), "wall_min_s": min(walls),
                         "cpu_median_s": statistics.median(cpus), "cpu_min_s": min(cpus),
                         "target_s": TARGETS.get(name, float("nan"))}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs per case (default 7)")
    parser.add_argument("--kubeconfig", type=Path, help="measure `top` against this cluster (default: a loopback "
                                                         "stand-in)")
    args = parser.parse_args()
    before = load_average()
    with tempfile.TemporaryDirectory() as folder:
        if args.kubeconfig is not None:
            results = measure(args.repeat, args.kubeconfig)
        else:
            with stand_in(Path(folder)) as kubeconfig:
                results = measure(args.repeat, kubeconfig)
    after = load_average()
    print(f"dra-quota start-up, {args.repeat} runs each ({' '.join(_command())}, {os.cpu_count()} cores); "
          f"load average {before} before, {after} after")
    print(f"{'command':20} {'wall median':>12} {'wall min':>9} {'CPU median':>11} {'CPU min':>8} {'target':>7}")
    for name, r in results.items():
        print(f"{name:20} {r['wall_median_s']:12.3f} {r['wall_min_s']:9.3f} {r['cpu_median_s']:11.3f} "
              f"{r['cpu_min_s']:8.3f} {r['target_s']:7.1f}".replace("nan", "  -"))
    print("seconds; CPU = user + system of the process; targets hold on an idle core")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "cli.json").write_text(json.dumps({"load_average": [before, after], **results}, indent=2) + "\n")
    print(f"results written to {out / 'cli.json'}")


if __name__ == "__main__":
    main()
