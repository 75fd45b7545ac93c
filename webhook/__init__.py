"""The admission webhook: what answers AdmissionReviews (and /metrics) over HTTPS. The server and its
connections, the routes (`endpoints`), the checks of claims, Pods, namespaces and the adminAccess
policy, the serving certificate, the metrics. Imports `kube`, `runtime`, `quota`, `certs`; never `controllers`."""
