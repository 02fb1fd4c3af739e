// What Toolport reveals, and to whom (SECURITY.md "Private data in logs and in the event stream",
// "Token mode", "Ownership mode", "Outbound: the callback call"; docs/protocol.md R9, R14 and
// "Errors of the API itself"; README "Live events", "The console", "Privacy", "MCP", "Plugin SDK").
//
// Planted secrets: every value that may be private gets a fresh unique core `Qz<kind><20 alnum>`
// (the token, plugin keys and malformed keys, Cookie and custom request headers, a wrong bearer,
// tool-call arguments, call ids, callback reply bodies (outputs, tool errors, HTTP error bodies,
// text), callback URL query strings and userinfo, unknown tool names, MCP client messages, bodies
// of refused requests, a plugin SDK handler's error message). The core is [A-Za-z0-9], which JSON
// escaping and URL encoding leave as it is, so one regex finds it in any of those forms; base64
// runs are decoded at each alignment and searched too. Secrets in arguments are decorated with
// characters that need escaping (`"`, `\`, `é`, `/`, space, `&`, `+`).
//
// The main property runs a real `toolport serve` child (pool mode, token mode, ownership mode,
// `--log-level trace`, stdout and stderr captured) with two event-stream subscribers (one
// role-filtered), a real callback server, real MCP SDK clients (one per run) and the real stdio
// bridge (`toolport mcp --token-file`, its stderr captured), and runs random sequences of
// registrations (own, another plugin's, missing or malformed key; userinfo URLs), calls that
// succeed and fail in every documented way (output, tool error, HTTP 500, text, hang-up,
// deadline, unreachable origin and eviction, invalid and unparsable arguments, unknown names),
// some concurrent, over HTTP, MCP and the bridge; MCP client noise (progress for an unknown
// token, a response to no request, a cancel of no request, a bad cursor); refused requests (no or
// wrong token, foreign Origin or Host) against every route; and reads of the list, definitions,
// console state and stats, health and /metrics. After each run it checks every channel:
//
// - logs (serve and bridge): no secret but call ids (the documented call metadata);
// - the event streams, /metrics, console stats: no secret at all;
// - console state and GET /api/tools: callback URLs (with their query) only;
// - each answer: only what its own client sent, and the replies of its own calls;
// - each callback request: only its own call's arguments and call id, and its own URL's query;
//   never a header of the caller (Cookie, Authorization, custom) or a plugin key;
// - a refused client: a fixed refusal, identical whether the role or route exists, that names no
//   role, tool or source.
//
// The regression tests at the end pin what was found, one fixed example each: MCP client messages
// and headers logged at debug (the SDK's transport errors quote them); a call arriving while
// Toolport shuts down logs and labels the model's free-text tool name; the TypeScript plugin SDK
// logs a handler's error message; a config file that is not JSON gets part of its token quoted on
// stderr; the stdio bridge prints a password given in --url. A last test checks the detector.
// TP_PROPERTY_RUNS multiplies the runs.
import assert from 'node:assert/strict'
import { spawn, type ChildProcess } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { PassThrough } from 'node:stream'
import { test, type TestContext } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import fc from 'fast-check'
import { Agent, request as httpRequest } from 'undici'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { main } from '../../src/main/cli.js'
import { Toolport } from '../../src/main/toolport.js'
import { createLogger } from '../../src/main/logger.js'
import { kDispatchReady } from '../../src/main/symbols.js'
import { createPlugin } from '../../src/plugin/index.js'
import { closedPort } from '../fixtures/callback-server.js'
import { listenOnLoopback, toolportCliArgs, waitFor, within } from '../helpers.js'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const RUNS = Math.max(1, Number(process.env.TP_PROPERTY_RUNS ?? '1'))
const FAILING_TIMEOUT_MS = 600_000
const MAX_SHRINKS = 20
const RUN_GUARD_MS = 60_000
/** timeout_seconds of the "short" tools; their slow replies take far longer. */
const SHORT_SECONDS = 0.25
const SLOW_REPLY_MS = 800

// ---- Secrets ----------------------------------------------------------------------------------

const KINDS = {
  token: 'T',
  badToken: 'W',
  key: 'K',
  badKey: 'B',
  cookie: 'C',
  header: 'H',
  arg: 'A',
  callId: 'I',
  reply: 'R',
  name: 'N',
  urlQuery: 'U',
  userinfo: 'P',
  refusedBody: 'X',
  mcpExtra: 'M',
  query: 'Q',
  pluginError: 'E'
} as const
type Kind = keyof typeof KINDS

const CORE = /Qz[A-Z][a-z0-9]{20}/g
const ALNUM = 'abcdefghijklmnopqrstuvwxyz0123456789'

/** Every secret made, by its core. */
class SecretBook {
  readonly kinds = new Map<string, Kind>()
  /** The order each secret was made in (0, 1, …). */
  readonly order = new Map<string, number>()

  /** A fresh secret core of `kind`: `Qz<letter><20 lowercase alnum>`. */
  make (kind: Kind): string {
    let tail = ''
    for (const byte of randomBytes(20)) tail += ALNUM[byte % ALNUM.length]
    const core = `Qz${KINDS[kind]}${tail}`
    this.kinds.set(core, kind)
    this.order.set(core, this.order.size)
    return core
  }
}

/** A secret value with characters that must be escaped in JSON, URLs and logs around its core. */
function decorate (core: string): string {
  return `${core}"\\é/ &+`
}

/**
 * The secret cores in `text`: as written, JSON-escaped or URL-encoded (none of which changes a
 * core), and inside base64 runs, decoded at each of the four alignments.
 */
function coresIn (text: string): Set<string> {
  const found = new Set<string>(text.match(CORE) ?? [])
  for (const run of text.match(/[A-Za-z0-9+/_-]{28,}/g) ?? []) {
    for (let offset = 0; offset < 4; offset++) {
      const decoded = Buffer.from(run.slice(offset), 'base64').toString('latin1')
      for (const core of decoded.match(CORE) ?? []) found.add(core)
    }
  }
  return found
}

/** Where a found secret is not allowed: one line naming channel, kind and the text around it. */
class Violations {
  readonly lines: string[] = []
  readonly #book: SecretBook
  /** Secrets found where they are allowed, by `<first word of the channel>:<kind>` (the checks' teeth). */
  readonly #seen: Map<string, number> | undefined

  readonly #ignore: (order: number) => boolean

  /**
   * `ignore`: secrets (by the order they were made in) this check leaves alone: a run checks the
   * world's secrets and its own, so that a leak is reported (and shrunk) by the run that made it,
   * not by a later one that finds it still in /metrics or the console.
   */
  constructor (book: SecretBook, seen?: Map<string, number>, ignore: (order: number) => boolean = () => false) {
    this.#book = book
    this.#seen = seen
    this.#ignore = ignore
  }

  /**
   * Records every secret in `text` that is neither in `own` (what this party sent or is owed) nor
   * of an `allowed` kind for this channel.
   */
  check (channel: string, text: string, own: ReadonlySet<string> = new Set(), allowed: readonly Kind[] = []): void {
    for (const core of coresIn(text)) {
      const kind = this.#book.kinds.get(core)
      if (kind === undefined || this.#ignore(this.#book.order.get(core) ?? 0)) continue
      if (own.has(core) || allowed.includes(kind)) {
        const key = `${channel.split(' ')[0] ?? ''}:${kind}`
        this.#seen?.set(key, (this.#seen.get(key) ?? 0) + 1)
        continue
      }
      const at = text.indexOf(core)
      const context = at === -1 ? '(base64)' : JSON.stringify(text.slice(Math.max(0, at - 160), at + 60))
      this.lines.push(`${channel}: a ${kind} secret ${core}: ${context}`)
    }
  }

  assertNone (): void {
    if (this.lines.length > 0) assert.fail(`secrets where they must not be:\n${[...new Set(this.lines)].join('\n')}`)
  }
}

// ---- The callback server -----------------------------------------------------------------------

type ReplyMode = 'ok' | 'echo' | 'toolError' | 'toolErrorOutput' | 'http500' | 'text' | 'hangUp' | 'slow' |
'large' | 'image'
const REPLY_MODES: readonly ReplyMode[] = ['ok', 'echo', 'toolError', 'toolErrorOutput', 'http500', 'text',
  'hangUp', 'slow', 'large', 'image']
const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])

interface Received {
  path: string
  headers: string
  body: string
}

interface Callbacks {
  url: string
  /** What the callback answers to the call whose arguments carry `k` = the key. */
  replies: Map<string, { mode: ReplyMode, reply: string }>
  received: Received[]
}

async function startCallbacks (t: TestContext): Promise<Callbacks> {
  const replies = new Map<string, { mode: ReplyMode, reply: string }>()
  const received: Received[] = []
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.once('end', () => {
      const body = Buffer.concat(chunks).toString('utf8')
      received.push({ path: req.url ?? '', headers: JSON.stringify(req.rawHeaders), body })
      let k = ''
      try {
        k = String((JSON.parse(body) as { arguments?: { k?: unknown } }).arguments?.k ?? '')
      } catch {}
      const plan = replies.get(k) ?? { mode: 'ok' as const, reply: 'plain' }
      const json = (value: unknown, status = 200): void => {
        res.writeHead(status, { 'content-type': 'application/json' })
        res.end(JSON.stringify(value))
      }
      switch (plan.mode) {
        case 'ok': json({ output: { r: plan.reply }, is_error: false }); return
        case 'echo': json({ output: JSON.parse(body) as unknown, is_error: false }); return
        case 'toolError': json({ error: `refused: ${plan.reply}`, is_error: true }); return
        case 'toolErrorOutput': json({ error: 'NO_DATA', output: { why: plan.reply }, is_error: true }); return
        case 'http500':
          res.writeHead(500, { 'content-type': 'text/plain' })
          res.end(`internal trouble ${plan.reply}`)
          return
        case 'text':
          res.writeHead(200, { 'content-type': 'text/plain' })
          res.end(`plain ${plan.reply}`)
          return
        case 'hangUp': req.socket.destroy(); return
        // Over 16 KiB: the text crosses from the worker as moved bytes (README "Performance").
        case 'large': json({ output: { pad: 'x'.repeat(20_000), r: plan.reply }, is_error: false }); return
        case 'image': {
          const data = Buffer.concat([PNG_MAGIC, Buffer.from(`IHDR ${plan.reply}`)]).toString('base64')
          json({ output: { caption: 'map' }, images: [{ data_b64: data, mime: 'image/png', vision_prompt: `look ${plan.reply}` }] })
          return
        }
        case 'slow': {
          const timer = setTimeout(() => { json({ output: { late: plan.reply }, is_error: false }) }, SLOW_REPLY_MS)
          res.once('close', () => clearTimeout(timer))
        }
      }
    })
  })
  const url = await listenOnLoopback(t, server)
  return { url, replies, received }
}

// ---- The `toolport serve` child ------------------------------------------------------------------

interface Served {
  url: string
  token: string
  roles: [string, string]
  /** Its stdout and stderr so far. */
  output: { text: string }
  stop: () => Promise<number | null>
  dir: string
}

function cleanEnv (): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {}
  for (const [name, value] of Object.entries(process.env)) if (!name.startsWith('TOOLPORT_')) env[name] = value
  return env
}

async function startServe (t: TestContext, book: SecretBook): Promise<Served> {
  const dir = mkdtempSync(join(tmpdir(), 'secrets-'))
  t.after(() => rmSync(dir, { recursive: true, force: true }))
  const token = `${book.make('token')}-${'t'.repeat(12)}`
  const tokenFile = join(dir, 'token')
  writeFileSync(tokenFile, `${token}\n`, { mode: 0o600 })
  const configFile = join(dir, 'config.json')
  writeFileSync(configFile, JSON.stringify({ security: { enforceOwnership: true }, evictionThreshold: 3 }))
  const suffix = randomBytes(4).toString('hex')
  const roles: [string, string] = [`alpha${suffix}`, `beta${suffix}`]
  const child: ChildProcess = spawn(process.execPath, [...toolportCliArgs(), 'serve', '--port', '0',
    '--role', roles[0], '--role', roles[1], '--log-level', 'trace', '--token-file', tokenFile, '--config', configFile], {
    cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'], env: cleanEnv()
  })
  const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>
  t.after(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
  const output = { text: '' }
  child.stderr?.setEncoding('utf8')
  child.stderr?.on('data', (d: string) => { output.text += d })
  const url = await within(new Promise<string>((resolve) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      output.text += `${line}\n`
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(line)
      if (m !== null) resolve(m[1] as string)
    })
  }), () => `toolport serve starts (output: ${output.text})`, 30_000)
  async function stop (): Promise<number | null> {
    if (child.exitCode !== null || child.signalCode !== null) return child.exitCode
    child.kill('SIGTERM')
    const [code] = await within(exited, 'toolport serve exits on SIGTERM', 20_000)
    return code
  }
  return { url, token, roles, output, stop, dir }
}

// ---- A world: the server, its subscribers, the callbacks, the bridge ------------------------------

interface World {
  book: SecretBook
  serve: Served
  callbacks: Callbacks
  deadPort: number
  agent: Agent
  /** Text of the authorized event subscribers: every event, and only the second role's. */
  events: Array<{ text: string }>
  bridge: { client: Client, stderr: { text: string } }
  /** What the callback of the call with arguments `k` may see (its own secrets). */
  callbackOwn: Map<string, Set<string>>
  /** Secrets found where they were allowed, by channel and kind (Violations). */
  seen: Map<string, number>
  /** How many secrets the world itself made (the token): every run checks those. */
  worldSecrets: number
  /** Callback requests and outputs already checked. */
  checked: { output: number, events: number[], received: number, bridge: number }
  runs: number
}

async function subscribe (t: TestContext, world: Pick<World, 'serve' | 'agent'>, query: string): Promise<{
  text: string
}> {
  const sink = { text: '' }
  const res = await httpRequest(`${world.serve.url}/api/events${query}`, {
    dispatcher: world.agent,
    headers: { authorization: `Bearer ${world.serve.token}` }
  })
  assert.equal(res.statusCode, 200)
  res.body.setEncoding('utf8')
  res.body.on('data', (d: string) => { sink.text += d })
  res.body.on('error', () => {})
  t.after(() => { res.body.destroy() })
  await waitFor('the event stream says hello', () => sink.text.includes('event: hello'))
  return sink
}

async function startWorld (t: TestContext): Promise<World> {
  const book = new SecretBook()
  const agent = new Agent({ connections: 16 })
  t.after(() => agent.destroy())
  const [serve, callbacks, deadPort] = await Promise.all([startServe(t, book), startCallbacks(t), closedPort()])
  const partial = { serve, agent }
  const events = [await subscribe(t, partial, ''), await subscribe(t, partial, `?role=${serve.roles[1]}`)]
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [...toolportCliArgs(), 'mcp', '--role', serve.roles[0], '--url', serve.url, '--token-file',
      join(serve.dir, 'token')],
    cwd: ROOT,
    stderr: 'pipe',
    env: cleanEnv() as Record<string, string>
  })
  const stderr = { text: '' }
  transport.stderr?.on('data', (d: Buffer) => { stderr.text += d.toString('utf8') })
  const client = new Client({ name: 'secrets-bridge', version: '1.0.0' })
  await within(client.connect(transport), 'the stdio bridge connects', 20_000)
  t.after(() => client.close())
  return {
    book,
    serve,
    callbacks,
    deadPort,
    agent,
    events,
    bridge: { client, stderr },
    callbackOwn: new Map(),
    seen: new Map(),
    worldSecrets: book.order.size,
    checked: { output: 0, events: [0, 0], received: 0, bridge: 0 },
    runs: 0
  }
}

// ---- The operations ---------------------------------------------------------------------------------

type KeyMode = 'own' | 'other' | 'missing' | 'malformed'
type ArgsKind = 'valid' | 'schema' | 'rawBad'
type Via = 'http' | 'mcp' | 'bridge'

interface ToolSpec {
  plugin: number
  /** Where the callback URL carries a secret: nowhere, its query string or a path segment (as the SDKs do). */
  urlSecret: 'none' | 'query' | 'path'
  /** timeout_seconds SHORT_SECONDS (else 30). */
  short: boolean
  /** The callback URL's port has no listener (connection failures, then eviction). */
  dead: boolean
  /** Registered for every role (null) or the first / second one. */
  role: 0 | 1 | null
}

interface CallOp { op: 'call', tool: number, unknown: boolean, mode: ReplyMode, args: ArgsKind, callId: boolean, via: Via }
type RefusalKind = 'noToken' | 'badToken' | 'origin' | 'host'
type McpNoise = 'progress' | 'strayResponse' | 'cancel' | 'cursor' | 'protocolHeader'
type Op =
  | CallOp
  | { op: 'parallel', calls: CallOp[] }
  | { op: 'register', tool: number, keyMode: KeyMode, userinfo: boolean }
  | { op: 'unregister', tool: number, keyMode: KeyMode, expected: boolean }
  | { op: 'clear', plugin: number, keyMode: KeyMode }
  | { op: 'refused', kind: RefusalKind, route: number, roleExists: boolean }
  | { op: 'read', route: 'tools' | 'toolsRole' | 'state' | 'stats' | 'metrics' | 'definitions' | 'health' | 'openapi' }
  | { op: 'mcpList' }
  | { op: 'mcpNoise', kind: McpNoise }
  | { op: 'probe', route: number }

const PLUGINS = 3

const toolArb: fc.Arbitrary<ToolSpec> = fc.record({
  plugin: fc.integer({ min: 0, max: PLUGINS - 1 }),
  urlSecret: fc.constantFrom<ToolSpec['urlSecret']>('none', 'query', 'path'),
  short: fc.boolean(),
  dead: fc.constantFrom(false, false, false, true),
  role: fc.constantFrom<0 | 1 | null>(null, null, 0, 1)
})

function callArb (tools: number): fc.Arbitrary<CallOp> {
  return fc.record({
    op: fc.constant<'call'>('call'),
    tool: fc.integer({ min: 0, max: tools - 1 }),
    unknown: fc.constantFrom(false, false, false, true),
    mode: fc.constantFrom(...REPLY_MODES),
    args: fc.constantFrom<ArgsKind>('valid', 'valid', 'valid', 'schema', 'rawBad'),
    callId: fc.boolean(),
    via: fc.constantFrom<Via>('http', 'http', 'mcp', 'mcp', 'bridge')
  })
}

const keyModeArb = fc.constantFrom<KeyMode>('own', 'own', 'other', 'missing', 'malformed')

/** Routes a refused client tries (method, path; `{role}` is an existing or an unknown role). */
const REFUSED_ROUTES: ReadonlyArray<readonly ['GET' | 'POST' | 'DELETE', string]> = [
  ['GET', '/api/tools'],
  ['GET', '/api/tools?role={role}'],
  ['POST', '/api/tools/register'],
  ['POST', '/api/tools/call'],
  ['POST', '/api/tools/unregister'],
  ['GET', '/api/events'],
  ['GET', '/api/events?role={role}'],
  ['GET', '/api/console/state'],
  ['GET', '/api/console/stats'],
  ['GET', '/metrics'],
  ['GET', '/api/health'],
  ['GET', '/openapi.json'],
  ['GET', '/api/tools/definitions?role={role}'],
  ['POST', '/mcp/{role}'],
  ['DELETE', '/mcp/{role}'],
  ['GET', '/no/such/route']
]

/**
 * Authorized requests with a secret (`{s}`) in the URL or a header, which their answers may quote
 * back to their own client (an unknown role, type or format, a path) but nothing else may keep.
 */
const PROBES: ReadonlyArray<readonly ['GET' | 'POST', string, Record<string, string>]> = [
  ['GET', '/api/tools?role={s}', {}],
  ['GET', '/api/events?types=registered,{s}', {}],
  ['GET', '/api/tools/definitions?role={role}&format={s}', {}],
  ['GET', '/no/such/{s}?q={s}', {}],
  ['POST', '/mcp/{s}', {}],
  ['POST', '/mcp/{role}', { 'mcp-session-id': '{s}' }],
  ['GET', '/api/tools?role={role}', { 'last-event-id': '{s}', 'x-forwarded-for': '{s}', 'user-agent': 'probe {s}' }]
]

function opArb (tools: number): fc.Arbitrary<Op> {
  return fc.oneof(
    { weight: 6, arbitrary: callArb(tools) },
    { weight: 2, arbitrary: fc.record({ op: fc.constant<'parallel'>('parallel'), calls: fc.array(callArb(tools), { minLength: 2, maxLength: 4 }) }) },
    { weight: 2, arbitrary: fc.record({ op: fc.constant<'register'>('register'), tool: fc.integer({ min: 0, max: tools - 1 }), keyMode: keyModeArb, userinfo: fc.constantFrom(false, false, true) }) },
    { weight: 1, arbitrary: fc.record({ op: fc.constant<'unregister'>('unregister'), tool: fc.integer({ min: 0, max: tools - 1 }), keyMode: keyModeArb, expected: fc.boolean() }) },
    { weight: 1, arbitrary: fc.record({ op: fc.constant<'clear'>('clear'), plugin: fc.integer({ min: 0, max: PLUGINS - 1 }), keyMode: keyModeArb }) },
    { weight: 2, arbitrary: fc.record({ op: fc.constant<'refused'>('refused'), kind: fc.constantFrom<RefusalKind>('noToken', 'badToken', 'origin', 'host'), route: fc.integer({ min: 0, max: REFUSED_ROUTES.length - 1 }), roleExists: fc.boolean() }) },
    { weight: 2, arbitrary: fc.record({ op: fc.constant<'read'>('read'), route: fc.constantFrom('tools', 'toolsRole', 'state', 'stats', 'metrics', 'definitions', 'health', 'openapi') as fc.Arbitrary<Extract<Op, { op: 'read' }>['route']> }) },
    { weight: 1, arbitrary: fc.record({ op: fc.constant<'mcpList'>('mcpList') }) },
    { weight: 2, arbitrary: fc.record({ op: fc.constant<'mcpNoise'>('mcpNoise'), kind: fc.constantFrom<McpNoise>('progress', 'strayResponse', 'cancel', 'cursor', 'protocolHeader') }) },
    { weight: 1, arbitrary: fc.record({ op: fc.constant<'probe'>('probe'), route: fc.integer({ min: 0, max: PROBES.length - 1 }) }) }
  )
}

const scenarioArb = fc.array(toolArb, { minLength: 1, maxLength: 4 }).chain((tools) => fc.record({
  tools: fc.constant(tools),
  ops: fc.array(opArb(tools.length), { minLength: 1, maxLength: 14 })
}))
type Scenario = { tools: ToolSpec[], ops: Op[] }

/** One run's state: its tools, keys, secrets per party. */
class Run {
  readonly world: World
  readonly tag: string
  readonly keys: string[]
  readonly cookie: string
  readonly header: string
  readonly tools: Array<ToolSpec & { name: string, source: string, url: string, urlQuery: string | null }>
  readonly v: Violations
  /** Registry strings a refused client must never learn. */
  readonly registry: string[]
  mcp: { client: Client, transport: StreamableHTTPClientTransport } | null = null
  #n = 0

  constructor (world: World, scenario: Scenario, v: Violations) {
    this.world = world
    this.v = v
    const book = world.book
    this.tag = `r${world.runs++}${randomBytes(3).toString('hex')}`
    this.keys = Array.from({ length: PLUGINS }, () => `${book.make('key')}-${'k'.repeat(16)}`)
    this.cookie = book.make('cookie')
    this.header = book.make('header')
    this.tools = scenario.tools.map((spec, i) => {
      const urlQuery = spec.urlSecret === 'none' ? null : book.make('urlQuery')
      const base = spec.dead ? `http://127.0.0.1:${world.deadPort}` : world.callbacks.url
      const path = `${base}/cb/${this.tag}/${spec.urlSecret === 'path' ? `${urlQuery}/` : ''}${i}`
      return {
        ...spec,
        name: `tool_${this.tag}_${i}`,
        source: `plugin:secrets-${this.tag}-${spec.plugin}`,
        url: spec.urlSecret === 'query' ? `${path}?sig=${urlQuery}&x=1` : path,
        urlQuery
      }
    })
    this.registry = [...world.serve.roles, ...this.tools.flatMap((tool) => [tool.name, tool.source])]
  }

  next (): number { return this.#n++ }

  /** The headers every authorized request of this run carries: the token, a cookie and a custom header. */
  headers (extra: Record<string, string> = {}): Record<string, string> {
    return {
      authorization: `Bearer ${this.world.serve.token}`,
      cookie: `session=${this.cookie}; theme=dark`,
      'x-client-secret': this.header,
      ...extra
    }
  }

  keyHeader (mode: KeyMode, plugin: number): Record<string, string> {
    switch (mode) {
      case 'own': return { 'x-toolport-plugin-key': this.keys[plugin] as string }
      case 'other': return { 'x-toolport-plugin-key': this.keys[(plugin + 1) % PLUGINS] as string }
      case 'missing': return {}
      case 'malformed': return { 'x-toolport-plugin-key': this.world.book.make('badKey') }
    }
  }

  async request (method: 'GET' | 'POST' | 'DELETE', path: string, body: unknown, headers: Record<string, string>):
  Promise<{ status: number, text: string }> {
    const res = await httpRequest(`${this.world.serve.url}${path}`, {
      method,
      dispatcher: this.world.agent,
      headers: body === undefined ? headers : { 'content-type': 'application/json', ...headers },
      ...(body === undefined ? {} : { body: typeof body === 'string' ? body : JSON.stringify(body) })
    })
    // The answer's headers are part of what the client learns.
    const text = `${JSON.stringify(res.headers)}\n${await res.body.text()}`
    return { status: res.statusCode, text }
  }

  /** An authorized request; its answer may hold only what `own` lists (and `allowed` kinds). */
  async api (method: 'GET' | 'POST' | 'DELETE', path: string, body: unknown, own: Set<string>,
    extra: Record<string, string> = {}, allowed: readonly Kind[] = []): Promise<{ status: number, text: string }> {
    const res = await this.request(method, path, body, this.headers(extra))
    this.v.check(`answer to ${method} ${path}`, res.text, own, allowed)
    assert.ok(res.status < 500, `${method} ${path} answered ${res.status}: ${res.text}`)
    return res
  }

  async register (index: number, keyMode: KeyMode, userinfo: boolean): Promise<void> {
    const tool = this.tools[index]!
    const own = new Set<string>()
    let url = tool.url
    if (userinfo) {
      const password = this.world.book.make('userinfo')
      own.add(password)
      url = url.replace('http://', `http://plugin:${password}@`)
    }
    if (tool.urlQuery !== null) own.add(tool.urlQuery)
    const body = {
      name: tool.name,
      description: `Tool ${index} of ${this.tag}.`,
      parameters: {
        type: 'object',
        properties: { s: { type: 'string' }, k: { type: 'string' }, n: { type: 'number' } },
        required: ['s']
      },
      callback_url: url,
      source: tool.source,
      role: tool.role === null ? null : this.world.serve.roles[tool.role],
      timeout_seconds: tool.short ? SHORT_SECONDS : 30
    }
    const res = await this.api('POST', '/api/tools/register', body, own, this.keyHeader(keyMode, tool.plugin))
    if (userinfo) assert.notEqual(res.status, 200, `a callback URL with userinfo is refused (R2): ${res.text}`)
  }

  async unregister (index: number, keyMode: KeyMode, expected: boolean): Promise<void> {
    const tool = this.tools[index]!
    await this.api('POST', '/api/tools/unregister', {
      name: tool.name, ...(expected ? { expected_source: tool.source } : {})
    }, new Set(), this.keyHeader(keyMode, tool.plugin))
  }

  async clear (plugin: number, keyMode: KeyMode): Promise<void> {
    await this.api('POST', '/api/tools/clear', { source: `plugin:secrets-${this.tag}-${plugin}` }, new Set(),
      this.keyHeader(keyMode, plugin))
  }

  async call (op: CallOp): Promise<void> {
    const book = this.world.book
    const tool = this.tools[op.tool]!
    const k = `k${this.tag}n${this.next()}`
    const argCore = book.make('arg')
    const argCore2 = book.make('arg')
    const reply = book.make('reply')
    const name = op.unknown ? `u${book.make('name')}` : tool.name
    const callId = op.callId && op.via === 'http' ? book.make('callId') : null
    const args: Record<string, unknown> = op.args === 'schema'
      ? { s: decorate(argCore), k, n: decorate(argCore2) }
      : { s: decorate(argCore), k }
    const own = new Set([argCore, argCore2, reply, ...(op.unknown ? [name.slice(1)] : []),
      ...(callId === null ? [] : [callId])])
    this.world.callbackOwn.set(k, new Set([argCore, argCore2, ...(callId === null ? [] : [callId]),
      ...(tool.urlQuery === null ? [] : [tool.urlQuery])]))
    this.world.callbacks.replies.set(k, { mode: op.mode, reply })
    const role = this.world.serve.roles[0]
    if (op.via === 'http') {
      const body: Record<string, unknown> = { role, name, ...(callId === null ? {} : { call_id: callId }) }
      if (op.args === 'rawBad') body.raw_arguments = `{"s": "${argCore}", "k": "${k}"`
      else body.arguments = args
      const res = await this.api('POST', '/api/tools/call', body, own)
      assert.equal(res.status, 200, res.text)
      return
    }
    const client = op.via === 'mcp' ? this.mcp?.client : this.world.bridge.client
    if (client === undefined) return
    let text: string
    try {
      // rawBad has no MCP form (arguments are JSON there): send the unparsable text as a string.
      const result = await client.callTool({ name, arguments: op.args === 'rawBad' ? { s: `{"s": "${argCore}"`, k } : args })
      text = JSON.stringify(result)
    } catch (err) {
      text = `${(err as Error).message} ${JSON.stringify((err as { data?: unknown }).data ?? null)}`
    }
    this.v.check(`${op.via} tools/call answer`, text, own)
  }

  async refused (kind: RefusalKind, route: number, roleExists: boolean): Promise<{ status: number, text: string }> {
    const book = this.world.book
    const role = roleExists ? this.world.serve.roles[0] : `nobody${randomBytes(3).toString('hex')}`
    const [method, template] = REFUSED_ROUTES[route]!
    const path = template.replace('{role}', role)
    const bodySecret = book.make('refusedBody')
    const headers: Record<string, string> = {
      cookie: `session=${this.cookie}`,
      'x-client-secret': this.header,
      'x-toolport-plugin-key': this.keys[0] as string
    }
    if (kind === 'badToken') headers.authorization = `Bearer ${book.make('badToken')}-${'w'.repeat(12)}`
    if (kind === 'origin' || kind === 'host') headers.authorization = `Bearer ${this.world.serve.token}`
    if (kind === 'origin') headers.origin = 'http://evil.example'
    if (kind === 'host') headers.host = 'evil.example'
    const body = method === 'POST'
      ? { name: this.tools[0]!.name, role, source: this.tools[0]!.source, callback_url: `${this.world.callbacks.url}/x`, arguments: { s: bodySecret } }
      : undefined
    const res = await this.request(method, path, body, headers)
    this.v.check(`refused (${kind}) ${method} ${path}`, res.text)
    assert.equal(res.status, kind === 'noToken' || kind === 'badToken' ? 401 : 403,
      `${kind} ${method} ${path} → ${res.status} ${res.text}`)
    for (const word of this.registry) {
      assert.ok(!res.text.includes(word), `a refused client (${kind}) of ${method} ${path} learns ${word}: ${res.text}`)
    }
    return res
  }

  async read (route: Extract<Op, { op: 'read' }>['route']): Promise<void> {
    const [role] = this.world.serve.roles
    const path = {
      tools: '/api/tools',
      toolsRole: `/api/tools?role=${role}`,
      state: '/api/console/state',
      stats: '/api/console/stats',
      metrics: '/metrics',
      definitions: `/api/tools/definitions?role=${role}&format=mcp`,
      health: '/api/health',
      openapi: '/openapi.json'
    }[route]
    // The list and the console's registry show each tool's callback URL as registered (R18).
    const allowed: Kind[] = route === 'tools' || route === 'toolsRole' || route === 'state' ? ['urlQuery'] : []
    await this.api('GET', path, undefined, new Set(), {}, allowed)
  }

  async openMcp (): Promise<void> {
    const transport = new StreamableHTTPClientTransport(new URL(`${this.world.serve.url}/mcp/${this.world.serve.roles[0]}`), {
      requestInit: { headers: this.headers() }
    })
    // What a client says about itself in `initialize` is its own business too.
    const clientName = this.world.book.make('mcpExtra')
    const client = new Client({ name: `secrets-mcp ${clientName}`, version: '1.0.0' })
    await client.connect(transport)
    this.mcp = { client, transport }
  }

  async closeMcp (): Promise<void> {
    if (this.mcp === null) return
    await this.mcp.transport.terminateSession().catch(() => {})
    await this.mcp.client.close()
    this.mcp = null
  }

  async mcpList (): Promise<void> {
    if (this.mcp === null) return
    const result = await this.mcp.client.listTools()
    this.v.check('MCP tools/list', JSON.stringify(result))
  }

  async probe (route: number): Promise<void> {
    const secret = this.world.book.make('query')
    const [method, template, headers] = PROBES[route]!
    const fill = (text: string): string => text.replaceAll('{s}', secret).replaceAll('{role}', this.world.serve.roles[0])
    const extra = Object.fromEntries(Object.entries(headers).map(([name, value]) => [name, fill(value)]))
    // The last probe reads the list, which shows the callback URLs as registered (R18).
    await this.api(method, fill(template), method === 'POST' ? { jsonrpc: '2.0', id: 1, method: 'tools/list' } : undefined,
      new Set([secret]), { ...extra, ...(method === 'POST' ? { accept: 'application/json, text/event-stream' } : {}) },
      route === PROBES.length - 1 ? ['urlQuery'] : [])
  }

  async mcpNoise (kind: McpNoise): Promise<void> {
    if (this.mcp === null) return
    const secret = this.world.book.make('mcpExtra')
    const n = this.next()
    const { client, transport } = this.mcp
    switch (kind) {
      case 'progress':
        await client.notification({ method: 'notifications/progress', params: { progressToken: 900_000 + n, progress: 1, message: decorate(secret) } })
        return
      case 'strayResponse':
        await transport.send({ jsonrpc: '2.0', id: 800_000 + n, result: { note: decorate(secret) } })
        return
      case 'cancel':
        await client.notification({ method: 'notifications/cancelled', params: { requestId: 700_000 + n, reason: decorate(secret) } })
        return
      case 'cursor': {
        let text: string
        try {
          text = JSON.stringify(await client.listTools({ cursor: secret }))
        } catch (err) {
          text = (err as Error).message
        }
        this.v.check('MCP tools/list with a bad cursor', text, new Set([secret]))
        return
      }
      case 'protocolHeader': {
        // A request of the session with an MCP-Protocol-Version header the server does not know.
        const res = await this.request('POST', `/mcp/${this.world.serve.roles[0]}`, { jsonrpc: '2.0', id: 600_000 + n, method: 'tools/list' },
          this.headers({ 'mcp-session-id': transport.sessionId ?? '', 'mcp-protocol-version': secret, accept: 'application/json, text/event-stream' }))
        this.v.check('MCP request with a bad protocol version', res.text, new Set([secret]))
      }
    }
  }

  async exec (op: Op): Promise<void> {
    switch (op.op) {
      case 'call': return await this.call(op)
      case 'parallel': await Promise.all(op.calls.map((call) => this.call(call))); return
      case 'register': return await this.register(op.tool, op.keyMode, op.userinfo)
      case 'unregister': return await this.unregister(op.tool, op.keyMode, op.expected)
      case 'clear': return await this.clear(op.plugin, op.keyMode)
      case 'refused': await this.refused(op.kind, op.route, op.roleExists); return
      case 'read': return await this.read(op.route)
      case 'mcpList': return await this.mcpList()
      case 'mcpNoise': return await this.mcpNoise(op.kind)
      case 'probe': return await this.probe(op.route)
    }
  }

  /**
   * Waits until the logs and both event streams have caught up (a marker registration), then
   * checks everything new in them, the callback requests, /metrics and the console.
   */
  async checkChannels (): Promise<void> {
    const world = this.world
    const book = world.book
    // A marker tool (its URL's query a secret) and one call whose arguments come back (echo), with a
    // call id: the checks below must find those where they are allowed (their teeth), and the
    // marker's log lines and events say the logs and both streams have caught up.
    const marker = `mark_${this.tag}`
    const markerKey = `${book.make('key')}-${'m'.repeat(16)}`
    const markerSource = `plugin:secrets-mark-${this.tag}`
    const query = book.make('urlQuery')
    await this.api('POST', '/api/tools/register', {
      name: marker, callback_url: `${world.callbacks.url}/marker?sig=${query}`, source: markerSource
    }, new Set([query]), { 'x-toolport-plugin-key': markerKey })
    const k = `k${this.tag}mark`
    const arg = book.make('arg')
    const callId = book.make('callId')
    world.callbackOwn.set(k, new Set([arg, callId, query]))
    world.callbacks.replies.set(k, { mode: 'echo', reply: '' })
    await this.api('POST', '/api/tools/call', {
      role: world.serve.roles[0], name: marker, call_id: callId, arguments: { s: decorate(arg), k }
    }, new Set([arg, callId]))
    await this.read('tools')
    await waitFor('the marker in the logs and both event streams', () => world.serve.output.text.includes(callId) &&
      world.serve.output.text.includes(marker) && world.events.every((e) => e.text.includes(marker)))
    await this.api('POST', '/api/tools/clear', { source: markerSource }, new Set(), { 'x-toolport-plugin-key': markerKey })
    const output = world.serve.output.text
    // Call ids are the call metadata the logs may carry (SECURITY.md); nothing else.
    this.v.check('toolport serve logs', output.slice(world.checked.output), new Set(), ['callId'])
    world.checked.output = output.length
    world.events.forEach((sink, i) => {
      this.v.check(i === 0 ? 'GET /api/events' : 'GET /api/events?role=…', sink.text.slice(world.checked.events[i]))
      world.checked.events[i] = sink.text.length
    })
    const bridge = world.bridge.stderr.text
    this.v.check('toolport mcp (bridge) stderr', bridge.slice(world.checked.bridge))
    world.checked.bridge = bridge.length
    for (const req of world.callbacks.received.slice(world.checked.received)) {
      let k = ''
      try {
        k = String((JSON.parse(req.body) as { arguments?: { k?: unknown } }).arguments?.k ?? '')
      } catch {}
      const own = world.callbackOwn.get(k) ?? new Set<string>()
      this.v.check(`callback request ${req.path.slice(0, 40)}`, `${req.path}\n${req.headers}\n${req.body}`, own)
    }
    world.checked.received = world.callbacks.received.length
    await this.read('metrics')
    await this.read('state')
    await this.read('stats')
  }

  /** Clears every source of this run with its own key. */
  async cleanUp (): Promise<void> {
    for (let plugin = 0; plugin < PLUGINS; plugin++) await this.clear(plugin, 'own')
  }
}

test('SECURITY.md "Private data in logs and in the event stream", R14, token and ownership mode: property: every planted secret reaches only the places the docs allow, over a real toolport serve, MCP clients and the stdio bridge', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const world = await startWorld(t)
  const refusals = new Map<string, string>()
  await fc.assert(fc.asyncProperty(fc.limitShrink(scenarioArb, MAX_SHRINKS), async (scenario) => {
    const since = world.book.order.size
    const v = new Violations(world.book, world.seen, (order) => order >= world.worldSecrets && order < since)
    const run = new Run(world, scenario, v)
    await within((async () => {
      await run.openMcp()
      for (let i = 0; i < run.tools.length; i++) await run.register(i, 'own', false)
      for (const op of scenario.ops) {
        await run.exec(op)
        if (op.op === 'refused') {
          // The same refusal for every route, whether the role exists or not.
          const res = await run.refused(op.kind, op.route, !op.roleExists)
          const body = res.text.slice(res.text.indexOf('\n') + 1)
          const canonical = refusals.get(op.kind)
          if (canonical === undefined) refusals.set(op.kind, body)
          else assert.equal(body, canonical, `a ${op.kind} refusal differs by route`)
        }
      }
      await run.closeMcp()
      await run.checkChannels()
      await run.cleanUp()
    })(), 'one run', RUN_GUARD_MS)
    v.assertNone()
  }), { numRuns: 15 * RUNS, includeErrorInReport: true })

  // The checks have teeth: each channel's detector found the secrets that were allowed there.
  for (const key of ['answer:arg', 'answer:urlQuery', 'callback:arg', 'callback:callId', 'callback:urlQuery',
    'toolport:callId']) {
    assert.ok((world.seen.get(key) ?? 0) > 0, `no allowed secret seen as ${key}: ${JSON.stringify([...world.seen])}`)
  }

  // The shutdown: nothing private in what the server says while it stops.
  await world.bridge.client.close()
  assert.equal(await world.serve.stop(), 0)
  const v = new Violations(world.book)
  v.check('toolport serve logs (shutdown)', world.serve.output.text.slice(world.checked.output), new Set(), ['callId'])
  v.check('toolport mcp (bridge) stderr (end)', world.bridge.stderr.text)
  v.assertNone()
  assert.ok(world.serve.output.text.includes('tool call finished'), 'calls were logged (metadata, at debug)')
})

// ---- Regression tests: what the property found, one fixed example each ----------------------------

/** A Toolport with its logs captured (JSON lines at `level`), listening on 127.0.0.1. */
async function capturedToolport (t: TestContext, options: ConstructorParameters<typeof Toolport>[0],
  level: 'debug' | 'trace' = 'trace'): Promise<{ tp: Toolport, url: string, log: { text: string } }> {
  const log = { text: '' }
  const sink = new PassThrough()
  sink.setEncoding('utf8')
  sink.on('data', (d: string) => { log.text += d })
  const tp = new Toolport({ dispatch: { mode: 'inline' }, ...options }, createLogger(level, { destination: sink }))
  t.after(() => tp.close())
  await tp[kDispatchReady]
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  return { tp, url, log }
}

test('SECURITY.md "Private data in logs": what an MCP client sends (a progress notification for an unknown token, a response to no request, an MCP-Protocol-Version header) never reaches the logs, at debug', { timeout: 60_000 }, async (t) => {
  const book = new SecretBook()
  const { url, log } = await capturedToolport(t, { roles: ['A'] }, 'debug')
  const transport = new StreamableHTTPClientTransport(new URL(`${url}/mcp/A`))
  const client = new Client({ name: 'secrets-noise', version: '1.0.0' })
  await client.connect(transport)
  t.after(() => client.close())
  const progress = book.make('mcpExtra')
  const response = book.make('mcpExtra')
  // A client reporting progress with private text (e.g. a file name it is reading), and a client
  // answering a request the server never sent (or one it gave up on) with private data.
  const version = book.make('mcpExtra')
  await client.notification({ method: 'notifications/progress', params: { progressToken: 4242, progress: 1, message: progress } })
  await transport.send({ jsonrpc: '2.0', id: 777, result: { content: response } })
  // A request header the client sent, which its own 400 answer quotes back.
  const res = await httpRequest(`${url}/mcp/A`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-session-id': transport.sessionId ?? '',
      'mcp-protocol-version': version
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: 5, method: 'tools/list' })
  })
  assert.equal(res.statusCode, 400)
  await res.body.text()
  await client.listTools()
  await sleep(50)
  assert.match(log.text, /MCP transport error/, 'the two messages were noticed (debug)')
  const v = new Violations(book)
  v.check('logs at debug', log.text)
  v.assertNone()
})

test('SECURITY.md "Private data in logs", README "Live events" (tool names that match no tool): a call arriving while Toolport shuts down never puts the model\'s free-text tool name into the logs, /metrics or the console', { timeout: 60_000 }, async (t) => {
  const book = new SecretBook()
  const { tp, url, log } = await capturedToolport(t, { roles: ['A'] }, 'debug')
  // A callback that answers only when released: a call in flight keeps the server up while the
  // runtime closes (Toolport.close: the runtime first, then the server, README "Public exports").
  let release = (): void => {}
  const held = new Promise<void>((resolve) => { release = resolve })
  const callback = createServer((_req, res) => {
    held.then(() => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('{"output": "done"}')
    }, () => {})
  })
  const callbackUrl = await listenOnLoopback(t, callback, release)
  await tp.register({ name: 'held', callback_url: `${callbackUrl}/held` })
  const post = async (path: string, body?: unknown): Promise<string> => {
    const res = await httpRequest(`${url}${path}`, {
      method: body === undefined ? 'GET' : 'POST',
      ...(body === undefined ? {} : { headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
    })
    return await res.body.text()
  }
  const inFlight = post('/api/tools/call', { role: 'A', name: 'held', arguments: {} })
  await waitFor('the held call reaches its callback', () => tp.health().dispatch.in_flight > 0)
  const closing = tp.close()
  assert.equal(tp.closed, true, 'the runtime is closing; the server still answers (the held call)')
  const name = `maybe_${book.make('name')}`
  // Over HTTP the closing runtime refuses it (503 TP_ERR_CLOSED); the library still answers it as
  // a tool error, which goes through the log, the metrics and the console's recent calls.
  const answer = JSON.parse(await post('/api/tools/call', { role: 'A', name, arguments: {} })) as { code?: string }
  assert.equal(answer.code, 'TP_ERR_CLOSED', 'the call route refuses while the runtime closes')
  assert.equal((await tp.callTool('A', { name, arguments: {} })).is_error, true, 'the library answers it as a tool error')
  const metrics = await post('/metrics')
  const state = await post('/api/console/state')
  release()
  await inFlight
  await closing
  const v = new Violations(book)
  v.check('logs at debug', log.text)
  v.check('GET /metrics', metrics)
  v.check('GET /api/console/state', state)
  v.assertNone()
})

test('README "Plugin SDK" → Privacy ("Arguments and outputs are never logged"): a handler\'s error, its arguments and output, the token and the plugin key never reach the SDK\'s logger, at any level', { timeout: 60_000 }, async (t) => {
  const book = new SecretBook()
  const token = `${book.make('token')}-${'t'.repeat(12)}`
  const pluginKey = `${book.make('key')}-${'k'.repeat(16)}`
  const { tp, url } = await capturedToolport(t, { roles: ['A'], security: { token, enforceOwnership: true } })
  const lines: string[] = []
  const logger = Object.fromEntries(['debug', 'info', 'warn', 'error'].map((level) =>
    [level, (message: string) => { lines.push(`${level}: ${message}`) }]))
  const plugin = createPlugin({
    toolportUrl: url,
    source: 'plugin:secrets-sdk',
    token,
    pluginKey,
    logger,
    pollIntervalMs: 600_000,
    tools: {
      forecast: {
        description: 'A forecast that fails for places it does not know.',
        parameters: { type: 'object', properties: { city: { type: 'string' }, fail: { type: 'boolean' } }, required: ['city'] },
        handler: (args: Record<string, unknown>) => {
          // The README's own pattern: the error names what the model asked for.
          if (args.fail === true) throw new Error(`no forecast for ${String(args.city)}`)
          return { city: args.city, temperature: 28 }
        }
      }
    }
  })
  t.after(() => plugin.stop({ graceMs: 0 }))
  await within(plugin.start(), 'the plugin starts', 20_000)
  const own = new Set<string>()
  for (const fail of [false, true]) {
    const city = book.make('arg')
    own.add(city)
    const result = await tp.callTool('A', { name: 'forecast', arguments: { city: decorate(city), fail } })
    assert.ok(result.text.includes(city), `the caller gets its result: ${result.text}`)
    assert.equal(result.is_error, fail)
  }
  await plugin.stop({ graceMs: 0 })
  const v = new Violations(book)
  v.check('the plugin SDK\'s logger', lines.join('\n'))
  v.assertNone()
})

/** Runs the `toolport` command in-process (src/main/cli.ts `main`) with its own streams. */
function runCli (argv: string[]): { exited: Promise<number>, stderr: { text: string }, stop: AbortController } {
  const stderr = { text: '' }
  const err = new PassThrough()
  err.setEncoding('utf8')
  err.on('data', (d: string) => { stderr.text += d })
  const out = new PassThrough()
  out.resume()
  const stop = new AbortController()
  const exited = main(argv, { stdin: new PassThrough(), stdout: out, stderr: err, env: {}, stop: stop.signal })
  return { exited, stderr, stop }
}

test('SECURITY.md "Token mode" ("never logged"): a config file that is not valid JSON never has its token quoted on stderr', { timeout: 60_000 }, async (t) => {
  const book = new SecretBook()
  const dir = mkdtempSync(join(tmpdir(), 'secrets-'))
  t.after(() => rmSync(dir, { recursive: true, force: true }))
  const token = `${book.make('token')}-${'t'.repeat(12)}`
  // JSON's most common mistake: single quotes (or none) around a string.
  for (const [i, text] of [`{"security": {"token": '${token}'}}`, `{"security": {"token": ${token}}}`].entries()) {
    const file = join(dir, `config-${i}.json`)
    writeFileSync(file, text, { mode: 0o600 })
    const cli = runCli(['serve', '--port', '0', '--config', file])
    assert.equal(await within(cli.exited, 'toolport serve refuses the file', 20_000), 2)
    assert.match(cli.stderr.text, /is not a JSON object of options/)
    assert.ok(!cli.stderr.text.includes(token.slice(0, 6)), `stderr quotes the token: ${cli.stderr.text}`)
  }
})

test('README "toolport mcp" (a bridge URL with userinfo): the password in --url is never printed on stderr', { timeout: 60_000 }, async (t) => {
  const book = new SecretBook()
  const password = book.make('userinfo')
  const tp = new Toolport({ roles: ['A'], dispatch: { mode: 'inline' } })
  t.after(() => tp.close())
  await tp[kDispatchReady]
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  const cli = runCli(['mcp', '--role', 'A', '--url', url.replace('http://', `http://bridge:${password}@`)])
  t.after(async () => {
    cli.stop.abort('SIGTERM')
    await cli.exited
  })
  // Either refused as a setting at once, or a first attempt that says why it cannot connect.
  const done = await within(Promise.race([cli.exited.then(() => 'exited'),
    waitFor('a line on stderr', () => cli.stderr.text.includes('\n')).then(() => 'said')]), 'the bridge reacts', 20_000)
  assert.ok(cli.stderr.text !== '' || done === 'exited')
  const v = new Violations(book)
  v.check('toolport mcp stderr', cli.stderr.text)
  v.assertNone()
})

test('the detector the checks rely on finds a secret as written, JSON-escaped (twice), URL-encoded, and in base64 or base64url at every alignment', () => {
  const book = new SecretBook()
  const core = book.make('arg')
  const value = decorate(core)
  const forms = [value, JSON.stringify({ v: value }), JSON.stringify(JSON.stringify({ v: value })),
    encodeURIComponent(value),
    ...[0, 1, 2].map((pad) => `"${Buffer.from('x'.repeat(pad) + value).toString('base64')}"`),
    ...[0, 1, 2].map((pad) => `data:${Buffer.from('yy'.repeat(pad) + value).toString('base64url')}`)]
  for (const text of forms) assert.ok(coresIn(text).has(core), `not found in ${text}`)
  assert.equal(coresIn(JSON.stringify({ v: 'Qz' + 'a'.repeat(30) })).size, 0)
})
