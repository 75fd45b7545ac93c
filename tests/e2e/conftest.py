"""Session fixtures for the end-to-end tests: one real control plane per pytest session.

The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) is
built from the k8s.io/kubernetes Go module by tests/cluster/build.sh and started on
free loopback ports by :mod:`tests.e2e.cluster`. Tests isolate by namespace (the
``namespace`` / ``make_namespace`` fixtures) and by fleet (``make_fleet``). The fixtures
of the tests that run `dra-quota serve` (``crd``, ``served``, ``setup``) are built on
:mod:`tests.e2e.harness`; a module overrides ``served`` to run it with other flags.

Failing to build or start the control plane is an ERROR of every e2e test, never a
skip: a green run must mean the tests ran.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from .cluster import ControlPlane, ControlPlaneError, build, free_ports
from .driver import Gpu, GpuFleet, create_fleet
from .harness import (
    CLIENTS, CRDS, RUN_LABEL, MakeFleet, MakeNamespace, Served, Setup, adapted_webhooks, installed, running, unique,
)
from .kube import ApiError, Kube, Obj
from .kubectl import Kubectl, KubectlError
from .kubectl import build as build_kubectl
from .kueue import API, Kueue, KueueError
from .kueue import build as build_kueue
from .queues import MakeQueueObject
from .timings import summary, write_if_asked

E2E_DIR = Path(__file__).resolve().parent

_control_plane: ControlPlane | None = None
_kueue: Kueue | None = None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run every async e2e test on the session event loop.

    The ``kube`` client (an aiohttp session) is session-scoped and bound to the session
    loop (pyproject: asyncio_default_fixture_loop_scope = "session"); tests must run on
    that loop too. This is the hook pytest-asyncio's docs recommend for it.
    """
    session_loop = pytest.mark.asyncio(loop_scope="session")
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if E2E_DIR in path.parents and pytest_asyncio.is_async_test(item):
            item.add_marker(session_loop, append=False)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Build (no-op when up to date) and start the control plane; stop it at session end."""
    global _control_plane
    problem = None
    try:
        binary = build()
    except ControlPlaneError as e:
        problem = f"cannot build the minik8s control plane:\n{e}"
    if problem:  # outside the except block: no chained traceback noise
        pytest.fail(problem, pytrace=False)
    timeout = float(os.environ.get("MINIK8S_START_TIMEOUT", "180"))
    # free_ports() closes its probe sockets before the components bind them, so
    # another process may grab one in between; retry once with fresh ports then.
    for attempt in (1, 2):
        problem = None
        cp = ControlPlane(binary=binary, workdir=tmp_path_factory.mktemp("minik8s"))
        _control_plane = cp
        try:
            cp.start(timeout=timeout)
        except ControlPlaneError as e:
            problem = f"cannot start the minik8s control plane: {e}"
        finally:
            if problem or cp.startup_seconds == 0.0:  # also on KeyboardInterrupt etc.
                cp.stop()
                _control_plane = None
        if not (problem and "address already in use" in problem and attempt == 1):
            break
    if problem:
        pytest.fail(problem, pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def kube(cluster: ControlPlane) -> AsyncIterator[Kube]:
    """Admin (system:masters) client for the control plane; plain-dict API, see kube.py."""
    async with cluster.client() as k:
        yield k


@pytest_asyncio.fixture(loop_scope="session")
async def clients(cluster: ControlPlane) -> AsyncIterator[list[Kube]]:
    """CLIENTS admin clients, each with its own connection pool (one pool serialises nothing
    then), closed after the test."""
    opened = [cluster.client() for _ in range(CLIENTS)]
    try:
        yield opened
    finally:
        for client in opened:
            await client.close()


@pytest.fixture(scope="session")
def kubectl(cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    """The real kubectl (tests/e2e/kubectl.py) with the admin kubeconfig; failing to build it
    is an ERROR of the tests that ask, never a skip."""
    problem = None
    try:
        binary = build_kubectl()
    except KubectlError as e:
        problem = f"cannot build kubectl:\n{e}"
    if problem:
        pytest.fail(problem, pytrace=False)
    return Kubectl(binary, cluster.kubeconfig, tmp_path_factory.mktemp("kubectl-cache"))


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def kueue(cluster: ControlPlane, kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Kueue]:
    """A real Kueue (tests/e2e/kueue.py), started once per session by the first test that asks.

    Failing to build or start it is an ERROR of those tests, never a skip."""
    global _kueue
    problem = None
    try:
        binary = await asyncio.to_thread(build_kueue)
    except KueueError as e:
        problem = f"cannot build Kueue:\n{e}"
    if problem:
        pytest.fail(problem, pytrace=False)
    k = Kueue(binary=binary, workdir=tmp_path_factory.mktemp("kueue"), cluster=cluster)
    _kueue = k
    try:
        await k.start(kube)
    except KueueError as e:
        problem = f"cannot start Kueue: {e}"
    if problem:
        await k.stop(kube)
        pytest.fail(problem, pytrace=False)
    try:
        yield k
    finally:
        await k.stop(kube)


@pytest_asyncio.fixture(loop_scope="session")
async def queue_objects(kueue: Kueue, kube: Kube) -> AsyncIterator[MakeQueueObject]:
    """Factory for cluster-scoped Kueue objects, deleted after the test (not awaited: a
    ClusterQueue keeps its finalizer until its Workloads are gone with the namespace)."""
    made: list[tuple[str, str]] = []

    async def make(plural: str, body: Obj) -> Obj:
        kueue.check_alive()
        created = await kube.create(API, plural, body)
        made.append((plural, created["metadata"]["name"]))
        return created

    yield make
    for plural, name in reversed(made):
        await kube.delete(API, plural, name)


@pytest_asyncio.fixture(loop_scope="session")
async def make_namespace(
    cluster: ControlPlane, kube: Kube
) -> AsyncIterator[MakeNamespace]:
    """Factory: ``await make_namespace(labels={...})`` -> a fresh namespace name, deleted after the test.

    Waits for the namespace's "default" ServiceAccount: the ServiceAccount admission
    plugin rejects pods until the serviceaccount controller has created it.
    """
    created: list[str] = []

    async def make(prefix: str = "e2e", labels: dict[str, str] | None = None) -> str:
        cluster.check_alive()
        name = unique(prefix)
        meta: Obj = {"name": name}
        if labels:
            meta["labels"] = labels
        await kube.create("v1", "namespaces", {"kind": "Namespace", "metadata": meta})
        created.append(name)
        await kube.wait_for(
            "v1", "serviceaccounts", "default", lambda _: True, namespace=name, timeout=30, what="created"
        )
        return name

    yield make
    for name in created:
        # Pods first, with grace period 0: the namespace controller deletes
        # them with their own terminationGracePeriodSeconds, and without a
        # kubelet to confirm, a bound pod with a non-zero grace period (and so
        # the namespace) would stay Terminating forever, keeping its claims
        # allocated (CheckGracefulDelete, pkg/registry/core/pod/strategy.go).
        # driver.create_pod sets 0 already; pods made otherwise may not.
        await kube.delete_collection("v1", "pods", namespace=name, grace_period_seconds=0)
        # Not awaited to completion: the rest (claims, finalizers, GC) is the
        # namespace controller's business and must not slow every test down.
        await kube.delete("v1", "namespaces", name)


@pytest_asyncio.fixture(loop_scope="session")
async def namespace(make_namespace: MakeNamespace) -> str:
    """A fresh namespace without labels."""
    return await make_namespace()


@pytest_asyncio.fixture(loop_scope="session")
async def make_fleet(cluster: ControlPlane, kube: Kube) -> AsyncIterator[MakeFleet]:
    """Factory for :class:`GpuFleet` (fake nodes + DeviceClass + slices), all deleted after the test."""
    fleets: list[GpuFleet] = []

    async def make(prefix: str = "fleet") -> GpuFleet:
        cluster.check_alive()
        fleet = await create_fleet(kube, unique(prefix))
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        await fleet.delete()


# -- `dra-quota serve` (tests/e2e/harness.py) ---------------------------------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def crd(kube: Kube) -> None:
    """The DeviceQuota and ClusterDeviceQuota CRDs, established (created once; never deleted:
    tests share them)."""
    for definition in CRDS:
        try:
            await kube.create("apiextensions.k8s.io/v1", "customresourcedefinitions", definition)
        except ApiError as err:
            if err.status != 409:
                raise
        await kube.wait_for_condition("apiextensions.k8s.io/v1", "customresourcedefinitions",
                                      definition["metadata"]["name"], "Established", timeout=60)


@pytest_asyncio.fixture(loop_scope="session")
async def served(cluster: ControlPlane, crd: None, tmp_path: Path) -> AsyncIterator[Served]:
    """One `dra-quota serve` on a free port, ready (its /readyz answers 200), killed after."""
    async for handle in running(Served(cluster, free_ports(1)[0], tmp_path / "serve.log")):
        yield handle


@pytest_asyncio.fixture(loop_scope="session")
async def setup(cluster: ControlPlane, kube: Kube, served: Served, make_namespace: MakeNamespace,
                make_fleet: MakeFleet) -> AsyncIterator[Setup]:
    """A labelled namespace, a 4-GPU fleet, and the webhook configurations pointing at `served`.

    Depends on `served` and `make_namespace`, so its teardown (deleting the configurations)
    runs before the process stops and before the namespace goes.
    """
    run = uuid.uuid4().hex[:8]
    fleet = await make_fleet("serve")
    await fleet.add_node("n1", [Gpu()] * 4)
    namespace = await make_namespace("serve", labels={RUN_LABEL: run})
    async with installed(kube, adapted_webhooks(run, served.port, cluster)) as created:
        yield Setup(run, namespace, fleet, served, created)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the control-plane log tails to every failed e2e test report."""
    report = yield
    if report.failed and _control_plane is not None and E2E_DIR in Path(str(item.fspath)).resolve().parents:
        report.sections.append(("minik8s control-plane logs (tail)", _control_plane.logs_report(40)))
        if _kueue is not None and "kueue" in item.fixturenames:  # type: ignore[attr-defined]
            report.sections.append(("Kueue log (tail)", _kueue.log_tail(60)))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    figures = summary()
    if figures:
        terminalreporter.section("durations measured, not asserted (tests/e2e/timings.py)")
        for line in figures:
            terminalreporter.write_line(line)
        written = write_if_asked()
        if written is not None:
            terminalreporter.write_line(f"written to {written}")
    cp = _control_plane
    if cp is None or not cp.startup_seconds:
        return
    rss = cp.final_rss or cp.rss()
    parts = ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in rss.items() if v)
    if _kueue is not None and _kueue.startup_seconds:
        kueue_rss = f"; RSS at session end {_kueue.final_rss / 2**20:.0f} MiB" if _kueue.final_rss else ""
        terminalreporter.write_line(f"kueue: ready in {_kueue.startup_seconds:.1f}s{kueue_rss}; log in {_kueue.log_path}")
    terminalreporter.write_line(
        f"minik8s: control plane ready in {cp.startup_seconds:.1f}s; RSS at session end: {parts}; "
        f"logs in {cp.logs}"
    )
