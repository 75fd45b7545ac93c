"""The floor of one-write admission: what one webhook call per create costs, whatever the webhook does.

The target (docs/development/one-write.md) is claim creates through the API server, our
webhooks and a DeviceQuota in scope, at >= 0.8x the rate of a namespace with only a
ResourceQuota, and API-server CPU per create <= 1.5x ResourceQuota's. Every design of
ours makes at least one webhook call per create (a quota whose prices come from CEL
selectors over the inventory cannot be checked in the API server's process). This
measures what that one call costs on its own, with a webhook that does nothing: a
separate Python process (aiohttp over TLS 1.2+, as `serve` listens) answering every
review at once, no parsing beyond the JSON, no pricing, no writes. Its numbers bound
every design from above: no webhook of ours can be cheaper.

Modes, alternating phases in one run (bench/admission.py's (c) harness: 16 creates in
flight, the same one-GPU claim, the API server's own metrics and each process's CPU):
- plain: no admission webhook and no quota at all (the ceiling);
- resourcequota: only an in-tree ResourceQuota (the baseline the target is a ratio of);
- floor-validating: one validating call to the do-nothing webhook (the validating
  design had one such call per create, plus the leader's charge patch);
- floor-mutating: one mutating call to the do-nothing webhook, answering with a JSON
  patch that sets the charge annotations (the one-write design's floor: reserve and
  annotate in the create itself, no second write);
- webhook, webhook-noquota: `dra-quota serve` itself in the validating design, the
  configuration before one write per create (`validating_design`: claim CREATE on the
  validating quota hooks, the leader patches the charge on), with and without a
  DeviceQuota in scope (as (c) measured it before the switch);
- one-write: `serve` with a DeviceQuota in scope, through the shipped configuration
  (`webhook.claimadmit`, docs/development/one-write.md): a mutating call for claim CREATE that
  reserves under a fresh token and patches the charge, the quotas and the token on, and
  the validating configuration without claim CREATE (`one_write_webhooks`; its mutating
  hooks named `admit.*`, so the API server's metrics tell them apart in one run). The
  leader writes nothing to these claims: the phase checks they carry the charge and a
  token, that the API server saw no PATCH of claims, and the DeviceQuota's record stays
  small.

Not a timed test: `python bench/floor.py [--seconds S] [--rounds N] [--nodes N]`; results
also in bench/results/floor.json.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import gc
import json
import os
import ssl
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from admission import (  # noqa: E402
    CHARGED, ROOMY, TARGETS, Bench, apiserver_cpu, control_plane, creates_per_second, device_quota, enforced,
    load_average, namespace, our_webhooks, rates, resource_quota_namespace,
)

from devcluster.controlplane import WEBHOOK_SERVICES  # noqa: E402
from quota.admission.admissiontoken import ADMISSION_ANNOTATION, is_token_key  # noqa: E402
from quota.manifests import webhook_configurations  # noqa: E402
from quota.objects.claims import CHARGE_ANNOTATION, QUOTAS_ANNOTATION  # noqa: E402
from tests.e2e.cluster import free_ports  # noqa: E402
from tests.e2e.harness import ADMISSION, DQ, PLURALS, QUOTA_HOOK, QUOTA_HOOK_OPEN, RUN_LABEL  # noqa: E402
from tests.e2e.kube import Kube, poll  # noqa: E402

JSON = dict[str, Any]
FLOOR_LABEL = "bench.draquota.io/floor"
# One JSON patch for every claim of the mutating floor: they are created without annotations.
PATCH = base64.b64encode(json.dumps([{"op": "add", "path": "/metadata/annotations", "value": CHARGED}]).encode()).decode()


# -- the do-nothing webhook (its own process) ------------------------------------------------------


def hook_app() -> web.Application:
    async def answer(request: web.Request, patch: bool) -> web.Response:
        uid = json.loads(await request.read())["request"]["uid"]
        response: JSON = {"uid": uid, "allowed": True}
        if patch:
            response |= {"patchType": "JSONPatch", "patch": PATCH}
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})

    async def validate(request: web.Request) -> web.Response:
        return await answer(request, patch=False)

    async def mutate(request: web.Request) -> web.Response:
        return await answer(request, patch=True)

    app = web.Application()
    app.router.add_post("/validate", validate)
    app.router.add_post("/mutate", mutate)
    return app


def serve_hook(port: int, cert: str, key: str) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    web.run_app(hook_app(), host="127.0.0.1", port=port, ssl_context=context, access_log=None, print=None)


@asynccontextmanager
async def do_nothing_webhook(bench: Bench) -> AsyncIterator[tuple[int, int]]:
    """The do-nothing webhook in its own process: its port (once it listens) and pid."""
    port = free_ports(1)[0]
    cert, key = bench.cluster.webhook_cert
    process = await asyncio.create_subprocess_exec(sys.executable, __file__, "--serve-hook", str(port), str(cert),
                                                   str(key))
    async def listening() -> bool:
        if process.returncode is not None:
            raise RuntimeError(f"the do-nothing webhook exited ({process.returncode})")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        return True

    try:
        await poll(listening, timeout=30, what="the do-nothing webhook to listen")
        yield port, process.pid
    finally:
        process.terminate()
        await process.wait()


def floor_configs(port: int, ca: bytes) -> list[JSON]:
    """A validating and a mutating configuration, each for claims created in namespaces
    labelled FLOOR_LABEL=validating / mutating, pointed at the do-nothing webhook."""
    namespace, service = WEBHOOK_SERVICES[0]
    configs = []
    for kind, path in (("ValidatingWebhookConfiguration", "validate"), ("MutatingWebhookConfiguration", "mutate")):
        hook: JSON = {
            "name": f"{path}.floor.bench.draquota.io",
            "clientConfig": {"service": {"namespace": namespace, "name": service, "path": f"/{path}", "port": port},
                             "caBundle": base64.b64encode(ca).decode()},
            "rules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["resourceclaims"], "scope": "Namespaced"}],
            "failurePolicy": "Fail", "sideEffects": "None", "timeoutSeconds": 5, "admissionReviewVersions": ["v1"],
            "namespaceSelector": {"matchLabels": {FLOOR_LABEL: f"{path[:-1]}ing"}},
        }
        if kind.startswith("Mutating"):
            hook["reinvocationPolicy"] = "Never"
        configs.append({"apiVersion": ADMISSION, "kind": kind, "metadata": {"name": f"floor-{path}"},
                        "webhooks": [hook]})
    return configs


# -- the two designs' configurations ------------------------------------------------------------------

ADMIT_HOOKS = {QUOTA_HOOK: "admit.resourceclaims.draquota.io", QUOTA_HOOK_OPEN: "admit-ungoverned.resourceclaims.draquota.io"}
# The validating design's quota hooks judged claims and templates together (one hook a
# failure domain); the shipped configuration keeps the templates' on their own.
TEMPLATE_HOOKS = {QUOTA_HOOK.replace(".resourceclaims.", ".resourceclaimtemplates."): QUOTA_HOOK,
                  QUOTA_HOOK_OPEN.replace(".resourceclaims.", ".resourceclaimtemplates."): QUOTA_HOOK_OPEN}


def one_write_shipped() -> list[JSON]:
    """The shipped configurations (one write per create, docs/development/one-write.md), the mutating
    claim CREATE hooks named `admit.*` here, so that the API server's metrics tell their
    calls from the validating design's quota hooks in the same run."""
    configs = copy.deepcopy(list(webhook_configurations()))
    renamed = [hook for config in configs if config["kind"] == "MutatingWebhookConfiguration"
               for hook in config["webhooks"] if hook["name"] in ADMIT_HOOKS]
    for hook in renamed:
        assert hook["clientConfig"]["service"]["path"] == "/admit", hook
        hook["name"] = ADMIT_HOOKS[hook["name"]]
    assert len(renamed) == len(ADMIT_HOOKS)
    for config in configs:
        if config["kind"] == "MutatingWebhookConfiguration":
            config["metadata"]["name"] = "dra-quota-admit"
    return configs


def validating_design() -> list[JSON]:
    """The shipped configurations as they were before one write per create: no mutating
    configuration; claim CREATE judged by the validating quota hooks with templates
    (`/validate`, the reservation keyed by the claim's uid), the leader patching the
    charge on once the claim exists."""
    configs = [c for c in copy.deepcopy(list(webhook_configurations())) if c["kind"] != "MutatingWebhookConfiguration"]
    merged = [hook for config in configs for hook in config["webhooks"] if hook["name"] in TEMPLATE_HOOKS]
    for hook in merged:
        hook["name"] = TEMPLATE_HOOKS[hook["name"]]
        hook["rules"] = [{**rule, "resources": ["resourceclaims", "resourceclaimtemplates"]} for rule in hook["rules"]]
    assert len(merged) == len(TEMPLATE_HOOKS)
    return configs


def one_write_webhooks(bench: Bench) -> contextlib.AbstractAsyncContextManager[str]:
    """`one_write_shipped` pointed at `serve`, as `our_webhooks` (another run label)."""
    return our_webhooks(bench, one_write_shipped(), name_suffix="onewrite")


async def one_write_check(kube: Kube, ns: str) -> JSON:
    """What the one-write phases left: how many claims carry the charge, the quotas and a
    token (all of them should), distinct tokens, and the DeviceQuota's record now."""
    claims = await kube.list("resource.k8s.io/v1", "resourceclaims", namespace=ns)
    notes = [c["metadata"].get("annotations") or {} for c in claims]
    quota = await kube.get(DQ, "devicequotas", "gpus", namespace=ns)
    held = (quota.get("status") or {}).get("reservations") or {}
    out = {"claims": len(claims), "charged": sum(CHARGE_ANNOTATION in a and QUOTAS_ANNOTATION in a for a in notes),
           "tokens": len({a[ADMISSION_ANNOTATION] for a in notes if ADMISSION_ANNOTATION in a}),
           "quotas_annotation": sorted({a.get(QUOTAS_ANNOTATION, "") for a in notes}),
           "charge_annotation": sorted({a.get(CHARGE_ANNOTATION, "") for a in notes}),
           "entries_after": len(held), "token_entries_after": sum(is_token_key(k) for k in held),
           "lease_entries_after": sum(r.get("source") == "Lease" for r in held.values())}
    print(f"  one-write: {out}")
    return out


# -- the run -----------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> JSON:
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
        async with control_plane(args, Path(tmp)) as bench, do_nothing_webhook(bench) as (port, hook_pid):
            gc.collect()
            gc.freeze()  # the generator's long-lived data: no full collections of it while measuring
            configs = floor_configs(port, bench.cluster.ca_file.read_bytes())
            for config in configs:
                await bench.kube.create(ADMISSION, PLURALS[config["kind"]], config)
            try:
                async with our_webhooks(bench, validating_design()) as ours_run, \
                        one_write_webhooks(bench) as one_write_run:
                    ours = await namespace(bench.kube, "floor-webhook", {RUN_LABEL: ours_run})
                    await device_quota(bench.kube, ours, ROOMY)
                    unquoted = await namespace(bench.kube, "floor-webhook-noquota", {RUN_LABEL: ours_run})
                    one_write = await namespace(bench.kube, "floor-one-write", {RUN_LABEL: one_write_run})
                    await device_quota(bench.kube, one_write, ROOMY)
                    modes = {
                        "plain": await namespace(bench.kube, "floor-plain"),
                        "resourcequota": await resource_quota_namespace(bench.kube, "floor-resourcequota"),
                        "floor-validating": await namespace(bench.kube, "floor-validating", {FLOOR_LABEL: "validating"}),
                        "floor-mutating": await namespace(bench.kube, "floor-mutating", {FLOOR_LABEL: "mutating"}),
                        "webhook": ours,
                        "webhook-noquota": unquoted,
                        "one-write": one_write,
                    }
                    if args.modes:  # a subset (to profile one), beside the baseline the ratios need
                        modes = {m: ns for m, ns in modes.items() if m in {"resourcequota", *args.modes.split(",")}}
                    await enforced(bench, ours)
                    await enforced(bench, one_write)
                    print(f"\ncreates through the API server, {args.workers} in flight, {args.rounds} rounds of "
                          f"{args.seconds:.0f} s per mode; load average {load_average()}")
                    # Every claim but those our webhooks see carries its charge (the mutating
                    # floor's get it from the patch), so the leader writes nothing to them.
                    charged = {modes[m] for m in ("plain", "resourcequota", "floor-validating") if m in modes}
                    phases = await creates_per_second(bench, args.seconds, args.rounds, args.workers, modes,
                                                      charged=charged, patched={"webhook", "webhook-noquota"},
                                                      more_pids={"floor-hook": hook_pid},
                                                      quotas={"webhook", "one-write"})
                    checked = await one_write_check(bench.kube, one_write)
            finally:
                for config in configs:
                    await bench.kube.delete(ADMISSION, PLURALS[config["kind"]], config["metadata"]["name"])
    rate, cpu = rates(phases), apiserver_cpu(phases)
    base_rate, base_cpu = rate["resourcequota"], cpu["resourcequota"]
    print(f"\nagainst only a ResourceQuota ({base_rate:.1f} creates/s, API server {base_cpu:.2f} ms CPU a create); "
          f"targets: rate >= {TARGETS['c_ratio']}x, API server CPU <= {TARGETS['c_cpu_ratio']}x")
    summary: JSON = {}
    for mode in modes:
        summary[mode] = {"creates_per_s": round(rate[mode], 1), "ratio": round(rate[mode] / base_rate, 3),
                         "apiserver_cpu_ms": round(cpu[mode], 3), "apiserver_cpu_ratio": round(cpu[mode] / base_cpu, 3)}
        print(f"  {mode:<17} {rate[mode]:7.1f}/s  ratio {rate[mode] / base_rate:.2f}  "
              f"API server CPU {cpu[mode]:.2f} ms a create, {cpu[mode] / base_cpu:.2f}x")
    for mode in ("webhook", "one-write"):
        rows = phases.get(mode, [])
        print(f"  {mode}: serve CPU ms a create {[r['cpu_ms_per_create']['serve'] for r in rows]}, leader PATCHes "
              f"{[r['annotation_patch_calls'] for r in rows]}, the DeviceQuota at most "
              f"{[r.get('max_entries') for r in rows]} entries, {[r.get('max_bytes') for r in rows]} bytes")
    print(f"load average {load_average()}")
    return {"one_write": checked, "nodes": args.nodes, "lease_period": args.lease_period, "workers": args.workers,
            "seconds": args.seconds, "rounds": args.rounds, "cores": os.cpu_count(), "summary": summary,
            "phases": phases, "load_average_end": load_average()}


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--serve-hook":
        serve_hook(int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500, help="inventory size (8 GPUs a node)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per mode")
    parser.add_argument("--workers", type=int, default=16, help="creates in flight")
    parser.add_argument("--lease-period", type=float, default=None,
                        help="serve's --lease-period (its default unless given; 0: no leases, every admission "
                             "writes its entry, so the DeviceQuota's record shows whether entries settle)")
    parser.add_argument("--modes", default="", help="only these modes (comma-separated) and resourcequota")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "floor.json")
    args = parser.parse_args()
    args.reservation_ttl = None  # serve's default (bench/admission.py's control_plane)
    results = asyncio.run(run(args))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results written to {args.output}")


if __name__ == "__main__":
    main()
