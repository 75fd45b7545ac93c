"""The showback counters of `dra-quota serve`: GPU-memory-seconds and device-seconds allocated.

Neighbours: `quota.accounting.showback.Accrual` integrates (pure, the time passed in); `quota.accounting.ledger`
tells it every claim counted in or out (`Ledger.observer`) and every relist swapped in
(`Ledger.replaced`); `webhook.metrics` owns the registry; `commands.serve` registers this
and runs `run()`. Metric names: `runtime.metricnames`.

Every replica follows the rates; only the one that leads (and has listed everything)
accrues, so the replicas' series never hold the same second twice and
`sum(increase(...))` over them is the cluster's total (docs/metrics.md, "Showback").
Leadership is looked at every `tick` seconds (one flag: constant work); a change of it,
a claim event and a scrape are the only times cells are brought up to date.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily

from quota.accounting.ledger import Ledger
from quota.accounting.ledgerentry import Entry
from quota.accounting.showback import Accrual, Cell, contributions
from quota.accounting.usage import device_labels
from quota.devices.inventory import Inventory
from quota.values.model import DeviceKey
from runtime.metricnames import ALLOCATED_DEVICE_SECONDS, ALLOCATED_MEMORY_SECONDS
from webhook.metrics import Metrics, render

__all__ = ["Showback"]

# Claims read again per pause of a resync after a relist: ~14 us each (most not allocated,
# bench/showback.py), so a few ms of the loop at a time.
_CHUNK = 200
LABELS = ("namespace", "device_class", "model")


class Showback:
    """Install with `attach()`; `run()` on the loop; `register()` on the metrics."""

    def __init__(self, ledger: Ledger, inventory: Inventory, leading: Callable[[], bool], *,
                 clock: Callable[[], float] = time.monotonic, tick: float = 1.0,
                 accrual: Accrual | None = None) -> None:
        self.ledger = ledger
        self.inventory = inventory
        self.leading = leading
        self.clock = clock
        self.tick = tick
        self.accrual = accrual if accrual is not None else Accrual()
        self._stale = False  # a relist was swapped in: every claim is read again
        # Each held device's model, for the inventory generation it was read in: most
        # events are of claims whose devices were looked up before (half an event's cost).
        self._models: tuple[int, dict[DeviceKey, str]] = (-1, {})
        self._labels: dict[Cell, str] = {}
        self._headers = _headers()

    def attach(self) -> None:
        self.ledger.observer = self.observe
        self.ledger.replaced = self.replaced

    # -- claim events ---------------------------------------------------------------------

    def observe(self, entry: Entry, sign: int) -> None:
        now = self.clock()
        if sign < 0:
            self.accrual.uncount(entry.ref, now)
        else:
            self.accrual.count(entry.ref, entry.namespace, contributions(entry, self.ledger.default_mode, self._model),
                               now)

    def replaced(self) -> None:
        self._stale = True

    def _model(self, key: DeviceKey) -> str:
        generation, models = self._models
        if generation != self.inventory.generation:
            models = {}
            self._models = (self.inventory.generation, models)
        model = models.get(key)
        if model is None:
            model = models[key] = device_labels(self.inventory.lookup(key)).model
        return model

    # -- the clock ------------------------------------------------------------------------

    def step(self) -> None:
        """Start or stop accruing as leadership now says."""
        self.accrual.lead(self.leading(), self.clock())

    async def run(self) -> None:
        while True:
            self.step()
            if self._stale:
                await self.resync()
            await asyncio.sleep(self.tick)

    async def resync(self) -> None:
        """Every claim of the ledger read again, in chunks: events landing between them
        go through `observe` as usual, each ref is read as it is when its turn comes."""
        self._stale = False
        refs = [entry.ref for entry in self.ledger.entries()]
        for start in range(0, len(refs), _CHUNK):
            now = self.clock()
            for ref in refs[start:start + _CHUNK]:
                entry = self.ledger.entry(ref)
                if entry is None:
                    self.accrual.uncount(ref, now)
                else:
                    self.observe(entry, +1)
            await asyncio.sleep(0)
        now = self.clock()
        for ref in self.accrual.counted():
            if self.ledger.entry(ref) is None:
                self.accrual.uncount(ref, now)

    # -- scrape ---------------------------------------------------------------------------

    def register(self, metrics: Metrics) -> None:
        metrics.rendered(self.rendered)

    def rendered(self) -> tuple[bytes, ...]:
        """The two families' text: each cell's label part is escaped once and kept (the
        text format through prometheus_client costs ~5 us a sample: 2,000 cells, 20 ms of
        the loop each scrape)."""
        self.step()
        memory, devices = [self._headers[0]], [self._headers[1]]
        labels = self._labels
        for accrued in self.accrual.totals(self.clock()):
            text = labels.get(accrued.cell)
            if text is None:
                text = labels[accrued.cell] = _labels(accrued.cell)
            memory.append(f"{ALLOCATED_MEMORY_SECONDS}{text} {accrued.memory_seconds!r}\n")
            devices.append(f"{ALLOCATED_DEVICE_SECONDS}{text} {accrued.device_seconds!r}\n")
        if len(labels) > 2 * len(memory):  # cells forgotten: their text goes with them
            kept = self.accrual.cells()
            self._labels = {cell: text for cell, text in labels.items() if cell in kept}
        return ("".join(memory).encode(), "".join(devices).encode())


def _headers() -> tuple[str, str]:
    """The HELP and TYPE lines of the two families, as prometheus_client writes them."""
    memory = CounterMetricFamily(
        ALLOCATED_MEMORY_SECONDS, "Device memory allocated to claims, integrated over time (byte-seconds): "
        "the exact charge of each allocated claim's devices, by namespace, device class and device model. Only "
        "the leader's series grow; sum(increase()) over every replica is the cluster's total.", labels=LABELS)
    devices = CounterMetricFamily(
        ALLOCATED_DEVICE_SECONDS, "Devices allocated to claims, integrated over time (device-seconds), as "
        f"{ALLOCATED_MEMORY_SECONDS} counts memory.", labels=LABELS)
    return render([memory]).decode(), render([devices]).decode()


def _labels(cell: Cell) -> str:
    pairs = ",".join(f'{name}="{_escape(value)}"' for name, value in zip(LABELS, cell, strict=True))
    return "{" + pairs + "}"


def _escape(value: str) -> str:
    # The text format's label value escapes (prometheus_client.exposition).
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
