// A model test of the request guard and of input validation, over real HTTP to a Toolport
// listening on 127.0.0.1 (raw sockets, so that every header byte is ours: duplicate Host headers,
// absolute-form targets, Origin and Sec-Fetch-Site, content types, bodies with a BOM, duplicate
// JSON keys, `__proto__` keys, out-of-range numbers, deep nesting, lone surrogates).
//
// The MODEL is what the documents promise (SECURITY.md "Inbound", docs/protocol.md R1, R2, R4–R8,
// "Errors of the API itself", "Ownership mode"; README "The API" and "Errors"):
// - the guard, in its documented order: Host (one header; `localhost`, a strict dotted-decimal
//   127/8 address, `[::1]` or an allowed name; port ignored, case-insensitive) → 403
//   TP_ERR_HOST_FORBIDDEN; Origin (own origin on the port the request arrived on, exactly
//   `http://` + Host, or allow-listed; without Origin, Sec-Fetch-Site cross-site/same-site is
//   refused) → 403 TP_ERR_ORIGIN_FORBIDDEN; the bearer token in token mode → 401; a route that does
//   not exist → 404 whatever its body; JSON only for POST/PUT/PATCH → 415. Then the body (413 too
//   deep, 400 not JSON), the plugin key in ownership mode (401 TP_ERR_PLUGIN_KEY_REQUIRED, 403
//   TP_ERR_NOT_OWNER), the fields (422 with `details` naming each field), the role (404), the
//   `parameters` schema (422 with `details[0].code`);
// - callback URLs (R2): judged on the WHATWG-parsed form: http/https, no userinfo (not even an
//   empty one), a canonical host that is `localhost`, a 127/8 dotted quad, `[::1]` or
//   `[::ffff:127.x.y.z]`, port not 0; the canonical href is stored and listed;
// - argument checks: a tool's arguments are valid exactly when a direct Ajv compile of the same
//   schema under the documented options (the `$schema` dialect, own-property semantics, RE2 for
//   `pattern`, the ajv-formats formats, remote `$ref`s never fetched) says so; a schema that Ajv
//   cannot compile (or that is not valid in its dialect) is a 422 `invalid_schema` at registration.
//
// Invariants checked after every request: the status and TP_ERR_* code are the model's; every
// answer has the security headers and no CORS grant; a 401/403 closes its connection; an error
// body has exactly the documented shape; no answer carries the token or a plugin key; the
// registry (tp.list()) is exactly the model's, so a refused request changed nothing; the server
// stays healthy. A trap callback server on 127.0.0.1 records every request it gets: a tool call
// reaches it exactly when the model accepted the URL and the arguments, and nothing the model
// refused ever reaches it (a URL such as `http://0.0.0.0:<trap>/` would, on Linux, if accepted).
//
// The tests at the end are the bugs this file found, shrunk to one case each, each pinning its
// fix; the generators above leave those exact inputs out so that the properties keep hunting.
// GUARD_PROPERTIES_SCALE=10 multiplies the runs of each property (the defaults fit ~8 s on 2 cores).
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { once } from 'node:events'
import { createServer as createHttpServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { connect, type AddressInfo } from 'node:net'
import { createRequire } from 'node:module'
import fc from 'fast-check'
import { request as httpRequest } from 'undici'
import { Ajv, type Format, type Options, type ValidateFunction } from 'ajv'
import { Ajv2019 } from 'ajv/dist/2019.js'
import { Ajv2020 } from 'ajv/dist/2020.js'
import { fullFormats } from 'ajv-formats/dist/formats.js'
import type { RE2 as RE2Type } from 're2-wasm'
import { ERROR_CODES } from '../../src/main/index.js'
import { checkProperty as check, byte, loopbackV4Spelling, startToolport, type StartedToolport } from '../helpers.js'

type Json = any

/** Runs per property: the defaults fit the file's time budget; GUARD_PROPERTIES_SCALE=10 hunts longer. */
function runs (n: number): number {
  return Math.max(1, Math.round(n * Number(process.env.GUARD_PROPERTIES_SCALE ?? 1)))
}

/**
 * `fc.assert`, with the failing assertion's own message in the error (fast-check keeps it as the
 * `cause`, which the test reporter does not print).
 */

// ---- Raw HTTP ----------------------------------------------------------------------------------

interface RawReply {
  status: number
  headers: Map<string, string[]>
  body: string
  json: Json
  /** Every byte of the answer, as latin1 text (for the secret-echo check). */
  raw: string
  /** The server ended the connection after the answer. */
  closed: boolean
}

/**
 * Sends `head` (request line and headers, without the blank line) and `body` on a new socket to
 * 127.0.0.1:port and reads one answer, by its Content-Length. Waits a little for the server to
 * end the connection when the answer says `connection: close`. Bounded: a silent server fails.
 */
async function exchange (port: number, head: string, body: Buffer = Buffer.alloc(0)): Promise<RawReply> {
  const socket = connect(port, '127.0.0.1')
  socket.on('error', () => {})
  try {
    await once(socket, 'connect')
    let received = Buffer.alloc(0)
    let ended = false
    const done = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no full answer within 5 s to ${JSON.stringify(head.slice(0, 200))}: ${received.toString('latin1').slice(0, 300)}`)), 5000)
      const check = (): void => {
        const split = received.indexOf('\r\n\r\n')
        if (split === -1) {
          if (ended) { clearTimeout(timer); reject(new Error(`connection closed without an answer to ${JSON.stringify(head.slice(0, 200))}`)) }
          return
        }
        const length = Number(/\r\ncontent-length: *(\d+)/i.exec(received.subarray(0, split).toString('latin1'))?.[1] ?? NaN)
        if ((Number.isNaN(length) && ended) || received.length - split - 4 >= length) {
          clearTimeout(timer)
          resolve()
        }
      }
      socket.on('data', (chunk: Buffer) => { received = Buffer.concat([received, chunk]); check() })
      socket.on('end', () => { ended = true; check() })
      socket.on('close', () => { ended = true; check() })
    })
    socket.write(Buffer.concat([Buffer.from(`${head}\r\n\r\n`, 'latin1'), body]))
    await done
    const split = received.indexOf('\r\n\r\n')
    const lines = received.subarray(0, split).toString('latin1').split('\r\n')
    const headers = new Map<string, string[]>()
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(':')
      const name = line.slice(0, colon).trim().toLowerCase()
      headers.set(name, [...(headers.get(name) ?? []), line.slice(colon + 1).trim()])
    }
    const text = received.subarray(split + 4).toString('utf8')
    if (headers.get('connection')?.[0]?.toLowerCase() === 'close' && !ended) {
      await Promise.race([once(socket, 'end'), once(socket, 'close'), new Promise((resolve) => setTimeout(resolve, 1000))])
    }
    let json: Json
    try { json = text === '' ? undefined : JSON.parse(text) } catch { json = undefined }
    return {
      status: Number(lines[0]?.split(' ')[1]),
      headers,
      body: text,
      json,
      raw: received.toString('latin1'),
      closed: ended || socket.readableEnded || socket.destroyed
    }
  } finally {
    socket.destroy()
  }
}

function header (reply: RawReply, name: string): string | undefined {
  return reply.headers.get(name)?.[0]
}

/** What every answer must carry (SECURITY.md "Inbound"), and never (no CORS grant). */
function assertEveryAnswer (reply: RawReply, what: string): void {
  assert.equal(header(reply, 'x-content-type-options'), 'nosniff', `nosniff on ${what}`)
  assert.equal(header(reply, 'cache-control'), 'no-store', `no-store on ${what}`)
  assert.equal(header(reply, 'cross-origin-resource-policy'), 'same-origin', `CORP on ${what}`)
  for (const name of reply.headers.keys()) assert.ok(!name.startsWith('access-control-'), `${name} on ${what}`)
}

/** docs/protocol.md "Errors of the API itself": the error body's exact shape, and a 401/403 closes. */
function assertErrorReply (reply: RawReply, status: number, code: string, what: string): void {
  assert.equal(reply.status, status, `${what}: status of ${reply.body.slice(0, 400)}`)
  const body = reply.json as Record<string, unknown>
  assert.ok(body !== null && typeof body === 'object', `${what}: a JSON error body, got ${reply.body.slice(0, 200)}`)
  assert.equal(body.code, code, `${what}: code of ${reply.body.slice(0, 400)}`)
  assert.equal(body.ok, false)
  assert.equal(body.statusCode, status)
  assert.equal(ERROR_CODES[code], status, `${code} is in the catalogue with status ${status}`)
  assert.equal(typeof body.error, 'string')
  assert.equal(typeof body.message, 'string')
  assert.deepEqual(Object.keys(body).filter((k) => !['ok', 'statusCode', 'code', 'error', 'message', 'details'].includes(k)), [])
  assert.equal(body.details !== undefined, status === 422, `${what}: only a 422 carries details`)
  assert.match(header(reply, 'content-type') ?? '', /^application\/json/)
  if (status === 401 || status === 403) {
    assert.equal(header(reply, 'connection')?.toLowerCase(), 'close', `${what}: a ${status} says Connection: close`)
    assert.ok(reply.closed, `${what}: a ${status} closes its connection`)
  }
}

// ---- A trap callback server ----------------------------------------------------------------------

interface Trap {
  port: number
  /** Request targets received, in order. */
  hits: string[]
  /** Sockets accepted (an https call to the plain-HTTP trap is a socket without a request). */
  connections: number
}

/** A plugin callback on 127.0.0.1 (and [::1] on the same port when it can) that answers its own path. */
async function startTrap (t: TestContext): Promise<Trap & { v6: boolean }> {
  const trap = { port: 0, hits: [] as string[], connections: 0, v6: false }
  const handler = (req: IncomingMessage, res: ServerResponse): void => {
    req.resume()
    req.on('end', () => {
      trap.hits.push(req.url ?? '')
      if (req.url?.includes('redirect=1') === true) {
        // A redirect to the trap itself: Toolport never follows one (SECURITY.md "Outbound").
        res.writeHead(307, { location: `http://127.0.0.1:${trap.port}/followed${req.url}` })
        res.end()
        return
      }
      res.setHeader('content-type', 'application/json')
      res.end(JSON.stringify({ output: req.url ?? '' }))
    })
  }
  const v4 = createHttpServer(handler)
  v4.on('connection', () => { trap.connections++ })
  v4.listen(0, '127.0.0.1')
  await once(v4, 'listening')
  trap.port = (v4.address() as AddressInfo).port
  t.after(() => new Promise<void>((resolve) => { v4.closeAllConnections(); v4.close(() => resolve()) }))
  const v6 = createHttpServer(handler)
  v6.on('connection', () => { trap.connections++ })
  trap.v6 = await new Promise<boolean>((resolve) => {
    v6.once('error', () => resolve(false))
    v6.listen(trap.port, '::1', () => resolve(true))
  })
  if (trap.v6) t.after(() => new Promise<void>((resolve) => { v6.closeAllConnections(); v6.close(() => resolve()) }))
  return trap
}

/** A JSON request over undici (keep-alive), for the register and call routes. */
async function postJson (url: string, path: string, text: string):
Promise<{ status: number, body: Json, text: string }> {
  const res = await httpRequest(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: text
  })
  const body = await res.body.text()
  let json: Json
  try { json = JSON.parse(body) } catch { json = undefined }
  return { status: res.statusCode, body: json, text: body }
}

async function assertHealthy (url: string, token?: string): Promise<void> {
  const res = await httpRequest(`${url}/api/health`, token === undefined ? {} : { headers: { authorization: `Bearer ${token}` } })
  const body = await res.body.json() as Json
  assert.equal(res.statusCode, 200, 'the server stays healthy')
  assert.equal(body.status, 'ready')
}

/** An object with exactly these own properties, `__proto__` included (a literal would set the prototype). */
function own (entries: ReadonlyArray<readonly [string, unknown]>): Record<string, unknown> {
  const out: Record<string, unknown> = {}
  for (const [key, value] of entries) {
    Object.defineProperty(out, key, { value, enumerable: true, writable: true, configurable: true })
  }
  return out
}

// ---- The guard model ------------------------------------------------------------------------------

const TOKEN = 'gp-token-0123456789abcdefghijklmnopqrstuvwxyzABCDEF'
const KEY_1 = 'gp-key-one-0123456789abcdefghijklmnopqrstuvwxyz'
const KEY_2 = 'gp-key-two-0123456789abcdefghijklmnopqrstuvwxyz'
const ALLOWED_HOST = 'toolport.test'
const ALLOWED_ORIGIN = 'http://localhost:5173'

/** SECURITY.md 2: a strict dotted-decimal address (no leading zeros, each part ≤ 255) in 127/8. */
function isStrictLoopbackQuad (name: string): boolean {
  const m = /^(0|[1-9]\d{0,2})\.(0|[1-9]\d{0,2})\.(0|[1-9]\d{0,2})\.(0|[1-9]\d{0,2})$/.exec(name)
  return m !== null && m.slice(1).every((p) => Number(p) <= 255) && m[1] === '127'
}

/** SECURITY.md 2: exactly one Host; its hostname (port ignored, case-insensitive) names loopback or an allowed name. */
function hostAllowed (hosts: readonly string[], allowList = true): boolean {
  if (hosts.length !== 1) return false
  const value = (hosts[0] as string).trim().toLowerCase()
  if (value === '') return false
  let name = value
  let port: string | null = null
  if (value.startsWith('[')) {
    const end = value.indexOf(']')
    if (end === -1) return false
    name = value.slice(0, end + 1)
    const rest = value.slice(end + 1)
    if (rest !== '') {
      if (!rest.startsWith(':')) return false
      port = rest.slice(1)
    }
  } else if (value.includes(':')) {
    name = value.slice(0, value.indexOf(':'))
    port = value.slice(value.indexOf(':') + 1)
  }
  // A port, when there is one, is digits naming a TCP port (an empty one is allowed by RFC 3986).
  if (port !== null && port !== '' && !(/^\d{1,5}$/.test(port) && Number(port) <= 65535)) return false
  return name === 'localhost' || name === '[::1]' || isStrictLoopbackQuad(name) || (allowList && name === ALLOWED_HOST)
}

/** SECURITY.md 3. `origins`: each Origin header sent (Node joins repeated ones with ", "). */
function originAllowed (origins: readonly string[], hosts: readonly string[], sfs: string | null, port: number,
  allowList: boolean): boolean {
  if (origins.length === 0) return sfs !== 'cross-site' && sfs !== 'same-site'
  const origin = origins.join(', ')
  if (allowList && origin === ALLOWED_ORIGIN) return true
  if ([`http://127.0.0.1:${port}`, `http://localhost:${port}`, `http://[::1]:${port}`].includes(origin)) return true
  // Exactly http:// + the (accepted) Host: the console's page under the name it was reached by.
  return hosts.length === 1 && origin.toLowerCase() === `http://${(hosts[0] as string).trim().toLowerCase()}`
}

/** RFC 6750 / SECURITY.md 4: `Authorization: Bearer <token>` (scheme case-insensitive). */
function tokenPresented (authorization: string | null): boolean {
  if (authorization === null) return false
  const m = /^bearer +(.*)$/i.exec(authorization.trim())
  return m !== null && (m[1] as string).trim() === TOKEN
}

/** The content types the docs admit (SECURITY.md 5): application/json, charset utf-8 at most. */
const JSON_TYPES = ['application/json', 'application/json; charset=utf-8', 'Application/JSON', 'application/json;charset=UTF-8',
  'application/json ; charset=utf-8', 'application/json; charset="utf-8"', 'application/json;charset=utf8']
const OTHER_TYPES = ['', 'text/plain', 'text/plain; charset=utf-8', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x',
  'application/json; charset=utf-16', 'application/json; charset=iso-8859-1', 'application/jsonx', 'application/ld+json', 'text/json',
  'application/json; foo=bar', 'application/json, text/plain', 'application/json; charset=utf-8; charset=utf-16']

/** SECURITY.md "Ownership mode": 32–512 visible ASCII characters, one header. */
function keyWellFormed (keys: readonly string[]): boolean {
  return keys.length === 1 && /^[\x21-\x7e]{32,512}$/.test((keys[0] as string).trim())
}

type RouteKind = 'list' | 'health' | 'register' | 'unregister' | 'unknown' | 'preflight' | 'put'
type BodyKind = 'valid' | 'empty-object' | 'null' | 'empty' | 'bad' | 'deep' | 'bom' | 'latin1'

interface GuardRequest {
  server: 'open' | 'locked'
  route: RouteKind
  absolute: boolean
  hosts: string[]
  origins: string[]
  sfs: string | null
  contentType: string | null
  authorization: string | null
  keys: string[]
  body: BodyKind
  otherHeaders: Array<[string, string]>
}

const hostName = fc.oneof(
  { weight: 4, arbitrary: fc.mixedCase(fc.constant('localhost')) },
  { weight: 4, arbitrary: fc.constantFrom('127.0.0.1', '127.1.2.3', '127.255.255.255', '[::1]', ALLOWED_HOST, 'TOOLPORT.test') },
  {
    weight: 4,
    arbitrary: fc.constantFrom('localhost.', 'a.localhost', 'evil.example', '127.0.0.1.', '127.1', '127.000.0.1', '0x7f.0.0.1',
      '2130706433', '128.0.0.1', '0.0.0.0', '[::]', '[0:0:0:0:0:0:0:1]', '[::ffff:127.0.0.1]', '[::1%25lo]', 'user@localhost',
      'localhost@evil.example', 'local host', '127.0.0.1.nip.io', '[::1', '::1', '', 'xn--localhost', 'toolport.test.',
      '127.0.0.256', '%6c%6f%63alhost', '[::1]x', 'localhost\\')
  },
  { weight: 1, arbitrary: fc.ipV4() },
  { weight: 1, arbitrary: fc.domain() }
)
const hostPort = fc.constantFrom(null, null, '', '80', '3917', '0', '65535', '65536', '99999', 'abc', '-1', '+80', '80:80', ' 80', '0080')
const hostValue = fc.tuple(hostName, hostPort).map(([name, port]) => port === null ? name : `${name}:${port}`)

function guardRequest (port: number, server: 'open' | 'locked'): fc.Arbitrary<GuardRequest> {
  const originChoice = fc.constantFrom('none', 'none', 'own127', 'ownLocalhost', 'ownV6', 'hostForm', 'hostFormUpper', 'allowed',
    'null', 'foreign', 'otherPort', 'trailingSlash', 'dup', 'empty', 'https', 'extension')
  return fc.record({
    route: fc.constantFrom('list', 'health', 'register', 'register', 'register', 'unregister', 'unknown', 'preflight', 'put') as
      fc.Arbitrary<RouteKind>,
    absolute: fc.boolean(),
    hostCount: fc.constantFrom(1, 1, 1, 1, 1, 0, 2),
    hostsGen: fc.array(hostValue, { minLength: 2, maxLength: 2 }),
    loopbackHost: fc.boolean(),
    originKind: originChoice,
    sfs: fc.constantFrom(null, null, 'cross-site', 'same-site', 'same-origin', 'none'),
    contentType: fc.oneof(
      { weight: 4, arbitrary: fc.constantFrom(...JSON_TYPES) },
      { weight: 2, arbitrary: fc.constantFrom(...OTHER_TYPES) },
      { weight: 1, arbitrary: fc.constant(null) }),
    authorization: fc.constantFrom(null, `Bearer ${TOKEN}`, `Bearer ${TOKEN}`, `bearer ${TOKEN}`, `Bearer   ${TOKEN}`,
      `Bearer ${TOKEN.slice(0, -1)}`, `Bearer ${TOKEN}x`, `Basic ${TOKEN}`, 'Bearer', TOKEN),
    keys: fc.constantFrom<string[]>([], [KEY_1], [KEY_1], [KEY_2], [KEY_1.slice(0, 31)], ['k'.repeat(513)], [`${KEY_1} x`], [KEY_1, KEY_1]),
    body: fc.constantFrom('valid', 'valid', 'valid', 'empty-object', 'null', 'empty', 'bad', 'deep', 'bom', 'latin1') as fc.Arbitrary<BodyKind>,
    otherHeaders: fc.subarray([['x-forwarded-for', '10.1.2.3'], ['forwarded', 'for=10.1.2.3;host=evil.example'],
      ['x-forwarded-host', 'evil.example'], ['x-http-method-override', 'DELETE'], ['access-control-request-method', 'POST']] as Array<[string, string]>)
  }).map((r) => {
    // Half the runs have a loopback Host, so that the later checks are reached as often as refusals.
    const hosts = r.loopbackHost ? [`127.0.0.1:${port}`] : r.hostsGen.slice(0, r.hostCount)
    const host = hosts[0] ?? `127.0.0.1:${port}`
    const origins = ((): string[] => {
      switch (r.originKind) {
        case 'none': return []
        case 'own127': return [`http://127.0.0.1:${port}`]
        case 'ownLocalhost': return [`http://localhost:${port}`]
        case 'ownV6': return [`http://[::1]:${port}`]
        case 'hostForm': return [`http://${host}`]
        case 'hostFormUpper': return [`http://${host.toUpperCase()}`]
        case 'allowed': return [ALLOWED_ORIGIN]
        case 'null': return ['null']
        case 'foreign': return ['https://evil.example']
        case 'otherPort': return [`http://127.0.0.1:${port + 1}`]
        case 'trailingSlash': return [`http://127.0.0.1:${port}/`]
        case 'dup': return [`http://127.0.0.1:${port}`, 'https://evil.example']
        case 'empty': return ['']
        case 'extension': return ['chrome-extension://abcdefghijklmnopabcdefghijklmnop']
        default: return [`https://127.0.0.1:${port}`]
      }
    })()
    return {
      server,
      route: r.route,
      // Absolute-form only with a loopback authority that is also the Host header: a foreign one is
      // the regression test "absolute-form request-target" below.
      absolute: r.absolute && hosts.length === 1 && hostAllowed(hosts, server === 'open'),
      hosts,
      origins,
      sfs: r.sfs,
      contentType: r.contentType,
      authorization: server === 'locked' ? r.authorization : null,
      keys: r.keys,
      body: r.body,
      otherHeaders: r.otherHeaders
    }
  })
}

interface Expected { status: number, code?: string }

/** What the documents say the answer to `r` is, on a server whose source owner so far is `owner`. */
function expectGuard (r: GuardRequest, port: number, owner: string | null): Expected {
  // Only the open server has the allow-lists (security.allowedHosts, security.allowedOrigins).
  const allowList = r.server === 'open'
  if (!hostAllowed(r.hosts, allowList)) return { status: 403, code: 'TP_ERR_HOST_FORBIDDEN' }
  if (!originAllowed(r.origins, r.hosts, r.sfs, port, allowList)) return { status: 403, code: 'TP_ERR_ORIGIN_FORBIDDEN' }
  if (r.server === 'locked' && !tokenPresented(r.authorization)) return { status: 401, code: 'TP_ERR_UNAUTHORIZED' }
  // A route that does not exist is 404 whatever its body (README "Errors": TP_ERR_ROUTE_NOT_FOUND).
  if (r.route === 'put') return { status: 404, code: 'TP_ERR_ROUTE_NOT_FOUND' }
  const hasBody = r.route === 'register' || r.route === 'unregister'
  if (hasBody && (r.contentType === null || !JSON_TYPES.includes(r.contentType))) {
    return { status: 415, code: 'TP_ERR_UNSUPPORTED_MEDIA_TYPE' }
  }
  switch (r.route) {
    case 'list': case 'health': return { status: 200 }
    case 'unknown': case 'preflight': return { status: 404, code: 'TP_ERR_ROUTE_NOT_FOUND' }
    case 'unregister':
      if (r.server === 'locked' && !keyWellFormed(r.keys)) return { status: 401, code: 'TP_ERR_PLUGIN_KEY_REQUIRED' }
      return { status: 200 }
  }
  switch (r.body) {
    case 'empty': case 'bad': case 'bom': case 'latin1': return { status: 400, code: 'TP_ERR_BAD_JSON' }
    case 'deep': return { status: 413, code: 'TP_ERR_JSON_TOO_DEEP' }
  }
  if (r.server === 'locked' && !keyWellFormed(r.keys)) return { status: 401, code: 'TP_ERR_PLUGIN_KEY_REQUIRED' }
  if (r.body !== 'valid') return { status: 422, code: 'TP_ERR_VALIDATION' }
  if (r.server === 'locked' && owner !== null && owner !== (r.keys[0] as string).trim()) return { status: 403, code: 'TP_ERR_NOT_OWNER' }
  return { status: 200 }
}

function guardBody (kind: BodyKind, name: string, source: string): Buffer {
  const valid = JSON.stringify({ name, callback_url: 'http://127.0.0.1:9/cb', source })
  switch (kind) {
    case 'valid': return Buffer.from(valid)
    case 'empty-object': return Buffer.from('{}')
    case 'null': return Buffer.from('null')
    case 'empty': return Buffer.alloc(0)
    case 'bad': return Buffer.from('{"name": "x",')
    case 'deep': return Buffer.from(`{"name":${'['.repeat(64)}${']'.repeat(64)}}`)
    case 'bom': return Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(valid)])
    // Not UTF-8: the name holds the bytes 0xff 0xfe and a lone surrogate encoded as UTF-8 (CESU).
    case 'latin1': return Buffer.concat([Buffer.from(valid.slice(0, 10)), Buffer.from([0xff, 0xfe, 0xed, 0xa0, 0x80]), Buffer.from(valid.slice(10))])
  }
}

function guardHead (r: GuardRequest, port: number, body: Buffer): string {
  const method = { list: 'GET', health: 'GET', register: 'POST', unregister: 'POST', unknown: 'GET', preflight: 'OPTIONS', put: 'PUT' }[r.route]
  const path = {
    list: '/api/tools',
    health: '/api/health',
    register: '/api/tools/register',
    unregister: '/api/tools/unregister',
    unknown: '/api/nope',
    preflight: '/api/tools/register',
    put: '/api/tools'
  }[r.route]
  const target = r.absolute ? `http://${(r.hosts[0] as string).trim()}${path}` : path
  // HTTP/1.1 requires a Host header (one without it is the regression test "requests refused
  // before routing" below); HTTP/1.0 may leave it out.
  const lines = [`${method} ${target} HTTP/1.${r.hosts.length === 0 ? 0 : 1}`]
  for (const host of r.hosts) lines.push(`Host: ${host}`)
  for (const origin of r.origins) lines.push(`Origin: ${origin}`)
  if (r.sfs !== null) lines.push(`Sec-Fetch-Site: ${r.sfs}`)
  if (r.authorization !== null) lines.push(`Authorization: ${r.authorization}`)
  for (const key of r.keys) lines.push(`X-Toolport-Plugin-Key: ${key}`)
  for (const [name, value] of r.otherHeaders) lines.push(`${name}: ${value}`)
  if (r.route === 'register' || r.route === 'unregister' || r.route === 'put') {
    if (r.contentType !== null) lines.push(`Content-Type: ${r.contentType}`)
    lines.push(`Content-Length: ${body.length}`)
  }
  lines.push('Connection: close')
  return lines.join('\r\n')
}

test('guard (property): every combination of Host, absolute-form target, Origin, Sec-Fetch-Site, token, content type, plugin key and body gets the documented answer, and only a 200 changes the registry', async (t) => {
  const open = await startToolport(t, {
    roles: ['A', 'B'],
    security: { allowedHosts: [ALLOWED_HOST], allowedOrigins: [ALLOWED_ORIGIN] }
  })
  const locked = await startToolport(t, { roles: ['A'], security: { token: TOKEN, enforceOwnership: true } })
  let owner: string | null = null
  let n = 0
  const requestArb = fc.oneof({ weight: 2, arbitrary: guardRequest(open.port, 'open') }, { weight: 1, arbitrary: guardRequest(locked.port, 'locked') })
  await check(fc.asyncProperty(requestArb, async (r) => {
    const server: StartedToolport = r.server === 'open' ? open : locked
    const name = `g${n++}`
    const body = r.route === 'register'
      ? guardBody(r.body, name, 'gp:guard')
      : r.route === 'unregister'
        ? Buffer.from(JSON.stringify({ name: `nope-${name}` }))
        : r.route === 'put' ? Buffer.from('{}') : Buffer.alloc(0)
    // A body with a BOM or bytes that are not UTF-8: RFC 8259 lets a parser ignore a BOM, and the
    // docs say nothing of bytes that are not UTF-8 (Toolport reads them as U+FFFD). Either reading
    // is allowed: refused as not JSON, or taken as the JSON it then is, with all that follows.
    const lenient = r.route === 'register' && (r.body === 'bom' || r.body === 'latin1')
    const readings = [expectGuard(r, server.port, owner)]
    if (lenient) readings.push(expectGuard({ ...r, body: 'valid' }, server.port, owner))
    const before = JSON.stringify(server.tp.list())
    const head = guardHead(r, server.port, body)
    const reply = await exchange(server.port, head, body)
    const what = JSON.stringify(head)
    assertEveryAnswer(reply, what)
    assert.ok(!reply.raw.includes(TOKEN) && !reply.raw.includes(KEY_1) && !reply.raw.includes(KEY_2), `${what}: the answer echoes a secret`)
    const expected = readings.find((e) => e.status === reply.status &&
      (e.code === undefined || e.code === reply.json?.code)) ?? readings[0] as Expected
    if (expected.code !== undefined) {
      assertErrorReply(reply, expected.status, expected.code, what)
      assert.equal(JSON.stringify(server.tp.list()), before, `${what}: a refused request changed the registry`)
    } else {
      assert.equal(reply.status, expected.status, `${what}: ${reply.body.slice(0, 400)}`)
      assert.equal(reply.json.ok, true, `${what}: ${reply.body.slice(0, 400)}`)
      if (r.route === 'register') {
        const roles = server === open ? ['A', 'B'] : ['A']
        const registered = r.body === 'latin1' ? body.subarray(9, body.indexOf('"', 10)).toString('utf8') : name
        assert.deepEqual(reply.json, { ok: true, registered, affected_roles: roles, failed_roles: [] })
        for (const role of roles) assert.equal(server.tp.list(role).tools_by_role[role]?.at(-1)?.name, registered)
        if (r.server === 'locked') owner ??= (r.keys[0] as string).trim()
      } else {
        assert.equal(JSON.stringify(server.tp.list()), before, `${what}: a request that is not a registration changed the registry`)
      }
    }
    await assertHealthy(server.url, r.server === 'locked' ? TOKEN : undefined)
  }), { numRuns: runs(400) })
  await assertHealthy(open.url)
  await assertHealthy(locked.url, TOKEN)
})

// ---- The registration model (fields and callback URLs) ---------------------------------------------

/** IPv4 inside IPv6: mapped (::ffff:) and the deprecated compatible (::a.b.c.d) form, dotted or hex. */
const embeddedV6 = fc.tuple(fc.oneof(fc.constant(127), fc.constant(0), byte), byte, byte, byte, fc.constantFrom('::ffff:', '::', '0:0:0:0:0:ffff:', '64:ff9b::'),
  fc.boolean()).map(([a, b, c, d, prefix, dotted]) => dotted
  ? `[${prefix}${a}.${b}.${c}.${d}]`
  : `[${prefix}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}]`)

const hostSpelling = fc.oneof(
  { weight: 10, arbitrary: fc.constantFrom('127.0.0.1', 'localhost', '[::1]', '[::ffff:127.0.0.1]') },
  { weight: 3, arbitrary: loopbackV4Spelling },
  { weight: 2, arbitrary: embeddedV6 },
  {
    weight: 4,
    arbitrary: fc.constantFrom('0.0.0.0', '0', '0x0', '0.0.0.0.', '000.0.0.0', '0.0', '[::]', '[::0]', '[0:0::0]', '[::ffff:0.0.0.0]',
      '[0:0:0:0:0:0:0:1]', '[::1%25lo]', '[fe80::1%25eth0]', '127.0.0.1.', 'localhost.', 'LOCALHOST', 'LocalHost',
      '\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54', 'loc%61lhost', 'localhost%2e', '127\u30020\u30020\u30021',
      '\u2460\u2461\u2466.0.0.1', '127.0.0.1%2e', 'local\u00adhost', 'a.localhost', 'localhost.localdomain', 'localtest.me',
      '127.0.0.1.nip.io', '127.0.0.256', '127.1', '0177.1', '0x7f.1', '2130706433', '4294967295', '[::ffff:7f00:1]',
      '[::127.0.0.1]', '[64:ff9b::7f00:1]', '[::ffff:0:7f00:1]', '[fe80::1]', '10.0.0.1', '169.254.169.254', '[2001:db8::1]',
      '\u24db\u24de\u24d2\u24d0\u24db\u24d7\u24de\u24e2\u24e3', 'xn--lcalhost-9ya', '%31%32%37.0.0.1', '')
  },
  { weight: 1, arbitrary: fc.ipV4() },
  { weight: 1, arbitrary: fc.ipV6().map((a) => `[${a}]`) },
  { weight: 1, arbitrary: fc.domain() }
)

interface UrlCase {
  /** The URL for a run: its path starts with `/cb/<id>`, which maps a trap hit to its run. */
  text: (id: string) => string
  /** The trap's port was used. */
  trapPort: boolean
}

function callbackUrl (trapPort: number): fc.Arbitrary<UrlCase> {
  return fc.record({
    scheme: fc.oneof({ weight: 8, arbitrary: fc.constantFrom('http', 'http', 'http', 'https', 'HTTP', 'HtTpS') },
      { weight: 1, arbitrary: fc.constantFrom('ftp', 'ws', 'file', 'javascript', 'gopher') }),
    sep: fc.constantFrom('://', '://', '://', '://', ':\\\\', ':/\\', ':///', ':'),
    userinfo: fc.oneof({ weight: 8, arbitrary: fc.constant('') },
      { weight: 1, arbitrary: fc.constantFrom('user@', 'user:pass@', ':@', '@', ':pass@', 'localhost@', '127.0.0.1:80@', '%40@', 'u%3Ap@') }),
    host: hostSpelling,
    port: fc.oneof({ weight: 6, arbitrary: fc.constant('trap') }, {
      weight: 2,
      arbitrary: fc.constantFrom('', ':', ':0', ':80', ':65535', ':65536', ':abc', ':0080', ':+80')
    }),
    suffix: fc.constantFrom('', '', '?q=1', '#frag', '/a%2e%2e/b', '/@10.0.0.1', '/..%2f..%2f', '\\@10.0.0.1', '?x=@10.0.0.1', '/%ZZ', '/\u00e9',
      '?redirect=1'),
    prefix: fc.constantFrom('', '', '', ' ', '\u0001', '\t'),
    trailer: fc.constantFrom('', '', ' ', '\n'),
    // A tab or newline anywhere from the authority on: the WHATWG parser removes it. (Between the
    // colon and the slashes it hides an empty userinfo: the regression test below.)
    whitespace: fc.option(fc.tuple(fc.constantFrom('\t', '\n', '\r'), fc.nat()), { freq: 4 })
  }).map((u) => {
    const port = u.port === 'trap' ? `:${trapPort}` : u.port
    const text = (id: string): string => {
      let rest = `${u.userinfo}${u.host}${port}/cb/${id}${u.suffix}`
      if (u.whitespace !== null) {
        const at = u.whitespace[1] % (rest.length + 1)
        rest = rest.slice(0, at) + u.whitespace[0] + rest.slice(at)
      }
      return `${u.prefix}${u.scheme}${u.sep}${rest}${u.trailer}`
    }
    return { text, trapPort: u.port === 'trap', toString: () => JSON.stringify(text('ID')) }
  })
}

/**
 * docs/protocol.md R2 on the WHATWG parse: http/https, no userinfo (the raw authority, after the
 * parser's own removal of tabs and newlines, holds no `@`), a canonical host that is `localhost`,
 * a 127/8 dotted quad, `[::1]` or `[::ffff:127.x.y.z]`, and a port that is not 0.
 */
function urlModel (input: string): { ok: false } | { ok: true, url: URL } {
  let url: URL
  try { url = new URL(input) } catch { return { ok: false } }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return { ok: false }
  if (url.username !== '' || url.password !== '') return { ok: false }
  // eslint-disable-next-line no-control-regex
  const cleaned = input.replace(/^[\u0000-\u0020]+|[\u0000-\u0020]+$/g, '').replace(/[\t\n\r]/g, '')
  if (/^[a-z][a-z0-9+.-]*:[/\\]*[^/\\?#]*@/i.test(cleaned)) return { ok: false }
  if (url.port === '0') return { ok: false }
  const host = url.hostname
  const ok = host === 'localhost' || host === '[::1]' || isStrictLoopbackQuad(host) ||
    /^\[::ffff:7f[0-9a-f]{2}:[0-9a-f]{1,4}\]$/.test(host)
  return ok ? { ok: true, url } : { ok: false }
}

// Each field: values the docs accept, and values they refuse (rarer, so that whole registrations pass often).
const TIMEOUTS: FieldValues = [[undefined, '30', '0.5', '300', '300.0000000000000001', '5e-324', '"30"', '" 7 "', '"+5"', '"5."', '".5"',
  '"1e2"', '"2.5E1"'], ['0', '-0', '-1', '300.5', '1e400', '"0"', '"-5"', '"301"', '"1e3"', '"abc"', '""', '"5s"', '"NaN"', '"Infinity"',
  'true', 'null', '[]', '{}']]
const ROLES_FIELD: FieldValues = [[undefined, undefined, 'null', '"A"', '"B"'], ['"Nope"', '""', '"__proto__"', '"toString"', '42', '"a"']]
const SOURCES_FIELD: FieldValues = [[undefined, '"plugin:x"', JSON.stringify('s'.repeat(256)), '"__proto__"', '"\\ud800"'],
  ['""', JSON.stringify('s'.repeat(257)), '42']]
const DESCRIPTIONS: FieldValues = [[undefined, '""', '"Get the weather."', JSON.stringify('\u00e9'.repeat(16384)), '"\\ud83d"'],
  [JSON.stringify('x'.repeat(16385)), '42', 'null']]
const NAMES: FieldValues = [['VALID', 'VALID', 'VALID', 'VALID', JSON.stringify('\u{1F600}'.repeat(64)), '"\\ud800"', '"a\\u0000b"', '"__proto__"'],
  ['""', JSON.stringify('\u{1F600}'.repeat(65)), JSON.stringify('n'.repeat(65)), '42', 'null', undefined]]

type FieldValues = [accepted: Array<string | undefined>, refused: Array<string | undefined>]

function field ([accepted, refused]: FieldValues): fc.Arbitrary<string | undefined> {
  return fc.oneof(
    { weight: 12, arbitrary: fc.constantFrom(...accepted) },
    { weight: 1, arbitrary: fc.constantFrom(...refused) })
}

/** `parameters` variants with what the docs say of each. */
const PARAMETERS: Array<{ text: string | undefined, verdict: 'ok' | 'type' | 'too_deep' | 'too_big' | 'non_finite' | 'unsupported_dialect' | 'invalid_schema' }> = [
  { text: undefined, verdict: 'ok' },
  { text: '{"type":"object"}', verdict: 'ok' },
  { text: '{"type":"object","properties":{"q":{"type":"string"}}}', verdict: 'ok' },
  { text: '{"__proto__":{"required":["x"]},"type":"object"}', verdict: 'ok' },
  { text: '[]', verdict: 'type' },
  { text: 'null', verdict: 'type' },
  { text: '"object"', verdict: 'type' },
  { text: `${'{"if":'.repeat(31)}{}${'}'.repeat(31)}`, verdict: 'ok' },
  { text: `${'{"if":'.repeat(32)}{}${'}'.repeat(32)}`, verdict: 'too_deep' },
  { text: JSON.stringify({ type: 'object', description: 'd'.repeat(65_536) }), verdict: 'too_big' },
  { text: '{"$schema":"http://json-schema.org/draft-04/schema#","type":"object"}', verdict: 'unsupported_dialect' },
  { text: '{"$schema":42}', verdict: 'unsupported_dialect' },
  { text: '{"type":"nope"}', verdict: 'invalid_schema' },
  { text: '{"$ref":"https://example.com/schema.json"}', verdict: 'invalid_schema' },
  // Judged with the size limits, before the role: JSON would turn the number into null.
  { text: '{"type":"number","maximum":1e400}', verdict: 'non_finite' }
]

/** docs/protocol.md "Register": a number > 0 and ≤ 300, or a numeric (decimal) string of one. */
function timeoutOk (value: unknown): boolean {
  if (typeof value === 'number') return Number.isFinite(value) && value > 0 && value <= 300
  if (typeof value !== 'string') return false
  const text = value.trim()
  if (!/^[+]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(text)) return false
  const n = Number(text)
  return n > 0 && n <= 300
}

function codePoints (s: string): number {
  return [...s].length
}

interface RegistryRow {
  name: string
  description: string
  source: string
  callback_url: string | null
  is_remote: boolean
}

test('registration (property): every field, every callback URL spelling, duplicate and __proto__ keys and out-of-range numbers get the documented answer; the registry is exactly the model\'s; calls reach the trap exactly for the URLs the model accepts', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A', 'B'] })
  const trap = await startTrap(t)
  // Canonical hosts the trap answers on (the plain 127.0.0.1 always; the others if this machine routes them).
  const reachable = new Set(['127.0.0.1'])
  if (trap.v6) reachable.add('[::1]')
  for (const host of ['localhost', '[::ffff:7f00:1]']) {
    const probe = `http://${host}:${trap.port}/probe-${host.replace(/\W/g, '')}`
    await tp.register({ name: 'probe', callback_url: probe, role: 'A' })
    const result = await tp.callTool('A', { name: 'probe', arguments: {} })
    if (!result.is_error && trap.hits.includes(new URL(probe).pathname)) reachable.add(host)
    await tp.unregister({ name: 'probe' })
  }
  const model = new Map<string, RegistryRow[]>([['A', []], ['B', []]])
  const acceptedIds = new Set<string>()
  let run = 0

  const caseArb = fc.record({
    name: field(NAMES),
    description: field(DESCRIPTIONS),
    parameters: fc.oneof(
      { weight: 8, arbitrary: fc.constantFrom(0, 1, 2, 3, 7) },
      { weight: 1, arbitrary: fc.nat(PARAMETERS.length - 1) }),
    role: field(ROLES_FIELD),
    source: field(SOURCES_FIELD),
    timeout: field(TIMEOUTS),
    url: fc.oneof({ weight: 12, arbitrary: fc.constant('GEN') }, { weight: 1, arbitrary: fc.constantFrom('42', 'null', 'MISSING') }),
    urlCase: callbackUrl(trap.port),
    duplicate: fc.constantFrom('none', 'none', 'none', 'none', 'none', 'foreignFirst', 'foreignLast'),
    extras: fc.subarray(['"__proto__":{"callback_url":"http://10.0.0.1/","role":"Nope","name":""}', '"constructor":{"prototype":{"x":1}}',
      '"unknown_field":[1,2,3]', '"toString":"x"']),
    shape: fc.oneof({ weight: 20, arbitrary: fc.constant('object') }, { weight: 1, arbitrary: fc.constantFrom('[]', '"x"', 'null', '42') })
  })

  await check(fc.asyncProperty(caseArb, async (c) => {
    const id = `r${run++}`
    const urlText = c.urlCase.text(id)
    const name = c.name === 'VALID' ? `tool_${id}` : c.name
    const parameters = PARAMETERS[c.parameters] as typeof PARAMETERS[number]
    const entries: Array<[string, string]> = []
    if (name !== undefined) entries.push(['name', name === `tool_${id}` ? JSON.stringify(name) : name])
    if (c.description !== undefined) entries.push(['description', c.description])
    if (parameters.text !== undefined) entries.push(['parameters', parameters.text])
    const urlJson = c.url === 'GEN' ? JSON.stringify(urlText) : c.url
    if (c.duplicate === 'foreignFirst' && c.url !== 'MISSING') entries.push(['callback_url', '"http://10.0.0.1:80/"'])
    if (c.url !== 'MISSING') entries.push(['callback_url', urlJson])
    if (c.duplicate === 'foreignLast') entries.push(['callback_url', '"http://10.0.0.1:80/"'])
    if (c.role !== undefined) entries.push(['role', c.role])
    if (c.source !== undefined) entries.push(['source', c.source])
    if (c.timeout !== undefined) entries.push(['timeout_seconds', c.timeout])
    const text = c.shape === 'object'
      ? `{${[...entries.map(([k, v]) => `${JSON.stringify(k)}:${v}`), ...c.extras].join(',')}}`
      : c.shape

    // The model reads the body as JSON.parse does (the last of duplicate keys wins, `__proto__` is an own key).
    const body = JSON.parse(text) as unknown
    const problems = new Set<string>()
    let status = 200
    let code: string | undefined
    let schemaCode: string | undefined
    let targetRoles: string[] = []
    let accepted: { url: URL, row: RegistryRow, timeoutSeconds: number } | null = null
    if (typeof body !== 'object' || body === null || Array.isArray(body)) {
      problems.add('')
    } else {
      const b = body as Record<string, unknown>
      const get = (key: string): unknown => Object.hasOwn(b, key) ? b[key] : undefined
      const nameValue = get('name')
      // 1–64 code points of well-formed Unicode (a lone surrogate has no UTF-8 form).
      if (typeof nameValue !== 'string' || codePoints(nameValue) < 1 || codePoints(nameValue) > 64 ||
        /\p{Surrogate}/u.test(nameValue)) problems.add('name')
      const description = get('description')
      if (description !== undefined && typeof description !== 'string') problems.add('description')
      const params = get('parameters')
      if (params !== undefined && (typeof params !== 'object' || params === null || Array.isArray(params))) problems.add('parameters')
      const cb = get('callback_url')
      const verdict = typeof cb === 'string' ? urlModel(cb) : { ok: false as const }
      if (!verdict.ok) problems.add('callback_url')
      const role = get('role')
      if (role !== undefined && role !== null && (typeof role !== 'string' || role === '')) problems.add('role')
      const source = get('source')
      if (source !== undefined && (typeof source !== 'string' || source.length < 1 || source.length > 256)) problems.add('source')
      const timeout = get('timeout_seconds')
      if (timeout !== undefined && !timeoutOk(timeout)) problems.add('timeout_seconds')
      if (problems.size === 0) {
        // The configurable limits (SECURITY.md "Limits"), then the role, then the schema.
        if ((description as string | undefined ?? '').length > 16_384) problems.add('description')
        if (parameters.verdict === 'too_deep' || parameters.verdict === 'too_big' || parameters.verdict === 'non_finite') {
          problems.add('parameters')
          if (parameters.verdict === 'non_finite' && !problems.has('description')) schemaCode = 'invalid_schema'
        }
      }
      if (problems.size === 0) {
        targetRoles = role === undefined || role === null ? ['A', 'B'] : [role as string]
        if (!model.has(targetRoles[0] as string)) {
          status = 404
          code = 'TP_ERR_ROLE_NOT_FOUND'
        } else if (parameters.verdict === 'unsupported_dialect' || parameters.verdict === 'invalid_schema') {
          status = 422
          code = 'TP_ERR_VALIDATION'
          schemaCode = parameters.verdict
        } else if (verdict.ok) {
          accepted = {
            url: verdict.url,
            timeoutSeconds: timeout === undefined ? 30 : Number(typeof timeout === 'string' ? timeout.trim() : timeout),
            row: {
              name: nameValue as string,
              description: (description as string | undefined) ?? '',
              source: (source as string | undefined) ?? 'external',
              callback_url: verdict.url.href,
              is_remote: true
            }
          }
        }
      }
    }
    if (problems.size > 0) {
      status = 422
      code = 'TP_ERR_VALIDATION'
    }

    const before = JSON.stringify(tp.list())
    const reply = await postJson(url, '/api/tools/register', text)
    const what = `register ${text.length > 600 ? `${text.slice(0, 600)}…` : text}`
    assert.equal(reply.status, status, `${what} → ${reply.text.slice(0, 600)}`)
    if (code !== undefined) {
      assert.equal(reply.body.code, code, `${what} → ${reply.text.slice(0, 600)}`)
      assert.equal(JSON.stringify(tp.list()), before, `${what}: a refused registration changed the registry`)
      if (problems.size > 0) {
        assert.deepEqual(new Set((reply.body.details as Array<{ path: string }>).map((d) => d.path)), problems,
          `${what}: details name exactly the failing fields: ${reply.text.slice(0, 600)}`)
      }
      if (schemaCode !== undefined) {
        assert.equal(reply.body.details[0].path, 'parameters')
        assert.equal(reply.body.details[0].code, schemaCode, `${what} → ${reply.text.slice(0, 600)}`)
      }
    } else {
      assert.ok(accepted !== null)
      const answer = { ok: true, registered: accepted.row.name, affected_roles: targetRoles, failed_roles: [] }
      assert.deepEqual(reply.body, answer, what)
      acceptedIds.add(id)
      for (const role of targetRoles) {
        const rows = (model.get(role) as RegistryRow[]).filter((row) => row.name !== accepted.row.name)
        rows.push(accepted.row)
        model.set(role, rows)
      }
    }
    // The registry is exactly the model: names, order (R5: a replaced tool moves to the end), canonical URLs.
    assert.deepEqual(JSON.parse(JSON.stringify(tp.list().tools_by_role)), Object.fromEntries(model), `${what}: the registry is not the model's`)

    // A call reaches the trap exactly when the model accepted a URL on the trap's port, with a host
    // this machine routes to it, over http; the path is the canonical one. Nothing else reaches it.
    const hitsBefore = trap.hits.length
    if (accepted !== null && c.urlCase.trapPort) {
      const call = await postJson(url, '/api/tools/call', JSON.stringify({ role: targetRoles[0], name: accepted.row.name, arguments: {} }))
      assert.equal(call.status, 200, call.text)
      const canHit = accepted.url.protocol === 'http:' && reachable.has(accepted.url.hostname)
      // A tool whose timeout is a sliver of a second (5e-324 s: a 1 ms deadline) may time out
      // before it is sent, or after: it reaches the canonical path at most once.
      const expectHit = canHit && accepted.timeoutSeconds >= 0.5
      const path = accepted.url.pathname + accepted.url.search
      if (canHit && !expectHit) {
        assert.ok(trap.hits.slice(hitsBefore).every((hit) => hit === path) && trap.hits.length - hitsBefore <= 1,
          `${what}: ${trap.hits.slice(hitsBefore).join(', ')}`)
      } else if (expectHit) {
        assert.deepEqual(trap.hits.slice(hitsBefore), [path], `${what}: the call reaches the canonical path (and follows no redirect)`)
        if (path.includes('redirect=1')) {
          assert.equal(call.body.is_error, true, `a redirect is a tool error: ${call.text}`)
        } else {
          assert.equal(call.body.is_error, false, call.text)
          assert.equal(call.body.output, path)
        }
      } else {
        assert.equal(trap.hits.length, hitsBefore, `${what}: ${trap.hits.slice(hitsBefore).join(', ')}`)
      }
    }
    await assertHealthy(url)
    for (const hit of trap.hits.filter((h) => !h.startsWith('/probe-'))) {
      const hitId = /^\/cb\/(r\d+)/.exec(hit)?.[1]
      assert.ok(hitId !== undefined && acceptedIds.has(hitId), `the trap was reached for a URL the model refused: ${hit}`)
    }
  }), { numRuns: runs(200) })
  // Both verdicts, and calls that reach the trap, happened (a generator that only refused would prove
  // nothing). The floors sit far below the usual counts (about 40 accepted and 16 calls at the trap in
  // 200 runs), so that no seed fails them by chance.
  const calls = trap.hits.filter((h) => !h.startsWith('/probe-')).length
  assert.ok(acceptedIds.size > runs(200) / 10 && calls >= Math.min(3, runs(200)),
    `accepted ${acceptedIds.size}, calls at the trap ${calls}`)
  await assertHealthy(url)
})

// ---- The argument-validation model (a direct Ajv compile) ------------------------------------------

const requireHere = createRequire(import.meta.url)
const { RE2 } = requireHere('re2-wasm') as typeof import('re2-wasm')

type RegExpEngine = NonNullable<NonNullable<Options['code']>['regExp']>
type Dialect = '2020-12' | '2019-09' | 'draft-07'
const AJV_CLASSES = { '2020-12': Ajv2020, '2019-09': Ajv2019, 'draft-07': Ajv } as const

/** README "parameters and argument validation": the documented `$schema` URIs of each dialect. */
const DIALECTS = new Map<string, Dialect>([
  ['https://json-schema.org/draft/2020-12/schema', '2020-12'],
  ['https://json-schema.org/draft/2020-12/schema#', '2020-12'],
  ['https://json-schema.org/draft/2019-09/schema', '2019-09'],
  ['https://json-schema.org/draft/2019-09/schema#', '2019-09'],
  ['http://json-schema.org/draft-07/schema#', 'draft-07'],
  ['http://json-schema.org/draft-07/schema', 'draft-07']
])
const UNSUPPORTED_SCHEMAS: unknown[] = ['http://json-schema.org/draft-04/schema#', 'http://json-schema.org/draft-06/schema#',
  'https://json-schema.org/draft/next/schema', 'https://example.com/my-meta', '', 42, 'HTTPS://JSON-SCHEMA.ORG/DRAFT/2020-12/SCHEMA']

const metaAjvs = new Map<Dialect, Ajv>()

type ModelVerdict = { kind: 'unsupported_dialect' } | { kind: 'invalid_schema', why: string } | { kind: 'ok', validate: ValidateFunction }

/** What the docs say Toolport does with `schema`, by a direct Ajv compile under the documented options. */
function modelSchema (schema: Record<string, unknown>, regexps: RE2Type[]): ModelVerdict {
  const uri = Object.hasOwn(schema, '$schema') ? schema.$schema : undefined
  const dialect = uri === undefined ? '2020-12' : typeof uri === 'string' ? DIALECTS.get(uri) : undefined
  if (dialect === undefined) return { kind: 'unsupported_dialect' }
  let meta = metaAjvs.get(dialect)
  if (meta === undefined) {
    meta = new AJV_CLASSES[dialect]({ strict: false, logger: false, validateFormats: false })
    metaAjvs.set(dialect, meta)
  }
  // (Ajv's deep equality throws on an object whose own `toString` is not a function, e.g. in the
  // draft-07 meta-schema's `uniqueItems` over `enum`: such a schema cannot be checked, so it is refused.)
  try {
    if (meta.validateSchema(schema) !== true) return { kind: 'invalid_schema', why: meta.errorsText(meta.errors) }
  } catch (err) {
    return { kind: 'invalid_schema', why: String(err) }
  }
  // RE2 for `pattern` (README: "Regular expressions … run on RE2"); remote refs never fetched (no
  // loadSchema, no meta-schemas to resolve against); own-property semantics; the ajv-formats formats.
  const regExp = Object.assign((pattern: string, flags: string) => {
    const re = new RE2(pattern, flags.includes('u') ? flags : `${flags}u`)
    regexps.push(re)
    return re
  }, { code: 'RE2' }) as unknown as RegExpEngine
  const ajv = new AJV_CLASSES[dialect]({
    strict: false,
    allowUnionTypes: true,
    ownProperties: true,
    validateSchema: false,
    meta: false,
    addUsedSchema: true,
    logger: false,
    formats: fullFormats as unknown as Record<string, Format>,
    code: { regExp }
  })
  try {
    return { kind: 'ok', validate: ajv.compile(schema) }
  } catch (err) {
    return { kind: 'invalid_schema', why: String(err) }
  }
}

function freeRegExps (regexps: RE2Type[]): void {
  for (const re of regexps.splice(0)) {
    const wrapper = (re as unknown as { wrapper?: { delete?: () => void, isDeleted?: () => boolean } }).wrapper
    if (wrapper?.delete !== undefined && wrapper.isDeleted?.() !== true) wrapper.delete()
  }
}

/** Property names, inherited ones and `__proto__` among them (own-property semantics). */
const PROPS = ['a', 'b', '__proto__', 'constructor', 'toString', 'description']
/**
 * String values. Not the Kelvin sign or the long s (the email regression test below), nor \r and
 * the other line terminators that RE2 and JavaScript treat differently in ajv-formats' multi-line
 * `byte` regex (where JavaScript's reading, which accepts "\r" as base64, is the wrong one).
 */
const STRING_VALUES = ['', 'a', 'ab', 'abc', 'aaaa', 'a b', '12', '2024-01-31', '2024-13-01', '12:30:00Z', '2024-01-31T12:30:00Z',
  'a@b.co', 'a@@b', '123e4567-e89b-12d3-a456-426614174000', 'not-a-uuid', '127.0.0.1', '256.1.1.1', '::1', 'http://x.example/a',
  'QUJD', 'QUJD=', '\u00e9', '\u{1F600}', '\n', 'x\ny', '/a/b', '~0', 'P1D', '#/a']
const PATTERNS = ['^a', 'b$', '^[a-c]+$', '^\\d{2,4}$', '.', '^.$', 'a|b', '^$', '\\s', '[^a]', '^(a|ab)*$', '\\p{L}', '^\\w+@',
  '(a)\\1', '(?=a)', '(?<=a)b', '(', 'a{2,1}']
const FORMATS = ['date', 'time', 'date-time', 'email', 'uuid', 'ipv4', 'ipv6', 'uri', 'uri-reference', 'hostname', 'byte', 'regex',
  'json-pointer', 'duration', 'made-up']

const jsonLeaf: fc.Arbitrary<unknown> = fc.oneof(
  fc.constantFrom(null, true, false, 0, 1, -1, 2, 2.5, 1e21, -0.5, 100),
  fc.constantFrom(...STRING_VALUES)
)
/** JSON values whose objects have keys from `keys` (own `__proto__` included when it is one). */
function jsonValueOf (keys: readonly string[]): fc.Arbitrary<unknown> {
  return fc.letrec<{ value: unknown }>((tie) => ({
    value: fc.oneof({ depthSize: 'small', withCrossShrink: true },
      jsonLeaf,
      fc.array(tie('value'), { maxLength: 4 }),
      fc.uniqueArray(fc.tuple(fc.constantFrom(...keys), tie('value')), { maxLength: 3, selector: ([k]) => k }).map(own))
  })).value
}
const jsonValue = jsonValueOf(PROPS)
/**
 * Values a schema holds (`const`, `enum`): without a `__proto__` key, which Toolport's standalone
 * validator code once read as the value's prototype (the regression test "a `__proto__` key in a
 * const" below).
 */
const schemaValue = jsonValueOf(PROPS.filter((k) => k !== '__proto__'))

type SchemaNode = boolean | Record<string, unknown>

function schemaArb (defs: boolean): fc.Arbitrary<SchemaNode> {
  return fc.letrec<{ schema: SchemaNode }>((tie) => {
    const sub = tie('schema')
    const keywords: Record<string, fc.Arbitrary<unknown>> = {
      type: fc.oneof(fc.constantFrom('string', 'number', 'integer', 'boolean', 'null', 'object', 'array'),
        fc.subarray(['string', 'number', 'integer', 'null', 'object', 'array'], { minLength: 1, maxLength: 3 }), fc.constant('nope')),
      enum: fc.array(schemaValue, { minLength: 1, maxLength: 4 }),
      const: schemaValue,
      minLength: fc.integer({ min: -1, max: 3 }),
      maxLength: fc.nat(3),
      pattern: fc.constantFrom(...PATTERNS),
      format: fc.constantFrom(...FORMATS),
      minimum: fc.integer({ min: -2, max: 3 }),
      maximum: fc.integer({ min: -1, max: 100 }),
      exclusiveMinimum: fc.integer({ min: -2, max: 2 }),
      multipleOf: fc.constantFrom(1, 2, 0.5, 0),
      properties: fc.uniqueArray(fc.tuple(fc.constantFrom(...PROPS), sub), { maxLength: 3, selector: ([k]) => k })
        .map(own),
      required: fc.oneof(fc.subarray(PROPS, { maxLength: 3 }), fc.constant('a')),
      additionalProperties: sub,
      patternProperties: fc.uniqueArray(fc.tuple(fc.constantFrom('^a', 'b', '^_', '(?=x)'), sub), { maxLength: 2, selector: ([k]) => k }).map(own),
      propertyNames: sub,
      minProperties: fc.nat(2),
      dependentRequired: fc.uniqueArray(fc.tuple(fc.constantFrom(...PROPS), fc.subarray(PROPS, { maxLength: 2 })),
        { maxLength: 2, selector: ([k]) => k }).map(own),
      items: sub,
      prefixItems: fc.array(sub, { minLength: 1, maxLength: 2 }),
      contains: sub,
      minItems: fc.nat(2),
      maxItems: fc.nat(3),
      uniqueItems: fc.boolean(),
      allOf: fc.array(sub, { minLength: 1, maxLength: 2 }),
      anyOf: fc.array(sub, { minLength: 1, maxLength: 2 }),
      oneOf: fc.array(sub, { minLength: 1, maxLength: 2 }),
      not: sub,
      if: sub,
      then: sub,
      else: sub,
      unevaluatedProperties: sub,
      description: fc.constantFrom('A city.', 'x'),
      title: fc.constantFrom('T'),
      $comment: fc.constantFrom('c'),
      $ref: defs
        ? fc.constantFrom('#', '#/$defs/d', '#/$defs/d', '#/$defs/missing', '#/properties/a', 'https://example.com/s.json',
          'https://json-schema.org/draft/2020-12/schema', 'other.json', '#/$defs/d/description', 'urn:x:y')
        : fc.constantFrom('#', 'https://example.com/s.json', '#/$defs/missing'),
      'x-unknown': jsonValue,
      default: jsonValue
    }
    const names = Object.keys(keywords)
    return {
      schema: fc.oneof({ depthSize: 'small', maxDepth: 3, withCrossShrink: true },
        { weight: 1, arbitrary: fc.boolean() },
        {
          weight: 5,
          arbitrary: fc.uniqueArray(fc.constantFrom(...names), { maxLength: 3 }).chain((keys) =>
            fc.tuple(...keys.map((key) =>
              (keywords[key] as fc.Arbitrary<unknown>).map((value) => [key, value] as const)))
              .map((pairs) => own(pairs)))
        })
    }
  }).schema
}

const rootSchemaArb: fc.Arbitrary<Record<string, unknown>> = fc.record({
  body: schemaArb(true).filter((s): s is Record<string, unknown> => typeof s === 'object'),
  defs: fc.option(schemaArb(false), { freq: 2 }),
  dialect: fc.oneof(
    { weight: 8, arbitrary: fc.constant(undefined) },
    { weight: 4, arbitrary: fc.constantFrom(...DIALECTS.keys()) },
    { weight: 1, arbitrary: fc.constantFrom(...UNSUPPORTED_SCHEMAS) }),
  bigEnum: fc.option(fc.integer({ min: 100, max: 3000 }), { freq: 12 })
}).map(({ body, defs, dialect, bigEnum }) => {
  const entries: Array<[string, unknown]> = Object.entries(body)
  if (dialect !== undefined) entries.unshift(['$schema', dialect])
  if (defs !== null) entries.push(['$defs', own([['d', defs]])])
  if (bigEnum !== null) entries.push(['enum', Array.from({ length: bigEnum }, (_, i) => i)])
  return own(entries)
})

test('arguments (property): a tool\'s schema is refused at registration, and its arguments reach the plugin, exactly as a direct Ajv compile under the documented options decides', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  const trap = await startTrap(t)
  const regexps: RE2Type[] = []
  t.after(() => freeRegExps(regexps))
  let run = 0
  let registered = 0
  let reached = 0
  let refusedArgs = 0
  // Number texts JSON.stringify never writes: out of a double's range, -0, more digits than it holds.
  const rawText = fc.constantFrom('1e400', '-1e400', '-0', '123456789012345678901234567890', '[1e400]', '{"a":1e-400}', '0.30000000000000004',
    '{"a":1,"a":"x"}', '{"__proto__":{"a":1},"b":2}', '"\\ud800"')
  const argsArb = fc.array(jsonValue, { minLength: 1, maxLength: 4 })
  await check(fc.asyncProperty(rootSchemaArb, argsArb, rawText, async (schema, args, raw) => {
    const id = `s${run++}`
    const schemaText = JSON.stringify(schema)
    const verdict = modelSchema(JSON.parse(schemaText) as Record<string, unknown>, regexps)
    const before = JSON.stringify(tp.list())
    const path = `/diff/${id}`
    const reply = await postJson(url, '/api/tools/register',
      `{"name":"diff","callback_url":"http://127.0.0.1:${trap.port}${path}","parameters":${schemaText}}`)
    const what = `schema ${schemaText.slice(0, 500)}`
    if (verdict.kind !== 'ok') {
      assert.equal(reply.status, 422, `${what}: the model refuses it (${verdict.kind}${verdict.kind === 'invalid_schema' ? `: ${verdict.why}` : ''}) → ${reply.text.slice(0, 500)}`)
      assert.equal(reply.body.code, 'TP_ERR_VALIDATION')
      assert.equal(reply.body.details[0].path, 'parameters')
      assert.equal(reply.body.details[0].code, verdict.kind, `${what} → ${reply.text.slice(0, 500)}`)
      assert.equal(JSON.stringify(tp.list()), before, `${what}: a refused registration changed the registry`)
      freeRegExps(regexps)
      return
    }
    assert.equal(reply.status, 200, `${what}: the model accepts it → ${reply.text.slice(0, 500)}`)
    registered++
    // Besides the random values: {} and [], and every `const` and `enum` value of the schema (the
    // values a schema singles out are where a validator that misreads it shows).
    const singled: unknown[] = [{}, []]
    const walk = (node: unknown): void => {
      if (typeof node !== 'object' || node === null) return
      if (Array.isArray(node)) { node.forEach(walk); return }
      for (const [key, value] of Object.entries(node)) {
        if (key === 'const') singled.push(value)
        else if (key === 'enum' && Array.isArray(value)) singled.push(...value.slice(0, 3))
        else walk(value)
      }
    }
    walk(JSON.parse(schemaText))
    for (const argText of [...[...args, ...singled].map((value) => JSON.stringify(value)), raw]) {
      // Ajv's deep equality (const, enum, uniqueItems) throws on an object whose own `toString` or
      // `valueOf` is not a function: Toolport then refuses the call ("could not be checked").
      let expected: boolean
      let threw = false
      try {
        expected = verdict.validate(JSON.parse(argText)) as boolean
      } catch {
        expected = false
        threw = true
      }
      const hits = trap.hits.length
      const call = await postJson(url, '/api/tools/call', JSON.stringify({ role: 'A', name: 'diff', raw_arguments: argText }))
      assert.equal(call.status, 200, call.text)
      const got = trap.hits.length > hits
      assert.equal(got, expected, `${what}, arguments ${argText}: the model says ${expected ? 'valid' : `invalid (${verdict.validate.errors?.[0]?.message ?? ''})`}, Toolport ${got ? 'called the plugin' : `answered ${call.text.slice(0, 300)}`}`)
      if (expected) {
        reached++
        assert.deepEqual(trap.hits.slice(hits), [path])
        assert.equal(call.body.is_error, false, call.text)
      } else {
        refusedArgs++
        assert.equal(call.body.is_error, true)
        assert.match(call.body.error, threw
          ? /^the arguments could not be checked against the tool's parameters/
          : /^arguments do not match the tool's parameters/)
      }
    }
    freeRegExps(regexps)
  }), { numRuns: runs(80) })
  // The property exercised both outcomes (a generator that only ever refused would prove nothing).
  assert.ok(registered > 20 && reached > 10 && refusedArgs > 10, `registered ${registered}, reached ${reached}, refused ${refusedArgs}`)
  await assertHealthy(url)
})

// ---- Bugs found, one shrunk case each ---------------------------------------------------------------

test('guard: an absolute-form request-target names the target host (RFC 9112 §3.2.2), so a foreign one is 403 TP_ERR_HOST_FORBIDDEN even under a loopback Host header', async (t) => {
  // find-my-way routes `POST http://evil.example/api/tools/register` to the register route, so the
  // guard (src/main/http/guard.ts hostProblem) must judge the authority of an absolute-form target
  // as it judges Host, and refuse one that differs from the Host header (the HTTP/1.1 twin of the
  // HTTP/2 ":authority differs from Host" case of SECURITY.md 2): a 403 that registers nothing.
  const { tp, port } = await startToolport(t, { roles: ['A'] })
  const body = Buffer.from(JSON.stringify({ name: 'absolute', callback_url: 'http://127.0.0.1:9/cb' }))
  const reply = await exchange(port, 'POST http://evil.example/api/tools/register HTTP/1.1\r\n' +
    `Host: 127.0.0.1:${port}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close`, body)
  assert.deepEqual(tp.list().tools_by_role.A, [], 'a request naming evil.example as its target registered a tool')
  assertErrorReply(reply, 403, 'TP_ERR_HOST_FORBIDDEN', 'absolute-form target http://evil.example/')
})

test('guard: requests refused before routing (a bad %-escape, an over-long role, an unreadable Content-Length, HTTP/1.1 without Host) pass the guard and answer in the documented shape', async (t) => {
  // These never reach a route's onRequest hook: fastify's router refuses a bad %-escape or an
  // over-long path parameter, Node's parser an unreadable Content-Length, and Node itself would
  // answer HTTP/1.1 without Host (`requireHostHeader`). Each must still pass the guard where
  // there is a request to judge (a foreign Host is 403, not 400/414) and answer in the documented
  // shape: the security headers, `{ok: false, code: "TP_ERR_…"}`, and a 401/403 closes the
  // connection (SECURITY.md "Inbound: every route, including unknown paths"; README "Errors":
  // TP_ERR_BAD_REQUEST for "bad Content-Length, URL").
  const { port } = await startToolport(t, { roles: ['A'] })
  const problems: string[] = []
  const cases: Array<[string, string, number, string]> = [
    ['bad %-escape, foreign Host', 'GET /api/tools/%zz HTTP/1.1\r\nHost: evil.example\r\nConnection: close', 403, 'TP_ERR_HOST_FORBIDDEN'],
    ['bad %-escape, loopback Host', `GET /api/tools/%zz HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nConnection: close`, 400, 'TP_ERR_BAD_REQUEST'],
    ['over-long MCP role, foreign Host', `GET /mcp/${'r'.repeat(300)} HTTP/1.1\r\nHost: evil.example\r\nConnection: close`, 403, 'TP_ERR_HOST_FORBIDDEN'],
    ['unreadable Content-Length', `POST /api/tools/register HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\nContent-Length: abc\r\nConnection: close`,
      400, 'TP_ERR_BAD_REQUEST'],
    ['HTTP/1.1 without Host', 'GET /api/tools HTTP/1.1\r\nConnection: close', 403, 'TP_ERR_HOST_FORBIDDEN']
  ]
  for (const [what, head, status, code] of cases) {
    const reply = await exchange(port, head)
    try {
      assertEveryAnswer(reply, what)
      assertErrorReply(reply, status, code, what)
    } catch (err) {
      problems.push(`${what}: ${(err as Error).message.split('\n')[0] ?? ''} — got ${reply.status} ${reply.body.slice(0, 120)}`)
    }
  }
  assert.deepEqual(problems, [])
})

test('R2: an empty userinfo is refused however it is spelled, also when a tab or newline (which the URL parser removes) sits between the colon and the slashes', async (t) => {
  // `http:/\t/@127.0.0.1/` is `http://@127.0.0.1/` once the WHATWG parser has removed the tab, so
  // the raw-authority scan for an empty userinfo (hasUserinfo in src/shared/loopback.ts) must
  // remove the tabs and newlines the parser ignores before it skips the slashes: every spelling is
  // a 422 naming callback_url, and nothing is registered.
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  for (const callback of ['http://@127.0.0.1:9/cb', 'http:/\t/@127.0.0.1:9/cb', 'http:\n//:@127.0.0.1:9/cb']) {
    const reply = await postJson(url, '/api/tools/register', JSON.stringify({ name: 'userinfo', callback_url: callback }))
    assert.equal(reply.status, 422, `${JSON.stringify(callback)} → ${reply.text}`)
    assert.equal(reply.body.details[0].path, 'callback_url')
  }
  assert.deepEqual(tp.list().tools_by_role.A, [])
})

test('parameters: a $schema that names a supported dialect over the other scheme (http for 2020-12 and 2019-09, https for draft-07) is accepted or refused as unsupported_dialect, never as the compiler\'s internal failure', async (t) => {
  // schemaDialect (src/shared/json-schema.ts) maps `http://json-schema.org/draft/2020-12/schema` to
  // 2020-12 ("http or https, with or without the empty fragment"), and the plugin SDK accepts the
  // schema; the compiler thread's meta-schema check must then use that dialect's meta-schema
  // rather than look the `$schema` URI up in Ajv (which has none under it and throws): each URI
  // is accepted, or refused as `unsupported_dialect`, never as the compiler's internal failure.
  const { url } = await startToolport(t, { roles: ['A'] })
  for (const uri of ['http://json-schema.org/draft/2020-12/schema', 'http://json-schema.org/draft/2019-09/schema',
    'https://json-schema.org/draft-07/schema#']) {
    const reply = await postJson(url, '/api/tools/register', JSON.stringify({
      name: 'dialect', callback_url: 'http://127.0.0.1:9/cb', parameters: { $schema: uri, type: 'object' }
    }))
    if (reply.status === 200) continue
    assert.equal(reply.status, 422, reply.text)
    assert.equal(reply.body.details[0].code, 'unsupported_dialect', `${uri} → ${reply.text}`)
  }
})

test('arguments: a `__proto__` key in a const is a key: `{}` does not match `{"const": {"__proto__": {"x": 1}}}` and the const value itself does', async (t) => {
  // The validator runs as Ajv's standalone code (src/workers/schema-compiler.ts, loaded by
  // src/main/dispatch/validators.ts). Written as an object literal, `{"__proto__": {…}}` would set
  // the constant's prototype instead of making a key, and the validator would hold `{}`: so `{}`
  // must be refused (it never reaches the plugin) and the const value itself must pass, as a
  // direct Ajv compile of the same JSON decides.
  const { url } = await startToolport(t, { roles: ['A'] })
  const trap = await startTrap(t)
  const registered = await postJson(url, '/api/tools/register',
    `{"name":"proto","callback_url":"http://127.0.0.1:${trap.port}/proto","parameters":{"const":{"__proto__":{"x":1}}}}`)
  // Refusing the schema is a fix too (docs: a schema Toolport cannot validate is a 422).
  if (registered.status === 422) return
  assert.equal(registered.status, 200, registered.text)
  const empty = await postJson(url, '/api/tools/call', '{"role":"A","name":"proto","raw_arguments":"{}"}')
  assert.equal(empty.body.is_error, true, `{} reached the plugin: ${empty.text}`)
  const exact = await postJson(url, '/api/tools/call', JSON.stringify({ role: 'A', name: 'proto', raw_arguments: '{"__proto__":{"x":1}}' }))
  assert.equal(exact.body.is_error, false, `the const value itself was refused: ${exact.text}`)
  assert.deepEqual(trap.hits, ['/proto'])
})

test('arguments: format "email" is ajv-formats\' email: the Kelvin sign (U+212A) and the long s (U+017F) are not ASCII letters', async (t) => {
  // compileFormat (src/shared/json-schema.ts) runs ajv-formats' case-insensitive email regex on
  // RE2, which has the `u` flag only, where case folding is Unicode's: K (U+212A) folds to k and
  // ſ (U+017F) to s. ajv-formats (JavaScript, /i without u) refuses both, so Toolport must too:
  // neither address reaches the plugin. (uri-reference, also /i, is the same case.)
  const { url } = await startToolport(t, { roles: ['A'] })
  const trap = await startTrap(t)
  const registered = await postJson(url, '/api/tools/register', JSON.stringify({
    name: 'mail', callback_url: `http://127.0.0.1:${trap.port}/mail`, parameters: { type: 'string', format: 'email' }
  }))
  assert.equal(registered.status, 200, registered.text)
  for (const address of ['\u212a@example.com', '\u017f@example.com']) {
    assert.equal((fullFormats.email as RegExp).test(address), false, 'ajv-formats refuses it')
    const call = await postJson(url, '/api/tools/call', JSON.stringify({ role: 'A', name: 'mail', arguments: address }))
    assert.equal(call.body.is_error, true, `${JSON.stringify(address)} reached the plugin: ${call.text}`)
  }
  assert.deepEqual(trap.hits, [])
})

test('arguments: one call cannot hold the main thread for long: uniqueItems over distinct objects is quadratic, patternProperties costs patterns × keys', async (t) => {
  // Argument validators run on the main thread (src/main/dispatch/arguments.ts, validators.ts).
  // Ajv's uniqueItems compares every pair of items when their type is not a scalar
  // (ajv/dist/vocabularies/validation/uniqueItems.js loopN2), and every key is tested against every
  // patternProperties regex (RE2, ~2 µs a test). Unbounded, 100 000 numbers (590 KB) under
  // `{"uniqueItems": true}` held every request ~9 s, and 600 patterns (17 KB of schema) × 20 000
  // keys (280 KB) 25 s, both within the documented limits (1 MiB body, 64 KiB schema). SECURITY.md
  // "Argument validation" says no schema can stall Toolport: each call here must answer within a
  // small multiple of its baseline (a refusal of the schema at registration is allowed too).
  // Unbounded, the sizes below cost ~0.5 s each here (~0.01 s fixed); the bound is relative to the
  // same call against a schema without the costly keyword, so a slow machine does not make a fixed
  // Toolport fail.
  const { url } = await startToolport(t, { roles: ['A'] })
  const trap = await startTrap(t)
  const patterns = Object.fromEntries(Array.from({ length: 80 }, (_, i) => [`^k${i}x$`, { type: 'string' }]))
  const cases = [
    { name: 'unique', schema: { type: 'array', uniqueItems: true }, base: { type: 'array' }, args: Array.from({ length: 5500 }, (_, i) => ({ a: i })) },
    {
      name: 'patterns',
      schema: { type: 'object', patternProperties: patterns },
      base: { type: 'object' },
      args: Object.fromEntries(Array.from({ length: 4500 }, (_, i) => [`z${i}`, i]))
    }
  ]
  const slow: string[] = []
  for (const c of cases) {
    const callback = `http://127.0.0.1:${trap.port}/${c.name}`
    const base = await postJson(url, '/api/tools/register', JSON.stringify({ name: `${c.name}_base`, callback_url: callback, parameters: c.base }))
    assert.equal(base.status, 200, base.text)
    const costly = await postJson(url, '/api/tools/register', JSON.stringify({ name: c.name, callback_url: callback, parameters: c.schema }))
    if (costly.status === 422) continue // refusing such a schema at registration is a fix too
    assert.equal(costly.status, 200, costly.text)
    const text = JSON.stringify({ role: 'A', name: `${c.name}_base`, arguments: c.args })
    let baseMs = Infinity
    for (let i = 0; i < 2; i++) {
      const started = performance.now()
      await postJson(url, '/api/tools/call', text)
      baseMs = Math.min(baseMs, performance.now() - started)
    }
    const started = performance.now()
    const call = await postJson(url, '/api/tools/call', JSON.stringify({ role: 'A', name: c.name, arguments: c.args }))
    const ms = performance.now() - started
    assert.equal(call.status, 200, call.text.slice(0, 300))
    if (ms > 5 * baseMs + 100) slow.push(`${c.name}: ${Math.round(ms)} ms, against ${Math.round(baseMs)} ms without the keyword`)
  }
  assert.deepEqual(slow, [])
})
