"""One stage of selectors evaluated over the groups of a partition, and its verdict caches.

Neighbours: `quota.devices.selectors` compiles each stage (`new_stage`), builds the partition
for the chain of field sets the stages read (`quota.devices.partitions`) and asks a `StageRun`
per stage whether each group passes; `quota.cel` evaluates one selector.

Why it is fast:
- A group's key holds the base fields, then each stage's fields in order, so a stage's
  verdict depends only on its slice of the key: a `StageRun` looks it up per distinct
  slice (a class selector over 58,000 per-device groups runs once).
- CEL sees a `device` projected on the paths the stage can read, never the whole
  device converted: built from the group key itself (`_KeyView`: driver and sharing are
  base fields, attributes and presence the stage's own), or, for a stage reading a
  capacity's amount (keys hold capacities by identity), from the device's own paths
  (`quota.cel.activation.projected_activation`). Either costs about a microsecond.
- Verdicts are kept across matches and inventory changes, per stage, by the values it
  reads (`Verdicts`); a stage reading a value unique per device (a uuid) fills neither
  that cache nor the per-match one past `PER_STAGE` entries: it just evaluates.

What it costs (`quota.values.work`): every evaluation spends the claim's `Budget`, and a
verdict found in the cache spends what it cost when it was evaluated, so a claim costs
the same whatever earlier claims left in the caches. Long evaluations pause every
`quota.values.work.PAUSE_EVERY` units when a slicer runs them (`runtime.slicing`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from quota.cel import COST_EXCEEDED, COST_LIMIT, CelRuntimeError, CompiledSelector, DeviceActivation, DevicePath
from quota.cel.activation import Projection, cel_attribute, projected_activation, projection_of
from quota.cel.ops import DomainMap
from quota.devices.columns import DRIVER_AT, MISSING, MULTI_AT, PRESENCE, Field, cel_value, presence, untyped
from quota.devices.partitions import GroupKey
from quota.values.model import Device
from quota.values.work import Budget, Pause

__all__ = ["SelectorError", "Stage", "StageFailed", "Verdicts", "StageRun", "new_stage", "PER_STAGE"]

# Distinct values of one stage worth remembering: a few per device shape for real
# selectors; past this many the stage reads something per device.
PER_STAGE = 1024


@dataclass(frozen=True, slots=True)
class SelectorError:
    """A selector that failed to compile, or errored on a device (stage, index, message)."""

    stage: int
    index: int
    message: str
    compile_error: bool


@dataclass(frozen=True, slots=True)
class Stage:
    index: int
    expressions: tuple[str, ...]
    selectors: tuple[CompiledSelector, ...]
    # Sorted fields the stage's selectors read, as presence fields where they only test
    # presence; None when one reads `device` dynamically.
    fields: tuple[Field, ...] | None
    # The paths they can read: all of `device` their evaluation needs to be shown.
    projection: Projection


def new_stage(index: int, expressions: tuple[str, ...], selectors: tuple[CompiledSelector, ...]) -> Stage:
    """A path some selector reads by value is a value field; one only ever tested for
    presence (`quota.cel.references.presence_only`) splits devices by presence alone."""
    values: set[DevicePath] = set()
    tested: set[DevicePath] = set()
    for selector in selectors:
        if selector.references is None:
            return Stage(index, expressions, selectors, None, ())
        values |= selector.references - selector.presence_only
        tested |= selector.presence_only
    fields = sorted(values) + sorted(presence(p) for p in tested - values)
    return Stage(index, expressions, selectors, tuple(fields), projection_of(values | tested))


class StageFailed(Exception):
    def __init__(self, error: SelectorError) -> None:
        super().__init__(error.message)
        self.error = error


class Verdicts:
    """Per stage (its expressions), verdicts by the values its selectors read, each with
    what it cost (`cost * 2 + verdict`, one int per entry).

    Kept across inventory changes: a seen selector after a slice update evaluates
    nothing. A table stops growing at `per_table` entries: a selector reading a value
    unique per device would otherwise fill the cache with verdicts nobody asks for
    again and evict every useful one. `limit` bounds all tables' entries together.
    """

    def __init__(self, limit: int, per_table: int = PER_STAGE) -> None:
        self._tables: OrderedDict[tuple[str, ...], dict[Hashable, int]] = OrderedDict()
        self._limit = limit
        self._per_table = per_table
        self._entries = 0

    def table(self, expressions: tuple[str, ...]) -> dict[Hashable, int]:
        found = self._tables.get(expressions)
        if found is None:
            found = self._tables[expressions] = {}
        self._tables.move_to_end(expressions)
        return found

    def store(self, expressions: tuple[str, ...], table: dict[Hashable, int], key: Hashable, verdict: bool,
              cost: int) -> None:
        # A match paused in a slice may come back to a table evicted meanwhile: entries
        # there would count against the limit for ever.
        if len(table) >= self._per_table or self._tables.get(expressions) is not table:
            return
        table[key] = cost * 2 + verdict
        self._entries += 1
        while self._entries > self._limit and len(self._tables) > 1:
            self._entries -= len(self._tables.popitem(last=False)[1])


class _KeyView:
    """Builds the projected `device` from a group key: the values the stage reads are in
    its slice, so the (cold) device objects are never touched."""

    __slots__ = ("plan",)

    def __init__(self, start: int, fields: tuple[Field, ...]) -> None:
        # (offset in the key, attributes?, domain, id, presence only?); driver and
        # allowMultipleAllocations come from the base fields, whether read or not.
        self.plan: list[tuple[int, bool, str, str, bool]] = []
        for at, field in enumerate(fields, start):
            presence_only = field[0] == PRESENCE
            path = field[1:] if presence_only else field
            if len(path) == 3:  # ("attributes" | "capacity", domain, id)
                self.plan.append((at, path[0] == "attributes", path[1], path[2], presence_only))

    @staticmethod
    def usable(fields: tuple[Field, ...]) -> bool:
        """Keys hold capacities by identity: their amounts must come from the device."""
        return all(f[0] != "capacity" for f in fields)

    def activation(self, key: GroupKey) -> DeviceActivation:
        attributes, capacity = DomainMap(), DomainMap()
        for at, is_attribute, domain, ident, presence_only in self.plan:
            value = key[at]
            if value is MISSING:
                continue
            side = attributes if is_attribute else capacity
            ids: dict[str, object] | None = side.get(domain)
            if ids is None:
                ids = side[domain] = {}
            # Only its presence is ever tested: any value stands for it.
            ids[ident] = True if presence_only else cel_attribute(untyped(value))
        return DeviceActivation(key[DRIVER_AT], attributes, capacity, untyped(key[MULTI_AT]))  # type: ignore[arg-type]


class StageRun:
    """One stage's verdicts during one match, by its slice [start, end) of group keys."""

    __slots__ = ("stage", "start", "end", "memo", "table", "verdicts", "activation", "budget", "pause", "view",
                 "spent")

    def __init__(self, stage: Stage, start: int, verdicts: Verdicts, *,
                 activation: Callable[[Device], DeviceActivation], budget: Budget, pause: Pause | None,
                 per_device: bool = False) -> None:
        self.stage = stage
        self.start = start
        self.end = start + (1 if stage.fields is None else len(stage.fields))
        # None: evaluate every group (a dynamic stage, or one that turned out per device).
        # `per_device`: keys do not hold the stage's fields (`quota.devices.equality`'s candidates).
        self.memo: dict[GroupKey, bool] | None = None if stage.fields is None or per_device else {}
        self.table = verdicts.table(stage.expressions)
        self.verdicts = verdicts
        self.activation = activation
        self.budget = budget
        self.pause = pause
        self.spent = 0  # what this stage cost in this match, cached verdicts included
        fields = stage.fields
        usable = fields is not None and not per_device and _KeyView.usable(fields)
        self.view = _KeyView(start, fields) if fields is not None and usable else None

    def passes(self, key: GroupKey, device: Device) -> bool:
        memo = self.memo
        if memo is None:
            return self._evaluate(key, device)
        values = key[self.start:self.end]
        found = memo.get(values)
        if found is None:
            found = memo[values] = self._cached(key, device)
            if len(memo) > PER_STAGE:
                # Values unique per device: neither cache will be asked for them again.
                self.memo = None
        return found

    def verdict(self, device: Device) -> bool:
        """One device's verdict outside any walk (a quota's selection judging an allocated
        device): through the verdict table by the values the stage reads, as in a walk.
        Build the run with `per_device`: no key holds those values."""
        return self._evaluate((), device) if self.stage.fields is None else self._cached((), device)

    def _cached(self, key: GroupKey, device: Device) -> bool:
        assert self.stage.fields is not None
        values = tuple([cel_value(device, f) for f in self.stage.fields])
        found = self.table.get(values)
        if found is not None:
            self._spend(found >> 1)
            return bool(found & 1)
        before = self.spent
        verdict = self._evaluate(key, device)
        self.verdicts.store(self.stage.expressions, self.table, values, verdict, self.spent - before)
        return verdict

    def _spend(self, cost: int) -> None:
        self.spent += cost
        self.budget.spend(cost)

    def _evaluate(self, key: GroupKey, device: Device) -> bool:
        stage, budget = self.stage, self.budget
        # Error devices never get to a projection (quota.devices.selectors fails on their ERROR).
        if self.view is not None:
            activation = self.view.activation(key)
        elif stage.fields is not None:
            activation = projected_activation(device, stage.projection, None)
        else:
            activation = self.activation(device)
        for position, selector in enumerate(stage.selectors):
            limit = min(COST_LIMIT, budget.remaining)
            try:
                matched, cost = selector.evaluate_with_cost(activation, cost_limit=limit, pause=self.pause)
            except CelRuntimeError as err:
                if limit < COST_LIMIT and str(err) == COST_EXCEEDED:
                    budget.spend(limit + 1)  # raises BudgetExceeded, naming the claim's or the review's
                message = f"{err} (device {device.key})"
                raise StageFailed(SelectorError(stage.index, position, message, compile_error=False)) from None
            self._spend(cost)
            if not matched:
                return False
        return True
