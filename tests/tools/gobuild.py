"""Run one of the Go build scripts for a test fixture: the script (a fast no-op when its
binary is up to date), then the binary's path, or BuildError with the script's last lines.

The scripts (tests/cluster/build.sh, tests/tools/build-*.sh; their shell side is
gobuild.sh) build into <repo>/.cache; a fixture that cannot build fails its tests, never
skips them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class BuildError(RuntimeError):
    pass


def build(script: Path, *args: str, binary: Path, timeout: float = 5400) -> Path:
    """`bash script args...` in the repository; `binary` once it exists and is executable."""
    try:
        proc = subprocess.run(["bash", str(script), *args], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"{script} did not finish within {timeout:.0f}s") from e
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-80:])
        raise BuildError(f"{script} failed with exit code {proc.returncode}:\n{tail}")
    if not os.access(binary, os.X_OK):
        raise BuildError(f"{script} succeeded but {binary} is missing")
    return binary
