"""What one tenant's requests may cost in log bytes: long messages cut, repeated lines sampled.

Neighbours: `commands.options.configure_logging` puts `CutLongMessages` on the process's
one log handler, so every line, in the text and the JSON format alike (the filter runs
before either formatter), carries at most `MESSAGE_LIMIT` characters of message;
`webhook.decisionlog` samples the denial lines of each namespace with a `Sampler`.

Why: a denial's message is as long as the tenant's object makes it (a claim of 256
subrequests naming missing classes is denied with 88 KB of text), and a tenant may send
hundreds of them a second, so logged whole each one cost the log as much as the tenant
chose. The tenant still gets the whole message in its AdmissionReview: only the log is
bounded. A cut message keeps its beginning (where the reason is) and says how long the
whole was. Pure but for the `logging.Filter` base: the sampler is told the time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["DENIALS_PER_INTERVAL", "INTERVAL", "MESSAGE_LIMIT", "CutLongMessages", "Sampler", "cut"]

# Characters of a message kept: a few quota denials with their explanations fit whole,
# and even in 4-byte characters a cut line stays under 8 KiB.
MESSAGE_LIMIT = 2000
# Lines of one key (a namespace's denials) logged whole per interval; the rest are counted.
DENIALS_PER_INTERVAL = 10
INTERVAL = 60.0  # seconds


def cut(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """`message`, or its first `limit` characters and how long it was whole."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}... [cut: {len(message):,} characters]"


class CutLongMessages(logging.Filter):
    """Cuts every record's message to `limit` characters (module doc); drops nothing."""

    def __init__(self, limit: int = MESSAGE_LIMIT) -> None:
        super().__init__()
        self.limit = limit

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if len(message) > self.limit:
            # The formatted message replaces the format and its arguments: a handler's
            # formatter calls getMessage() again, and must find the cut one.
            record.msg, record.args = cut(message, self.limit), None
        return True


@dataclass(slots=True)
class _Window:
    started: float
    seen: int = 0  # events of the key since `started`, logged or not


class Sampler:
    """The first `per_interval` events of each key in each `interval` seconds pass; the rest
    are counted, and each count is told once its interval is over (`admit`, `expired`).

    A key's interval starts with its first event after the last one ended, so a key that
    is quiet costs nothing, and one interval's count is told once: with the key's next
    event, or by `expired` (the caller's timer), whichever comes first.
    """

    def __init__(self, *, per_interval: int = DENIALS_PER_INTERVAL, interval: float = INTERVAL) -> None:
        self.per_interval = per_interval
        self.interval = interval
        self._windows: dict[str, _Window] = {}

    def admit(self, key: str, now: float) -> tuple[bool, int]:
        """Whether this event of `key` is to be logged, and how many of `key`'s events the
        interval that ended before it held back (0: none, or already told)."""
        window = self._windows.get(key)
        ended = 0
        if window is not None and now - window.started >= self.interval:
            ended = max(window.seen - self.per_interval, 0)
            window = None
        if window is None:
            window = self._windows[key] = _Window(now)
        window.seen += 1
        return window.seen <= self.per_interval, ended

    def expired(self, now: float) -> list[tuple[str, int]]:
        """The keys whose interval is over and held events back, with how many; every
        interval that is over is forgotten (the next event of its key starts another)."""
        told: list[tuple[str, int]] = []
        for key, window in list(self._windows.items()):
            if now - window.started >= self.interval:
                del self._windows[key]
                if window.seen > self.per_interval:
                    told.append((key, window.seen - self.per_interval))
        return told

    def active(self) -> bool:
        """Whether some key's interval is not forgotten yet (the caller's timer is due:
        without it a quiet key's last count would wait for its next event)."""
        return bool(self._windows)
