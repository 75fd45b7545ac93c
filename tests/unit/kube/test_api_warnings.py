"""kube.api.warning_text: the text of a `Warning` response header."""

from __future__ import annotations

import pytest

from kube.api import warning_text


@pytest.mark.parametrize(("header", "text"), [
    ('299 - "exceeded DeviceQuota \\"gpus\\": requested devices=2"', 'exceeded DeviceQuota "gpus": requested devices=2'),
    ('299 - "a \\\\ backslash"', "a \\ backslash"),
    ('299 kube-apiserver "v1 ComponentStatus is deprecated"', "v1 ComponentStatus is deprecated"),
    ("not rfc 7234", "not rfc 7234"),
])
def test_warning_text(header: str, text: str) -> None:
    assert warning_text(header) == text
