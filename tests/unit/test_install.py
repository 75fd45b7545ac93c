"""An installed copy runs without the source tree: what it reads is package data.

The project is built as the Dockerfile builds it, from only what the Dockerfile copies
(pyproject.toml, README.md and the packages), and installed non-editable into a target
directory (offline: no index, the test venv's setuptools). Every command then runs from
a directory outside the checkout, with that directory first on the import path, so
nothing can be found through the checkout: `--version`, `check` on a copied example,
the modules that read package data (the CRD, the webhook configurations, the examples),
`demo`, which without a checkout says how to get the live demo and runs `check` on the
packaged examples, and every package's py.typed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from devcluster.binary import NOT_A_CHECKOUT

ROOT = Path(__file__).resolve().parents[2]
# What the build stage of the Dockerfile copies: `COPY <name> ./<name>` and `COPY <files> ./`.
COPIED = re.compile(r"^COPY (?:([\w.]+(?: [\w.]+)*) \./|([\w]+) \./\2)$", re.M)
PACKAGES = [p.rstrip("*") for p in
            tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]]


def dockerfile_context() -> list[str]:
    """What the image is built from (test_chart.py checks the packages are all there)."""
    names: list[str] = []
    for files, directory in COPIED.findall((ROOT / "Dockerfile").read_text()):
        names.extend(files.split() if files else [directory])
    return names


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target directory holding the installed distribution."""
    source, target = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("site")
    for name in dockerfile_context():
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
                    "--no-deps", "--no-build-isolation", "--target", str(target), str(source)],
                   check=True, cwd=source, capture_output=True, timeout=600)
    return target


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory outside the checkout."""
    assert not tmp_path.resolve().is_relative_to(ROOT)
    return tmp_path


def run(installed: Path, cwd: Path, *argv: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MINIK8S_BIN")}
    env["PYTHONPATH"] = str(installed)  # before site-packages, where the checkout's editable install is
    if path is not None:
        env["PATH"] = path
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_version(installed: Path, elsewhere: Path) -> None:
    done = run(installed, elsewhere, str(installed / "bin" / "dra-quota"), "--version")
    assert (done.returncode, done.stdout) == (0, f"dra-quota {metadata.version('dra-quota')}\n"), done.stderr


def test_check_on_copied_examples(installed: Path, elsewhere: Path) -> None:
    copied = shutil.copytree(ROOT / "examples", elsewhere / "cluster")
    done = run(installed, elsewhere, str(installed / "bin" / "dra-quota"), "check", "-f", str(copied), "-o", "json")
    assert done.returncode == 0, done.stderr
    h200 = next(o for o in json.loads(done.stdout)["objects"] if o["name"] == "h200-pair")
    assert h200["allowed"] is False and "exceeded DeviceQuota" in h200["reason"]


# Imports the modules that read package data, calls what reads it, and says where each came from.
READ_PACKAGE_DATA = """
import json, sys
import commands.demoplan, devcluster.webhooks, quota.manifests
modules = [m for name, m in sys.modules.items() if name.split(".")[0] in sys.argv[1:]]
print(json.dumps({
    "files": sorted(m.__file__ for m in modules if getattr(m, "__file__", None)),
    "crd": quota.manifests.crd(),
    "webhooks": quota.manifests.webhook_configurations(),
    "examples": {f.name: f.read_text() for f in commands.demoplan.examples().iterdir()},
}))
"""


def test_the_modules_that_read_package_data_find_it(installed: Path, elsewhere: Path) -> None:
    done = run(installed, elsewhere, sys.executable, "-c", READ_PACKAGE_DATA, *PACKAGES)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["files"] and all(Path(f).is_relative_to(installed) for f in found["files"])
    assert found["crd"] == yaml.safe_load((ROOT / "deploy" / "crds" / "devicequota.yaml").read_text())
    assert found["webhooks"] == [d for d in yaml.safe_load_all((ROOT / "deploy" / "manifests" / "webhooks.yaml")
                                                               .read_text()) if d]
    assert found["examples"] == {p.name: p.read_text() for p in sorted((ROOT / "examples").glob("*.yaml"))}


def test_demo_without_a_checkout_says_so_and_checks_the_packaged_examples(installed: Path, elsewhere: Path) -> None:
    bare = elsewhere / "bin"  # no `go`: nothing could be built, even with a checkout
    bare.mkdir()
    done = run(installed, elsewhere, str(installed / "bin" / "dra-quota"), "demo", path=str(bare))
    assert done.returncode == 0, done.stderr
    assert NOT_A_CHECKOUT in done.stderr
    row = next(line for line in done.stdout.splitlines() if " h200-pair " in line)
    assert "DENIED" in row
    assert "Traceback" not in done.stderr


def test_every_package_is_typed(installed: Path) -> None:
    assert [p for p in PACKAGES if not (installed / p / "py.typed").is_file()] == []
