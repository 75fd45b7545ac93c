"""controllers.governed: which namespaces the leader looks at again, told by the caches.

The label writes themselves are proven against the real API server (tests/e2e)."""

from __future__ import annotations

from controllers.governed import GovernedLabels, governed_value
from quota.accounting.ledger import Ledger
from quota.quotas.devicequota import parse_cluster_device_quota
from quota.values.model import Namespace

from ..builders import make_cluster_quota

ML = {"team.draquota.io/name": "ml"}


def test_the_quotas_an_event_moved_name_the_namespaces_to_look_at_again() -> None:
    governed = GovernedLabels(None, Ledger(), {"team-a": {}, "team-b": {}, "team-c": {}},  # type: ignore[arg-type]
                              leading=lambda: True)
    governed.quotas_changed([(Namespace("team-a"), "gpus"), (Namespace("team-a"), "mig"), (Namespace("team-b"), "q")])
    assert governed._dirty == {"team-a", "team-b"}
    governed.changed("team-c")  # a Namespace event
    assert governed._dirty == {"team-a", "team-b", "team-c"}
    governed._dirty.clear()
    governed.quotas_changed(None)  # a whole list: every namespace
    assert governed._dirty == {"team-a", "team-b", "team-c"}


def test_a_team_governs_its_members_and_only_a_change_of_members_is_looked_at_again() -> None:
    ledger = Ledger()
    for ns, labels in (("team-a", ML), ("team-b", ML), ("team-c", {})):
        ledger.set_namespace(Namespace(ns), labels)
    governed = GovernedLabels(None, ledger, {"team-a": {}, "team-b": {}, "team-c": {}},  # type: ignore[arg-type]
                              leading=lambda: True)
    team = (Namespace(""), "ml")
    governed.quotas_changed([team])  # no such team yet: nothing to look at
    assert governed._dirty == set()
    ledger.add_or_update_quota(parse_cluster_device_quota(make_cluster_quota("ml", memory="1Ti")))
    governed.quotas_changed([team])
    assert governed._dirty == {"team-a", "team-b"}
    assert [governed_value(ledger, ns) for ns in ("team-a", "team-b", "team-c")] == ["true", "true", None]
    governed._dirty.clear()
    governed.quotas_changed([team])  # a claim event of the team: its members did not move
    assert governed._dirty == set()
    ledger.delete_quota(*team)
    governed.quotas_changed([team])  # deleted: its former members are looked at again
    assert governed._dirty == {"team-a", "team-b"} and governed_value(ledger, "team-a") is None
