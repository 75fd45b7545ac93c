"""commands.serve: the policy file, JSON log lines, and the certificate pair reloaded from disk."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from pathlib import Path

import pytest

from certs.authority import inspect
from certs.tls import ReloadingContext
from commands.cli import main
from commands.listeners import pair_stamp, reload_certificates
from commands.serve import Caches, JsonFormatter, ServeError, ServeOptions, policy_source, serve
from quota.admission.policy import AdminAccessPolicy

from ..certs.test_tls import mint
from ..clock import until


def test_the_policy_comes_from_a_map_or_a_configmap(tmp_path: Path) -> None:
    def load_policy(path: Path | None) -> AdminAccessPolicy:
        return policy_source(ServeOptions(admin_access_policy=path)).policy()

    assert load_policy(None).groups == frozenset()
    plain = tmp_path / "policy.yaml"
    plain.write_text("groups: [gpu-admins]\nusers: alice\n")
    assert (load_policy(plain).groups, load_policy(plain).users) == (frozenset({"gpu-admins"}), frozenset({"alice"}))
    configmap = tmp_path / "cm.json"
    configmap.write_text(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "p"},
                                     "data": {"serviceAccounts": "ops:robot, ops:*"}}))
    assert load_policy(configmap).service_accounts == frozenset({"ops:robot", "ops:*"})
    for text in ("nobody: [x]\n", "[a, b]\n", "groups: [\n"):
        plain.write_text(text)
        with pytest.raises(ServeError, match="--admin-access-policy"):
            load_policy(plain)
    # Read as strictly as check's input: a second `users:` must not silently win.
    plain.write_text("users: [alice]\nusers: [mallory]\n")
    with pytest.raises(ServeError, match="duplicate key 'users'"):
        load_policy(plain)
    plain.write_text("users: [alice]\n---\nusers: [mallory]\n")
    with pytest.raises(ServeError, match="one document expected, found 2"):
        load_policy(plain)
    with pytest.raises(ServeError, match="--admin-access-policy .*missing.yaml"):
        load_policy(tmp_path / "missing.yaml")


def test_json_log_lines_carry_the_review_fields() -> None:
    record = logging.LogRecord("webhook.server", logging.INFO, __file__, 1, "denied %s", ("x",), None)
    record.uid, record.object_name, record.allowed = "u-1", "c1", False
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "denied x" and line["level"] == "info" and line["logger"] == "webhook.server"
    assert (line["uid"], line["object_name"], line["allowed"]) == ("u-1", "c1", False)
    assert "namespace" not in line


async def test_a_changed_pair_on_disk_is_served_and_a_broken_one_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = mint(), mint()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(first.serving.cert_pem)
    key.write_bytes(first.serving.key_pem)
    options = ServeOptions(tls_cert_file=cert, tls_key_file=key, cert_poll_seconds=0.01)
    tls = ReloadingContext(first.serving)
    task = asyncio.create_task(reload_certificates(options, tls, pair_stamp(options)))

    try:
        # A key that does not match the certificate (a half-written swap) is not loaded...
        with caplog.at_level(logging.WARNING, logger="commands.serve"):
            cert.write_bytes(second.serving.cert_pem)
            await until(lambda: any("keeping the current one" in r.getMessage() for r in caplog.records))
        assert tls.serial == inspect(first.serving.cert_pem).serial
        # ...and the matching pair is, once it is complete.
        key.write_bytes(second.serving.key_pem)
        await until(lambda: tls.serial == inspect(second.serving.cert_pem).serial)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_the_cli_states_the_limitation_and_refuses_what_it_cannot_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The process's logging setup replaces the root handlers: not in a shared test process.
    monkeypatch.setattr("commands.serve.configure_logging", lambda *_: None)
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "Reservations are persisted on DeviceQuota status" in help_text and "--reservation-ttl" in help_text
    missing = str(tmp_path / "missing.crt")
    assert main(["serve", "--tls-cert-file", missing, "--tls-key-file", missing]) == 2
    assert capsys.readouterr().err.startswith("error: cannot load the serving certificate: ")
    material = mint()
    cert, key, kubeconfig = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "kubeconfig"
    cert.write_bytes(material.serving.cert_pem)
    key.write_bytes(material.serving.key_pem)
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    assert main(["serve", "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--kubeconfig", str(kubeconfig)]) == 2
    assert "error: cannot reach the cluster: " in capsys.readouterr().err


def unreachable(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A serving pair, and a kubeconfig for an API server nobody listens for."""
    material = mint()
    cert, key, kubeconfig = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "kubeconfig"
    cert.write_bytes(material.serving.cert_pem)
    key.write_bytes(material.serving.key_pem)
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    return cert, key, kubeconfig


async def test_a_dead_cache_stops_the_process_with_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key, kubeconfig = unreachable(tmp_path)

    async def broken(self: Caches) -> None:
        raise RuntimeError("a store bug")

    monkeypatch.setattr(Caches, "run", broken)
    options = ServeOptions(tls_cert_file=cert, tls_key_file=key, kubeconfig=str(kubeconfig),
                           bind_address="127.0.0.1", port=0, metrics_port=0)
    async with asyncio.timeout(10):
        assert await serve(options) == 1
    # The handlers are the process's; a returned serve() leaves the loop as it found it.
    assert asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM) is False


class _Logged(logging.Handler):
    """Sets `events[text]` once a record containing `text` is logged."""

    def __init__(self, events: dict[str, asyncio.Event]) -> None:
        super().__init__()
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        for text, event in self.events.items():
            if text in record.getMessage():
                event.set()


async def test_a_cache_that_dies_during_the_shutdown_delay_ends_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """After SIGTERM a ready replica answers on for --shutdown-delay; a cache that dies
    meanwhile ends the delay at once (exit 1) rather than answering from a frozen cache."""
    cert, key, kubeconfig = unreachable(tmp_path)
    seen = {"ready after": asyncio.Event(), "not ready; answering": asyncio.Event()}

    async def synced(self: Caches) -> None:
        return None

    async def dies_in_the_delay(self: Caches) -> None:
        await seen["not ready; answering"].wait()
        raise RuntimeError("a store bug")

    monkeypatch.setattr(Caches, "wait_synced", synced)
    monkeypatch.setattr(Caches, "synced", property(lambda self: True))
    monkeypatch.setattr(Caches, "run", dies_in_the_delay)
    logger, handler = logging.getLogger("commands.serve"), _Logged(seen)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        options = ServeOptions(tls_cert_file=cert, tls_key_file=key, kubeconfig=str(kubeconfig),
                               bind_address="127.0.0.1", port=0, metrics_port=0, shutdown_delay_seconds=3600)
        task = asyncio.create_task(serve(options))
        async with asyncio.timeout(30):  # a hang detector, not a bound
            await seen["ready after"].wait()
            os.kill(os.getpid(), signal.SIGTERM)
            assert await task == 1
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def test_a_metrics_port_in_use_is_a_start_up_error(tmp_path: Path) -> None:
    cert, key, kubeconfig = unreachable(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        options = ServeOptions(tls_cert_file=cert, tls_key_file=key, kubeconfig=str(kubeconfig),
                               bind_address="127.0.0.1", port=0, metrics_bind_address="127.0.0.1", metrics_port=port)
        with pytest.raises(ServeError, match=f"cannot serve metrics on 127.0.0.1:{port}: "):
            async with asyncio.timeout(10):
                await serve(options)
    assert asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM) is False


@pytest.mark.parametrize("flags,error", [
    (["--max-connections", "0"], "error: --max-connections must be at least 1, got 0"),
    (["--request-body-timeout", "0"], "error: --request-body-timeout must be positive, got 0.0"),
    (["--bind-address", "127.0.0.1,"], "error: --bind-address '127.0.0.1,' has an empty address"),
    (["--bind-address", "127.0.0.1,::1", "--port", "0"],
     "error: --bind-address with several addresses needs a --port other than 0 (each would get its own)"),
    (["--shutdown-delay", "-1"], "error: --shutdown-delay must be 0 or more, got -1.0"),
    (["--team-namespace-series", "-1"], "error: --team-namespace-series must be 0 or more, got -1"),
    (["--lease-period", "0.2"], "error: --lease-period must be 0 (no leases) or at least 1 second, got 0.2"),
    (["--lease-period", "-5"], "error: --lease-period must be 0 (no leases) or at least 1 second, got -5.0"),
    (["--clock-skew", "-1"], "error: --clock-skew must be between 0 and 3600 seconds, got -1.0"),
    (["--clock-skew", "nan"], "error: --clock-skew must be between 0 and 3600 seconds, got nan"),
])
def test_connection_bounds_that_cannot_work_are_refused_by_name(flags: list[str], error: str,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The process's logging setup replaces the root handlers: not in a shared test process.
    monkeypatch.setattr("commands.serve.configure_logging", lambda *_: None)
    assert main(["serve", *flags]) == 2
    assert capsys.readouterr().err.strip() == error


async def test_plain_http_metrics_off_loopback_are_a_start_up_error(tmp_path: Path) -> None:
    cert, key, kubeconfig = unreachable(tmp_path)
    options = ServeOptions(tls_cert_file=cert, tls_key_file=key, kubeconfig=str(kubeconfig), bind_address="127.0.0.1",
                           port=0, metrics_bind_address="0.0.0.0", metrics_port=1, metrics_secure=False)
    with pytest.raises(ServeError, match="plain-HTTP metrics are served on a loopback address only, not 0.0.0.0"):
        async with asyncio.timeout(10):
            await serve(options)
    assert asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM) is False
