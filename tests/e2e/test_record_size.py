"""A burst of creates keeps the DeviceQuota small and never above `hard`.

Until 0.2 each admission's entry stayed on `status.reservations` for a 60 s TTL, about
280 bytes an entry as stored: the ~940 creates of a one-minute burst passed 256 KiB, and
every status write rewrote all of it. Now an entry goes once the writer's own claim cache
holds its claim carrying the charge (docs/development/reservations.md). Here `serve` (one process,
the shipped webhooks) takes BURST creates of one 80Gi GPU into a quota with room, CLIENTS
clients (test_replicas.py's) with IN_FLIGHT in flight between them, while FILL creates of the same size go
at a quota of `hard` = K x 80Gi in a second namespace.

Asserted on every sample of both DeviceQuotas (read every SAMPLE_EVERY seconds while the
burst runs, and once after):
- the object is at most `bound()` bytes as the API server sends it: the object with an
  empty record, plus MAX_ENTRIES (the most entries `quota.accounting.reservations.apply` ever keeps,
  and the CRD's maxProperties) entries of the longest this test makes, plus 4 KiB for the
  rest of the status to grow. A size, not a time: no interleaving can pass it. It is well
  under 256 KiB, which the old record passed after ~940 of these creates within a minute
  (its TTL). BURST (1,100) is also more than MAX_ENTRIES: a record that kept entries for a
  TTL would refuse creates past the 1,000th, so the next assertion catches it too;
- `used + reserved <= hard` on the filling quota (and on the other, trivially);
and after the burst: the filling quota admitted exactly K of its FILL claims (the rest
denied with its message), every claim of the quota with room was admitted, and the
record empties once every claim is cached with its charge (written in the create itself,
by the mutating webhook: the entries are keyed by the admission's token). The largest size seen is
printed (a figure, never asserted against a time).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets

import pytest

from quota.accounting.reservationrecord import MAX_ENTRIES, Reservation
from quota.admission.admissiontoken import ADMISSION_ANNOTATION, is_token_key, token_key
from quota.values.model import Charge
from quota.values.quantity import parse_quantity

from .driver import RESOURCE_V1
from .harness import CLIENTS, DQ, QUOTA_HOOK, RUN_LABEL, MakeNamespace, Setup, claim_body, governed
from .kube import ApiError, Kube, Obj, poll

pytestmark = pytest.mark.e2e

GPU = 80 * 1024**3
BURST = 1100
FILL = 60
K = 40
IN_FLIGHT = 32
SAMPLE_EVERY = 0.2  # seconds between samples: a sampling period, never a wait for a condition
SLACK = 4096  # bytes the rest of the status may grow by (conditions, numbers)


def size(obj: Obj) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def bound(empty: Obj, namespace: str, longest_name: str) -> int:
    """The largest the DeviceQuota can be: `empty` with MAX_ENTRIES entries as long as this
    test's longest (a token's key, claim name, memory and devices of one GPU, an expiry), plus SLACK."""
    entry = Reservation(token_key(secrets.token_hex(16)), f"{namespace}/{longest_name}", Charge(GPU, 1), 1e10)
    one = len(json.dumps({entry.uid: entry.as_json()}, separators=(",", ":")))
    return size(empty) + MAX_ENTRIES * one + SLACK


def over_hard(status: Obj, hard: int) -> int:
    """Bytes by which `used + reserved` memory is above `hard` (0 or less: not above)."""
    used = int(parse_quantity(str((status.get("used") or {}).get("memory") or "0")))
    reserved = int(parse_quantity(str((status.get("reserved") or {}).get("memory") or "0")))
    return used + reserved - hard


async def quota(kube: Kube, namespace: str, memory: str) -> Obj:
    """DeviceQuota "gpus" of `hard` memory, once the leader labelled its namespace governed and
    first wrote its status (one process: its caches, which the webhook reads, hold the quota)."""
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                           "spec": {"hard": {"memory": memory}}}, namespace=namespace)
    await governed(kube, namespace)
    written: Obj = await kube.wait_for(DQ, "devicequotas", "gpus", lambda q: "used" in (q.get("status") or {}),
                                       namespace=namespace, timeout=30, what="the leader's first status")
    return written


async def test_a_burst_keeps_the_record_small_and_the_quota_within_hard(
        kube: Kube, setup: Setup, make_namespace: MakeNamespace, clients: list[Kube]) -> None:
    roomy, filling = setup.namespace, await make_namespace("serve-fill", labels={RUN_LABEL: setup.run})
    hard = K * GPU
    limits = {roomy: await quota(kube, roomy, "1000Ti"), filling: await quota(kube, filling, f"{K * 80}Gi")}
    names = {roomy: [f"burst-{i:04d}" for i in range(BURST)], filling: [f"fill-{i:04d}" for i in range(FILL)]}
    bounds = {ns: bound(obj, ns, max(names[ns], key=len)) for ns, obj in limits.items()}
    hards = {roomy: int(parse_quantity("1000Ti")), filling: hard}
    largest = {ns: 0 for ns in limits}
    stop = asyncio.Event()

    async def check(ns: str) -> None:
        obj = await kube.get(DQ, "devicequotas", "gpus", namespace=ns)
        largest[ns] = max(largest[ns], size(obj))
        assert size(obj) <= bounds[ns], (ns, size(obj), bounds[ns], len(obj["status"].get("reservations") or {}))
        assert over_hard(obj.get("status") or {}, hards[ns]) <= 0, (ns, obj.get("status"))
        # Every entry but a replica's lease is an admission's, named by its token (one write per create).
        held = obj["status"].get("reservations") or {}
        assert all(is_token_key(k) for k, r in held.items() if r.get("source") != "Lease"), held

    async def sample() -> None:
        while not stop.is_set():
            await asyncio.gather(*(check(ns) for ns in limits))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SAMPLE_EVERY)

    work = [(ns, name) for i in range(BURST) for ns, name in
            ([(roomy, names[roomy][i])] + ([(filling, names[filling][i])] if i < FILL else []))]
    outcomes: dict[tuple[str, str], str] = {}
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def create(i: int, ns: str, name: str) -> None:
        async with slots:
            try:
                made = await clients[i % CLIENTS].create(RESOURCE_V1, "resourceclaims", claim_body(setup, name),
                                                         namespace=ns)
                # The create itself carries the charge and the admission's token.
                ours = made["metadata"].get("annotations") or {}
                outcomes[(ns, name)] = "created" if {"draquota.io/charge", ADMISSION_ANNOTATION} <= set(ours) else \
                    f"created without the charge and token: {ours}"
            except ApiError as err:
                outcomes[(ns, name)] = err.message

    sampler = asyncio.create_task(sample())
    try:
        await asyncio.gather(*(create(i, ns, name) for i, (ns, name) in enumerate(work)))
    finally:
        stop.set()
        await sampler
    await asyncio.gather(*(check(ns) for ns in limits))

    refused = {k: v for k, v in outcomes.items() if k[0] == roomy and v != "created"}
    assert not refused, f"{len(refused)} creates refused under the quota with room, e.g. {next(iter(refused.items()))}"
    admitted = [k for k, v in outcomes.items() if k[0] == filling and v == "created"]
    denied = {v for k, v in outcomes.items() if k[0] == filling and v != "created"}
    assert len(admitted) == K, (len(admitted), denied)
    assert all(m.startswith(f'admission webhook "{QUOTA_HOOK}" denied the request: exceeded DeviceQuota "gpus"')
               for m in denied), denied

    async def drained() -> bool:
        objs = [await kube.get(DQ, "devicequotas", "gpus", namespace=ns) for ns in limits]
        return not any((o.get("status") or {}).get("reservations") for o in objs)

    await poll(drained, timeout=60, what="every entry to go once its claim is cached with its charge")
    print(f"largest DeviceQuota objects during the burst: {largest} bytes (bounds {bounds})")
