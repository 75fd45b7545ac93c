"""Fuzzing the served app in-process: any body POSTed to it gets HTTP 200 and a review back.

What `dra-quota serve` mounts (`webhook.server.build_app` over `webhook.endpoints`),
served by aiohttp on loopback, is sent random bytes, random JSON, mutated
AdmissionReviews (a random or hostile value spliced in at a random place of a realistic
review, from test_claimreview's bases) and byte-level damage to valid reviews (truncation,
a flipped byte), wired as `serve` wires it: reservations persisted on DeviceQuota status
(over the scripted API server of tests/unit/kube/scripted.py). Every answer must be HTTP
200 with a well-formed AdmissionReview carrying the request's uid when the body had one
(as `respond` writes it: escaped for terminals), a denial must say why, and nothing
may be logged as an error or with a traceback: the server turns an endpoint that
raises into a denial (never a 500), so a bug would otherwise pass unseen. Each example
runs under `bounded()`. DRA_QUOTA_FUZZ_EXAMPLES sets the count (bench/fuzz.py runs a
long one). The parsers and handlers are fuzzed without HTTP in test_review and
test_claimreview; this adds the body decoding, the size limit, the deadline, the logging
and the answer's encoding.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.reports.printable import for_terminal
from webhook.claimreview import ClaimContext
from webhook.endpoints import endpoints
from webhook.server import build_app

from ..bounds import bounded, fuzz_examples
from ..builders import make_quota
from ..quota.objects.test_fuzz_parsers import json_values, paths, splice, values
from .test_claimreview import ADMIN_LABELS, BASES, GPUS, context
from ..kube.test_admissionreview import REVIEW

MAX_BODY = 256 * 1024
AUDIT = make_quota("audit", memory="1Gi", enforcement="Audit")
REVIEWS = [REVIEW, *BASES]
PATHS = ("/validate", "/mutate")
NESTED_TOO_DEEPLY = b"malformed AdmissionReview: the body is not JSON: nested too deeply"


class Errors(logging.Handler):
    """Records anything logged at ERROR or above, or with a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(record)


@dataclasses.dataclass
class App:
    loop: asyncio.AbstractEventLoop
    client: TestClient[Any, Any]
    errors: Errors

    def post(self, path: str, body: bytes) -> tuple[int, str, bytes]:
        async def call() -> tuple[int, str, bytes]:
            async with self.client.post(path, data=body, headers={"Content-Type": "application/json"}) as resp:
                return resp.status, resp.content_type, await resp.read()

        return self.loop.run_until_complete(call())


@pytest.fixture(scope="module")
def app() -> Iterator[App]:
    # A loop of our own: hypothesis calls the test synchronously, once per example.
    loop = asyncio.new_event_loop()
    async def start(ctx: ClaimContext) -> TestClient[Any, Any]:
        server = TestServer(build_app(endpoints(ctx), ready=lambda: True, max_body_bytes=MAX_BODY), host="127.0.0.1")
        client: TestClient[Any, Any] = TestClient(server)  # binds to the running loop
        await client.start_server()
        return client

    client = loop.run_until_complete(start(context(GPUS, AUDIT, labels=ADMIN_LABELS)))
    errors = Errors()
    for name in ("webhook", "quota", "aiohttp"):
        logging.getLogger(name).addHandler(errors)
    try:
        yield App(loop, client, errors)
    finally:
        for name in ("webhook", "quota", "aiohttp"):
            logging.getLogger(name).removeHandler(errors)
        loop.run_until_complete(client.close())
        loop.close()


def expected_uid(body: bytes) -> tuple[str, int]:
    """The uid the answer must carry (the request's, when the body is a JSON object whose
    `request.uid` is a string; "" otherwise: nothing to echo), and how deep the body nests."""
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError):
        return "", 0
    request = decoded.get("request") if isinstance(decoded, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    return (for_terminal(uid) if isinstance(uid, str) and len(body) <= MAX_BODY else ""), depth(decoded)


def depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, level + 1) for child in children)
    return deepest


def encoded(value: Any) -> bytes | None:
    try:
        return json.dumps(value).encode()
    except (ValueError, RecursionError):  # over Python's 4,300-digit str() limit, or nested too deep to encode
        return None


def mutated_review(data: st.DataObject) -> bytes | None:
    body = copy.deepcopy(data.draw(st.sampled_from(REVIEWS)))
    return encoded(splice(body, data.draw(st.sampled_from(paths(body))), data.draw(values)))


def damaged_review(data: st.DataObject) -> bytes:
    raw = json.dumps(data.draw(st.sampled_from(REVIEWS))).encode()
    at = data.draw(st.integers(0, len(raw) - 1))
    if data.draw(st.booleans()):
        return raw[:at]
    return raw[:at] + bytes([data.draw(st.integers(0, 255))]) + raw[at + 1:]


def body_of(data: st.DataObject) -> bytes | None:
    kind = data.draw(st.sampled_from(["bytes", "json", "mutated", "mutated", "mutated", "damaged"]))
    if kind == "bytes":
        return data.draw(st.binary(max_size=512) | st.just(b" " * (MAX_BODY + 1)))
    if kind == "json":
        return encoded(data.draw(json_values))
    if kind == "mutated":
        return mutated_review(data)
    return damaged_review(data)


def assert_well_formed(status: int, content_type: str, raw: bytes, uid: str) -> None:
    assert (status, content_type) == (200, "application/json"), (status, raw[:300])
    review = json.loads(raw.decode("utf-8"))
    assert (review["apiVersion"], review["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response = review["response"]
    assert response["uid"] == uid
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert isinstance(response["status"]["message"], str) and response["status"]["message"]
        assert isinstance(response["status"]["code"], int) and "patch" not in response
    if "patch" in response:
        assert response["patchType"] == "JSONPatch"
        assert isinstance(json.loads(base64.b64decode(response["patch"])), list)
    assert all(isinstance(w, str) for w in response.get("warnings", []))


@settings(max_examples=fuzz_examples(150), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(st.data(), st.sampled_from(PATHS))
def test_fuzz_every_body_gets_a_well_formed_review_and_nothing_is_logged_as_an_error(
    app: App, data: st.DataObject, path: str
) -> None:
    body = body_of(data)
    if body is None:
        return
    app.errors.records.clear()
    with bounded(seconds=10, megabytes=256):
        status, content_type, raw = app.post(path, body)
    uid, nesting = expected_uid(body)
    if uid and NESTED_TOO_DEEPLY in raw:
        # Python's decoder stops at its recursion limit (less the server's own stack):
        # then no uid can be read. The API server never nests our kinds that deep.
        assert nesting > 500, (nesting, raw[:300])
        uid = ""
    assert_well_formed(status, content_type, raw, uid)
    assert not app.errors.records, [r.getMessage() for r in app.errors.records]


def test_the_fuzzer_reaches_the_deciding_code(app: App) -> None:
    """The bases are reviews the endpoints decide on (not refused as malformed), so the
    mutations explore the handlers, not only the parser; and an endpoint that raises is
    caught by `Errors` (the property's other half)."""
    for base in REVIEWS:
        status, content_type, raw = app.post("/validate", json.dumps(base).encode())
        assert_well_formed(status, content_type, raw, base["request"]["uid"])
        assert "malformed AdmissionReview" not in raw.decode()
    app.errors.records.clear()
    logging.getLogger("webhook.server").exception("probe")
    assert len(app.errors.records) == 1
