"""Whom RBAC allows to grant adminAccess: a SubjectAccessReview, cached briefly.

Neighbours: `webhook.namespaces` asks it about a requester the allowlist (`quota.admission.policy`)
does not name; `commands.serve` builds one per process. It asks exactly what the shipped
ValidatingAdmissionPolicy asks the API server's authorizer
(`authorizer.group('draquota.io').resource('adminaccess').check('label')`, cluster-scoped,
`quota.admission.policy.ADMIN_ACCESS_GRANT`), so the policy in the API server and this webhook
agree: `cluster-admin`, system:masters and a ClusterRoleBinding to the ClusterRole
dra-quota-admin-access-labeler may add, change or remove the label; a namespace `admin`
may not.

Cost: namespace label writes are rare, but a loop of them must not become a loop of
reviews. Answers are cached by user, uid and groups for `TTL` seconds (a revoked grant
is honoured within that, as the API server's own webhook authorizer caches), at most
`MAX_CACHED` subjects, least recently used dropped first; at most `MAX_ASKING` reviews
are in flight. Fail closed: an answer that cannot be had is `None` (the label change is
refused, with a message asking to retry) and is never cached. The review carries user,
uid, groups and the request's `extra`, as the policy's authorizer check does: RBAC reads
only the first three, but a webhook authorizer (a managed cluster's IAM) or a scoped token
decides on `extra`, and a review without it could allow what the request itself may not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kube.admissionreview import UserInfo
from kube.api import KubeApi
from kube.apierror import ApiError
from kube.resources import ACCESS_REVIEWS
from quota.admission.policy import ADMIN_ACCESS_GRANT
from runtime.answers import Answers

__all__ = ["MAX_ASKING", "MAX_CACHED", "TTL", "LabelAccess"]

log = logging.getLogger(__name__)

TTL = 10.0
MAX_CACHED = 256
MAX_ASKING = 4

Subject = tuple[str, str, tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...]]


class LabelAccess:
    """`await access(user)`: may `user` label adminaccess.draquota.io? None: could not ask."""

    def __init__(self, api: KubeApi, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._api = api
        self._clock = clock
        self._cache: Answers[Subject, bool] = Answers(MAX_CACHED)
        self._asking = asyncio.Semaphore(MAX_ASKING)

    async def __call__(self, user: UserInfo) -> bool | None:
        key: Subject = (user.username, user.uid, tuple(sorted(user.groups)), user.extra)
        cached = self._cache.get(key, self._clock())
        if cached is not None:
            return cached
        async with self._asking:
            try:
                allowed = await self._review(user)
            except (ApiError, OSError, TimeoutError, ValueError) as err:
                log.warning("cannot ask the API server whether %s may grant adminAccess: %s",
                            user.username or "(anonymous)", err)
                return None
        self._cache.put(key, allowed, self._clock() + TTL)
        return allowed

    async def _review(self, user: UserInfo) -> bool:
        group, resource, verb = ADMIN_ACCESS_GRANT
        spec = {"user": user.username, "uid": user.uid, "groups": list(user.groups),
                "extra": {key: list(values) for key, values in user.extra},
                "resourceAttributes": {"group": group, "resource": resource, "verb": verb}}
        decided = await self._api.create(ACCESS_REVIEWS, {"apiVersion": ACCESS_REVIEWS.api_version,
                                                          "kind": "SubjectAccessReview", "spec": spec})
        return bool((decided.get("status") or {}).get("allowed"))
