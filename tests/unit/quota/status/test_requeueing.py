"""quota.status.requeueing: the write budget of a freed quota and the turns namespaces take."""

from __future__ import annotations

from quota.status.requeueing import Settles, Turn, Turns


def test_a_credit_a_deletion_capped_and_spent_per_turn() -> None:
    turns = Turns(interval=1.0, cap=5, per_turn=2)
    for _ in range(9):
        turns.grant("a")
    assert turns.take(0.0) == Turn("a", ("a",), 2)
    assert turns.take(0.5) is None  # a's next turn is an interval away
    assert turns.next_at() == 1.0
    assert [turns.take(t) for t in (1.0, 2.0, 3.0)] == [Turn("a", ("a",), 2), Turn("a", ("a",), 1), None]
    assert turns.next_at() is None and len(turns) == 0


def test_origins_take_turns_and_a_churning_one_does_not_delay_another() -> None:
    turns = Turns(interval=1.0, per_turn=1)
    for _ in range(50):
        turns.grant("churn")
    turns.grant("team-b", ["team-c", "team-b", "team-a"])
    assert turns.take(0.0) == Turn("churn", ("churn",), 1)
    assert turns.take(0.0) == Turn("team-b", ("team-b", "team-a", "team-c"), 1)  # the origin first
    assert turns.take(0.0) is None
    turns.grant("late")
    assert turns.take(1.0) == Turn("churn", ("churn",), 1)
    assert turns.take(1.0) == Turn("late", ("late",), 1)


def test_a_settle_touches_what_was_touched_once_more() -> None:
    settles = Settles()
    settles.add("a", ["t1", "t2"], 3.0)
    settles.add("a", ["t2", "t3"], 4.0)
    settles.add("b", ["t1"], 5.0)
    assert settles.next_at() == 3.0
    assert settles.take(2.9) == []
    assert settles.take(4.0) == [("a", ["t1", "t2", "t3"])]
    assert settles.take(9.0) == [("b", ["t1"])] and settles.next_at() is None
