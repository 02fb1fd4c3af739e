"""Loopback checks for Toolport's URL and the callback server's Host header (docs/protocol.md R1, R2)."""
from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback_hostname(hostname: str) -> bool:
    """True for ``localhost``, ``127.0.0.0/8``, ``::1`` and ``::ffff:127.x.y.z`` (brackets allowed)."""
    name = hostname.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def is_loopback_host_header(host: str | None) -> bool:
    """True when an HTTP Host header (``name`` or ``name:port``) names a loopback address."""
    if not host:
        return False
    try:
        hostname = urlsplit(f"http://{host}/").hostname
    except ValueError:
        return False
    return hostname is not None and is_loopback_hostname(hostname)
