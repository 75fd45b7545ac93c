"""`dra-quota --version`: the installed distribution's version (what the image is checked with)."""

from __future__ import annotations

from importlib import metadata

import pytest

from commands.cli import main


def test_version_prints_the_installed_distributions_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"dra-quota {metadata.version('dra-quota')}\n"
