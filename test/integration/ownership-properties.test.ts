// A model test of ownership mode (`security.enforceOwnership`) and token mode over real HTTP:
// README "Ownership mode: the plugin key", SECURITY.md "Ownership mode (optional)" and "Token
// mode", docs/protocol.md "Ownership mode" and "Eviction" (R13), README "Errors".
//
// Random sequences of register / re-register / unregister / clear by several plugin keys (distinct
// keys, the same key sent with optional whitespace around it, keys differing only in case, the
// shortest and longest well-formed keys) and by malformed keys (missing, 31 or 513 characters,
// inner space or tab, a latin-1 byte, empty, sent twice), by the host (library calls without a
// key), with good, missing and wrong bearer tokens in token mode; between them the host removes
// and adds a role, a plugin at a dead port is called until its origin is evicted, and Toolport
// restarts (token mode on or off). Every request goes over a raw socket to a real Toolport on
// 127.0.0.1, so the exact header bytes are the test's.
//
// The model: per role, name -> source and origin; per source, the owner that first registered it
// (a key, or the host), a binding that ends when the source has no tool left in any role. After
// each step: the answer (status, code, body) is the model's; GET /api/tools is the model; the
// events of the step on GET /api/events (fenced by a role the host adds and removes) are exactly
// the model's change, and none for a refused request; `/metrics` (toolport_*) is unchanged by a
// refused request and its registry gauge is the model's; no key (nor its first 16 characters)
// appears in any answer, event, `/metrics`, `/api/console/state` or in the trace-level log.
//
// The plugin SDK (src/plugin, in-process) is checked apart: it sends its key, a second key is
// refused at once, the same key takes the source back, and it recovers after a restart.
//
// TP_PROPERTY_RUNS=N multiplies the runs of each property (the default fits ~15 s).
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { connect } from 'node:net'
import { Writable } from 'node:stream'
import { isDeepStrictEqual } from 'node:util'
import fc from 'fast-check'
import { request as httpRequest } from 'undici'
import { Toolport } from '../../src/main/toolport.js'
import { createLogger } from '../../src/main/logger.js'
import { kDispatchReady } from '../../src/main/symbols.js'
import { createPlugin, PluginError } from '../../src/plugin/index.js'
import { closedPort, startCallbackServer } from '../fixtures/callback-server.js'
import { waitFor, within } from '../helpers.js'

type Json = Record<string, any>

const FAILING_TIMEOUT_MS = 600_000
const GUARD_MS = 10_000
function runs (n: number): number {
  return Math.max(1, Math.round(n * Number(process.env.TP_PROPERTY_RUNS ?? 1)))
}

// ---------------------------------------------------------------------------------------------
// Keys

const b64 = (n: number): string => randomBytes(n).toString('base64url')
/** Visible ASCII, punctuation included (`"`, `\`, `~`, `!`): every character the docs allow. */
function visibleAscii (length: number): string {
  const bytes = randomBytes(length)
  let s = ''
  for (const b of bytes) s += String.fromCharCode(0x21 + (b % 94))
  return s
}
function swapCase (s: string): string {
  let out = ''
  for (const ch of s) out += ch === ch.toLowerCase() ? ch.toUpperCase() : ch.toLowerCase()
  return out
}

/** Who each well-formed key is (README: a source belongs to the key, compared exactly). */
type OwnerId = 'K0' | 'K1' | 'K0case' | 'K32' | 'K512' | 'host'
const K0 = `A${b64(32)}z`.slice(0, 43)
const KEYS: Record<Exclude<OwnerId, 'host'>, string> = {
  K0,
  K1: b64(32),
  // The same characters in another case: another key (no case folding).
  K0case: swapCase(K0),
  K32: visibleAscii(32),
  K512: visibleAscii(512)
}
assert.notEqual(KEYS.K0case, KEYS.K0)

interface KeyVariant {
  label: string
  /** Header lines to send (latin-1 bytes); [] sends no key. */
  lines: string[]
  /** The owner the key is, or null: malformed (401 TP_ERR_PLUGIN_KEY_REQUIRED). */
  owner: Exclude<OwnerId, 'host'> | null
  /** A byte Node's HTTP parser refuses (SECURITY.md: 400 TP_ERR_BAD_REQUEST, before any check). */
  unreadable?: true
}
const SHORT = b64(24).slice(0, 31)
const LONG = visibleAscii(513)
const VARIANTS: KeyVariant[] = [
  { label: 'K0', lines: [KEYS.K0], owner: 'K0' },
  // HTTP drops optional whitespace around a field value (RFC 9110 §5.5): the same key.
  { label: 'K0 with whitespace around', lines: [` \t${KEYS.K0}  `], owner: 'K0' },
  { label: 'K1', lines: [KEYS.K1], owner: 'K1' },
  { label: 'K0 in swapped case', lines: [KEYS.K0case], owner: 'K0case' },
  { label: '32 characters', lines: [KEYS.K32], owner: 'K32' },
  { label: '512 characters', lines: [KEYS.K512], owner: 'K512' },
  { label: 'no key', lines: [], owner: null },
  { label: 'empty', lines: [''], owner: null },
  { label: '31 characters', lines: [SHORT], owner: null },
  { label: '513 characters', lines: [LONG], owner: null },
  { label: 'inner space', lines: [`${KEYS.K0.slice(0, 20)} ${KEYS.K0.slice(20)}`], owner: null },
  { label: 'inner tab', lines: [`${KEYS.K1.slice(0, 20)}\t${KEYS.K1.slice(20)}`], owner: null },
  { label: 'latin-1 byte', lines: [`${KEYS.K0.slice(0, 40)}\u00e9`], owner: null },
  { label: 'sent twice', lines: [KEYS.K0, KEYS.K0], owner: null },
  { label: 'DEL byte', lines: [`${KEYS.K1.slice(0, 40)}\x7f`], owner: null, unreadable: true }
]
/** Strings that must never be echoed: every key-like secret sent, and the first 16 characters of each. */
const SECRETS: string[] = [...Object.values(KEYS), SHORT, LONG]
const PROBES: string[] = [...SECRETS, ...SECRETS.map((k) => k.slice(0, 16))]

function assertNoKey (text: string, where: string): void {
  for (const probe of PROBES) {
    assert.ok(!text.includes(probe), `a plugin key (or its start) appears in ${where}`)
  }
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP over a socket: exact header bytes, one connection per request

interface RawReply { statusCode: number, headers: Record<string, string>, text: string, body: any }

async function rawRequest (port: number, method: 'GET' | 'POST', path: string, body: unknown,
  headers: Array<[string, string]>): Promise<RawReply> {
  const payload = body === undefined ? Buffer.alloc(0) : Buffer.from(JSON.stringify(body), 'utf8')
  // Keep-alive asked for: the server's own `Connection: close` (SECURITY.md) is then its choice.
  let head = `${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nConnection: keep-alive\r\n`
  if (body !== undefined) head += `Content-Type: application/json\r\nContent-Length: ${payload.length}\r\n`
  for (const [name, value] of headers) head += `${name}: ${value}\r\n`
  head += '\r\n'
  const data = await within(new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = []
    const socket = connect(port, '127.0.0.1', () => {
      socket.write(Buffer.concat([Buffer.from(head, 'latin1'), payload]))
    })
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk)
      if (isComplete(Buffer.concat(chunks))) socket.destroy()
    })
    socket.on('error', reject)
    socket.on('close', () => { resolve(Buffer.concat(chunks)) })
  }), `${method} ${path}`, GUARD_MS)
  const split = data.indexOf('\r\n\r\n')
  assert.ok(split > 0, `an HTTP answer to ${method} ${path}`)
  const lines = data.subarray(0, split).toString('latin1').split('\r\n')
  const statusCode = Number(lines[0]!.split(' ')[1])
  const out: Record<string, string> = {}
  for (const line of lines.slice(1)) {
    const i = line.indexOf(':')
    out[line.slice(0, i).toLowerCase()] = line.slice(i + 1).trim()
  }
  let raw = data.subarray(split + 4)
  if (out['transfer-encoding'] === 'chunked') {
    const parts: Buffer[] = []
    let at = 0
    for (;;) {
      const eol = raw.indexOf('\r\n', at)
      const size = parseInt(raw.subarray(at, eol).toString('latin1'), 16)
      if (!(size > 0)) break
      parts.push(raw.subarray(eol + 2, eol + 2 + size))
      at = eol + 2 + size + 2
    }
    raw = Buffer.concat(parts)
  }
  const text = raw.toString('utf8')
  let parsed: any
  try { parsed = text === '' ? undefined : JSON.parse(text) } catch { parsed = text }
  return { statusCode, headers: out, text, body: parsed }
}

/** Whether `data` holds one whole HTTP answer (Content-Length or chunked). */
function isComplete (data: Buffer): boolean {
  const split = data.indexOf('\r\n\r\n')
  if (split < 0) return false
  const head = data.subarray(0, split).toString('latin1').toLowerCase()
  const length = /\r\ncontent-length:\s*(\d+)/.exec(head)
  if (length !== null) return data.length - split - 4 >= Number(length[1])
  if (head.includes('transfer-encoding: chunked')) return data.subarray(split).includes('\r\n0\r\n\r\n')
  return false
}

/**
 * A port that refuses connections (a plugin that died). Below the range the kernel hands out for
 * port 0 (closedPort), so that no other test's server is given it later.
 */
async function deadPort (): Promise<number> {
  return await closedPort()
}

// ---------------------------------------------------------------------------------------------
// The event stream, fenced

interface SseEvent { type: string, data: any, raw: string }

class EventTap {
  readonly events: SseEvent[] = []
  raw = ''
  #buffer = ''
  #abort = new AbortController()
  #done: Promise<void>

  constructor (url: string, headers: Record<string, string>) {
    this.#done = (async () => {
      const res = await httpRequest(`${url}/api/events?types=registered,unregistered,cleared,evicted,role-added,role-removed`,
        { method: 'GET', headers, signal: this.#abort.signal })
      assert.equal(res.statusCode, 200)
      try {
        for await (const chunk of res.body) this.#push(String(chunk))
      } catch { /* aborted */ }
    })()
    this.#done.catch(() => {})
  }

  #push (text: string): void {
    this.raw += text
    this.#buffer += text
    let end: number
    while ((end = this.#buffer.indexOf('\n\n')) >= 0) {
      const block = this.#buffer.slice(0, end)
      this.#buffer = this.#buffer.slice(end + 2)
      let type = 'message'
      let data = ''
      for (const line of block.split('\n')) {
        if (line.startsWith('event:')) type = line.slice(6).trim()
        else if (line.startsWith('data:')) data += line.slice(5).trim()
      }
      if (data === '') continue
      this.events.push({ type, data: JSON.parse(data), raw: block })
    }
  }

  async waitFor (predicate: (e: SseEvent) => boolean, what: string): Promise<number> {
    let index = -1
    await waitFor(what, () => { index = this.events.findIndex(predicate); return index >= 0 }, GUARD_MS)
    return index
  }

  async close (): Promise<void> {
    this.#abort.abort()
    await within(this.#done.catch(() => {}), 'event stream close', GUARD_MS)
  }
}

// ---------------------------------------------------------------------------------------------
// The world: one Toolport at a time, restarted on demand

const ROLES = ['A', 'B'] as const
const NAMES = ['t0', 't1', 't2'] as const
const SOURCES = ['plugin:s0', 'plugin:s1', 'host:h'] as const
type Origin = 'live' | 'dead'

interface ModelTool { source: string, origin: Origin }

class Model {
  roles = new Map<string, Map<string, ModelTool>>(ROLES.map((r) => [r, new Map()]))
  owners = new Map<string, OwnerId>()

  hasTools (source: string): boolean {
    for (const tools of this.roles.values()) for (const t of tools.values()) if (t.source === source) return true
    return false
  }

  bound (source: string): OwnerId | undefined {
    const owner = this.owners.get(source)
    if (owner === undefined) return undefined
    if (this.hasTools(source)) return owner
    this.owners.delete(source)
    return undefined
  }

  clone (): Model {
    const m = new Model()
    m.roles = new Map([...this.roles].map(([r, tools]) => [r, new Map([...tools].map(([n, t]) => [n, { ...t }]))]))
    m.owners = new Map(this.owners)
    return m
  }

  allows (source: string, caller: OwnerId): boolean {
    const bound = this.bound(source)
    return caller === 'host' || bound === undefined || bound === caller
  }
}

class World {
  tp!: Toolport
  port = 0
  url = ''
  token: string | null = null
  tap: EventTap | undefined
  logs = ''
  fences = 0
  readonly liveUrl: string
  readonly deadUrl: string

  constructor (liveUrl: string, deadUrl: string) {
    this.liveUrl = liveUrl
    this.deadUrl = deadUrl
  }

  async start (tokenMode: boolean): Promise<void> {
    this.token = tokenMode ? randomBytes(32).toString('hex') : null
    const log = createLogger('trace', {
      destination: new Writable({ write: (chunk, _enc, cb) => { this.logs += String(chunk); cb() } }) as any
    })
    this.tp = new Toolport({
      roles: [...ROLES],
      dispatch: { mode: 'inline' },
      security: { enforceOwnership: true, ...(this.token === null ? {} : { token: this.token }) }
    }, log)
    await this.tp[kDispatchReady]
    const { port, url } = await this.tp.listen({ host: '127.0.0.1', port: 0 })
    this.port = port
    this.url = url
    this.tap = new EventTap(url, this.authHeaders())
    // The stream is subscribed once its hello came.
    await this.tap!.waitFor((e) => e.type === 'hello', 'hello')
    this.tap!.events.length = 0
    await this.fence()
  }

  async stop (): Promise<void> {
    await this.tap?.close()
    await within(this.tp.close(), 'Toolport close', GUARD_MS)
    // Everything the run logged, for the last time: keys never appear.
    assertNoKey(this.logs, 'the log')
  }

  authHeaders (): Record<string, string> {
    return this.token === null ? {} : { authorization: `Bearer ${this.token}` }
  }

  authLines (auth: 'ok' | 'missing' | 'wrong'): Array<[string, string]> {
    if (this.token === null || auth === 'missing') return []
    return [['Authorization', `Bearer ${auth === 'ok' ? this.token : randomBytes(32).toString('hex')}`]]
  }

  async get (path: string): Promise<RawReply> {
    return await rawRequest(this.port, 'GET', path, undefined, this.authLines('ok'))
  }

  /** The host adds and removes a role: once its role-removed comes, every earlier event has. */
  async fence (): Promise<SseEvent[]> {
    const name = `fence${++this.fences}`
    this.tp.roles.add(name)
    this.tp.roles.remove(name)
    const index = await this.tap!.waitFor((e) => e.type === 'role-removed' && e.data.role === name, `fence ${name}`)
    const before = this.tap!.events.splice(0, index + 1)
    return before.filter((e) => !(typeof e.data.role === 'string' && e.data.role.startsWith('fence')))
  }
}

// ---------------------------------------------------------------------------------------------
// Steps

type Who = { kind: 'key', variant: number } | { kind: 'host' }
type Auth = 'ok' | 'missing' | 'wrong'
type Step =
  | { kind: 'register', who: Who, auth: Auth, name: string, source: string, role: string | null, origin: Origin }
  | { kind: 'unregister', who: Who, auth: Auth, name: string, role: string | null, expected: string | undefined }
  | { kind: 'clear', who: Who, auth: Auth, source: string, role: string | null }
  | { kind: 'role' }
  /** 2–4 mutations over HTTP issued at once: the answers are those of SOME serial order (docs/protocol.md "Sync"). */
  | { kind: 'batch', ops: Array<Extract<Step, { kind: 'register' | 'unregister' | 'clear' }>> }
  | { kind: 'evict' }
  | { kind: 'restart', token: boolean }

const VALID = VARIANTS.map((v, i) => [v, i] as const).filter(([v]) => v.owner !== null).map(([, i]) => i)
const arbWho: fc.Arbitrary<Who> = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom(...VALID.slice(0, 4)).map((variant): Who => ({ kind: 'key', variant })) },
  { weight: 2, arbitrary: fc.nat({ max: VARIANTS.length - 1 }).map((variant): Who => ({ kind: 'key', variant })) },
  { weight: 1, arbitrary: fc.constant<Who>({ kind: 'host' }) }
)
const arbAuth: fc.Arbitrary<Auth> = fc.oneof({ weight: 8, arbitrary: fc.constant<Auth>('ok') },
  { weight: 1, arbitrary: fc.constantFrom<Auth>('missing', 'wrong') })
const arbRole = fc.constantFrom<string | null>(null, 'A', 'B')
const arbRegister = fc.record({ kind: fc.constant('register' as const), who: arbWho, auth: arbAuth, name: fc.constantFrom(...NAMES), source: fc.constantFrom(...SOURCES), role: arbRole, origin: fc.constantFrom<Origin>('live', 'dead') })
const arbUnregister = fc.record({ kind: fc.constant('unregister' as const), who: arbWho, auth: arbAuth, name: fc.constantFrom(...NAMES), role: arbRole, expected: fc.oneof({ weight: 3, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: fc.constantFrom<string | undefined>(...SOURCES) }) })
const arbClear = fc.record({ kind: fc.constant('clear' as const), who: arbWho, auth: arbAuth, source: fc.constantFrom(...SOURCES), role: arbRole })
const arbHttpWho = fc.constantFrom(...VALID.slice(0, 4)).map((variant): Who => ({ kind: 'key', variant }))
const arbBatchOp = fc.oneof({ weight: 3, arbitrary: arbRegister }, arbUnregister, arbClear)
  .chain((op) => arbHttpWho.map((who) => ({ ...op, who, auth: 'ok' as Auth })))
const arbStep: fc.Arbitrary<Step> = fc.oneof(
  { weight: 8, arbitrary: arbRegister },
  { weight: 5, arbitrary: arbUnregister },
  { weight: 3, arbitrary: arbClear },
  { weight: 2, arbitrary: fc.array(arbBatchOp, { minLength: 2, maxLength: 4 }).map((ops): Step => ({ kind: 'batch', ops })) },
  { weight: 1, arbitrary: fc.constant<Step>({ kind: 'role' }) },
  { weight: 2, arbitrary: fc.constant<Step>({ kind: 'evict' }) },
  { weight: 1, arbitrary: fc.boolean().map((token): Step => ({ kind: 'restart', token })) }
)

interface Outcome {
  /** null: accepted; else the error code and status. */
  error: null | { code: string, status: number }
  /** Events expected: type -> set of `role/name/source`. */
  changes: Array<{ type: string, role: string, name: string, source: string }>
  body?: Json
}

function callerOf (who: Who): OwnerId | null {
  return who.kind === 'host' ? 'host' : VARIANTS[who.variant]!.owner
}

function targets (model: Model, role: string | null): string[] | null {
  if (role === null) return [...model.roles.keys()]
  return model.roles.has(role) ? [role] : null
}

/** Applies a mutation to the model; returns what Toolport should answer. */
function apply (model: Model, step: Extract<Step, { kind: 'register' | 'unregister' | 'clear' }>, tokenMode: boolean): Outcome {
  const viaHttp = step.who.kind === 'key'
  if (step.who.kind === 'key' && VARIANTS[step.who.variant]!.unreadable === true) return { error: { code: 'TP_ERR_BAD_REQUEST', status: 400 }, changes: [] }
  if (viaHttp && tokenMode && step.auth !== 'ok') return { error: { code: 'TP_ERR_UNAUTHORIZED', status: 401 }, changes: [] }
  const caller = callerOf(step.who)
  if (caller === null) return { error: { code: 'TP_ERR_PLUGIN_KEY_REQUIRED', status: 401 }, changes: [] }
  const roles = targets(model, step.role)
  if (roles === null) return { error: { code: 'TP_ERR_ROLE_NOT_FOUND', status: 404 }, changes: [] }
  const changes: Outcome['changes'] = []
  if (step.kind === 'register') {
    if (!model.allows(step.source, caller)) return { error: { code: 'TP_ERR_NOT_OWNER', status: 403 }, changes }
    const free = model.bound(step.source) === undefined
    const affected: string[] = []
    const failed: Json[] = []
    for (const role of roles) {
      const tools = model.roles.get(role)!
      const existing = tools.get(step.name)
      if (existing !== undefined && existing.source !== step.source) {
        failed.push({ role, owned_by: existing.source })
        continue
      }
      tools.set(step.name, { source: step.source, origin: step.origin })
      affected.push(role)
      changes.push({ type: 'registered', role, name: step.name, source: step.source })
    }
    if (affected.length > 0 && free) model.owners.set(step.source, caller)
    const body = { ok: affected.length > 0, registered: step.name, affected_roles: affected, failed_roles: failed }
    return { error: null, changes, body }
  }
  if (step.kind === 'unregister') {
    const affected: string[] = []
    const refused: Json[] = []
    for (const role of roles) {
      const tools = model.roles.get(role)!
      const existing = tools.get(step.name)
      if (existing === undefined) continue
      const mismatch = step.expected !== undefined && existing.source !== step.expected
      if (mismatch || !model.allows(existing.source, caller)) {
        refused.push({ role, owned_by: existing.source })
        continue
      }
      tools.delete(step.name)
      affected.push(role)
      changes.push({ type: 'unregistered', role, name: step.name, source: existing.source })
    }
    const removed = affected.length > 0
    const body = { ok: true, removed, affected_roles: affected, failed_roles: [], refused_roles: refused }
    return { error: null, changes, body }
  }
  if (!model.allows(step.source, caller)) return { error: { code: 'TP_ERR_NOT_OWNER', status: 403 }, changes }
  let removed = 0
  const affected: string[] = []
  for (const role of roles) {
    const tools = model.roles.get(role)!
    let n = 0
    for (const [name, t] of [...tools]) {
      if (t.source !== step.source) continue
      tools.delete(name)
      n++
      changes.push({ type: 'cleared', role, name, source: step.source })
    }
    if (n > 0) affected.push(role)
    removed += n
  }
  return { error: null, changes, body: { ok: true, removed, affected_roles: affected, failed_roles: [] } }
}

function changesOf (events: SseEvent[]): string[] {
  const out: string[] = []
  for (const e of events) {
    if (!['registered', 'unregistered', 'cleared', 'evicted'].includes(e.type)) continue
    for (const t of e.data.tools as Array<{ role: string, name: string }>) out.push(`${e.type} ${t.role}/${t.name} ${e.data.source}`)
  }
  return out.sort()
}

function toolportMetrics (text: string): string {
  return text.split('\n').filter((l) => l.startsWith('toolport_')).join('\n')
}

async function checkListing (world: World, model: Model, context: string): Promise<void> {
  const listed = await world.get('/api/tools')
  assert.equal(listed.statusCode, 200, context)
  const actual: Json = {}
  for (const [role, rows] of Object.entries(listed.body.tools_by_role as Json)) {
    if (role.startsWith('fence')) continue
    actual[role] = Object.fromEntries((rows as Json[]).map((r) => [r.name, { source: r.source, origin: String(r.callback_url).startsWith(world.liveUrl) ? 'live' : 'dead' }]))
  }
  const expected: Json = {}
  for (const [role, tools] of model.roles) {
    expected[role] = Object.fromEntries([...tools].map(([n, t]) => [n, { ...t }]))
  }
  assert.deepEqual(actual, expected, `${context}: GET /api/tools is the model`)
}

type Mutation = Extract<Step, { kind: 'register' | 'unregister' | 'clear' }>

function payloadOf (world: World, step: Mutation): Json {
  return step.kind === 'register'
    ? { name: step.name, source: step.source, callback_url: `${step.origin === 'live' ? world.liveUrl : world.deadUrl}/${step.name}`, ...(step.role === null ? {} : { role: step.role }) }
    : step.kind === 'unregister'
      ? {
          name: step.name,
          ...(step.role === null ? {} : { role: step.role }),
          ...(step.expected === undefined ? {} : { expected_source: step.expected })
        }
      : { source: step.source, ...(step.role === null ? {} : { role: step.role }) }
}

async function sendOverHttp (world: World, step: Mutation & { who: { kind: 'key', variant: number } }): Promise<RawReply> {
  const variant = VARIANTS[step.who.variant]!
  const headers: Array<[string, string]> = [...world.authLines(step.auth), ...variant.lines.map((l): [string, string] => ['X-Toolport-Plugin-Key', l])]
  return await rawRequest(world.port, 'POST', `/api/tools/${step.kind}`, payloadOf(world, step), headers)
}

/** What an answer says, in the model's terms. */
function answerOf (reply: { status: number, body: any }): string {
  if (reply.status !== 200) return JSON.stringify({ status: reply.status, code: reply.body?.code })
  const shape = { ...reply.body }
  if (Array.isArray(shape.failed_roles) && 'registered' in shape) {
    shape.failed_roles = (shape.failed_roles as Json[]).map((f) => ({ role: f.role, owned_by: f.owned_by }))
    delete shape.error
  }
  return JSON.stringify(shape)
}
function expectedAnswerOf (outcome: Outcome): string {
  return outcome.error === null
    ? JSON.stringify(outcome.body)
    : JSON.stringify({ status: outcome.error.status, code: outcome.error.code })
}

function permutations<T> (items: T[]): T[][] {
  if (items.length <= 1) return [items]
  return items.flatMap((item, i) =>
    permutations([...items.slice(0, i), ...items.slice(i + 1)]).map((rest) => [item, ...rest]))
}

function describeStep (step: Step): string {
  if (step.kind === 'batch') return JSON.stringify(step.ops.map((op) => JSON.parse(describeStep(op))))
  if ('who' in step) {
    const who = step.who.kind === 'host' ? 'host' : VARIANTS[step.who.variant]!.label
    return JSON.stringify({ ...step, who })
  }
  return JSON.stringify(step)
}

async function runScenario (t: TestContext, world: World, tokenMode: boolean, steps: Step[]): Promise<void> {
  let model = new Model()
  try {
    await world.start(tokenMode)
    let metrics = toolportMetrics((await world.get('/metrics')).text)
    for (const [i, step] of steps.entries()) {
      const context = `step ${i} ${describeStep(step)}`
      if (step.kind === 'restart') {
        await world.stop()
        await world.start(step.token)
        model = new Model()
        metrics = toolportMetrics((await world.get('/metrics')).text)
        await checkListing(world, model, context)
        continue
      }
      if (step.kind === 'role') {
        if (world.tp.roles.has('B')) {
          world.tp.roles.remove('B')
          model.roles.delete('B')
        } else {
          world.tp.roles.add('B')
          model.roles.set('B', new Map())
        }
        await world.fence()
        await checkListing(world, model, context)
        metrics = toolportMetrics((await world.get('/metrics')).text)
        continue
      }
      if (step.kind === 'batch') {
        const replies = await Promise.all(step.ops.map(async (op) => await sendOverHttp(world, op as any)))
        const answers = replies.map((r) => answerOf({ status: r.statusCode, body: r.body }))
        for (const r of replies) assertNoKey(r.text, `the answer (${context})`)
        const events = await world.fence()
        const listed = await world.get('/api/tools')
        let found: Model | null = null
        for (const order of permutations([...step.ops.keys()])) {
          const trial = model.clone()
          const expected: string[] = []
          const changes: string[] = []
          for (const i of order) {
            const outcome = apply(trial, step.ops[i]!, world.token !== null)
            expected[i] = expectedAnswerOf(outcome)
            for (const c of outcome.changes) changes.push(`${c.type} ${c.role}/${c.name} ${c.source}`)
          }
          if (!expected.every((e, i) => e === answers[i])) continue
          if (!isDeepStrictEqual(changesOf(events), changes.sort())) continue
          const rows: Json = {}
          for (const [role, tools] of trial.roles) rows[role] = [...tools].map(([n, tl]) => `${n} ${tl.source} ${tl.origin}`).sort()
          const actual: Json = {}
          for (const [role, list] of Object.entries(listed.body.tools_by_role as Json)) {
            if (role.startsWith('fence')) continue
            actual[role] = (list as Json[]).map((r) => `${r.name} ${r.source} ${String(r.callback_url).startsWith(world.liveUrl) ? 'live' : 'dead'}`).sort()
          }
          if (!isDeepStrictEqual(actual, rows)) continue
          found = trial
          break
        }
        assert.ok(found !== null, `${context}: answers ${JSON.stringify(answers)}, events ${JSON.stringify(changesOf(events))} and listing ${listed.text} are those of no serial order`)
        model = found
        metrics = toolportMetrics((await world.get('/metrics')).text)
        continue
      }
      if (step.kind === 'evict') {
        let pick: { role: string, name: string } | undefined
        for (const [role, tools] of model.roles) {
          for (const [name, tl] of tools) if (pick === undefined && tl.origin === 'dead' && tl.source.startsWith('plugin:')) pick = { role, name }
        }
        if (pick === undefined) continue
        // docs/protocol.md "Eviction": three consecutive connection failures at the origin.
        for (let n = 0; n < 3; n++) {
          const res = await rawRequest(world.port, 'POST', '/api/tools/call', { role: pick.role, name: pick.name, arguments: {} }, world.authLines('ok'))
          assert.equal(res.statusCode, 200, `${context}: call ${n}`)
          assert.equal(res.body.is_error, true, `${context}: call ${n} at a dead port`)
          if (n < 2) assert.ok(world.tp.list(pick.role).tools_by_role[pick.role]!.some((r) => r.name === pick!.name), `${context}: not evicted before the third failure`)
        }
        const expected: string[] = []
        for (const [role, tools] of model.roles) {
          for (const [name, tl] of [...tools]) {
            if (tl.origin === 'dead' && tl.source.startsWith('plugin:')) {
              tools.delete(name)
              expected.push(`evicted ${role}/${name} ${tl.source}`)
            }
          }
        }
        const events = await world.fence()
        for (const e of events) assertNoKey(e.raw, 'an event')
        assert.deepEqual(changesOf(events), expected.sort(), `${context}: evicted events`)
        await checkListing(world, model, context)
        metrics = toolportMetrics((await world.get('/metrics')).text)
        continue
      }
      const tokenOn = world.token !== null
      const outcome = apply(model, step, tokenOn)
      let status: number
      let body: any
      let text: string
      if (step.who.kind === 'host') {
        const payload = payloadOf(world, step)
        const call = step.kind === 'register'
          ? world.tp.register(payload)
          : step.kind === 'unregister' ? world.tp.unregister(payload) : world.tp.clear(payload)
        try {
          body = await within(call as Promise<any>, context, GUARD_MS)
          status = 200
        } catch (err) {
          const e = err as { statusCode?: number, code?: string, message?: string }
          status = e.statusCode ?? 0
          body = { code: e.code, message: e.message }
        }
        text = JSON.stringify(body)
      } else {
        const res = await sendOverHttp(world, { ...step, who: step.who })
        status = res.statusCode
        body = res.body
        text = res.text
        if (outcome.error !== null) {
          // README "Errors": the error shape; SECURITY.md: a refused client keeps no socket.
          assert.equal(body?.ok, false, `${context}: ${text}`)
          assert.equal(body.statusCode, outcome.error.status, context)
          if (outcome.error.status === 401 || outcome.error.status === 403) {
            assert.equal(res.headers.connection, 'close', `${context}: Connection: close`)
          }
          if (outcome.error.code === 'TP_ERR_PLUGIN_KEY_REQUIRED') {
            assert.equal(res.headers['www-authenticate'], 'Toolport-Plugin-Key', context)
          }
        }
      }
      assertNoKey(text, `the answer (${context})`)
      if (outcome.error === null) {
        assert.equal(status, 200, `${context}: accepted, got ${text}`)
        const shape = { ...body }
        if (step.kind === 'register') {
          shape.failed_roles = (shape.failed_roles as Json[]).map((f) => ({ role: f.role, owned_by: f.owned_by }))
          delete shape.error
        }
        assert.deepEqual(shape, outcome.body, `${context}: the answer is the model's`)
      } else {
        assert.equal(status, outcome.error.status, `${context}: expected ${outcome.error.code}, got ${text}`)
        assert.equal(body.code, outcome.error.code, `${context}: ${text}`)
      }
      const events = await world.fence()
      for (const e of events) assertNoKey(e.raw, 'an event')
      assert.deepEqual(changesOf(events), outcome.changes.map((c) => `${c.type} ${c.role}/${c.name} ${c.source}`).sort(),
        `${context}: the step's events are the model's change (none for a refused request)`)
      await checkListing(world, model, context)
      const now = toolportMetrics((await world.get('/metrics')).text)
      assertNoKey(now, '/metrics')
      if (outcome.error !== null || outcome.changes.length === 0) {
        assert.equal(now, metrics, `${context}: a request that changed nothing changes no metric`)
      }
      metrics = now
    }
    const state = await world.get('/api/console/state')
    assert.equal(state.statusCode, 200)
    assertNoKey(state.text, '/api/console/state')
  } finally {
    await world.stop()
  }
}

test('ownership property: who may change which tool, over real HTTP, against the documented model', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const live = await startCallbackServer()
  t.after(() => live.close())
  const world = new World(live.url, `http://127.0.0.1:${await deadPort()}`)
  const arbSteps = fc.array(arbStep, { minLength: 1, maxLength: 30 })
  await fc.assert(fc.asyncProperty(fc.boolean(), arbSteps, async (tokenMode, steps) => {
    await runScenario(t, world, tokenMode, steps)
  }), { numRuns: runs(40), endOnFailure: true, includeErrorInReport: true })
})

// ---------------------------------------------------------------------------------------------
// Key comparison: exact equality of the whole key (README "the plugin key")

test('ownership property: a source answers only to the exact key that bound it', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const world = new World('http://127.0.0.1:9', 'http://127.0.0.1:9')
  await world.start(false)
  t.after(() => world.stop())
  let n = 0
  const keyChar = fc.integer({ min: 0x21, max: 0x7e }).map((c) => String.fromCharCode(c))
  const arbKey = fc.array(keyChar, { minLength: 32, maxLength: 80 }).map((cs) => cs.join(''))
  /** A variant of `key`: one character changed, cut, extended, or its case swapped. */
  const arbOther = fc.tuple(fc.nat(), keyChar, fc.constantFrom('replace', 'append', 'drop-last', 'case', 'same'))
  await fc.assert(fc.asyncProperty(arbKey, arbOther, async (key, [at, ch, how]) => {
    const source = `plugin:exact${n++}`
    const i = at % key.length
    let other = key
    if (how === 'replace') other = key.slice(0, i) + ch + key.slice(i + 1)
    else if (how === 'append') other = key + ch
    else if (how === 'drop-last' && key.length > 32) other = key.slice(0, -1)
    else if (how === 'case') other = swapCase(key)
    const body = { name: `tool${n}`, source, role: 'A', callback_url: 'http://127.0.0.1:9/x' }
    const first = await rawRequest(world.port, 'POST', '/api/tools/register', body, [['X-Toolport-Plugin-Key', key]])
    assert.equal(first.body.ok, true, first.text)
    const second = await rawRequest(world.port, 'POST', '/api/tools/clear', { source }, [['X-Toolport-Plugin-Key', other]])
    if (other === key) {
      assert.equal(second.statusCode, 200, second.text)
      assert.equal(second.body.removed, 1)
    } else {
      assert.equal(second.statusCode, 403, `${JSON.stringify(other)} is another key than ${JSON.stringify(key)}`)
      assert.equal(second.body.code, 'TP_ERR_NOT_OWNER')
      assert.ok(!second.text.includes(key) && !second.text.includes(other), 'no key in the error')
      const cleared = await rawRequest(world.port, 'POST', '/api/tools/clear', { source }, [['X-Toolport-Plugin-Key', key]])
      assert.equal(cleared.body.removed, 1, cleared.text)
    }
  }), { numRuns: runs(60), endOnFailure: true, includeErrorInReport: true })
})

// ---------------------------------------------------------------------------------------------
// The plugin SDK in ownership mode

test('ownership property: the TypeScript SDK sends its key, is refused at once under another key, and recovers', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const tokenModes = fc.sample(fc.boolean(), { numRuns: runs(2) })
  for (const tokenMode of [...new Set([false, true, ...tokenModes])]) {
    const token = tokenMode ? randomBytes(32).toString('hex') : undefined
    let tp = new Toolport({ roles: ['A'], logger: false, dispatch: { mode: 'inline' }, security: { enforceOwnership: true, ...(token === undefined ? {} : { token }) } })
    await tp[kDispatchReady]
    const { port, url } = await tp.listen({ host: '127.0.0.1', port: 0 })
    const source = 'plugin:sdk'
    const key = KEYS.K0
    const tools = { sdk_tool: { description: 'x', handler: () => ({ ok: 1 }) } }
    // The SDK's own log, every level: the key never appears in it (nor in its errors, below).
    let sdkLog = ''
    const write = (message: string): void => { sdkLog += `${message}\n` }
    const logger = { debug: write, info: write, warn: write, error: write }
    const common = {
      toolportUrl: url,
      source,
      tools,
      logger,
      pollIntervalMs: 50,
      maxBackoffMs: 50,
      ...(token === undefined ? {} : { token })
    }
    const owner = createPlugin({ ...common, pluginKey: key, startTimeoutMs: 5000 })
    try {
      await within(owner.start(), 'owner start', GUARD_MS)
      // The key it sent is the key the source is bound to: that key may clear it, another may not.
      const auth: Array<[string, string]> = token === undefined ? [] : [['Authorization', `Bearer ${token}`]]
      const foreign = await rawRequest(port, 'POST', '/api/tools/clear', { source }, [...auth, ['X-Toolport-Plugin-Key', KEYS.K0case]])
      assert.equal(foreign.statusCode, 403, foreign.text)
      // README "Plugin SDK": another key's start() rejects at once with TP_ERR_NOT_OWNER, even with
      // a long startTimeoutMs (a 4xx is never retried).
      for (const other of [KEYS.K1, KEYS.K0case]) {
        const intruder = createPlugin({ ...common, pluginKey: other, startTimeoutMs: 30_000 })
        await assert.rejects(within(intruder.start(), 'intruder start (must reject at once, not retry)', GUARD_MS),
          (err: unknown) => {
            assertNoKey(`${String((err as Error).message)} ${JSON.stringify(err)}`, 'the SDK\'s error')
            return err instanceof PluginError && err.toolportCode === 'TP_ERR_NOT_OWNER'
          })
        assert.equal(tp.list('A').tools_by_role.A![0]!.callback_url, owner.callbackUrl('sdk_tool'))
      }
      // Toolport restarts on the same port: the plugin registers again with the same key (R3).
      const restored = new Promise<void>((resolve) => { owner.on('registered', (e) => { if (e.reason === 'restored') resolve() }) })
      owner.on('error', () => {})
      await tp.close()
      tp = new Toolport({ roles: ['A'], logger: false, dispatch: { mode: 'inline' }, security: { enforceOwnership: true, ...(token === undefined ? {} : { token }) } })
      await tp[kDispatchReady]
      await tp.listen({ host: '127.0.0.1', port })
      await within(restored, 'the plugin registers again after the restart', GUARD_MS)
      assert.equal(tp.list('A').tools_by_role.A![0]!.callback_url, owner.callbackUrl('sdk_tool'))
      const foreign2 = await rawRequest(port, 'POST', '/api/tools/clear', { source }, [...auth, ['X-Toolport-Plugin-Key', KEYS.K1]])
      assert.equal(foreign2.statusCode, 403, `after the restart the source is bound to the plugin's key again: ${foreign2.text}`)
      // A second plugin object with the SAME key (a restarted plugin that kept its key) takes the source back at once.
      const heir = createPlugin({ ...common, pluginKey: key, startTimeoutMs: 5000 })
      await within(heir.start(), 'heir start', GUARD_MS)
      assert.equal(tp.list('A').tools_by_role.A![0]!.callback_url, heir.callbackUrl('sdk_tool'))
      const stopped = await within(heir.stop({ graceMs: 0 }), 'heir stop', GUARD_MS)
      assert.equal(stopped.isCleared, true)
      assert.equal(stopped.removed, 1)
      // The source is free now: a plugin with a new key starts on it.
      await within(owner.stop({ graceMs: 0 }), 'owner stop', GUARD_MS)
      const fresh = createPlugin({ ...common, pluginKey: KEYS.K1, startTimeoutMs: 5000 })
      await within(fresh.start(), 'a new key on a free source', GUARD_MS)
      await within(fresh.stop({ graceMs: 0 }), 'fresh stop', GUARD_MS)
      assert.deepEqual(tp.list('A').tools_by_role.A, [])
      assertNoKey(sdkLog, 'the SDK\'s log')
    } finally {
      await owner.stop({ graceMs: 0 }).catch(() => {})
      await tp.close()
    }
  }
})

test('ownership: the SDK refuses a malformed pluginKey before sending it (README "Plugin SDK" options)', () => {
  for (const bad of [SHORT, LONG, `${KEYS.K0.slice(0, 20)} ${KEYS.K0.slice(20)}`, `${KEYS.K0}\u00e9`]) {
    assert.throws(() => createPlugin({ toolportUrl: 'http://127.0.0.1:9', source: 'plugin:x', pluginKey: bad, logger: false, tools: { a: { handler: () => 1 } } }),
      (err: unknown) => !String((err as Error).message).includes(bad))
  }
})

test('ownership: a plugin whose source another key took meanwhile reports TP_ERR_NOT_OWNER, then restores once it is free', { timeout: FAILING_TIMEOUT_MS }, async () => {
  const tp = new Toolport({ roles: ['A'], logger: false, dispatch: { mode: 'inline' }, security: { enforceOwnership: true } })
  await tp[kDispatchReady]
  const { port, url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  const source = 'plugin:taken'
  const plugin = createPlugin({
    toolportUrl: url,
    source,
    pluginKey: KEYS.K0,
    logger: false,
    pollIntervalMs: 30,
    maxBackoffMs: 30,
    startTimeoutMs: 5000,
    tools: { taken_tool: { handler: () => 1 } }
  })
  const errors: PluginError[] = []
  const restored: string[] = []
  plugin.on('error', (err: PluginError) => { errors.push(err) })
  plugin.on('registered', (e) => { if (e.reason === 'restored') restored.push(e.reason) })
  try {
    await within(plugin.start(), 'start', GUARD_MS)
    // The host clears the source (it may change any source): the binding ends with its last tool ...
    assert.equal((await tp.clear({ source })).removed, 1)
    // ... and another key claims it before the plugin's next check.
    const claimed = await rawRequest(port, 'POST', '/api/tools/register', { name: 'intruder', source, callback_url: 'http://127.0.0.1:9/x' }, [['X-Toolport-Plugin-Key', KEYS.K1]])
    assert.equal(claimed.body?.ok, true, claimed.text)
    await within((async () => { while (!errors.some((e) => e.toolportCode === 'TP_ERR_NOT_OWNER')) await new Promise((resolve) => setTimeout(resolve, 10)) })(),
      () => `the plugin reports TP_ERR_NOT_OWNER (errors: ${errors.map((e) => e.toolportCode ?? e.message).join(', ')})`, GUARD_MS)
    assert.deepEqual(tp.list('A').tools_by_role.A!.map((r) => r.name), ['intruder'])
    // The other key clears: the source is free, and the plugin takes it back by itself.
    const cleared = await rawRequest(port, 'POST', '/api/tools/clear', { source }, [['X-Toolport-Plugin-Key', KEYS.K1]])
    assert.equal(cleared.body?.removed, 1, cleared.text)
    await within((async () => { while (restored.length === 0) await new Promise((resolve) => setTimeout(resolve, 10)) })(), 'restored', GUARD_MS)
    assert.deepEqual(tp.list('A').tools_by_role.A!.map((r) => r.callback_url), [plugin.callbackUrl('taken_tool')])
    const foreign = await rawRequest(port, 'POST', '/api/tools/clear', { source }, [['X-Toolport-Plugin-Key', KEYS.K1]])
    assert.equal(foreign.statusCode, 403, 'bound to the plugin\'s key again')
  } finally {
    await plugin.stop({ graceMs: 0 })
    await tp.close()
  }
})
