"""A throw-away Kubernetes control plane on loopback, with fake GPU nodes and a fake DRA driver.

Shared by the end-to-end tests (tests/e2e re-exports these modules under their old names)
and `dra-quota demo`: `controlplane` starts the Go-built minik8s etcd, kube-apiserver,
kube-scheduler and kube-controller-manager (the binary from `binary`, each process a
`processes.Component`); `kube` is the admin client on top of
`kube.api`; `driver` creates kubelet-less Nodes and publishes ResourceSlices;
`webhooks` routes the shipped webhook configurations to a local `dra-quota serve`.
It does I/O, so it is not part of quota's pure domain.
"""
