"""docs/api.md, the API reference, is what the CRDs declare (tests/tools/api_reference.py)."""

from __future__ import annotations

from tests.tools.api_reference import current, fields, render


def test_the_api_reference_is_generated_from_the_crds() -> None:
    assert current() == render(), "docs/api.md is stale: run python -m tests.tools.api_reference"


def test_it_has_every_kind_and_the_fields_a_reader_looks_for() -> None:
    page = render()
    for heading in ("## DeviceQuota\n", "## ClusterDeviceQuota\n", "## AppliedClusterDeviceQuota\n"):
        assert heading in page
    assert "| `spec.hard.memory` | quantity |" in page
    assert "| `spec.namespaceSelector` |" in page
    assert "| `spec.enforcement` | string: `Enforce`, `Audit` (default `Enforce`) |" in page


def test_items_and_map_values_are_their_fields() -> None:
    schema = {"required": ["a"], "properties": {
        "a": {"type": "array", "description": "As.", "items": {"type": "object", "required": ["b"],
                                                             "properties": {"b": {"type": "string", "description": "B."}}}},
        "m": {"type": "object", "description": "Ms.", "additionalProperties": {
            "type": "object", "properties": {"c": {"type": "integer", "enum": [1, 2]}}}}}}
    assert fields(schema, "") == [("a", "[]object (required)", "As."), ("a[].b", "string (required)", "B."),
                                  ("m", "map[string]object", "Ms."), ("m.<key>.c", "integer: `1`, `2`", "")]
