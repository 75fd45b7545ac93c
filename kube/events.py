"""Kubernetes Events for admission: quota denials and adminAccess grants and refusals.

Neighbours: `webhook.server` tells `EventRecorder.review` every verdict (through the
`observe` hook `dra-quota serve` sets); `kube.api.KubeApi` writes the Events
(`events.k8s.io/v1`); `webhook.metrics` counts what is dropped.

A review never waits for an Event and never fails because of one: `record` only puts a
key on a bounded queue (full: dropped and counted) and one background task writes them.
Repeats aggregate as client-go's EventRecorder does (k8s.io/client-go tools/events,
event_broadcaster.go `recordToSink`): an Event with the same regarding, related, type,
reason, action and note as one seen within `window` is not created again; its
`series.count` and `series.lastObservedTime` are patched instead. client-go patches the
second occurrence and then refreshes every 30 minutes; here every repeat marks the series
for one write, and repeats that arrive while it waits share that write, so the count is
current within one queue turn and a storm of repeats costs at most one write per turn.

Which Events (dryRun reviews make none: `sideEffects: NoneOnDryRun`):
- `QuotaExceeded` (Warning) regarding each DeviceQuota (or ClusterDeviceQuota, its Event
  in `default`) that denied a claim, a template or an allocation, or that one was
  admitted over (enforcement Audit, or the allocation check in account-only mode); the
  note is the denial message or the warning, prefixed with the object.
- `QuotaExceeded` (Warning) regarding the Pod that controls a claim denied for quota at
  CREATE (`owning_pod`: the resourceclaim controller's template claims and the
  scheduler's extended-resource claims both name their Pod so): the denied claim does not
  exist, the Pod is what its owner looks at. The note is the denial message alone (no
  claim name, no related object), so the retries' claims aggregate into one series.
- `ChargedAboveReservation` (Normal) regarding a claim some DeviceQuota counts whose
  allocation was admitted with an exact charge above the `draquota.io/charge` recorded
  at its admission (`quota.admission.charged_above`). Here, not in the leader's controller: the API server
  sends each allocation write to exactly one replica's webhook, once, so one write makes
  one Event whichever replica leads, and no restart or leader change replays it; a
  controller seeing the allocation in its watch cannot tell, after a restart or a
  take-over, which allocations its predecessor already reported. Normal, not Warning:
  the allocation went through and nothing is wrong with the claim (Optimistic pricing
  does this by design); when the extra charge breaks a quota's `hard`, that quota's
  QuotaExceeded Warning says so. Told once: the same claim charged the same again within
  the window is not counted (the API server reviews one write again, on the newer copy,
  when the claim changed in storage meanwhile). The limit: an update refused after us
  (another admission step, storage) leaves an Event for an allocation that did not happen.
- `QuotaExceeded` (Warning, action `Reconcile`) regarding a DeviceQuota or ClusterDeviceQuota
  whose status write turned its Exceeded condition True (for a team, e.g. a namespace
  relabelled into it while it was full) (`controllers.quotas`, the leader only).
- `AdminAccessGranted` (Normal) and `AdminAccessRefused` (Warning) regarding the Namespace
  (for claims and templates, the related object is the claim or template): the note is
  the record the audit annotation carries (who, what, why). Events regarding a
  cluster-scoped object live in `default`, as client-go puts them (the API server
  requires that namespace or none for them).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, NoReturn, Protocol

from kube.admissionreview import AdmissionRequest, Verdict
from kube.api import ApiError, KubeApi
from kube.resources import EVENTS, QUOTAS, RESOURCE_V1
from quota.devicequota import KIND, ref_of
from quota.extended import generated_base
from quota.policy import PolicyRecord
from quota.raw import Obj, dig

__all__ = [
    "CONTROLLER",
    "EventKey",
    "EventRecorder",
    "KubeSink",
    "Ref",
    "Sink",
    "owning_pod",
    "reporting_instance",
    "uid_of",
]

log = logging.getLogger(__name__)

CONTROLLER = "draquota.io/dra-quota"
DEVICE_QUOTA = QUOTAS.api_version
# events.k8s.io/v1 validation (k/k pkg/apis/core/validation/events.go): note at most
# 1 KiB, reason, action and reportingInstance at most 128 characters.
NOTE_BYTES = 1024
FIELD_CHARS = 128
_DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True, slots=True)
class Ref:
    """An ObjectReference: what an Event regards or relates to."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""
    # `kubectl describe` selects Events by the object's uid too: set it where it is known.
    uid: str = ""

    def as_json(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        return out


@dataclass(frozen=True, slots=True)
class EventKey:
    """What makes two occurrences the same Event (client-go tools/events `getKey`)."""

    regarding: Ref
    related: Ref | None
    type: str  # Normal | Warning
    reason: str
    action: str
    note: str

    @property
    def namespace(self) -> str:
        return self.regarding.namespace or _DEFAULT_NAMESPACE


@dataclass(slots=True)
class _Series:
    first: float
    last: float
    count: int = 1
    name: str | None = None  # set once created
    queued: bool = False


class Sink(Protocol):
    """Where Events go: the API server (`KubeSink`), or a fake in unit tests."""

    async def create(self, namespace: str, body: Obj) -> Obj: ...
    async def patch(self, namespace: str, name: str, patch: Obj) -> Obj: ...


class KubeSink:
    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def create(self, namespace: str, body: Obj) -> Obj:
        return await self.api.create(EVENTS, body, namespace=namespace)

    async def patch(self, namespace: str, name: str, patch: Obj) -> Obj:
        return await self.api.patch(EVENTS, name, patch, namespace=namespace)


def reporting_instance() -> str:
    """This replica: the Pod's name (the Downward API's POD_NAME), else the host name."""
    return (os.environ.get("POD_NAME") or socket.gethostname())[:FIELD_CHARS]


class EventRecorder:
    """A bounded queue of Events to write, aggregated into series; `run` writes them."""

    def __init__(
        self,
        sink: Sink,
        *,
        instance: str,
        dropped: Callable[[str], None] = lambda reason: None,
        queue_size: int = 256,
        window: float = 360.0,
        max_series: int = 4096,
        clock: Callable[[], float] = time.time,
        quota_uid: Callable[[str, str], str] = lambda namespace, name: "",
    ) -> None:
        self.sink, self.instance, self.dropped = sink, instance, dropped
        # (namespace, name) -> the DeviceQuota's uid from the caches ("" unknown): the
        # verdict names its quotas, `kubectl describe` selects their Events by uid.
        self.quota_uid = quota_uid
        # client-go's defaults: a series ends after 6 minutes without a repeat; its
        # cache of isomorphic events holds 4096.
        self.window, self.max_series, self.clock = window, max_series, clock
        self._queue: asyncio.Queue[EventKey] = asyncio.Queue(queue_size)
        self._series: OrderedDict[EventKey, _Series] = OrderedDict()

    # -- what a review records ------------------------------------------------------------------

    def review(self, review: AdmissionRequest | None, verdict: Verdict) -> None:
        """The Events of one answered review (`webhook.server.Observer`, with `webhook.metrics`)."""
        if review is None or review.dry_run:
            return
        if verdict.cause == "quota":
            subject = f"{review.kind.kind or 'object'} {review.namespace}/{_named(review)}"
            for quota in verdict.quotas:
                # A ClusterDeviceQuota is cluster-scoped: its Events live in `default`.
                kind, name = ref_of(quota)
                namespace = review.namespace if kind == KIND else ""
                self.record(EventKey(Ref(DEVICE_QUOTA, kind, name, namespace, self.quota_uid(namespace, name)),
                                     _related(review), "Warning", "QuotaExceeded", "Admit",
                                     f"{subject}: {_quota_note(quota, verdict)}"))
            pod = owning_pod(review) if not verdict.allowed else None
            if pod is not None:
                # Neither the claim's name nor a related object: each retry of the
                # resourceclaim controller or the scheduler is a new generated name, and
                # the Pod's owner should see one Event counting them, as client-go would.
                self.record(EventKey(pod, None, "Warning", "QuotaExceeded", "Admit", verdict.message))
        if verdict.allowed and verdict.charged_above:
            claim = _related(review)
            key = None if claim is None else EventKey(replace(claim, uid=uid_of(review.object)), None, "Normal",
                                                      "ChargedAboveReservation", "Allocate", verdict.charged_above)
            if key is not None and not self._seen_lately(key):
                self.record(key)
        for record in verdict.records:
            self.record(_policy_event(record))

    def _seen_lately(self, key: EventKey) -> bool:
        """Whether `key` occurred within the window: a ChargedAboveReservation is told once.
        The API server reviews one allocation write again when the claim changed in storage
        while the webhook decided (the leader's annotation, while the excess was being
        persisted: `quota.excess`), each time on the newer copy; the claim, the devices and
        the charges are the same, and only one of the attempts lands."""
        series = self._series.get(key)
        return series is not None and self.clock() - series.last <= self.window

    def record(self, key: EventKey) -> bool:
        """Count one occurrence of `key`; False when it was dropped (the queue is full). Never blocks."""
        now = self.clock()
        series = self._series.get(key)
        if series is None or now - series.last > self.window:
            series = self._series[key] = _Series(first=now, last=now)
            while len(self._series) > self.max_series:
                self._series.popitem(last=False)
        else:
            series.count += 1
            series.last = now
        self._series.move_to_end(key)
        if series.queued:
            return True  # the write already waiting carries this occurrence too
        try:
            self._queue.put_nowait(key)
        except asyncio.QueueFull:
            # The occurrence stays counted in the series: a later write still reports it.
            self.dropped("queue_full")
            return False
        series.queued = True
        return True

    # -- the writer ------------------------------------------------------------------------

    async def run(self) -> NoReturn:
        """Write queued Events until cancelled."""
        while True:
            await self.write_next()

    async def write_next(self) -> None:
        """Write the next queued Event (waits for one): a create, or a patch of its series."""
        key = await self._queue.get()
        series = self._series.get(key)
        if series is None:
            return  # evicted from the cache while it waited
        series.queued = False
        count, last = series.count, series.last
        try:
            if series.name is not None:
                try:
                    await self.sink.patch(key.namespace, series.name,
                                          {"series": {"count": count, "lastObservedTime": _micro(last)}})
                    return
                except ApiError as err:
                    if err.status != 404:
                        raise
                    series.name = None  # the Event expired (the API server's event TTL): create it again
            created = await self.sink.create(key.namespace, self._body(key, series, count, last))
            series.name = str((created.get("metadata") or {}).get("name") or "") or None
        except Exception as err:  # noqa: BLE001 - an Event is never worth more than a log line
            self.dropped("write_failed")
            if _namespace_terminating(err):
                # As client-go's recorder (record/event.go): expected while a namespace
                # goes, and nothing anyone can act on, so no warning.
                log.debug("Event %s on %s %s/%s not recorded: its namespace is being deleted", key.reason,
                          key.regarding.kind, key.regarding.namespace, key.regarding.name)
                return
            log.warning("cannot record Event %s on %s %s/%s: %s", key.reason, key.regarding.kind,
                        key.regarding.namespace, key.regarding.name, err)

    def _body(self, key: EventKey, series: _Series, count: int, last: float) -> Obj:
        body: dict[str, Any] = {
            "apiVersion": EVENTS.api_version,
            "kind": "Event",
            # client-go's naming: <regarding name>.<nanoseconds, hex>, within 253 characters.
            "metadata": {"name": f"{key.regarding.name[:230]}.{time.time_ns():x}", "namespace": key.namespace},
            "eventTime": _micro(series.first),
            "reportingController": CONTROLLER,
            "reportingInstance": self.instance,
            "action": key.action,
            "reason": key.reason,
            "regarding": key.regarding.as_json(),
            "type": key.type,
            "note": _bounded(key.note),
        }
        if key.related is not None:
            body["related"] = key.related.as_json()
        if count > 1:
            body["series"] = {"count": count, "lastObservedTime": _micro(last)}
        return body


def owning_pod(review: AdmissionRequest) -> Ref | None:
    """The Pod controlling the ResourceClaim a CREATE review carries, None for any other review.

    The resourceclaim controller (k/k pkg/controller/resourceclaim/controller.go,
    handleClaim) and the scheduler (extendeddynamicresources.go) both set the Pod as the
    claim's controlling ownerReference. Anyone creating a claim may write one too, but an
    ownerReference names an object of the claim's own namespace: the most a forger gets is
    a Warning on a Pod of a namespace where they create claims.
    """
    if review.operation != "CREATE" or review.kind.kind != "ResourceClaim" or review.sub_resource:
        return None
    meta = (review.object or {}).get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, dict) else None
    for owner in owners if isinstance(owners, list) else ():
        if (isinstance(owner, dict) and owner.get("controller") is True and owner.get("apiVersion") == "v1"
                and owner.get("kind") == "Pod" and isinstance(owner.get("name"), str) and owner["name"]):
            uid = owner.get("uid")
            return Ref("v1", "Pod", owner["name"], review.namespace, uid if isinstance(uid, str) else "")
    return None


def uid_of(obj: Mapping[str, Any] | None) -> str:
    """An object's `metadata.uid`, "" when it has none: what a `Ref` carries."""
    uid = dig(obj, "metadata", "uid")
    return uid if isinstance(uid, str) else ""


def _named(review: AdmissionRequest) -> str:
    """The reviewed object's name; for a `generateName` CREATE reviewed before the API server
    names it (the mutating claim admission, `webhook.claimadmit`), the generateName's base,
    as its reservation entry and denial name it."""
    if review.name:
        return review.name
    generate = dig(review.object, "metadata", "generateName")
    return generated_base(generate) if isinstance(generate, str) else ""


def _related(review: AdmissionRequest) -> Ref | None:
    if not review.kind.kind or not review.name:
        return None
    group = review.kind.group
    return Ref(f"{group}/{review.kind.version}" if group else review.kind.version, review.kind.kind, review.name,
               review.namespace)


def _quota_note(quota: str, verdict: Verdict) -> str:
    """The denial, or for an admission over an Audit quota the warning that names `quota`."""
    if not verdict.allowed:
        return verdict.message
    kind, name = ref_of(quota)
    return next((w for w in verdict.warnings if f'{kind} "{name}"' in w), "admitted over its hard")


def _policy_event(record: PolicyRecord) -> EventKey:
    if record.kind == "Namespace":
        regarding, related = Ref("v1", "Namespace", record.name), None
    else:
        regarding = Ref("v1", "Namespace", record.namespace)
        related = Ref(RESOURCE_V1, record.kind, record.name, record.namespace)
    granted = record.outcome == "granted"
    return EventKey(regarding, related, "Normal" if granted else "Warning",
                    "AdminAccessGranted" if granted else "AdminAccessRefused", "AuthorizeAdminAccess",
                    record.audit_value)


def _micro(at: float) -> str:
    """A metav1.MicroTime: RFC 3339 with microseconds, UTC."""
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _bounded(note: str) -> str:
    raw = note.encode()
    if len(raw) <= NOTE_BYTES:
        return note
    return raw[: NOTE_BYTES - 3].decode(errors="ignore") + "…"


def _namespace_terminating(err: Exception) -> bool:
    """The API server refused a write into a namespace being deleted: its `Status` carries
    the cause `NamespaceTerminating` (k8s.io/api/core/v1 NamespaceTerminatingCause, added
    by the NamespaceLifecycle plugin), or at least that plugin's fixed message: a CI run
    (2026-11-27) met a 403 with the message whose decoded Status this cause test missed."""
    if not isinstance(err, ApiError):
        return False
    causes = dig(err.body, "details", "causes")
    if isinstance(causes, list) and any(isinstance(c, dict) and c.get("type") == "NamespaceTerminating"
                                        for c in causes):
        return True
    return err.status == 403 and "because it is being terminated" in err.message
