"""quota.values.interning: equal values share one object, and the table stops growing at its limit."""

from __future__ import annotations

from quota.values.interning import Interned


def test_equal_values_decoded_apart_become_one_object() -> None:
    shared: Interned[str] = Interned(4)
    first, second = "".join(["team", "-a"]), "".join(["team-", "a"])
    assert first is not second
    assert shared(first) is first and shared(second) is first


def test_past_its_limit_a_new_value_is_returned_as_it_is_and_not_held() -> None:
    # A tenant's request names, or pools of nodes long gone, must not grow it without end.
    shared: Interned[str] = Interned(2)
    for name in ("a", "b", "c", "d"):
        shared(name)
    assert len(shared) == 2
    late = "".join(["c", ""]) + "x"
    assert shared(late) is late and len(shared) == 2
