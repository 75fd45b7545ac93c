"""The control plane's processes: one component's process and log, free ports, dying with the parent.

Neighbours: `devcluster.controlplane` starts each component as a `Component` on ports from
`free_ports`, with `die_with_parent_process` so that no orphaned control plane survives
the process that started it; `devcluster.served` starts `dra-quota serve` the same way;
`devcluster.binary` builds the binary they run.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Component:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def rss_bytes(self) -> int | None:
        """Resident set size from /proc (Linux), or None when unavailable."""
        if self.proc is None:
            return None
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def log_tail(self, lines: int = 60) -> str:
        try:
            return tail(self.log_path.read_text(errors="replace"), lines)
        except OSError as e:
            return f"<no log: {e}>"


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tail(text: str, lines: int) -> str:
    """The last `lines` lines of `text`."""
    return "\n".join(text.splitlines()[-lines:])


_PR_SET_PDEATHSIG = 1


def die_with_parent_process() -> None:
    """Child-side: get SIGKILL when the test runner dies, so no orphaned control plane survives it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
