"""A relist of every claim, built aside and swapped into a `quota.accounting.ledger.Ledger` at once.

Neighbours: `kube.claimstore.ClaimStore` builds one per relist (in slices, `kube.rebuilds`);
`quota.accounting.ledger` owns the tables this swaps (a friend of the ledger: it reads and replaces
its private tables, as one synchronous step). A decision taken between two slices
sees the ledger as it was before the relist, whole. What changes the live ledger
meanwhile is reconciled at the swap: a claim the list carries unchanged (`keep`)
takes the live entry (the stored-claim pricing of `controllers.refine`, an allocation
admitted by the webhook); a quota whose scope changed is counted again from the new
entries, and so is a team's part of a namespace that joined it meanwhile
(`quota.accounting.teams`; left to a recount where the ledger defers them). Everything else the
list says wins, as an event-by-event relist would have it: the watch resumes from the
list's resourceVersion and brings what came after. Where few claims differ from the live
ledger (a watch that broke for a while: the list priced few again and dropped few), the
swap moves the live usage by them (`Ledger._apply`, as their events would have), so a
relist of 150,000 claims costs no pass over all of them per quota (bench/controller.py:
0.9-1.25 s against 2.3 s); else every quota is summed again over the new entries, in pauses.
"Few" is counted in quota updates (`MOVED_AT_SWAP`), as the swap holds the loop for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from quota.accounting.ledger import Ledger, QuotaKey
from quota.accounting.ledgerentry import ClaimRef, Entry, add_usage, sum_usage, usage_scope
from quota.accounting.teams import Recount
from quota.quotas.devicequota import DeviceQuota, Usage
from quota.values.model import Namespace
from quota.values.work import drop, pause_point

__all__ = ["ClaimsRebuild"]

# How many quota updates a swap may make to move the live usage by the claims that differ
# from it, with no pause (`ClaimsRebuild._move`: a claim's old and new entry each update
# every DeviceQuota of its namespace and every team selecting it, 7-12 µs each);
# past it every quota is summed again over every claim, in pauses. The claims the live
# ledger changed meanwhile are reconciled at the swap either way.
MOVED_AT_SWAP = 2000

T = TypeVar("T")


class ClaimsRebuild:
    """A relist of every claim, built aside and swapped into `ledger` by `commit` (module doc).

    Say what the list holds with `keep` (a claim unchanged since the ledger counted it)
    and `put` (a claim priced again); `commit` builds the rest (pausing at
    `quota.values.work.pause_point`) and swaps it in. One at a time per ledger.
    """

    def __init__(self, ledger: Ledger) -> None:
        if ledger._touched is not None:
            raise RuntimeError("a claims rebuild is already under way on this ledger")
        self._ledger = ledger
        self._entries: dict[ClaimRef, Entry] = {}
        self._kept: set[ClaimRef] = set()
        # Claims the list priced again (`put`): with the ones it no longer holds, all that
        # can differ from the live ledger but for what changed it meanwhile.
        self._put: set[ClaimRef] = set()
        # What the ledger held before `commit` (entries, by namespace, by owner), for `release`.
        self._old: tuple[dict[ClaimRef, Entry], dict[Namespace, dict[ClaimRef, Entry]],
                         dict[str, set[ClaimRef]]] | None = None
        ledger._touched = set()

    def keep(self, ref: ClaimRef) -> bool:
        """Carry the claim the live ledger holds over; False when it holds none."""
        entry = self._ledger.entry(ref)
        if entry is None:
            return False
        self._entries[ref] = entry
        self._kept.add(ref)
        self._put.discard(ref)
        return True

    def put(self, entry: Entry) -> None:
        self._entries[entry.ref] = entry
        self._kept.discard(entry.ref)
        self._put.add(entry.ref)

    def holds(self, ref: ClaimRef) -> bool:
        return ref in self._entries

    def cancel(self) -> None:
        """Give up without changing the ledger (`commit` is then refused)."""
        self._ledger._touched = None

    def commit(self) -> list[Entry]:
        """Swap the new claims in; the entries the list no longer holds (for callbacks)."""
        ledger = self._ledger
        if ledger._touched is None:
            raise RuntimeError("this claims rebuild was cancelled")
        try:
            dropped = [ref for ref in self._walk(list(ledger._entries)) if ref not in self._entries]
            # Few claims differ from the live ledger (a relist after a short break): its usage
            # is moved by them at the swap, rather than summed again over every claim.
            moved = self._move_cost(dropped) <= MOVED_AT_SWAP
            by_namespace, by_owner, usage, counted, parts = self._derive(sums=not moved)
        except BaseException:
            ledger._touched = None
            raise
        # The swap: no pause point from here on.
        touched, ledger._touched = ledger._touched, None
        changed = self._reconcile(touched, by_namespace, by_owner)
        gone = [e for ref in dict.fromkeys((*dropped, *touched))
                if ref not in self._entries and (e := ledger._entries.get(ref)) is not None]
        if moved:
            self._move(dict.fromkeys((*self._put, *dropped, *touched)))
            self._swap(by_namespace, by_owner)
            return gone
        for namespace, quotas in ledger._quotas.items():
            for name, quota in quotas.items():
                key = (namespace, name)
                was = counted.get(key)
                if was is None or usage_scope(was) != usage_scope(quota):
                    usage[key] = ledger._count(quota, by_namespace.get(namespace, {}).values())
                    continue
                usage[key] = self._changed(usage[key], quota, changed.get(namespace, ()))
        self._teams_parts(parts, by_namespace, changed)
        ledger._usage = {k: u for k, u in usage.items() if k[1] in ledger._quotas.get(k[0], {})}
        self._swap(by_namespace, by_owner)
        if ledger.replaced is not None:
            ledger.replaced()  # no claim went through `Ledger._apply`: its observer reads them again
        return gone

    def _move_cost(self, dropped: list[ClaimRef]) -> int:
        """The quota updates `_move` would make for the claims put or dropped (a bound on
        claims alone would let the quotas of one namespace multiply the swap's work);
        counted only until past `MOVED_AT_SWAP`."""
        ledger = self._ledger
        per_namespace: dict[Namespace, int] = {}
        cost = 0
        for ref in (*self._put, *dropped):
            for entry in (ledger._entries.get(ref), self._entries.get(ref)):
                if entry is None:
                    continue
                namespace = entry.namespace
                if (updates := per_namespace.get(namespace)) is None:
                    updates = len(ledger._quotas.get(namespace, {})) + len(ledger._teams.selecting(namespace))
                    per_namespace[namespace] = updates
                cost += max(updates, 1)
            if cost > MOVED_AT_SWAP:
                break
        return cost

    def _move(self, refs: Iterable[ClaimRef]) -> None:
        """The live ledger's usage (its quotas' and its teams' parts, `Ledger._apply`) moved
        by each claim whose new entry is not the live one: the usage of the new entries,
        as every other claim counts the same in both."""
        ledger = self._ledger
        for ref in refs:
            old, new = ledger._entries.get(ref), self._entries.get(ref)
            if old is new:
                continue
            if old is not None:
                ledger._apply(old, -1)
            if new is not None:
                ledger._apply(new, +1)

    def _swap(self, by_namespace: dict[Namespace, dict[ClaimRef, Entry]], by_owner: dict[str, set[ClaimRef]]) -> None:
        ledger = self._ledger
        for namespace in {*ledger._by_namespace, *by_namespace}:
            ledger._namespace_generation[namespace] = ledger._namespace_generation.get(namespace, 0) + 1
        self._old = (ledger._entries, ledger._by_namespace, ledger._by_owner)
        ledger._entries, ledger._by_namespace, ledger._by_owner = self._entries, by_namespace, by_owner

    def release(self) -> None:
        """After `commit`: free what the ledger held before, in pieces (`quota.values.work.drop`):
        each namespace's claims too, no one else's once swapped out (one namespace's
        3,000 claims freed in one piece: tens of ms, bench/stalls.py)."""
        if self._old is None:
            return
        entries, by_namespace, by_owner = self._old
        self._old = None
        for per_namespace in by_namespace.values():
            drop(per_namespace)
        for table in (entries, by_namespace, by_owner):
            drop(table)

    def _changed(self, usage: Usage, quota: DeviceQuota, changed: Iterable[tuple[Entry | None, Entry | None]]) -> Usage:
        for old, new in changed:
            if old is not None:
                usage = add_usage(usage, old, quota, self._ledger.default_mode, -1)
            if new is not None:
                usage = add_usage(usage, new, quota, self._ledger.default_mode, +1)
        return usage

    def _teams_parts(self, parts: dict[QuotaKey, tuple[DeviceQuota, Usage]],
                     by_namespace: dict[Namespace, dict[ClaimRef, Entry]],
                     changed: dict[Namespace, list[tuple[Entry | None, Entry | None]]]) -> None:
        """Every team member's part of the new entries: counted in `_derive` where the
        namespace was a member then under the same scope, else counted again (it joined,
        or the team's scope changed, while the rebuild was built): now, or by a recount
        over the new entries (`Ledger.defer_recounts`)."""
        ledger = self._ledger
        new: dict[str, dict[Namespace, Usage | Recount]] = {}
        for quota in ledger._teams.quotas():
            for namespace in ledger._teams.members(quota.name):
                was = parts.get((namespace, quota.name))
                part: Usage | Recount
                if was is None or usage_scope(was[0]) != usage_scope(quota):
                    part = ledger._recount_of(quota, namespace, by_namespace.get(namespace, {}).values())
                else:
                    part = self._changed(was[1], quota, changed.get(namespace, ()))
                new.setdefault(quota.name, {})[namespace] = part
        ledger._teams.replace_parts(new)

    def _derive(self, *, sums: bool) -> tuple[dict[Namespace, dict[ClaimRef, Entry]], dict[str, set[ClaimRef]],
                                              dict[QuotaKey, Usage], dict[QuotaKey, DeviceQuota],
                                              dict[QuotaKey, tuple[DeviceQuota, Usage]]]:
        """The indexes and, with `sums`, every quota's usage of the new entries, in pauses:
        the quotas each was counted against are returned, to count again any that changed
        meanwhile; and each team's part of its member namespaces then, by (namespace, team
        name)."""
        ledger = self._ledger
        by_namespace: dict[Namespace, dict[ClaimRef, Entry]] = {}
        by_owner: dict[str, set[ClaimRef]] = {}
        for entry in self._walk(self._entries.values()):
            by_namespace.setdefault(entry.namespace, {})[entry.ref] = entry
            if entry.owner:
                by_owner.setdefault(entry.owner, set()).add(entry.ref)
        usage: dict[QuotaKey, Usage] = {}
        counted: dict[QuotaKey, DeviceQuota] = {}
        parts: dict[QuotaKey, tuple[DeviceQuota, Usage]] = {}
        for namespace, entries in by_namespace.items() if sums else ():
            # Quotas that count alike (`usage_scope`: a namespace's DeviceQuota and the
            # team selecting it, both unscoped) share one pass over its claims.
            alike: dict[object, Usage] = {}
            for quota in list(ledger._quotas.get(namespace, {}).values()):
                key = (namespace, quota.name)
                counted[key] = quota
                usage[key] = self._sum(entries.values(), quota, alike)
            for quota in ledger._teams.selecting(namespace):
                parts[(namespace, quota.name)] = (quota, self._sum(entries.values(), quota, alike))
        return by_namespace, by_owner, usage, counted, parts

    def _sum(self, entries: Iterable[Entry], quota: DeviceQuota, alike: dict[object, Usage]) -> Usage:
        key = usage_scope(quota)
        if (found := alike.get(key)) is None:
            found = alike[key] = sum_usage(self._walk(entries), quota, self._ledger.default_mode)
        return found

    @staticmethod
    def _walk(items: Iterable[T]) -> Iterator[T]:
        """`items` with a pause point between two (only over what no one else mutates)."""
        for item in items:
            yield item
            pause_point()

    def _reconcile(self, touched: set[ClaimRef], by_namespace: dict[Namespace, dict[ClaimRef, Entry]],
                   by_owner: dict[str, set[ClaimRef]]) -> dict[Namespace, list[tuple[Entry | None, Entry | None]]]:
        """Kept claims the live ledger changed while this was built take the live entry;
        the (old, new) pairs changed, by namespace, for the usage."""
        changed: dict[Namespace, list[tuple[Entry | None, Entry | None]]] = {}
        for ref in touched & self._kept:
            old, new = self._entries.get(ref), self._ledger._entries.get(ref)
            if old is new:
                continue
            if old is not None:
                del self._entries[ref]
                by_namespace[old.namespace].pop(ref, None)
                if old.owner and (owned := by_owner.get(old.owner)) is not None:
                    owned.discard(ref)
                    if not owned:
                        del by_owner[old.owner]
                changed.setdefault(old.namespace, []).append((old, None))
            if new is not None:
                self._entries[ref] = new
                by_namespace.setdefault(new.namespace, {})[ref] = new
                if new.owner:
                    by_owner.setdefault(new.owner, set()).add(ref)
                changed.setdefault(new.namespace, []).append((None, new))
        return changed
