"""DeviceQuota and ClusterDeviceQuota objects: parsed and checked (`devicequota`), what a quota
counts (`scope`), the `hard`s in force on a schedule (`windows`, `cron`), and the advice a
denial gives (`advice`). Imports `quota.values` and `quota.cel` (a scope's selectors); not the
inventory, which is its sibling floor `quota.devices`.
"""
