"""controllers.applied: which AppliedClusterDeviceQuotas the leader writes and deletes for a
team, and how often. The writes themselves are proven against the real API server
(tests/e2e/test_tenant_rbac.py)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any


from controllers.applied import AppliedQuotas
from kube.api import ApiError
from quota.applied import applied_quotas

from ..quota.test_top import BREAKDOWN, part, team


class RecordingApi:
    """Server-side applies and deletes, as (verb, namespace, name)."""

    def __init__(self, existing: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
        self.calls: list[tuple[str, str, str]] = []
        self.existing = existing

    async def list(self, resource: Any, **kwargs: Any) -> Any:
        assert kwargs == {"label_selector": "app.kubernetes.io/managed-by=dra-quota"}
        return type("Listing", (), {"items": self.existing})()

    async def patch(self, resource: Any, name: str, body: Any, **kwargs: Any) -> Any:
        assert kwargs["patch_type"] == "apply" and kwargs["force"]
        self.calls.append(("apply", kwargs["namespace"], name))
        return body

    async def delete(self, resource: Any, name: str, *, namespace: str) -> Any:
        self.calls.append(("delete", namespace, name))
        if namespace == "gone-already":
            raise ApiError(404, "NotFound", "not found")
        return {}


def owned(breakdown: list[dict[str, Any]], used: str = "480Gi") -> dict[str, Any]:
    obj = team(breakdown)
    obj["metadata"]["uid"] = "u1"
    obj["status"]["used"]["memory"] = used
    return obj


async def round_of(applied: AppliedQuotas, obj: dict[str, Any] | None) -> int:
    return await applied._round("ml-team", obj, asyncio.Semaphore(4))


async def test_writes_each_member_once_then_only_what_changed_and_deletes_who_left() -> None:
    api = RecordingApi()
    applied = AppliedQuotas(api, leading=lambda: True)  # type: ignore[arg-type]
    assert await round_of(applied, owned(BREAKDOWN)) == 2
    assert sorted(api.calls) == [("apply", "ml-dev", "ml-team"), ("apply", "ml-train", "ml-team")]
    api.calls.clear()
    assert await round_of(applied, owned(BREAKDOWN)) == 0  # the resync: nothing changed, nothing sent
    assert api.calls == []
    # ml-train left the team and the totals moved: ml-dev rewritten, ml-train's copy deleted.
    assert await round_of(applied, owned([BREAKDOWN[0]], used="80Gi")) == 2
    assert sorted(api.calls) == [("apply", "ml-dev", "ml-team"), ("delete", "ml-train", "ml-team")]


async def test_a_new_leader_writes_only_what_differs_from_what_it_found() -> None:
    found = copy.deepcopy(applied_quotas(owned(BREAKDOWN)))
    stale = {"metadata": {"name": "ml-team", "namespace": "gone-already", "ownerReferences": [{"uid": "u1"}]},
             "status": {}}
    api = RecordingApi([*found.values(), stale])
    applied = AppliedQuotas(api, leading=lambda: True)  # type: ignore[arg-type]
    await applied._list()
    assert await round_of(applied, owned(BREAKDOWN)) == 1  # the stale one, already gone (404 is done)
    assert api.calls == [("delete", "gone-already", "ml-team")]


async def test_nothing_sent_when_not_leading_and_a_deleted_team_is_left_to_garbage_collection() -> None:
    api = RecordingApi()
    applied = AppliedQuotas(api, leading=lambda: False)  # type: ignore[arg-type]
    assert await round_of(applied, owned(BREAKDOWN)) == 0 and api.calls == []
    applied.leading = lambda: True
    await round_of(applied, owned([part("solo", "1Gi", 1)]))
    api.calls.clear()
    assert await round_of(applied, None) == 0 and api.calls == []
    assert applied._have == {}


async def test_a_copy_deleted_by_hand_is_written_again_after_the_next_list() -> None:
    api = RecordingApi()
    applied = AppliedQuotas(api, leading=lambda: True)  # type: ignore[arg-type]
    await round_of(applied, owned(BREAKDOWN))
    api.existing = list(applied_quotas(owned(BREAKDOWN)).values())[:1]  # ml-train's deleted by hand
    await applied._list()  # the resync's list
    api.calls.clear()
    assert await round_of(applied, owned(BREAKDOWN)) == 1
    assert api.calls == [("apply", "ml-train", "ml-team")]
