"""What this replica's own caches know of the uids a reservation record holds (`quota.accounting.reservations.Caches`).

Neighbours: `kube.statuswriter.QuotaStatusWriter`, so `kube.quotawriter.Reservations`, is one
(it settles and counts records with it); the claim reflector (`kube.claimstore.ClaimStore`)
supplies the versions at which the claim cache holds a claim and tells `claim_deleted`;
the Workload cache tells `forget_workload`; `webhook.claimreview` asks `claim_outlived`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kube.watching import Progress
from quota.accounting.ledger import Ledger
from quota.accounting.ledgerentry import ClaimRef

__all__ = ["Seen"]

# Deleted claims and finished Workloads remembered: an entry of theirs may still be in a
# record this replica has not written since. Beyond this, the oldest are forgotten (their
# entries then go by the watermark of another writer, or expire).
_GONE_REMEMBERED = 8192


class Seen:
    """This replica's `quota.accounting.reservations.Caches`."""

    def __init__(self, ledger: Ledger, *, progress: Progress | None = None,
                 claim_version: Callable[[str], int | None] = lambda uid: None,
                 claim_recorded: Callable[[str], int | None] | None = None) -> None:
        self.ledger = ledger
        # How far the claim watch has come, and at which resourceVersion the claim cache
        # holds a claim (`kube.claimstore.ClaimStore.version`), with its charge recorded on
        # it (`recorded_version`).
        self.progress = progress or Progress()
        self._claim_version = claim_version
        self._claim_recorded = claim_recorded or claim_version
        # Whether the claim cache can vouch for a claim's allocation history
        # (`kube.claimstore.ClaimStore.history_known`; set where it is built).
        self.claim_history_known: Callable[[str], bool] = lambda uid: True
        # uid -> the resourceVersion at which the claim watch delivered its deletion.
        self._claims_gone: dict[str, int] = {}
        self._workloads_gone: dict[str, None] = {}

    def claim_deleted(self, uid: str, resource_version: str | None) -> None:
        """The claim watch delivered `uid`'s deletion (or a relist no longer has it) at
        `resource_version` (None: at the watch's current position)."""
        version = int(resource_version) if resource_version and resource_version.isdigit() else self.progress.version
        # 0: known gone, at no version that could raise a watermark.
        _remember(self._claims_gone, uid, version or 0)

    def workload_gone(self, uid: str) -> bool:
        return uid in self._workloads_gone

    def forget_workload(self, uid: str) -> None:
        """The Workload cache saw `uid` finish or go: its entry counts no more."""
        _remember(self._workloads_gone, uid, None)

    # -- quota.accounting.reservations.Caches ----------------------------------------------------

    def claim_version(self, uid: str) -> int | None:
        return self._claim_version(uid)

    def claim_recorded(self, uid: str) -> int | None:
        return self._claim_recorded(uid)

    def claim_gone(self, uid: str) -> int | None:
        return self._claims_gone.get(uid)

    def workload_counted(self, uid: str) -> bool:
        return self.ledger.holding(ClaimRef(uid)) is not None

    def claim_outlived(self, uid: str, version: int | None) -> bool:
        """Whether claim `uid`, read at resourceVersion `version` (None: unknown), is gone
        as far as this replica's claim watch goes: it delivered the deletion, or it has
        passed `version` and the cache does not hold the claim (deleted before the list
        the cache was built from, whose watch never tells). A review of such a copy
        (`webhook.claimreview.allocate_claim`) is late: the API server validated a stale
        copy and its write will find no claim; counting it would never be undone."""
        if self.claim_gone(uid) is not None:
            return True
        return version is not None and self.claim_version(uid) is None and self.progress.has_reached(version)


def _remember(table: dict[str, Any], uid: str, value: Any) -> None:
    table[uid] = value
    while len(table) > _GONE_REMEMBERED:
        del table[next(iter(table))]
