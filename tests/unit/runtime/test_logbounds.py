"""runtime.logbounds: long log messages cut with their length stated; repeated lines sampled per key."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commands.options import JsonFormatter
from runtime.logbounds import MESSAGE_LIMIT, CutLongMessages, Sampler, cut


def test_a_short_message_is_kept_whole() -> None:
    assert cut("denied: exceeded DeviceQuota", limit=100) == "denied: exceeded DeviceQuota"
    assert cut("x" * 100, limit=100) == "x" * 100


def test_a_long_message_keeps_its_beginning_and_says_how_long_it_was() -> None:
    assert cut("a" * 87_799, limit=10) == "aaaaaaaaaa... [cut: 87,799 characters]"


@given(st.text(max_size=3 * MESSAGE_LIMIT))
def test_a_cut_message_is_bounded_and_begins_as_the_whole(message: str) -> None:
    shown = cut(message)
    assert len(shown) <= MESSAGE_LIMIT + len(f"... [cut: {3 * MESSAGE_LIMIT:,} characters]")
    assert shown.startswith(message[:MESSAGE_LIMIT])
    assert (shown == message) == (len(message) <= MESSAGE_LIMIT)


def record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("webhook.server", logging.INFO, __file__, 1, msg, args, None)


def test_the_filter_cuts_the_formatted_message_for_the_text_and_the_json_format() -> None:
    long = record("/validate denied CREATE team-a/c uid=u in 2.0ms: %s", "request s0: class missing; " * 4000)
    assert CutLongMessages(limit=50).filter(long) is True  # cut, never dropped
    text = logging.Formatter("%(levelname)s %(name)s: %(message)s").format(long)
    assert text == ("INFO webhook.server: /validate denied CREATE team-a/c uid=u in 2.0ms: r"
                    "... [cut: 108,049 characters]")
    assert json.loads(JsonFormatter().format(long))["message"] == text.removeprefix("INFO webhook.server: ")


def test_the_filter_leaves_a_short_record_as_it_was() -> None:
    short = record("%s denied", "c1")
    assert CutLongMessages(limit=50).filter(short) is True
    assert (short.msg, short.args) == ("%s denied", ("c1",))


def test_the_first_of_each_interval_pass_the_rest_are_counted_and_told_once() -> None:
    sampler = Sampler(per_interval=3, interval=60.0)
    assert [sampler.admit("mallory", 10.0 + n) for n in range(5)] == [(True, 0)] * 3 + [(False, 0)] * 2
    # Another key has an interval of its own: the flood does not crowd it out.
    assert sampler.admit("alice", 12.0) == (True, 0)
    # The next event after the interval tells the count it held back, and is logged.
    assert sampler.admit("mallory", 70.0) == (True, 2)
    assert sampler.expired(71.0) == []  # told already, and mallory's new interval is not over
    assert sampler.active()


def test_an_interval_that_ends_quiet_is_told_by_the_timer_and_forgotten() -> None:
    sampler = Sampler(per_interval=1, interval=60.0)
    for n in range(4):
        sampler.admit("mallory", float(n))
    sampler.admit("alice", 0.0)  # held nothing back: nothing to tell
    assert sampler.expired(59.0) == []
    assert sampler.expired(60.0) == [("mallory", 3)]
    assert not sampler.active()  # forgotten: a quiet namespace costs no memory
    assert sampler.admit("mallory", 61.0) == (True, 0)  # a new interval, nothing told twice


@pytest.mark.parametrize("flood", [10, 300, 10_000])
def test_a_flood_logs_a_constant_per_interval(flood: int) -> None:
    sampler = Sampler(per_interval=10, interval=60.0)
    logged = sum(sampler.admit("mallory", n * 0.001)[0] for n in range(flood))
    assert logged == min(flood, 10)
    assert sampler.expired(61.0) == ([("mallory", flood - 10)] if flood > 10 else [])
