"""The webhook's TLS server context: TLS 1.2+, and a certificate swapped without restart.

Neighbours: `certs.rotation` decides when the pair changes; the server (aiohttp) is
given `ReloadingContext.context` once at start. A new pair is loaded into a fresh
SSLContext and selected per handshake from the SNI callback (which OpenSSL runs on
every ClientHello, with or without a server name), so connections already open keep
their session and new ones get the new certificate: the same effect as
controller-runtime's certwatcher `GetCertificate` (kueue.md §4).
"""

from __future__ import annotations

import os
import ssl
import tempfile

from certs.authority import KeyPair, inspect

__all__ = ["TLS12_CIPHERS", "ReloadingContext", "server_context"]


# TLS 1.2 suites: ECDHE key exchange (forward secrecy) with an AEAD cipher only, as
# Mozilla's "intermediate" profile and Go's defaults for the API server's client; Python's
# default list also offers two CBC-SHA2 suites on 1.2. TLS 1.3's suites are all AEAD and
# set apart (set_ciphers does not touch them).
TLS12_CIPHERS = "@SECLEVEL=2:ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL"


def server_context(pair: KeyPair) -> ssl.SSLContext:
    """A server context serving `pair`, TLS 1.2 (AEAD ECDHE suites only) or newer."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    # Renegotiation is a DoS vector and nothing the API server needs.
    context.options |= ssl.OP_NO_RENEGOTIATION
    _load(context, pair)
    return context


def _load(context: ssl.SSLContext, pair: KeyPair) -> None:
    # ssl loads key material only from files: a private, unlinked-right-after temp file
    # (0600 in a 0700 directory) keeps the key off any shared path.
    with tempfile.TemporaryDirectory(prefix="dra-quota-tls-") as tmp:
        path = os.path.join(tmp, "pair.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(pair.key_pem + b"\n" + pair.cert_pem)
        context.load_cert_chain(path)


class ReloadingContext:
    """Serves the newest pair given to `update`, from the next handshake on."""

    def __init__(self, pair: KeyPair) -> None:
        self.context = server_context(pair)
        self._current = self.context
        info = inspect(pair.cert_pem)
        # The served leaf's serial and notAfter (the certificate-expiry metric reads it).
        self.serial, self.not_after = info.serial, info.not_after
        self.context.sni_callback = self._select

    def update(self, pair: KeyPair) -> bool:
        """Switch to `pair` (False when it is the one already served)."""
        info = inspect(pair.cert_pem)
        if info.serial == self.serial:
            return False
        fresh = server_context(pair)
        self._current, self.serial, self.not_after = fresh, info.serial, info.not_after
        return True

    def _select(self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext) -> None:
        if self._current is not self.context:
            connection.context = self._current
