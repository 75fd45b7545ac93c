"""controllers.requeue against a fake API: how many Pod lists quota freed in a team costs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from controllers.requeue import Requeuer

from ..quota.test_waiting import pod


@dataclass
class Listed:
    items: list[dict[str, Any]]


class Api:
    """Unscheduled Pods: one waiting on template `gpu` in each of `waiting`."""

    def __init__(self, waiting: list[str]) -> None:
        self.pods = [{**(p := pod(f"p-{ns}", {"gpu": "gpu"})), "metadata": {**p["metadata"], "namespace": ns}}
                     for ns in waiting]
        self.lists: list[str | None] = []
        self.patched: list[tuple[str, str]] = []
        self.done = asyncio.Event()
        self.expected = len(waiting)

    async def list(self, resource: Any, *, namespace: str | None = None, transform: Any = None,
                   **_: Any) -> Listed:
        self.lists.append(namespace)
        return Listed([transform(p) for p in self.pods if namespace in (None, p["metadata"]["namespace"])])

    async def patch(self, resource: Any, name: str, body: Any, *, namespace: str, **_: Any) -> Any:
        self.patched.append((namespace, name))
        if len(self.patched) == self.expected:
            self.done.set()
        return body


@pytest.mark.parametrize(("due", "lists"), [(3, ["team-0", "team-1", "team-2"]), (500, [None])])
async def test_quota_freed_in_many_namespaces_at_once_lists_the_unscheduled_pods_once(due: int,
                                                                                     lists: list[str | None]) -> None:
    # A claim deleted in a team's namespace frees quota in each of the team's namespaces
    # (commands.wiring): 500 namespaces were 500 lists per pass; a few stay one each.
    namespaces = [f"team-{i}" for i in range(due)]
    api = Api(namespaces[:3])
    requeuer = Requeuer(api, interval=0, settle=3600)  # type: ignore[arg-type]
    for namespace in namespaces:
        requeuer.quota_freed(namespace)
    task = asyncio.create_task(requeuer.run())
    try:
        await asyncio.wait_for(api.done.wait(), timeout=30)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert api.lists == lists
    assert sorted(api.patched) == [(ns, "gpu") for ns in namespaces[:3]]
