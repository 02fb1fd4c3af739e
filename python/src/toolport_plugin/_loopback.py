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
        parts = [int(part) for part in match["ipv4"].split(".")]
        return parts[0] == 127 and all(part <= 255 for part in parts)
    if match["ipv6"] is not None:
        try:
            address = ipaddress.IPv6Address(match["ipv6"])
        except ValueError:
            return False
        mapped = address.ipv4_mapped
        return mapped.is_loopback if mapped is not None else address.is_loopback
    return True
