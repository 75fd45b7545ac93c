"""Kubernetes Events for admission: quota denials and adminAccess grants and refusals.

Neighbours: `webhook.server` tells `EventRecorder.review` every verdict (through the
`observe` hook `dra-quota serve` sets); `kube.api.KubeApi` writes the Events
(`events.k8s.io/v1`); `webhook.metrics` counts what is written and dropped.

A review never waits for an Event and never fails because of one: `record` only counts
the occurrence and puts its series on its namespace's bounded queue (full: dropped and
counted), and one background task writes them. What one tenant's requests cost in Events
is bounded whatever it sends (`runtime.eventcorrelation`, client-go's EventCorrelator and
more):
- occurrences aggregate into series as client-go's recorders do: the same regarding,
  related, type, reason, action and note within `window` is one Event whose
  `series.count` and `series.lastObservedTime` are patched; past 9 distinct notes on one
  object, or 9 distinct objects of one kind in one namespace (same type, reason and
  action) within 10 minutes, the rest count on one "(combined from similar events)" Event;
- a series is patched at most once per `refresh` (client-go patches every repeat; its
  newer events API every 30 minutes): repeats meanwhile share that write;
- every write takes a token from its object's bucket (client-go's spam filter: 25, then
  one per 5 minutes), its namespace's (25, then one per 10 s) and the process's (50, then
  20 a second); a write refused waits for its tokens, its occurrences still counted;
- the namespaces' queues are drained in turn, so a namespace's flood waits behind its own
  Events and never delays another namespace's.
Events go to the namespace the request acted in, regarding the object acted on, never to
`default` on a tenant's behalf (only a Namespace's own label, a change no `edit` user may
make, and the leader's reconcile of a ClusterDeviceQuota regard cluster-scoped objects).

Which Events (dryRun reviews make none: `sideEffects: NoneOnDryRun`):
- `QuotaExceeded` (Warning) regarding each DeviceQuota that denied a claim, a template or
  an allocation, or that one was admitted over (enforcement Audit, or the allocation
  check in account-only mode); the note is the denial message or the warning, prefixed
  with the object. For a ClusterDeviceQuota, the same regarding the reviewed object in its
  namespace, the team quota related.
- `QuotaExceeded` (Warning) regarding the Pod that controls a claim denied for quota at
  CREATE (`owning_pod`: the resourceclaim controller's template claims and the
  scheduler's extended-resource claims both name their Pod so): the denied claim does not
  exist, the Pod is what its owner looks at. The note is the denial message alone (no
  claim name, no related object), so the retries' claims aggregate into one series.
- `ChargedAboveReservation` (Normal) regarding a claim some DeviceQuota counts whose
  allocation was admitted with an exact charge above the `draquota.io/charge` recorded
  at its admission (`quota.admission.admitter.charged_above`). Here, not in the leader's controller: the API server
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
- `WindowOpened`, `WindowClosed`, `HardInForceChanged` (Normal, action `Reconcile`)
  regarding a quota with windows whose status write changed its hard in force
  (`quota.status.quotastatus.boundary`, `controllers.quotas`, the leader only): one per boundary.
- `AdminAccessGranted` (Normal) and `AdminAccessRefused` (Warning) regarding the claim or
  template in its namespace (the Namespace related), or for a change of the Namespace's
  label the Namespace, in `default` (events.k8s.io/v1 accepts an Event regarding a
  cluster-scoped object there or in kube-system only): the note is the record the audit
  annotation carries (who, what, why).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
import socket
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, NoReturn, Protocol

from kube.admissionreview import AdmissionRequest, Verdict
from kube.api import KubeApi
from kube.apierror import ApiError
from kube.resources import EVENTS, QUOTAS, RESOURCE_V1
from quota.admission.policy import PolicyRecord
from quota.objects.extended import generated_base
from quota.quotas.devicequota import KIND, ref_of
from quota.values.raw import Obj, dig
from runtime.eventcorrelation import Budget, Correlator, EventKey, Ref

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


@dataclass(slots=True)
class _Series:
    first: float
    last: float
    count: int = 1
    name: str | None = None  # set once created
    queued: bool = False  # waiting in a namespace's queue or for its time (one entry at most)
    written: float | None = None  # when its last write went out


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
    """Occurrences correlated into series, queued per namespace; `run` writes them in turn."""

    def __init__(
        self,
        sink: Sink,
        *,
        instance: str,
        dropped: Callable[[str], None] = lambda reason: None,
        written: Callable[[str], None] = lambda operation: None,
        queue_size: int = 32,
        window: float = 360.0,
        refresh: float = 10.0,
        max_series: int = 4096,
        clock: Callable[[], float] = time.time,
        quota_uid: Callable[[str, str], str] = lambda namespace, name: "",
        correlator: Correlator | None = None,
        budget: Budget | None = None,
    ) -> None:
        self.sink, self.instance, self.dropped, self.written = sink, instance, dropped, written
        # (namespace, name) -> the DeviceQuota's uid from the caches ("" unknown): the
        # verdict names its quotas, `kubectl describe` selects their Events by uid.
        self.quota_uid = quota_uid
        # client-go's defaults: a series ends after 6 minutes without a repeat; its
        # cache of isomorphic events holds 4096.
        self.window, self.max_series, self.clock = window, max_series, clock
        # A series is patched at most once per `refresh` (client-go patches every repeat):
        # a flood's repeats cost one write per series per refresh, and the last count lands
        # at most `refresh` after the last repeat (budget permitting).
        self.queue_size, self.refresh = queue_size, refresh
        self.correlator = correlator or Correlator(max_entries=max_series)
        self.budget = budget or Budget(max_entries=max_series)
        self._series: OrderedDict[EventKey, _Series] = OrderedDict()
        self._told: OrderedDict[EventKey, float] = OrderedDict()
        # Series ready to write, one queue per namespace, drained in turn: a namespace's
        # flood waits behind its own Events, never another namespace's.
        self._ready: OrderedDict[str, deque[EventKey]] = OrderedDict()
        self._later: list[tuple[float, int, EventKey]] = []  # (when, tie-break, key): waiting for time
        self._queued: Counter[str] = Counter()  # per namespace, in `_ready` and `_later` together
        self._ticket = 0
        self._wake = asyncio.Event()

    # -- what a review records ------------------------------------------------------------------

    def review(self, review: AdmissionRequest | None, verdict: Verdict) -> None:
        """The Events of one answered review (`webhook.server.Observer`, with `webhook.metrics`)."""
        if review is None or review.dry_run:
            return
        if verdict.cause == "quota":
            self._quota_events(review, verdict)
        if verdict.allowed and verdict.charged_above:
            claim = _related(review)
            key = None if claim is None else EventKey(replace(claim, uid=uid_of(review.object)), None, "Normal",
                                                      "ChargedAboveReservation", "Allocate", verdict.charged_above)
            if key is not None and not self._told_lately(key):
                self.record(key)
        for record in verdict.records:
            self.record(_policy_event(record, uid_of(review.object) if record.name == review.name else ""))

    def _quota_events(self, review: AdmissionRequest, verdict: Verdict) -> None:
        subject = f"{review.kind.kind or 'object'} {review.namespace}/{_named(review)}"
        for quota in verdict.quotas:
            kind, name = ref_of(quota)
            note = f"{subject}: {_quota_note(quota, verdict)}"
            if kind == KIND:
                self.record(EventKey(Ref(DEVICE_QUOTA, kind, name, review.namespace,
                                         self.quota_uid(review.namespace, name)),
                                     _related(review), "Warning", "QuotaExceeded", "Admit", note))
            else:
                # A ClusterDeviceQuota is cluster-scoped: an Event regarding it could live
                # only in `default`, a namespace the tenant did not act in. It goes to the
                # reviewed object's namespace, regarding that object, the team quota related.
                self.record(EventKey(_reviewed(review), Ref(DEVICE_QUOTA, kind, name), "Warning", "QuotaExceeded",
                                     "Admit", note))
        pod = owning_pod(review) if not verdict.allowed else None
        if pod is not None:
            # Neither the claim's name nor a related object: each retry of the
            # resourceclaim controller or the scheduler is a new generated name, and
            # the Pod's owner should see one Event counting them, as client-go would.
            self.record(EventKey(pod, None, "Warning", "QuotaExceeded", "Admit", verdict.message))

    def _told_lately(self, key: EventKey) -> bool:
        """Whether `key` occurred within the window (and note it now): a ChargedAboveReservation
        is told once. The API server reviews one allocation write again when the claim changed
        in storage while the webhook decided (the leader's annotation, while the excess was
        being persisted: `quota.accounting.excess`), each time on the newer copy; the claim, the devices
        and the charges are the same, and only one of the attempts lands."""
        now, last = self.clock(), self._told.get(key)
        self._told[key] = now
        self._told.move_to_end(key)
        while len(self._told) > self.max_series:
            self._told.popitem(last=False)
        return last is not None and now - last <= self.window

    def record(self, key: EventKey) -> bool:
        """Count one occurrence of `key`; False when it was dropped (its namespace's queue is full). Never blocks."""
        now = self.clock()
        key = self.correlator.correlate(key, now)
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
        if self._queued[key.namespace] >= self.queue_size:
            # The occurrence stays counted in the series: a later write still reports it.
            self.dropped("queue_full")
            return False
        series.queued = True
        self._queued[key.namespace] += 1
        self._ready.setdefault(key.namespace, deque()).append(key)
        self._wake.set()
        return True

    # -- the writer ------------------------------------------------------------------------

    async def run(self) -> NoReturn:
        """Write queued Events until cancelled."""
        while True:
            if await self.write_ready():
                continue
            # No await since `write_ready` found nothing: no `record` came in between.
            self._wake.clear()
            timeout = None if not self._later else max(0.0, self._later[0][0] - self.clock())
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def write_ready(self) -> bool:
        """Take the next namespace's next series in turn and write it (a create, or a patch of
        its count), or set it aside until its refresh or its budget allows: False when
        nothing is ready now."""
        now = self.clock()
        while self._later and self._later[0][0] <= now:
            key = heapq.heappop(self._later)[2]
            self._ready.setdefault(key.namespace, deque()).append(key)
        if not self._ready:
            return False
        namespace, keys = next(iter(self._ready.items()))
        key = keys.popleft()
        if keys:
            self._ready.move_to_end(namespace)
        else:
            del self._ready[namespace]
        series = self._series.get(key)
        if series is None or not series.queued:
            self._unqueue(namespace)  # evicted from the cache (or ended) while it waited
            return True
        later = self._not_before(key, series, now)
        if later is not None:
            self._ticket += 1
            heapq.heappush(self._later, (later, self._ticket, key))
            return True
        series.queued = False
        self._unqueue(namespace)
        await self._write(key, series, now)
        return True

    def _unqueue(self, namespace: str) -> None:
        self._queued[namespace] -= 1
        if self._queued[namespace] <= 0:
            del self._queued[namespace]

    def _not_before(self, key: EventKey, series: _Series, now: float) -> float | None:
        """When the write of `series` may go, None for now (a token then taken)."""
        if series.name is not None and series.written is not None and now < series.written + self.refresh:
            return series.written + self.refresh
        return self.budget.take(key, now)

    async def _write(self, key: EventKey, series: _Series, now: float) -> None:
        count, last = series.count, series.last
        series.written = now
        try:
            if series.name is not None:
                try:
                    await self.sink.patch(key.namespace, series.name,
                                          {"series": {"count": count, "lastObservedTime": _micro(last)}})
                    self.written("patch")
                    return
                except ApiError as err:
                    if err.status != 404:
                        raise
                    series.name = None  # the Event expired (the API server's event TTL): create it again
            created = await self.sink.create(key.namespace, self._body(key, series, count, last))
            self.written("create")
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


def _reviewed(review: AdmissionRequest) -> Ref:
    """The object a review is about, in its namespace (named as `_named` names it)."""
    group = review.kind.group
    return Ref(f"{group}/{review.kind.version}" if group else review.kind.version, review.kind.kind or "object",
               _named(review), review.namespace)


def _policy_event(record: PolicyRecord, uid: str) -> EventKey:
    if record.kind == "Namespace":
        regarding, related = Ref("v1", "Namespace", record.name), None
    else:
        # The claim or template acted on, in its namespace: an Event regarding the
        # Namespace (cluster-scoped) could live only in `default`, where a tenant's refused
        # requests would pile up beside every other tenant's.
        regarding = Ref(RESOURCE_V1, record.kind, record.name, record.namespace, uid)
        related = Ref("v1", "Namespace", record.namespace)
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
