"""dra-quota domain: inventory, CEL selectors, pricing, DeviceQuota, ledger (pure) and the controller."""
