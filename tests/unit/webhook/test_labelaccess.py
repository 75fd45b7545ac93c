"""webhook.labelaccess: RBAC's answer on who may grant adminAccess, cached and bounded.

The API server's answers are scripted (`Reviews`) so the cache can be driven past its
bound and its TTL; the same path on the real API server, with real RBAC, is
tests/e2e/test_tenant_rbac.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from kube.admissionreview import UserInfo
from kube.api import Resource
from kube.apierror import ApiError
from webhook.labelaccess import MAX_CACHED, TTL, LabelAccess

from ..clock import FakeClock

ASYNC = pytest.mark.asyncio(loop_scope="session")
ADMIN = UserInfo("platform-admin", "u-1", ("platform", "system:authenticated"))
TENANT = UserInfo("alice", "u-2", ("system:authenticated",))


class Reviews:
    """A scripted API server: the users RBAC allows."""

    def __init__(self) -> None:
        self.allowed = {ADMIN.username}
        self.calls: list[dict[str, Any]] = []
        self.failing = False

    async def create(self, resource: Resource, body: dict[str, Any]) -> dict[str, Any]:
        assert resource.plural == "subjectaccessreviews"
        self.calls.append(body["spec"])
        if self.failing:
            raise ApiError(500, "InternalError", "etcd is sad")
        return {"status": {"allowed": body["spec"]["user"] in self.allowed}}


def access() -> tuple[LabelAccess, Reviews, FakeClock]:
    reviews, clock = Reviews(), FakeClock()
    return LabelAccess(reviews, clock=clock), reviews, clock  # type: ignore[arg-type]


@ASYNC
async def test_it_asks_what_the_admission_policy_asks_the_authorizer() -> None:
    may, reviews, _ = access()
    assert (await may(ADMIN), await may(TENANT)) == (True, False)
    # Cluster-scoped (no namespace): a RoleBinding in one's own namespace grants nothing.
    assert reviews.calls[0] == {"user": "platform-admin", "uid": "u-1", "groups": ["platform", "system:authenticated"],
                                "extra": {}, "resourceAttributes": {"group": "draquota.io", "resource": "adminaccess",
                                                       "verb": "label"}}


@ASYNC
async def test_the_requests_extra_goes_to_the_authorizer_and_keys_the_cache() -> None:
    # A scoped token (OpenShift's scopes) or a webhook authorizer decides on `extra`: the
    # same user with another scope is another subject, asked again.
    may, reviews, _ = access()
    scoped = UserInfo(ADMIN.username, ADMIN.uid, ADMIN.groups, (("scopes.authorization.openshift.io", ("user:info",)),))
    assert await may(scoped) is True
    assert reviews.calls[0]["extra"] == {"scopes.authorization.openshift.io": ["user:info"]}
    assert await may(ADMIN) is True
    assert len(reviews.calls) == 2


@ASYNC
async def test_answers_are_cached_for_the_ttl_and_failures_never() -> None:
    may, reviews, clock = access()
    reviews.failing = True
    assert await may(ADMIN) is None
    assert await may(ADMIN) is None
    assert len(reviews.calls) == 2
    reviews.failing = False
    assert await may(ADMIN) is True
    reviews.allowed.clear()  # the grant is revoked: honoured once the answer expires
    clock.advance(TTL - 1)
    assert await may(ADMIN) is True
    clock.advance(2)
    assert await may(ADMIN) is False
    assert len(reviews.calls) == 4
    # Another group set is another subject.
    assert await may(UserInfo(ADMIN.username, ADMIN.uid, ("platform",))) is False
    assert len(reviews.calls) == 5


@ASYNC
async def test_the_cache_holds_at_most_max_cached_subjects() -> None:
    may, reviews, _ = access()
    for i in range(MAX_CACHED + 1):
        await may(UserInfo(f"user-{i}"))
    await may(UserInfo(f"user-{MAX_CACHED}"))  # the newest stays
    assert len(reviews.calls) == MAX_CACHED + 1
    await may(UserInfo("user-0"))  # the oldest was dropped
    assert len(reviews.calls) == MAX_CACHED + 2
