"""runtime.eventcorrelation: which Event an occurrence counts under, and the write budget (plain values)."""

from __future__ import annotations

import pytest

from runtime.eventcorrelation import COMBINED, Bucket, Budget, Correlator, EventKey, Rate, Ref, Similar

QUOTA = Ref("draquota.io/v1alpha1", "DeviceQuota", "gpus", "team-a")
T0 = 1_700_000_000.0


def claim(name: str, namespace: str = "team-a") -> Ref:
    return Ref("resource.k8s.io/v1", "ResourceClaim", name, namespace)


def denial(claim_name: str, regarding: Ref = QUOTA) -> EventKey:
    return EventKey(regarding, claim(claim_name, regarding.namespace), "Warning", "QuotaExceeded", "Admit",
                    f"ResourceClaim {regarding.namespace}/{claim_name}: exceeded")


def refusal(claim_name: str, namespace: str = "team-a") -> EventKey:
    return EventKey(claim(claim_name, namespace), Ref("v1", "Namespace", namespace), "Warning", "AdminAccessRefused",
                    "AuthorizeAdminAccess", f"refused: mallory may not create ResourceClaim {namespace}/{claim_name}")


def distinct(keys: list[EventKey], correlator: Correlator, now: float = T0) -> list[EventKey]:
    """The keys `keys` count under, each once, in order."""
    seen: dict[EventKey, None] = {}
    for key in keys:
        seen.setdefault(correlator.correlate(key, now))
    return list(seen)


def test_nine_similar_notes_on_one_object_stay_apart_then_the_rest_combine() -> None:
    keys = distinct([denial(f"c{i}") for i in range(300)], Correlator())
    assert keys[:9] == [denial(f"c{i}") for i in range(9)]
    assert keys[9:] == [EventKey(QUOTA, None, "Warning", "QuotaExceeded", "Admit",
                                 COMBINED + "ResourceClaim team-a/c9: exceeded")]


def test_a_repeated_note_is_its_own_series_even_once_the_object_combines() -> None:
    correlator = Correlator()
    distinct([denial(f"c{i}") for i in range(20)], correlator)
    assert correlator.correlate(denial("c3"), T0) == denial("c3")


def test_many_objects_of_one_kind_in_one_namespace_combine() -> None:
    """A refusal regards the claim acted on: a new object per request, which client-go's
    per-object aggregation never folds; the namespace's does."""
    keys = distinct([refusal(f"c{i}") for i in range(300)], Correlator())
    assert keys[:9] == [refusal(f"c{i}") for i in range(9)]
    assert keys[9:] == [EventKey(claim("c9"), None, "Warning", "AdminAccessRefused", "AuthorizeAdminAccess",
                                 COMBINED + "refused: mallory may not create ResourceClaim team-a/c9")]


@pytest.mark.parametrize(
    "other",
    [refusal("c1", "team-b"),  # another namespace
     EventKey(claim("c1"), None, "Normal", "AdminAccessGranted", "AuthorizeAdminAccess", "granted"),  # reason
     denial("c1", Ref("v1", "Pod", "p1", "team-a"))],  # kind: a Pod's Events never fold into a claim's
    ids=["namespace", "reason", "kind"],
)
def test_a_full_group_leaves_other_groups_alone(other: EventKey) -> None:
    correlator = Correlator()
    distinct([refusal(f"c{i}") for i in range(50)], correlator)
    assert correlator.correlate(other, T0) == other


def test_a_group_idle_for_its_interval_starts_again() -> None:
    correlator = Correlator(interval=600.0)
    distinct([refusal(f"c{i}") for i in range(50)], correlator)
    assert correlator.correlate(refusal("late"), T0 + 600.5) == refusal("late")


def test_similar_keeps_at_most_its_entries() -> None:
    similar = Similar(max_similar=2, max_entries=3)
    key = denial("c")
    for group in range(10):
        similar.fold(group, "a", key, key, T0)
    assert len(similar._groups) == 3


@pytest.mark.parametrize(
    ("bucket", "now", "expected"),
    [(Bucket(0.0, T0), T0 + 5, Bucket(0.5, T0 + 5)),
     (Bucket(1.0, T0), T0 + 1000, Bucket(2.0, T0 + 1000)),  # never above the burst
     (Bucket(1.0, T0), T0 - 5, Bucket(1.0, T0 - 5))],  # a clock stepping back refills nothing
)
def test_a_bucket_refills_at_its_rate_up_to_its_burst(bucket: Bucket, now: float, expected: Bucket) -> None:
    assert bucket.refilled(Rate(2, 0.1), now) == expected


def test_an_object_gets_its_burst_then_one_write_per_refill() -> None:
    budget = Budget(per_object=Rate(25, 1 / 300), per_namespace=Rate(1000, 1), overall=Rate(1000, 1))
    key = denial("c")
    assert [budget.take(key, T0) for _ in range(25)] == [None] * 25
    assert budget.take(key, T0) == pytest.approx(T0 + 300)
    assert budget.take(key, T0 + 300) is None
    # another object of the namespace has its own bucket
    assert budget.take(denial("c", Ref("v1", "Pod", "p", "team-a")), T0) is None


def test_a_namespace_bound_holds_over_many_objects_and_leaves_other_namespaces_theirs() -> None:
    budget = Budget(per_namespace=Rate(25, 0.1))
    taken = [budget.take(refusal(f"c{i}"), T0) for i in range(100)]
    assert taken.count(None) == 25
    assert taken[25] == pytest.approx(T0 + 10)
    assert budget.take(refusal("c0", "team-b"), T0) is None


def test_a_refused_take_takes_nothing_from_any_bucket() -> None:
    budget = Budget(per_object=Rate(1, 1), per_namespace=Rate(5, 1), overall=Rate(5, 1))
    assert budget.take(denial("c"), T0) is None
    assert budget.take(denial("c"), T0) == pytest.approx(T0 + 1)  # the object's bucket is empty
    for i in range(4):  # the namespace still has its four
        assert budget.take(refusal(f"c{i}"), T0) is None


def test_the_overall_bound_holds_across_namespaces() -> None:
    budget = Budget(overall=Rate(50, 20))
    taken = [budget.take(refusal("c", f"ns-{i}"), T0) for i in range(60)]
    assert taken.count(None) == 50 and taken[50] == pytest.approx(T0 + 0.05)
