"""The durations the end-to-end tests measure but never assert, beside their targets.

Each was once a bar inside a test (test_fleet's p99 <= 1 s failed a fresh CI at 5.651 s,
load average 5): the tests now keep only their correctness assertions and record the
figures (tests/e2e/timings.py). This runs those tests on the real control plane and prints
every figure with the load average when it was measured and whether it met its target:

    python bench/e2e_timings.py                 # every test that records a figure (~5 min)
    python bench/e2e_timings.py -k fleet        # pytest's -k, to pick some

Results: bench/results/e2e-timings-<time>.json. A MISSED target is a number to look at,
not a failure: compare it with the load average first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.e2e.timings import TIMINGS_ENV, Figure, render  # noqa: E402

# The test files that call tests.e2e.timings.record.
FILES = ["test_fleet.py", "test_serve.py", "test_controller.py", "test_crash_safety.py", "test_requeue.py"]


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", default="", help="pytest -k expression")
    args = parser.parse_args()
    out = ROOT / "bench" / "results" / f"e2e-timings-{time.strftime('%Y%m%dT%H%M%S')}.json"
    print(f"e2e timings: {os.cpu_count()} cores, load average {load_average()} before", flush=True)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               *(str(ROOT / "tests" / "e2e" / f) for f in FILES), *(["-k", args.k] if args.k else [])]
    proc = subprocess.run(command, cwd=ROOT, env={**os.environ, TIMINGS_ENV: str(out)},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not out.exists():
        print(proc.stdout[-4000:])
        print(f"no figures recorded (pytest exit {proc.returncode})")
        return 1
    for entry in json.loads(out.read_text()):
        print(render(Figure(**{**entry, "load": tuple(entry["load"])})))
    print(f"pytest exit {proc.returncode}; load average {load_average()} after; written to {out}")
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
