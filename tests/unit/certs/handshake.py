"""An in-memory TLS handshake between a client context and our server context."""

from __future__ import annotations

import ssl

from certs.authority import KeyPair
from certs.tls import server_context


def handshake(pair: KeyPair, client: ssl.SSLContext, server_name: str) -> tuple[str | None, str | None]:
    """(client error, server error); both None when the handshake succeeds."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    ends = {
        "client": client.wrap_bio(c_in, c_out, server_hostname=server_name),
        "server": server_context(pair).wrap_bio(s_in, s_out, server_side=True),
    }
    errors: dict[str, str | None] = {"client": None, "server": None}
    done: set[str] = set()
    for _ in range(20):
        for name, end in ends.items():
            if name in done:
                continue
            try:
                end.do_handshake()
                done.add(name)
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLCertVerificationError as err:
                errors[name] = str(err.verify_message)
                done.add(name)
            except ssl.SSLError as err:
                errors[name] = str(err)
                done.add(name)
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if len(done) == 2:
            return errors["client"], errors["server"]
    return "handshake did not finish", None


def verify(pair: KeyPair, client: ssl.SSLContext, server_name: str) -> str | None:
    """None when `client` accepts `pair` as `server_name`, else its verification error."""
    return handshake(pair, client, server_name)[0]
