"""The long fuzz run: every fuzz suite of the tests, with many more examples.

The suites in tests/ run a few hundred examples each in CI; each reads the example
count from DRA_QUOTA_FUZZ_EXAMPLES (`fuzz_examples` in tests/unit/bounds.py) and runs every example under `tests/unit/bounds.py`
(a time bound and a memory bound: a hang or a blow-up fails the example). This script
finds those suites, runs them with a large count through pytest, and reports how many
inputs each tried and how many failed (a traceback, a hang, an allocation over the
bound), from hypothesis' own statistics.

    python bench/fuzz.py                 # 5,000 examples per fuzz test
    python bench/fuzz.py --examples 500  # a quicker pass
    python bench/fuzz.py --match fuzz_app --examples 20000  # only the suites whose path holds "fuzz_app"

Writes bench/results/fuzz.json (fuzz-<match>.json with --match).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = "DRA_QUOTA_FUZZ_EXAMPLES"
# hypothesis --hypothesis-show-statistics: "  - during generate phase (1.23 seconds):
#     - Typical runtimes: ..., of which ... in data generation
#     - 500 passing, 0 failing, and 12 invalid test cases"
_TEST = re.compile(r"^(tests/\S+::\S+):$")
_COUNTS = re.compile(r"(\d+) passing, (\d+) failing, and (\d+) invalid")
_PHASE = re.compile(r"during (\w+) phase")
_ERRORS = re.compile(r"Found (\d+) distinct errors? in this phase")


def suites(match: str = "") -> list[str]:
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if match in str(path.relative_to(ROOT)) and "fuzz_examples(" in path.read_text(encoding="utf-8"):
            found.append(str(path.relative_to(ROOT)))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=5000)
    parser.add_argument("--match", default="", help="only the suites whose path contains this")
    args = parser.parse_args()
    files = suites(args.match)
    if not files:
        sys.exit(f"no test file{' matching ' + repr(args.match) if args.match else ''} calls tests/unit/bounds.fuzz_examples")
    env = {**os.environ, ENV: str(args.examples)}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics",
         *files],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    seconds = time.monotonic() - started
    per_test: dict[str, list[int]] = {}
    current, phase = None, ""
    for line in proc.stdout.splitlines():
        if (m := _TEST.match(line.strip())) is not None:
            current = m.group(1)
            per_test.setdefault(current, [0, 0, 0])
        elif (m := _PHASE.search(line)) is not None:
            phase = m.group(1)
        elif current is None:
            continue
        elif (m := _COUNTS.search(line)) is not None and phase != "shrink":
            # Inputs tried: the explicit, reuse and generate phases; shrinking replays
            # variants of one failure and would inflate both counts.
            per_test[current][0] += int(m.group(1)) + int(m.group(2))
            per_test[current][2] += int(m.group(3))
        elif (m := _ERRORS.search(line)) is not None:
            per_test[current][1] += int(m.group(1))
    tried = sum(t for t, _, _ in per_test.values())
    failing = sum(f for _, f, _ in per_test.values())
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
    print(f"{'test':90} {'tried':>8} {'errors':>8} {'invalid':>8}")
    for name, (p, f, i) in sorted(per_test.items()):
        print(f"{name[-90:]:90} {p:8} {f:8} {i:8}")
    summary = (f"{len(per_test)} fuzz tests, {tried} inputs tried, {failing} distinct errors "
               f"(tracebacks, hangs or allocations over the per-example bound), pytest exit {proc.returncode}, "
               f"{seconds:.0f} s, peak RSS of the run {rss} MiB")
    print(summary)
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    # A partial run (--match) does not replace the record of the full one.
    name = f"fuzz-{re.sub(r'[^A-Za-z0-9_.-]', '_', args.match)}.json" if args.match else "fuzz.json"
    (out / name).write_text(json.dumps({
        "examples_per_test": args.examples, "tests": per_test, "tried": tried, "failing": failing,
        "exit": proc.returncode, "seconds": round(seconds), "peak_rss_mib": rss,
    }, indent=2))
    return 0 if proc.returncode == 0 and failing == 0 and tried else 1


if __name__ == "__main__":
    sys.exit(main())
