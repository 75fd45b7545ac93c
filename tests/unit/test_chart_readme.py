"""deploy/helm/dra-quota/README.md's values table is what values.yaml and
values.schema.json say (tests/tools/chart_readme.py)."""

from __future__ import annotations

import json

from tests.tools.chart_readme import CHART, comments, current, render


def test_the_chart_readme_values_table_is_generated_from_the_chart() -> None:
    assert current() == render(), "deploy/helm/dra-quota/README.md is stale: run python -m tests.tools.chart_readme"


def test_the_table_has_a_row_for_every_value_with_its_default() -> None:
    table = render()
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert all(f"| `{key}" in table for key in schema["properties"])
    assert '| `webhooks.failurePolicy.governed` | `"Fail"` | one of `Fail`, `Ignore` | The claim webhooks' in table
    assert "| `teamLabels.groups` |" in table
    assert "| `metrics.serviceMonitor.bearerTokenSecret` | `{}` |" in table


def test_comments_are_read_above_and_beside_their_key_without_examples() -> None:
    said = comments(
        "# Top.\n"
        "\n"
        "# What a is.\n"
        "a:\n"
        "  # b, over two\n"
        "  # lines.\n"
        "  b: 1  # and inline\n"
        "  c: {}\n"
        "  #   name: an-example\n"
        "  #   - {kind: X}\n"
        "  d: 2\n")
    assert said == {"a": "What a is.", "a.b": "b, over two lines. and inline", "a.c": "", "a.d": ""}
