"""The HTTPS admission server: AdmissionReview endpoints, health and readiness.

Neighbours: `kube.admissionreview` reads and writes reviews; the endpoint functions given to
`build_app` (one per path, e.g. `/validate`, `/mutate`) decide; `certs.tls` supplies
the SSL context the caller serves this app with.

Whatever arrives, the answer is HTTP 200 with a well-formed AdmissionReview: a body that
is too large, not JSON or not a review is denied with a message saying what is wrong;
an endpoint that fails or runs past its deadline is denied with a message too, never a
500 (the API server would report a 500 without our words, then apply failurePolicy).
The one exception is deliberate: a replica cut off from the API server answers 503 with
a Status carrying our words, so that the failurePolicy decides (`kube.contact`).
The deadline comes from the `timeout` query parameter the API server adds to every
webhook call (k8s.io/apiserver pkg/admission/plugin/webhook/request, `?timeout=5s`),
less a margin (a fifth of it, at least 0.5 s), so our denial arrives before the API
server gives up.

The body is read whole as it arrives (a review comes in as many TCP pieces as the
network cuts it into), bounded while it is read: a `Content-Length` over the limit is
refused before any of the body is read but its first KiB, a chunked body once it passes
the limit. A review refused for its size still gets its uid echoed, found in those first
bytes without parsing the rest (`_uid_in`), so the API server shows our message rather
than a failed call. How long the body may take is `webhook.connections`' business: with
`connections` given (what `serve` does), the listener drops a connection whose request
does not arrive in time, and one whose review is whole is never evicted.

Every answer, malformed reviews included, passes one `observe` call: the one place
where each verdict is known, which `dra-quota serve` points at `webhook.metrics` and
`kube.events`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web, web_response

from kube.admissionreview import AdmissionRequest, ReviewError, Verdict, parse_review, respond
from quota.values.goduration import NANOS, parse_go_duration
from quota.values.raw import dig
from webhook.connections import Connections
from webhook.decisionlog import DenialLog
from webhook.tlssite import track

__all__ = ["Endpoint", "MAX_BODY_BYTES", "Observer", "SERVER", "build_app", "decode_body"]

log = logging.getLogger(__name__)

# An API object is at most ~1.5 MiB in etcd (and 3 MiB on the API server's wire);
# a review carries the object and, on UPDATE, the old object too.
MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_TIMEOUT = 10.0  # the API server's default timeoutSeconds
# Our answer must reach the API server before its own deadline, which began before ours
# (connecting, sending) and ends on its clock, while ours fires late by however long
# the loop was busy: 0.5 s was short on a loaded node (an expensive claim's denial left
# 4.82 s after the review came in, the API server had given up at 5 s: a 500 without
# our words). A fifth of the timeout, at least half a second.
_MARGIN, _MARGIN_SHARE = 0.5, 0.2
# The API server serializes an AdmissionReview with Go's encoding/json, fields in their
# declaration order (k8s.io/api admission/v1 types.go): kind, apiVersion, then request,
# whose first field is uid: it is within the first hundred bytes or so.
_UID_WINDOW = 1024
_UID = re.compile(rb'^\s*\{.{0,200}?"request"\s*:\s*\{\s*"uid"\s*:\s*"([0-9A-Za-z._:-]{1,128})"', re.S)
# The whole `Server` header of every answer: aiohttp's default names the Python and
# aiohttp versions, which only helps whoever looks for a known bug.
SERVER = "dra-quota"

Endpoint = Callable[[AdmissionRequest], Awaitable[Verdict]]
BodyDecoder = Callable[[bytes], Any]
# Told every answer: the path, the review (None when unreadable), the verdict and the
# seconds it took. Synchronous and cheap (`webhook.metrics`, `kube.events` queue
# their work), so it cannot delay an answer.
Observer = Callable[[str, AdmissionRequest | None, Verdict, float], None]


def _unobserved(path: str, review: AdmissionRequest | None, verdict: Verdict, seconds: float) -> None:
    pass


def decode_body(body: bytes) -> Any:
    """JSON from the API server; anything it would not send raises ValueError."""
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def build_app(
    endpoints: Mapping[str, Endpoint],
    *,
    ready: Callable[[], bool],
    decode: BodyDecoder = decode_body,
    max_body_bytes: int = MAX_BODY_BYTES,
    observe: Observer = _unobserved,
    connections: Connections | None = None,
    unavailable: Callable[[], str] = str,
) -> web.Application:
    """The webhook's app; `connections`: the bounds of the listener that will serve it;
    `unavailable`: while it says why (not ""), every review is answered HTTP 503, not
    decided (`kube.contact`: the webhooks' failurePolicy decides)."""
    # client_max_size bounds what aiohttp's own readers buffer; ours reads by the limit.
    app = web.Application(client_max_size=max_body_bytes + 1,
                          middlewares=[track(connections)] if connections is not None else [])
    denials = DenialLog(log)  # one namespace's flood of denials logs a constant per interval
    for path, endpoint in endpoints.items():
        app.router.add_post(path, _review_handler(path, endpoint, decode, max_body_bytes, observe, connections,
                                                  denials, unavailable))
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz(ready))
    quiet_server_header()
    return app


def quiet_server_header() -> None:
    """Answer `Server: dra-quota` on every response of the process.

    aiohttp sets its `Server: Python/<version> aiohttp/<version>` (setdefault, so a
    handler could override it) on every response, including the 400s its HTTP parser
    answers before any app, middleware or signal runs: the module constant it reads is
    the one place that covers them all (tests/unit/webhook/test_transport.py checks both).
    """
    if getattr(web_response, "SERVER_SOFTWARE", None) is None:
        log.warning("aiohttp no longer has web_response.SERVER_SOFTWARE: the Server header may name its version")
        return
    setattr(web_response, "SERVER_SOFTWARE", SERVER)


def _review_handler(path: str, endpoint: Endpoint, decode: BodyDecoder, limit: int, observe: Observer,
                    connections: Connections | None, denials: DenialLog,
                    unavailable: Callable[[], str]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        started = time.monotonic()
        try:
            body = await _read_body(request, limit)
        except _Unread as err:
            log.warning("unreadable AdmissionReview on %s (uid %r): %s", path, err.uid, err)
            if connections is not None:
                connections.hang_up(request)  # the rest of the body is not read at all
            return _answered(path, started, err.uid, None, err.verdict, observe, denials, close=True)
        except ConnectionError as err:
            # The connection is gone (the client left, or a connection bound dropped it):
            # nobody is left to answer. aiohttp's reader keeps the error to raise it again,
            # and its traceback holds our frames, which hold the request and so the reader:
            # a cycle only a full collection would free, one per cut-off body (the slow
            # bodies of bench/connections.py's flood, cut at their deadline, promoted to the
            # oldest generation by then: most of what each full collection freed). Without
            # the traceback, reference counting frees them.
            err.__traceback__ = None
            log.debug("%s: the connection closed before the AdmissionReview arrived whole", path)
            return web.Response(status=400)
        if connections is not None:
            connections.deciding(request)
        if why := unavailable():
            return _unavailable(path, started, body, decode, why, observe)
        uid, review, verdict = await _review(request, body, path, endpoint, decode, started)
        return _answered(path, started, uid, review, verdict, observe, denials)

    return handle


def _answered(path: str, started: float, uid: str, review: AdmissionRequest | None, verdict: Verdict,
              observe: Observer, denials: DenialLog, *, close: bool = False) -> web.Response:
    seconds = time.monotonic() - started
    if review is not None:
        _log_decision(path, review, verdict, seconds, denials)
    try:
        observe(path, review, verdict, seconds)
    except Exception:  # metrics and Events must never cost a review its answer
        log.exception("observing a verdict on %s failed", path)
    answer = _answer(uid, verdict)
    if close:
        # What is left of the body is not read (`Connections.hang_up`, where a listener
        # tracks the connection; elsewhere aiohttp discards it, for at most its lingering
        # time) and the connection closes after the answer.
        answer.force_close()
    return answer


def _unavailable(path: str, started: float, body: bytes, decode: BodyDecoder, why: str,
                 observe: Observer) -> web.Response:
    """HTTP 503 with a Status saying `why`: a failed call, which the API server reports
    with our message and settles by the webhook's failurePolicy (`kube.contact`)."""
    try:
        review: AdmissionRequest | None = parse_review(_decoded(body, decode))
    except ReviewError:
        review = None
    verdict = Verdict(False, why, "ServiceUnavailable", 503, cause="unavailable")
    try:
        observe(path, review, verdict, time.monotonic() - started)
    except Exception:
        log.exception("observing a verdict on %s failed", path)
    log.debug("%s: answered 503 undecided: %s", path, why)
    answer = web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": why, "reason": "ServiceUnavailable", "code": 503}, status=503)
    # The API server's next call dials again, through the Service to a ready Pod: on this
    # connection, kept alive, it would come back here.
    answer.force_close()
    return answer


class _Unread(Exception):
    """A body not read whole: the answer it gets, with the uid found in its first bytes."""

    def __init__(self, head: bytes, message: str, reason: str, code: int) -> None:
        super().__init__(message)
        self.uid = _uid_in(head)
        self.verdict = Verdict(False, message, reason, code, cause="invalid")


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, however many pieces it arrives in; `_Unread` past `limit` bytes or
    when its HTTP framing breaks (a bad chunk), ConnectionError when the connection closes first."""
    declared = request.content_length
    too_large = f"the AdmissionReview is larger than {limit} bytes"
    if declared is not None and declared > limit:
        raise _Unread(await _head(request, min(declared, _UID_WINDOW)), too_large, "RequestEntityTooLarge", 413)
    body = bytearray()
    try:
        while chunk := await request.content.readany():
            body += chunk
            if len(body) > limit:
                raise _Unread(bytes(body[:_UID_WINDOW]), too_large, "RequestEntityTooLarge", 413)
    except web.RequestPayloadError as err:
        raise _Unread(bytes(body[:_UID_WINDOW]), f"malformed AdmissionReview: the body cannot be read: {err}",
                      "BadRequest", 400) from None
    return bytes(body)


async def _head(request: web.Request, size: int) -> bytes:
    """The first `size` bytes of the body (fewer if it ends or breaks first)."""
    try:
        return await request.content.readexactly(size)
    except asyncio.IncompleteReadError as err:
        return err.partial
    except web.RequestPayloadError:
        return b""


def _uid_in(head: bytes) -> str:
    """The request's uid, where the API server puts it (before anything else of the request), else ""."""
    found = _UID.match(head[:_UID_WINDOW])
    return found.group(1).decode() if found else ""


async def _review(request: web.Request, body: bytes, path: str, endpoint: Endpoint, decode: BodyDecoder,
                  started: float) -> tuple[str, AdmissionRequest | None, Verdict]:
    """The uid to echo, the review (None when it could not be read) and the verdict on it."""
    try:
        review = parse_review(_decoded(body, decode))
    except ReviewError as err:
        log.warning("malformed AdmissionReview on %s: %s", path, err)
        return err.uid, None, Verdict(False, f"malformed AdmissionReview: {err}", "BadRequest", 400, cause="invalid")
    deadline = _deadline(request.query.get("timeout")) - (time.monotonic() - started)
    return review.uid, review, await _decide(endpoint, review, deadline)


def _log_decision(path: str, review: AdmissionRequest, verdict: Verdict, seconds: float, denials: DenialLog) -> None:
    # `extra` keys must not be LogRecord attributes (`name` is one: makeRecord raises).
    # Denials at INFO (each is a user-visible event worth finding by uid), allowed ones at
    # DEBUG: at hundreds of reviews a second they would drown everything else (and where
    # DEBUG is off, as it is by default, their fields are not even built). Denials are
    # sampled per namespace, their messages cut by the handler (`webhook.decisionlog`):
    # a tenant's flood of long denials would otherwise cost the log what the tenant chose.
    level = logging.DEBUG if verdict.allowed else logging.INFO
    if not log.isEnabledFor(level) or not (verdict.allowed or denials.admit(review.namespace)):
        return
    fields = {"uid": review.uid, "operation": review.operation, "resource": review.resource.resource,
              "namespace": review.namespace, "object_name": review.name, "allowed": verdict.allowed,
              "duration_ms": round(seconds * 1000, 2)}
    log.log(level, "%s %s %s %s/%s uid=%s in %.1fms%s",
            path, "allowed" if verdict.allowed else "denied", review.operation, review.namespace, _shown_name(review),
            review.uid, seconds * 1000, "" if verdict.allowed else f": {verdict.message}", extra=fields)


def _shown_name(review: AdmissionRequest) -> str:
    """The object's name for a log line: a `generateName` CREATE reaches the mutating
    webhook before the API server names it, so it shows as `<generateName>*`."""
    if review.name:
        return review.name
    generate = dig(review.object, "metadata", "generateName")
    return f"{generate}*" if isinstance(generate, str) and generate else ""


def _decoded(body: bytes, decode: BodyDecoder) -> Any:
    try:
        return decode(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise ReviewError(f"the body is not JSON: {err}") from None


def _where(review: AdmissionRequest) -> str:
    return f"{review.operation} {review.resource.resource} {review.namespace}/{_shown_name(review)} uid={review.uid}"


async def _decide(endpoint: Endpoint, review: AdmissionRequest, deadline: float) -> Verdict:
    try:
        # asyncio.timeout, not wait_for: 3.11's wait_for runs the endpoint in a task of its
        # own, a task's creation and a loop step more per review (1.7 % of `serve`'s busy
        # time in bench/floor.py's one-write mode); this one runs it in the handler's task.
        # A deadline already passed (the body took that long) is not entered at all:
        # asyncio.timeout(0) cancels only at the endpoint's first suspension, and one that
        # decides without one (a memoised claim under this replica's lease) would reserve
        # for a create the API server has already failed (`wait_for` never started it).
        if deadline <= 0:
            raise TimeoutError
        async with asyncio.timeout(deadline):
            return await endpoint(review)
    except TimeoutError:
        log.warning("deadline of %.1fs passed deciding %s", deadline, _where(review))
        return Verdict(False, f"dra-quota could not decide within the webhook timeout ({deadline:.1f}s); retry",
                       "Timeout", 504, cause="timeout")
    except Exception:  # an endpoint bug must become a denial, not a 500
        log.exception("failed deciding %s", _where(review))
        return Verdict(False, "dra-quota failed to evaluate this request (see its logs); retry", "ServiceUnavailable", 503,
                       cause="error")


# The API server sends the same `timeout` on every call of a webhook (its timeoutSeconds):
# parsing it again each review was 1.7 % of `serve`'s busy time (bench/floor.py). Bounded:
# anyone who reaches the port may send other values, which then cost what they did.
@functools.lru_cache(maxsize=16)
def _deadline(timeout: str | None) -> float:
    """The API server's `timeout` (a Go duration), less a margin for the answer's trip."""
    seconds = DEFAULT_TIMEOUT
    if timeout:
        try:
            seconds = parse_go_duration(timeout) / NANOS
        except ValueError:
            pass  # not a Go duration: keep the default
    seconds = min(seconds, 30.0)
    return max(seconds - max(_MARGIN, _MARGIN_SHARE * seconds), 0.1)


def _answer(uid: str, verdict: Verdict) -> web.Response:
    return web.json_response(respond(uid, verdict), dumps=lambda o: json.dumps(o, ensure_ascii=False))


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def _readyz(ready: Callable[[], bool]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(_: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok")
        return web.Response(status=503, text="not ready: caches not synced yet, shutting down, "
                                             "or the API server not answering")

    return handle
