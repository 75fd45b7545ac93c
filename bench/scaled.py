"""Run e2e tests at a benchmark's scale and collect what they report: shared by
bench/rolling.py and bench/budget_requeue.py.

Such a test reads its scale from one environment variable and, when another names a file,
appends one JSON object per test to it (the numbers it measured but never asserts). This
runs pytest on them with both set and returns pytest's exit code and those objects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_scaled(tests: list[str], *, scale: tuple[str, str], report_variable: str,
               k: str = "") -> tuple[int, list[dict[str, Any]]]:
    """pytest on `tests` (from the repository's root, `-k k` when given) with `scale`
    (variable, value) set and `report_variable` naming the file they report to."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.jsonl"
        env = {**os.environ, scale[0]: scale[1], report_variable: str(report), "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider",
                               *(["-k", k] if k else [])], cwd=ROOT, env=env)
        lines = report.read_text().splitlines() if report.exists() else []
    return proc.returncode, [json.loads(line) for line in lines]
