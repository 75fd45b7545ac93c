"""quota: the pure domain of dra-quota; no I/O, no event loop, no network.

Its floors, bottom first; each imports only the floors below it (the `layers` contract in
pyproject.toml holds them to that), and siblings on one floor not each other:

- `values`: identifiers, devices, charges, quantities, field rules, object metadata, budgets.
- `objects` | `cel`: the Kubernetes objects a tenant or a driver writes, parsed; the CEL of
  device selectors.
- `quotas` | `devices`: DeviceQuotas and their windows and scopes; the device inventory and
  the selectors over it.
- `pricing`: what a claim costs, estimated before its allocation and exact from it.
- `accounting`: the ledger of every claim's charge against every quota, reservations, leases
  of headroom, teams, usage and showback.
- `admission` | `status`: the decisions for a tenant's object; what the controllers publish.
- `reports`: `dra-quota check`, `report` and the tables the command line prints.

`version` (the installed distribution's) and `manifests` (the CRDs and webhook configurations,
as package data) stand apart.
"""
