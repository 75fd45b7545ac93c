"""The e2e tests' Kubernetes client: :mod:`devcluster.kube`, shared with `dra-quota demo`."""

from devcluster.kube import MERGE_PATCH, ApiError, Kube, Obj, WaitTimeout, poll, resource_path

__all__ = ["ApiError", "Kube", "MERGE_PATCH", "Obj", "WaitTimeout", "poll", "resource_path"]
