"""Two-variable comprehensions (cel-go ext.TwoVarComprehensions, base.go since 1.32).

`list.all(i, v, p)` binds the index and the element, `map.all(k, v, p)` the key and
the value; `exists`, `existsOne`, `transformList`, `transformMap` and
`transformMapEntry` (optionally with a filter before the transform) follow the same
pattern. `all` and `exists` absorb errors by the one rule of the one-variable macros
(`quota.cel.calls.quantify`) and each step is charged as there; `quota.cel.evaluator`
picks this module when `var2` is set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from quota.cel import ops
from quota.cel.calls import quantify
from quota.cel.runtime import Fn, State, charge, not_iterable
from quota.cel.values import EvalError

Slots = tuple[int, int]


def _pairs(rng: Fn, st: State) -> Iterator[tuple[Any, Any]]:
    value = rng(st)
    if type(value) is tuple:
        return iter(enumerate(value))
    if isinstance(value, dict):
        return iter(list(value.items()))
    raise not_iterable(value)


def _steps(rng: Fn, slots: Slots, step: int, st: State) -> Iterator[tuple[Any, Any]]:
    for first, second in _pairs(rng, st):
        charge(st, step)
        st.slots[slots[0]] = first
        st.slots[slots[1]] = second
        yield first, second


def _keep(pred: Fn | None, st: State, name: str) -> bool:
    if pred is None:
        return True
    keep = pred(st)
    if type(keep) is not bool:
        raise ops.no_overload(name, keep)
    return keep


def _exists_one(rng: Fn, slots: Slots, body: Fn, pred: Fn | None, step: int) -> Fn:
    def run(st: State) -> bool:
        count = 0
        for _ in _steps(rng, slots, step, st):
            result = body(st)
            if type(result) is not bool:
                raise ops.no_overload("existsOne", result)
            count += result
        return count == 1

    return run


def _transform_list(rng: Fn, slots: Slots, body: Fn, pred: Fn | None, step: int) -> Fn:
    def run(st: State) -> tuple[Any, ...]:
        return tuple(body(st) for _ in _steps(rng, slots, step, st) if _keep(pred, st, "transformList"))

    return run


def _transform_map(rng: Fn, slots: Slots, body: Fn, pred: Fn | None, step: int) -> Fn:
    def run(st: State) -> dict[Any, Any]:
        return {key: body(st) for key, _ in _steps(rng, slots, step, st) if _keep(pred, st, "transformMap")}

    return run


def _transform_map_entry(rng: Fn, slots: Slots, body: Fn, pred: Fn | None, step: int) -> Fn:
    def run(st: State) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for _ in _steps(rng, slots, step, st):
            if not _keep(pred, st, "transformMapEntry"):
                continue
            entry = body(st)
            if not isinstance(entry, dict):
                raise ops.no_overload("transformMapEntry", entry)
            for key, value in entry.items():
                if key in out:
                    raise EvalError(f"insert failed: key {key} already exists")
                out[key] = value
        return out

    return run


_BUILDERS: dict[str, Callable[[Fn, Slots, Fn, Fn | None, int], Fn]] = {
    "exists_one": _exists_one,
    "transformList": _transform_list,
    "transformMap": _transform_map,
    "transformMapEntry": _transform_map_entry,
}


def compile_two_var(kind: str, rng: Fn, slots: Slots, body: Fn, pred: Fn | None, step: int) -> Fn:
    if kind in ("all", "exists"):
        stop_on = kind == "exists"
        return lambda st: quantify(kind, stop_on, _steps(rng, slots, step, st), body, st)
    return _BUILDERS[kind](rng, slots, body, pred, step)
