"""The demo's scenario played on the live cluster: examples/ published, each step, the usage table.

Neighbours: `commands.demo` starts the control plane and `serve`, then calls
`publish_examples` and `play_step` for each `Step` of `commands.demoplan.SCENARIO`; the
claims come from examples/40-claims.yaml; `quota.status.published` reads each DeviceQuota's status
into the rows printed (`usage`). Nothing here asserts outcomes: it reports what the
cluster did.
"""

from __future__ import annotations

import fnmatch
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from commands.demoplan import TEAMS, DemoError, DemoRun, Step, examples
from devcluster.driver import RESOURCE_V1, create_node, create_pod, free_pod
from devcluster.kube import ApiError, Kube, poll
from quota.manifests import documents
from quota.objects.claims import CHARGE_ANNOTATION
from quota.quotas.devicequota import GOVERNED_LABEL, format_amount
from quota.reports.tables import USAGE_HEADERS, print_rows, usage_cells
from quota.status.published import quota_usage
from quota.values.raw import Obj

__all__ = ["DQ", "KINDS", "play_step", "publish_examples", "usage"]

DQ = "draquota.io/v1alpha1"

# Where each kind of examples/ goes: (apiVersion, plural). Claims are created by the scenario.
KINDS = {
    "DeviceClass": (RESOURCE_V1, "deviceclasses"),
    "ResourceSlice": (RESOURCE_V1, "resourceslices"),
    "Namespace": ("v1", "namespaces"),
    "DeviceQuota": (DQ, "devicequotas"),
}


async def publish_examples(state: DemoRun, kube: Kube) -> str:
    counts: dict[str, int] = {}
    nodes: list[str] = []
    published = (f for f in examples().iterdir() if fnmatch.fnmatch(f.name, "[0-3]*.yaml"))
    for path in sorted(published, key=lambda f: f.name):
        for doc in documents(path):
            kind = doc.get("kind", "")
            if kind not in KINDS:
                continue
            api_version, plural = KINDS[kind]
            meta = doc["metadata"]
            team = meta["name"] if kind == "Namespace" else meta.get("namespace")
            if team is not None and team not in TEAMS:
                # Only the scenario's teams: `research`'s admin-access label needs an allowlist entry.
                continue
            await kube.create(api_version, plural, {k: v for k, v in doc.items() if k != "status"},
                              namespace=meta.get("namespace"))
            counts[kind] = counts.get(kind, 0) + 1
            node = (doc.get("spec") or {}).get("nodeName") if kind == "ResourceSlice" else None
            if node and node not in nodes:
                # The node the driver's slice names, as a kubelet would register it (no kubelet here).
                await create_node(kube, node)
                nodes.append(node)
    counts["Node"] = len(nodes)
    for team in TEAMS:
        # Pods are refused until the namespace's "default" ServiceAccount exists.
        await kube.wait_for("v1", "serviceaccounts", "default", lambda _: True, namespace=team, timeout=60,
                            what="created")

    async def counted() -> bool:
        rows = await usage(kube)
        return bool(rows) and all(r["current"] for r in rows)

    await poll(counted, timeout=state.options.step_timeout, what="the quota controller to count every DeviceQuota")

    async def governed() -> bool:
        # The leader labels every namespace holding a DeviceQuota: from then on its claims
        # go to the webhooks that fail closed (docs/install.md, "Failure modes").
        quoted = {r["namespace"] for r in await usage(kube)}
        labels = [((await kube.get("v1", "namespaces", n))["metadata"].get("labels") or {}) for n in quoted]
        return all(label.get(GOVERNED_LABEL) == "true" for label in labels)

    await poll(governed, timeout=state.options.step_timeout, what="the leader to label the teams' namespaces governed")
    return ", ".join(f"{n} {k}{'es' if k.endswith('s') else 's'}" for k, n in counts.items())


async def play_step(state: DemoRun, kube: Kube, number: int, step: Step,
                     claims: Mapping[tuple[str, str], Obj]) -> None:
    indent = " " * 10
    assert state.cluster is not None and state.serve is not None
    state.cluster.check_alive()
    if state.serve.exited() is not None:
        raise DemoError(f"dra-quota serve exited with {state.serve.exited()}; its log: {state.serve_log}")
    state.say(f"\nstep {number}/{len(state.options.scenario)}  {step.says}")
    record: dict[str, Any] = {"step": number, "team": step.team, "claim": step.claim, "pod": step.pod}
    before = {(r["namespace"], r["name"]): r for r in await usage(kube)}
    if step.delete:
        await free_pod(kube, step.team, step.pod, timeout=state.options.step_timeout)
        await kube.delete(RESOURCE_V1, "resourceclaims", step.claim, namespace=step.team)
        await kube.wait_deleted(RESOURCE_V1, "resourceclaims", step.claim, namespace=step.team,
                                timeout=state.options.step_timeout)
        record["decision"] = "deleted"
        state.say(f"{indent}Pod {step.pod} and ResourceClaim {step.claim} deleted: its devices are free again")
    else:
        source = claims[(step.team, step.claim)]
        body = {"kind": "ResourceClaim", "metadata": {"name": step.claim}, "spec": source["spec"]}
        try:
            await kube.create(RESOURCE_V1, "resourceclaims", body, namespace=step.team)
        except ApiError as err:
            if err.status not in (403, 422):
                raise
            record.update(decision="denied", message=err.message)
            state.say(f"{indent}DENIED by the webhook: {err.message}")
        else:
            # The mutating webhook wrote the charge into the claim in its create (the leader
            # writes it only on a claim that arrived without one).
            async def annotated() -> str | None:
                claim = await kube.get(RESOURCE_V1, "resourceclaims", step.claim, namespace=step.team)
                value = (claim["metadata"].get("annotations") or {}).get(CHARGE_ANNOTATION)
                return value if isinstance(value, str) else None

            charge = json.loads(await poll(annotated, timeout=state.options.step_timeout,
                                           what="the claim's charge annotation"))
            record.update(decision="admitted", charge=charge)
            state.say(f"{indent}admitted by the webhook, reserving its charge: "
                      + ", ".join(f"{k}={format_amount(k, v)}" for k, v in charge.items()))

            async def reserved() -> list[dict[str, Any]] | None:
                mine = [r for r in await usage(kube) if r["namespace"] == step.team]
                keys = [(r["namespace"], r["name"]) for r in mine]
                return mine if any(r["reserved"] != before[k]["reserved"] for r, k in zip(mine, keys)) else None

            # Before any Pod uses it: the claim's charge is reserved on the DeviceQuota status.
            for row in await poll(reserved, timeout=state.options.step_timeout, what="the reservation on the status"):
                memory_cell, devices_cell = usage_cells(row)
                state.say(f"{indent}{row['namespace']}/{row['name']} used/reserved/hard: memory {memory_cell}, "
                          f"devices {devices_cell}")
            t0 = time.monotonic()
            await create_pod(kube, step.team, step.pod, claim=step.claim)
            allocated = await kube.wait_for(
                RESOURCE_V1, "resourceclaims", step.claim, lambda c: bool((c.get("status") or {}).get("allocation")),
                namespace=step.team, timeout=state.options.step_timeout, what="allocated by kube-scheduler")
            devices = [f"{r['pool']}/{r['device']}" for r in allocated["status"]["allocation"]["devices"]["results"]]
            record["devices"] = devices
            state.say(f"{indent}Pod {step.pod} scheduled; kube-scheduler allocated {', '.join(devices)} "
                      f"({time.monotonic() - t0:.1f}s)")
    if record["decision"] != "denied":
        t0 = time.monotonic()

        async def moved() -> list[dict[str, Any]] | None:
            rows = await usage(kube)
            mine = [r for r in rows if r["namespace"] == step.team]
            changed = any(r["used"] != before.get((r["namespace"], r["name"]), {}).get("used") for r in mine)
            settled = all(r["current"] and r["claims"]["pending"] == 0 for r in mine)
            return rows if changed and settled else None

        await poll(moved, timeout=state.options.step_timeout, what=f"{step.team}'s DeviceQuota usage to move")
        state.say(f"{indent}usage counted by the quota controller ({time.monotonic() - t0:.1f}s)")
    rows = [r for r in await usage(kube) if r["namespace"] in TEAMS]
    record["usage"] = rows
    state.steps.append(record)
    table: list[tuple[str, ...]] = [("NAMESPACE", "QUOTA", *USAGE_HEADERS, "CLAIMS allocated/pending")]
    table.extend((r["namespace"], r["name"], *usage_cells(r), f"{r['claims']['allocated']} / {r['claims']['pending']}")
                 for r in rows)
    stream = sys.stderr if state.options.output == "json" else state.out
    print_rows(table, stream, indent=indent)


async def usage(kube: Kube) -> list[dict[str, Any]]:
    rows = [quota_usage(q) for q in await kube.list(DQ, "devicequotas")]
    return sorted(rows, key=lambda r: (r["namespace"], r["name"]))
