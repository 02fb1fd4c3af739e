// Properties of the stdio MCP bridge, `toolport mcp` (src/main/cli-bridge.ts, src/main/cli.ts;
// README "MCP: one endpoint per role" and its bridge paragraph; docs/protocol.md "MCP endpoint").
//
// How: the REAL `toolport mcp` command is spawned as a child process (the package's bin, as an MCP
// client launches it), against a real listening Toolport (pool dispatch, one worker thread) and a
// real plugin (test/fixtures/callback-server.ts) on 127.0.0.1. Nothing is mocked.
//
// - Differential property: the official SDK Client over StdioClientTransport (through the bridge)
//   and, side by side, an SDK Client over StreamableHTTPClientTransport straight to /mcp/<role>
//   run the same random steps: registrations, unregistrations and clears of the role's tools
//   (so that `notifications/tools/list_changed` flows), tools/list, tools/call (one to three at
//   once) with random arguments (unicode, lone surrogates, big, nested, invalid per the tool's
//   schema), calls that fail or time out, calls cancelled by an AbortSignal, ping, Toolport
//   restarted on its port, and the role removed and added again. Both paths must give the same
//   results, the same JSON-RPC error codes and messages, and both must be told of every change
//   (the bridge passes the upstream `list_changed` on, and announces one itself after it had to
//   start a new session); a request Toolport refused before it ran (an HTTP error carrying a
//   JSON-RPC error, e.g. 413) is answered by the bridge as that JSON-RPC error (cli-bridge.ts:
//   "An upstream JSON-RPC error is answered as Toolport sent it"), never as a call that "may have
//   run". The bridge's client never sees a line on stdout that is not JSON-RPC, nor an answer to
//   a request it cancelled.
// - stdin fuzz property: raw bytes on the bridge's stdin (random chunking; valid requests, bad
//   params, unknown methods, notifications, responses to nothing, non-UTF-8 bytes, lines that are
//   not JSON, JSON that is not a JSON-RPC message, batches). Every request is answered once, as
//   the same bytes POSTed to a direct session of /mcp/<role> are; every malformed line gets a
//   JSON-RPC error with `id: null` (JSON-RPC 2.0 §5.1: -32700 / -32600), as /mcp/<role> answers
//   one; notifications and stray responses get nothing; stdout carries JSON-RPC lines only; the
//   bridge keeps serving, and exits 0 on stdin EOF.
// - Token mode: a token file read as documented (`--token-file` or TOOLPORT_TOKEN_FILE, 0600,
//   >= 32 bytes) serves like a direct client with the header; a refused token is not passed off
//   as an unreachable Toolport.
// - Stopping: stdin EOF and SIGTERM (SIGINT too, with Toolport up) end the bridge with exit 0 and
//   nothing but JSON-RPC on stdout, with a call in flight, whether Toolport is up, down, or up but
//   not answering (a TCP proxy that stops passing bytes), also while the bridge is still starting.
//
// The tests after the properties are the cases they found, shrunk to one example each, and one
// found beside them: a reply Toolport accepts (under dispatch.maxResponseBytes) must not become a
// stdout line the MCP SDK's own stdio client refuses (over 10 MiB).
// TP_PROPERTY_RUNS=N multiplies the runs of the properties.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process'
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { createServer as createHttpServer } from 'node:http'
import { connect, createServer, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setImmediate as tick, setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import fc from 'fast-check'
import { request as httpRequest } from 'undici'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { JSONRPCMessageSchema, McpError, ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import { createToolport, type Toolport } from '../../src/main/index.js'
import { closedPort, startCallbackServer, type CallbackServer } from '../fixtures/callback-server.js'
import { checkProperty as check, listenOnLoopback, toolportCliArgs, waitFor, within } from '../helpers.js'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))
const ROLE = 'Bridged'
const SOURCE = 'plugin:bridge-properties'
const TOKEN = 'bridge-properties-token-'.padEnd(48, 'z')
/** Hang guard for one answer or one exit: what never comes fails the test instead of hanging it. */
const GUARD_MS = 8_000
const FAILING_TIMEOUT_MS = 300_000
/** Shrinking replays real runs (processes, sockets): a bounded number keeps a failure's report quick. */
const MAX_SHRINKS = 8
const PROTOCOL = '2025-06-18'

type Json = any

/** Runs per property: TP_PROPERTY_RUNS=N hunts N times longer. */
function runs (n: number): number {
  return Math.max(1, Math.round(n * Number(process.env.TP_PROPERTY_RUNS ?? 1)))
}

// ---------------------------------------------------------------------------------------------
// The pieces: a Toolport, the bridge (through the SDK or raw), a direct client, a freezable proxy.

interface StartedTp { tp: Toolport, url: string, port: number }

async function startTp (port: number, token?: string): Promise<StartedTp> {
  const tp = await createToolport({
    roles: [ROLE],
    logger: false,
    dispatch: { mode: 'pool', threads: 1 },
    ...(token === undefined ? {} : { security: { token } })
  })
  const listening = await tp.listen({ host: '127.0.0.1', port })
  return { tp, url: listening.url, port: listening.port }
}

/** The lines of a process's stderr that are a stack trace or a crash, not a diagnostic line. */
function crashLines (stderr: string): string[] {
  return stderr.split('\n').filter((line) => /^\s+at |Unhandled|uncaught|^node:/i.test(line))
}

interface SdkBridge {
  client: Client
  notices: () => number
  /** Everything the client's protocol layer complained of (a line that is not JSON-RPC, an answer to nothing). */
  errors: Error[]
  stderr: () => string
  close: () => Promise<void>
}

/** `toolport mcp --role ROLE --url url` spawned through the SDK's StdioClientTransport, initialized. */
async function sdkBridge (url: string): Promise<SdkBridge> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [...toolportCliArgs(), 'mcp', '--role', ROLE, '--url', url],
    cwd: ROOT,
    stderr: 'pipe'
  })
  let stderr = ''
  transport.stderr?.on('data', (chunk: Buffer) => { stderr += chunk.toString('utf8') })
  const client = new Client({ name: 'bridge-properties', version: '1.0.0' })
  let notices = 0
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => { notices++ })
  const errors: Error[] = []
  client.onerror = (err) => { errors.push(err) }
  await within(client.connect(transport), 'initialize through the bridge', GUARD_MS)
  return { client, notices: () => notices, errors, stderr: () => stderr, close: async () => { await client.close() } }
}

interface Direct {
  client: Client
  notices: () => number
  sessionId: string
  close: () => Promise<void>
}

/** An SDK client over Streamable HTTP straight to /mcp/ROLE. */
async function directClient (url: string, headers: Record<string, string> = {}): Promise<Direct> {
  const transport = new StreamableHTTPClientTransport(new URL(`${url}/mcp/${ROLE}`), { requestInit: { headers } })
  const client = new Client({ name: 'bridge-properties-direct', version: '1.0.0' })
  let notices = 0
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => { notices++ })
  client.onerror = () => {}
  await within(client.connect(transport), 'initialize straight to /mcp', GUARD_MS)
  return {
    client,
    notices: () => notices,
    sessionId: transport.sessionId ?? '',
    close: async () => { await transport.terminateSession().catch(() => {}); await client.close() }
  }
}

interface RawBridge {
  child: ChildProcessWithoutNullStreams
  /** Every stdout line that is a JSON-RPC message, parsed. */
  messages: Json[]
  /** Every stdout line that is not (the protocol channel must carry nothing else). */
  junk: string[]
  stderr: () => string
  exited: Promise<{ code: number | null, signal: NodeJS.Signals | null }>
  exit: { code: number | null, signal: NodeJS.Signals | null } | null
  send: (data: string | Buffer) => void
  /** The first answer with this id (hang guard). */
  answer: (id: string | number | null, what: string, timeoutMs?: number) => Promise<Json>
}

function isJsonRpcMessage (value: Json): boolean {
  return JSONRPCMessageSchema.safeParse(value).success ||
    // JSON-RPC 2.0 §5: an error whose id could not be read is answered with id null.
    (value !== null && typeof value === 'object' && value.jsonrpc === '2.0' && value.id === null &&
      typeof value.error?.code === 'number' && typeof value.error?.message === 'string')
}

/** `toolport mcp …args` as a raw child process: the test writes its stdin bytes itself. Killed in t.after. */
function rawBridge (t: TestContext, args: string[], env: NodeJS.ProcessEnv = {}): RawBridge {
  const child = spawn(process.execPath, [...toolportCliArgs(), 'mcp', ...args], {
    cwd: ROOT,
    env: { PATH: process.env.PATH, ...env },
    stdio: ['pipe', 'pipe', 'pipe']
  })
  child.stdin.on('error', () => {})
  const messages: Json[] = []
  const junk: string[] = []
  let pending = Buffer.alloc(0)
  child.stdout.on('data', (chunk: Buffer) => {
    pending = Buffer.concat([pending, chunk])
    for (let end = pending.indexOf(10); end !== -1; end = pending.indexOf(10)) {
      const line = pending.subarray(0, end).toString('utf8')
      pending = pending.subarray(end + 1)
      let value: Json
      try {
        value = JSON.parse(line)
      } catch {
        junk.push(line)
        continue
      }
      if (isJsonRpcMessage(value)) messages.push(value)
      else junk.push(line)
    }
  })
  let stderr = ''
  child.stderr.on('data', (chunk: Buffer) => { stderr += chunk.toString('utf8') })
  const bridge: RawBridge = {
    child,
    messages,
    junk,
    stderr: () => stderr,
    exit: null,
    exited: new Promise((resolve) => {
      child.once('exit', (code, signal) => {
        bridge.exit = { code, signal }
        resolve(bridge.exit)
      })
    }),
    send: (data) => { if (child.stdin.writable) child.stdin.write(data) },
    answer: async (id, what, timeoutMs = GUARD_MS) => {
      let found: Json
      await waitFor(`${what} (the answer to id ${JSON.stringify(id)}; bridge stderr: ${stderr.slice(-500)})`, () => {
        found = messages.find((m) => m.id === id && ('result' in m || 'error' in m))
        return found !== undefined || bridge.exit !== null
      }, timeoutMs)
      if (found === undefined) {
        throw new Error(`${what}: the bridge exited (${JSON.stringify(bridge.exit)}) without answering id ${JSON.stringify(id)}; stderr: ${stderr.slice(-500)}`)
      }
      return found
    }
  }
  t.after(async () => {
    if (bridge.exit !== null) return
    child.kill('SIGKILL')
    await bridge.exited
  })
  return bridge
}

function rpcLine (message: Json): string {
  return `${JSON.stringify(message)}\n`
}

const INITIALIZE = {
  jsonrpc: '2.0',
  id: 'init',
  method: 'initialize',
  params: { protocolVersion: PROTOCOL, capabilities: {}, clientInfo: { name: 'bridge-properties-raw', version: '1.0.0' } }
}

/** initialize + notifications/initialized on a raw bridge. */
async function initializeRaw (bridge: RawBridge): Promise<Json> {
  bridge.send(rpcLine(INITIALIZE))
  const answer = await bridge.answer('init', 'initialize through the raw bridge')
  bridge.send(rpcLine({ jsonrpc: '2.0', method: 'notifications/initialized' }))
  return answer
}

interface RawSession {
  /** POSTs these bytes on the session: the JSON-RPC messages answered (JSON or SSE), and the status. */
  post: (body: string | Buffer) => Promise<{ status: number, messages: Json[] }>
  close: () => Promise<void>
}

/** A raw HTTP session of /mcp/ROLE (initialize + initialized), for answers to compare byte for byte. */
async function rawSession (url: string): Promise<RawSession> {
  const endpoint = `${url}/mcp/${ROLE}`
  const base = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
  type Reply = { status: number, headers: Json, messages: Json[] }
  const send = async (body: string | Buffer, headers: Record<string, string>): Promise<Reply> => {
    const res = await httpRequest(endpoint, { method: 'POST', headers: { ...base, ...headers }, body })
    const text = await res.body.text()
    const messages: Json[] = []
    if (String(res.headers['content-type']).startsWith('text/event-stream')) {
      for (const line of text.split('\n')) {
        if (line.startsWith('data: ') && line.length > 6) messages.push(JSON.parse(line.slice(6)))
      }
    } else if (text !== '') {
      const value = JSON.parse(text)
      messages.push(...(Array.isArray(value) ? value : [value]))
    }
    return { status: res.statusCode, headers: res.headers, messages }
  }
  const init = await send(JSON.stringify(INITIALIZE), {})
  const sessionId = String(init.headers['mcp-session-id'])
  const headers = { 'mcp-session-id': sessionId, 'mcp-protocol-version': PROTOCOL }
  await send(JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }), headers)
  return {
    post: async (body) => await send(body, headers),
    close: async () => {
      const res = await httpRequest(endpoint, { method: 'DELETE', headers })
      await res.body.dump()
    }
  }
}

/**
 * A TCP proxy in front of a Toolport that can freeze: from then on it passes no byte either way
 * and holds new connections without answering (a Toolport that is up but does not answer: stopped
 * in a debugger, swapping, its event loop stuck).
 */
async function freezableProxy (t: TestContext, port: number,
  frozen = false): Promise<{ url: string, freeze: () => void, connections: () => number }> {
  const sockets = new Set<Socket>()
  const state = { frozen, connections: 0 }
  const server = createServer((client) => {
    state.connections++
    sockets.add(client)
    client.on('error', () => {})
    client.once('close', () => sockets.delete(client))
    if (state.frozen) return
    const upstream = connect(port, '127.0.0.1')
    sockets.add(upstream)
    upstream.on('error', () => {})
    upstream.once('close', () => { sockets.delete(upstream); client.destroy() })
    client.once('close', () => upstream.destroy())
    client.on('data', (data) => { if (!state.frozen) upstream.write(data) })
    upstream.on('data', (data) => { if (!state.frozen) client.write(data) })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(() => new Promise<void>((resolve) => {
    for (const socket of sockets) socket.destroy()
    server.close(() => resolve())
  }))
  const address = server.address()
  return {
    url: `http://127.0.0.1:${typeof address === 'object' && address !== null ? address.port : 0}`,
    freeze: () => { state.frozen = true },
    connections: () => state.connections
  }
}

// ---------------------------------------------------------------------------------------------
// Answers, normalised for comparison.

type Answer =
  | { kind: 'result', value: Json }
  | { kind: 'rpc', code: number, message: string, data?: Json }
  | { kind: 'http', status: number, rpc?: { code: number, message: string, data?: Json } }
  | { kind: 'thrown', name: string, message: string }

const CALL_ID = /call_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g

/** A value with the per-call ids Toolport generates (`call_<uuid>`) made equal. */
function normalise (value: Json): Json {
  return JSON.parse(JSON.stringify(value).replace(CALL_ID, 'call_*'))
}

async function answerOf (request: Promise<unknown>): Promise<Answer> {
  try {
    return { kind: 'result', value: normalise(await request) }
  } catch (err) {
    if (err instanceof McpError) {
      return { kind: 'rpc', code: err.code, message: err.message, ...(err.data === undefined ? {} : { data: err.data }) }
    }
    if (err instanceof StreamableHTTPError) {
      // The SDK puts the refused POST's body in its message: Toolport's JSON-RPC error, if any.
      const text = err.message
      let rpc: Json
      try {
        rpc = JSON.parse(text.slice(text.indexOf('{'))).error
      } catch {}
      return { kind: 'http', status: err.code ?? 0, ...(typeof rpc?.code === 'number' ? { rpc } : {}) }
    }
    return { kind: 'thrown', name: (err as Error).name, message: (err as Error).message }
  }
}

/** Asserts the bridge answered what the direct client got (see the file comment for the 413 rule). */
function assertSameAnswer (what: string, direct: Answer, bridged: Answer): void {
  if (direct.kind === 'http' && direct.rpc !== undefined) {
    // Toolport refused the POST before anything ran, with a JSON-RPC error in the body.
    assert.ok(bridged.kind === 'rpc',
      `${what}: Toolport refused the request (HTTP ${direct.status}: ${JSON.stringify(direct.rpc)}), which the direct client sees; the bridge must answer that JSON-RPC error, and answered ${JSON.stringify(bridged).slice(0, 400)}`)
    assert.equal(bridged.code, direct.rpc.code, `${what}: the JSON-RPC error code Toolport sent`)
    assert.ok(bridged.message.includes(direct.rpc.message), `${what}: the bridge's message ${JSON.stringify(bridged.message)} carries Toolport's ${JSON.stringify(direct.rpc.message)}`)
    return
  }
  assert.deepEqual(bridged, direct, `${what}: the bridge answered otherwise than the direct client`)
}

// ---------------------------------------------------------------------------------------------
// The differential property.

const NAMES = ['bridge_echo', 'bridge-ünï', 'bridge 🙂 tool', 'bridge.x'] as const
const MISSING = 'bridge_missing'
const SLOW = 'bridge_slow'
/** The plugin route the cancelled calls wait on (only they use it). */
const SLOW_PATH = '/sleep/59000'

/** Plugin behaviours: a route and its `timeout_seconds`. */
const ROUTES: Array<{ path: string, timeout?: number }> = [
  { path: '/echo' },
  { path: '/tool-error' },
  { path: '/status/500' },
  { path: '/text' },
  { path: '/raw-output' },
  { path: '/sleep/60000', timeout: 0.2 },
  { path: '/sleep/20' }
]

const SCHEMAS: Json[] = [
  undefined,
  { type: 'object', properties: { s: { type: 'string', maxLength: 40 } }, required: ['s'] },
  { type: 'object', properties: { n: { type: 'integer', minimum: 0, maximum: 9 } }, additionalProperties: false }
]

const surrogate = fc.integer({ min: 0xd800, max: 0xdfff }).map((c) => String.fromCharCode(c))
const text = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 12 }),
  fc.string({ unit: 'grapheme', maxLength: 8 }),
  fc.string({ unit: surrogate, maxLength: 3 })
)

/** Call arguments, as a compact description (a 2 MB string is built at run time, not printed). */
type ArgsSpec =
  | { kind: 'plain', value: Json }
  | { kind: 'big', chars: number }
  | { kind: 'deep', depth: number }

const argsArb: fc.Arbitrary<ArgsSpec> = fc.oneof(
  { weight: 4, arbitrary: fc.record({ s: text }, { requiredKeys: [] }).map((value): ArgsSpec => ({ kind: 'plain', value })) },
  {
    weight: 3,
    arbitrary: fc.record({ n: fc.oneof(fc.integer({ min: -2, max: 12 }), fc.double(), text) }, { requiredKeys: [] })
      .map((value): ArgsSpec => ({ kind: 'plain', value }))
  },
  {
    weight: 2,
    arbitrary: fc.dictionary(text, fc.jsonValue({ maxDepth: 2 }), { maxKeys: 3 }).map((value): ArgsSpec => ({ kind: 'plain', value }))
  },
  // ü is 2 bytes of UTF-8: the last size is over limits.maxBodyBytes (1 MiB).
  { weight: 1, arbitrary: fc.constantFrom(3_000, 200_000, 600_000).map((chars): ArgsSpec => ({ kind: 'big', chars })) },
  // Over limits.maxJsonDepth (64) for the deeper ones, counting the JSON-RPC envelope.
  { weight: 1, arbitrary: fc.integer({ min: 20, max: 80 }).map((depth): ArgsSpec => ({ kind: 'deep', depth })) }
)

function materialise (spec: ArgsSpec): Record<string, unknown> {
  switch (spec.kind) {
    case 'plain': return spec.value as Record<string, unknown>
    case 'big': return { s: 'ü'.repeat(spec.chars) }
    case 'deep': {
      let value: Json = 'bottom'
      for (let i = 0; i < spec.depth; i++) value = { d: value }
      return { s: 'deep', d: value }
    }
  }
}

type Step =
  | { kind: 'register', name: number, route: number, schema: number, description: string }
  | { kind: 'unregister', name: number }
  | { kind: 'clear' }
  | { kind: 'list' }
  | { kind: 'call', calls: Array<{ name: number, args: ArgsSpec }> }
  | { kind: 'cancel' }
  | { kind: 'ping' }
  | { kind: 'restart' }
  | { kind: 'rebuild' }

const stepArb: fc.Arbitrary<Step> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      name: fc.nat(NAMES.length - 1),
      route: fc.nat(ROUTES.length - 1),
      schema: fc.nat(SCHEMAS.length - 1),
      description: fc.string({ unit: 'binary', maxLength: 10 })
    }).map((s): Step => ({ kind: 'register', ...s }))
  },
  { weight: 2, arbitrary: fc.nat(NAMES.length).map((name): Step => ({ kind: 'unregister', name })) },
  { weight: 1, arbitrary: fc.constant<Step>({ kind: 'clear' }) },
  { weight: 3, arbitrary: fc.constant<Step>({ kind: 'list' }) },
  {
    weight: 6,
    arbitrary: fc.array(fc.record({ name: fc.nat(NAMES.length), args: argsArb }), { minLength: 1, maxLength: 3 })
      .map((calls): Step => ({ kind: 'call', calls }))
  },
  { weight: 1, arbitrary: fc.constant<Step>({ kind: 'cancel' }) },
  { weight: 1, arbitrary: fc.constant<Step>({ kind: 'ping' }) },
  { weight: 1, arbitrary: fc.constant<Step>({ kind: 'restart' }) },
  { weight: 1, arbitrary: fc.constant<Step>({ kind: 'rebuild' }) }
)

interface World {
  current: StartedTp
  port: number
  plugin: CallbackServer
  bridge: SdkBridge
  direct: Direct
  /** `call-finished` events with outcome `cancelled` of SLOW, on the current Toolport. */
  cancelled: number
  /** The role's tool names, as the model has them (registration order is Toolport's). */
  tools: Set<string>
  /** Whether each path listed on its current upstream session (Toolport notifies only those). */
  listed: { bridge: boolean, direct: boolean }
  /** Bridge notices when the bridge's session was last lost (restart, rebuild); null when not since. */
  lostAt: number | null
}

function toolName (index: number): string {
  return NAMES[index] ?? MISSING
}

async function api (world: World, path: string, body: Json): Promise<Json> {
  const res = await httpRequest(`${world.current.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body)
  })
  const reply = await res.body.json() as Json
  assert.equal(res.statusCode, 200, `${path}: ${JSON.stringify(reply)}`)
  return reply
}

function watchCancelled (world: World, tp: Toolport): void {
  tp.on('call-finished', (event) => {
    if (event.name === SLOW && event.outcome === 'cancelled' && world.current.tp === tp) world.cancelled++
  })
}

/** A registry change; waits until every path that listed on its session was told (list_changed). */
async function mutate (world: World, path: string, body: Json, changed: (reply: Json) => boolean): Promise<void> {
  const before = { bridge: world.bridge.notices(), direct: world.direct.notices() }
  const reply = await api(world, path, body)
  if (!changed(reply)) return
  const expect = { ...world.listed }
  await waitFor(`list_changed after ${path} ${JSON.stringify(body).slice(0, 200)} (expected: ${JSON.stringify(expect)}; ` +
    `bridge ${before.bridge}→${world.bridge.notices()}, direct ${before.direct}→${world.direct.notices()})`, () =>
    (!expect.bridge || world.bridge.notices() > before.bridge) &&
    (!expect.direct || world.direct.notices() > before.direct),
  GUARD_MS)
}

async function listBoth (world: World, what: string): Promise<void> {
  const [direct, bridged] = await within(Promise.all([
    answerOf(world.direct.client.listTools()),
    answerOf(world.bridge.client.listTools())
  ]), `${what}: tools/list on both paths`, GUARD_MS)
  assertSameAnswer(`${what}: tools/list`, direct, bridged)
  assert.equal(direct.kind, 'result', `${what}: tools/list straight to /mcp answered ${JSON.stringify(direct)}`)
  if (direct.kind === 'result') {
    assert.deepEqual(new Set(direct.value.tools.map((tool: Json) => tool.name)), world.tools, `${what}: the role's tools`)
  }
  world.listed = { bridge: true, direct: true }
}

async function replaceToolport (world: World, how: 'restart' | 'rebuild'): Promise<void> {
  await world.direct.close()
  if (how === 'restart') {
    await world.current.tp.close()
    world.current = await startTp(world.port)
    watchCancelled(world, world.current.tp)
  } else {
    world.current.tp.roles.remove(ROLE)
    world.current.tp.roles.add(ROLE)
  }
  world.direct = await directClient(world.current.url)
  world.tools.clear()
  world.listed = { bridge: false, direct: false }
  world.lostAt = world.bridge.notices()
}

async function runStep (world: World, step: Step, index: number): Promise<void> {
  const what = `step ${index} (${step.kind})`
  switch (step.kind) {
    case 'register': {
      const route = ROUTES[step.route]!
      const schema = SCHEMAS[step.schema]
      const name = toolName(step.name)
      await mutate(world, '/api/tools/register', {
        name,
        role: ROLE,
        source: SOURCE,
        description: step.description,
        callback_url: `${world.plugin.url}${route.path}`,
        ...(route.timeout === undefined ? {} : { timeout_seconds: route.timeout }),
        ...(schema === undefined ? {} : { parameters: schema })
      }, (reply) => reply.ok === true)
      world.tools.add(name)
      return
    }
    case 'unregister': {
      const name = toolName(step.name)
      await mutate(world, '/api/tools/unregister', { name, role: ROLE }, (reply) => reply.removed === true)
      world.tools.delete(name)
      return
    }
    case 'clear':
      await mutate(world, '/api/tools/clear', { source: SOURCE, role: ROLE }, (reply) => reply.cleared > 0)
      world.tools.clear()
      return
    case 'list':
      await listBoth(world, what)
      return
    case 'call': {
      const calls = step.calls.map((call) => ({ name: toolName(call.name), arguments: materialise(call.args) }))
      const [direct, bridged] = await within(Promise.all([
        Promise.all(calls.map(async (params) => await answerOf(world.direct.client.callTool(params)))),
        Promise.all(calls.map(async (params) => await answerOf(world.bridge.client.callTool(params))))
      ]), `${what}: tools/call on both paths`, GUARD_MS)
      calls.forEach((call, i) => {
        assertSameAnswer(`${what}: tools/call ${JSON.stringify(call.name)} ${JSON.stringify(step.calls[i]!.args).slice(0, 200)}`,
          direct[i]!, bridged[i]!)
      })
      return
    }
    case 'cancel': {
      if (!world.tools.has(SLOW)) {
        await mutate(world, '/api/tools/register', {
          name: SLOW, role: ROLE, source: SOURCE, callback_url: `${world.plugin.url}${SLOW_PATH}`
        }, (reply) => reply.ok === true)
        world.tools.add(SLOW)
      }
      const arrivedBefore = world.plugin.requests.filter((r) => r.path === SLOW_PATH).length
      const cancelledBefore = world.cancelled
      const controllers = [new AbortController(), new AbortController()]
      const calls = [world.direct.client, world.bridge.client].map(async (client, i) =>
        await answerOf(client.callTool({ name: SLOW, arguments: {} }, undefined, { signal: controllers[i]!.signal })))
      await waitFor(`${what}: both calls reach the plugin`, () =>
        world.plugin.requests.filter((r) => r.path === SLOW_PATH).length >= arrivedBefore + 2, GUARD_MS)
      for (const controller of controllers) controller.abort(new Error('cancelled by the user'))
      const [direct, bridged] = await within(Promise.all(calls), `${what}: the cancelled calls settle`, GUARD_MS) as [Answer, Answer]
      // The SDK rejects a request its caller aborted by itself (no answer is waited for).
      assert.notEqual(direct.kind, 'result', `${what}: a cancelled call rejects (direct): ${JSON.stringify(direct)}`)
      assert.deepEqual(bridged, direct, `${what}: a cancelled call rejects alike on both paths`)
      // notifications/cancelled reached Toolport on both paths: both calls were cancelled there.
      await waitFor(`${what}: Toolport cancels both calls (cancelled ${world.cancelled - cancelledBefore} of 2)`,
        () => world.cancelled >= cancelledBefore + 2, GUARD_MS)
      return
    }
    case 'ping': {
      const [direct, bridged] = await within(Promise.all([answerOf(world.direct.client.ping()),
        answerOf(world.bridge.client.ping())]), `${what}: ping`, GUARD_MS)
      assertSameAnswer(`${what}: ping`, direct, bridged)
      return
    }
    case 'restart':
    case 'rebuild':
      await replaceToolport(world, step.kind)
  }
}

async function runScenario (world: World, steps: Step[]): Promise<void> {
  // Each run starts from an empty role; both paths list it first.
  await mutate(world, '/api/tools/clear', { source: SOURCE, role: ROLE }, (reply) => reply.cleared > 0)
  world.tools.clear()
  await listBoth(world, 'start')
  world.lostAt = null
  const errorsBefore = world.bridge.errors.length
  try {
    for (const [i, step] of steps.entries()) await runStep(world, step, i)
    await listBoth(world, 'end')
    if (world.lostAt !== null) {
      // Its session lost, the bridge started a new one (the last tools/list), and told its client.
      const lostAt = world.lostAt
      await waitFor('the bridge announces list_changed after it started a new session', () =>
        world.bridge.notices() > lostAt, GUARD_MS)
    }
    assert.deepEqual(world.bridge.errors.slice(errorsBefore).map((e) => e.message), [],
      'the bridge\'s client saw nothing on stdout that is not JSON-RPC, and no answer to a request it cancelled')
    assert.deepEqual(crashLines(world.bridge.stderr()), [], 'the bridge\'s stderr shows no crash')
  } catch (err) {
    throw new Error(`${(err as Error).message}\nbridge stderr (end):\n${world.bridge.stderr().slice(-1500)}`, { cause: err })
  }
}

test('toolport mcp, differential property: through the stdio bridge and straight to /mcp/<role> the same tools/list, tools/call results, JSON-RPC errors and list_changed notices, under random registrations, calls, cancellations, restarts and role rebuilds (README "MCP: one endpoint per role" and the bridge paragraph; docs/protocol.md "MCP endpoint", R3)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const port = await closedPort()
  const plugin = await startCallbackServer()
  t.after(() => plugin.close())
  const first = await startTp(port)
  const world: World = {
    current: first,
    port,
    plugin,
    bridge: await sdkBridge(first.url),
    direct: await directClient(first.url),
    cancelled: 0,
    tools: new Set(),
    listed: { bridge: false, direct: false },
    lostAt: null
  }
  watchCancelled(world, first.tp)
  // initialize: the bridge introduces itself as the endpoint does.
  for (const read of ['getServerVersion', 'getServerCapabilities', 'getInstructions'] as const) {
    assert.deepEqual(world.bridge.client[read](), world.direct.client[read](), `initialize: ${read}`)
  }
  // In order: the clients go before the Toolport they talk to.
  t.after(async () => {
    await world.bridge.close()
    await world.direct.close()
    await world.current.tp.close()
  })
  const steps = fc.array(stepArb, { minLength: 1, maxLength: 9 })
  // One run of every kind of step first, so that the default run count always covers each.
  const plain = (value: Json): ArgsSpec => ({ kind: 'plain', value })
  const everyKind: Step[] = [
    { kind: 'register', name: 0, route: 0, schema: 1, description: 'echo' },
    { kind: 'list' },
    { kind: 'call', calls: [{ name: 0, args: plain({ s: 'ünï 🙂' }) }, { name: 0, args: plain({ s: 5 }) }, { name: 4, args: plain({}) }] },
    { kind: 'cancel' },
    { kind: 'ping' },
    { kind: 'restart' },
    { kind: 'register', name: 1, route: 5, schema: 0, description: '' },
    { kind: 'call', calls: [{ name: 1, args: plain({}) }] },
    { kind: 'rebuild' },
    { kind: 'register', name: 2, route: 1, schema: 2, description: 'x' },
    { kind: 'list' },
    { kind: 'unregister', name: 2 },
    { kind: 'register', name: 3, route: 4, schema: 0, description: '' },
    { kind: 'clear' },
    { kind: 'call', calls: [{ name: 3, args: plain({}) }] },
    { kind: 'register', name: 0, route: 0, schema: 0, description: '' },
    { kind: 'call', calls: [{ name: 0, args: { kind: 'big', chars: 600_000 } }, { name: 0, args: { kind: 'deep', depth: 70 } }] }
  ]
  await check(fc.asyncProperty(fc.limitShrink(steps, MAX_SHRINKS), async (list) => {
    await runScenario(world, list)
  }), { numRuns: runs(7), examples: [[everyKind]] })
})

// ---------------------------------------------------------------------------------------------
// The stdin fuzz property.

type RequestItem =
  | { kind: 'ping' }
  | { kind: 'list', cursor?: Json }
  | { kind: 'call', name: string, args: Json }
  | { kind: 'method', method: string, params?: Json }

type Item =
  | { kind: 'request', request: RequestItem, crlf: boolean }
  | { kind: 'notification', method: string, params?: Json }
  | { kind: 'response', isError: boolean }
  | { kind: 'not-json', text: string }
  | { kind: 'not-a-message', value: Json }
  | { kind: 'batch', requests: RequestItem[] }
  | { kind: 'non-utf8', bytes: number[] }

const requestArb: fc.Arbitrary<RequestItem> = fc.oneof(
  fc.constant<RequestItem>({ kind: 'ping' }),
  fc.oneof(fc.constant(undefined), fc.constantFrom('0', '1', 'zz', 5 as Json)).map((cursor): RequestItem =>
    cursor === undefined ? { kind: 'list' } : { kind: 'list', cursor }),
  fc.record({
    name: fc.constantFrom('bridge_echo', 'bridge_strict', MISSING, 5 as Json),
    args: fc.oneof(fc.dictionary(text, fc.jsonValue({ maxDepth: 2 }), { maxKeys: 3 }), fc.constant(null),
      fc.constant([1]))
  }).map((r): RequestItem => ({ kind: 'call', ...r })),
  fc.record({
    method: fc.constantFrom('resources/list', 'prompts/get', 'bridge/unknown', 'completion/complete', 'logging/setLevel'),
    params: fc.option(fc.dictionary(text, fc.jsonValue({ maxDepth: 1 }), { maxKeys: 2 }), { nil: undefined })
  }).map((r): RequestItem => ({ kind: 'method', ...r }))
)

const notJsonArb = fc.oneof(
  fc.constantFrom('{nope', '{"jsonrpc":"2.0","id":1,"method":"ping"', 'ping', '[1,', '{"a":1}}', '\u0000', 'NaN', "{'id':1}"),
  fc.string({ unit: 'binary', minLength: 1, maxLength: 30 })
).filter((s) => {
  if (s.includes('\n') || s.trim() === '' || s.trim().replace(/\r$/, '') === '') return false
  try {
    JSON.parse(s.replace(/\r$/, ''))
    return false
  } catch {
    return true
  }
})

const notMessageArb = fc.oneof(
  fc.constantFrom<Json>(
    { jsonrpc: '1.0', id: 14, method: 'ping' },
    { jsonrpc: '2.0', id: 1.5, method: 'ping' },
    { jsonrpc: '2.0', id: {}, method: 'ping' },
    { jsonrpc: '2.0', id: true, method: 'ping' },
    { jsonrpc: '2.0', id: 3, method: 7 },
    { id: 4, method: 'ping' },
    { jsonrpc: '2.0', id: 5, method: 'ping', params: [] },
    { hello: 1 },
    'str', 42, null, true
  ),
  fc.jsonValue({ maxDepth: 2 })
).filter((value) => !Array.isArray(value) && !JSONRPCMessageSchema.safeParse(value).success)

const itemArb: fc.Arbitrary<Item> = fc.oneof(
  { weight: 6, arbitrary: fc.tuple(requestArb, fc.boolean()).map(([request, crlf]): Item => ({ kind: 'request', request, crlf })) },
  {
    weight: 2,
    arbitrary: fc.record({
      method: fc.constantFrom('notifications/initialized', 'notifications/cancelled', 'notifications/roots/list_changed', 'notifications/bridge-unknown'),
      params: fc.option(fc.constant({ requestId: 'nobody', reason: 'x' }), { nil: undefined })
    }).map((n): Item => ({ kind: 'notification', ...n }))
  },
  { weight: 1, arbitrary: fc.boolean().map((isError): Item => ({ kind: 'response', isError })) },
  { weight: 3, arbitrary: notJsonArb.map((value): Item => ({ kind: 'not-json', text: value })) },
  { weight: 3, arbitrary: notMessageArb.map((value): Item => ({ kind: 'not-a-message', value })) },
  { weight: 2, arbitrary: fc.array(requestArb, { minLength: 1, maxLength: 3 }).map((requests): Item => ({ kind: 'batch', requests })) },
  {
    weight: 1,
    arbitrary: fc.array(fc.oneof(fc.integer({ min: 0x80, max: 0xff }), fc.constantFrom(0xc0, 0xed, 0xf8)),
      { minLength: 1, maxLength: 4 })
      .map((bytes): Item => ({ kind: 'non-utf8', bytes }))
  }
)

function requestMessage (request: RequestItem, id: string | number): Json {
  switch (request.kind) {
    case 'ping': return { jsonrpc: '2.0', id, method: 'ping' }
    case 'list': return { jsonrpc: '2.0', id, method: 'tools/list', ...(request.cursor === undefined ? {} : { params: { cursor: request.cursor } }) }
    case 'call': return { jsonrpc: '2.0', id, method: 'tools/call', params: { name: request.name, arguments: request.args } }
    case 'method': return { jsonrpc: '2.0', id, method: request.method, ...(request.params === undefined ? {} : { params: request.params }) }
  }
}

/** One item's line (bytes, ending in \n) and the ids of the requests in it. */
function itemLine (item: Item, nextId: () => string | number): { bytes: Buffer, ids: Array<string | number> } {
  const line = (value: Json): Buffer => Buffer.from(rpcLine(value))
  switch (item.kind) {
    case 'request': {
      const id = nextId()
      const bytes = line(requestMessage(item.request, id))
      // A CRLF line end, as a Windows client may write: the same request.
      return { bytes: item.crlf ? Buffer.concat([bytes.subarray(0, -1), Buffer.from('\r\n')]) : bytes, ids: [id] }
    }
    case 'notification':
      return { bytes: line({ jsonrpc: '2.0', method: item.method, ...(item.params === undefined ? {} : { params: item.params }) }), ids: [] }
    case 'response':
      return {
        bytes: line(item.isError
          ? { jsonrpc: '2.0', id: 'to-nothing', error: { code: -1, message: 'an answer to nothing' } }
          : { jsonrpc: '2.0', id: 'to-nothing', result: {} }),
        ids: []
      }
    case 'not-json':
      return { bytes: Buffer.from(`${item.text}\n`), ids: [] }
    case 'not-a-message':
      return { bytes: line(item.value), ids: [] }
    case 'batch': {
      const ids = item.requests.map(() => nextId())
      return { bytes: line(item.requests.map((request, i) => requestMessage(request, ids[i]!))), ids }
    }
    case 'non-utf8': {
      const id = nextId()
      const [head, tail] = JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'bridge_echo', arguments: { s: '@@' } } })
        .split('@@') as [string, string]
      return { bytes: Buffer.concat([Buffer.from(head), Buffer.from(item.bytes), Buffer.from(`${tail}\n`)]), ids: [id] }
    }
  }
}

/** The JSON-RPC error answers with `id: null` (answers to lines whose request could not be read). */
function nullIdErrors (messages: Json[]): Json[] {
  return messages.filter((m) => m.id === null && m.error !== undefined)
}

interface FuzzWorld { tp: StartedTp, t: TestContext }

async function runFuzz (world: FuzzWorld, items: Item[], cuts: number[]): Promise<void> {
  const bridge = rawBridge(world.t, ['--role', ROLE, '--url', world.tp.url])
  const session = await rawSession(world.tp.url)
  try {
    await initializeRaw(bridge)
    let counter = 0
    const lines = items.map((item) => itemLine(item, () => counter++ % 2 === 0 ? `r${counter}` : counter))
    const bytes = Buffer.concat(lines.map((l) => l.bytes))
    // The bytes in random pieces, each its own write, a turn of the event loop apart.
    let offset = 0
    for (const cut of [...cuts.map((c) => Math.floor(c * bytes.length)).sort((a, b) => a - b), bytes.length]) {
      if (cut <= offset) continue
      bridge.send(bytes.subarray(offset, cut))
      offset = cut
      await tick()
    }
    bridge.send(rpcLine({ jsonrpc: '2.0', id: 'fence', method: 'ping' }))
    assert.deepEqual((await bridge.answer('fence', 'a ping after the fuzzed input (the bridge keeps serving)')).result, {})
    // The bridge answers ping itself; the forwarded requests may come after it.
    const isBatch = (i: number): boolean => items[i]!.kind === 'batch'
    for (const id of lines.flatMap((l, i) => isBatch(i) ? [] : l.ids)) await bridge.answer(id, `the answer to request ${id}`)
    const batchIds = lines.flatMap((l, i) => isBatch(i) ? l.ids : [])
    // A batch is answered whole or refused whole: a short wait for the whole, not a hang guard.
    await waitFor('batches answered', () => batchIds.every((id) => bridge.messages.some((m) => m.id === id)), 1_500).catch(() => {})

    // Each item, compared with what /mcp/<role> answers to the same bytes.
    let expectedNullErrors = 0
    /** The codes of the null-id errors of non-batch lines, in order. */
    const expectedNullCodes: number[] = []
    for (const [i, item] of items.entries()) {
      const { bytes: body, ids } = lines[i]!
      const what = `item ${i} ${item.kind} ${body.toString('utf8').slice(0, 160)}`
      const direct = await session.post(body)
      if (item.kind === 'not-json' || item.kind === 'not-a-message') {
        // /mcp/<role> answers a JSON-RPC error with id null: -32700 for what is not JSON, -32600
        // for JSON that is no JSON-RPC message (JSON-RPC 2.0 §5.1); so must the bridge.
        assert.equal(direct.messages[0]?.id, null, `${what}: /mcp answered ${JSON.stringify(direct.messages)}`)
        assert.equal(direct.messages[0]?.error?.code, item.kind === 'not-json' ? -32700 : -32600,
          `${what}: /mcp answered ${JSON.stringify(direct.messages)}`)
        expectedNullErrors++
        expectedNullCodes.push(item.kind === 'not-json' ? -32700 : -32600)
        continue
      }
      if (item.kind === 'batch') {
        const answered = ids.filter((id) => bridge.messages.some((m) => m.id === id))
        if (answered.length === 0) {
          // A batch refused whole (MCP 2025-06-18 has no batches) is one error with id null.
          expectedNullErrors++
          continue
        }
        assert.equal(answered.length, ids.length, `${what}: a batch is answered whole or refused whole (answered ids ${JSON.stringify(answered)})`)
      }
      for (const id of ids) {
        const bridged = bridge.messages.filter((m) => m.id === id)
        assert.equal(bridged.length, 1, `${what}: id ${JSON.stringify(id)} answered once by the bridge (got ${JSON.stringify(bridged).slice(0, 300)})`)
        const expected = direct.messages.find((m) => m.id === id)
        assert.deepEqual(normalise(bridged[0]), normalise(expected),
          `${what}: the bridge answered id ${JSON.stringify(id)} otherwise than /mcp/${ROLE} (HTTP ${direct.status})`)
      }
    }
    const nullErrors = nullIdErrors(bridge.messages)
    assert.equal(nullErrors.length, expectedNullErrors,
      `every line that is not a readable JSON-RPC request gets one JSON-RPC error with id null (JSON-RPC 2.0 §5.1; /mcp/${ROLE} answers -32700), got ${JSON.stringify(nullErrors).slice(0, 300)}`)
    for (const error of nullErrors) assert.ok([-32700, -32600].includes(error.error.code), `an error code of JSON-RPC 2.0 §5.1: ${JSON.stringify(error)}`)
    // Refused batches are -32600 too: the non-batch lines' codes, in order, are the bridge's.
    assert.deepEqual(nullErrors.map((e) => e.error.code).filter((code) => code === -32700),
      expectedNullCodes.filter((code) => code === -32700), 'the bridge answers -32700 exactly where /mcp does')
    // Nothing answers a notification or a response, and nothing is answered twice.
    const ids = new Set(lines.flatMap((l) => l.ids).concat(['init', 'fence']))
    const stray = bridge.messages.filter((m) => m.id !== null && !ids.has(m.id) && m.method === undefined)
    assert.deepEqual(stray, [], 'answers to nothing that was asked')
    assert.deepEqual(bridge.junk, [], 'stdout carries JSON-RPC messages only')

    bridge.child.stdin.end()
    const exit = await within(bridge.exited, 'the bridge exits on stdin EOF', GUARD_MS)
    assert.deepEqual(exit, { code: 0, signal: null }, 'stdin EOF: exit 0')
    assert.deepEqual(crashLines(bridge.stderr()), [], 'no crash on stderr')
  } catch (err) {
    throw new Error(`${(err as Error).message}\nbridge stderr:\n${bridge.stderr().slice(-1500)}`, { cause: err })
  } finally {
    if (bridge.exit === null) bridge.child.kill('SIGKILL')
    await session.close().catch(() => {})
  }
}

test('toolport mcp, stdin fuzz property: each request line is answered once, as /mcp/<role> answers the same bytes; a line that is not a JSON-RPC request gets a JSON-RPC error with id null; notifications and stray responses get nothing; stdout is JSON-RPC only; the bridge keeps serving and exits 0 on EOF (README bridge paragraph: "stdout carries the protocol"; docs/protocol.md "MCP endpoint": -32700, -32600)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const plugin = await startCallbackServer()
  t.after(() => plugin.close())
  const tp = await startTp(0)
  t.after(() => tp.tp.close())
  await tp.tp.register({ name: 'bridge_echo', role: ROLE, callback_url: `${plugin.url}/echo` })
  await tp.tp.register({
    name: 'bridge_strict',
    role: ROLE,
    callback_url: `${plugin.url}/echo`,
    parameters: { type: 'object', properties: { s: { type: 'string' } }, additionalProperties: false }
  })
  const world: FuzzWorld = { tp, t }
  const scenario = fc.record({
    items: fc.array(itemArb, { minLength: 1, maxLength: 10 }),
    cuts: fc.array(fc.double({ min: 0, max: 1, noNaN: true }), { maxLength: 6 })
  })
  // Each run and each shrink spawns a bridge: fewer shrinks keep a failure's report quick.
  await check(fc.asyncProperty(fc.limitShrink(scenario, 4), async ({ items, cuts }) => {
    await runFuzz(world, items, cuts)
  }), { numRuns: runs(6) })
})

// ---------------------------------------------------------------------------------------------
// Token mode.

/**
 * A bridge whose token Toolport refuses: like a role Toolport does not have (TP_ERR_ROLE_NOT_FOUND)
 * it may exit 1 naming TP_ERR_UNAUTHORIZED; if it serves on, its answer to request `id` must name the
 * refusal and must not claim that Toolport is unreachable (it is up; it refused the token).
 */
async function assertRefusalSurfaced (bridge: RawBridge, what: string, id: number): Promise<void> {
  await waitFor(`${what}: the bridge exits or answers id ${id}`, () =>
    bridge.exit !== null || bridge.messages.some((m) => m.id === id), GUARD_MS)
  const answer = bridge.messages.find((m) => m.id === id)
  if (answer === undefined) {
    assert.deepEqual(bridge.exit, { code: 1, signal: null }, `${what}: exit 1`)
    assert.match(bridge.stderr(), /TP_ERR_UNAUTHORIZED/, `${what}: stderr names the refusal`)
    return
  }
  const text = JSON.stringify(answer)
  assert.doesNotMatch(text, /not reachable/, `${what}: Toolport is up and refused the token; the bridge says: ${text}`)
  assert.match(text, /TP_ERR_UNAUTHORIZED|unauthori[sz]ed|token/i, `${what}: the answer names Toolport's refusal of the token: ${text}`)
}

type TokenCase = {
  token: 'right' | 'right-padded' | 'wrong' | 'short' | 'none'
  channel: 'flag' | 'env'
  mode: number
}

test('toolport mcp, token mode property: a token file as documented serves like a direct client with the header; a bad file exits 2; a token Toolport refuses is not passed off as an unreachable Toolport (README bridge paragraph: --token-file; `toolport mcp --help`)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const plugin = await startCallbackServer()
  t.after(() => plugin.close())
  const tp = await startTp(0, TOKEN)
  t.after(() => tp.tp.close())
  await tp.tp.register({ name: 'bridge_echo', role: ROLE, callback_url: `${plugin.url}/echo` })
  const dir = mkdtempSync(join(tmpdir(), 'bridge-properties-'))
  t.after(() => rmSync(dir, { recursive: true, force: true }))
  const direct = await directClient(tp.url, { authorization: `Bearer ${TOKEN}` })
  t.after(() => direct.close())
  const expectedList = await answerOf(direct.client.listTools())
  const expectedCall = await answerOf(direct.client.callTool({ name: 'bridge_echo', arguments: { s: 'ünï 🙂' } }))
  // Without the token, a direct client is refused: 401 TP_ERR_UNAUTHORIZED.
  await assert.rejects(directClient(tp.url, { authorization: `Bearer ${'w'.repeat(40)}` }), /TP_ERR_UNAUTHORIZED/)

  let n = 0
  const caseArb: fc.Arbitrary<TokenCase> = fc.record({
    token: fc.constantFrom('right', 'right-padded', 'wrong', 'short', 'none'),
    channel: fc.constantFrom('flag', 'env'),
    mode: fc.constantFrom(0o600, 0o400, 0o640, 0o604)
  })
  await check(fc.asyncProperty(fc.limitShrink(caseArb, 4), async (c) => {
    const args = ['--role', ROLE, '--url', tp.url]
    const env: NodeJS.ProcessEnv = {}
    if (c.token !== 'none') {
      const file = join(dir, `token-${n++}`)
      const content = { right: TOKEN, 'right-padded': ` ${TOKEN}\n\n`, wrong: 'w'.repeat(40), short: 'z'.repeat(31) }[c.token]
      writeFileSync(file, content)
      chmodSync(file, c.mode)
      if (c.channel === 'flag') args.push('--token-file', file)
      else env.TOOLPORT_TOKEN_FILE = file
    }
    const bridge = rawBridge(t, args, env)
    const what = `token ${c.token} via ${c.channel}, mode ${c.mode.toString(8)}`
    try {
      const badFile = c.token !== 'none' && ((c.mode & 0o077) !== 0 || c.token === 'short')
      if (badFile) {
        const exit = await within(bridge.exited, `${what}: the bridge exits`, GUARD_MS)
        assert.deepEqual(exit, { code: 2, signal: null }, `${what}: a token file that cannot be used exits 2`)
        assert.match(bridge.stderr(), (c.mode & 0o077) !== 0 ? /readable by others/ : /shorter than 32 bytes/)
      } else if (c.token === 'right' || c.token === 'right-padded') {
        await initializeRaw(bridge)
        bridge.send(rpcLine({ jsonrpc: '2.0', id: 1, method: 'tools/list' }))
        bridge.send(rpcLine({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'bridge_echo', arguments: { s: 'ünï 🙂' } } }))
        const list = await bridge.answer(1, `${what}: tools/list`)
        const call = await bridge.answer(2, `${what}: tools/call`)
        assert.deepEqual({ kind: 'result', value: normalise(list.result) }, expectedList, `${what}: tools/list as the direct client's`)
        assert.deepEqual({ kind: 'result', value: normalise(call.result) }, expectedCall, `${what}: tools/call as the direct client's`)
      } else {
        // Toolport is up and refuses the token (wrong, or none given).
        bridge.send(rpcLine(INITIALIZE))
        bridge.send(rpcLine({ jsonrpc: '2.0', method: 'notifications/initialized' }))
        bridge.send(rpcLine({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'bridge_echo', arguments: {} } }))
        await assertRefusalSurfaced(bridge, what, 2)
      }
      assert.deepEqual(bridge.junk, [], `${what}: stdout carries JSON-RPC only`)
    } finally {
      if (bridge.exit === null) {
        bridge.child.stdin.end()
        await within(bridge.exited, `${what}: exit on EOF`, GUARD_MS).catch(() => {})
      }
    }
  }), {
    numRuns: runs(8),
    // Each kind of token file once, then random ones.
    examples: [
      [{ token: 'right-padded', channel: 'env', mode: 0o400 }],
      [{ token: 'wrong', channel: 'flag', mode: 0o600 }],
      [{ token: 'none', channel: 'flag', mode: 0o600 }],
      [{ token: 'short', channel: 'env', mode: 0o600 }],
      [{ token: 'right', channel: 'flag', mode: 0o640 }]
    ]
  })
})

// ---------------------------------------------------------------------------------------------
// Stopping.

test('toolport mcp: stdin EOF, SIGTERM and SIGINT end the bridge with exit 0 and JSON-RPC-only stdout, with a call in flight, whether Toolport is up, down, or up but not answering (README bridge paragraph; cli-bridge.ts Bridge.close: "ends the upstream session (DELETE)")', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const plugin = await startCallbackServer()
  t.after(() => plugin.close())
  const live = await startTp(0)
  t.after(() => live.tp.close())
  await live.tp.register({ name: SLOW, role: ROLE, callback_url: `${plugin.url}${SLOW_PATH}` })
  let cancelled = 0
  live.tp.on('call-finished', (event) => { if (event.outcome === 'cancelled') cancelled++ })
  const down = `http://127.0.0.1:${await closedPort()}`

  type Upstream = 'up' | 'down' | 'frozen' | 'frozen-from-start'
  type Stop = 'eof' | 'SIGTERM' | 'SIGINT'
  const cases: Array<{ upstream: Upstream, stop: Stop }> = []
  for (const upstream of ['up', 'down', 'frozen', 'frozen-from-start'] as const) {
    for (const stop of ['eof', 'SIGTERM', 'SIGINT'] as const) {
      if (stop === 'SIGINT' && upstream !== 'up') continue
      cases.push({ upstream, stop })
    }
  }
  const results = await Promise.all(cases.map(async ({ upstream, stop }) => {
    const what = `Toolport ${upstream}, stopped by ${stop}`
    try {
      const proxy = upstream.startsWith('frozen') ? await freezableProxy(t, live.port, upstream === 'frozen-from-start') : undefined
      const url = upstream === 'down' ? down : proxy?.url ?? live.url
      const bridge = rawBridge(t, ['--role', ROLE, '--url', url])
      bridge.send(rpcLine(INITIALIZE))
      if (upstream !== 'frozen-from-start') {
        await bridge.answer('init', `${what}: initialize`)
        bridge.send(rpcLine({ jsonrpc: '2.0', method: 'notifications/initialized' }))
        const marker = `${upstream}-${stop}`
        bridge.send(rpcLine({ jsonrpc: '2.0', id: 'slow', method: 'tools/call', params: { name: SLOW, arguments: { marker } } }))
        if (upstream !== 'down') {
          await waitFor(`${what}: the call reaches the plugin`, () =>
            plugin.requests.some((r) => r.path === SLOW_PATH && r.body.includes(marker)), GUARD_MS)
        } else {
          await bridge.answer('slow', `${what}: the call answers while Toolport is down`)
        }
        proxy?.freeze()
      } else {
        // The bridge has started (it is trying to reach Toolport) when it is asked to stop.
        await waitFor(`${what}: the bridge tries to reach Toolport`, () => (proxy?.connections() ?? 0) > 0, GUARD_MS)
      }
      if (stop === 'eof') bridge.child.stdin.end()
      else bridge.child.kill(stop)
      // It only has to end one session (a DELETE): 6 s is a hang guard, not a timing.
      const exit = await within(bridge.exited, `${what}: the bridge exits`, 6_000)
      assert.deepEqual(exit, { code: 0, signal: null }, `${what}: exit 0 (stderr: ${bridge.stderr().slice(-300)})`)
      assert.deepEqual(bridge.junk, [], `${what}: stdout carries JSON-RPC only`)
      assert.deepEqual(crashLines(bridge.stderr()), [], `${what}: no crash on stderr`)
      return ''
    } catch (err) {
      return (err as Error).message
    }
  }))
  assert.deepEqual(results.filter((r) => r !== ''), [], 'every case stops cleanly')
  // The bridges stopped while Toolport answered ended their sessions (DELETE): their calls were cancelled.
  const stoppedLive = cases.filter((c) => c.upstream === 'up').length
  await waitFor(`the calls of the ${stoppedLive} bridges stopped while Toolport answered are cancelled (${cancelled})`,
    () => cancelled >= stoppedLive, GUARD_MS)
})

// ---------------------------------------------------------------------------------------------
// Cases the properties found, shrunk.

test('toolport mcp: a call Toolport refuses before it runs (413 TP_ERR_BODY_TOO_LARGE, TP_ERR_JSON_TOO_DEEP) is answered with Toolport\'s JSON-RPC error on the same session, not as a lost connection whose tool "may have run" (README bridge paragraph; cli-bridge.ts: upstream JSON-RPC errors are answered as Toolport sent them)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const plugin = await startCallbackServer()
  t.after(() => plugin.close())
  const tp = await startTp(0)
  t.after(() => tp.tp.close())
  await tp.tp.register({ name: 'bridge_echo', role: ROLE, callback_url: `${plugin.url}/echo` })
  const bridge = await sdkBridge(tp.url)
  t.after(() => bridge.close())
  const direct = await directClient(tp.url)
  t.after(() => direct.close())
  await bridge.client.listTools()
  const sessions = (): string[] => tp.tp.roles.get(ROLE).sessions()
    .filter((s) => (s as { sessionId?: string }).sessionId !== direct.sessionId).map((s) => s.id).sort()
  const before = sessions()
  assert.equal(before.length, 1, 'the bridge holds one session')
  const noticesBefore = bridge.notices()

  for (const args of [materialise({ kind: 'big', chars: 600_000 }), materialise({ kind: 'deep', depth: 70 })]) {
    const params = { name: 'bridge_echo', arguments: args }
    const expected = await answerOf(direct.client.callTool(params))
    assert.ok(expected.kind === 'http' && expected.rpc !== undefined, `Toolport refuses it: ${JSON.stringify(expected)}`)
    const got = await answerOf(bridge.client.callTool(params))
    assert.doesNotMatch(JSON.stringify(got), /may have run/, 'the call never ran: Toolport refused its request')
    assertSameAnswer('the refused call', expected, got)
  }
  assert.deepEqual(plugin.requests, [], 'no call reached the plugin')
  // The session was fine: the bridge keeps it (no new session, no list_changed of its own).
  await bridge.client.listTools()
  assert.deepEqual(sessions(), before, 'the bridge is still on its one session')
  assert.equal(bridge.notices(), noticesBefore, 'no list_changed: nothing changed')
})

test('toolport mcp: a call Toolport refuses (413) does not cut off the other calls in flight on the bridge\'s session: they get their own results, not "the connection was lost; the tool may have run" (README bridge paragraph: only a call whose connection is lost while it runs answers that)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const plugin = await startCallbackServer()
  t.after(() => plugin.close())
  const tp = await startTp(0)
  t.after(() => tp.tp.close())
  await tp.tp.register({ name: 'bridge_echo', role: ROLE, callback_url: `${plugin.url}/echo` })
  await tp.tp.register({ name: 'bridge_slow', role: ROLE, callback_url: `${plugin.url}/sleep/400` })
  const bridge = await sdkBridge(tp.url)
  t.after(() => bridge.close())
  const slow = answerOf(bridge.client.callTool({ name: 'bridge_slow', arguments: { k: 'innocent' } }))
  await waitFor('the slow call reaches the plugin', () => plugin.requests.length === 1, GUARD_MS)
  await answerOf(bridge.client.callTool({ name: 'bridge_echo', arguments: materialise({ kind: 'big', chars: 600_000 }) }))
  const result = await within(slow, 'the slow call\'s answer', GUARD_MS)
  assert.ok(result.kind === 'result', JSON.stringify(result))
  assert.equal(result.value.isError, false, `the call ran and its plugin answered: ${JSON.stringify(result.value).slice(0, 300)}`)
  assert.deepEqual(result.value.structuredContent?.arguments, { k: 'innocent' })
})

test('toolport mcp: a tool reply within dispatch.maxResponseBytes (4 MiB) is answered through the bridge without breaking the MCP SDK\'s stdio client, which refuses a line over 10 MiB and disconnects (README "MCP: one endpoint per role": tools/call answers text and structuredContent; README bridge paragraph)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  // 1.9 M double quotes: a 3.8 MB reply whose object output is sent twice (the text, where each
  // quote is escaped twice over, and structuredContent): an 11.4 MB JSON-RPC line.
  const reply = Buffer.from(JSON.stringify({ output: { s: '"'.repeat(1_900_000) } }))
  const plugin = await listenOnLoopback(t, createHttpServer((request, response) => {
    request.resume()
    request.once('end', () => {
      response.writeHead(200, { 'content-type': 'application/json', 'content-length': reply.length })
      response.end(reply)
    })
  }))
  const tp = await startTp(0)
  t.after(() => tp.tp.close())
  await tp.tp.register({ name: 'bridge_quotes', role: ROLE, callback_url: `${plugin}/quotes` })
  const direct = await directClient(tp.url)
  t.after(() => direct.close())
  const expected = await answerOf(direct.client.callTool({ name: 'bridge_quotes', arguments: {} }))
  assert.ok(expected.kind === 'result' && expected.value.isError === false, 'straight to /mcp the call succeeds')
  const bridge = await sdkBridge(tp.url)
  t.after(() => bridge.close())
  let closed = false
  bridge.client.onclose = () => { closed = true }
  const got = await within(answerOf(bridge.client.callTool({ name: 'bridge_quotes', arguments: {} })), 'the call through the bridge', GUARD_MS)
  assert.deepEqual(bridge.errors.map((e) => e.message), [], 'the client could read every line the bridge wrote')
  assert.equal(closed, false, 'the client\'s connection to the bridge survives the call')
  // The same result, or (if it cannot be carried over stdio) an answer saying so.
  assert.ok(got.kind === 'result' || got.kind === 'rpc', `the call is answered: ${JSON.stringify(got).slice(0, 300)}`)
  assert.deepEqual(await answerOf(bridge.client.ping()), { kind: 'result', value: {} }, 'the bridge still serves')
})

test('toolport mcp: a line over 10 MiB on stdin is answered with an error and the bridge keeps serving, instead of the bridge exiting 0 without a word (README bridge paragraph; JSON-RPC 2.0 §5)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const tp = await startTp(0)
  t.after(() => tp.tp.close())
  const bridge = rawBridge(t, ['--role', ROLE, '--url', tp.url])
  await initializeRaw(bridge)
  const huge = { jsonrpc: '2.0', id: 'huge', method: 'tools/call', params: { name: 'bridge_echo', arguments: { s: 'x'.repeat(11 * 1024 * 1024) } } }
  bridge.send(rpcLine(huge))
  bridge.send(rpcLine({ jsonrpc: '2.0', id: 'after', method: 'ping' }))
  await waitFor('an answer to the line after the huge one, or the bridge\'s exit', () =>
    bridge.exit !== null || bridge.messages.some((m) => m.id === 'after'), GUARD_MS)
  assert.equal(bridge.exit, null, `the bridge is still running (it exited ${JSON.stringify(bridge.exit)}; stderr: ${JSON.stringify(bridge.stderr().slice(-300))})`)
  const answer = bridge.messages.find((m) => m.id === 'huge' || (m.id === null && m.error !== undefined))
  assert.ok(answer?.error !== undefined || answer?.result?.isError === true, `the huge request is answered with an error: ${JSON.stringify(answer)?.slice(0, 300)}`)
})

test('toolport mcp: a line that is not JSON (-32700), or JSON that is not a JSON-RPC message (-32600), is answered with a JSON-RPC error with id null, as /mcp/<role> answers it, and the bridge keeps serving (JSON-RPC 2.0 §5.1; docs/protocol.md "MCP endpoint")', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const tp = await startTp(0)
  t.after(() => tp.tp.close())
  const bridge = rawBridge(t, ['--role', ROLE, '--url', tp.url])
  await initializeRaw(bridge)
  bridge.send('{nope\n')
  bridge.send(rpcLine({ jsonrpc: '2.0', id: 1.5, method: 'ping' }))
  bridge.send(rpcLine({ jsonrpc: '2.0', id: 'after', method: 'ping' }))
  await bridge.answer('after', 'a ping after the bad lines')
  await sleep(100)
  const codes = nullIdErrors(bridge.messages).map((m) => m.error.code)
  assert.equal(codes.length, 2, `one error with id null per bad line: ${JSON.stringify(bridge.messages.slice(1))}`)
  assert.equal(codes[0], -32700, 'not JSON: Parse error')
  assert.equal(codes[1], -32600, 'JSON, not a JSON-RPC message: Invalid Request, as /mcp answers it')
})

test('toolport mcp: a JSON-RPC batch on stdin is answered (each request, as /mcp/<role> answers a batch) or refused with a JSON-RPC error, never left unanswered (JSON-RPC 2.0 §6; MCP 2025-03-26, which the bridge negotiates, requires batches)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const tp = await startTp(0)
  t.after(() => tp.tp.close())
  const bridge = rawBridge(t, ['--role', ROLE, '--url', tp.url])
  bridge.send(rpcLine({ ...INITIALIZE, params: { ...INITIALIZE.params, protocolVersion: '2025-03-26' } }))
  assert.equal((await bridge.answer('init', 'initialize')).result.protocolVersion, '2025-03-26', 'the bridge speaks 2025-03-26')
  bridge.send(rpcLine({ jsonrpc: '2.0', method: 'notifications/initialized' }))
  bridge.send(rpcLine([{ jsonrpc: '2.0', id: 'b1', method: 'ping' }, { jsonrpc: '2.0', id: 'b2', method: 'tools/list' }]))
  bridge.send(rpcLine({ jsonrpc: '2.0', id: 'after', method: 'ping' }))
  await bridge.answer('after', 'a ping after the batch')
  await sleep(100)
  const answered = bridge.messages.filter((m) => m.id === 'b1' || m.id === 'b2' || m.id === null)
  assert.ok(answered.length > 0, 'the batch got an answer')
})

test('toolport mcp: with a token Toolport refuses, the bridge does not claim Toolport "is not reachable" (README bridge paragraph: --token-file; cli-bridge.ts startBridge: a misconfiguration fails fast)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const tp = await startTp(0, TOKEN)
  t.after(() => tp.tp.close())
  const dir = mkdtempSync(join(tmpdir(), 'bridge-properties-'))
  t.after(() => rmSync(dir, { recursive: true, force: true }))
  const file = join(dir, 'token')
  writeFileSync(file, 'w'.repeat(40), { mode: 0o600 })
  const bridge = rawBridge(t, ['--role', ROLE, '--url', tp.url, '--token-file', file])
  bridge.send(rpcLine(INITIALIZE))
  bridge.send(rpcLine({ jsonrpc: '2.0', method: 'notifications/initialized' }))
  bridge.send(rpcLine({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'anything', arguments: {} } }))
  await assertRefusalSurfaced(bridge, 'a wrong token', 1)
})
