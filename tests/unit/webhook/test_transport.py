"""How a review's bytes arrive does not change its answer.

Over real TLS sockets to the app behind `TlsSite`, as `serve` runs it: a review cut into
many writes, sent a byte at a time, chunked, exactly at the size limit, one byte over it
(declared up front or found while reading a chunked body). Every whole review is
answered for what it says, with its uid; an oversized one is refused with our message
and its uid (the API server then shows our words, not a failed call); no answer names
the Python or aiohttp version.
"""

from __future__ import annotations

import copy
import json
import logging
import ssl

import pytest

from kube.admissionreview import AdmissionRequest, Verdict
from webhook.server import SERVER

from ..clock import until
from ..kube.test_admissionreview import REVIEW
from .wire import Wire, exchange, post, serving

pytestmark = pytest.mark.asyncio(loop_scope="session")
LIMIT = 64 * 1024
UID = REVIEW["request"]["uid"]


async def allow(request: AdmissionRequest) -> Verdict:
    return Verdict(True, warnings=(f"seen {request.name} with {len(request.object or {})} fields",))


def padded(size: int) -> bytes:
    """REVIEW as the API server orders it (uid first in request), its claim carrying an
    annotation that makes the body `size` bytes: valid JSON only when read whole."""
    def body(pad: int) -> bytes:
        out = copy.deepcopy(REVIEW)
        out["request"]["object"]["metadata"]["annotations"] = {"example.com/pad": "x" * pad}
        return json.dumps(out).encode()

    data = body(size - len(body(0)))
    assert len(data) == size
    return data


async def review_of(data: bytes, *, pieces: int = 1, pause: float = 0.0) -> dict[str, object]:
    async with serving({"/validate": allow}, max_body_bytes=LIMIT) as served:
        answer = await exchange(served.port, data, pieces=pieces, pause=pause)
    assert answer.status == 200, answer
    review: dict[str, object] = answer.review()
    return review


@pytest.mark.parametrize("pieces,pause", [(2, 0.02), (40, 0.005), (400, 0.001)], ids=["halves", "forty", "400-writes"])
async def test_a_review_cut_into_pieces_is_read_whole(pieces: int, pause: float) -> None:
    review = await review_of(post(padded(20 * 1024)), pieces=pieces, pause=pause)
    assert review["uid"] == UID and review["allowed"] is True, review


async def test_a_review_sent_a_byte_at_a_time_is_read_whole() -> None:
    data = post(json.dumps(REVIEW).encode())
    review = await review_of(data, pieces=len(data), pause=0.001)
    assert review["uid"] == UID and review["allowed"] is True, review


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_review_of_exactly_the_limit_is_read(chunked: bool) -> None:
    review = await review_of(post(padded(LIMIT), chunked=chunked), pieces=7, pause=0.01)
    assert review["uid"] == UID and review["allowed"] is True, review


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_one_byte_over_the_limit_is_refused_with_our_message_and_the_uid(chunked: bool) -> None:
    review = await review_of(post(padded(LIMIT + 1), chunked=chunked), pieces=7, pause=0.01)
    assert review["uid"] == UID and review["allowed"] is False
    assert review["status"] == {"code": 413, "reason": "RequestEntityTooLarge",
                                "message": f"the AdmissionReview is larger than {LIMIT} bytes"}, review


async def test_an_oversized_declared_body_is_refused_before_it_is_sent() -> None:
    """Content-Length over the limit: answered from the first bytes; the rest is never sent."""
    async with serving({"/validate": allow}, max_body_bytes=LIMIT) as served:
        wire = await Wire.open(served.port)
        try:
            await wire.send(post(padded(1024), length=LIMIT * 100))
            answer = await wire.answer()
            assert answer.review()["uid"] == UID and answer.review()["status"]["code"] == 413
            assert await wire.closed_by_server()
        finally:
            await wire.close()


async def test_the_rest_of_a_body_refused_for_its_size_is_never_read() -> None:
    """A client that goes on sending after its 413 (bench/attacks.py's 9 MiB reviews): the
    server reads none of it (`Connections.hang_up`) and drops the connection once the
    answer had its grace, with the rest unread: a reset, where reading and discarding it
    all (aiohttp's lingering close) ended in an orderly close."""
    data = post(padded(LIMIT * 20))
    async with serving({"/validate": allow}, max_body_bytes=LIMIT) as served:
        wire = await Wire.open(served.port)
        try:
            await wire.send(data[:4096])
            answer = await wire.answer()
            assert answer.review()["uid"] == UID and answer.review()["status"]["code"] == 413
            wire.writer.write(data[4096:])  # not drained: the kernel and asyncio hold what the server does not read
            with pytest.raises((ConnectionResetError, ssl.SSLError)):
                while await wire.reader.read(65536):
                    pass
        finally:
            await wire.close()
        await until(lambda: len(served.connections) == 0, what="the connection to be dropped")


@pytest.mark.parametrize("head,uid", [
    (b'{"request":{"uid":"u-1"', "u-1"),
    (b"  " + json.dumps(REVIEW).encode()[:200], UID),
    (b'{"kind":"AdmissionReview","request":{"kind":{"uid":"not-this"}', ""),
    (b'{"request":{"uid":"' + b"x" * 200 + b'"', ""),
    (b'{"request":{"uid":"a\\"b"', ""),
    (b"not json at all", ""),
], ids=["short", "leading-space", "uid-not-first", "uid-too-long", "escaped-quote", "garbage"])
async def test_the_uid_of_an_oversized_body_is_found_only_where_the_api_server_puts_it(head: bytes, uid: str) -> None:
    review = await review_of(post(head + b"x" * (LIMIT + 1 - len(head)), chunked=True))
    assert review["uid"] == uid and review["allowed"] is False, review


async def test_malformed_http_is_refused_without_a_traceback_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    """The parser's 400 is aiohttp's (a review needs well-formed HTTP); what a client
    sends must not fill our log with tracebacks."""
    broken = post(json.dumps(REVIEW).encode(), chunked=True).replace(b"0\r\n\r\n", b"zz\r\n\r\n")
    async with serving({"/validate": allow}) as served:
        answer = await exchange(served.port, broken)
    assert answer.status == 400
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.records


@pytest.mark.parametrize("request_line", [
    b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /nothing-here HTTP/1.1\r\nHost: x\r\n\r\n",
    b"BREW /validate HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
], ids=["review", "healthz", "404", "405", "parser-400"])
async def test_no_answer_names_python_or_aiohttp(request_line: bytes) -> None:
    async with serving({"/validate": allow}) as served:
        answer = await exchange(served.port, request_line)
    assert answer.headers.get("server") == SERVER, (answer.status, answer.headers)
