"""`dra-quota demo` where no control plane can be had: it says so and runs `check` on examples/.

The live demo itself runs against the real control plane in tests/e2e/test_demo.py. Here
no Go is on PATH and the built binary is absent (a path under tmp_path), so nothing is
started: `commands.demo.locate_binary` gives up before any process, and the command line
falls back to `check`.
"""

import contextlib
import json
from pathlib import Path

import pytest

from commands import cli, demo

from ..builders import advised

H200_DENIAL = advised('exceeded DeviceQuota "gpus": requested memory=282Gi, used memory=100Gi, '
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


# -- interrupting a cold build ------------------------------------------------------------------

# `dra-quota demo` with a stand-in for tests/cluster/build.sh that builds for five minutes
# (a shell and its child `sleep`, as bash and go are): what a cold build looks like.
RUN_DEMO = """
import sys
from pathlib import Path
import devcluster.binary as binary
from commands import cli, demo
binary.BUILD_SCRIPT = Path(sys.argv[1])
demo.DEFAULT_BINARY = Path(sys.argv[2])
sys.exit(cli.main(["demo"]))
"""
SLOW_BUILD = """echo $$ > "$1.script"
sleep 300 &
echo $! > "$1.child"
wait
"""


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def test_sigint_to_the_pid_stops_a_cold_build(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    script, marks = tmp_path / "build.sh", tmp_path / "build"
    script.write_text(SLOW_BUILD.replace('"$1', f'"{marks}'))
    go = tmp_path / "bin" / "go"  # a `go` on PATH: the demo builds rather than falls back
    go.parent.mkdir()
    go.write_text("#!/bin/sh\nexit 1\n")
    go.chmod(0o755)
    env = {**os.environ, "PATH": f"{go.parent}:{os.environ['PATH']}"}
    env.pop("MINIK8S_BIN", None)
    proc = subprocess.Popen([sys.executable, "-c", RUN_DEMO, str(script), str(tmp_path / "no-minik8s")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        child = Path(f"{marks}.child")
        deadline = time.monotonic() + 30
        while not child.exists() or not child.read_text().strip():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # to the pid alone, as `kill -INT <pid>` does
        _, err = proc.communicate(timeout=30)  # a TimeoutExpired here: it waited for the build
        assert proc.returncode == 130 and "interrupted" in err, err
        pids = [int(Path(f"{marks}.{name}").read_text()) for name in ("script", "child")]
        deadline = time.monotonic() + 10
        while not all(_gone(pid) for pid in pids):
            assert time.monotonic() < deadline, f"build processes left running: {pids}"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for name in ("script", "child"):
            mark = Path(f"{marks}.{name}")
            if mark.exists():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(mark.read_text()), signal.SIGKILL)
