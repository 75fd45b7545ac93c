"""The `dra-quota` command line.

Neighbours: `quota.check` does the work of `check`, `commands.serve` of `serve`,
`certs.commands` of `certs`. This module parses flags, renders
tables and maps failures to exit codes: 0 when it ran; 1 when the cluster could not be
read (`top`, `demo`) or, with `check --fail-on-deny`, when an object was denied; 2 on
unreadable input.

Start-up: every command starts at once (targets in bench/cli.py). This module imports only the
standard library at the top; each subcommand imports what it needs when it runs, and
`main` defines the flags of the chosen subcommand only (the others are listed by name
and help), so `--help` and `check` never load kubernetes_asyncio, aiohttp, prometheus
or cryptography. `_parser()` with no argument still builds every subcommand (the
docs/configuration.md, the flag reference, is generated from it). bench/cli.py measures the start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeAlias

from quota.version import version

if TYPE_CHECKING:
    from datetime import datetime

    from commands.serve import LeaderElection
    from quota.check import Report
    from quota.loader import Document
    from quota.memorysources import MemorySources
    from quota.model import Charge

EXIT_OK = 0
EXIT_CLUSTER = 1  # top, demo: the cluster could not be read or run
EXIT_DENIED = 1  # check --fail-on-deny: an object was denied
EXIT_INPUT = 2
_MAX_PEM_BYTES = 1024 * 1024
# Every command finds the cluster the same way (kube.credentials).
_KUBECONFIG_HELP = ("kubeconfig to reach the API server (default: $KUBECONFIG, a colon-separated list merged as "
                    "kubectl merges it; else the Pod's service account; else ~/.kube/config)")


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


_Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


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
            add(sub)
        else:
            sub.add_parser(name, help=summary)  # listed in --help; never parsed
    return parser


def _add_check(sub: _Subparsers) -> None:
    check = sub.add_parser(
        "check",
        help=_COMMANDS["check"][0],
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
    check.add_argument("--kubeconfig", metavar="FILE", help=f"with --from-cluster: {_KUBECONFIG_HELP}")
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
    _memory_source_flags(check)
    check.set_defaults(run=_run_check)


def _memory_source_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--memory-sources", dest="memory_sources", action="append", default=[], metavar="FILE",
                        help="a MemorySources file: where devices whose driver publishes no `memory` capacity get "
                             "their memory; each file replaces the shipped entries of the drivers it names "
                             "(repeatable; docs/charging.md, \"Devices without a memory\")")
    parser.add_argument("--default-memory-sources", action=argparse.BooleanOptionalAction, default=True,
                        help="start from the shipped memory sources (NVIDIA VFIO, Gaudi, TPU, ...; default on)")


def _memory_sources(args: argparse.Namespace) -> MemorySources:
    """The memory sources the flags name; raises MemorySourcesError."""
    from quota.memorysources import load_memory_sources
    return load_memory_sources(args.memory_sources, defaults=args.default_memory_sources)


def _add_serve(sub: _Subparsers) -> None:
    from commands.serve import LIMITATIONS
    from webhook import certificates, connections
    from webhook.adminpolicy import configmap_ref
    from quota.breakdown import DEFAULT_SERIES
    from webhook.metrics import DEFAULT_METRICS_PORT

    serve = sub.add_parser(
        "serve", help=_COMMANDS["serve"][0],
        description="Serve the validating admission webhook over HTTPS, with caches of "
                    "ResourceSlices, DeviceClasses, Namespaces, DeviceQuotas and ResourceClaims kept by "
                    f"list+watch. {LIMITATIONS} Stops cleanly on SIGTERM or SIGINT (exit 0).")
    serve.add_argument("--kubeconfig", metavar="FILE", help=_KUBECONFIG_HELP)
    serve.add_argument("--bind-address", default="0.0.0.0",
                       help="address to listen on, or several separated by commas (default 0.0.0.0)")
    serve.add_argument("--port", type=int, default=8443, help="HTTPS port (default 8443)")
    serve.add_argument("--cert-mode", choices=("self", "files"),
                       help="self: CA and serving certificate in a Secret, caBundles patched, renewed and "
                            "rotated in place; files: --tls-cert-file/--tls-key-file, reloaded on change "
                            "(default: files when those are given, else self)")
    serve.add_argument("--tls-cert-file", type=Path, metavar="FILE", help="PEM serving certificate (chain)")
    serve.add_argument("--tls-key-file", type=Path, metavar="FILE", help="PEM private key")
    certificates.add_arguments(serve)
    allowlist = serve.add_mutually_exclusive_group()
    allowlist.add_argument("--admin-access-policy", type=Path, metavar="PATH",
                           help="adminAccess allowlist: a YAML/JSON map (users, groups, serviceAccounts) or a "
                                "ConfigMap manifest holding it, or a directory of one file per key (a mounted "
                                "ConfigMap); reloaded when it changes (polled every 5s; default: nobody allowlisted)")
    allowlist.add_argument("--admin-access-configmap", type=configmap_ref, metavar="NAMESPACE/NAME",
                           help="adminAccess allowlist: this ConfigMap's data, watched through the API (the "
                                "ValidatingAdmissionPolicy's parameter object); missing means nobody allowlisted")
    serve.add_argument("--allocation-check", choices=("enforce", "account-only"), default="enforce",
                       help="deny an allocation that charges more than was reserved and breaks hard (default enforce)")
    _memory_source_flags(serve)
    serve.add_argument("--default-pricing", choices=("conservative", "optimistic"), default="conservative",
                       help="price unallocated claims at the largest (default) or smallest candidate")
    serve.add_argument("--reservation-ttl", type=float, default=120.0, metavar="SECONDS",
                       help="an admitted claim's reservation is persisted on the DeviceQuota status until a "
                            "replica's claim watch delivers the claim; one whose claim never appears (a later "
                            "admission step refused the create) is dropped after this long; keep it longer than "
                            "the API server's request timeout (60 s by default) plus any replica's watch lag "
                            "(default 120)")
    serve.add_argument("--lease-period", type=float, default=5.0, metavar="SECONDS",
                       help="while a DeviceQuota is far from hard, each replica reserves a chunk of its headroom "
                            "(a lease, one status write) and admits claims against it for this long with no write; "
                            "near hard every admission is persisted one by one; 0 turns leases off, else at least 1 "
                            "(default 5)")
    serve.add_argument("--clock-skew", type=float, default=5.0, metavar="SECONDS",
                       help="how far the replicas' clocks may differ: at a boundary of a quota's windows "
                            "(spec.windows) every replica admits against the smallest limit in force within this "
                            "many seconds of its clock, so a decrease applies this much early and an increase this "
                            "much late (default 5)")
    serve.add_argument("--requeue-waiting-pods", action=argparse.BooleanOptionalAction, default=True,
                       help="when a claim is deleted, touch the ResourceClaimTemplates that unscheduled Pods of its "
                            "namespace still wait on, so the resourceclaim controller retries them at once instead "
                            "of after its backoff (up to 1000 s); done by the Lease holder; needs list pods, patch "
                            "resourceclaimtemplates (default on)")
    _add_controller(serve)
    serve.add_argument("--kueue", choices=("auto", "on", "off"), default="auto",
                       help="run the Kueue AdmissionCheck controller (controllerName draquota.io/devicequota) on "
                            "the Lease holder and keep a Workload cache on every replica; auto: when the API "
                            "server serves kueue.x-k8s.io/v1beta2 workloads at start-up (default auto)")
    serve.add_argument("--kueue-retry-seconds", type=int, default=15, metavar="SECONDS",
                       help="requeueAfterSeconds of a Retry for a Workload that does not fit: Kueue checks it "
                            "again this long after (default 15)")
    serve.add_argument("--shutdown-delay", type=float, default=0.0, metavar="SECONDS",
                       help="after SIGTERM, /readyz answers 503 at once and reviews are still answered this long, "
                            "so the Service's endpoints drop this Pod before its listener closes (a rollout's old Pod "
                            "then fails no review); a second signal ends the wait (default 0; the chart sets 15)")
    serve.add_argument("--reuse-port", action="store_true",
                       help="SO_REUSEPORT: let several replicas on one host listen on --port (each listens once "
                            "its caches have synced: the kernel, not readiness, picks the replica)")
    serve.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                       help=f"port of GET /metrics (Prometheus); 0 disables (default {DEFAULT_METRICS_PORT})")
    serve.add_argument("--metrics-secure", action=argparse.BooleanOptionalAction, default=True,
                       help="HTTPS with the serving certificate, for bearer tokens the API server authenticates "
                            "(TokenReview) and allows to get /metrics (SubjectAccessReview); --no-metrics-secure: "
                            "plain HTTP with no authentication, on a loopback address only (default on)")
    serve.add_argument("--team-namespace-series", type=int, default=DEFAULT_SERIES, metavar="N",
                       help="namespaces a ClusterDeviceQuota exports a draquota_cluster_quota_namespace part of: its "
                            f"N largest, the rest summed as namespace=\"(other)\" (default {DEFAULT_SERIES})")
    serve.add_argument("--metrics-bind-address",
                       help="address the metrics port listens on (default 0.0.0.0; 127.0.0.1 with --no-metrics-secure)")
    connections.add_arguments(serve)
    serve.add_argument("--log-format", choices=("text", "json"), default="text",
                       help="log lines as text (default) or one JSON object a line, for a log collector")
    serve.add_argument("--log-level", choices=("debug", "info", "warning"), default="info",
                       help="info logs denials, debug also every allowed review (default info)")
    serve.set_defaults(run=_run_serve)


def _add_controller(serve: argparse.ArgumentParser) -> None:
    roles = serve.add_argument_group("webhook and quota controller (all replicas serve webhooks, one leader reconciles)")
    roles.add_argument("--webhook", action=argparse.BooleanOptionalAction, default=True,
                       help="serve the admission webhooks over HTTPS; --no-webhook: no listener and no "
                            "certificates (a controller-only Deployment) (default on)")
    roles.add_argument("--controller", action=argparse.BooleanOptionalAction, default=True,
                       help="campaign for the Lease and, while leading, write each DeviceQuota's status "
                            "(used, reserved, claims, conditions) (default on)")
    roles.add_argument("--resync-period", type=float, default=300.0, metavar="SECONDS",
                       help="recompute every DeviceQuota's status this often even without events (default 300)")
    roles.add_argument("--team-totals-refresh-period", type=float, default=60.0, metavar="SECONDS",
                       help="how long after a team's totals move its AppliedClusterDeviceQuotas may still show "
                            "older ones: a claim event writes its own namespace's copy only, the other members' "
                            "totals are refreshed at most this often (at once after a change of the team's spec "
                            "or members) (default 60)")
    roles.add_argument("--leader-election-lease-name", default="dra-quota-controller", metavar="NAME",
                       help="the coordination.k8s.io/v1 Lease (default dra-quota-controller)")
    roles.add_argument("--leader-election-namespace", metavar="NAMESPACE",
                       help="the Lease's namespace (default: the Pod's own, else dra-quota-system)")
    roles.add_argument("--leader-election-lease-duration", type=float, default=15.0, metavar="SECONDS",
                       help="how long candidates wait after the last renewal they saw before taking over (default 15)")
    roles.add_argument("--leader-election-renew-deadline", type=float, default=10.0, metavar="SECONDS",
                       help="the leader stops leading when it could not renew for this long (default 10)")
    roles.add_argument("--leader-election-retry-period", type=float, default=2.0, metavar="SECONDS",
                       help="how often the leader renews and candidates try (default 2)")


def _leader_election(args: argparse.Namespace) -> LeaderElection:
    """The flags' Lease settings; ValueError says which values cannot work together."""
    from commands.serve import LeaderElection
    from quota.leases import Timing
    from webhook import certificates

    timing = Timing(args.leader_election_lease_duration, args.leader_election_renew_deadline,
                    args.leader_election_retry_period)
    problem = timing.problem()
    if problem is not None:
        raise ValueError(f"--leader-election-*: {problem}")
    return LeaderElection(args.leader_election_lease_name,
                          args.leader_election_namespace or certificates.default_namespace(), timing)


def _run_serve(args: argparse.Namespace) -> int:
    import asyncio

    from commands.serve import ServeError, ServeOptions, configure_logging, serve
    from quota.printable import for_terminal
    from webhook import certificates, connections

    configure_logging(args.log_format, args.log_level)
    if not (args.webhook or args.controller):
        print("error: --no-webhook and --no-controller together leave nothing to run", file=sys.stderr)
        return EXIT_INPUT
    if args.resync_period <= 0:
        print("error: --resync-period must be positive", file=sys.stderr)
        return EXIT_INPUT
    if not args.team_totals_refresh_period > 0:
        print("error: --team-totals-refresh-period must be positive", file=sys.stderr)
        return EXIT_INPUT
    hosts = [host.strip() for host in args.bind_address.split(",")]
    if not all(hosts):
        print(f"error: --bind-address {args.bind_address!r} has an empty address", file=sys.stderr)
        return EXIT_INPUT
    if len(hosts) > 1 and args.port == 0:
        print("error: --bind-address with several addresses needs a --port other than 0 (each would get its own)",
              file=sys.stderr)
        return EXIT_INPUT
    if not (args.lease_period == 0 or args.lease_period >= 1):
        # A window shorter than a status write's round trip would be renewed without end.
        print(f"error: --lease-period must be 0 (no leases) or at least 1 second, got {args.lease_period}",
              file=sys.stderr)
        return EXIT_INPUT
    if not 0 <= args.clock_skew <= 3600:
        print(f"error: --clock-skew must be between 0 and 3600 seconds, got {args.clock_skew}", file=sys.stderr)
        return EXIT_INPUT
    if not args.shutdown_delay >= 0:
        print(f"error: --shutdown-delay must be 0 or more, got {args.shutdown_delay}", file=sys.stderr)
        return EXIT_INPUT
    if args.team_namespace_series < 0:  # 0: each team's breakdown is its "(other)" alone
        print(f"error: --team-namespace-series must be 0 or more, got {args.team_namespace_series}", file=sys.stderr)
        return EXIT_INPUT
    files = args.tls_cert_file is not None or args.tls_key_file is not None
    mode = args.cert_mode or ("files" if files else "self")
    if (mode == "files") != files or (files and None in (args.tls_cert_file, args.tls_key_file)):
        print("error: --tls-cert-file and --tls-key-file go together, with --cert-mode files only", file=sys.stderr)
        return EXIT_INPUT
    try:
        self_managed = certificates.from_args(args) if mode == "self" else None
        election = _leader_election(args)
        limits = connections.from_args(args)
        memory_sources = _memory_sources(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INPUT
    options = ServeOptions(
        tls_cert_file=args.tls_cert_file, tls_key_file=args.tls_key_file, kubeconfig=args.kubeconfig,
        certificates=self_managed,
        bind_address=",".join(hosts), port=args.port, admin_access_policy=args.admin_access_policy,
        admin_access_configmap=args.admin_access_configmap,
        allocation_check=args.allocation_check, default_pricing=args.default_pricing, memory_sources=memory_sources,
        reservation_ttl=args.reservation_ttl, lease_period=args.lease_period, reuse_port=args.reuse_port, shutdown_delay_seconds=args.shutdown_delay,
        clock_skew=args.clock_skew,
        requeue_waiting_pods=args.requeue_waiting_pods,
        metrics_port=args.metrics_port, metrics_secure=args.metrics_secure, limits=limits,
        team_namespace_series=args.team_namespace_series,
        metrics_bind_address=args.metrics_bind_address or ("0.0.0.0" if args.metrics_secure else "127.0.0.1"),
        webhook=args.webhook, controller=args.controller, leader_election=election,
        resync_seconds=args.resync_period, team_totals_refresh_seconds=args.team_totals_refresh_period,
        kueue=args.kueue, kueue_retry_seconds=args.kueue_retry_seconds,
    )
    try:
        return asyncio.run(serve(options))
    except ServeError as err:
        print(f"error: {for_terminal(str(err))}", file=sys.stderr)
        return EXIT_INPUT


def _add_certs(sub: _Subparsers) -> None:
    from certs.authority import SERVICE

    certs = sub.add_parser("certs", help=_COMMANDS["certs"][0],
                           description="Make or read the webhook's CA and serving certificate by hand.")
    verbs = certs.add_subparsers(dest="verb", metavar="VERB", required=True)
    generate = verbs.add_parser(
        "generate", help="write ca.crt, ca.key, tls.crt, tls.key for the webhook Service",
        description="Mint a CA and a serving certificate for <service>.<namespace>.svc (and the "
                    "other Service names), as the server would: for --cert-mode files or to see what "
                    "it manages. Keys are written 0600; existing files are kept unless --force.")
    generate.add_argument("--service", default=SERVICE, help=f"webhook Service name (default {SERVICE})")
    generate.add_argument("--namespace", default="dra-quota-system", help="its namespace (default dra-quota-system)")
    generate.add_argument("--ip", dest="ips", action="append", default=[], metavar="IP",
                          help="also valid for this IP address (repeatable; e.g. 127.0.0.1 for local tests)")
    generate.add_argument("--days", type=int, default=365, help="serving certificate validity (default 365)")
    generate.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder to write into")
    generate.add_argument("--force", action="store_true", help="overwrite existing files")
    generate.set_defaults(run=_run_certs_generate)
    inspect = verbs.add_parser("inspect", help="print the certificates of a PEM file or bundle",
                               description="Subject, issuer, names, validity and fingerprint of each "
                                           "certificate in FILE (- for standard input).")
    inspect.add_argument("file", metavar="FILE", help="a PEM file (tls.crt, ca.crt, a bundle; - for stdin)")
    inspect.set_defaults(run=_run_certs_inspect)


def _run_certs_generate(args: argparse.Namespace) -> int:
    from certs.commands import CertsError, generate
    from quota.printable import for_terminal

    try:
        written = generate(args.out, service=args.service, namespace=args.namespace, ip_addresses=args.ips,
                           days=args.days, force=args.force)
    except (CertsError, OSError, ValueError) as err:
        print(f"error: {for_terminal(str(err))}", file=sys.stderr)
        return EXIT_INPUT
    for path in written:
        print(path)
    return EXIT_OK


def _run_certs_inspect(args: argparse.Namespace) -> int:
    from certs.commands import CertsError, describe
    from quota.printable import for_terminal

    try:
        # A PEM bundle is a few KiB; the bound keeps `inspect /dev/zero` from reading forever.
        if args.file == "-":
            pem = sys.stdin.buffer.read(_MAX_PEM_BYTES + 1)
        else:
            with open(args.file, "rb") as handle:
                pem = handle.read(_MAX_PEM_BYTES + 1)
        if len(pem) > _MAX_PEM_BYTES:
            raise CertsError(f"larger than {_MAX_PEM_BYTES} bytes: not a PEM bundle")
        print(describe(pem), end="")
    except (CertsError, OSError) as err:
        print(f"error: {for_terminal(f'{args.file}: {err}')}", file=sys.stderr)
        return EXIT_INPUT
    return EXIT_OK


class _ClusterUnreadable(Exception):
    """`check --from-cluster` could not list the cluster's state: exit 2, with this message."""


def _cluster_state(args: argparse.Namespace) -> list[Document]:
    """The cluster's DeviceClasses, ResourceSlices, Namespaces and quotas, as `check` reads
    files (only lists: a read-only command). No ClusterDeviceQuota CRD: no teams."""
    import asyncio

    import aiohttp
    from kube.loaders import ConfigException

    from kube.api import ApiError, KubeApi
    from kube.resources import CLASSES, CLUSTER_QUOTAS, NAMESPACES, QUOTAS, SLICES
    from quota.loader import Document

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


def _run_check(args: argparse.Namespace) -> int:
    from itertools import chain

    from quota.check import run_check
    from quota.inventory import gc_paused
    from quota.loader import CheckInputError, iter_documents
    from quota.memorysources import MemorySourcesError
    from quota.printable import for_terminal

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
                               memory_sources=_memory_sources(args), at=at)
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

    from quota.loader import CheckInputError
    from quota.windows import parse_time

    return datetime.now(UTC) if text is None else parse_time(text, "--at", CheckInputError)


def _charge(charge: Charge) -> tuple[str, str]:
    from quota.quantity import format_quantity

    return format_quantity(charge.memory), str(charge.devices)


def render_table(report: Report, out: TextIO) -> None:
    from quota.tables import USAGE_HEADERS, print_rows, usage_cells

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


# -- top ----------------------------------------------------------------------------------------

def _add_top(sub: _Subparsers) -> None:
    top = sub.add_parser(
        "top", help=_COMMANDS["top"][0],
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
    top.add_argument("--kubeconfig", metavar="FILE", help=_KUBECONFIG_HELP)
    top.add_argument("--context", help="kubeconfig context (default: the current one)")
    top.set_defaults(run=_run_top)


def _run_top(args: argparse.Namespace) -> int:
    import asyncio
    from datetime import UTC, datetime

    import aiohttp
    from kube.loaders import ConfigException

    from kube.api import ApiError
    from quota.devicequota import QuotaError
    from quota.printable import for_json, for_terminal
    from quota.tables import print_rows, top_tables
    from quota.top import applied_usage, quota_usage, team_usage

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
    from kube.api import ApiError, KubeApi
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
            # are in its namespace, as AppliedClusterDeviceQuotas (quota.applied).
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

    from kube.api import ApiError

    if isinstance(err, ApiError) and err.status == 404:
        return "the API server serves no draquota.io/v1alpha1 devicequotas: is the DeviceQuota CRD installed?"
    if isinstance(err, ApiError) and err.status in (401, 403):
        return f"not allowed to list DeviceQuotas: {err.message}"
    if isinstance(err, ConfigException):
        return f"cannot reach the cluster: {err}"
    return f"cannot read DeviceQuotas from the API server: {err or type(err).__name__}"


# -- demo ---------------------------------------------------------------------------------------

def _add_demo(sub: _Subparsers) -> None:
    demo = sub.add_parser(
        "demo", help=_COMMANDS["demo"][0],
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

    from commands import demo
    from quota.printable import for_json, for_terminal

    try:
        summary = demo.run(demo.DemoOptions(keep=args.keep, output=args.output), sys.stdout)
    except demo.DemoUnavailable as err:
        print(f"dra-quota demo: {for_terminal(str(err))}", file=sys.stderr)
        print("dra-quota demo: note: showing `dra-quota check -f examples/` instead: the same admission and "
              "accounting code on the example cluster, offline (no live webhook, scheduler or controller). "
              "Install Go >= 1.26 (or set MINIK8S_BIN) for the live demo.", file=sys.stderr)
        # The examples are package data: a directory of files in any pip-installed copy.
        with as_file(demo.examples()) as examples:
            return _run_check(argparse.Namespace(paths=[str(examples)], output=args.output, mode="conservative",
                                                 fail_on_deny=False, memory_sources=[], from_cluster=False,
                                                 default_memory_sources=True))
    except demo.DemoError as err:
        for line in str(err).splitlines():
            print(f"error: dra-quota demo: {for_terminal(line)}", file=sys.stderr)
        return EXIT_CLUSTER
    except KeyboardInterrupt:
        print("dra-quota demo: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    if args.output == "json":
        print(json.dumps(for_json(summary), indent=2))
    return EXIT_OK


def _add_report(sub: _Subparsers) -> None:
    from commands import report

    report.add_arguments(sub, summary=_COMMANDS["report"][0])


def _add_selftest(sub: _Subparsers) -> None:
    from commands import selftest

    selftest.add_arguments(sub, summary=_COMMANDS["selftest"][0], kubeconfig_help=_KUBECONFIG_HELP)


# name -> (its one-line help, the function defining its flags); the order of --help.
_COMMANDS: dict[str, tuple[str, Callable[[_Subparsers], None]]] = {
    "check": ("price and admit claims offline from YAML files (no cluster needed)", _add_check),
    "certs": ("generate or inspect webhook certificates", _add_certs),
    "serve": ("run the admission webhook against a cluster", _add_serve),
    "top": ("print each DeviceQuota's and ClusterDeviceQuota's usage as the quota controller published it",
            _add_top),
    "report": ("print GPU-memory-hours, device-hours and idle hours per namespace, team or model, from Prometheus",
               _add_report),
    "demo": ("run the webhook and quota controller live on a throw-away local cluster", _add_demo),
    "selftest": ("send a dry-run claim through the API server and check that the dra-quota webhook answered "
                 "(helm test)", _add_selftest),
}


if __name__ == "__main__":
    sys.exit(main())
