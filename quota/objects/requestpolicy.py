"""A shared device's CapacityRequestPolicy, read and checked as the API server does.

Neighbours: `quota.objects.slices` calls `parse_policy` for each capacity of a device with
`allowMultipleAllocations`; `quota.pricing.capacity` rounds requests with the result. The rules
are validateRequestPolicy and its helpers in k/k pkg/apis/resource/validation/
validation.go: at most one of validValues / validRange; validValues ascending, unique,
at most 10, none above the capacity, and the default one of them; validRange with a
min no larger than the capacity or max, a default inside the range, a positive step
that fits the capacity, and default and max reachable from min in whole steps. A
policy that breaks them would change what a shared allocation costs, so it is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from quota.values.model import RequestPolicy, ValidRange
from quota.values.quantity import format_quantity, non_negative_amount
from quota.values.raw import as_list, show
from quota.values.validation import MAX_VALID_VALUES, at_most

__all__ = ["parse_policy"]


def parse_policy(raw: Any, capacity: Fraction, where: str, error: type[Exception]) -> RequestPolicy:
    if not isinstance(raw, dict):
        raise error(f"{where} must be an object, got {show(raw)}")
    default = _optional(raw.get("default"), f"{where}.default", error)
    values_raw = at_most(as_list(raw.get("validValues"), f"{where}.validValues", error),
                         MAX_VALID_VALUES, f"{where}.validValues", error)
    range_raw = raw.get("validRange")
    if values_raw and range_raw is not None:
        raise error(f"{where}: exactly one policy can be specified, cannot specify validValues and validRange")
    if values_raw:
        values = tuple(non_negative_amount(v, f"{where}.validValues[{i}]", error) for i, v in enumerate(values_raw))
        _check_values(values, default, capacity, where, error)
        return RequestPolicy(default=default, valid_values=values)
    if range_raw is not None:
        valid_range = _range(range_raw, f"{where}.validRange", error)
        _check_range(valid_range, default, capacity, where, error)
        return RequestPolicy(default=default, valid_range=valid_range)
    return RequestPolicy(default=default)


def _check_values(
    values: tuple[Fraction, ...], default: Fraction | None, capacity: Fraction, where: str, error: type[Exception]
) -> None:
    for i in range(1, len(values)):
        if values[i] <= values[i - 1]:
            raise error(f"{where}.validValues[{i}]: values must be unique and sorted in ascending order")
    if values[-1] > capacity:
        raise error(f"{where}.validValues: option {format_quantity(values[-1])} is larger than the capacity value")
    if default is None:
        raise error(f"{where}.default: required when validValues is defined")
    if default not in values:
        raise error(f"{where}.default: {format_quantity(default)} is not one of validValues")


def _range(raw: Any, where: str, error: type[Exception]) -> ValidRange:
    if not isinstance(raw, Mapping):
        raise error(f"{where} must be an object, got {show(raw)}")
    if raw.get("min") is None:
        raise error(f"{where}.min: required when validRange is defined")
    return ValidRange(
        min=non_negative_amount(raw["min"], f"{where}.min", error),
        max=_optional(raw.get("max"), f"{where}.max", error),
        step=_optional(raw.get("step"), f"{where}.step", error),
    )


def _check_range(
    rng: ValidRange, default: Fraction | None, capacity: Fraction, where: str, error: type[Exception]
) -> None:
    at = f"{where}.validRange"
    if default is None:
        raise error(f"{where}.default: required when validRange is defined")
    if rng.min > capacity:
        raise error(f"{at}.min: is larger than the capacity value")
    if default < rng.min:
        raise error(f"{where}.default: is less than validRange.min")
    if rng.max is not None:
        if rng.min > rng.max:
            raise error(f"{at}.max: min is larger than max")
        if rng.max > capacity:
            raise error(f"{at}.max: is larger than the capacity value")
        if default > rng.max:
            raise error(f"{where}.default: is more than validRange.max")
    if rng.step is None:
        return
    if rng.step <= 0:
        raise error(f"{at}.step: must be greater than zero")
    if rng.min + rng.step > capacity:
        raise error(f"{at}.step: one step above min is larger than the capacity value")
    for name, value in (("default", default), ("max", rng.max)):
        if value is not None and (value - rng.min) % rng.step != 0:
            raise error(f"{at}.step: {name} {format_quantity(value)} is not min plus a whole number of steps")


def _optional(value: Any, where: str, error: type[Exception]) -> Fraction | None:
    return None if value is None else non_negative_amount(value, where, error)
