"""`dra-quota serve`'s flags, and turning them into `ServeOptions`.

Neighbours: `commands.cli` lists the subcommand and calls `add_arguments`;
`commands.options` holds `ServeOptions`, `commands.serve.serve` runs them;
`webhook.certificates` and `webhook.connections` add and read their own flags.
Exit 2 on flags that cannot work together, with one line saying why.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from commands.commandflags import EXIT_INPUT, KUBECONFIG_HELP, Subparsers, memory_source_flags, memory_sources

if TYPE_CHECKING:
    from commands.serve import LeaderElection


def add_arguments(sub: Subparsers, *, summary: str) -> None:
    from commands.serve import LIMITATIONS
    from webhook import certificates, connections
    from webhook.adminpolicy import configmap_ref
    from quota.status.breakdown import DEFAULT_SERIES
    from webhook.metrics import DEFAULT_METRICS_PORT

    serve = sub.add_parser(
        "serve", help=summary,
        description="Serve the validating admission webhook over HTTPS, with caches of "
                    "ResourceSlices, DeviceClasses, Namespaces, DeviceQuotas and ResourceClaims kept by "
                    f"list+watch. {LIMITATIONS} Stops cleanly on SIGTERM or SIGINT (exit 0).")
    serve.add_argument("--kubeconfig", metavar="FILE", help=KUBECONFIG_HELP)
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
    memory_source_flags(serve)
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
    serve.set_defaults(run=run)


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
    from quota.status.leases import Timing
    from webhook import certificates

    timing = Timing(args.leader_election_lease_duration, args.leader_election_renew_deadline,
                    args.leader_election_retry_period)
    problem = timing.problem()
    if problem is not None:
        raise ValueError(f"--leader-election-*: {problem}")
    return LeaderElection(args.leader_election_lease_name,
                          args.leader_election_namespace or certificates.default_namespace(), timing)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from commands.serve import ServeError, ServeOptions, configure_logging, serve
    from quota.reports.printable import for_terminal
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
        sources = memory_sources(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INPUT
    options = ServeOptions(
        tls_cert_file=args.tls_cert_file, tls_key_file=args.tls_key_file, kubeconfig=args.kubeconfig,
        certificates=self_managed,
        bind_address=",".join(hosts), port=args.port, admin_access_policy=args.admin_access_policy,
        admin_access_configmap=args.admin_access_configmap,
        allocation_check=args.allocation_check, default_pricing=args.default_pricing, memory_sources=sources,
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
