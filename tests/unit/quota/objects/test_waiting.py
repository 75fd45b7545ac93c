"""quota.objects.waiting: which templates unscheduled Pods still wait on."""

from typing import Any

from quota.objects.waiting import Waiter, pick, pod_mark, waiting_templates


def pod(name: str, claims: dict[str, str], *, created: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {"resourceClaims": [{"name": n, "resourceClaimTemplateName": t} for n, t in claims.items()],
                 "containers": [{"name": "main", "image": "x" * 1000}]},
        "status": {"phase": "Pending",
                   "resourceClaimStatuses": [{"name": n, "resourceClaimName": f"{name}-{n}-abcde"} for n in created]},
    }
    for path, value in extra.items():
        section, key = path.split("__")
        obj[section][key] = value
    return obj


def test_a_template_claim_without_a_status_entry_is_waiting() -> None:
    pods = [pod("a", {"gpu": "one-gpu", "nic": "nic"}, created=("nic",)), pod("b", {"gpu": "two-gpus"}, created=("gpu",))]
    assert waiting_templates(pods) == {"one-gpu"}


def test_scheduled_terminal_and_deleting_pods_do_not_wait() -> None:
    pods = [
        pod("s", {"gpu": "t1"}, spec__nodeName="n1"),
        pod("f", {"gpu": "t2"}, status__phase="Failed"),
        pod("d", {"gpu": "t3"}, metadata__deletionTimestamp="2026-11-23T00:00:00Z"),
    ]
    assert waiting_templates(pods) == set()


def test_direct_claims_and_odd_shapes_are_ignored() -> None:
    direct = {"metadata": {}, "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "mine"}]}, "status": {}}
    odd: list[dict[str, Any]] = [direct, {"spec": {"resourceClaims": "x"}}, {"spec": {"resourceClaims": [3, {"resourceClaimTemplateName": ""}]}},
           {"status": {"resourceClaimStatuses": 7}, "spec": {"resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t"}]}}]
    assert waiting_templates(odd) == {"t"}


def test_pick_goes_round_the_templates_least_recently_touched_first() -> None:
    waiters = [Waiter("1", "2026-01-01T00:00:03Z", ("c",)), Waiter("2", "2026-01-01T00:00:01Z", ("b", "a")),
               Waiter("3", "2026-01-01T00:00:02Z", ("a",)), Waiter("4", "2026-01-01T00:00:00Z", ())]
    assert pick(waiters, {}, 2) == ["a", "b"]  # never touched: oldest waiting Pod first, then by name
    assert pick(waiters, {"a": 5.0, "b": 6.0}, 2) == ["c", "a"]
    assert pick(waiters, {}, 0) == [] and pick([], {}, 3) == []


def test_a_pod_mark_keeps_four_fields_of_its_metadata() -> None:
    item = {"metadata": {"name": "p", "uid": "u", "resourceVersion": "7", "creationTimestamp": "T",
                         "annotations": {"pad": "x" * 1000}, "managedFields": [{"manager": "m"}]}}
    assert pod_mark(item) == {"name": "p", "uid": "u", "version": "7", "created": "T"}
    assert pod_mark({}) == {"name": "", "uid": "", "version": "", "created": ""}
