"""webhook.metrics: bounded labels, what each verdict counts, the collectors, the HTTP endpoint.

Each test builds its own `Metrics` (its own registry), so counts start at zero. The
server's hook is exercised through `build_app` in-process; the real process is scraped
in tests/e2e/test_observability.py.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, cast

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from kube.admissionreview import AdmissionRequest, Verdict
from kube.api import Resource
from kube.leasebook import LeaseBook
from kube.watching import Reflector, ReflectorStats
from quota.accounting.headroom import Lease
from quota.accounting.ledger import Ledger
from quota.accounting.usage import Holders
from quota.admission.policy import PolicyRecord
from quota.devices.inventory import Inventory
from quota.quotas.devicequota import parse_device_quota
from quota.status.appliedplan import Reason as AppliedReason
from quota.values.model import Charge, Namespace
from runtime.metricnames import (
    ALLOCATION_WAIT,
    QUOTA_DENIALS,
    ANNOTATION_WRITERS,
    ANNOTATIONS_PENDING,
    ADMIN_ACCESS_DECISIONS,
    ADMISSION_DURATION,
    ADMISSION_REQUESTS,
    BUILD_INFO,
    CERTIFICATE_EXPIRATION,
    EVENTS_DROPPED,
    LEASE_ROOM,
    LEASE_WRITES,
    NAMES,
    APPLIED_QUOTA_WRITES,
    REQUEUE_CREDITS,
    REQUEUE_PENDING,
    REQUEUE_WRITES,
    RESERVATION_ADMISSIONS,
    WATCH_RELISTS,
    WATCH_RESTARTS,
    WATCH_SYNCED,
)
from webhook.connections import Connections, Limits
from webhook.metrics import Metrics, NamespaceLabel, QuotaLabel, decision_of, resource_of
from webhook.metricsserver import serve_metrics
from webhook.server import build_app
from webhook.showbackmetrics import Showback
from webhook.usagemetrics import UsageMetrics

from ..builders import GiB, make_quota
from .test_claimreview import CLAIM_GVR, gpu_claim, review_request, stored
from ..kube.test_admissionreview import REVIEW

ASYNC = pytest.mark.asyncio(loop_scope="session")


def requests(m: Metrics, **labels: str) -> float:
    """A count of `draquota_admission_requests_total`; namespace "other" unless given."""
    return m.registry.get_sample_value(ADMISSION_REQUESTS, {"namespace": "other", **labels}) or 0.0


def claim_create(**kwargs: Any) -> AdmissionRequest:
    return review_request(stored(gpu_claim()), **kwargs)


@pytest.mark.parametrize(
    ("request_", "resource"),
    [
        (claim_create(), "resourceclaims"),
        (claim_create(operation="UPDATE", sub="status", old=stored(gpu_claim())), "resourceclaims/status"),
        (claim_create(gvr={**CLAIM_GVR, "resource": "secrets"}), "other"),  # whatever a caller sends: bounded
        (claim_create(gvr={**CLAIM_GVR, "resource": "x" * 300}), "other"),
        (claim_create(sub="binding", operation="UPDATE"), "other"),
        (None, "unknown"),
    ],
)
def test_the_resource_label_is_a_closed_set(request_: AdmissionRequest | None, resource: str) -> None:
    assert resource_of(request_) == resource


def test_the_namespace_label_names_only_namespaces_with_a_device_quota_and_a_bounded_number() -> None:
    """Namespaces are tenant-creatable, DeviceQuotas the admins': the label is bounded by
    the quotas (at most `limit` names per process); everything else reads "other"."""
    quotas = {"team-a", "team-b", "team-c"}
    m = Metrics()
    m.namespace = NamespaceLabel(quotas.__contains__, limit=2)
    for namespace in ("team-a", "team-b", "team-c", "tenant-made-1", "team-a"):
        m.review("/validate", replace(claim_create(), namespace=namespace), Verdict(False, "q", cause="quota"), 0.001)
    m.review("/validate", None, Verdict(False, "bad", cause="invalid"), 0.001)
    denied = {"webhook": "validating", "operation": "CREATE", "resource": "resourceclaims", "decision": "denied",
              "reason": "quota"}
    assert (requests(m, **denied, namespace="team-a"), requests(m, **denied, namespace="team-b")) == (2, 1)
    # team-c holds a quota but came after the limit; tenant-made-1 holds none.
    assert requests(m, **denied) == 2 and requests(m, **denied, namespace="team-c") == 0
    # A namespace keeps its value once named, even after its quota goes.
    quotas.clear()
    m.review("/validate", replace(claim_create(), namespace="team-b"), Verdict(False, "q", cause="quota"), 0.001)
    assert requests(m, **denied, namespace="team-b") == 2


def test_quota_denials_are_counted_by_each_quota_that_denied_or_warned_and_bounded() -> None:
    m = Metrics()
    m.namespace = NamespaceLabel(lambda _namespace: True)
    m.quota = QuotaLabel(limit=3)
    team = "ClusterDeviceQuota/ml-team"
    template = replace(claim_create(), namespace="team-a",
                       resource=replace(claim_create().resource, resource="resourceclaimtemplates"))
    m.review("/admit", replace(claim_create(), namespace="team-a"), Verdict(False, "q", cause="quota",
                                                                             quotas=("gpus", team)), 0.001)
    m.review("/validate", template, Verdict(False, "q", cause="quota", quotas=("gpus",)), 0.001)
    m.review("/admit", replace(claim_create(), namespace="team-b"),
             Verdict(True, warnings=("over",), cause="quota", quotas=("audit",)), 0.001)
    m.review("/admit", replace(claim_create(), namespace="team-b"), Verdict(False, "p", cause="pricing"), 0.001)
    m.review("/admit", replace(claim_create(), namespace="team-c"), Verdict(False, "q", cause="quota",
                                                                             quotas=("gpus",)), 0.001)

    def denials(namespace: str, quota: str, decision: str = "denied", resource: str = "resourceclaims") -> float:
        labels = {"namespace": namespace, "quota": quota, "decision": decision, "resource": resource}
        return m.registry.get_sample_value(QUOTA_DENIALS, labels) or 0.0

    assert (denials("team-a", "gpus"), denials("team-a", team)) == (1, 1)
    assert denials("team-a", "gpus", resource="resourceclaimtemplates") == 1
    assert denials("team-b", "audit", decision="warned") == 1
    # The fourth (namespace, quota) pair is past the limit: "other", not a new series.
    assert (denials("team-c", "gpus"), denials("team-c", "other")) == (0, 1)
    assert sum(s.value for f in m.registry.collect() if f.name + "_total" == QUOTA_DENIALS
               for s in f.samples) == 5


def test_allocation_waits_are_a_histogram_per_namespace() -> None:
    m = Metrics()
    m.namespace.has_quota = {"team-a"}.__contains__
    m.allocated("team-a", 3.0)
    m.allocated("team-a", 700.0)
    m.allocated("elsewhere", 1.0)
    assert m.registry.get_sample_value(f"{ALLOCATION_WAIT}_count", {"namespace": "team-a"}) == 2
    assert m.registry.get_sample_value(f"{ALLOCATION_WAIT}_bucket", {"namespace": "team-a", "le": "5.0"}) == 1
    assert m.registry.get_sample_value(f"{ALLOCATION_WAIT}_sum", {"namespace": "other"}) == 1.0


@pytest.mark.parametrize(
    ("verdict", "decision"),
    [(Verdict(True), "allowed"), (Verdict(True, warnings=("w",)), "warned"), (Verdict(False, "no", warnings=("w",)), "denied")],
)
def test_decisions(verdict: Verdict, decision: str) -> None:
    assert decision_of(verdict) == decision


def test_a_review_counts_once_with_its_duration() -> None:
    m = Metrics()
    m.review("/validate", claim_create(), Verdict(False, "q", cause="quota", quotas=("gpus",)), 0.003)
    m.review("/mutate", claim_create(), Verdict(True), 0.0004)
    m.review("/validate", None, Verdict(False, "bad", cause="invalid"), 0.0001)
    assert requests(m, webhook="validating", operation="CREATE", resource="resourceclaims", decision="denied",
                    reason="quota") == 1
    assert requests(m, webhook="mutating", operation="CREATE", resource="resourceclaims", decision="allowed",
                    reason="none") == 1
    assert requests(m, webhook="validating", operation="unknown", resource="unknown", decision="denied",
                    reason="invalid") == 1
    labels = {"webhook": "validating", "operation": "CREATE", "resource": "resourceclaims"}
    assert m.registry.get_sample_value(f"{ADMISSION_DURATION}_count", labels) == 1
    assert m.registry.get_sample_value(f"{ADMISSION_DURATION}_bucket", {**labels, "le": "0.0025"}) == 0
    assert m.registry.get_sample_value(f"{ADMISSION_DURATION}_bucket", {**labels, "le": "0.005"}) == 1


def test_admin_access_decisions_by_outcome_and_action_dry_run_excluded() -> None:
    m = Metrics()

    def rec(outcome: str, kind: str) -> PolicyRecord:
        return PolicyRecord(outcome, "alice", "a", "b", kind, "team-a", "c")  # type: ignore[arg-type]

    def count(outcome: str, action: str) -> float:
        return m.registry.get_sample_value(ADMIN_ACCESS_DECISIONS, {"outcome": outcome, "action": action}) or 0.0

    assert count("granted", "claim") == 0 and count("refused", "namespace_label") == 0  # present from the start
    m.review("/validate", claim_create(), Verdict(True, records=(rec("granted", "ResourceClaim"),)), 0.001)
    m.review("/validate", claim_create(), Verdict(False, records=(rec("refused", "ResourceClaimTemplate"),)), 0.001)
    m.review("/validate", claim_create(), Verdict(False, records=(rec("refused", "Namespace"),)), 0.001)
    m.review("/validate", claim_create(dry_run=True), Verdict(True, records=(rec("granted", "ResourceClaim"),)), 0.001)
    assert (count("granted", "claim"), count("refused", "template"), count("refused", "namespace_label")) == (1, 1, 1)


@dataclass
class FakeReflector:
    resource: Resource
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    stats: ReflectorStats = field(default_factory=ReflectorStats)


def test_reflectors_and_certificates_are_read_at_scrape_time() -> None:
    m = Metrics()
    claims = FakeReflector(Resource("resource.k8s.io/v1", "resourceclaims"))
    m.watch(lambda: [cast(Reflector, claims)])
    not_after = [("serving", datetime(2030, 1, 1, tzinfo=timezone.utc))]
    m.certificates(lambda: not_after)
    label = {"resource": "resourceclaims"}
    assert m.registry.get_sample_value(WATCH_SYNCED, label) == 0
    claims.synced.set()
    claims.stats.restarts, claims.stats.relists = 3, 1
    assert (m.registry.get_sample_value(WATCH_SYNCED, label), m.registry.get_sample_value(WATCH_RESTARTS, label),
            m.registry.get_sample_value(WATCH_RELISTS, label)) == (1, 3, 1)
    assert m.registry.get_sample_value(CERTIFICATE_EXPIRATION, {"certificate": "serving"}) == 1893456000
    not_after.append(("ca", datetime(2031, 1, 1, tzinfo=timezone.utc)))
    assert m.registry.get_sample_value(CERTIFICATE_EXPIRATION, {"certificate": "ca"}) == 1924992000


def test_leases_are_read_at_scrape_time_with_every_path_and_outcome_from_the_start() -> None:
    m, book = Metrics(), LeaseBook(holder="serve-a")
    m.leases(book)
    samples = {(s.name, tuple(s.labels.values())): s.value
               for f in text_string_to_metric_families(m.exposition().decode()) for s in f.samples}
    assert {k: v for k, v in samples.items() if k[0].startswith(("draquota_lease", "draquota_reservation"))} == {
        **{(RESERVATION_ADMISSIONS, (path,)): 0 for path in ("lease", "exact")},
        **{(LEASE_WRITES, (o,)): 0 for o in ("granted", "renewed", "shrunk", "released", "refused", "uncertain")},
        (LEASE_ROOM, ("memory",)): 0, (LEASE_ROOM, ("devices",)): 0}
    book.stats.admitted["lease"] += 7
    book.stats.writes["refused"] += 1
    quota = parse_device_quota(make_quota("gpus", memory="8000Gi"))
    for name, amount in (("gpus", Charge(160 * GiB, 2)), ("more", Charge(80 * GiB, 1))):  # summed over quotas
        book.leases[(Namespace("team-a"), name)] = Lease("lease.serve-a.0", "serve-a", quota, amount)
    value = m.registry.get_sample_value
    assert (value(RESERVATION_ADMISSIONS, {"path": "lease"}), value(LEASE_WRITES, {"outcome": "refused"})) == (7, 1)
    assert (value(LEASE_ROOM, {"resource": "memory"}), value(LEASE_ROOM, {"resource": "devices"})) == (240 * GiB, 3)


def test_the_leaders_charge_backlog_and_writers_are_read_at_each_scrape() -> None:
    m = Metrics()
    backlog = [0]
    m.annotations(lambda: backlog[0], lambda: 16 + backlog[0] // 8)
    value = m.registry.get_sample_value
    assert (value(ANNOTATIONS_PENDING), value(ANNOTATION_WRITERS)) == (0, 16)
    backlog[0] = 200
    assert (value(ANNOTATIONS_PENDING), value(ANNOTATION_WRITERS)) == (200, 41)


def test_the_requeues_credits_writes_and_debt_are_read_at_each_scrape() -> None:
    m = Metrics()
    state = {"credits": 0, "writes": 0, "pending": 0}
    m.requeue(lambda: state["credits"], lambda: state["writes"], lambda: state["pending"])
    value = m.registry.get_sample_value
    assert (value(REQUEUE_CREDITS), value(REQUEUE_WRITES), value(REQUEUE_PENDING)) == (0, 0, 0)
    state.update(credits=3, writes=4, pending=2)
    assert (value(REQUEUE_CREDITS), value(REQUEUE_WRITES), value(REQUEUE_PENDING)) == (3, 4, 2)


def test_the_applied_quota_writes_are_read_at_each_scrape_every_reason_from_0() -> None:
    m = Metrics()
    writes: Counter[AppliedReason] = Counter()
    m.applied_writes(lambda: writes)
    value = m.registry.get_sample_value
    assert [value(APPLIED_QUOTA_WRITES, {"reason": r}) for r in ("own", "refresh", "spec", "delete")] == [0, 0, 0, 0]
    writes.update({"own": 3, "refresh": 49})
    assert [value(APPLIED_QUOTA_WRITES, {"reason": r}) for r in ("own", "refresh", "spec", "delete")] == [3, 49, 0, 0]


def test_every_name_is_exposed_with_help_and_documented_and_registries_are_separate() -> None:
    a, b = Metrics(), Metrics()
    a.review("/validate", claim_create(), Verdict(True), 0.001)
    a.events_dropped.labels("queue_full").inc()
    a.watch(lambda: [])
    a.leases(LeaseBook(holder="serve-a"))
    a.annotations(lambda: 0, lambda: 0)
    a.requeue(lambda: 0, lambda: 0, lambda: 0)
    a.applied_writes(lambda: {})
    a.certificates(lambda: [])
    a.connections({"webhook": Connections(Limits())})
    a.contact(lambda: True)
    UsageMetrics(Ledger(), Inventory(), Holders()).register(a)  # nothing held: the families, no samples
    Showback(Ledger(), Inventory(), lambda: False).register(a)
    assert requests(b, webhook="validating", operation="CREATE", resource="resourceclaims", decision="allowed",
                    reason="none") == 0
    families = {f.name: f for f in text_string_to_metric_families(a.exposition().decode())}
    # the parser drops a counter's `_total` from the family name
    exposed = {name.removesuffix("_total") for name in NAMES}
    assert exposed <= set(families), exposed - set(families)
    assert all(families[n].documentation for n in exposed)
    table = (Path(__file__).parents[3] / "docs" / "metrics.md").read_text()
    assert [n for n in NAMES if f"| `{n}` |" not in table] == []  # a row of the docs' table each
    assert a.registry.get_sample_value(EVENTS_DROPPED, {"reason": "queue_full"}) == 1
    [build] = families[BUILD_INFO].samples
    assert build.value == 1 and build.labels["version"]


@ASYNC
async def test_the_server_hook_sees_every_answer_and_a_failing_hook_costs_nothing() -> None:
    m = Metrics()

    async def crash(_: AdmissionRequest) -> Verdict:
        raise KeyError("a bug")

    async def allow(_: AdmissionRequest) -> Verdict:
        return Verdict(True)

    calls: list[str] = []

    def observe(path: str, review: AdmissionRequest | None, verdict: Verdict, seconds: float) -> None:
        calls.append(path)
        m.review(path, review, verdict, seconds)
        if path == "/allow":
            raise RuntimeError("a metrics bug")

    app = build_app({"/validate": crash, "/allow": allow}, ready=lambda: True, observe=observe)
    async with TestClient(TestServer(app)) as client:
        for path, body in (("/validate", json.dumps(REVIEW)), ("/validate", "not json"), ("/allow", json.dumps(REVIEW))):
            resp = await client.post(path, data=body)
            assert resp.status == 200
            answer = await resp.json()
            assert answer["response"]["uid"] == (REVIEW["request"]["uid"] if body != "not json" else "")
    assert calls == ["/validate", "/validate", "/allow"]
    assert requests(m, webhook="validating", operation="CREATE", resource="resourceclaims", decision="denied",
                    reason="error") == 1
    assert requests(m, webhook="validating", operation="unknown", resource="unknown", decision="denied",
                    reason="invalid") == 1


@ASYNC
async def test_serve_metrics_answers_prometheus_text_over_plain_http() -> None:
    m = Metrics()
    m.review("/validate", claim_create(), Verdict(True), 0.001)
    runner, port = await serve_metrics(m, host="127.0.0.1", port=0, context=None, access=None)
    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            text = await resp.text()
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
    finally:
        await runner.cleanup()
    assert ('draquota_admission_requests_total{decision="allowed",namespace="other",operation="CREATE",'
            'reason="none",resource="resourceclaims",webhook="validating"} 1.0') in text
    # prometheus_client's _created series are off: no dashboard reads them.
    assert "_created" not in text


def test_a_large_gauge_family_renders_in_pieces_as_it_renders_whole() -> None:
    """A scrape pauses every `RENDER_CHUNK` samples (`serve` renders it in slices): the
    text is the same as prometheus_client's in one piece."""
    from prometheus_client import generate_latest
    from prometheus_client.core import GaugeMetricFamily

    from quota.values.work import pausing
    from webhook.metrics import RENDER_CHUNK

    class Many:
        def collect(self) -> Any:
            family = GaugeMetricFamily("draquota_test_many", "Many samples.", labels=["i"])
            for i in range(3 * RENDER_CHUNK + 5):
                family.add_metric([str(i)], float(i))
            yield family

    m = Metrics()
    m.registry.register(Many())
    pauses: list[int] = []
    with pausing(lambda: pauses.append(1)):
        text = m.exposition()
    assert len(pauses) >= 4
    assert text == generate_latest(m.registry)


def test_a_scrape_keeps_rendered_families_in_their_pieces() -> None:
    """`GET /metrics` writes the pieces as they are: tens of MB joined in one piece (twice)
    held the loop 20-40 ms at 150,000 claims (bench/stalls.py)."""
    m = Metrics()
    pieces = (b"# a claim's lines\n", b"# another's\n")
    m.rendered(lambda: pieces)
    parts = m.exposition_parts()
    assert parts[-2] is pieces[0] and parts[-1] is pieces[1]
    assert m.exposition() == b"".join(parts)
