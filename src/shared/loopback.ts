// The loopback predicates (docs/protocol.md R1, R2), built on ipaddr.js.
//
// Shared by both threads: the main thread judges peers and callback URLs at registration, and the
// callback workers re-check the canonical URL and the connected socket's peer at call time. Pure
// functions, no state, so importing this file from src/workers keeps the one-way import rule
// (nothing in src/workers imports from src/main).
import ipaddr from 'ipaddr.js'

/**
 * True when `address` (a socket's remote address, as Node reports it) is a loopback address:
 * 127.0.0.0/8, ::1, or an IPv4-mapped loopback address (::ffff:127.0.0.0/104).
 * Anything unparseable (including undefined or a zone-scoped address) is not loopback.
 *
 * @example
 * isLoopbackAddress('::ffff:127.0.0.1') // true
 */
export function isLoopbackAddress (address: string | undefined | null): boolean {
  if (typeof address !== 'string') return false
  const parsed = parseAddress(address)
  if (parsed === undefined) return false
  if (parsed.kind() === 'ipv6') {
    const v6 = parsed as ipaddr.IPv6
    if (v6.isIPv4MappedAddress()) return v6.toIPv4Address().range() === 'loopback'
    return v6.range() === 'loopback'
  }
  // ipaddr.isValid accepts legacy IPv4 forms ("127.1", "0x7f.1"); Node never reports those for a
  // socket, and a peer address must be exact, so insist on four decimal parts.
  return ipaddr.IPv4.isValidFourPartDecimal(address) && parsed.range() === 'loopback'
}

/**
 * True for an IPv4-mapped IPv6 address (`::ffff:127.0.0.1`, `::ffff:7f00:1`, …); the
 * IPv4-compatible form `::127.0.0.1` is not one.
 */
export function isIPv4MappedAddress (address: string): boolean {
  const parsed = parseAddress(address)
  return parsed !== undefined && parsed.kind() === 'ipv6' && (parsed as ipaddr.IPv6).isIPv4MappedAddress()
}

/** True for the address of every interface: `0.0.0.0` or `::`, in any spelling ipaddr.js reads. */
export function isUnspecifiedAddress (address: string): boolean {
  return parseAddress(address)?.range() === 'unspecified'
}

/** An address as ipaddr.js reads it; undefined when it is empty, zone-scoped or not an address. */
function parseAddress (address: string): ipaddr.IPv4 | ipaddr.IPv6 | undefined {
  if (address.length === 0 || address.includes('%')) return undefined
  let text = address
  if (text.includes(':')) {
    // ipaddr.js 2.5 reads the deprecated IPv4-compatible form `::127.0.0.1` (= ::7f00:1, not
    // loopback) as if it were IPv4-mapped `::ffff:127.0.0.1`. Let the WHATWG serialiser write the
    // address in hex first; it keeps `::ffff:` only where it really is there.
    try {
      text = new URL(`http://[${text}]/`).hostname.slice(1, -1)
    } catch {
      return undefined
    }
  }
  if (!ipaddr.isValid(text)) return undefined
  try {
    return ipaddr.parse(text)
  } catch {
    return undefined
  }
}

/** Why a callback URL was refused; `undefined` means accepted. */
export type CallbackUrlProblem =
  | 'not a valid absolute URL'
  | 'scheme must be http or https'
  | 'credentials (user:password@) are not allowed'
  | 'host is empty'
  | 'port must be 1 to 65535'
  | 'host must be a loopback address'

/** The parts of an accepted callback URL that the registry keeps. */
export interface CallbackUrlParts {
  /** The canonical WHATWG `href`. */
  href: string
  /** `scheme://host:port` with the default port explicit. */
  origin: string
  /** Path plus query, as sent in the request line. */
  path: string
  /** The URL host as it will be connected to: `localhost`, an IPv4 literal, or a bracketed IPv6. */
  hostname: string
  port: number
  isHttps: boolean
}

/**
 * Judges a callback URL on its WHATWG-parsed form (docs/protocol.md R2). Accepted hosts: `localhost` (any
 * case; the parser lower-cases it), an IPv4 address in 127.0.0.0/8 (any spelling the WHATWG parser
 * normalises to one, e.g. `127.1`), `[::1]`, and `[::ffff:127.x.y.z]` in either spelling.
 * Refused: userinfo, an empty host, `0.0.0.0`, `[::]`, `localhost.`, `*.localhost`, IPv6 zone ids
 * (the WHATWG parser rejects them) and every other host.
 *
 * @example
 * checkCallbackUrl('http://127.0.0.1:9333/tools/x').ok // true
 */
export function checkCallbackUrl (input: string):
  { ok: true, parts: CallbackUrlParts } | { ok: false, problem: CallbackUrlProblem } {
  let url: URL
  try {
    url = new URL(input)
  } catch {
    return { ok: false, problem: 'not a valid absolute URL' }
  }
  const isHttps = url.protocol === 'https:'
  if (!isHttps && url.protocol !== 'http:') return { ok: false, problem: 'scheme must be http or https' }
  // The parser drops an empty userinfo (`http://@localhost/`), so look at the raw authority too.
  if (url.username !== '' || url.password !== '' || hasUserinfo(input)) {
    return { ok: false, problem: 'credentials (user:password@) are not allowed' }
  }
  const hostname = url.hostname
  if (hostname === '') return { ok: false, problem: 'host is empty' }
  if (!isLoopbackHostname(hostname)) return { ok: false, problem: 'host must be a loopback address' }
  const port = url.port === '' ? (isHttps ? 443 : 80) : Number(url.port)
  if (port === 0) return { ok: false, problem: 'port must be 1 to 65535' }
  return {
    ok: true,
    parts: {
      href: url.href,
      origin: `${url.protocol}//${hostname}:${port}`,
      path: url.pathname + url.search,
      hostname,
      port,
      isHttps
    }
  }
}

/**
 * True when the authority of an absolute http(s) URL holds an `@` (userinfo, even empty). For
 * special schemes the parser accepts any run of slashes and backslashes after the colon. The text
 * is first cleaned as the WHATWG parser cleans it (leading and trailing C0 controls and spaces
 * removed, every tab and newline removed), so that `http:/\t/@127.0.0.1/` is read as the parser
 * reads it.
 */
function hasUserinfo (input: string): boolean {
  // (Loops, not a regex: `[\0- ]+$` backtracks quadratically over a long run of spaces.)
  let start = 0
  let end = input.length
  while (start < end && input.charCodeAt(start) <= 0x20) start++
  while (end > start && input.charCodeAt(end - 1) <= 0x20) end--
  const text = input.slice(start, end).replace(/[\t\n\r]/g, '')
  let i = text.indexOf(':') + 1
  if (i === 0) return false
  while (i < text.length && (text[i] === '/' || text[i] === '\\')) i++
  for (; i < text.length; i++) {
    const c = text[i]
    if (c === '@') return true
    if (c === '/' || c === '\\' || c === '?' || c === '#') return false
  }
  return false
}

/**
 * True for a WHATWG-canonical URL hostname that names loopback: `localhost`, a dotted-quad IPv4
 * in 127/8, or a bracketed IPv6 loopback / IPv4-mapped loopback. The input must already be
 * canonical (the URL parser lower-cases, converts IPv4 spellings and compresses IPv6).
 */
export function isLoopbackHostname (hostname: string): boolean {
  if (hostname === 'localhost') return true
  if (hostname.startsWith('[')) {
    if (!hostname.endsWith(']')) return false
    return isLoopbackAddress(hostname.slice(1, -1))
  }
  // The WHATWG parser turns every IPv4 spelling it accepts into a dotted quad; a host name that
  // is not one (including "localhost." and "x.localhost") is refused here.
  return ipaddr.IPv4.isValidFourPartDecimal(hostname) && isLoopbackAddress(hostname)
}

/**
 * A table of the `localhost` callback ports last reached over ::1, a byte per port, for the
 * connector of every thread that calls callbacks (src/shared/loopback-connector.ts).
 */
export function createLocalhostV6Ports (): SharedArrayBuffer {
  return new SharedArrayBuffer(65_536)
}
