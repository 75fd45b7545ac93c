"""`dra-quota certs generate|inspect` through the command line's own entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

from commands.cli import main


def test_generate_then_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "generate", "--service", "dq", "--namespace", "ops", "--ip", "127.0.0.1",
                 "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / n) for n in ("ca.crt", "ca.key", "tls.crt", "tls.key")]
    assert main(["certs", "inspect", str(tmp_path / "tls.crt")]) == 0
    out = capsys.readouterr().out
    assert "names:       dq, dq.ops, dq.ops.svc, dq.ops.svc.cluster.local, 127.0.0.1" in out
    assert "(valid, 364 days left)" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["certs", "inspect", "/dev/zero"], "error: /dev/zero: larger than 1048576 bytes: not a PEM bundle"),
        (["certs", "inspect", "/nonexistent.pem"], "error: /nonexistent.pem: [Errno 2] No such file or directory"),
        (["certs", "generate", "--out", "/dev/null/x"], "error: [Errno 20] Not a directory"),
        (["certs", "generate", "--out", "/tmp", "--ip", "not-an-ip", "--force"], "error: 'not-an-ip' does not appear to be an IPv4 or IPv6 address"),
        (["certs", "generate", "--out", "/tmp", "--days", "0"], "error: --days must be at least 1"),
    ],
)
def test_bad_input_exits_2_with_a_message(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    assert capsys.readouterr().err.startswith(message)
