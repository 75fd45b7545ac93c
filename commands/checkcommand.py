"""`dra-quota check`: its flags, reading the cluster for `--from-cluster`, and the table it prints.

Neighbours: `commands.cli` lists the subcommand and calls `add_arguments`; `quota.reports.check`
does the work, `quota.reports.loader` reads the files; `commands.commandflags` has the exit codes
and the memory-source flags. Exit 0 when it ran (1 with `--fail-on-deny` when an object
was denied), 2 on unreadable input.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

from commands.commandflags import (
    EXIT_DENIED, EXIT_INPUT, EXIT_OK, KUBECONFIG_HELP, Subparsers, memory_source_flags, memory_sources,
)

if TYPE_CHECKING:
    from datetime import datetime

    from quota.reports.check import Report
    from quota.reports.loader import Document
    from quota.values.model import Charge


def add_arguments(sub: Subparsers, *, summary: str) -> None:
    check = sub.add_parser(
        "check",
        help=summary,
        description=(
            "Load DeviceClasses, ResourceSlices, Namespaces, DeviceQuotas, ResourceClaims and "
            "ResourceClaimTemplates from files or folders and run the webhook's admission and "
            "accounting code over them. Exit 0 when it ran (1 with --fail-on-deny when an object is "
            "denied), 2 on unreadable input."
        ),
    )
    check.add_argument("-f", "--filename", dest="paths", action="extend", nargs="+", required=True,
                       metavar="PATH", help="YAML/JSON file or folder (repeatable; multi-document files)")
    check.add_argument("--from-cluster", action="store_true",
                       help="also read the cluster's DeviceClasses, ResourceSlices, Namespaces, DeviceQuotas and "
                            "ClusterDeviceQuotas (list only, with your kubeconfig) before the files: the claims are "
                            "checked against the quotas' limits, not against what the cluster uses now")
    check.add_argument("--kubeconfig", metavar="FILE", help=f"with --from-cluster: {KUBECONFIG_HELP}")
    check.add_argument("--context", help="with --from-cluster: kubeconfig context (default: the current one)")
    check.add_argument("-o", "--output", choices=("table", "json"), default="table",
                       help="a table per object and per quota (default), or JSON: the contract in docs/cli.md")
    check.add_argument("--mode", choices=("conservative", "optimistic"), default="conservative",
                       help="price unallocated claims at the largest (default) or smallest candidate")
    check.add_argument("--at", metavar="TIME",
                       help="evaluate the quotas' windows (spec.windows) as of this RFC 3339 instant, e.g. "
                            "2026-12-24T18:00:00Z (default: now)")
    check.add_argument("--fail-on-deny", action="store_true",
                       help="exit 1 when any claim or template is denied or a quota's selector does not "
                            "compile (for CI gates; the report is printed either way; unreadable input stays 2)")
    memory_source_flags(check)
    check.set_defaults(run=run)


class _ClusterUnreadable(Exception):
    """`check --from-cluster` could not list the cluster's state: exit 2, with this message."""


def _cluster_state(args: argparse.Namespace) -> list[Document]:
    """The cluster's DeviceClasses, ResourceSlices, Namespaces and quotas, as `check` reads
    files (only lists: a read-only command). No ClusterDeviceQuota CRD: no teams."""
    import asyncio

    import aiohttp
    from kube.loaders import ConfigException

    from kube.api import KubeApi
    from kube.apierror import ApiError
    from kube.resources import CLASSES, CLUSTER_QUOTAS, NAMESPACES, QUOTAS, SLICES
    from quota.reports.loader import Document

    async def read() -> list[Document]:
        docs: list[Document] = []
        async with await KubeApi.connect(args.kubeconfig, context=args.context) as api:
            for resource in (CLASSES, SLICES, NAMESPACES, QUOTAS, CLUSTER_QUOTAS):
                try:
                    items = (await api.list(resource)).items
                except ApiError as err:
                    if err.status == 404 and resource == CLUSTER_QUOTAS:
                        continue
                    if err.status == 404:
                        raise _ClusterUnreadable(f"the API server serves no {resource.api_version} "
                                                 f"{resource.plural}: is the CRD installed?") from None
                    raise _ClusterUnreadable(f"cannot list {resource.plural}: {err.message}") from None
                docs.extend(Document(f"{resource.plural} from the cluster", item) for item in items)
        return docs

    try:
        return asyncio.run(read())
    except ConfigException as err:
        raise _ClusterUnreadable(f"cannot reach the cluster: {err}") from None
    except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as err:
        raise _ClusterUnreadable(f"cannot read the cluster: {err or type(err).__name__}") from None


def run(args: argparse.Namespace) -> int:
    from itertools import chain

    from quota.devices.inventory import gc_paused
    from quota.devices.memorysources import MemorySourcesError
    from quota.reports.check import run_check
    from quota.reports.loader import CheckInputError, iter_documents
    from quota.reports.printable import for_terminal

    load_warnings: list[str] = []
    cluster: list[Document] = []
    try:
        at = _check_time(getattr(args, "at", None))
    except CheckInputError as err:
        print(f"error: {for_terminal(str(err))}", file=sys.stderr)
        return EXIT_INPUT
    if args.from_cluster:
        try:
            cluster = _cluster_state(args)
        except _ClusterUnreadable as err:
            print(f"error: {for_terminal(str(err))}", file=sys.stderr)
            return EXIT_INPUT
    try:
        # Documents are parsed as they are read, so a large dump's raw objects are never
        # all alive at once; the collector is paused while tens of thousands of acyclic
        # objects are built (measured on the 5,000-node dump: 7.1 s/496 MB -> 4.1 s/350 MB).
        with gc_paused():
            report = run_check(chain(cluster, iter_documents(args.paths, load_warnings)), mode=args.mode,
                               memory_sources=memory_sources(args), at=at)
    except (CheckInputError, MemorySourcesError) as err:
        print(f"error: {for_terminal(str(err))}", file=sys.stderr)
        return EXIT_INPUT
    report.warnings[:0] = load_warnings  # the JSON carries what stderr says
    for warning in report.warnings:
        print(f"warning: {for_terminal(warning)}", file=sys.stderr)
    if args.output == "json":
        print(report.dumps())
    else:
        render_table(report, sys.stdout)
    if args.fail_on_deny and (denied := sum(not o.allowed for o in report.objects)):
        print(f"error: {denied} of {len(report.objects)} claims and templates denied (--fail-on-deny)",
              file=sys.stderr)
        return EXIT_DENIED
    if args.fail_on_deny and report.invalid_quotas:
        print(f"error: {len(report.invalid_quotas)} quota selectors do not compile (--fail-on-deny)", file=sys.stderr)
        return EXIT_DENIED
    return EXIT_OK


def _check_time(text: str | None) -> datetime:
    """`check --at`, or now."""
    from datetime import UTC, datetime

    from quota.quotas.windows import parse_time
    from quota.reports.loader import CheckInputError

    return datetime.now(UTC) if text is None else parse_time(text, "--at", CheckInputError)


def _charge(charge: Charge) -> tuple[str, str]:
    from quota.values.quantity import format_quantity

    return format_quantity(charge.memory), str(charge.devices)


def render_table(report: Report, out: TextIO) -> None:
    from quota.reports.tables import USAGE_HEADERS, print_rows, usage_cells

    rows: list[tuple[str, ...]] = [("KIND", "NAMESPACE", "NAME", "DECISION", "MEMORY", "DEVICES", "DETAILS")]
    for obj in report.objects:
        decision = "allocated" if obj.allocated else ("allowed" if obj.allowed else "DENIED")
        details = [obj.reason or obj.unlimited] if obj.reason or obj.unlimited else []
        details.extend(f"warning: {w}" for w in obj.warnings)
        rows.append((obj.kind, obj.namespace, obj.name, decision, *_charge(obj.charge), "; ".join(details)))
    print_rows(rows, out)
    if report.quotas:
        out.write("\n")
        # WINDOW only when a quota has windows: the active one, "-" for the quota's own hard.
        windows = any("window" in q for q in report.quotas)
        quota_rows: list[tuple[str, ...]] = [("QUOTA", "NAMESPACE", *USAGE_HEADERS, *(("WINDOW",) if windows else ()))]
        # A ClusterDeviceQuota spans namespaces: its row says so, its members follow in JSON.
        quota_rows.extend((q["name"], q["namespace"] or "(cluster)", *usage_cells(q),
                           *((q.get("window") or "-",) if windows else ())) for q in report.quotas)
        print_rows(quota_rows, out)
