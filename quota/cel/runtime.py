"""Per-evaluation state and the runtime cost budget shared by the evaluator modules.

`quota.cel.evaluator` and `quota.cel.calls` build closures `Fn = State -> value`;
`charge` spends the budget and raises `CostLimitExceeded` past the scheduler's limit
(k/k resource/v1 CELSelectorExpressionMaxCost = 1,000,000, enforced per evaluation by
dynamic-resource-allocation/cel/compile.go through cel.CostLimit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quota.cel.library import Overload
from quota.cel.types import T, runtime_test
from quota.cel.values import CostLimitExceeded, EvalError, go_type_name

COST_LIMIT = 1_000_000
COST_EXCEEDED = "operation cancelled: actual cost limit exceeded"


class State:
    """Per-evaluation state: the device, local variable slots, the cost spent.

    `mark` is the cost at which `charge` looks up: the limit, or with a `pause` hook
    (`quota.values.work`) the next pause point before it, so that one long evaluation lets the
    event loop run every `every` units without a second comparison per charge.
    """

    __slots__ = ("device", "slots", "cost", "limit", "mark", "pause", "every")

    def __init__(self, device: Any, slot_count: int, limit: int = COST_LIMIT, *,
                 pause: Callable[[], None] | None = None, every: int = 0) -> None:
        self.device = device
        self.slots: list[Any] = [None] * slot_count
        self.cost = 0
        self.limit = limit
        self.pause = pause
        self.every = every
        self.mark = limit if pause is None else min(limit, every)

    def passed_mark(self) -> None:
        if self.cost > self.limit:
            raise CostLimitExceeded(COST_EXCEEDED)
        assert self.pause is not None
        self.pause()
        self.mark = min(self.limit, self.cost + self.every)


Fn = Callable[[State], Any]


def charge(st: State, amount: int) -> None:
    st.cost += amount
    if st.cost > st.mark:
        st.passed_mark()


def needs_runtime_check(overload: Overload, static: list[T]) -> bool:
    return any(runtime_test(p) is not None and s.is_dyn for p, s in zip(overload.params, static))


def not_iterable(value: Any) -> EvalError:
    return EvalError(f"got '{go_type_name(value)}', expected iterable type")
