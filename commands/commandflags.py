"""What the `dra-quota` subcommands share: exit codes, the `--kubeconfig` help, the memory-source flags.

Neighbours: `commands.cli` dispatches to the subcommands; `commands.checkcommand`,
`commands.servecommand`, `commands.topcommand` and `commands.certscommand` define their flags
and run them with these. Imports only the standard library at the top (`commands.cli`:
start-up).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from quota.devices.memorysources import MemorySources

EXIT_OK = 0
EXIT_CLUSTER = 1  # top, demo: the cluster could not be read or run
EXIT_DENIED = 1  # check --fail-on-deny: an object was denied
EXIT_INPUT = 2
# Every command finds the cluster the same way (kube.credentials).
KUBECONFIG_HELP = ("kubeconfig to reach the API server (default: $KUBECONFIG, a colon-separated list merged as "
                   "kubectl merges it; else the Pod's service account; else ~/.kube/config)")

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def memory_source_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--memory-sources", dest="memory_sources", action="append", default=[], metavar="FILE",
                        help="a MemorySources file: where devices whose driver publishes no `memory` capacity get "
                             "their memory; each file replaces the shipped entries of the drivers it names "
                             "(repeatable; docs/charging.md, \"Devices without a memory\")")
    parser.add_argument("--default-memory-sources", action=argparse.BooleanOptionalAction, default=True,
                        help="start from the shipped memory sources (NVIDIA VFIO, Gaudi, TPU, ...; default on)")


def memory_sources(args: argparse.Namespace) -> MemorySources:
    """The memory sources the flags name; raises MemorySourcesError."""
    from quota.devices.memorysources import load_memory_sources
    return load_memory_sources(args.memory_sources, defaults=args.default_memory_sources)
