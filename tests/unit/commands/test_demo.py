"""`dra-quota demo` where no control plane can be had: it says so and runs `check` on examples/.

The live demo itself runs against the real control plane in tests/e2e/test_demo.py. Here
no Go is on PATH and the built binary is absent (a path under tmp_path), so nothing is
started: `commands.demo.locate_binary` gives up before any process, and the command line
falls back to `check`.
"""

import json
from pathlib import Path

import pytest

from commands import cli, demo

H200_DENIAL = ('exceeded DeviceQuota "gpus": requested memory=282Gi, used memory=100Gi, '
               'reserved memory=160Gi, limited memory=320Gi')


@pytest.fixture
def no_control_plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no `go`
    monkeypatch.delenv("MINIK8S_BIN", raising=False)
    monkeypatch.setattr(demo, "DEFAULT_BINARY", tmp_path / "no-minik8s")


def test_without_go_or_a_binary_it_says_so_and_checks_the_examples(
        no_control_plane: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo"]) == 0
    out, err = capsys.readouterr()
    assert "no local control plane: Go (>= 1.26" in err
    assert "note: showing `dra-quota check -f examples/` instead" in err
    # check's table over examples/: the H200 pair is denied with docs/design.md's message.
    row = next(line for line in out.splitlines() if " h200-pair " in line)
    assert "DENIED" in row and H200_DENIAL in row


def test_the_fallback_keeps_the_output_format(no_control_plane: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    h200 = next(o for o in report["objects"] if o["name"] == "h200-pair")
    assert h200["allowed"] is False and h200["reason"] == H200_DENIAL


def test_an_unusable_minik8s_bin_is_an_error_not_a_fallback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MINIK8S_BIN", str(tmp_path / "absent"))
    assert cli.main(["demo"]) == 1
    err = capsys.readouterr().err
    assert f"MINIK8S_BIN={tmp_path / 'absent'} is not an executable file" in err
    assert "check -f examples/" not in err
