"""`dra-quota check` as a user runs it, on a 5,000-node inventory dump: time and peak RSS.

For the dump as JSON (`kubectl get resourceslices -o json`) and as YAML (`-o yaml`),
each run as a separate process of the installed console script:
- load:  only reading the dump (`quota.reports.loader`), as a process of its own;
- inventory: `check -f dump -f classes-and-quotas` (loading + building the inventory);
- total: `check -f dump -f claims.yaml`, 100 claims whose selectors each read a field
  or a literal no other selector does (see bench/check_data.py);
so that load time, inventory build and pricing of never-seen selectors can be told
apart. Wall time is measured around each child, peak RSS is the child's own ru_maxrss
(os.wait4).

Targets (docs/development/performance.md): JSON dump + 100 claims <= 10 s and <= 600 MB; YAML <= 30 s.
Prints a table and writes bench/results/check.json. Not a test: run
`python bench/check.py [--quick] [--nodes N] [--repeat N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_data import write_inputs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
class _Target(TypedDict):
    total_s: float
    rss_mb: float | None  # None: no RSS target for this format


TARGETS: dict[str, _Target] = {"json": {"total_s": 10.0, "rss_mb": 600.0}, "yaml": {"total_s": 30.0, "rss_mb": None}}
_LOAD_ONLY = (
    "import sys, time\n"
    "from quota.reports.loader import iter_documents\n"
    "start = time.perf_counter()\n"
    "count = sum(1 for _ in iter_documents(sys.argv[1:], []))\n"
    "print(f'{count} {time.perf_counter() - start:.3f}')\n"
)


def _command() -> list[str]:
    """The console script next to this interpreter, as a user's shell would find it."""
    script = Path(sys.executable).parent / "dra-quota"
    found = str(script) if script.exists() else shutil.which("dra-quota")
    return [found] if found else [sys.executable, "-m", "commands.cli"]


def _run(argv: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stdout) of one child; fails loudly on exit != 0.

    os.wait4 gives this child's own rusage (RUSAGE_CHILDREN would report the largest
    child so far); output goes through files so that nothing reaps the child first.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{err.read().decode()[-2000:]}")
        return wall, usage.ru_maxrss / 1024, out.read().decode()


def _best(argv: list[str], repeat: int) -> tuple[float, float, str]:
    runs = [_run(argv) for _ in range(repeat)]
    return min(runs, key=lambda r: r[0])


def measure(paths: dict[str, Path], repeat: int) -> dict[str, Any]:
    check = [*_command(), "check", "-o", "json"]
    results: dict[str, Any] = {}
    for fmt in ("json", "yaml"):
        dump = str(paths[fmt])
        load_wall, load_rss, out = _best([sys.executable, "-c", _LOAD_ONLY, dump], repeat)
        objects, load_s = out.split()
        inv_wall, inv_rss, _ = _best([*check, "-f", dump, "-f", str(paths["cluster"])], repeat)
        total_wall, total_rss, report = _best([*check, "-f", dump, "-f", str(paths["claims"])], repeat)
        decided = json.loads(report)["objects"]
        results[fmt] = {
            "dump_mb": round(paths[fmt].stat().st_size / 1e6, 1),
            "objects": int(objects),
            "load_s": float(load_s), "load_process_s": round(load_wall, 2), "load_rss_mb": round(load_rss),
            "inventory_s": round(inv_wall, 2), "inventory_rss_mb": round(inv_rss),
            "total_s": round(total_wall, 2), "total_rss_mb": round(total_rss),
            "claims": len(decided), "claims_allowed": sum(o["allowed"] for o in decided),
            "pricing_s": round(total_wall - inv_wall, 2),
        }
    return results


def _print(results: dict[str, Any], nodes: int) -> None:
    print(f"dra-quota check on a {nodes}-node dump ({sys.executable}, {os.cpu_count()} cores)")
    header = f"{'format':6} {'dump MB':>8} {'load s':>7} {'load RSS':>9} {'+inventory s':>13} " \
             f"{'total s':>8} {'target':>7} {'ratio':>6} {'peak RSS MB':>12} {'target':>7} {'ratio':>6}"
    print(header)
    for fmt, r in results.items():
        target = TARGETS[fmt]
        rss_target = target["rss_mb"]
        rss_ratio = f"{r['total_rss_mb'] / rss_target:.2f}" if rss_target else "-"
        print(f"{fmt:6} {r['dump_mb']:8.1f} {r['load_s']:7.2f} {r['load_rss_mb']:9} {r['inventory_s']:13.2f} "
              f"{r['total_s']:8.2f} {target['total_s']:7.0f} {r['total_s'] / target['total_s']:6.2f} "
              f"{r['total_rss_mb']:12} {rss_target or '-':>7} "
              f"{rss_ratio:>6}")
    print("load s: decoding only, in-process; +inventory s: check on dump + classes/quotas (process);"
          " total: check on dump + 100 never-seen-selector claims (process); pricing = total - inventory")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="500 nodes: a smoke run")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case; the fastest counts")
    parser.add_argument("--cache", type=Path, default=ROOT / ".cache" / "bench")
    args = parser.parse_args()
    nodes = 500 if args.quick else args.nodes
    paths = write_inputs(args.cache, nodes, args.claims)
    results = {"nodes": nodes, "claims": args.claims, "command": " ".join(_command()), **measure(paths, args.repeat)}
    _print({k: v for k, v in results.items() if k in TARGETS}, nodes)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "check.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"results written to {out / 'check.json'}")


if __name__ == "__main__":
    main()
