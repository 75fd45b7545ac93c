"""What a claim costs: estimated before its allocation (`pricer`) from the candidates of each
request, a device's capacity rules (`capacity`) and a node's shared counters (`counters`), and
exact from its allocation (`allocated`); a priced claim as each quota scope sees it
(`priced`). Imports the floors below (`quota.devices`, `quota.quotas`, `quota.objects`,
`quota.values`); knows nothing of the ledger, admission or status.
"""
