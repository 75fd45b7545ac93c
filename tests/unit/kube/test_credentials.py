"""kube.credentials and KubeApi.connect: how every command finds the cluster.

One rule for every command, kubectl's: a `serve` that read only --kubeconfig or the service
account would say "Service host/port is not set" under `KUBECONFIG=… dra-quota serve` while
`top` reads $KUBECONFIG. Tested here on files; tests/e2e/test_top.py runs both commands with
it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kube.api import KubeApi
from kube.credentials import Credentials, CredentialsError, resolve

IN_POD = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def kubeconfig(path: Path, *, clusters: dict[str, str], contexts: dict[str, str], current: str = "") -> str:
    """A kubeconfig file: cluster name -> server, context name -> cluster (user "u" throughout)."""
    body: dict[str, object] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": n, "cluster": {"server": s}} for n, s in clusters.items()],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": n, "context": {"cluster": c, "user": "u"}} for n, c in contexts.items()],
    }
    if current:
        body["current-context"] = current
    path.write_text(json.dumps(body))
    return str(path)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    (folder / ".kube").mkdir(parents=True)
    return folder


def test_the_flag_wins_over_everything(tmp_path: Path, home: Path) -> None:
    flag = kubeconfig(tmp_path / "flag", clusters={"c": "http://flag"}, contexts={"x": "c"}, current="x")
    kubeconfig(home / ".kube" / "config", clusters={}, contexts={})
    env = {"KUBECONFIG": kubeconfig(tmp_path / "env", clusters={}, contexts={}), **IN_POD}
    assert resolve(flag, environ=env, home=home) == Credentials("kubeconfig", (flag,), "x", "--kubeconfig")
    with pytest.raises(CredentialsError, match="--kubeconfig .*missing: no such file"):
        resolve(str(tmp_path / "missing"), environ=env, home=home)


def test_kubeconfig_lists_skip_missing_files_and_the_first_current_context_wins(tmp_path: Path, home: Path) -> None:
    a = kubeconfig(tmp_path / "a", clusters={"c": "http://a"}, contexts={"x": "c"})  # no current-context
    b = kubeconfig(tmp_path / "b", clusters={"c": "http://b"}, contexts={"y": "c"}, current="y")
    c = kubeconfig(tmp_path / "c", clusters={}, contexts={}, current="z")
    env = {"KUBECONFIG": os.pathsep.join(["", str(tmp_path / "gone"), a, b, c, a]), **IN_POD}
    assert resolve(environ=env, home=home) == Credentials("kubeconfig", (a, b, c), "y", "$KUBECONFIG")
    # A --context names one itself.
    assert resolve(context="x", environ=env, home=home).context == "x"


def test_a_kubeconfig_list_naming_no_file_is_an_error_not_the_home_file(tmp_path: Path, home: Path) -> None:
    kubeconfig(home / ".kube" / "config", clusters={}, contexts={})
    gone = {"KUBECONFIG": str(tmp_path / "gone")}
    with pytest.raises(CredentialsError, match=r"\$KUBECONFIG=.*none of these files exists"):
        resolve(environ=gone, home=home)
    # In a Pod, as for kubectl: the service account.
    assert resolve(environ={**gone, **IN_POD}, home=home).kind == "in-cluster"


def test_in_a_pod_the_service_account_comes_before_the_home_file(home: Path) -> None:
    default = kubeconfig(home / ".kube" / "config", clusters={"c": "http://home"}, contexts={"h": "c"}, current="h")
    assert resolve(environ=IN_POD, home=home) == Credentials("in-cluster", source="in-cluster")
    # Only a kubeconfig has contexts: asking for one skips the service account.
    assert resolve(context="h", environ=IN_POD, home=home).files == (default,)
    assert resolve(environ={}, home=home) == Credentials("kubeconfig", (default,), "h", "~/.kube/config")


def test_nothing_to_use_says_every_way(home: Path) -> None:
    with pytest.raises(CredentialsError, match="pass --kubeconfig, set \\$KUBECONFIG, run in a Pod"):
        resolve(environ={}, home=home)


async def test_connect_merges_the_list_as_kubectl_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Names defined twice: the first file's wins; current-context: the first file setting one
    (kubernetes_asyncio alone would take the last file's)."""
    first = kubeconfig(tmp_path / "first", clusters={"shared": "http://127.0.0.1:1"}, contexts={"mine": "shared"},
                       current="mine")
    second = kubeconfig(tmp_path / "second", clusters={"shared": "http://127.0.0.1:2", "other": "http://127.0.0.1:3"},
                        contexts={"theirs": "other"}, current="theirs")
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([first, second]))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    async with await KubeApi.connect() as api:
        assert api.server == "http://127.0.0.1:1"
        assert api.credentials is not None and api.credentials.describe() == (
            f"kubeconfig {first}{os.pathsep}{second} ($KUBECONFIG, context mine)")
    async with await KubeApi.connect(context="theirs") as api:
        assert api.server == "http://127.0.0.1:3"
