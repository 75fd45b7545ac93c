"""The Kubernetes objects a tenant or a driver writes, parsed into values: ResourceClaims and
their templates and DeviceClasses (`claims`, `claimspec`, `jsonclaims`), ResourceSlices
(`slices`, `requestpolicy`), the claims behind a Pod's extended resources (`extended`), the
allocation record we keep on a claim (`allocationrecord`), Pods waiting for a template's claim
(`waiting`), older API versions read as v1 (`conversion`) and strict field validation
(`knownfields`). Imports only `quota.values`; knows nothing of quotas, CEL or prices.
"""
