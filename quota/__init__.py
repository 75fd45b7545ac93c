"""quota: the pure domain (inventory, CEL selectors, pricing, DeviceQuota, ledger); no I/O, no asyncio."""
