"""`dra-quota top`: list the DeviceQuotas and ClusterDeviceQuotas and print their usage.

Neighbours: `commands.cli` lists the subcommand and calls `add_arguments`; `quota.status.published`
reads each object's status into a row, `quota.reports.tables` lays them out; `kube.api` lists.
Exit 0 when it printed, 1 when the cluster could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from commands.commandflags import EXIT_CLUSTER, EXIT_OK, KUBECONFIG_HELP, Subparsers


def add_arguments(sub: Subparsers, *, summary: str) -> None:
    top = sub.add_parser(
        "top", help=summary,
        description="List DeviceQuotas and ClusterDeviceQuotas (team quotas) from the API server and print "
                    "used/reserved/hard memory and devices, allocated and pending claims, and whether the quota is "
                    "exceeded or not counted yet (status missing or older than the spec); for each team, its "
                    "totals and each namespace's part. Reads status only, like kubectl top. A cluster without "
                    "the ClusterDeviceQuota CRD gets the DeviceQuotas alone; a user not allowed to list ClusterDeviceQuotas "
                    "gets, with -n, the AppliedClusterDeviceQuotas there: each team's totals and that namespace's part. "
                    "Exit 0 when it printed, 1 when the cluster could not be read.")
    top.add_argument("-n", "--namespace", help="only this namespace: its DeviceQuotas, and the teams selecting it "
                     "with its part (default: all namespaces)")
    top.add_argument("-o", "--output", choices=("table", "json"), default="table",
                     help="a table (default), or JSON: the contract in docs/cli.md")
    top.add_argument("--kubeconfig", metavar="FILE", help=KUBECONFIG_HELP)
    top.add_argument("--context", help="kubeconfig context (default: the current one)")
    top.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    from datetime import UTC, datetime

    import aiohttp
    from kube.loaders import ConfigException

    from kube.apierror import ApiError
    from quota.quotas.devicequota import QuotaError
    from quota.reports.printable import for_json, for_terminal
    from quota.reports.tables import print_rows, top_tables
    from quota.status.published import applied_usage, quota_usage, team_usage

    try:
        objects, teams, note = asyncio.run(_list_quotas(args))
    except (ApiError, ConfigException, OSError, aiohttp.ClientError, TimeoutError, ValueError) as err:
        print(f"error: {for_terminal(_cluster_error(err))}", file=sys.stderr)
        return EXIT_CLUSTER
    if note:
        print(f"warning: {for_terminal(note)}", file=sys.stderr)
    quotas = []
    def read_team(obj: dict[str, Any]) -> dict[str, Any] | None:
        return applied_usage(obj) if obj.get("kind") == "AppliedClusterDeviceQuota" else team_usage(obj, args.namespace)

    for read, items in ((quota_usage, objects), (read_team, teams)):
        for obj in items:
            try:
                if (row := read(obj)) is not None:
                    quotas.append(row)
            except QuotaError as err:  # one unreadable object does not hide the others
                print(f"warning: skipped: {for_terminal(str(err))}", file=sys.stderr)
    quotas.sort(key=lambda q: (q["namespace"], q["name"]))
    if args.output == "json":
        print(json.dumps(for_json({"quotas": quotas}), indent=2))
        return EXIT_OK
    tables = [rows for rows in top_tables(quotas, datetime.now(UTC)) if len(rows) > 1]
    if not tables:
        print("No DeviceQuotas or ClusterDeviceQuotas found"
              + (f" for namespace {for_terminal(args.namespace)}" if args.namespace else ""), file=sys.stderr)
    for index, rows in enumerate(tables):
        if index:
            sys.stdout.write("\n")
        print_rows(rows, sys.stdout)
    return EXIT_OK


async def _list_quotas(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """The DeviceQuotas, the ClusterDeviceQuotas (with a namespace, for a user who may not list
    them: that namespace's AppliedClusterDeviceQuotas instead), and why the latter are missing
    ("" when not)."""
    from kube.api import KubeApi
    from kube.apierror import ApiError
    from kube.resources import APPLIED_QUOTAS, CLUSTER_QUOTAS, QUOTAS

    async with await KubeApi.connect(args.kubeconfig, context=args.context) as api:
        quotas = (await api.list(QUOTAS, namespace=args.namespace)).items
        try:
            return quotas, (await api.list(CLUSTER_QUOTAS)).items, ""
        except ApiError as err:
            if err.status == 404:  # no ClusterDeviceQuota CRD: no teams
                return quotas, [], ""
            if err.status not in (401, 403):
                raise
            # A tenant may read its namespace's quotas, not the cluster's: its teams' numbers
            # are in its namespace, as AppliedClusterDeviceQuotas (quota.status.applied).
            denied = f"not allowed to list ClusterDeviceQuotas, team quotas not shown: {err.message}"
        if args.namespace is None:
            return quotas, [], denied
        try:
            return quotas, (await api.list(APPLIED_QUOTAS, namespace=args.namespace)).items, ""
        except ApiError as err:
            if err.status in (401, 403, 404):  # not allowed either, or an older install without the CRD
                return quotas, [], denied
            raise


def _cluster_error(err: Exception) -> str:
    from kube.loaders import ConfigException

    from kube.apierror import ApiError

    if isinstance(err, ApiError) and err.status == 404:
        return "the API server serves no draquota.io/v1alpha1 devicequotas: is the DeviceQuota CRD installed?"
    if isinstance(err, ApiError) and err.status in (401, 403):
        return f"not allowed to list DeviceQuotas: {err.message}"
    if isinstance(err, ConfigException):
        return f"cannot reach the cluster: {err}"
    return f"cannot read DeviceQuotas from the API server: {err or type(err).__name__}"
