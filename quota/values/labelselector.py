"""Label selectors (metav1.LabelSelector): parsed as the API server validates them, matched.

Neighbours: `quota.quotas.devicequota.parse_cluster_device_quota` reads a ClusterDeviceQuota's
`spec.namespaceSelector` here; `quota.accounting.teams` asks `matches` of every Namespace's labels.
Validation follows ValidateLabelSelector (staging/src/k8s.io/apimachinery/pkg/apis/meta/
v1/validation/validation.go): operators In, NotIn, Exists, DoesNotExist; values required
for In and NotIn, forbidden for Exists and DoesNotExist; keys qualified names, values
valid label values. Matching follows labels.Selector (pkg/labels/selector.go): the
requirements are ANDed, `{}` selects everything, NotIn and DoesNotExist match a
namespace without the key. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from quota.values.meta import is_label_key, is_label_value
from quota.values.raw import show

__all__ = ["MAX_EXPRESSIONS", "MAX_LABELS", "MAX_VALUES", "LabelSelector", "Requirement", "parse_label_selector"]

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
_OPERATORS: tuple[Operator, ...] = ("In", "NotIn", "Exists", "DoesNotExist")
# Bounds of ours (the CRD says the same): a selector is written by a cluster admin, but
# every Namespace event is matched against every team's selector.
MAX_LABELS = 16
MAX_EXPRESSIONS = 16
MAX_VALUES = 64


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        present = self.key in labels and labels[self.key] in self.values
        return present if self.operator == "In" else not present


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """`matchLabels` as In requirements of one value, then `matchExpressions`, ANDed."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def keys(self) -> frozenset[str]:
        return frozenset(r.key for r in self.requirements)


def parse_label_selector(raw: Any, where: str, error: type[Exception]) -> LabelSelector:
    """A metav1.LabelSelector; `error` names the field of any defect."""
    if not isinstance(raw, dict):
        raise error(f"{where} must be a label selector (matchLabels, matchExpressions), got {show(raw)}")
    unknown = [k for k in raw if k not in ("matchLabels", "matchExpressions")]
    if unknown:
        raise error(f"{where}: unknown field {show(unknown[0])}: a label selector has matchLabels, matchExpressions")
    requirements: list[Requirement] = []
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        raise error(f"{where}.matchLabels must be a map of at most {MAX_LABELS} labels, got {show(labels)}")
    for key, value in labels.items():
        _key(key, f"{where}.matchLabels", error)
        if not isinstance(value, str) or not is_label_value(value):
            raise error(f"{where}.matchLabels[{show(key)}]: {show(value)} is not a valid label value")
        requirements.append(Requirement(key, "In", frozenset((value,))))
    expressions = raw.get("matchExpressions") or []
    if not isinstance(expressions, list) or len(expressions) > MAX_EXPRESSIONS:
        raise error(f"{where}.matchExpressions must be a list of at most {MAX_EXPRESSIONS}, got {show(expressions)}")
    for i, item in enumerate(expressions):
        requirements.append(_expression(item, f"{where}.matchExpressions[{i}]", error))
    return LabelSelector(tuple(requirements))


def _expression(raw: Any, where: str, error: type[Exception]) -> Requirement:
    if not isinstance(raw, dict):
        raise error(f"{where} must be an object (key, operator, values), got {show(raw)}")
    key = _key(raw.get("key"), where, error)
    operator = raw.get("operator")
    if operator not in _OPERATORS:
        raise error(f"{where}.operator: {show(operator)} is not a valid selector operator: use "
                    + ", ".join(_OPERATORS))
    values = raw.get("values") or []
    if not isinstance(values, list) or len(values) > MAX_VALUES:
        raise error(f"{where}.values must be a list of at most {MAX_VALUES} label values, got {show(values)}")
    for j, value in enumerate(values):
        if not isinstance(value, str) or not is_label_value(value):
            raise error(f"{where}.values[{j}]: {show(value)} is not a valid label value")
    if operator in ("In", "NotIn") and not values:
        raise error(f"{where}.values: must be specified when `operator` is 'In' or 'NotIn'")
    if operator in ("Exists", "DoesNotExist") and values:
        raise error(f"{where}.values: may not be specified when `operator` is 'Exists' or 'DoesNotExist'")
    return Requirement(key, operator, frozenset(values))


def _key(key: Any, where: str, error: type[Exception]) -> str:
    if not isinstance(key, str) or not is_label_key(key):
        raise error(f"{where}: key {show(key)} is not a valid label key (a qualified name: [prefix/]name)")
    return key
