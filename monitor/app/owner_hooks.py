"""Owners' webhooks: an address someone on the internet gave must never reach the monitor's own
network. The check is made on the address actually connected to (after DNS, on the socket), so a
name that resolves to a public address when asked and to a private one a moment later (DNS
rebinding) still cannot pass; redirects are never followed. Private, loopback, link-local,
multicast and reserved addresses are refused unless the operator allows them
(``owner_webhooks_private``: a private deployment, or a spec's receiver on 127.0.0.1).
"""

from __future__ import annotations

import http.client
import ipaddress
import urllib.request
from typing import Optional

from monitor.app import webhooks


def public(address: str) -> bool:
    """Whether ``address`` (an IP) is one anyone on the internet could have."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
                                 or ip.is_reserved or ip.is_unspecified)


class _Refused(OSError):
    pass


def _checked(connection_class):
    class Checked(connection_class):
        allow_private = False

        def connect(self):
            super().connect()
            peer = self.sock.getpeername()[0]
            if not (self.allow_private or public(peer)):
                self.sock.close()
                raise _Refused(f"the webhook's address {peer} is not public (an owner's webhook must be)")

    return Checked


_HTTP, _HTTPS = _checked(http.client.HTTPConnection), _checked(http.client.HTTPSConnection)


class _PublicHTTP(urllib.request.HTTPHandler):
    def __init__(self, allow_private: bool):
        super().__init__()
        self.allow_private = allow_private

    def http_open(self, req):
        return self.do_open(lambda host, **kw: _with(_HTTP(host, **kw), self.allow_private), req)


class _PublicHTTPS(urllib.request.HTTPSHandler):
    def __init__(self, allow_private: bool):
        super().__init__()
        self.allow_private = allow_private

    def https_open(self, req):
        return self.do_open(lambda host, **kw: _with(_HTTPS(host, **kw), self.allow_private), req,
                            context=self._context)


def _with(connection, allow_private: bool):
    connection.allow_private = allow_private
    return connection


def send(url: str, body: bytes, *, timeout: float, allow_private: bool = False,
         headers: Optional[dict[str, str]] = None) -> None:
    """``webhooks.send`` to an owner's webhook, refusing any address that is not public."""
    opener = urllib.request.build_opener(_PublicHTTP(allow_private), _PublicHTTPS(allow_private),
                                         webhooks.NoRedirects())
    webhooks.send(url, body, timeout=timeout, headers=headers, opener=opener)
