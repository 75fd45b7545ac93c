"""What runs in the background, beside the webhook: leader election (`leader`), the quota
controller (`quotas`), the claim annotator and allocation records (`annotator`, `refine`), the
requeue of waiting Pods (`requeue`), the Kueue AdmissionCheck controller (`kueue`), governed
namespaces' labels (`governed`). Imports `kube`, `runtime`, `quota`; never `webhook`."""
