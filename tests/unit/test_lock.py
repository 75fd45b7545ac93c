"""requirements/*.lock agree with pyproject.toml (requirements/refresh.sh writes them).

The locks are what .ci/run, the Dockerfile and the README install, with --require-hashes;
pyproject.toml is what a reviewer reads. A dependency added to pyproject but not locked
would fail at install time only on a clean machine, and a pin its specifier no longer
allows would install a version the project says it does not support: both fail here.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_LOCK = ROOT / "requirements" / "runtime.lock"
TEST_LOCK = ROOT / "requirements" / "test.lock"

# `name==version \` then `    --hash=sha256:... \` lines, then `# via` comments.
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True, slots=True)
class Pin:
    version: str
    hashes: frozenset[str]


def parse_lock(text: str) -> dict[str, Pin]:
    """name (canonical) -> its pin; an entry without a hash is kept with none (and fails)."""
    pins: dict[str, Pin] = {}
    name = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pin = _PIN.match(stripped)
        if pin:
            name = canonicalize_name(pin.group(1))
            pins[name] = Pin(pin.group(2), frozenset())
        elif name and (digest := _HASH.search(stripped)):
            pins[name] = Pin(pins[name].version, pins[name].hashes | {digest.group(1)})
        else:
            raise ValueError(f"unexpected lock line: {line!r}")
    return pins


def disagreements(requirements: Iterable[str], lock: dict[str, Pin]) -> list[str]:
    """Each requirement missing from the lock, or pinned at a version it does not allow."""
    problems = []
    for text in requirements:
        req = Requirement(text)
        pin = lock.get(canonicalize_name(req.name))
        if pin is None:
            problems.append(f"{text}: not in the lock")
        elif not req.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{text}: the lock pins {pin.version}")
    return problems


def _pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def _strings(table: object, *keys: str) -> list[str]:
    for key in keys:
        assert isinstance(table, dict), keys
        table = table[key]
    assert isinstance(table, list) and all(isinstance(s, str) for s in table), keys
    return [str(s) for s in table]


def runtime_requirements() -> list[str]:
    """What installing the project needs: its dependencies and its build backend."""
    pyproject = _pyproject()
    return _strings(pyproject, "project", "dependencies") + _strings(pyproject, "build-system", "requires")


def extra_requirements() -> list[str]:
    extras = _pyproject()["project"]
    assert isinstance(extras, dict)
    return [r for extra in extras["optional-dependencies"] for r in _strings(extras, "optional-dependencies", extra)]


STALE = "pyproject.toml and {lock} disagree (run requirements/refresh.sh and commit the locks):\n  "


@pytest.mark.parametrize(
    ("lock_path", "requirements"),
    [
        (RUNTIME_LOCK, runtime_requirements),
        (TEST_LOCK, runtime_requirements),
        (TEST_LOCK, extra_requirements),
    ],
    ids=["runtime.lock:runtime", "test.lock:runtime", "test.lock:extras"],
)
def test_every_pyproject_requirement_is_pinned_at_an_allowed_version(
    lock_path: Path, requirements: Callable[[], list[str]]
) -> None:
    problems = disagreements(requirements(), parse_lock(lock_path.read_text()))
    assert not problems, STALE.format(lock=lock_path.name) + "\n  ".join(problems)


@pytest.mark.parametrize("lock_path", [RUNTIME_LOCK, TEST_LOCK], ids=lambda p: p.name)
def test_every_pin_is_exact_and_hashed(lock_path: Path) -> None:
    unhashed = [name for name, pin in parse_lock(lock_path.read_text()).items() if not pin.hashes]
    assert not unhashed, f"{lock_path.name}: pins without --hash (pip --require-hashes refuses them): {unhashed}"


def test_the_test_lock_holds_the_runtime_lock_unchanged() -> None:
    """.ci/run tests what the image ships: each runtime pin, with its hashes, is a test pin."""
    runtime, test = parse_lock(RUNTIME_LOCK.read_text()), parse_lock(TEST_LOCK.read_text())
    differing = sorted(name for name, pin in runtime.items() if test.get(name) != pin)
    assert not differing, f"runtime.lock and test.lock pin these differently: {differing}"


@pytest.mark.parametrize(
    ("pyproject_requirement", "lock_text", "expected"),
    [
        ("PyYAML>=6.0", "pyyaml==6.0.4 \\\n    --hash=sha256:" + "a" * 64, []),
        ("PyYAML>=7", "pyyaml==6.0.4 \\\n    --hash=sha256:" + "a" * 64, ["PyYAML>=7: the lock pins 6.0.4"]),
        ("google-re2>=1.1", "pyyaml==6.0.4", ["google-re2>=1.1: not in the lock"]),
        ("google_re2>=1.1", "Google.RE2==1.1.20251105", []),
    ],
)
def test_disagreements_name_the_requirement_and_the_pin(
    pyproject_requirement: str, lock_text: str, expected: list[str]
) -> None:
    assert disagreements([pyproject_requirement], parse_lock(lock_text)) == expected
