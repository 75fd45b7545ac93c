"""webhook.adminpolicy: the policy in force follows its ConfigMap or file, and never fails open.

The ConfigMap's watch is proven against the real API server in
tests/e2e/test_admin_access_policy.py; here the Store is fed plain dicts, and the file
source runs on real files with kubelet's atomic symlink swap.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from pathlib import Path

import pytest

from commands.cli import main
from quota.admission.policy import PolicyError
from runtime.filepoll import Stamp
from webhook import adminpolicy
from webhook.adminpolicy import NOBODY, ConfigMapPolicy, PolicySource, configmap_ref, read_policy

from ..clock import until


def configmap(data: object, *, name: str = "allow", version: str = "1") -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "ops", "resourceVersion": version}, "data": data}


def test_configmap_refs() -> None:
    assert configmap_ref("dra-quota-system/dra-quota-admin-access") == ("dra-quota-system", "dra-quota-admin-access")
    for bad in ("no-slash", "Ops/x", "ops/", "/x", "ops/x/y"):
        with pytest.raises(argparse.ArgumentTypeError):
            configmap_ref(bad)


def test_the_configmap_sets_the_policy_and_a_bad_version_keeps_the_last_good_one(caplog: pytest.LogCaptureFixture) -> None:
    source = PolicySource.from_configmap("ops", "allow")
    store = ConfigMapPolicy(source, "ops", "allow")
    assert source.policy() == NOBODY  # nobody until listed
    store.replace([configmap({"users": "alice, bob", "groups": "admins"})])
    assert source.policy().users == frozenset({"alice", "bob"})
    assert source.policy().basis("carol", ["admins"]) == "allowlisted group admins"

    with caplog.at_level(logging.WARNING, logger="webhook.adminpolicy"):
        store.upsert(configmap({"users": "mallory", "bogus": "x"}, version="2"))
    assert source.policy().users == frozenset({"alice", "bob"})
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "ConfigMap ops/allow (resourceVersion 2)" in warning and "unknown field 'bogus'" in warning, warning
    assert "keeping the one from ConfigMap ops/allow (resourceVersion 1)" in warning, warning

    store.upsert(configmap({"users": "mallory"}, version="3"))
    assert source.policy().users == frozenset({"mallory"})
    # Another ConfigMap's events (never sent with the field selector) change nothing.
    store.upsert(configmap({"users": "eve"}, name="other"))
    store.delete(configmap({}, name="other"))
    assert source.policy().users == frozenset({"mallory"})
    # Deleted, or not there at all: nobody (fail closed), and a bad version then keeps nobody.
    store.delete(configmap({"users": "mallory"}, version="4"))
    assert source.policy() == NOBODY
    store.replace([configmap({"users": "mallory"}, version="5")])
    assert source.policy().users == frozenset({"mallory"})
    store.replace([])
    assert source.policy() == NOBODY
    store.upsert(configmap({"users": "not valid"}, version="6"))
    assert source.policy() == NOBODY
    # A ConfigMap without data (or with binaryData only) allowlists nobody.
    store.upsert(configmap(None, version="7"))
    assert source.policy() == NOBODY


def write_mounted(directory: Path, data: dict[str, str], generation: int) -> None:
    """Kubelet's AtomicWriter: a new timestamped dir, `..data` swapped to it by rename,
    each key a symlink through `..data` (k8s.io/kubernetes pkg/volume/util/atomic_writer.go)."""
    target = directory / f"..gen_{generation}"
    target.mkdir()
    for key, value in data.items():
        (target / key).write_text(value)
    tmp = directory / "..data_tmp"
    tmp.symlink_to(target.name)
    os.rename(tmp, directory / "..data")
    for key in data:
        link = directory / key
        if not link.is_symlink():
            link.symlink_to(f"..data/{key}")


def test_a_mounted_configmap_directory_reads_as_the_configmap_data(tmp_path: Path) -> None:
    write_mounted(tmp_path, {"users": "alice\nbob", "serviceAccounts": "ops:*"}, 1)
    policy = read_policy(tmp_path)
    assert policy.users == frozenset({"alice", "bob"}) and policy.service_accounts == frozenset({"ops:*"})
    (tmp_path / "..gen_1" / "surprise").write_text("x")
    (tmp_path / "surprise").symlink_to("..data/surprise")
    with pytest.raises(PolicyError, match=f"{tmp_path}: adminAccess policy: unknown field 'surprise'"):
        read_policy(tmp_path)
    (tmp_path / "surprise").unlink()
    (tmp_path / "..gen_1" / "users").write_bytes(b"alice\xff")
    with pytest.raises(PolicyError, match="users: not UTF-8 text"):
        read_policy(tmp_path)


async def test_the_file_is_reloaded_on_an_atomic_swap_and_a_bad_one_is_kept_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    stamps, stamp = [0], adminpolicy._stamp

    def counted(path: Path) -> Stamp:  # each poll looks at the file's stamp
        stamps[0] += 1
        return stamp(path)

    monkeypatch.setattr(adminpolicy, "_stamp", counted)
    write_mounted(tmp_path, {"users": "alice"}, 1)
    source = PolicySource.from_file(tmp_path, poll_seconds=0.01)
    assert source.policy().users == frozenset({"alice"})
    task = asyncio.create_task(source.poll())
    try:
        write_mounted(tmp_path, {"users": "mallory"}, 2)
        await until(lambda: source.policy().users == frozenset({"mallory"}))
        with caplog.at_level(logging.WARNING):
            write_mounted(tmp_path, {"users": "mallory", "groups": "two words"}, 3)
            await until(lambda: any("cannot reload the adminAccess policy" in r.getMessage() for r in caplog.records))
            # Polled many more times meanwhile: still the last good policy, one warning.
            polled = stamps[0]
            await until(lambda: stamps[0] >= polled + 20, "20 more looks at the file")
        assert source.policy().users == frozenset({"mallory"}) and not source.policy().groups
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "groups[0] must be a non-empty name without spaces" in warnings[0], warnings
        write_mounted(tmp_path, {"users": "carol", "groups": "admins"}, 4)
        await until(lambda: source.policy().groups == frozenset({"admins"}))
        # A key edited in place (not kubelet's way, but an operator's) is followed too.
        (tmp_path / "users").write_text("carol, dave")
        await until(lambda: source.policy().users == frozenset({"carol", "dave"}))
        # Keys removed, as from the ConfigMap's data: what is left is the allowlist,
        # exactly as the watched ConfigMap would be read.
        for key in ("users", "groups"):
            (tmp_path / key).unlink()
        await until(lambda: source.policy() == NOBODY)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_the_cli_takes_one_source(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("commands.serve.configure_logging", lambda *_: None)
    with pytest.raises(SystemExit):
        main(["serve", "--admin-access-configmap", "ops/allow", "--admin-access-policy", str(tmp_path)])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--admin-access-configmap", "allow"])
    assert "'allow' must be NAMESPACE/NAME" in capsys.readouterr().err
