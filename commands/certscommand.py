"""`dra-quota certs generate` and `certs inspect`: their flags and the output.

Neighbours: `commands.cli` lists the subcommand and calls `add_arguments`;
`certs.commands` mints and describes the certificates. Exit 2 on a file that cannot be
written or read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from commands.commandflags import EXIT_INPUT, EXIT_OK, Subparsers

_MAX_PEM_BYTES = 1024 * 1024


def add_arguments(sub: Subparsers, *, summary: str) -> None:
    from certs.authority import SERVICE

    certs = sub.add_parser("certs", help=summary,
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
    from quota.reports.printable import for_terminal

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
    from quota.reports.printable import for_terminal

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
