"""README.md's configuration reference is what the CLI accepts (tests/tools/cli_reference.py)."""

from __future__ import annotations

from tests.tools.cli_reference import commands, current, render


def test_the_reference_covers_every_command() -> None:
    assert {"check", "serve", "top", "demo", "certs generate", "certs inspect"} <= set(commands())


def test_the_readme_reference_is_what_the_cli_accepts() -> None:
    assert current() == render(), "README.md's CLI reference is stale: run python -m tests.tools.cli_reference"
