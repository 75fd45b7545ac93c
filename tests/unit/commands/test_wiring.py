"""commands.wiring: what the caches tell the leader's helpers, with no API server."""

from __future__ import annotations

from commands.wiring import Caches
from controllers.requeue import Requeuer
from kube.claimstore import ClaimStore
from quota.quotas.devicequota import parse_cluster_device_quota
from quota.status.requeueing import Turn
from quota.values.model import Namespace

from ..builders import make_cluster_quota

ML = {"team.draquota.io/name": "ml"}


def test_quota_freed_in_a_teams_namespace_retries_the_pods_of_every_namespace_of_the_team() -> None:
    requeue = Requeuer(None)  # type: ignore[arg-type]  # only told, never run here
    caches = Caches(None, "conservative", requeue=requeue)  # type: ignore[arg-type]
    ledger = caches.admitter.ledger
    for ns, labels in (("team-a", ML), ("team-b", ML), ("alone", {})):
        ledger.set_namespace(Namespace(ns), labels)
    ledger.add_or_update_quota(parse_cluster_device_quota(make_cluster_quota("ml", memory="1Ti")))
    store = caches.claims.store
    assert isinstance(store, ClaimStore) and store.freed is not None
    store.freed("team-a")  # a claim of team-a deleted: the team has room for team-b's Pods too
    # One credit for the team, not one per namespace of it (quota.status.requeueing).
    assert requeue._turns.take(0.0) == Turn("team-a", ("team-a", "team-b"), 1)
    store.freed("alone")
    assert requeue._turns.take(0.0) == Turn("alone", ("alone",), 1)
    assert requeue._turns.take(9.0) is None


def test_serves_ledger_checks_windows_by_the_wall_clock_with_the_skew() -> None:
    import time

    ledger = Caches(None, "conservative", clock_skew=7.5).admitter.ledger  # type: ignore[arg-type]
    assert (ledger.clock, ledger.clock_skew) == (time.time, 7.5)
