"""docs/configuration.md, the configuration reference, is what the CLI accepts
(tests/tools/cli_reference.py)."""

from __future__ import annotations

from tests.tools.cli_reference import commands, current, render


def test_the_reference_covers_every_command() -> None:
    assert {"check", "serve", "top", "demo", "certs generate", "certs inspect"} <= set(commands())


def test_the_configuration_reference_is_what_the_cli_accepts() -> None:
    assert current() == render(), "docs/configuration.md is stale: run python -m tests.tools.cli_reference"
