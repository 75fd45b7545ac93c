"""quota.values.labelselector: parsed as apimachinery validates a LabelSelector, matched as labels.Selector does."""

from typing import Any

import pytest

from quota.values.labelselector import MAX_EXPRESSIONS, parse_label_selector


class Bad(ValueError):
    pass


def parse(raw: Any) -> Any:
    return parse_label_selector(raw, "spec.namespaceSelector", Bad)


@pytest.mark.parametrize(("selector", "labels", "expected"), [
    ({}, {}, True),  # {} selects everything
    ({}, {"a": "b"}, True),
    ({"matchLabels": {"team.draquota.io/name": "ml"}}, {"team.draquota.io/name": "ml"}, True),
    ({"matchLabels": {"team.draquota.io/name": "ml"}}, {"team.draquota.io/name": "web"}, False),
    ({"matchLabels": {"team.draquota.io/name": "ml"}}, {}, False),
    ({"matchExpressions": [{"key": "k", "operator": "In", "values": ["a", "b"]}]}, {"k": "b"}, True),
    ({"matchExpressions": [{"key": "k", "operator": "In", "values": ["a"]}]}, {}, False),
    # NotIn and DoesNotExist match a namespace without the key (pkg/labels/selector.go).
    ({"matchExpressions": [{"key": "k", "operator": "NotIn", "values": ["a"]}]}, {}, True),
    ({"matchExpressions": [{"key": "k", "operator": "NotIn", "values": ["a"]}]}, {"k": "a"}, False),
    ({"matchExpressions": [{"key": "k", "operator": "Exists"}]}, {"k": ""}, True),
    ({"matchExpressions": [{"key": "k", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "k", "operator": "DoesNotExist"}]}, {}, True),
    ({"matchExpressions": [{"key": "k", "operator": "DoesNotExist"}]}, {"k": "x"}, False),
    # Requirements are ANDed, matchLabels with matchExpressions too.
    ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1"}, False),
    ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1", "b": ""}, True),
])
def test_matches(selector: dict[str, Any], labels: dict[str, str], expected: bool) -> None:
    assert parse(selector).matches(labels) is expected


@pytest.mark.parametrize(("selector", "message"), [
    ("team-a", "must be a label selector"),
    ({"matchLabel": {}}, "unknown field 'matchLabel'"),
    ({"matchLabels": {"bad key!": "x"}}, "is not a valid label key"),
    ({"matchLabels": {"k": "not valid!"}}, "is not a valid label value"),
    ({"matchLabels": {"k": 3}}, "is not a valid label value"),
    ({"matchLabels": {"k": "x" * 64}}, "is not a valid label value"),
    ({"matchExpressions": [{"key": "k", "operator": "Equals", "values": ["a"]}]},
     "'Equals' is not a valid selector operator: use In, NotIn, Exists, DoesNotExist"),
    ({"matchExpressions": [{"key": "k", "operator": "In"}]}, "must be specified when `operator` is 'In' or 'NotIn'"),
    ({"matchExpressions": [{"key": "k", "operator": "NotIn", "values": []}]}, "must be specified"),
    ({"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["a"]}]}, "may not be specified"),
    ({"matchExpressions": [{"key": "k", "operator": "In", "values": ["-a"]}]}, "values[0]: '-a' is not a valid label value"),
    ({"matchExpressions": [{"operator": "Exists"}]}, "matchExpressions[0]: key None is not a valid label key"),
    ({"matchExpressions": [{"key": "k", "operator": "Exists"}] * (MAX_EXPRESSIONS + 1)}, "at most 16"),
    ({"matchExpressions": "k"}, "must be a list"),
])
def test_refuses_what_the_api_server_refuses_naming_the_field(selector: Any, message: str) -> None:
    with pytest.raises(Bad) as err:
        parse(selector)
    assert message in str(err.value)
    assert str(err.value).startswith("spec.namespaceSelector")
