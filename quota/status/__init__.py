"""What the controllers publish on the API server and read back: a DeviceQuota's status
(`quotastatus`) and the published status as `dra-quota top` rows (`published`), a team's copies
in its member namespaces (`applied`, `appliedplan`), the per-namespace breakdown's cap
(`breakdown`), Lease records for leader election (`leases`) and who gets the next requeue write
(`requeueing`). Imports `quota.accounting` and below; never `quota.admission`, its sibling.
"""
