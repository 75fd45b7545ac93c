"""The domain's value types and the rules for reading Kubernetes JSON, shared by every floor.

Holds identifiers, devices and charges (`model`), exact quantities (`quantity`), defensive
reads of raw JSON (`raw`), the API server's field rules (`validation`), object envelopes and
label selectors (`meta`, `labelselector`), Go durations, the work budgets that bound what one
tenant object may cost (`work`), and two bounded tables (`lru`, `interning`). The bottom floor:
it imports nothing else of `quota`.
"""
