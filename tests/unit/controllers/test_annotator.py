"""The leader's annotator (controllers/annotator.py): a pool of writers, one patch per claim at a time.

The entry an admission wrote in its quota's record goes only once the claim carries its
charge, so the annotator's patches must keep up with the creates: a slow patch must hold
up only its own writer, never the claims created after it. The API here is a stand-in
that records patches and holds the ones a test asks it to (the patch itself is proven
against the real API server in tests/e2e/test_serve.py and test_chart.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from controllers.annotator import Annotator
from kube.api import KubeApi, Resource
from quota.objects.claims import Claim, parse_claim

CHARGE = {"draquota.io/charge": '{"memory":1,"devices":1}'}


class Api:
    """Records each patch; a patch of a name in `held` waits until the test releases it."""

    def __init__(self) -> None:
        self.patched: list[str] = []
        self.in_flight: dict[str, int] = {}
        self.most_at_once: dict[str, int] = {}
        self.held: dict[str, asyncio.Event] = {}

    async def patch(self, resource: Resource, name: str, patch: Any, **_: Any) -> dict[str, Any]:
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        self.most_at_once[name] = max(self.most_at_once.get(name, 0), self.in_flight[name])
        try:
            if name in self.held:
                await self.held[name].wait()
            self.patched.append(name)
        finally:
            self.in_flight[name] -= 1
        return {}


def claim(name: str) -> Claim:
    return parse_claim({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
                        "spec": {"devices": {"requests": []}}})


def due(_claim: Claim, current: Mapping[str, str]) -> dict[str, str]:
    return {} if "draquota.io/charge" in current else dict(CHARGE)


def annotator(api: Api, concurrency: int = 4) -> Annotator:
    return Annotator(api, due, lambda c, current: "draquota.io/charge" not in current,  # type: ignore[arg-type]
                     leading=lambda: True, concurrency=concurrency)


async def until(condition: Any, what: str) -> None:
    async with asyncio.timeout(5):  # a hang fails the test, it never paces it
        while not condition():
            await asyncio.sleep(0)
    assert condition(), what


async def test_a_slow_patch_holds_up_only_its_own_writer() -> None:
    api = Api()
    api.held["slow"] = asyncio.Event()
    writer = annotator(api)
    task = asyncio.create_task(writer.run())
    try:
        writer.seen(claim("slow"), {})
        await until(lambda: api.in_flight.get("slow") == 1, "the slow patch in flight")
        # Claims created while it hangs are written meanwhile (a round of a batch would
        # wait for it first).
        for name in ("a", "b", "c"):
            writer.seen(claim(name), {})
        await until(lambda: {"a", "b", "c"} <= set(api.patched), "the later claims written")
        assert "slow" not in api.patched
        api.held["slow"].set()
        await until(lambda: "slow" in api.patched, "the slow one written once released")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_backlog_starts_more_writers_up_to_the_bound_and_they_stop_once_it_is_gone() -> None:
    """Each create needs one patch: a fixed pool fell minutes behind a sustained burst
    and the quota's record filled with the entries of claims it had not reached."""
    api = Api()
    gate = asyncio.Event()
    names = [f"c{i:03d}" for i in range(200)]
    for name in names:
        api.held[name] = gate
    writer = Annotator(api, due, lambda c, current: "draquota.io/charge" not in current,  # type: ignore[arg-type]
                       leading=lambda: True, concurrency=4, max_concurrency=16)
    task = asyncio.create_task(writer.run())
    try:
        for name in names[:20]:  # a short backlog: the base pool only
            writer.seen(claim(name), {})
        await until(lambda: sum(api.in_flight.values()) == 4, "the base pool busy")
        assert writer.writers == 4
        for name in names[20:]:
            writer.seen(claim(name), {})
        writer.seen(claim("c000"), {})  # any event wakes the pool (here: one already in flight)
        await until(lambda: sum(api.in_flight.values()) == 16, "the bound reached with a long backlog")
        assert writer.writers == 16 and writer.most_writers == 16
        gate.set()
        await until(lambda: set(names) <= set(api.patched) and writer.writers == 4,
                    "every claim written, the extra writers gone")
        assert sum(api.in_flight.values()) == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert writer.writers == 4  # cancelled with run(): no writer left behind


async def test_an_unforeseen_error_costs_a_retry_never_a_writer() -> None:
    class Flaky(Api):
        def __init__(self) -> None:
            super().__init__()
            self.raised = 0

        async def patch(self, resource: Resource, name: str, patch: Any, **kw: Any) -> dict[str, Any]:
            if name == "bad" and self.raised == 0:
                self.raised += 1
                raise KeyError("an unforeseen bug")
            return await super().patch(resource, name, patch, **kw)

    api = Flaky()
    writer = Annotator(api, due, lambda c, current: "draquota.io/charge" not in current,  # type: ignore[arg-type]
                       leading=lambda: True, concurrency=1, backoff=0.0)
    task = asyncio.create_task(writer.run())
    try:
        writer.seen(claim("bad"), {})
        writer.seen(claim("good"), {})
        await until(lambda: {"bad", "good"} <= set(api.patched) or task.done(), "both written, the bad one retried")
        assert not task.done() and api.raised == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_claim_is_patched_by_one_writer_at_a_time() -> None:
    api = Api()
    api.held["x"] = asyncio.Event()
    writer = annotator(api, concurrency=8)
    task = asyncio.create_task(writer.run())
    try:
        writer.seen(claim("x"), {})
        await until(lambda: api.in_flight.get("x") == 1, "the first patch in flight")
        # Newer events of the same claim while its patch is in flight (labels, a finalizer):
        # no second patch of it starts beside the first.
        for _ in range(3):
            writer.seen(claim("x"), {})
        writer.seen(claim("y"), {})
        await until(lambda: "y" in api.patched, "another claim written meanwhile")
        assert api.most_at_once["x"] == 1
        api.held["x"].set()
        # The newest event, still without the charge, is written again afterwards.
        await until(lambda: api.patched.count("x") == 2 and writer.pending == 0, "x written again, in turn")
        assert api.most_at_once["x"] == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_full_slow_lane_holds_a_claim_until_its_turn_and_never_stops_the_writers() -> None:
    """While the slow lane is full (a tenant's expensive claims) a claim whose annotations
    take more than a first slice waits its turn there (`Slicer.run(wait=True)`: never
    refused, nothing to retry); the writers, vital to `serve`, go on."""
    from quota.values.work import pause_point
    from runtime.slicing import Slicer

    from ..runtime.test_slicing import full_lane

    api = Api()
    slicer = Slicer(first_slice=0.0, slice_seconds=0.0, lane=1, queue=1)

    def slow_due(claim: Claim, current: Mapping[str, str]) -> dict[str, str]:
        pause_point()  # past a first slice of 0 s: the slow lane
        return due(claim, current)

    writer = Annotator(api, slow_due, lambda c, current: "draquota.io/charge" not in current,  # type: ignore[arg-type]
                       leading=lambda: True, concurrency=1, run=lambda fn: slicer.run(fn, wait=True))
    task = asyncio.create_task(writer.run())
    try:
        async with full_lane(slicer):
            writer.seen(claim("a"), {})
            await until(lambda: slicer.crowded == 1 or task.done(), "the claim waiting behind the full lane")
            assert not task.done() and api.patched == []
        await until(lambda: api.patched == ["a"] or task.done(), "the claim written once the lane freed")
        assert not task.done() and slicer.crowded == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
