"""The `dra-quota` command line.

Neighbours: `quota.check` does the work of `check`, `webhook.serve` of `serve`,
`certs.commands` of `certs`. This module parses flags, renders
tables and maps failures to exit codes: 0 when it ran, 2 on unreadable input.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from certs.commands import CertsError, describe, generate
from quota.check import Report, run_check
from quota.inventory import gc_paused
from quota.loader import CheckInputError, iter_documents
from quota.devicequota import format_amount
from quota.model import Charge
from quota.printable import for_terminal
from quota.quantity import format_quantity
from webhook import certificates
from webhook.adminpolicy import configmap_ref
from webhook.serve import LIMITATIONS, ServeError, ServeOptions, configure_logging, serve

EXIT_OK = 0
EXIT_INPUT = 2
_MAX_PEM_BYTES = 1024 * 1024


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dra-quota",
        description="GPU-memory quotas and usage accounting for Kubernetes DRA ResourceClaims.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    check = sub.add_parser(
        "check",
        help="price and admit claims offline from YAML files (no cluster needed)",
        description=(
            "Load DeviceClasses, ResourceSlices, Namespaces, DeviceQuotas, ResourceClaims and "
            "ResourceClaimTemplates from files or folders and run the webhook's admission and "
            "accounting code over them. Exit 0 when it ran, 2 on unreadable input."
        ),
    )
    check.add_argument("-f", "--filename", dest="paths", action="extend", nargs="+", required=True,
                       metavar="PATH", help="YAML/JSON file or folder (repeatable; multi-document files)")
    check.add_argument("-o", "--output", choices=("table", "json"), default="table")
    check.add_argument("--mode", choices=("conservative", "optimistic"), default="conservative",
                       help="price unallocated claims at the largest (default) or smallest candidate")
    check.set_defaults(run=_run_check)
    _add_certs(sub)
    _add_serve(sub)
    return parser


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser(
        "serve", help="run the admission webhook against a cluster",
        description="Serve the validating and mutating admission webhook over HTTPS, with caches of "
                    "ResourceSlices, DeviceClasses, Namespaces, DeviceQuotas and ResourceClaims kept by "
                    f"list+watch. {LIMITATIONS} Stops cleanly on SIGTERM or SIGINT (exit 0).")
    serve.add_argument("--kubeconfig", metavar="FILE",
                       help="kubeconfig to reach the API server (default: the Pod's service account)")
    serve.add_argument("--bind-address", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
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
    serve.add_argument("--default-pricing", choices=("conservative", "optimistic"), default="conservative",
                       help="price unallocated claims at the largest (default) or smallest candidate")
    serve.add_argument("--reservation-ttl", type=float, default=60.0, metavar="SECONDS",
                       help="an admitted claim's reservation is persisted on the DeviceQuota status and "
                            "counted by every replica until its claim is seen, at most this long: an "
                            "entry whose claim never appeared is dropped after it; keep it longer than "
                            "any replica's watch lag (default 60)")
    serve.add_argument("--reuse-port", action="store_true",
                       help="SO_REUSEPORT: let several replicas on one host listen on --port")
    serve.add_argument("--log-format", choices=("text", "json"), default="text")
    serve.add_argument("--log-level", choices=("debug", "info", "warning"), default="info",
                       help="info logs denials, debug also every allowed review (default info)")
    serve.set_defaults(run=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    configure_logging(args.log_format, args.log_level)
    files = args.tls_cert_file is not None or args.tls_key_file is not None
    mode = args.cert_mode or ("files" if files else "self")
    if (mode == "files") != files or (files and None in (args.tls_cert_file, args.tls_key_file)):
        print("error: --tls-cert-file and --tls-key-file go together, with --cert-mode files only", file=sys.stderr)
        return EXIT_INPUT
    try:
        self_managed = certificates.from_args(args) if mode == "self" else None
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INPUT
    options = ServeOptions(
        tls_cert_file=args.tls_cert_file, tls_key_file=args.tls_key_file, kubeconfig=args.kubeconfig,
        certificates=self_managed,
        bind_address=args.bind_address, port=args.port, admin_access_policy=args.admin_access_policy,
        admin_access_configmap=args.admin_access_configmap,
        allocation_check=args.allocation_check, default_pricing=args.default_pricing,
        reservation_ttl=args.reservation_ttl, reuse_port=args.reuse_port,
    )
    try:
        return asyncio.run(serve(options))
    except ServeError as err:
        print(f"error: {for_terminal(str(err))}", file=sys.stderr)
        return EXIT_INPUT


def _add_certs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = sub.add_parser("certs", help="generate or inspect webhook certificates",
                           description="Make or read the webhook's CA and serving certificate by hand.")
    verbs = certs.add_subparsers(dest="verb", metavar="VERB", required=True)
    generate = verbs.add_parser(
        "generate", help="write ca.crt, ca.key, tls.crt, tls.key for the webhook Service",
        description="Mint a CA and a serving certificate for <service>.<namespace>.svc (and the "
                    "other Service names), as the server would: for --cert-mode files or to see what "
                    "it manages. Keys are written 0600; existing files are kept unless --force.")
    generate.add_argument("--service", default="dra-quota", help="webhook Service name (default dra-quota)")
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
    inspect.add_argument("file", metavar="FILE")
    inspect.set_defaults(run=_run_certs_inspect)


def _run_certs_generate(args: argparse.Namespace) -> int:
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


def _run_check(args: argparse.Namespace) -> int:
    load_warnings: list[str] = []
    try:
        # Documents are parsed as they are read, so a large dump's raw objects are never
        # all alive at once; the collector is paused while tens of thousands of acyclic
        # objects are built (measured on the 5,000-node dump: 7.1 s/496 MB -> 4.1 s/350 MB).
        with gc_paused():
            report = run_check(iter_documents(args.paths, load_warnings), mode=args.mode)
    except CheckInputError as err:
        print(f"error: {for_terminal(str(err))}", file=sys.stderr)
        return EXIT_INPUT
    for warning in (*load_warnings, *report.warnings):
        print(f"warning: {for_terminal(warning)}", file=sys.stderr)
    if args.output == "json":
        print(report.dumps())
    else:
        render_table(report, sys.stdout)
    return EXIT_OK


def _charge(charge: Charge) -> tuple[str, str]:
    return format_quantity(charge.memory), str(charge.devices)


def render_table(report: Report, out: TextIO) -> None:
    rows: list[tuple[str, ...]] = [("KIND", "NAMESPACE", "NAME", "DECISION", "MEMORY", "DEVICES", "DETAILS")]
    for obj in report.objects:
        decision = "allocated" if obj.allocated else ("allowed" if obj.allowed else "DENIED")
        details = [obj.reason] if obj.reason else []
        details.extend(f"warning: {w}" for w in obj.warnings)
        rows.append((obj.kind, obj.namespace, obj.name, decision, *_charge(obj.charge), "; ".join(details)))
    _print_rows(rows, out)
    if report.quotas:
        out.write("\n")
        quota_rows: list[tuple[str, ...]] = [("QUOTA", "NAMESPACE", "MEMORY used/reserved/hard", "DEVICES used/reserved/hard")]
        for q in report.quotas:
            cells = []
            for resource in ("memory", "devices"):
                used, reserved = q["used"][resource], q["reserved"][resource]
                hard = q["hard"].get(resource)
                cells.append(" / ".join(
                    format_amount(resource, v) if v is not None else "-" for v in (used, reserved, hard)
                ))
            quota_rows.append((q["name"], q["namespace"], *cells))
        _print_rows(quota_rows, out)


def _print_rows(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    # The last column (details) is free text and is not padded. Every cell is escaped:
    # one row per object, whatever its name or reason holds.
    rows = [[for_terminal(cell) for cell in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        out.write("  ".join((*cells, row[-1])).rstrip() + "\n")


if __name__ == "__main__":
    sys.exit(main())
