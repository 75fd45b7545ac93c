"""certs.tls over a real loopback socket: TLS 1.2+ only, a new pair served without restart."""

from __future__ import annotations

import asyncio
import socket
import ssl
import warnings
from datetime import datetime, timezone

import pytest

from certs.authority import inspect, service_names
from certs.rotation import Material, Policy, plan
from certs.tls import ReloadingContext

from .handshake import handshake

POLICY = Policy(dns_names=service_names("dra-quota", "ns"), ip_addresses=("127.0.0.1",))


def mint() -> Material:
    result = plan(None, POLICY, now=datetime.now(timezone.utc), trusted=frozenset())
    assert result is not None
    return result.material


async def serve(context: ssl.SSLContext) -> tuple[asyncio.Server, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    return server, server.sockets[0].getsockname()[1]


async def served_serial(port: int, client: ssl.SSLContext, server_name: str | None) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname=server_name)
    assert await reader.read() == b"ok"
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return int(inspect(ssl.DER_cert_to_PEM_cert(der).encode()).serial)


def client_for(*materials: Material) -> ssl.SSLContext:
    return ssl.create_default_context(cadata="".join(b"".join(m.bundle).decode() for m in materials))


async def test_a_new_pair_is_served_from_the_next_handshake_without_restart() -> None:
    first, second = mint(), mint()
    reloading = ReloadingContext(first.serving)
    server, port = await serve(reloading.context)
    client = client_for(first, second)
    try:
        for name in ("dra-quota.ns.svc", None):  # with SNI (the API server) and without (an IP)
            assert await served_serial(port, client, name or "127.0.0.1") == inspect(first.serving.cert_pem).serial
        assert reloading.update(second.serving) is True
        assert reloading.update(second.serving) is False
        for name in ("dra-quota.ns.svc", "127.0.0.1"):
            assert await served_serial(port, client, name) == inspect(second.serving.cert_pem).serial
    finally:
        server.close()
        await server.wait_closed()


def test_tls_older_than_1_2_is_refused_by_the_server() -> None:
    material = mint()
    old = client_for(material)
    # A client that really offers TLS 1.0/1.1 (OpenSSL 3 would otherwise refuse on its
    # own side, and the test would prove nothing about the server).
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = ssl.TLSVersion.TLSv1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    _, server_error = handshake(material.serving, old, "dra-quota.ns.svc")
    assert server_error is not None and "UNSUPPORTED_PROTOCOL" in server_error
    current = client_for(material)
    current.maximum_version = ssl.TLSVersion.TLSv1_2
    assert handshake(material.serving, current, "dra-quota.ns.svc") == (None, None)


CBC_SUITES = "ECDHE-ECDSA-AES128-SHA256:ECDHE-ECDSA-AES256-SHA384:ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA"


def handshake_over_socket(port: int, client: ssl.SSLContext) -> tuple[str, str]:
    """(protocol, cipher) of a blocking client's handshake over a real loopback socket
    (ssl.SSLError with the server's alert when it fails)."""
    with socket.create_connection(("127.0.0.1", port)) as raw, \
            client.wrap_socket(raw, server_hostname="dra-quota.ns.svc") as tls:
        cipher = tls.cipher()
        assert cipher is not None
        return str(tls.version()), cipher[0]


async def negotiated(port: int, client: ssl.SSLContext) -> tuple[str, str]:
    return await asyncio.to_thread(handshake_over_socket, port, client)


async def test_tls_1_2_offers_only_aead_ecdhe_suites_and_1_3_is_untouched() -> None:
    material = mint()
    server, port = await serve(ReloadingContext(material.serving).context)
    try:
        cbc_only = client_for(material)
        cbc_only.maximum_version = ssl.TLSVersion.TLSv1_2
        cbc_only.set_ciphers(CBC_SUITES)
        with pytest.raises(ssl.SSLError):  # asyncio drops the connection: an EOF, not always an alert
            await negotiated(port, cbc_only)
        tls12 = client_for(material)
        tls12.maximum_version = ssl.TLSVersion.TLSv1_2
        assert await negotiated(port, tls12) == ("TLSv1.2", "ECDHE-ECDSA-AES256-GCM-SHA384")
        tls12.set_ciphers("ECDHE-ECDSA-CHACHA20-POLY1305")
        assert await negotiated(port, tls12) == ("TLSv1.2", "ECDHE-ECDSA-CHACHA20-POLY1305")
        assert (await negotiated(port, client_for(material)))[0] == "TLSv1.3"
    finally:
        server.close()
        await server.wait_closed()
