"""Loopback checks for Toolport's URL and the callback server's Host header (docs/protocol.md R1, R2)."""
from __future__ import annotations

import ipaddress
import re

# A Host header the callback server answers: ``localhost`` (ASCII, any case), a dotted-decimal IPv4
# address (four parts, no leading zeros; 127/8 checked below) or a bracketed IPv6 address (loopback
# checked below), then optionally ``:`` and a port. Nothing else: no userinfo, path, trailing dot,
# legacy IPv4 spelling (``127.1``, ``0x7f.0.0.1``) or space. The TypeScript SDK's HOST_HEADER
# (src/plugin/callback-server.ts) is the same expression.
_HOST_HEADER = re.compile(
    r"(?:localhost|(?P<ipv4>(?:0|[1-9][0-9]{0,2})(?:\.(?:0|[1-9][0-9]{0,2})){3})|\[(?P<ipv6>[0-9a-f:.]+)\])"
    r"(?::(?P<port>[0-9]{1,5}))?",
    re.ASCII | re.IGNORECASE,
)


def loopback_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The loopback IP address ``text`` spells (``127.0.0.0/8`` or ``::1``; an IPv4-mapped
    ``::ffff:127.x.y.z`` as its IPv4 address), or None when it is not a loopback IP address."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address if address.is_loopback else None


def is_loopback_hostname(hostname: str) -> bool:
    """True for ``localhost``, ``127.0.0.0/8``, ``::1`` and ``::ffff:127.x.y.z`` (brackets allowed)."""
    name = hostname.strip("[]").lower()
    return name == "localhost" or loopback_ip(name) is not None


def is_loopback_host_header(host: str | None) -> bool:
    """True when an HTTP Host header (``name`` or ``name:port``) names a loopback address:
    ``localhost``, a dotted-decimal ``127.0.0.0/8`` address or a bracketed ``::1`` (or
    ``::ffff:127.x.y.z``), with an optional port of 1 to 65535; any other spelling is refused."""
    match = _HOST_HEADER.fullmatch(host or "")
    if match is None:
        return False
    port = match["port"]
    if port is not None and not 1 <= int(port) <= 65535:
        return False
    if match["ipv4"] is not None:
        return is_loopback_hostname(match["ipv4"])
    if match["ipv6"] is not None:
        # The ":" keeps an IPv4 address in brackets (``[127.0.0.1]``) refused.
        return ":" in match["ipv6"] and is_loopback_hostname(match["ipv6"])
    return True
