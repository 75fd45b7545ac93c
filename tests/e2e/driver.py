"""The e2e tests' fake GPU nodes and DRA driver: :mod:`devcluster.driver`, shared with `dra-quota demo`."""

from devcluster.driver import (
    DRIVER,
    FLEET_LABEL,
    POD_IMAGE,
    RESOURCE_V1,
    Gpu,
    GpuFleet,
    allocation_results,
    claim_spec,
    create_claim,
    create_claim_template,
    create_device_class,
    create_fleet,
    create_node,
    create_pod,
    exact_request,
    free_pod,
    generated_claim_name,
    gpu_devices,
    pod_body,
    publish_node_slice,
    wait_pod_allocated,
)

__all__ = ["DRIVER", "FLEET_LABEL", "POD_IMAGE", "RESOURCE_V1", "Gpu", "GpuFleet", "allocation_results",
           "claim_spec", "create_claim", "create_claim_template", "create_device_class", "create_fleet",
           "create_node", "create_pod", "exact_request", "free_pod", "generated_claim_name", "gpu_devices",
           "pod_body", "publish_node_slice", "wait_pod_allocated"]
