"""The one authoritative ledger and what it keeps: every claim's charge against every quota
(`ledger`; its entries and their sums in `ledgerentry`), a relist swapped in at once
(`claimsrebuild`), teams over labelled namespaces (`teams`), Kueue Workloads (`workloads`), the
reservations persisted on a quota's status (the record in `reservationrecord`, the watermark
protocol and its decision in `reservations`, an allocation's `excess`), the leases of headroom
one replica admits against (`headroom`), usage for the metrics (`usage`) and showback's seconds
(`showback`). Imports `quota.pricing` and the floors below it; not admission, status or reports.
"""
