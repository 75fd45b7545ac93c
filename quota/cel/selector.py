"""The public face of the DRA CEL environment: compile a selector, evaluate it.

`compile_selector` runs the pipeline parse (`quota.cel.syntax`) -> check
(`quota.cel.checker`) -> references (`quota.cel.references`) and cost estimate
(`quota.cel.estimate`) -> closures (`quota.cel.evaluator`) once per expression and keeps the result in an LRU cache, like
the scheduler's compiled-expression cache (k/k dynamic-resource-allocation/cel/cache.go).
Errors carry the API server's and scheduler's wording: "compilation failed: ...",
"must evaluate to bool ...", "no such key: ...", "... actual cost limit exceeded".
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator

from quota.cel import checker, references
from quota.cel.estimate import estimate
from quota.cel.evaluator import compile_program, node_count
from quota.cel.literals import SyntaxProblem
from quota.cel.nesting import MAX_AST_DEPTH
from quota.cel.ops import DeviceActivation
from quota.cel.runtime import COST_EXCEEDED, COST_LIMIT, Fn, State
from quota.cel.values import CostLimitExceeded, EvalError, type_name
from quota.values.work import PAUSE_EVERY, pause_point

__all__ = ["CelCompileError", "CelRuntimeError", "CompiledSelector", "compile_selector", "MAX_EXPRESSION_BYTES"]

# resourceapi.CELSelectorExpressionMaxLength (k/k staging/src/k8s.io/api/resource/v1/types.go).
MAX_EXPRESSION_BYTES = 10 * 1024
_CACHE_SIZE = 4096


class CelCompileError(ValueError):
    """The expression is not a valid DRA selector; the message says why and where."""


class CelRuntimeError(RuntimeError):
    """Evaluating a selector against a device failed; the scheduler would fail the
    whole allocation attempt with this error rather than skip the device."""


class CompiledSelector:
    """A compiled, immutable selector; share it freely between devices and threads."""

    __slots__ = ("expression", "references", "presence_only", "estimated_cost", "equalities", "_fn", "_slots",
                 "_base_cost")

    def __init__(
        self,
        expression: str,
        refs: frozenset[references.DevicePath] | None,
        fn: Fn,
        slots: int,
        *,
        base_cost: int,
        estimated_cost: int | None,
        presence_only: frozenset[references.DevicePath] = frozenset(),
        equalities: tuple[tuple[references.DevicePath, str | int | bool], ...] = (),
    ) -> None:
        self.expression = expression
        self.references = refs
        # The references only tested for presence: devices need agree on nothing more.
        self.presence_only = presence_only
        # Advisory worst case of one evaluation (None: unbounded), see quota.cel.estimate.
        self.estimated_cost = estimated_cost
        # Top-level `attribute == literal` terms (`quota.cel.references.equalities`).
        self.equalities = equalities
        self._fn = fn
        self._slots = slots
        # Every node evaluated once; loops and traversals add to it while running.
        self._base_cost = base_cost

    def __repr__(self) -> str:
        return f"CompiledSelector({self.expression!r})"

    def evaluate(self, activation: DeviceActivation, *, cost_limit: int = COST_LIMIT) -> bool:
        """Does the device match? Raises CelRuntimeError for any evaluation error."""
        return self.evaluate_with_cost(activation, cost_limit=cost_limit)[0]

    def evaluate_with_cost(self, activation: DeviceActivation, *, cost_limit: int = COST_LIMIT,
                           pause: Callable[[], None] | None = None) -> tuple[bool, int]:
        """`evaluate`, plus the cost spent: lets a caller keep one budget across many
        devices (a claim's selectors over a whole inventory). `pause` is called every
        `quota.values.work.PAUSE_EVERY` units (the slicer's hook: one evaluation may take
        100-200 ms of the 1,000,000 units)."""
        if activation.error is not None:
            raise CelRuntimeError(activation.error)
        state = State(activation, self._slots, cost_limit - self._base_cost, pause=pause, every=PAUSE_EVERY)
        try:
            result = self._fn(state)
        except EvalError as exc:
            raise CelRuntimeError(str(exc)) from None
        except CostLimitExceeded:
            raise CelRuntimeError(COST_EXCEEDED) from None
        except (RecursionError, MemoryError, ArithmeticError, TypeError, ValueError) as exc:
            # Not expected; keep the webhook answering with a clear error, never a crash.
            raise CelRuntimeError(f"internal evaluation error: {type(exc).__name__}: {exc}") from None
        if type(result) is not bool:
            raise CelRuntimeError(f"CEL result of type {type_name(result)} could not be converted to bool")
        return result, self._base_cost + state.cost


def compile_selector(expression: str) -> CompiledSelector:
    """Compile (or fetch from the LRU cache) one CEL selector expression."""
    if not isinstance(expression, str):  # YAML can hand over a number or a list
        raise CelCompileError(f"expression must be a string, not {type(expression).__name__}")
    result = _compile_cached(expression)
    if isinstance(result, CelCompileError):
        raise CelCompileError(str(result))
    return result


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _compile_cached(expression: str) -> CompiledSelector | CelCompileError:
    # Failures are cached too: a bad selector in a popular class must not be re-parsed
    # for every admission request.
    try:
        with _recursion_room():
            return _compile(expression)
    except CelCompileError as exc:
        return exc
    except (RecursionError, MemoryError) as exc:  # a safety net: the limits should prevent both
        return CelCompileError(f"expression too complex to compile ({type(exc).__name__})")


@contextlib.contextmanager
def _recursion_room() -> Iterator[None]:
    """The checker, compiler and estimator recurse over the AST with up to 3 Python
    frames per level; `quota.cel.nesting` bounds the depth (MAX_AST_DEPTH), and this
    makes sure the interpreter's limit leaves room for that on top of the caller's
    stack. Python 3.11+ keeps Python-to-Python calls off the C stack, so a higher
    limit is safe; compilation is rare (cached), evaluation never needs this."""
    needed = _frame_depth() + 4 * MAX_AST_DEPTH + 100
    if needed > sys.getrecursionlimit():
        # Raised, never lowered again: compilations paused in slices (`quota.values.work`)
        # interleave, and one restoring the limit under another would fail it.
        sys.setrecursionlimit(needed)
    yield


def _frame_depth() -> int:
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth += 1
        frame = frame.f_back  # type: ignore[assignment]
    return depth


def _compile(expression: str) -> CompiledSelector:
    try:
        size = len(expression.encode("utf-8"))
    except UnicodeEncodeError as err:
        # Only a Python string can hold one: Go's JSON decoder (the API server) turns a
        # lone surrogate escape into U+FFFD, so no stored expression contains it.
        raise CelCompileError(
            f"expression is not valid UTF-8 text: a lone surrogate at character {err.start}"
        ) from None
    if size > MAX_EXPRESSION_BYTES:
        raise CelCompileError(
            f"expression too long: {size} bytes, may not be more than {MAX_EXPRESSION_BYTES} bytes"
        )
    # Imported at the first compile: building the grammar costs ~0.2 s of CPU, which a
    # command that compiles no selector (`--help`, `top`) should not pay: every command
    # starts at once.
    from quota.cel import syntax

    try:
        root = syntax.parse(expression)
    except SyntaxProblem as exc:
        raise CelCompileError(_compile_failed(expression, exc.message, exc.line, exc.column)) from None
    try:
        notes = checker.check(root)
    except checker.CheckProblem as exc:
        if exc.message.startswith("must evaluate to"):
            raise CelCompileError(exc.message) from None
        raise CelCompileError(_compile_failed(expression, exc.message, *exc.pos)) from None
    fn, slots = compile_program(root, notes)
    return CompiledSelector(
        expression,
        references.references(root),
        fn,
        slots,
        base_cost=node_count(root),
        estimated_cost=estimate(root),
        presence_only=references.presence_only(root),
        equalities=references.equalities(root),
    )


def _compile_failed(expression: str, message: str, line: int, column: int) -> str:
    """cel-go's issue format, prefixed as compile.go does."""
    lines = expression.splitlines() or [""]
    source = lines[min(line, len(lines)) - 1]
    caret = "." * (column - 1) + "^"
    return f"compilation failed: ERROR: <input>:{line}:{column}: {message}\n | {source}\n | {caret}"
