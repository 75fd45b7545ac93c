"""Which devices of the inventory match a chain of CEL selectors.

Neighbours: `quota.cel` compiles and evaluates one expression; `quota.devices.inventory` holds
the devices; `quota.pricing.pricer` asks `SelectorMatcher.match` for the candidates of a
request: its class's selectors, then the request's own, in the order the scheduler
evaluates them (staging/src/k8s.io/dynamic-resource-allocation/structured/.../
allocator.go), each stage seeing only the devices the previous one kept.

Why it is fast:
- A CEL evaluation costs microseconds to tens of microseconds, and a cluster publishes
  tens of thousands of devices. `CompiledSelector.references` names the device fields
  an expression can read; devices that agree on those fields (and on what pricing
  needs: driver, memory, sharing, taints) get the same verdict, so each stage groups
  its input by those values (`quota.devices.partitions`) and evaluates CEL once per distinct
  value (`quota.devices.verdicts`), on a view of just those fields. The groups that pass are
  merged by what pricing needs, so pricing sees a few groups even when CEL had to run
  per device.
- Grouping never reads devices: the inventory keeps each pool's columns
  (`quota.devices.columns`), so a field no selector read before costs a lookup per pool, and
  pools that agree on it are split once. Partitions are kept per chain of field sets
  and refreshed per pool: after a slice update only that pool moves.

Cost and pauses (`quota.values.work`): a match spends the claim's budget on every evaluation
(`quota.devices.verdicts`), and a cached match spends what it cost when computed, once per
claim. Under a slicer (`runtime.slicing`) a match pauses between groups and inside
long evaluations; it walks a snapshot of the partition's classes taken when it
started, so a slice update that refreshes the partition in place meanwhile cannot
break the walk: the result is the match at the generation it started from, as if it
had run a moment earlier, and is cached under that generation.
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import overload

from quota.cel import CelCompileError, CompiledSelector, DeviceActivation, compile_selector, device_activation
from quota.cel.activation import activation_error
from quota.devices.columns import Field, PoolIndex, base_fields
from quota.devices.equality import INDEX_SHARE, EqualityIndex, index_term, worth_indexing
from quota.devices.inventory import Inventory
from quota.devices.partitions import FieldsOf, GroupKey, Part, Partition, Superseded
from quota.devices.verdicts import SelectorError, Stage, StageFailed, StageRun, Verdicts, new_stage
from quota.values.lru import LRU
from quota.values.model import Device
from quota.values.work import PAUSE_EVERY, Budget, pauses, wait_point

__all__ = ["PATIENCE", "SelectorError", "DeviceGroup", "Match", "SelectorMatcher"]


class _Devices(Sequence[Device]):
    """A group's devices, materialized on first iteration: pricing mostly needs only how
    many there are and one of them, and a group can span thousands of pools."""

    __slots__ = ("_parts", "_len", "_all")

    def __init__(self, parts: tuple[Part, ...]) -> None:
        self._parts = parts
        self._len = sum(len(pools) * len(positions) for pools, positions in parts)
        self._all: tuple[Device, ...] | None = None

    def __len__(self) -> int:
        return self._len

    @property
    def parts(self) -> tuple[Part, ...]:
        return self._parts

    @overload
    def __getitem__(self, index: int) -> Device: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Device]: ...

    def __getitem__(self, index: int | slice) -> Device | Sequence[Device]:
        if isinstance(index, int) and index == 0 and self._parts:
            pools, positions = self._parts[0]
            return pools[0].devices[positions[0]]
        return self._materialized()[index]

    def __iter__(self) -> Iterator[Device]:
        return iter(self._materialized())

    def _materialized(self) -> tuple[Device, ...]:
        if self._all is None:
            out: list[Device] = []
            for pools, positions in self._parts:
                if len(positions) == 1:
                    position = positions[0]
                    out.extend([pool.devices[position] for pool in pools])
                else:
                    get = operator.itemgetter(*positions)
                    for pool in pools:
                        out.extend(get(pool.devices))
            self._all = tuple(out)
        return self._all


class DeviceGroup:
    """Devices that passed the selectors, identical in everything pricing looks at."""

    __slots__ = ("devices",)

    def __init__(self, parts: tuple[Part, ...]) -> None:
        self.devices: Sequence[Device] = _Devices(parts)

    @property
    def representative(self) -> Device:
        return self.devices[0]

    def parts(self) -> tuple[Part, ...]:
        """Its devices as (pools, positions) pieces: the same positions in each of the pools."""
        devices = self.devices
        return devices.parts if isinstance(devices, _Devices) else ()


@dataclass(frozen=True, slots=True)
class Match:
    groups: tuple[DeviceGroup, ...]
    error: SelectorError | None = None
    # What computing it cost (CEL units) and what `Budget.once` knows it by.
    cost: int = 0
    key: Hashable = None

    @property
    def count(self) -> int:
        return sum(len(g.devices) for g in self.groups)

    def devices(self) -> Iterator[Device]:
        for group in self.groups:
            yield from group.devices


# Turns a call waits for another's rebuild of the level it needs that did not move (`_fresh`).
PATIENCE = 3


class SelectorMatcher:
    """Matches selector chains against one inventory, incrementally per pool."""

    def __init__(
        self,
        inventory: Inventory,
        *,
        cache_size: int = 1024,
        partition_cache_size: int = 32,
        verdict_cache_size: int = 65536,
        index_cache_size: int = 8,
    ) -> None:
        self._inventory = inventory
        self._compiled = LRU[Hashable, object](cache_size)
        # A partition holds a state per usable pool (about 0.5 MB at 5,000 pools), and
        # clusters read a few dozen distinct field sets at most: keep few, recompute rest.
        self._partitions = LRU[Hashable, object](partition_cache_size)
        # The levels being rebuilt now, by key: (the generation, the partition).
        self._building: dict[Hashable, tuple[int, Partition]] = {}
        self._results = LRU[Hashable, object](cache_size)
        # Equality indexes (`quota.devices.equality`) by attribute: ~8 MB each at 58,000 devices.
        self._indexes = LRU[Hashable, object](index_cache_size)
        self._verdicts = Verdicts(verdict_cache_size)
        self._activations: weakref.WeakKeyDictionary[Device, DeviceActivation] = weakref.WeakKeyDictionary()
        # Pools (re)partitioned so far: lets tests and benchmarks see incrementality.
        self.pools_computed = 0

    def match(self, stages: Sequence[Sequence[str]], capacity_names: Sequence[str] = (),
              budget: Budget | None = None) -> Match:
        """Devices passing every selector of every stage, grouped by what pricing reads.

        `capacity_names` are the capacities a request asks for: they join the grouping
        key so every device of a group has the same capacity to check and charge.
        `budget`: the claim's (a claim of its own when None); BudgetExceeded when it runs
        out, and nothing is cached then (another claim may have more left).
        """
        budget = budget if budget is not None else Budget.claim()
        generation = self._inventory.generation
        extra = tuple(sorted(set(capacity_names)))
        chain = tuple(tuple(stage) for stage in stages)
        key = ("match", chain, extra)
        result_key = (chain, extra, generation)
        cached = self._results.lookup(result_key)
        if isinstance(cached, Match):
            budget.once(key, cached.cost)
            return cached
        compiled: list[Stage] = []
        for index, expressions in enumerate(chain):
            stage = self._stage(index, expressions)
            if isinstance(stage, SelectorError):
                return Match((), stage, key=key)
            compiled.append(stage)
        runs: list[StageRun] = []
        try:
            groups = self._by_index(compiled, extra, generation, budget, runs)
            if groups is None:
                partition = self._partition(tuple(s.fields for s in compiled), extra, generation)
                groups = self._kept(compiled, partition, len(base_fields("", extra)), budget, runs)
            result = Match(groups, key=key)
        except StageFailed as failed:
            result = Match((), failed.error, key=key)
        result = replace(result, cost=sum(run.spent for run in runs))
        budget.mark(key)
        self._results.store(result_key, result)
        return result

    def selects(self, expressions: tuple[str, ...], device: Device, budget: Budget) -> bool | SelectorError:
        """Whether every selector of `expressions` is true for one device, or why they
        cannot say (they do not compile, fail on it, or it holds a value CEL cannot read).
        Verdicts come from, and go to, the same cache as a match's (`quota.devices.verdicts`)."""
        stage = self._stage(0, expressions)
        if isinstance(stage, SelectorError):
            return stage
        broken = activation_error(device)
        if broken is not None:
            return SelectorError(0, 0, f"{broken} (device {device.key})", compile_error=False)
        run = StageRun(stage, 0, self._verdicts, activation=self._activation, budget=budget, pause=pauses(),
                       per_device=True)
        try:
            return run.verdict(device)
        except StageFailed as failed:
            return failed.error

    def _stage(self, index: int, expressions: tuple[str, ...]) -> Stage | SelectorError:
        cached = self._compiled.lookup((index, expressions))
        if isinstance(cached, (Stage, SelectorError)):
            return cached
        selectors: list[CompiledSelector] = []
        result: Stage | SelectorError
        for position, expression in enumerate(expressions):
            try:
                selectors.append(compile_selector(expression))
            except CelCompileError as err:
                result = SelectorError(index, position, str(err), compile_error=True)
                break
        else:
            result = new_stage(index, expressions, tuple(selectors))
        self._compiled.store((index, expressions), result)
        return result

    # -- partitions ------------------------------------------------------------------

    def _partition(
        self, chain: tuple[tuple[Field, ...] | None, ...], extra: tuple[str, ...], generation: int
    ) -> Partition:
        """The partition for a chain of field sets, refined from the one for its prefix.

        It depends only on which fields are read, not on the expressions: every selector
        that reads `productName` shares one partition, whatever literal it compares with.
        """
        key = (chain, extra)
        found = self._partitions.lookup(key)
        partition = found if isinstance(found, Partition) else None
        if partition is not None and partition.generation == generation:
            return partition
        parent = self._partition(chain[:-1], extra, generation) if chain else None
        # The journal names the pools rebuilt since (the parent, refreshed first, already
        # moved them); when it cannot tell, or the parent was evicted and rebuilt since,
        # every pool is recomputed.
        changed = (self._inventory.changed_since(partition.generation)
                   if partition is not None and partition.parent is parent else None)
        if partition is not None and changed is not None:
            self.pools_computed += partition.refresh(changed, self._inventory.usable_pools())
            partition.generation = generation
            return partition
        return self._fresh(key, Partition(parent, _base(extra) if not chain else _fixed(chain[-1])), generation)

    def _fresh(self, key: Hashable, fresh: Partition, generation: int) -> Partition:
        """`fresh` rebuilt and installed, or the same level another caller installed
        meanwhile: this one waits for a rebuild under way (the loop given back each turn,
        `quota.values.work.wait_point`) while it moves, and a paused rebuild stops once another
        one is installed (`quota.devices.partitions.Superseded`). After a relist of the slices
        every review needs the levels rebuilt (~0.1 s): each building its own, new
        reviews' first slices starved the one that would finish and the slow lane's queue
        overflowed (bench/stalls.py). A rebuild that does not move for `PATIENCE` turns
        may be waiting for the slow lane this call holds: then this call builds its own."""
        def done_elsewhere() -> Partition | None:
            found = self._partitions.get(key)
            return found if isinstance(found, Partition) and found.generation == generation else None

        still = 0
        while (other := self._building.get(key)) is not None and other[0] == generation and still < PATIENCE:
            steps = other[1].steps
            if not wait_point():
                break
            still = still + 1 if other[1].steps == steps else 0
        if (done := done_elsewhere()) is not None:
            return done
        mine = self._building[key] = (generation, fresh)
        try:
            self.pools_computed += fresh.rebuild(self._inventory.usable_pools(), self._inventory.field_pools(),
                                                 done_elsewhere)
        except Superseded as superseded:
            return superseded.partition
        finally:
            if self._building.get(key) is mine:
                del self._building[key]
        fresh.generation = generation
        self._partitions.store(key, fresh)
        return fresh

    # -- verdicts --------------------------------------------------------------------

    def _kept(self, stages: list[Stage], partition: Partition, base: int, budget: Budget,
              runs: list[StageRun]) -> tuple[DeviceGroup, ...]:
        """The groups passing every stage, merged by their first `base` key values (the
        fields pricing needs uniform). `runs` receives the stages' runs (what they spent)."""
        kept: dict[GroupKey, list[Part]] = {}
        for key, pools, positions in self._walk(stages, partition, base, budget, runs, stages):
            kept.setdefault(key[:base], []).append((pools, positions))
        return tuple(DeviceGroup(tuple(parts)) for parts in kept.values())

    def _walk(self, stages: list[Stage], partition: Partition, base: int, budget: Budget, runs: list[StageRun],
              chain: list[Stage]) -> Iterator[tuple[GroupKey, tuple[PoolIndex, ...], tuple[int, ...]]]:
        """The partition's groups passing `stages`, which run in order, as the scheduler
        evaluates them: later ones only see devices the earlier ones kept, so their
        runtime errors cannot fire on others. `chain`: every stage of the match (a
        device CEL cannot see fails it if any stage evaluates CEL)."""
        pause = pauses()
        for stage in stages:
            runs.append(StageRun(stage, runs[-1].end if runs else base, self._verdicts,
                                 activation=self._activation, budget=budget, pause=pause))
        evaluated = [s for s in chain if s.selectors]
        # Class by class (pools with the same groups): a key may recur across classes.
        # A snapshot (module doc): the walk may pause, and refreshes move pools in place.
        classes = [(state, tuple(members.values())) for state, members in partition.classes.items()]
        walked, paused_at = 0, budget.spent
        for state, pools in classes:
            devices = pools[0].devices
            for key, positions in state:
                walked += 1
                # Every few hundred groups, or sooner after evaluations (each too short
                # to reach a pause point of its own).
                if pause is not None and (not walked % _PAUSE_GROUPS or budget.spent - paused_at >= PAUSE_EVERY):
                    pause()
                    paused_at = budget.spent
                device = devices[positions[0]]
                if type(key[0]) is str and evaluated:  # ERROR, the first base field: CEL cannot see it
                    message = f"{key[0]} (device {device.key})"
                    raise StageFailed(SelectorError(evaluated[0].index, 0, message, compile_error=False))
                for run in runs:  # a loop, not all(): no generator per group
                    if not run.passes(key, device):
                        break
                else:
                    yield key, pools, positions

    # -- equality indexes ------------------------------------------------------------

    def _by_index(self, stages: list[Stage], extra: tuple[str, ...], generation: int, budget: Budget,
                  runs: list[StageRun]) -> tuple[DeviceGroup, ...] | None:
        """The match from an equality index (`quota.devices.equality`), None when it cannot help:
        the earlier stages over every group, the last one only on its candidates."""
        term = index_term(stages[-1]) if len(stages) > 1 else None
        if term is None or not worth_indexing(term[0], self._inventory.usable_pools()):
            return None
        index = self._index(term[0], generation)
        if index.count(term[1]) * INDEX_SHARE > len(self._inventory.usable()):
            return None
        candidates = index.candidates(term[1])
        base = len(base_fields("", extra))
        partition = self._partition(tuple(s.fields for s in stages[:-1]), extra, generation)
        passing = {key for key, _, _ in self._walk(stages[:-1], partition, base, budget, runs, stages)}
        last = StageRun(stages[-1], runs[-1].end, self._verdicts, activation=self._activation, budget=budget,
                        pause=pauses(), per_device=True)
        runs.append(last)
        pools = self._inventory.usable_pools()
        kept: dict[GroupKey, list[Part]] = {}
        for pool_key, position in candidates:
            pool, state = pools.get(pool_key), partition.states.get(pool_key)
            if pool is None or state is None or position >= len(pool.devices):
                continue  # rebuilt while this match paused: the next generation's match sees it
            key = next((k for k, group in state if position in group), None)
            if key in passing and last.passes(key, pool.devices[position]):
                kept.setdefault(key[:base], []).append(((pool,), (position,)))
        return tuple(DeviceGroup(tuple(parts)) for parts in kept.values())

    def _index(self, field: Field, generation: int) -> EqualityIndex:
        found = self._indexes.lookup(field)
        index = found if isinstance(found, EqualityIndex) else None
        if index is not None and index.generation == generation:
            return index
        changed = self._inventory.changed_since(index.generation) if index is not None else None
        if index is not None and changed is not None:
            index.refresh(changed, self._inventory.usable_pools())
        else:
            index = EqualityIndex(field)  # fresh, installed once complete: the build may pause
            index.rebuild(self._inventory.usable_pools())
        index.generation = generation
        self._indexes.store(field, index)
        return index

    def _activation(self, device: Device) -> DeviceActivation:
        activation = self._activations.get(device)
        if activation is None:
            activation = device_activation(device)
            self._activations[device] = activation
        return activation


# Groups walked between two pause points (~0.1 ms when their verdicts are cached).
_PAUSE_GROUPS = 256


def _base(extra: tuple[str, ...]) -> FieldsOf:
    """The base level: what pricing needs uniform in a group, in each pool's own domain."""
    by_driver = functools.lru_cache(maxsize=64)(lambda driver: base_fields(driver, extra))
    return lambda pool: by_driver(pool.devices[0].key.driver) if pool.devices else ()


def _fixed(fields: tuple[Field, ...] | None) -> FieldsOf:
    return lambda pool: fields
