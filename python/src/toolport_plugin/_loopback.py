"""Loopback checks for Toolport's URL and the callback server's Host header (docs/protocol.md R1, R2)."""
from __future__ import annotations

import ipaddress
import re
from urllib.parse import unquote_to_bytes

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


# ---- Toolport's URL, read as the WHATWG URL parser reads it ---------------------------------
#
# The TypeScript SDK and Toolport read URLs with the WHATWG parser (src/shared/loopback.ts,
# checkCallbackUrl), which accepts spellings urllib does not (`127.1`, `http:\\127.0.0.1`,
# surrounding spaces, a trailing dot) and refuses some it takes (an IPv6 zone id). `toolport_url`
# follows the same rule here, for http and https (the only schemes accepted): the host must be
# loopback once the parser has normalised it.

_C0_OR_SPACE = "".join(chr(c) for c in range(0x21))
_TAB_OR_NEWLINE = re.compile("[\t\n\r]")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
_DEFAULT_PORT = {"http": 80, "https": 443}
# Forbidden domain code points (https://url.spec.whatwg.org/#forbidden-domain-code-point).
_FORBIDDEN_DOMAIN = re.compile("[\x00-\x20#%/:<>?@\\[\\\\\\]^|\x7f]")
# The path percent-encode set, beyond C0 controls and non-ASCII.
_PATH_ESCAPED = frozenset(' "#<>?`{}')
_SINGLE_DOT = frozenset([".", "%2e"])
_DOUBLE_DOT = frozenset(["..", ".%2e", "%2e.", "%2e%2e"])


def loopback_api_url(text: str) -> str:
    """The base URL of Toolport's API that ``text`` names, as the WHATWG parser normalises it,
    with its path ending in ``/`` and without query or fragment (an API path is joined to it).
    Raises ValueError naming the problem, in the TypeScript SDK's words."""
    text = _TAB_OR_NEWLINE.sub("", text.strip(_C0_OR_SPACE))
    scheme_match = _SCHEME.match(text)
    if scheme_match is None:
        raise ValueError("not a valid absolute URL")
    scheme = scheme_match.group(1).lower()
    if scheme not in _DEFAULT_PORT:
        raise ValueError("scheme must be http or https")
    rest = text[scheme_match.end():].lstrip("/\\")  # any run of slashes, either way, after "http:"
    end = next((i for i, c in enumerate(rest) if c in "/\\?#"), len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        raise ValueError("credentials (user:password@) are not allowed")
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0 or (close + 1 < len(authority) and authority[close + 1] != ":"):
            raise ValueError("not a valid absolute URL")
        host_text, port_text = authority[:close + 1], authority[close + 2:]
    else:
        host_text, _, port_text = authority.partition(":")
    if host_text == "":
        raise ValueError("not a valid absolute URL")
    if port_text != "" and not (port_text.isascii() and port_text.isdigit() and int(port_text) <= 65535):
        raise ValueError("not a valid absolute URL")
    host = _whatwg_host(host_text)
    if host is None:
        raise ValueError("not a valid absolute URL")
    if not is_loopback_hostname(host):
        raise ValueError("host must be a loopback address")
    port = int(port_text) if port_text else _DEFAULT_PORT[scheme]
    if port == 0:
        raise ValueError("port must be 1 to 65535")
    netloc = host if port == _DEFAULT_PORT[scheme] else f"{host}:{port}"
    path = _whatwg_path(re.split(r"[?#]", tail, maxsplit=1)[0])
    return f"{scheme}://{netloc}{path if path.endswith('/') else path + '/'}"


def _whatwg_host(text: str) -> str | None:
    """The WHATWG host parser for a special URL, as far as loopback needs it: an IPv6 literal
    compressed in brackets, an IPv4 address in any accepted spelling as a dotted quad, or a domain
    in its ASCII, lower-case form; None when the parser fails."""
    if text.startswith("["):
        inner = text[1:-1]
        if "%" in inner:  # a zone id is no part of a URL's IPv6 address
            return None
        try:
            return f"[{ipaddress.IPv6Address(inner).compressed}]"
        except ValueError:
            return None
    try:
        domain = unquote_to_bytes(text).decode("utf-8")
        ascii_domain = domain.lower() if domain.isascii() else domain.encode("idna").decode("ascii").lower()
    except (UnicodeError, ValueError):
        return None
    if ascii_domain == "" or _FORBIDDEN_DOMAIN.search(ascii_domain):
        return None
    if not _ends_in_a_number(ascii_domain):
        return ascii_domain
    address = _whatwg_ipv4(ascii_domain)
    return None if address is None else str(ipaddress.IPv4Address(address))


def _ends_in_a_number(domain: str) -> bool:
    parts = domain.split(".")
    if parts[-1] == "":
        if len(parts) == 1:
            return False
        parts.pop()
    last = parts[-1]
    return (last != "" and last.isascii() and last.isdigit()) or _ipv4_number(last) is not None


def _whatwg_ipv4(domain: str) -> int | None:
    parts = domain.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    if len(parts) > 4:
        return None
    numbers = [_ipv4_number(part) for part in parts]
    if any(n is None for n in numbers):
        return None
    values = [n for n in numbers if n is not None]
    if any(n > 255 for n in values[:-1]) or values[-1] >= 256 ** (5 - len(values)):
        return None
    address: int = values[-1] + sum(n * 256 ** (3 - i) for i, n in enumerate(values[:-1]))
    return address


def _ipv4_number(part: str) -> int | None:
    """One part of an IPv4 address: decimal, octal with a leading 0, hex after 0x."""
    if part == "" or not part.isascii():
        return None
    radix = 10
    if part[:2] in ("0x", "0X"):
        part, radix = part[2:], 16
    elif len(part) > 1 and part[0] == "0":
        part, radix = part[1:], 8
    if part == "":
        return 0
    digits = "0123456789abcdef"[:radix]
    if any(c not in digits for c in part.lower()):
        return None
    return int(part, radix)


def _whatwg_path(path: str) -> str:
    """A special URL's path as the WHATWG parser writes it: ``\\`` is ``/``, dot segments are
    resolved, and what the path percent-encode set names is percent-encoded (as UTF-8)."""
    segments: list[str] = []
    raw = path.replace("\\", "/").split("/")[1:] if path else []
    for index, segment in enumerate(raw):
        last = index == len(raw) - 1
        lowered = segment.lower()
        if lowered in _DOUBLE_DOT:
            if segments:
                segments.pop()
            if last:
                segments.append("")
        elif lowered in _SINGLE_DOT:
            if last:
                segments.append("")
        else:
            segments.append("".join(_escape_path_char(c) for c in segment))
    return "/" + "/".join(segments)


def _escape_path_char(c: str) -> str:
    if c in _PATH_ESCAPED or ord(c) < 0x20 or ord(c) > 0x7e:
        if 0xD800 <= ord(c) <= 0xDFFF:  # a lone surrogate is U+FFFD to the parser
            c = "\ufffd"
        return "".join(f"%{b:02X}" for b in c.encode("utf-8"))
    return c
