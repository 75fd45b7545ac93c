"""A scripted API server for `kube.quotawriter`: DeviceQuotas by name, conditional status writes.

What the real one cannot be made to do on demand: answer a status PUT with 409 when
its resourceVersion precondition is stale, and inject conflicts (another replica
writing in between). tests/unit/kube/test_quotawriter.py and the admission tests of
tests/unit/webhook (every claim CREATE persists its reservation) write through it; the
real control plane is exercised in tests/e2e/test_replicas.py.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from kube.api import Resource
from kube.apierror import ApiError

__all__ = ["FakeApi"]


class FakeApi:
    def __init__(self, *quotas: dict[str, Any]) -> None:
        self.objects = {q["metadata"]["name"]: {**copy.deepcopy(q), "status": {}} for q in quotas}
        for obj in self.objects.values():
            obj["metadata"]["resourceVersion"] = "1"
        self.writes = 0
        self.conflicts_to_inject = 0
        # (plural, namespace, name) of every status write, in order.
        self.written: list[tuple[str, str | None, str]] = []

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        await asyncio.sleep(0)
        if name not in self.objects:
            raise ApiError(404, "NotFound", name)
        return copy.deepcopy(self.objects[name])

    async def update_status(self, resource: Resource, body: dict[str, Any], *,
                            namespace: str | None = None) -> dict[str, Any]:
        await asyncio.sleep(0)
        name = body["metadata"]["name"]
        current = self.objects[name]
        if self.conflicts_to_inject:
            self.conflicts_to_inject -= 1
            current["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
        if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        self.writes += 1
        self.written.append((resource.plural, namespace, name))
        current["status"] = copy.deepcopy(body["status"])
        current["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(current)
