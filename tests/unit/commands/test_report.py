"""commands.report against a loopback stand-in for Prometheus' HTTP API: what it asks, what it
sends (token, CA), and the one-line errors with exit 2."""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from commands import cli
from commands.report import ReportError, build
from quota.reports.showbackreport import GIB, render

from devcluster.processes import free_ports

ASYNC = pytest.mark.asyncio(loop_scope="session")  # the fixtures' loop

NOW = datetime(2026, 12, 1, tzinfo=UTC)
Answer = Callable[[str], list[dict[str, Any]]]


def vector(value: float, **labels: str) -> list[dict[str, Any]]:
    return [{"metric": labels, "value": [NOW.timestamp(), str(value)]}]


def healthy(query: str) -> list[dict[str, Any]]:
    if query.startswith("max_over_time("):
        return vector(1)
    if "draquota_allocated_memory" in query:
        return vector(80 * GIB * 3600, namespace="team-a") if "by (namespace)" in query and "sum(" not in query \
            else vector(80 * GIB * 3600)
    if "draquota_allocated_device" in query:
        return vector(3600, namespace="team-a") if "sum(" not in query else vector(3600)
    return []  # no idle series


class Fake:
    def __init__(self) -> None:
        self.answer: Answer = healthy
        self.status = 200
        self.seen: list[dict[str, str]] = []
        self.headers: list[str] = []
        self.scraped_steps: set[float] | None = None  # None: every step led

    async def query(self, request: web.Request) -> web.Response:
        self.seen.append(dict(request.query))
        self.headers.append(request.headers.get("Authorization", ""))
        if self.status != 200:
            return web.Response(status=self.status, text="Unauthorized")
        return web.json_response({"status": "success",
                                  "data": {"resultType": "vector", "result": self.answer(request.query["query"])}})

    async def query_range(self, request: web.Request) -> web.Response:
        start, end = float(request.query["start"]), float(request.query["end"])
        step = float(request.query["step"].rstrip("s"))
        values, t = [], start
        while t <= end:
            if self.scraped_steps is None or t in self.scraped_steps:
                values.append([t, "1"])
            t += step
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {}, "values": values}]}})


def free_port() -> int:
    return free_ports(1)[0]


async def serve(fake: Fake) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/api/v1/query", fake.query)
    app.router.add_get("/api/v1/query_range", fake.query_range)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


@pytest_asyncio.fixture(loop_scope="session")
async def prometheus() -> AsyncIterator[tuple[Fake, str]]:
    fake = Fake()
    runner, url = await serve(fake)
    try:
        yield fake, url
    finally:
        await runner.cleanup()


@pytest.fixture
def prometheus_thread() -> Iterator[str]:
    """The stand-in on a loop of its own: `cli.main` runs its own event loop."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner, url = asyncio.run_coroutine_threadsafe(serve(Fake()), loop).result(timeout=10)
    try:
        yield url
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def args(*extra: str) -> argparse.Namespace:
    return cli._parser("report").parse_args(["report", *extra])


@ASYNC
async def test_a_month_by_namespace_sends_the_token_and_asks_at_the_end(prometheus: tuple[Fake, str],
                                                                        tmp_path: Path) -> None:
    fake, url = prometheus
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    report = await build(args("--prometheus", url, "--from", "2026-11-01", "--to", "2026-12-01",
                              "--token-file", str(token)), NOW)
    assert [(r.key, r.memory_gib_hours, r.device_hours, r.idle_gib_hours) for r in report.rows] == [
        ("team-a", 80.0, 1.0, None)]
    assert set(fake.headers) == {"Bearer s3cret"}
    assert {q["time"] for q in fake.seen} == {f"{NOW.timestamp():.3f}"}
    assert any("[2592000s]" in q["query"] for q in fake.seen)
    assert [w for w in report.warnings if "idle" in w]
    assert render(report, "table").splitlines()[2].split() == ["team-a", "80.00", "1.00", "-"]


@ASYNC
async def test_unreachable_prometheus() -> None:
    with pytest.raises(ReportError, match=r"cannot reach Prometheus at http://127\.0\.0\.1:\d+"):
        await build(args("--prometheus", f"http://127.0.0.1:{free_port()}", "--from", "now-1h"), NOW)


@ASYNC
async def test_a_refused_token_says_so(prometheus: tuple[Fake, str]) -> None:
    fake, url = prometheus
    fake.status = 401
    with pytest.raises(ReportError, match="HTTP 401.*--token-file"):
        await build(args("--prometheus", url, "--from", "now-1h"), NOW)


@ASYNC
async def test_no_dra_quota_series_asks_whether_prometheus_scrapes_it(prometheus: tuple[Fake, str]) -> None:
    fake, url = prometheus
    fake.answer = lambda _query: []
    with pytest.raises(ReportError, match="no draquota_leader series .* is Prometheus scraping dra-quota"):
        await build(args("--prometheus", url, "--from", "now-1h"), NOW)


@ASYNC
async def test_a_range_with_gaps_is_refused_unless_allowed(prometheus: tuple[Fake, str]) -> None:
    fake, url = prometheus
    start = NOW.timestamp() - 3600
    fake.scraped_steps = {start + 60 * i for i in range(1, 61) if not 10 <= i <= 20}
    with pytest.raises(ReportError, match="gaps.*no replica scraped"):
        await build(args("--prometheus", url, "--from", "now-1h"), NOW)
    report = await build(args("--prometheus", url, "--from", "now-1h", "--allow-gaps"), NOW)
    assert [w for w in report.warnings if w.startswith("gaps, not counted")]


@ASYNC
async def test_a_range_that_ends_before_it_starts() -> None:
    with pytest.raises(ReportError, match="must be before"):
        await build(args("--prometheus", "http://127.0.0.1:1", "--from", "now", "--to", "now-1d"), NOW)


def test_exit_2_with_one_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", "--prometheus", f"http://127.0.0.1:{free_port()}", "--from", "now-1h"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach Prometheus") and err.count("\n") == 1


def test_json_output_of_the_whole_command(prometheus_thread: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", "--prometheus", prometheus_thread, "--from", "now-1h", "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["rows"][0]["namespace"] == "team-a" and document["total"]["deviceHours"] == 1.0
