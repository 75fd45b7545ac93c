"""controllers.governed: which namespaces the leader looks at again, told by the caches.

The label writes themselves are proven against the real API server (tests/e2e)."""

from __future__ import annotations

from controllers.governed import GovernedLabels
from quota.ledger import Ledger
from quota.model import Namespace


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
