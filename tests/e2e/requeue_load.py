"""What a tenant's waiting Pods make the leader's requeue do: shared by test_requeue_budget.py and bench/budget_requeue.py.

The requeue (`controllers.requeue`) answers each deleted claim by touching the
ResourceClaimTemplates some unscheduled Pod waits on. A tenant with `edit` controls how
many templates wait, how large they are and how large its unscheduled Pods are; these
helpers build such a tenant's objects (`padded_template`, `fat_pod`) and measure what
serve did about them: its template writes, read from the API server's audit log
(devcluster.controlplane AUDIT_POLICY records every template patch), and its peak RSS
(`RssPeak`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

from .cluster import ControlPlane
from .driver import RESOURCE_V1, claim_spec, exact_request, pod_body
from .harness import Served
from .kube import Obj


def padded_template(name: str, device_class: str, *, count: int, pad: int) -> Obj:
    """A template of one claim of `count` GPUs, with `pad` bytes of annotation."""
    return {"apiVersion": RESOURCE_V1, "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "annotations": {"pad": "x" * pad} if pad else {}},
            "spec": {"spec": claim_spec(exact_request("gpu", device_class, count=count))}}


def fat_pod(name: str, template: str, node_selector: dict[str, str], *, pad: int) -> Obj:
    """A Pod using `template`, `pad` bytes of it in environment values (annotations cap at 256 KiB)."""
    body: Obj = {"apiVersion": "v1", **pod_body(name, template=template, node_selector=node_selector)}
    piece = 200_000
    body["spec"]["containers"][0]["env"] = [{"name": f"PAD{i}", "value": "x" * min(piece, pad - i * piece)}
                                            for i in range((pad + piece - 1) // piece)]
    return body


def template_writes(cluster: ControlPlane, namespaces: Iterable[str]) -> list[Obj]:
    """Every completed patch of a ResourceClaimTemplate in `namespaces` not made by a tenant
    (tenants are impersonated): serve's, as the leader's requeue writes them."""
    wanted = set(namespaces)
    return [e for e in cluster.audit_events()
            if e.get("stage") == "ResponseComplete" and e.get("verb") == "patch"
            and (e.get("objectRef") or {}).get("resource") == "resourceclaimtemplates"
            and (e.get("objectRef") or {}).get("namespace") in wanted and not e.get("impersonatedUser")]


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


class RssPeak:
    """The highest RSS of serve since `start` above its RSS then, in bytes: VmRSS sampled
    every 20 ms, and VmHWM (the kernel's own peak) once it rose past where it stood."""

    def __init__(self, served: Served) -> None:
        assert served.process is not None
        self._pid = served.process.pid
        self._base = self._hwm = self._peak = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._base = self._peak = status_kib(self._pid, "VmRSS")
        self._hwm = status_kib(self._pid, "VmHWM")
        self._task = asyncio.create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            self._peak = max(self._peak, status_kib(self._pid, "VmRSS"))
            await asyncio.sleep(0.02)

    async def stop(self) -> int:
        """The growth, in bytes."""
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        hwm = status_kib(self._pid, "VmHWM")
        peak = max(self._peak, hwm if hwm > self._hwm else 0)
        return (peak - self._base) * 1024
