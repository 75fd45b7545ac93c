"""The `dra-quota` command line: the subcommands and the dispatch to them.

Neighbours: one module per subcommand defines its flags (`add_arguments`) and runs it:
`commands.checkcommand`, `commands.certscommand`, `commands.servecommand`,
`commands.topcommand`, `commands.report`, `commands.selftest`; `demo` is here, its
scenario in `commands.demo`. `commands.commandflags` holds the exit codes they share: 0
when it ran; 1 when the cluster could not be read (`top`, `demo`) or, with `check
--fail-on-deny`, when an object was denied; 2 on unreadable input.

Start-up: every command starts at once (targets in bench/cli.py). This module and the
subcommands' modules import only the standard library at the top; each subcommand imports
what it needs when it runs, and `main` defines the flags of the chosen subcommand only
(the others are listed by name and help), so `--help` and `check` never load
kubernetes_asyncio, aiohttp, prometheus or cryptography. `_parser()` with no argument
still builds every subcommand (the docs/configuration.md, the flag reference, is
generated from it). bench/cli.py measures the start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Protocol

from commands import certscommand, checkcommand, servecommand, topcommand
from commands.commandflags import EXIT_CLUSTER, EXIT_INPUT, EXIT_OK, Subparsers
from quota.version import version


def main(argv: Sequence[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else list(argv)
    # Only the chosen subcommand's flags are defined (module doc: start-up).
    chosen = args_list[0] if args_list and args_list[0] in _COMMANDS else ""
    parser = _parser(only=chosen)
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_INPUT
    try:
        code: int = args.run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`dra-quota check ... | head`): not our failure. Point
        # stdout at devnull so the interpreter's final flush stays quiet (Python docs,
        # "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    return code


class _AddCommand(Protocol):
    """Defines a subcommand's flags under `sub`, with `summary` as its help."""

    def __call__(self, sub: Subparsers, *, summary: str) -> None: ...


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; `only`: define that subcommand's flags alone (None: all of them)."""
    parser = argparse.ArgumentParser(
        prog="dra-quota",
        description="GPU-memory quotas and usage accounting for Kubernetes DRA ResourceClaims.",
    )
    parser.add_argument("--version", action="version", version=f"dra-quota {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (summary, add) in _COMMANDS.items():
        if only is None or name == only:
            add(sub, summary=summary)
        else:
            sub.add_parser(name, help=summary)  # listed in --help; never parsed
    return parser


# -- demo ---------------------------------------------------------------------------------------

def _add_demo(sub: Subparsers, *, summary: str) -> None:
    demo = sub.add_parser(
        "demo", help=summary,
        description="Start a local Kubernetes 1.37 control plane on loopback (built from source with Go when "
                    "needed), install the DeviceQuota CRD and the webhook, run `dra-quota serve`, publish "
                    "examples/ and play a short scenario: claims admitted and denied by the live webhook, "
                    "allocated by the real scheduler, usage counted by the quota controller. Without Go "
                    "or a built control plane it says so and runs `check` on examples/ instead. "
                    "Exit 0 when it ran, 1 when it failed (logs kept), 130 on Ctrl-C (all stopped).")
    demo.add_argument("--keep", action="store_true",
                      help="leave the cluster and serve running at the end; print the kubeconfig and how to stop")
    demo.add_argument("-o", "--output", choices=("table", "json"), default="table",
                      help="json: progress and tables on stderr, a summary of every step on stdout")
    demo.set_defaults(run=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    # Imported here, like every command's needs: the demo's control plane is only for a
    # source checkout (processes from .cache).
    from importlib.resources import as_file

    from commands import demo, demoplan
    from quota.reports.printable import for_json, for_terminal

    try:
        summary = demo.run(demoplan.DemoOptions(keep=args.keep, output=args.output), sys.stdout)
    except demoplan.DemoUnavailable as err:
        print(f"dra-quota demo: {for_terminal(str(err))}", file=sys.stderr)
        print("dra-quota demo: note: showing `dra-quota check -f examples/` instead: the same admission and "
              "accounting code on the example cluster, offline (no live webhook, scheduler or controller). "
              "Install Go >= 1.26 (or set MINIK8S_BIN) for the live demo.", file=sys.stderr)
        # The examples are package data: a directory of files in any pip-installed copy.
        with as_file(demoplan.examples()) as examples:
            return checkcommand.run(argparse.Namespace(paths=[str(examples)], output=args.output, mode="conservative",
                                                       fail_on_deny=False, memory_sources=[], from_cluster=False,
                                                       default_memory_sources=True))
    except demoplan.DemoError as err:
        for line in str(err).splitlines():
            print(f"error: dra-quota demo: {for_terminal(line)}", file=sys.stderr)
        return EXIT_CLUSTER
    except KeyboardInterrupt:
        print("dra-quota demo: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    if args.output == "json":
        print(json.dumps(for_json(summary), indent=2))
    return EXIT_OK


def _add_report(sub: Subparsers, *, summary: str) -> None:
    from commands import report

    report.add_arguments(sub, summary=summary)


def _add_selftest(sub: Subparsers, *, summary: str) -> None:
    from commands import selftest

    selftest.add_arguments(sub, summary=summary)


# name -> (its one-line help, the function defining its flags); the order of --help.
_COMMANDS: dict[str, tuple[str, _AddCommand]] = {
    "check": ("price and admit claims offline from YAML files (no cluster needed)", checkcommand.add_arguments),
    "certs": ("generate or inspect webhook certificates", certscommand.add_arguments),
    "serve": ("run the admission webhook against a cluster", servecommand.add_arguments),
    "top": ("print each DeviceQuota's and ClusterDeviceQuota's usage as the quota controller published it",
            topcommand.add_arguments),
    "report": ("print GPU-memory-hours, device-hours and idle hours per namespace, team or model, from Prometheus",
               _add_report),
    "demo": ("run the webhook and quota controller live on a throw-away local cluster", _add_demo),
    "selftest": ("send a dry-run claim through the API server and check that the dra-quota webhook answered "
                 "(helm test)", _add_selftest),
}


if __name__ == "__main__":
    sys.exit(main())
