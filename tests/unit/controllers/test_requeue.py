"""controllers.requeue against a fake API: what quota freed costs in lists, reads and writes."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from controllers.requeue import Requeuer
from kube.api import METADATA_LIST
from kube.apierror import ApiError

from ..clock import until
from ..quota.objects.test_waiting import pod


@dataclass
class Listed:
    items: list[dict[str, Any]]


class Api:
    """Unscheduled Pods, each waiting on its own template (`waiting`: namespace -> count)."""

    def __init__(self, waiting: dict[str, int]) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        for ns, count in waiting.items():
            for i in range(count):
                p = pod(f"p{i}", {"gpu": f"t{i}"})
                p["metadata"].update(namespace=ns, uid=f"{ns}-{i}", resourceVersion="1",
                                     creationTimestamp=f"2026-01-01T00:00:{i:02d}Z")
                self.pods[ns, f"p{i}"] = p
        self.lists: list[str | None] = []
        self.reads: Counter[tuple[str, str]] = Counter()
        self.patched: list[tuple[str, str]] = []

    async def list(self, resource: Any, *, namespace: str | None = None, transform: Any = None,
                   headers: Any = (), **_: Any) -> Listed:
        assert ("Accept", METADATA_LIST) in headers  # never whole Pods
        self.lists.append(namespace)
        return Listed([transform({"metadata": p["metadata"]}) for (ns, _), p in self.pods.items()
                       if namespace in (None, ns)])

    async def get(self, resource: Any, name: str, *, namespace: str, **_: Any) -> dict[str, Any]:
        self.reads[namespace, name] += 1
        if (namespace, name) not in self.pods:
            raise ApiError(404, "NotFound", "gone")
        return self.pods[namespace, name]

    async def patch(self, resource: Any, name: str, body: Any, *, namespace: str, **_: Any) -> Any:
        self.patched.append((namespace, name))
        return body


def idle(requeuer: Requeuer) -> bool:
    """No credit left to spend, no settle to write, no write in flight."""
    return requeuer.pending == 0


@asynccontextmanager
async def running(requeuer: Requeuer) -> AsyncIterator[None]:
    task = asyncio.create_task(requeuer.run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_each_deletion_buys_one_write_and_its_settle_whatever_waits() -> None:
    # 200 templates waited on: the old requeue wrote all 200 twice per deletion.
    api = Api({"mallory": 200})
    requeuer = Requeuer(api, interval=0, settle=0)  # type: ignore[arg-type]
    async with running(requeuer):
        for _ in range(5):
            requeuer.quota_freed("mallory")
        await until(lambda: idle(requeuer), "5 writes and their settles")
    assert len(api.patched) == 10
    assert (requeuer.credits, requeuer.writes) == (5, 10)  # what the metrics export
    assert len(set(api.patched)) == 5  # round the templates, each touched then settled
    assert max(api.reads.values()) == 1  # a Pod is read once per resourceVersion


async def test_a_team_of_500_namespaces_is_looked_at_a_few_at_a_time_never_listed_at_once() -> None:
    team = [f"team-{i:03d}" for i in range(500)]
    api = Api({"team-250": 1})
    requeuer = Requeuer(api, interval=0, settle=0)  # type: ignore[arg-type]
    async with running(requeuer):
        for _ in range(80):
            requeuer.quota_freed("team-000", team)
            await until(lambda: idle(requeuer), "the turn taken")
            if api.patched:
                break
    assert api.patched == [("team-250", "t0")] * 2  # the write and its settle
    assert None not in api.lists  # never every namespace's Pods in one list
    assert len(api.lists) <= 80 * 8  # at most 8 namespaces a deletion


async def test_another_namespace_is_served_between_the_turns_of_a_churning_one() -> None:
    api = Api({"mallory": 50, "bob": 1})
    requeuer = Requeuer(api, interval=3600, settle=3600)  # type: ignore[arg-type]
    async with running(requeuer):
        for _ in range(50):
            requeuer.quota_freed("mallory")
        requeuer.quota_freed("bob")
        await until(lambda: ("bob", "t0") in api.patched, "bob's template touched")
    assert len(api.patched) == 5  # mallory's first turn (4 writes), then bob's, mallory rate-limited


async def test_not_leading_writes_nothing() -> None:
    api = Api({"a": 3})
    requeuer = Requeuer(api, leading=lambda: False, interval=0, settle=0)  # type: ignore[arg-type]
    async with running(requeuer):
        requeuer.quota_freed("a")
        await until(lambda: idle(requeuer), "the turn taken")
    assert api.patched == [] and api.lists == []
