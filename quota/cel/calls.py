"""Closures for function calls and comprehension macros, split out of the evaluator.

`compile_call` binds a call site to the overloads `quota.cel.checker` left possible:
one statically proven overload is called directly, several are dispatched on the
runtime types (cel-go's dynamic dispatch for `dyn` arguments). `optional.or` and
`orValue` short-circuit like cel-go's planner. `compile_comprehension` implements
all / exists / exists_one / map / filter and the optional macros optMap / optFlatMap
with cel-go's error absorption (`all` is false if any element is false, even when
another element errored) and charges each step to the budget in `quota.cel.runtime`;
the two-variable forms live in `quota.cel.twovar`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from quota.cel import ops
from quota.cel.extlib import sort_keys
from quota.cel.library import Overload
from quota.cel.runtime import Fn, State, charge, needs_runtime_check, not_iterable
from quota.cel.types import T, runtime_test
from quota.cel.values import EvalError, Optional


def compile_call(name: str, candidates: tuple[Overload, ...], fns: list[Fn], static: list[T]) -> Fn:
    if name in ("or", "orValue") and len(fns) == 2 and all(o.member for o in candidates):
        return _optional_fallback(name, fns[0], fns[1])
    if len(candidates) == 1 and not needs_runtime_check(candidates[0], static):
        return _direct(candidates[0], fns)
    return _dispatch(name, candidates, fns)


def _direct(overload: Overload, fns: list[Fn]) -> Fn:
    impl, cost = overload.impl, overload.cost
    if cost is not None:

        def costly(st: State) -> Any:
            args = [f(st) for f in fns]
            charge(st, 1 + cost(*args))
            return impl(*args)

        return costly
    if len(fns) == 0:
        return lambda st: impl()
    if len(fns) == 1:
        (a,) = fns
        return lambda st: impl(a(st))
    if len(fns) == 2:
        a, b = fns
        return lambda st: impl(a(st), b(st))
    return lambda st: impl(*[f(st) for f in fns])


def _dispatch(name: str, candidates: tuple[Overload, ...], fns: list[Fn]) -> Fn:
    tests = [(o, [runtime_test(p) for p in o.params]) for o in candidates]

    def dispatch(st: State) -> Any:
        args = [f(st) for f in fns]
        for overload, predicates in tests:
            if all(p is None or p(a) for p, a in zip(predicates, args)):
                if overload.cost is not None:
                    charge(st, 1 + overload.cost(*args))
                return overload.impl(*args)
        raise ops.no_overload(name, *args)

    return dispatch


def _optional_fallback(name: str, receiver: Fn, alternative: Fn) -> Fn:
    def fallback(st: State) -> Any:
        value = receiver(st)
        if type(value) is not Optional:
            raise ops.no_overload(name, value)
        if value.has_value:
            return value if name == "or" else value.value
        result = alternative(st)
        if name == "or" and type(result) is not Optional:
            raise ops.no_overload(name, value, result)
        return result

    return fallback


def _items(rng: Fn, st: State) -> tuple[Any, ...]:
    value = rng(st)
    if type(value) is tuple:
        return value
    if isinstance(value, dict):
        return tuple(value)
    raise not_iterable(value)


def compile_comprehension(kind: str, rng: Fn, slot: int, body: Fn, pred: Fn | None, step: int) -> Fn:
    builder: Callable[[Fn, int, Fn, Fn | None, int], Fn] = _BUILDERS[kind]
    return builder(rng, slot, body, pred, step)


def quantify(name: str, stop_on: bool, steps: Iterable[object], body: Fn, st: State) -> bool:
    """`all` (stop_on False) or `exists` (stop_on True) over `steps`, each of which has
    bound the loop variables and charged its step, with cel-go's error absorption: an
    element that errors is ignored if another decides the result, else re-raised.
    The one rule for the one-variable macros here and the two-variable ones
    (`quota.cel.twovar`)."""
    # Compared by identity with untyped results; kept apart from the bools returned so
    # the comparison cannot narrow them.
    decisive: object = stop_on
    other: object = not stop_on
    error: EvalError | None = None
    for _ in steps:
        try:
            result = body(st)
        except EvalError as exc:
            error = error or exc
            continue
        if result is decisive:
            return stop_on
        if result is not other:
            error = error or ops.no_overload(name, result)
    if error is not None:
        raise error
    return not stop_on


def _steps(rng: Fn, slot: int, step: int, st: State) -> Iterator[object]:
    for item in _items(rng, st):
        charge(st, step)
        st.slots[slot] = item
        yield item


def _quantifier(name: str, stop_on: bool) -> Callable[[Fn, int, Fn, Fn | None, int], Fn]:
    def build(rng: Fn, slot: int, body: Fn, pred: Fn | None, step: int) -> Fn:
        return lambda st: quantify(name, stop_on, _steps(rng, slot, step, st), body, st)

    return build


_all = _quantifier("all", stop_on=False)
_exists = _quantifier("exists", stop_on=True)


def _exists_one(rng: Fn, slot: int, body: Fn, pred: Fn | None, step: int) -> Fn:
    def run(st: State) -> bool:
        count = 0
        for item in _items(rng, st):
            charge(st, step)
            st.slots[slot] = item
            result = body(st)
            if type(result) is not bool:
                raise ops.no_overload("exists_one", result)
            count += result
        return count == 1

    return run


def _map(rng: Fn, slot: int, body: Fn, pred: Fn | None, step: int) -> Fn:
    def run(st: State) -> tuple[Any, ...]:
        out = []
        for item in _items(rng, st):
            charge(st, step)
            st.slots[slot] = item
            if pred is not None:
                keep = pred(st)
                if type(keep) is not bool:
                    raise ops.no_overload("map", keep)
                if not keep:
                    continue
            out.append(body(st))
        return tuple(out)

    return run


def _filter(rng: Fn, slot: int, body: Fn, pred: Fn | None, step: int) -> Fn:
    def run(st: State) -> tuple[Any, ...]:
        out = []
        for item in _items(rng, st):
            charge(st, step)
            st.slots[slot] = item
            keep = body(st)
            if type(keep) is not bool:
                raise ops.no_overload("filter", keep)
            if keep:
                out.append(item)
        return tuple(out)

    return run


def _sort_by(rng: Fn, slot: int, body: Fn, pred: Fn | None, step: int) -> Fn:
    """ext.Lists `list.sortBy(v, key)`: a stable sort by the key of each element."""

    def run(st: State) -> tuple[Any, ...]:
        items = _items(rng, st)
        keys = []
        for item in items:
            charge(st, step)
            st.slots[slot] = item
            keys.append(body(st))
        order = sort_keys(keys)
        return tuple(items[i] for i in order)

    return run


def _opt_map(rng: Fn, slot: int, body: Fn, pred: Fn | None, step: int) -> Fn:
    return _optional_macro(rng, slot, body, step, flat=False)


def _opt_flat_map(rng: Fn, slot: int, body: Fn, pred: Fn | None, step: int) -> Fn:
    return _optional_macro(rng, slot, body, step, flat=True)


def _optional_macro(rng: Fn, slot: int, body: Fn, step: int, *, flat: bool) -> Fn:
    """`opt.optMap(v, e)` / `opt.optFlatMap(v, e)`: none stays none, else apply e."""

    def run(st: State) -> Optional:
        value = rng(st)
        if type(value) is not Optional:
            raise ops.no_overload("optFlatMap" if flat else "optMap", value)
        if not value.has_value:
            return value
        charge(st, step)
        st.slots[slot] = value.value
        result = body(st)
        if not flat:
            return Optional(result)
        if type(result) is not Optional:
            raise ops.no_overload("optFlatMap", result)
        return result

    return run


_BUILDERS: dict[str, Callable[[Fn, int, Fn, Fn | None, int], Fn]] = {
    "all": _all,
    "exists": _exists,
    "exists_one": _exists_one,
    "map": _map,
    "filter": _filter,
    "optMap": _opt_map,
    "sortBy": _sort_by,
    "optFlatMap": _opt_flat_map,
}
