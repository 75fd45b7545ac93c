"""What one `dra-quota demo` run is: the scenario it plays, its options, its errors, its state.

Neighbours: `commands.demo` runs it (the control plane, `serve`, teardown or `--keep`);
`commands.demosteps` publishes examples/ and plays each `Step` of `SCENARIO`; both share
`DemoRun`, what one run started. `commands.cli` catches `DemoUnavailable` (then runs
`check` on `examples()`) and `DemoError`.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from quota.reports.printable import for_terminal

if TYPE_CHECKING:
    from devcluster.controlplane import ControlPlane
    from devcluster.served import Served

__all__ = ["SCENARIO", "TEAMS", "DemoError", "DemoOptions", "DemoRun", "DemoUnavailable", "Step", "examples"]


class DemoUnavailable(Exception):
    """No control plane can be had here (no binary, no Go to build one): `check` instead."""


class DemoError(Exception):
    """The demo could not finish; the message says where the logs are."""


@dataclass(frozen=True)
class Step:
    """One move of the scenario: `team` creates (or deletes) ResourceClaim `claim` of
    examples/40-claims.yaml, and Pod `pod` uses it, so the scheduler allocates it."""

    team: str
    claim: str
    pod: str
    says: str
    delete: bool = False


SCENARIO = (
    Step("team-a", "h100-pair", "train-1", "team-a asks for two H100 80GB GPUs for a training job"),
    Step("team-a", "h200-pair", "train-2", "team-a also asks for two H200 141GB GPUs (282Gi more)"),
    Step("team-b", "mig-3g", "notebook-1", "team-b asks for a MIG 3g.20gb slice for a notebook"),
    Step("team-b", "mig-1g-x4", "notebook-2", "team-b asks for four MIG 1g.5gb slices"),
    Step("team-b", "mig-3g-second", "notebook-3", "team-b asks for another MIG 3g.20gb slice"),
    Step("team-a", "h100-pair", "train-1", "team-a's training job ends: Pod and claim deleted", delete=True),
    Step("team-a", "h200-pair", "train-2", "team-a asks for the two H200s again"),
)
TEAMS = ("team-a", "team-b")


@dataclass(frozen=True)
class DemoOptions:
    keep: bool = False
    output: Literal["table", "json"] = "table"
    workdir: Path | None = None
    start_timeout: float = 180.0
    step_timeout: float = 60.0
    scenario: tuple[Step, ...] = SCENARIO


@dataclass
class DemoRun:
    """What one demo started, so that teardown (or `--keep`'s stop script) can end it."""

    options: DemoOptions
    out: TextIO
    workdir: Path
    started: float = field(default_factory=time.monotonic)
    cluster: ControlPlane | None = None
    serve: Served | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C while the scenario ran (`commands.demo._interruptible`)

    def say(self, text: str) -> None:
        # Progress goes to stdout with the table; with -o json, to stderr (stdout is the JSON).
        stream = sys.stderr if self.options.output == "json" else self.out
        for line in text.split("\n"):
            stream.write(for_terminal(line) + "\n")
        stream.flush()

    @property
    def serve_log(self) -> Path:
        return self.workdir / "serve.log"


def examples() -> Traversable:
    """The example cluster (examples/ of a checkout), package data here: the demo publishes
    it and plays its claims, and without a control plane `check` runs on it."""
    return files(__package__ or "commands") / "examples"
