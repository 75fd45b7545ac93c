"""`dra-quota report`: GPU-memory-hours, device-hours and idle hours per namespace, team or model.

Neighbours: `commands.cli` lists the subcommand and calls `add_arguments`;
`quota.reports.showbackreport` builds the queries, rows, gaps and output; this module asks
Prometheus' HTTP API (`/api/v1/query`, `/api/v1/query_range`) with aiohttp, with a
bearer token and a CA as the user's Prometheus needs (an OpenShift or
kube-prometheus Prometheus behind an authenticating proxy). Read-only: nothing is sent
but GET queries.

Exit 0 with the report; 2 with one line saying what went wrong: Prometheus unreachable
or refusing, no dra-quota series in the range (not scraped), a range with gaps (no
replica scraped, or none led, for a while: the totals would miss it; `--allow-gaps`
prints it anyway, the gaps on stderr), bad flags.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from commands.commandflags import Subparsers

if TYPE_CHECKING:
    from quota.reports.showbackreport import Report

EXIT_OK, EXIT_FAILED = 0, 2


class ReportError(Exception):
    """What to tell the user, as it is (exit 2)."""


def add_arguments(sub: Subparsers, *, summary: str) -> None:
    report = sub.add_parser(
        "report", help=summary,
        description="Ask Prometheus how much GPU memory and how many devices each namespace, team "
                    "(ClusterDeviceQuota) or device model was allocated between --from and --to, in GiB-hours "
                    "and device-hours, and how many of those GiB-hours were allocated while the GPU was idle "
                    "(under 5% utilisation: needs dcgm-exporter and the chart's recording rules), with totals. "
                    "Reads dra-quota's showback counters as Prometheus scraped them. Exit 0 with the report, 2 "
                    "when Prometheus cannot be asked, holds no dra-quota series, or the range has gaps.")
    report.add_argument("--prometheus", required=True, metavar="URL",
                        help="Prometheus' base URL (http://prometheus.monitoring:9090, or a proxy path ending "
                             "before /api/v1)")
    report.add_argument("--from", dest="start", required=True, metavar="TIME",
                        help="start of the range: RFC 3339 (2026-11-01T00:00:00Z), a date (midnight UTC), or "
                             "now-30d (s, m, h, d, w)")
    report.add_argument("--to", dest="end", default="now", metavar="TIME", help="end of the range (default now)")
    report.add_argument("--by", choices=("namespace", "team", "model"), default="namespace",
                        help="one row per namespace, team (the ClusterDeviceQuota selecting the namespace at --to) "
                             "or device model (default namespace)")
    report.add_argument("-o", "--output", choices=("table", "csv", "json"), default="table",
                        help="a table with totals (default), CSV (a header and a row each, no totals), or JSON")
    report.add_argument("--token-file", type=Path, metavar="FILE",
                        help="send the file's content as a bearer token (Authorization: Bearer)")
    report.add_argument("--ca-file", type=Path, metavar="FILE",
                        help="PEM CA bundle to verify Prometheus' HTTPS certificate (default: the system's)")
    report.add_argument("--allow-gaps", action="store_true",
                        help="print the report even when the range has gaps (listed on stderr)")
    report.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="give up on a query after this long (default 60)")
    report.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from quota.reports.printable import for_terminal
    from quota.reports.showbackreport import render

    try:
        report = asyncio.run(build(args, datetime.now(UTC)))
    except ReportError as err:
        print(f"error: {for_terminal(str(err))}", file=sys.stderr)
        return EXIT_FAILED
    for warning in report.warnings:
        print(f"warning: {for_terminal(warning)}", file=sys.stderr)
    sys.stdout.write(render(report, args.output))
    return EXIT_OK


async def build(args: argparse.Namespace, now: datetime) -> Report:
    from quota.reports.showbackreport import IDLE, LEADER, MEMORY, describe, gaps, parse_time, presence_query, queries, \
        rows_of, step_for

    try:
        start, end = parse_time(args.start, now), parse_time(args.end, now)
    except ValueError as err:
        raise ReportError(str(err)) from None
    seconds = round((end - start).total_seconds())
    if seconds < 1:
        raise ReportError(f"--from ({args.start}) must be before --to ({args.end})")
    async with _Prometheus(args.prometheus, args.token_file, args.ca_file, args.timeout) as prometheus:
        step = step_for(seconds)
        at = end.timestamp()
        if not await prometheus.query(f"max_over_time({LEADER}[{seconds}s])", at):
            raise ReportError(f"no {LEADER} series between {args.start} and {args.end} in {args.prometheus}: "
                              "is Prometheus scraping dra-quota (serve's --metrics-port)?")
        warnings = []
        if not await prometheus.query(f"max_over_time({MEMORY}[{seconds}s])", at):
            warnings.append(f"no {MEMORY} series in the range: nothing was allocated, or dra-quota predates "
                            "showback")
        points = await prometheus.query_range(presence_query(step), start.timestamp(), at, step)
        holes = gaps(points, start.timestamp(), at, step)
        if holes:
            listed = describe(holes)
            if not args.allow_gaps:
                raise ReportError(f"the range has gaps, so its totals would miss them: {listed} "
                                  "(--allow-gaps reports anyway)")
            warnings.append(f"gaps, not counted: {listed}")
        answers = {name: await prometheus.query(expr, at) for name, expr in queries(args.by, seconds).items()}
        if not answers["total_idle"]:
            warnings.append(f"no idle figures: no {IDLE} series (the chart's recording rules, and "
                            "dcgm-exporter scraped by the same Prometheus)")
    return rows_of(args.by, answers, start, end, warnings)


class _Prometheus:
    """GETs to /api/v1, every failure a ReportError naming what failed."""

    def __init__(self, url: str, token_file: Path | None, ca_file: Path | None, timeout: float) -> None:
        self.base = url.rstrip("/")
        self.token_file, self.ca_file, self.timeout = token_file, ca_file, timeout
        self.headers: dict[str, str] = {}
        self._session: Any = None

    async def __aenter__(self) -> _Prometheus:
        import ssl

        import aiohttp

        if self.token_file is not None:
            try:
                self.headers["Authorization"] = f"Bearer {self.token_file.read_text().strip()}"
            except OSError as err:
                raise ReportError(f"cannot read --token-file: {err}") from None
        context: ssl.SSLContext | bool = True
        if self.ca_file is not None:
            try:
                context = ssl.create_default_context(cafile=str(self.ca_file))
            except (OSError, ssl.SSLError) as err:
                raise ReportError(f"cannot read --ca-file: {err}") from None
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context),
                                              timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._session.close()

    async def query(self, expr: str, at: float) -> list[Mapping[str, Any]]:
        data = await self._get("query", {"query": expr, "time": f"{at:.3f}"})
        result: list[Mapping[str, Any]] = data["result"]
        return result

    async def query_range(self, expr: str, start: float, end: float, step: int) -> list[tuple[float, float]]:
        data = await self._get("query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                               "step": f"{step}s"})
        return [(float(t), float(v)) for series in data["result"] for t, v in series["values"]]

    async def _get(self, path: str, params: dict[str, str]) -> Any:
        import aiohttp

        url = f"{self.base}/api/v1/{path}"
        try:
            async with self._session.get(url, params=params, headers=self.headers) as resp:
                if resp.status in (401, 403):
                    raise ReportError(f"Prometheus at {self.base} refused the query (HTTP {resp.status}): "
                                      "pass --token-file with a token it accepts")
                try:
                    body = await resp.json(content_type=None)
                except ValueError:
                    raise ReportError(f"{url} answered HTTP {resp.status} with no Prometheus API response: "
                                      "is --prometheus Prometheus' base URL?") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise ReportError(f"cannot reach Prometheus at {self.base}: {str(err) or type(err).__name__}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            what = body.get("error") if isinstance(body, dict) else body
            raise ReportError(f"Prometheus refused {params['query']!r}: {what}")
        return body["data"]
