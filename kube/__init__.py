"""The Kubernetes API, as webhook and controllers share it: the client (`api`), watches and their
stores (`watching`, `caches`, `claimstore`, `rebuilds`), the one DeviceQuota status writer
(`statuswriter`) and the reservations on it (`quotawriter`), Events (`events`), the
AdmissionReview wire format (`admissionreview`). Imports `runtime` and `quota`."""
