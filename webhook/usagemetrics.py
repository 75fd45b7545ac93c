"""The usage metrics of `dra-quota serve`, built at scrape time from the caches it keeps.

Neighbours: `webhook.metrics` owns the registry, `runtime.metricnames` every metric name; `quota.accounting.usage`
computes the views (per quota from `quota.accounting.ledger`, the one accountant; per namespace and
class; per model from `quota.devices.inventory`; per held device from `quota.accounting.usage.Holders`);
`kube.quotawriter.Reservations.pending` adds the persisted reservations whose claim
this replica's cache does not hold yet; `commands.serve` registers them. Nothing is
counted here: a scrape reads the same ledger the webhook admits against.

Only the leader exports the usage families (`leading()`; the other replicas leave them
out), so `sum()` over every replica's scrape never counts a claim twice.
`draquota_leader` says which replica that is.

Scrape cost (bench/usage_metrics.py; docs/development/performance.md): a scrape runs on the event
loop the reviews share, so nothing is recomputed that did not change. A namespace's
samples are kept until one of its claims changes (`Ledger.namespace_generation`); the
per-device family (one sample per held device: tens of thousands) is kept as rendered
text per claim (`Metrics.rendered`), re-rendered only for the claims that changed (all
of them when the inventory changed, as its attributes feed the labels); the per-model
index is rebuilt once per inventory generation. `draquota_quota` is built at every
scrape: a few samples per quota. So are the team families (`draquota_cluster_quota`, a
ClusterDeviceQuota's totals, and `draquota_cluster_quota_namespace`, each selected
namespace's part, `Ledger.members` and `Ledger.usage_in`): a part is one lookup in the
ledger, which keeps it incrementally, so keeping it here would save nothing, and a relabel
or a change of the team's selector or scope moves parts without any claim changing. The
breakdown is capped (`quota.status.breakdown`: the `team_series` largest parts and one "(other)"
summing the rest), so its series are bounded by the teams, not by what they select.

A scrape runs in slices (`kube.rebuilds`, from `webhook.metricsserver`): it pauses
between quotas, chunks of a team's namespaces, namespaces, claims and chunks of rendered
claims (`quota.values.work.pause_point`), so the first scrape of 150,000 claims (seconds of work)
never holds the loop for long. Claim events land between its slices: every loop runs
over a copy of what it reads, and each cache is stamped with the generation read
before it was built, so what changed meanwhile is built again at the next scrape. One
scrape at a time (the metrics server's lock): the per-claim state is this object's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client.core import GaugeMetricFamily, Metric

from quota.accounting.ledger import Ledger
from quota.accounting.ledgerentry import ClaimRef
from quota.accounting.usage import Held, HeldCounts, Holders, ModelIndex, held_devices, held_keys, namespace_usage
from quota.devices.inventory import Inventory
from quota.quotas.devicequota import DeviceQuota, Usage
from quota.quotas.windows import hard_at
from quota.status.breakdown import DEFAULT_SERIES, OTHER, top_parts
from quota.values.model import Charge, DeviceClassName, DeviceKey, Namespace
from quota.values.work import drop, pause_point
from runtime.metricnames import (
    CLAIM_DEVICE_INFO,
    CLUSTER_QUOTA,
    CLUSTER_QUOTA_NAMESPACE,
    INVENTORY_ALLOCATED,
    INVENTORY_DEVICES,
    INVENTORY_MEMORY,
    LEADER,
    NAMESPACE_USAGE,
    PENDING_CLAIMS,
    QUOTA,
    WORKLOADS_RESERVED,
)
from webhook.metrics import RENDER_CHUNK, Metrics, render

__all__ = ["DEVICE_INFO_LABELS", "UsageMetrics"]

# DCGM exporter's own label names for the GPU and the MIG profile, so that
# `on(UUID)` / `on(UUID, GPU_I_PROFILE)` join without label_replace (docs/metrics.md).
DEVICE_INFO_LABELS = ("namespace", "claim", "pod", "driver", "pool", "device", "model", "UUID", "GPU_I_PROFILE")
_RESOURCES = ("memory", "devices")



@dataclass(eq=False)
class UsageMetrics:
    """The collector: call `register` once; each scrape reads the caches as they are then."""

    ledger: Ledger
    inventory: Inventory
    holders: Holders
    # (namespace, quota name) -> persisted reservations not in the claim cache.
    pending: Callable[[str, str], Charge] = lambda _namespace, _name: Charge()
    leading: Callable[[], bool] = lambda: True
    # Namespaces a team exports a part of, the rest summed as one (`quota.status.breakdown`).
    team_series: int = DEFAULT_SERIES
    # namespace -> (its ledger generation, its samples, its pending claims)
    _namespaces: dict[Namespace, tuple[int, list[tuple[DeviceClassName, str, Charge]], int]] = field(
        default_factory=dict, init=False)
    # The per-model index of the inventory generation the per-claim state below was built on.
    _models: tuple[int, ModelIndex, HeldCounts] | None = field(default=None, init=False)
    # claim ref -> (the Held it was built from, its devices as counted, its rendered lines)
    _claims: dict[ClaimRef, tuple[Held, tuple[DeviceKey, ...], bytes]] = field(default_factory=dict, init=False)
    _text: tuple[tuple[int, int], tuple[bytes, ...]] | None = field(default=None, init=False)

    def register(self, metrics: Metrics) -> None:
        metrics.collect(self.collect)
        metrics.rendered(self.rendered)

    def collect(self) -> Iterator[Metric]:
        leading = self.leading()
        leader = GaugeMetricFamily(LEADER, "1 on the replica that holds the quota controller's Lease and alone "
                                   "exports the usage metrics (draquota_quota, draquota_cluster_quota*, "
                                   "draquota_namespace_device_usage, "
                                   "draquota_inventory_*, draquota_claim_device_info), else 0.")
        leader.add_metric([], 1.0 if leading else 0.0)
        yield leader
        if leading:
            yield self._quota_family()
            yield from self._team_families()
            yield self._workloads_family()
            yield from self._namespace_families()

    def rendered(self) -> tuple[bytes, ...]:
        """The per-model and per-device families, as pieces of text (`Metrics.rendered`);
        re-rendered only where inputs moved."""
        if not self.leading():
            return ()
        stamp = (self.inventory.generation, self.holders.version)
        if self._text is None or self._text[0] != stamp:
            self._text = (stamp, self._refresh())
        return self._text[1]

    # -- the families ---------------------------------------------------------------------

    def _quota_family(self) -> Metric:
        family = _quota_family()
        for quota in self._namespaced():
            pause_point()
            self._add_totals(family, [quota.namespace, quota.name], quota)
        return family

    def _team_families(self) -> tuple[Metric, Metric]:
        """Each ClusterDeviceQuota's totals, and each namespace it selects with its part."""
        totals, parts = _team_family(), _team_namespace_family()
        for quota in self.ledger.quotas():
            if not quota.cluster:
                continue
            pause_point()
            self._add_totals(totals, [quota.name], quota)
            members: list[tuple[str, Usage]] = []
            for index, namespace in enumerate(self.ledger.members(quota.name)):  # a copy: relabels land in pauses
                if index and index % RENDER_CHUNK == 0:
                    pause_point()
                members.append((namespace, self.ledger.usage_in(quota.name, namespace)))
            pause_point()
            breakdown = top_parts(members, self.team_series)
            other = () if breakdown.other is None else ((OTHER, breakdown.other),)
            for namespace, part in (*breakdown.kept, *other):
                for resource in _RESOURCES:
                    parts.add_metric([quota.name, namespace, resource, "used"], part.used.amount(resource))
                    parts.add_metric([quota.name, namespace, resource, "reserved"], part.reserved.amount(resource))
        return totals, parts

    def _add_totals(self, family: GaugeMetricFamily, labels: list[str], quota: DeviceQuota) -> None:
        """`quota`'s hard (the resources it limits), used and reserved samples, after `labels`.
        The hard in force: with windows, as the quota's `status.effectiveHard` shows it."""
        usage = self.ledger.usage(quota.namespace, quota.name)
        reserved = usage.reserved + self.pending(quota.namespace, quota.name)
        hard = hard_at(quota.hard, quota.windows, datetime.now(UTC))[0] if quota.windows else quota.hard
        for resource in _RESOURCES:
            limit = hard.get(resource)
            if limit is not None:
                family.add_metric([*labels, resource, "hard"], limit)
            family.add_metric([*labels, resource, "used"], usage.used.amount(resource))
            family.add_metric([*labels, resource, "reserved"], reserved.amount(resource))

    def _namespaced(self) -> list[DeviceQuota]:
        """The DeviceQuotas: `Ledger.quotas()` lists the teams' too, under namespace ""."""
        return [quota for quota in self.ledger.quotas() if not quota.cluster]

    def _workloads_family(self) -> Metric:
        """The part of draquota_quota{type="reserved"} Kueue Workloads hold (status.reservedBy.workloads)."""
        family = GaugeMetricFamily(
            WORKLOADS_RESERVED, 'The part of draquota_quota{type="reserved"} held by Kueue Workloads admitted by '
            "dra-quota's AdmissionCheck beyond what their Pods' claims count (the rest is claims'); resource memory "
            "in bytes, devices a count. Exported by the leader only.", labels=["namespace", "quota", "resource"])
        for quota in self._namespaced():
            pause_point()
            held = self.ledger.usage(quota.namespace, quota.name).workloads
            for resource in _RESOURCES:
                family.add_metric([quota.namespace, quota.name, resource], held.amount(resource))
        return family

    def _namespace_families(self) -> tuple[Metric, Metric]:
        """Each namespace's samples are kept until a claim of that namespace changes."""
        family, pending = _namespace_family(), _pending_family()
        present = set(self.ledger.namespaces())
        for gone in [ns for ns in self._namespaces if ns not in present]:
            del self._namespaces[gone]
        for namespace in sorted(present):
            pause_point()
            generation = self.ledger.namespace_generation(namespace)
            cached = self._namespaces.get(namespace)
            if cached is None or cached[0] != generation:
                entries = list(self.ledger.entries_in(namespace))  # claim events land during the pauses
                usage = namespace_usage(self.ledger, entries)
                waiting = sum(not entry.allocated for entry in entries)
                cached = self._namespaces[namespace] = (
                    generation, [(c, s, v) for (c, s), v in sorted(usage.items())], waiting)
            for device_class, state, charge in cached[1]:
                for resource in _RESOURCES:
                    family.add_metric([namespace, device_class, resource, state], charge.amount(resource))
            pending.add_metric([namespace], cached[2])
        return family, pending

    def _model_families(self, index: ModelIndex, held: HeldCounts) -> list[Metric]:
        devices, memory, allocated = _model_families()
        for (driver, model, profile), usage in sorted(index.usage(held).items()):
            devices.add_metric([driver, model, profile], usage.devices)
            memory.add_metric([driver, model, profile], usage.memory)
            allocated.add_metric([driver, model, profile], usage.allocated)
        return [devices, memory, allocated]

    def _refresh(self) -> tuple[bytes, ...]:
        """Bring the per-claim state up to the holders and the inventory; the families' text.

        Only claims that changed since the last scrape are rendered and counted again;
        all of them after the inventory changed (its attributes feed the labels). What is
        listed at once holds references only: a list of 24,000 new tuples, traversed by
        each young collection while it grows, held the loop 37 ms (bench/stalls.py).
        """
        generation = self.inventory.generation
        if self._models is None or self._models[0] != generation:
            index = ModelIndex.of(self.inventory)
            self._models = (generation, index, HeldCounts(index))
            rendered, self._claims = self._claims, {}
            drop(rendered)
        _, index, counts = self._models
        current = dict(self.holders.mapping())  # claim events land during the pauses
        for gone in [ref for ref in self._claims if ref not in current]:
            counts.add(self._claims.pop(gone)[1], -1)
        stale = [ref for ref, held in current.items() if (hit := self._claims.get(ref)) is None or hit[0] is not held]
        for start in range(0, len(stale), RENDER_CHUNK):
            pause_point()
            self._render([(ref, current[ref]) for ref in stale[start:start + RENDER_CHUNK]], counts)
        return (render(self._model_families(index, counts)), render([_device_family()]),
                *(text for _, _, text in self._claims.values()))

    def _render(self, stale: list[tuple[ClaimRef, Held]], counts: HeldCounts) -> None:
        """One render for these claims; each claim's share of the lines is its sample count."""
        family = _device_family()
        sizes = [self._add_samples(family, held) for _, held in stale]
        lines = render([family]).split(b"\n")[2:]  # past "# HELP" and "# TYPE"
        at = 0
        for (ref, held), size in zip(stale, sizes, strict=True):
            previous = self._claims.get(ref)
            if previous is not None:
                counts.add(previous[1], -1)
            keys = held_keys(held)
            counts.add(keys)
            self._claims[ref] = (held, keys, b"".join(line + b"\n" for line in lines[at:at + size]))
            at += size

    def _add_samples(self, family: GaugeMetricFamily, held: Held) -> int:
        count = 0
        for result, labels in held_devices(held, self.inventory):
            key = result.key
            for pod in held.pods or ("",):
                family.add_metric([held.namespace, held.name, pod, key.driver, key.pool, key.device, labels.model,
                                   labels.uuid, labels.profile], 1.0)
                count += 1
        return count


def _quota_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        QUOTA, "A DeviceQuota's limit and usage, in the kube_resourcequota shape; resource memory in bytes, "
        "devices a count. type hard: the hard in force (spec.hard, or an open window's: status.effectiveHard; "
        "only the resources it limits); used: the exact charge of its "
        "allocated claims; reserved: the estimated charge of its claims admitted and not yet allocated, plus the "
        "reservations persisted on its status whose claim this replica's cache does not hold yet (each claim "
        "counted once). Exported by the leader only.", labels=["namespace", "quota", "resource", "type"])


def _team_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        CLUSTER_QUOTA, "A ClusterDeviceQuota's (a team's) limit and usage over every namespace it selects, as "
        "draquota_quota shows a DeviceQuota's; resource memory in bytes, devices a count. type hard: the hard in "
        "force (spec.hard, or an open window's; only the resources it limits); used and reserved: the team's totals, reserved with the reservations "
        "persisted on its status whose claim this replica's cache does not hold yet. Exported by the leader only.",
        labels=["quota", "resource", "type"])


def _team_namespace_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        CLUSTER_QUOTA_NAMESPACE, "Each namespace a ClusterDeviceQuota selects, with its part of the team's usage "
        "(status.namespaces); a team of more namespaces than --team-namespace-series (default 50) shows its largest "
        "parts (used + reserved devices, then memory; ties by name) and namespace=\"(other)\" summing the rest, so "
        "a sum over namespace is still the team's total. Resource memory in bytes, devices a count. type used: the exact charge of its "
        "allocated claims; reserved: the estimated charge of its claims not yet allocated, and what its admitted "
        "Kueue Workloads hold (a reservation whose claim is not in the cache yet is in draquota_cluster_quota "
        "only). Exported by the leader only.", labels=["quota", "namespace", "resource", "type"])


def _namespace_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        NAMESPACE_USAGE, "Device usage of every namespace with claims, with or without a DeviceQuota, by device "
        "class; resource memory in bytes, devices a count. state allocated: the exact charge of allocated claims; "
        "reserved: the estimated charge of claims not yet allocated (a reservation whose claim is not in the "
        "cache yet is in draquota_quota only). Exported by the leader only.",
        labels=["namespace", "device_class", "resource", "state"])


def _pending_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        PENDING_CLAIMS, "Claims that exist and are not allocated yet, per namespace with claims (the scheduler has "
        "not placed them: their Pods wait); status.claims.pending counts the same per DeviceQuota. Exported by "
        "the leader only.", labels=["namespace"])


def _model_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
    labels = ["driver", "model", "profile"]
    where = ("by driver, model (the productName attribute) and profile (the MIG profile; empty for a whole "
             "device). Exported by the leader only.")
    return (
        GaugeMetricFamily(INVENTORY_DEVICES, f"Devices of complete ResourceSlice pools, {where}", labels=labels),
        GaugeMetricFamily(INVENTORY_MEMORY, f"Memory capacity of those devices in bytes, {where}", labels=labels),
        GaugeMetricFamily(INVENTORY_ALLOCATED, f"Those devices allocated to at least one claim (adminAccess "
                          f"excluded), {where}", labels=labels),
    )


def _device_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        CLAIM_DEVICE_INFO, "Always 1: one sample per device allocated to a claim and "
        "pod consuming it (status.reservedFor; pod empty while none). model is the device's productName "
        "attribute (else model; a MIG device carries its parent GPU's), as draquota_inventory_devices. UUID is "
        "the GPU's uuid attribute (a MIG "
        "device's parentUUID) and GPU_I_PROFILE the MIG profile, as DCGM exporter labels its metrics, so they "
        "join on UUID. adminAccess allocations are left out. Exported by the leader only.",
        labels=list(DEVICE_INFO_LABELS))
