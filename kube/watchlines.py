"""Watch streams read line by line: newline-terminated JSON documents, each a watch event.

Neighbours: `kube.api.KubeApi.watch` feeds what it reads to a `LineBuffer` and decodes
each line with `decode_event`; `kube.watching` handles the events and the `ApiError`
(410 as an ERROR event) it raises.
"""

from __future__ import annotations

import json

from kube.apierror import ApiError
from quota.values.raw import Obj

__all__ = ["LineBuffer", "decode_event"]


class LineBuffer:
    """Splits a byte stream into newline-terminated JSON documents.

    As kopf `_cogs/clients/watching.py` `_iter_jsonlines`: aiohttp's own line reader fails
    on lines above its buffer limit, and one watch event (a ResourceSlice with 128 devices,
    a claim with many results) can be far larger.
    """

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        return [line for line in lines if line.strip()]

    def rest(self) -> bytes:
        """What is left after the stream ended (a last line without a newline)."""
        rest, self._buffer = self._buffer.strip(), b""
        return rest


def decode_event(line: bytes) -> tuple[str, Obj]:
    """One watch line -> (type, object). An ERROR event raises `ApiError` with its code.

    The API server reports "too old resource version" on an established watch as an ERROR
    event whose object is a `Status` with code 410 (k8s.io/apiserver
    pkg/storage/cacher/cacher.go newErrWatcher), not as an HTTP 410: callers handle both
    the same way through `ApiError.status`.
    """
    event = json.loads(line)
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise ValueError(f"not a watch event: {line[:200]!r}")
    kind, obj = str(event.get("type", "")), event["object"]
    if kind == "ERROR":
        raise ApiError(int(obj.get("code") or 500), str(obj.get("reason", "")), str(obj.get("message", "")), where="watch")
    return kind, obj
