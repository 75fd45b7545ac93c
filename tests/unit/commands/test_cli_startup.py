"""Every command starts at once: what each one imports, in a fresh interpreter.

Module sets, not timings (bench/cli.py prints those): `--help` and `check` never load
the Kubernetes client, aiohttp, prometheus_client or cryptography, and only a command
that compiles a CEL selector builds the grammar (lark).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ..quota.reports.test_check import EXAMPLES

HEAVY = ("kubernetes_asyncio", "aiohttp", "prometheus_client", "cryptography", "lark")


def loaded_after(code: str) -> set[str]:
    """The top-level packages of HEAVY that `code` leaves imported in a new interpreter."""
    probe = (f"import sys, io, contextlib\n{code}\n"
             f"print(__import__('json').dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def run_main(*argv: str) -> str:
    return ("from commands.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "    try:\n"
            f"        main({list(argv)!r})\n"
            "    except SystemExit:\n"
            "        pass")


def test_importing_the_cli_loads_none_of_the_heavy_packages() -> None:
    assert loaded_after("import commands.cli") == set()


@pytest.mark.parametrize("argv", [("--help",), ("check", "--help"), ("top", "--help"), ("demo", "--help")])
def test_help_loads_none_of_them(argv: tuple[str, ...]) -> None:
    assert loaded_after(run_main(*argv)) == set()


def test_check_builds_the_cel_grammar_and_nothing_of_the_cluster_client() -> None:
    # The examples' DeviceClasses have CEL selectors: lark is needed, the client is not.
    assert loaded_after(run_main("check", "-f", str(EXAMPLES))) == {"lark"}


def test_serve_help_still_lists_every_flag() -> None:
    """`main` defines only the chosen subcommand's flags; the chosen one has all of its own."""
    result = subprocess.run([sys.executable, "-m", "commands.cli", "serve", "--help"], capture_output=True, text=True,
                            check=False, timeout=120)
    assert result.returncode == 0 and "--metrics-port" in result.stdout and "--kueue" in result.stdout
