"""Whether and how the gateway listens: HTTPS with the admin's certificate, or plain HTTP
on loopback only (or where the admin said ``--insecure`` in so many words).

Every request carries a bearer token: on plain HTTP across a network, anyone on the path
reads it and acts as that principal. So a gateway that would listen on an address other
than loopback without a certificate refuses to start and says why; behind a proxy on the
same host that terminates TLS (docs/deploy.md: nginx) it listens on loopback and needs
nothing. Clients (edges/client.py, edges/mcp/relay.py) verify the certificate against the
system's store, or ``CORRAL_CA_FILE`` for a site CA."""

from __future__ import annotations

import ipaddress
import ssl
from typing import Any

from corral.core.config import Settings
from corral.core.errors import InvalidRequest

CA_FILE_ENV = "CORRAL_CA_FILE"
"""The clients' own setting: a PEM file of the CA(s) that signed the gateway's certificate."""


def loopback(host: str) -> bool:
    """Only this machine can reach ``host`` (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any address


def check(settings: Settings) -> None:
    """Refuse what would send tokens in clear, and a certificate the server could not load,
    before anything starts; InvalidRequest in the admin's words."""
    where = f"{settings.host}:{settings.port}"
    if settings.tls_cert is None:
        if not loopback(settings.host) and not settings.insecure:
            raise InvalidRequest(
                f"refusing to listen on {where} without TLS: every request carries a bearer token, and on plain "
                "HTTP anyone on the network path could read it and act as its principal",
                hint="give --tls-cert FILE --tls-key FILE (or tls_cert/tls_key in corral.toml); or keep the "
                     "gateway on 127.0.0.1 behind a proxy that terminates TLS (docs/deploy.md); or, on a network "
                     "no one else reaches, say --insecure")
        return
    assert settings.tls_key is not None  # Settings refuses one without the other
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(settings.tls_cert, settings.tls_key)
    except FileNotFoundError as e:
        raise InvalidRequest(f"TLS: {e.filename} does not exist", hint="tls_cert and tls_key name PEM files") from None
    except PermissionError as e:
        raise InvalidRequest(f"TLS: the gateway may not read {e.filename}",
                             hint="the key must be readable by the gateway's account (and no one else)") from None
    except (ssl.SSLError, OSError) as e:
        raise InvalidRequest(f"TLS: cannot use certificate {settings.tls_cert} with key {settings.tls_key}: "
                             f"{getattr(e, 'reason', None) or e}",
                             hint="both PEM; the key must be the certificate's own, unencrypted") from None


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn.Config's TLS arguments (none for plain HTTP)."""
    if settings.tls_cert is None:
        return {}
    return {"ssl_certfile": str(settings.tls_cert), "ssl_keyfile": str(settings.tls_key)}



def mcp_transport_security(settings: Settings) -> Any:
    """The MCP SDK's DNS-rebinding protection, as it sets it for a loopback host, plus the
    name the gateway is reached by (``url``) and each name without a port. Behind a proxy
    on this host the Host header is the public name (nginx's ``$host``, which has no
    port), and the SDK's own list (``127.0.0.1:*`` ...) answered every MCP request 421.
    None (the SDK's choice: no check) where the gateway does not listen on loopback."""
    from urllib.parse import urlsplit

    from mcp.server.transport_security import TransportSecuritySettings

    if settings.host not in ("127.0.0.1", "localhost", "::1"):
        return None
    names = ["127.0.0.1", "localhost", "[::1]"]
    public = urlsplit(settings.url).hostname if settings.url else None
    if public:
        names.append(f"[{public}]" if ":" in public else public)
    hosts = [h for n in names for h in (n, f"{n}:*")]
    origins = [f"{scheme}://{h}" for scheme in ("http", "https") for h in hosts]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=origins)
