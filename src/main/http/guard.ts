// The request guard: one `onRequest` hook, before any body is read, on every route (unknown
// paths included).
//
// - docs/protocol.md R1: the socket's peer address decides (never X-Forwarded-For; trustProxy is off), and an
//   unknown peer fails closed.
// - DNS rebinding: a page on attacker.example whose name now resolves to 127.0.0.1 reaches us
//   from a loopback peer, but its requests carry `Host: attacker.example`; only loopback names
//   (and configured extras) pass.
// - Cross-site requests: a browser adds `Origin` (and `Sec-Fetch-Site`) to a page's requests;
//   only Toolport's own origin (a loopback name with the port the request arrived on: /docs'
//   "Try it out", the MCP conformance check) and allow-listed origins pass, so another web page
//   cannot drive the API, not even with a "simple" POST that needs no CORS preflight.
// - Mutating methods must send `application/json`, which a cross-site form or simple request
//   cannot do without a preflight that we never answer with CORS headers.
import { createHash, timingSafeEqual } from 'node:crypto'
import type { FastifyReply, FastifyRequest, HookHandlerDoneFunction } from 'fastify'
import ipaddr from 'ipaddr.js'
import { isLoopbackAddress } from '../../shared/loopback.js'
import {
  BadRequestError, HostForbiddenError, NotLoopbackError, OriginForbiddenError, UnauthorizedError,
  UnsupportedMediaTypeError
} from '../errors.js'

export interface GuardOptions {
  checkHost: boolean
  allowedHosts: readonly string[]
  checkOrigin: boolean
  allowedOrigins: readonly string[]
  /** Token mode: the secret every request must present as `Authorization: Bearer <token>`. */
  token?: string | undefined
}

export type GuardHook = (request: FastifyRequest, reply: FastifyReply, done: HookHandlerDoneFunction) => void

/** The headers set on every answer, errors included (also by handleClientError, which has no reply). */
export const SECURITY_HEADERS: ReadonlyArray<readonly [name: string, value: string]> = [
  ['x-content-type-options', 'nosniff'],
  ['cache-control', 'no-store'],
  ['cross-origin-resource-policy', 'same-origin']
]

/**
 * The refusal of a peer that is not loopback (docs/protocol.md R1), or null for a loopback one;
 * an unknown peer fails closed.
 */
export function peerRefusal (peer: string | undefined): Error | null {
  return isLoopbackAddress(peer) ? null : new NotLoopbackError(peer ?? 'an unknown peer')
}

/** Sockets whose peer was found to be loopback (weak: gone with the connection). */
const loopbackSockets = new WeakMap<object, true>()

/** Builds the onRequest guard for the given security options. */
export function buildGuard (options: GuardOptions): GuardHook {
  const allowedHosts = new Set(options.allowedHosts.map((h) => h.toLowerCase()))
  const allowedOrigins = new Set(options.allowedOrigins)
  const { checkHost, checkOrigin } = options
  // Compare digests, not the strings: equal-length inputs for timingSafeEqual, and no early exit
  // that would leak how much of a guessed token was right.
  const tokenDigest = options.token === undefined ? null : sha256(options.token)

  return function toolportGuard (request, reply, done): void {
    for (const [name, value] of SECURITY_HEADERS) reply.header(name, value)

    const socket = request.raw.socket
    // A socket's peer never changes: judge it once per connection, not once per request.
    if (socket === undefined || socket === null || loopbackSockets.get(socket) !== true) {
      const refused = peerRefusal(socket?.remoteAddress)
      if (refused !== null) {
        done(refused)
        return
      }
      if (socket !== undefined && socket !== null) loopbackSockets.set(socket, true)
    }
    if (checkHost) {
      const problem = hostProblem(request, allowedHosts)
      if (problem !== '') {
        done(new HostForbiddenError(problem))
        return
      }
    } else if (request.raw.httpVersion === '1.1' && request.headers.host === undefined) {
      // The standalone server lets HTTP/1.1 without Host through to this guard (Node's
      // `requireHostHeader` is off) so that the check above answers it; without that check, it
      // is still the 400 RFC 9112 §3.2 asks for.
      done(new BadRequestError('an HTTP/1.1 request needs a Host header'))
      return
    }
    if (checkOrigin) {
      const origin = request.headers.origin
      if (origin !== undefined) {
        if (!allowedOrigins.has(origin) && !isOwnOrigin(origin, socket?.localPort) &&
          !(checkHost && isHostOrigin(origin, request.headers.host))) {
          done(new OriginForbiddenError(`Origin ${JSON.stringify(origin)} is not allowed`))
          return
        }
      } else {
        const site = request.headers['sec-fetch-site']
        if (site === 'cross-site' || site === 'same-site') {
          done(new OriginForbiddenError(`Sec-Fetch-Site ${site} without an allowed Origin`))
          return
        }
      }
    }
    if (tokenDigest !== null && !hasToken(request.headers.authorization, tokenDigest)) {
      reply.header('www-authenticate', 'Bearer')
      done(new UnauthorizedError())
      return
    }
    if (hasBodyMethod(request.method) && !isJsonContentType(request.headers['content-type'])) {
      done(new UnsupportedMediaTypeError(request.headers['content-type'] ?? 'no Content-Type'))
      return
    }
    done()
  }
}

/**
 * `http://127.0.0.1:<port>`, `http://localhost:<port>` or `http://[::1]:<port>` where `<port>` is
 * the port this request arrived on: a page Toolport itself served. (A rebinding page has its own
 * hostname in Origin, and another local web app has another port.)
 */
function isOwnOrigin (origin: string, localPort: number | undefined): boolean {
  if (localPort === undefined || !origin.startsWith('http://')) return false
  const rest = origin.slice(7)
  const colon = rest.lastIndexOf(':')
  const host = colon === -1 ? rest : rest.slice(0, colon)
  if (host !== '127.0.0.1' && host !== 'localhost' && host !== '[::1]') return false
  if (colon === -1) return localPort === 80
  const port = rest.slice(colon + 1)
  return /^[1-9]\d{0,4}$/.test(port) && Number(port) === localPort
}

/**
 * True when `Origin` is exactly `http://<Host>`: a page Toolport served itself, under the name it
 * was reached by. Only trusted once the Host check passed (a rebinding page's Host is refused).
 */
function isHostOrigin (origin: string, host: string | undefined): boolean {
  return host !== undefined && origin.toLowerCase() === `http://${host.toLowerCase()}`
}

function sha256 (text: string): Buffer {
  return createHash('sha256').update(text).digest()
}

function hasToken (authorization: string | undefined, digest: Buffer): boolean {
  if (authorization === undefined || !/^bearer /i.test(authorization)) return false
  return timingSafeEqual(sha256(authorization.slice(7).trim()), digest)
}

/**
 * Verdicts of recently seen Host header values ('' = allowed), per allowed-hosts set: clients send
 * the same Host on every request, and judging it (port syntax, ipaddr.js) cost ~2.4 µs a request.
 * Bounded: cleared when full, so a flood of distinct values costs only the uncached path.
 */
const hostVerdicts = new WeakMap<ReadonlySet<string>, Map<string, string>>()
const HOST_VERDICTS_MAX = 256

/** '' when the Host header names loopback (or an allowed extra), else what is wrong with it. */
function hostProblem (request: FastifyRequest, allowedHosts: ReadonlySet<string>): string {
  const raw = request.raw.rawHeaders
  let host: string | undefined
  let authority: string | undefined
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i] as string
    if (name.length === 4 && name.toLowerCase() === 'host') {
      if (host !== undefined) return '(duplicate Host headers)'
      host = raw[i + 1] as string
    } else if (name === ':authority') {
      // HTTP/2 (a host app may mount the plugin on an http2 server) names the target here and
      // Host is optional. A pseudo-header never reaches us over HTTP/1 (':' is not a name byte).
      authority = raw[i + 1] as string
    }
  }
  if (authority !== undefined) {
    // RFC 9113 §8.3.1: a Host naming another target than :authority makes the request malformed.
    if (host !== undefined && host.toLowerCase() !== authority.toLowerCase()) return '(Host differs from :authority)'
    host = authority
  } else {
    // HTTP/1.1 absolute form (`POST http://evil.example/api/tools/register`): the request-target
    // names the target, and RFC 9112 §3.2.2 has the server use it instead of Host. Judge it as a
    // Host, and refuse a Host that names another target (as for :authority above).
    const target = targetAuthority(request.raw.url)
    if (target !== undefined) {
      if (target === null) return '(the request-target holds userinfo or no host)'
      if (host !== undefined && host.toLowerCase() !== target.toLowerCase()) return '(Host differs from the request-target)'
      host = target
    }
  }
  if (host === undefined || host === '') return '(missing)'
  let verdicts = hostVerdicts.get(allowedHosts)
  if (verdicts === undefined) {
    verdicts = new Map()
    hostVerdicts.set(allowedHosts, verdicts)
  }
  let verdict = verdicts.get(host)
  if (verdict === undefined) {
    verdict = judgeHost(host, allowedHosts)
    if (verdicts.size >= HOST_VERDICTS_MAX) verdicts.clear()
    verdicts.set(host, verdict)
  }
  return verdict
}

/**
 * The authority of an absolute-form request-target (`http://host:port/path`), `null` when it has
 * userinfo or is empty, `undefined` for the origin form (`/path`) and every other form (`*`,
 * which matches no route).
 */
function targetAuthority (url: string | undefined): string | null | undefined {
  if (url === undefined || url.startsWith('/')) return undefined
  const match = /^[a-z][a-z0-9+.-]*:\/\/([^/?#]*)/i.exec(url)
  if (match === null) return undefined
  const authority = match[1] as string
  return authority === '' || authority.includes('@') ? null : authority
}

function judgeHost (host: string, allowedHosts: ReadonlySet<string>): string {
  const hostname = hostnameOf(host.toLowerCase())
  if (hostname === null) return JSON.stringify(host)
  if (isLoopbackHostHeader(hostname) || allowedHosts.has(hostname)) return ''
  return JSON.stringify(host)
}

/** The hostname of a Host header (port stripped), or null when malformed. */
function hostnameOf (host: string): string | null {
  let hostname = host
  let port = ''
  if (host.startsWith('[')) {
    const end = host.indexOf(']')
    if (end === -1) return null
    hostname = host.slice(0, end + 1)
    const rest = host.slice(end + 1)
    if (rest !== '') {
      if (!rest.startsWith(':')) return null
      port = rest.slice(1)
    }
  } else {
    const colon = host.indexOf(':')
    if (colon !== -1) {
      hostname = host.slice(0, colon)
      port = host.slice(colon + 1)
    }
  }
  if (port !== '' && !(/^\d{1,5}$/.test(port) && Number(port) <= 65535)) return null
  if (hostname === '' || /[^a-z0-9.\-[\]:]/.test(hostname)) return null
  return hostname
}

/** `localhost`, a strict dotted-decimal 127/8 address, or `[::1]`. */
function isLoopbackHostHeader (hostname: string): boolean {
  if (hostname === 'localhost' || hostname === '[::1]') return true
  return ipaddr.IPv4.isValidFourPartDecimal(hostname) && isLoopbackAddress(hostname)
}

function hasBodyMethod (method: string): boolean {
  return method === 'POST' || method === 'PUT' || method === 'PATCH'
}

/** `application/json`, optionally with `charset=utf-8` (any other parameter value is refused). */
export function isJsonContentType (value: string | undefined): boolean {
  if (value === undefined) return false
  const semicolon = value.indexOf(';')
  const type = (semicolon === -1 ? value : value.slice(0, semicolon)).trim().toLowerCase()
  if (type !== 'application/json') return false
  if (semicolon === -1) return true
  for (const param of value.slice(semicolon + 1).split(';')) {
    const [key, val] = param.split('=').map((p) => p.trim().toLowerCase())
    if (key === '' && val === undefined) continue
    if (key !== 'charset' || (val !== 'utf-8' && val !== 'utf8' && val !== '"utf-8"')) return false
  }
  return true
}
