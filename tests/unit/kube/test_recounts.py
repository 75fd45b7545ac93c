"""kube.recounts: a team's part of a namespace counted in slices of the loop, and the claims
charged to a team while it is counted waiting for the count or refused, never decided on
a partial one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from kube.quotawriter import Reservations
from kube.rebuilds import Rebuilds
from kube.recounts import Recounter
from quota.accounting.ledger import Ledger, QuotaKey, recounting_message
from quota.admission.admitter import Admitter
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import parse_cluster_device_quota
from quota.values.model import Charge, Namespace
from webhook.claimreview import ClaimContext, create_claim

from ..builders import make_cluster_quota
from ..quota.pricing.test_pricer import CLASSES, inventory
from ..webhook.test_claimreview import POLICY, UID, gpu_claim, review_request, stored
from .scripted import FakeApi
from .test_quotawriter import GPU, NS, team_entry

ML = {"team.draquota.io/name": "ml"}
TEAM = (Namespace(""), "ml")


def team_ledger(claims: int, memory: str = "1Ti") -> Ledger:
    """Team "ml" selecting nothing yet, and `claims` 80Gi claims in team-a (outside it)."""
    ledger = Ledger()
    ledger.set_namespace(NS, {})
    ledger.add_or_update_quota(parse_cluster_device_quota(make_cluster_quota("ml", team="ml", memory=memory)))
    for i in range(claims):
        ledger.add_or_update_claim(team_entry(f"c{i}", NS))
    return ledger


async def running(recounter: Recounter, body: Callable[[], Awaitable[Any]]) -> Any:
    task = asyncio.create_task(recounter.run())
    try:
        return await body()
    finally:
        task.cancel()


async def test_a_relabel_is_counted_in_slices_and_the_team_told_once_whole() -> None:
    ledger = team_ledger(2_000)
    told: list[tuple[QuotaKey, ...] | None] = []
    recounter = Recounter(ledger, Rebuilds(slice_seconds=0.0), changed=lambda keys: told.append(
        None if keys is None else tuple(keys)), every=16)
    turns = 0

    async def other_work() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    ledger.set_namespace(NS, ML)  # the watch event: no pass over the 2,000 claims in it
    assert ledger.recounting("ml") and ledger.usage(*TEAM).reserved == Charge()

    async def counted() -> bool:
        ticking = asyncio.create_task(other_work())
        try:
            return await recounter.wait(["ml"], timeout=60)
        finally:
            ticking.cancel()

    assert await running(recounter, counted)
    assert turns >= 2_000 // 16  # the loop ran other work between every 16 claims
    assert not ledger.recounting("ml") and ledger.usage(*TEAM).reserved == GPU.times(2_000)
    assert told == [(TEAM,)] and recounter.passes == 1


async def test_waiting_on_a_recount_that_does_not_run_gives_up() -> None:
    ledger = team_ledger(3)
    recounter = Recounter(ledger, Rebuilds())
    ledger.set_namespace(NS, ML)
    assert not await recounter.wait(["ml"], timeout=0.01)
    assert await recounter.wait(["other"], timeout=0.01)  # a team not being recounted: at once


def claim_context(ledger: Ledger, recounter: Recounter | None) -> tuple[FakeApi, ClaimContext]:
    api = FakeApi(make_cluster_quota("ml", team="ml", memory="160Gi"))
    reservations = Reservations(api, ledger, ttl=60.0, clock=lambda: 1_000.0)  # type: ignore[arg-type]
    return api, ClaimContext(Admitter(Pricer(inventory(), CLASSES), ledger), {"team-a": ML}.get, lambda: POLICY,
                             reservations, recounts=recounter)


async def test_a_claim_charged_to_a_team_being_recounted_waits_and_is_decided_on_the_whole_count() -> None:
    # team-a joins a team of 160Gi with two 80Gi claims: the team is full, though its
    # count is still zero until the recount ends. Deciding at once would admit an 80Gi claim.
    ledger = team_ledger(2, memory="160Gi")
    recounter = Recounter(ledger, Rebuilds(slice_seconds=0.0), every=1)
    api, ctx = claim_context(ledger, recounter)
    ledger.set_namespace(NS, ML)
    assert ledger.recounting("ml")
    verdict = await running(recounter, lambda: create_claim(ctx, review_request(stored(gpu_claim(), uid=UID))))
    assert not verdict.allowed and verdict.message.startswith('exceeded ClusterDeviceQuota "ml": requested memory=80Gi, '
                                                              "used memory=0, reserved memory=160Gi")


async def test_a_claim_charged_to_a_team_whose_recount_does_not_end_in_time_is_refused_to_retry() -> None:
    ledger = team_ledger(2, memory="160Gi")
    recounter = Recounter(ledger, Rebuilds())  # never run: the count stays partial
    api, ctx = claim_context(ledger, recounter)
    ledger.set_namespace(NS, ML)
    verdict = await create_claim(ctx, review_request(stored(gpu_claim(), uid=UID)))
    assert (verdict.allowed, verdict.message, verdict.cause) == (False, recounting_message("ml"), "unavailable")
    assert not (api.objects["ml"].get("status") or {}).get("reservations")
    ctx_without_wait = ClaimContext(ctx.admitter, ctx.namespace_labels, ctx.policy, ctx.reservations)
    verdict = await create_claim(ctx_without_wait, review_request(stored(gpu_claim(), uid=UID)))
    assert (verdict.allowed, verdict.message) == (False, recounting_message("ml"))  # the decision itself refuses
