"""The devices a cluster publishes and the CEL selectors over them: the inventory of
ResourceSlices by pool (`inventory`), memory where a driver publishes none (`memorysources`),
per-pool columns and partitions of equal devices (`columns`, `partitions`), selector verdicts
per group (`verdicts`), equality indexes (`equality`), and the matcher that answers which
devices a chain of selectors picks (`selectors`). Imports `quota.values`, `quota.objects` and
`quota.cel`; knows nothing of quotas or prices.
"""
