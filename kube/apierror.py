"""`ApiError`: every HTTP failure of the Kubernetes API, with its `Status` decoded.

Neighbours: `kube.api.KubeApi` raises it for a non-2xx answer, `kube.watchlines` for a watch
ERROR event, `kube.writegate.NotLeading` is the one for a write its gate refused before
sending. Callers tell cases apart by `status` and `reason`; transport failures stay
`aiohttp.ClientError` / `TimeoutError`.
"""

from __future__ import annotations

import json

from quota.values.raw import Obj

__all__ = ["ApiError"]


class ApiError(Exception):
    """A non-2xx answer (or a watch ERROR event), with the decoded `Status` fields."""

    def __init__(self, status: int, reason: str, message: str, *, where: str = "", body: Obj | None = None) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        # The whole decoded `Status` (its `details.causes` name the fields of a 422).
        self.body: Obj = body if body is not None else {"reason": reason, "message": message}
        super().__init__(f"{where}: HTTP {status} {reason}: {message}" if where else f"HTTP {status} {reason}: {message}")

    @classmethod
    def from_body(cls, status: int, body: bytes, *, where: str) -> ApiError:
        """Decode a `Status` body when there is one; keep a short text otherwise."""
        try:
            decoded = json.loads(body)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            return cls(status, str(decoded.get("reason", "")), str(decoded.get("message", "")), where=where,
                       body=decoded)
        return cls(status, "", body[:500].decode("utf-8", "replace"), where=where)
