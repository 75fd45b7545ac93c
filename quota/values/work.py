"""What pricing a tenant's object may cost, and where long pricing may pause.

Neighbours: `quota.pricing.pricer` gives every claim it prices a `Budget` and charges it;
`quota.devices.selectors` and `quota.devices.verdicts` spend it on CEL evaluations; `quota.cel` calls
`pause_point` while compiling and every `PAUSE_EVERY` cost units while evaluating;
`runtime.slicing` installs the pause hook that lets the event loop run between slices
of one review's pricing (`pausing`), and the wait hook for work that waits on another
call's (`wait_point`). Pure: no clock, no I/O; a pause is whatever the
hook does (nothing, for `dra-quota check` and the caches).

Budgets follow the API server's model, so that no tenant's selectors hold the event loop
from everyone else's reviews: a per-expression cost limit (the
scheduler's 1,000,000, `quota.cel.COST_LIMIT`) *and* a total per call. Here the calls
are a claim (every request, subrequest and pricing mode of it) and a review (everything
one admission answer or one Kueue Workload decision prices). The units are the CEL
cost units, plus `COMPILE_UNITS_PER_BYTE` per byte of each request selector (compiling
a 10 KiB expression takes up to ~200 ms, more than a million units of evaluation).
A claim is charged what its pricing costs computed from scratch: results cached by
earlier claims (compiled selectors, matches, verdicts) are charged at the cost they
had, so the same claim gets the same verdict on every replica and in `dra-quota check`,
cache or no cache. Work shared inside one claim (the same selector in two requests,
the second pricing mode) is charged once (`Budget.once`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, MutableMapping, MutableSequence, MutableSet
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal, TypeVar

__all__ = ["CLAIM_COST_BUDGET", "COMPILE_UNITS_PER_BYTE", "PAUSE_EVERY", "REVIEW_COST_BUDGET", "Budget",
           "BudgetExceeded", "PAUSE_ITEMS", "Pause", "drop", "paced", "pause_point", "pauses", "pausing", "wait_point"]

# Per claim: twice the scheduler's per-expression limit, ~0.2-0.4 s of work on an idle
# core (1-2 s on a loaded one). Honest claims cost thousands of units (grouping
# evaluates each selector once per distinct device shape); a selector read per device
# over a 58,000-device inventory costs ~300,000.
CLAIM_COST_BUDGET = 2_000_000
# Per review: twice a claim's (a claim is priced once for its check, and a denial's
# explanation may price it again, `quota.admission.explain`), and all the templates of a Kueue
# Workload together.
REVIEW_COST_BUDGET = 4_000_000
# Compiling costs ~5-70 us a byte (the LALR parse, then five passes over the AST); an
# evaluation unit ~30-200 ns.
COMPILE_UNITS_PER_BYTE = 50
# CEL units between two pause points of one evaluation (~0.1-0.4 ms of work).
PAUSE_EVERY = 2_000
# Items of a plain loop over every device or pool between two pause points (`paced`:
# a few dict operations an item, ~0.5-1 ms of work).
PAUSE_ITEMS = 1024

T = TypeVar("T")
Scope = Literal["claim", "review"]
Pause = Callable[[], None]


class BudgetExceeded(Exception):
    """Pricing ran out of a budget; `message` says which, its size, and what to do."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        super().__init__(budget.message())


class Budget:
    """Units one claim or one review may still spend; a claim's spending counts in its review's too.

    Spent once per CEL evaluation, so flat: a claim's `cap` is the least of its own limit
    and what its review had left when the claim's pricing began (a review prices its
    claims one after another), and its spending is added to the review's as it goes.
    """

    __slots__ = ("limit", "spent", "scope", "parent", "cap", "_charged")

    def __init__(self, limit: int, scope: Scope, parent: Budget | None = None) -> None:
        self.limit = limit
        self.spent = 0
        self.scope: Scope = scope
        self.parent = parent
        self.cap = limit if parent is None else min(limit, parent.remaining)
        self._charged: set[Hashable] = set()

    @classmethod
    def review(cls) -> Budget:
        return cls(REVIEW_COST_BUDGET, "review")

    @classmethod
    def claim(cls, review: Budget | None = None) -> Budget:
        return cls(CLAIM_COST_BUDGET, "claim", review if review is not None else cls.review())

    @property
    def remaining(self) -> int:
        return self.cap - self.spent

    def spend(self, units: int) -> None:
        """Count `units`; raise BudgetExceeded (naming the budget that ran out) past a limit."""
        self.spent += units
        if self.parent is not None:
            self.parent.spent += units
        if self.spent > self.cap:
            raise BudgetExceeded(self if self.spent > self.limit or self.parent is None else self.parent)

    def once(self, key: Hashable, units: int) -> None:
        """`spend(units)` unless this claim was charged for `key` already."""
        if key in self._charged:
            return
        self._charged.add(key)
        self.spend(units)

    def mark(self, key: Hashable) -> None:
        """`key`'s work was spent live (a match computed now): `once` will not charge it again."""
        self._charged.add(key)

    def message(self) -> str:
        what = ("pricing this claim (all its requests, subrequests and selectors)" if self.scope == "claim" else
                "this review (every claim it prices; for a Kueue Workload, all its ResourceClaimTemplates)")
        return (f"{what} exceeded the per-{self.scope} budget of {self.limit:,} CEL cost units "
                f"(each selector is charged its evaluations over the inventory and {COMPILE_UNITS_PER_BYTE} units "
                "per byte to compile): make the selectors cheaper (no loops over lists or ranges), read attributes "
                "by name so devices with equal values are evaluated once, or use fewer requests and subrequests")


# The pause hook of the running slice (`runtime.slicing`), or None: pricing never pauses.
# A ContextVar, so that only the greenlet a slicer runs sees its hook.
_PAUSE: ContextVar[Pause | None] = ContextVar("dra_quota_pause", default=None)
# Its other hook: give the loop back now, whatever is left of the slice (`wait_point`).
_WAIT: ContextVar[Pause | None] = ContextVar("dra_quota_wait", default=None)


def pause_point() -> None:
    """Where long work may let others run (compiling: per token and per AST node)."""
    hook = _PAUSE.get()
    if hook is not None:
        hook()


def wait_point() -> bool:
    """Where work waits on another caller's (a partition another review is building):
    give the loop back now. False where nothing runs this work in slices: waiting there
    would never end, so the caller does the work itself."""
    hook = _WAIT.get()
    if hook is None:
        return False
    hook()
    return True


def pauses() -> Pause | None:
    """The hook itself, for loops that fetch it once and call it every so often."""
    return _PAUSE.get()


def paced(items: Iterable[T], every: int = PAUSE_ITEMS) -> Iterator[T]:
    """`items`, with a pause point after every `every` of them: for loops over every
    device (58,000) that would otherwise hold the loop for tens of ms in one piece."""
    for n, item in enumerate(items, 1):
        yield item
        if not n % every:
            pause_point()


def drop(items: MutableMapping[Any, Any] | MutableSequence[Any] | MutableSet[Any]) -> None:
    """Empty `items` an element at a time, with a pause point between two.

    Reference counting frees what was only held here as each goes: the old caches of a
    relist (millions of objects) dropped in one go free in one cascade, ~0.1 s a million
    objects holding the loop (bench/stalls.py). Only `items` itself is emptied: an
    element that is a big table of its own (one namespace's claims) is the caller's to
    drop first, who knows it is no one else's.
    """
    if isinstance(items, MutableMapping):
        while items:
            items.popitem()
            pause_point()
    else:
        while items:
            items.pop()
            pause_point()


@contextmanager
def pausing(hook: Pause, wait: Pause | None = None) -> Iterator[None]:
    """`hook` at every pause point, `wait` at every wait point (module doc)."""
    token, waiting = _PAUSE.set(hook), _WAIT.set(wait)
    try:
        yield
    finally:
        _PAUSE.reset(token)
        _WAIT.reset(waiting)
