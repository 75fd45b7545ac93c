"""The DRA CEL environment: device selectors evaluated as kube-scheduler does.

Imports only `quota.values`. Public API (used by the selectors of `quota.devices` and by
`quota.quotas.scope`)::

    sel = compile_selector(expr)      # LRU-cached; CelCompileError
    act = device_activation(device)   # once per quota.values.model.Device
    sel.evaluate(act) -> bool         # CelRuntimeError
    sel.evaluate_with_cost(act, cost_limit=n) -> (bool, cost)   # one budget over many devices
    sel.references                    # frozenset[DevicePath] | None

Parsing builds on cel-python's grammar (`celpy/cel.lark`); see README.md in this
package for the supported language, the gaps against the scheduler and the numbers.
"""

from quota.cel.activation import DeviceActivation, device_activation
from quota.cel.references import DevicePath
from quota.cel.runtime import COST_EXCEEDED, COST_LIMIT
from quota.cel.selector import (
    MAX_EXPRESSION_BYTES,
    CelCompileError,
    CelRuntimeError,
    CompiledSelector,
    compile_selector,
)

__all__ = [
    "COST_EXCEEDED",
    "COST_LIMIT",
    "MAX_EXPRESSION_BYTES",
    "CelCompileError",
    "CelRuntimeError",
    "CompiledSelector",
    "DeviceActivation",
    "DevicePath",
    "compile_selector",
    "device_activation",
]
