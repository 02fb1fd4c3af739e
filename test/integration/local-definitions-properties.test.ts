// Properties of a host's local (in-process) tools and of the tool definitions a host hands its own
// LLM loop (README "Embedding: the library", "Definitions for your own LLM loop", "Tool results for
// your own LLM loop"; docs/protocol.md "Model-visible result", R5, R15–R18, "Ownership mode").
//
// Everything is real: a listening Toolport on 127.0.0.1, `POST /api/tools/call` and
// `GET /api/tools/definitions` over undici, the official MCP SDK Client over Streamable HTTP, a
// `ws` fake Realtime provider with the host's `ws` client wired to `createRealtimeSession` (as the
// realtime tests do), and a real plugin callback server for the plugin tools.
//
// - Exits: local-tool handlers that return any value (JSON values, Dates, Maps, typed arrays,
//   toJSON objects, BigInt, cycles, undefined, symbols, functions, -0, NaN, sparse arrays, deep
//   nesting, large strings, `__proto__` keys), throw or reject (Errors, non-Errors, null), answer
//   late, or never answer before a short deadline (ignoring or observing their signal). Each call
//   goes through every exit: `tp.callTool`, `POST /api/tools/call`, MCP `tools/call` and Realtime;
//   every exit answers once with the same ToolResult (docs/protocol.md "Model-visible result": "The
//   same text reaches every session"), the shape on the wire keeps the documented rules, and the
//   handler runs once per exit.
// - Deadlines and cancellation: random deadlines, handler delays, signal-observing or not, and
//   caller aborts at random times: each call is answered once, by the handler's own result, a
//   timeout or a cancellation, with the handler's signal aborted for the right reason.
// - Local tool vs plugin tool of one name: random sequences of host registerLocalTool /
//   unregisterLocalTool and plugin register / unregister / clear over HTTP (ownership mode on or
//   off) against a model of R5, R15, R16, R17 and "Ownership mode"; GET /api/tools and a call of
//   each name agree with the model after every step.
// - Definitions: random registries (random accepted JSON Schemas, unicode and long names and
//   descriptions, remote and local tools) answer GET /api/tools/definitions for every documented
//   format consistently with toolDefinitions(), GET /api/tools, MCP tools/list and the Realtime
//   session.update; bodies have an exact Content-Length, are deterministic and are the documented
//   shape; names are passed as registered (no mapping), so two tools never share a name.
//
// TP_PROPERTY_RUNS=N multiplies the runs of each property (the default fits ~15 s).
// TP_LOCAL_SKIP_KNOWN_BUGS=1 leaves out the inputs of the bugs documented below, to hunt past them.
//
// The tests after the properties are the cases the properties found, shrunk; they fail until the
// bugs they document are fixed.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { EventEmitter, once } from 'node:events'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { isDeepStrictEqual } from 'node:util'
import fc from 'fast-check'
import { request as httpRequest } from 'undici'
import { WebSocket, WebSocketServer } from 'ws'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  createRealtimeSession, createToolport, toolDefinitions, toolResultBlock, type RealtimeSession, type Toolport
} from '../../src/main/index.js'
import type { ToolResult } from '../../src/main/dispatch/result.js'
import { startToolport, within } from '../helpers.js'

const FAILING_TIMEOUT_MS = 300_000
const GUARD_MS = 10_000
const MAX_SHRINKS = 30

/** Runs per property: TP_PROPERTY_RUNS=N hunts N times longer. */
function runs (n: number): number {
  return Math.max(1, Math.round(n * Number(process.env.TP_PROPERTY_RUNS ?? 1)))
}

type Json = Record<string, any>

// ---------------------------------------------------------------------------------------------
// Exits: the library, the HTTP route, an MCP SDK client and a Realtime session on a `ws` provider.

/** A fake Realtime provider: acks session.update, records client events, plays server events. */
class FakeProvider extends EventEmitter {
  readonly received: Json[] = []
  socket: WebSocket | null = null
  readonly server: WebSocketServer

  constructor (server: WebSocketServer) {
    super()
    this.setMaxListeners(0)
    this.server = server
    server.on('connection', (socket) => {
      this.socket = socket
      socket.on('message', (data) => this.#onClientEvent(JSON.parse(data.toString()) as Json))
    })
  }

  get url (): string {
    return `ws://127.0.0.1:${(this.server.address() as AddressInfo).port}`
  }

  sent (type: string): Json[] {
    return this.received.filter((e) => e.type === type)
  }

  play (...events: Json[]): void {
    for (const event of events) this.socket?.send(JSON.stringify({ event_id: `evt_${Math.random().toString(36).slice(2)}`, ...event }))
  }

  #onClientEvent (event: Json): void {
    this.received.push(event)
    if (event.type === 'session.update') {
      this.play({ type: 'session.updated', session: { object: 'realtime.session', ...event.session } })
    }
    this.emit('client-event', event)
  }

  /** Resolves with the function_call_output items for `callId` once there is at least one. */
  async outputFor (callId: string): Promise<Json[]> {
    const items = (): Json[] => this.sent('conversation.item.create')
      .filter((e) => e.item?.type === 'function_call_output' && e.item.call_id === callId)
    while (items().length === 0) await once(this, 'client-event')
    return items()
  }
}

interface Exits {
  tp: Toolport
  url: string
  mcp: Client
  provider: FakeProvider
  session: RealtimeSession
  host: WebSocket
}

let serial = 0

async function openExits (t: TestContext, tp: Toolport, url: string, role: string): Promise<Exits> {
  const mcp = new Client({ name: 'local-definitions-properties', version: '1.0.0' })
  await mcp.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/${role}`)))
  const wss = new WebSocketServer({ host: '127.0.0.1', port: 0 })
  await once(wss, 'listening')
  const provider = new FakeProvider(wss)
  const host = new WebSocket(provider.url)
  await once(host, 'open')
  const session = createRealtimeSession({
    toolport: tp,
    role,
    rateLimit: false,
    send: (event) => { host.send(JSON.stringify(event)) }
  })
  host.on('message', (data) => session.handleServerEvent(data.toString()))
  t.after(async () => {
    session.close()
    host.terminate()
    for (const client of wss.clients) client.terminate()
    await new Promise<void>((resolve) => wss.close(() => resolve()))
    await mcp.close().catch(() => {})
  })
  // The attach-time sync settles once the provider acked.
  await tp.roles.get(role).sync()
  return { tp, url, mcp, provider, session, host }
}

async function httpCall (url: string, body: Json): Promise<{ status: number, raw: string, body: any }> {
  const res = await httpRequest(`${url}/api/tools/call`, {
    method: 'POST',
    body: JSON.stringify(body),
    headers: { 'content-type': 'application/json' }
  })
  const raw = await res.body.text()
  return { status: res.statusCode, raw, body: raw === '' ? undefined : JSON.parse(raw) }
}

/** One Realtime function call in its own response; resolves with every output item for it. */
async function realtimeCall (exits: Exits, name: string, args: string): Promise<Json[]> {
  const n = ++serial
  const responseId = `resp_${n}`
  const callId = `call_rt_${n}`
  const itemId = `item_${n}`
  const item = { id: itemId, object: 'realtime.item', type: 'function_call', status: 'completed', call_id: callId, name, arguments: args }
  const answered = exits.provider.outputFor(callId)
  exits.provider.play(
    { type: 'response.output_item.added', response_id: responseId, output_index: 0, item: { ...item, status: 'in_progress', arguments: '' } },
    { type: 'response.function_call_arguments.done', response_id: responseId, item_id: itemId, output_index: 0, call_id: callId, arguments: args, name },
    { type: 'response.output_item.done', response_id: responseId, output_index: 0, item },
    { type: 'response.done', response: { id: responseId, object: 'realtime.response', status: 'completed', output: [item] } }
  )
  await answered
  // A second answer for this call would have been sent before the session.update of the role's
  // next sync, which the provider acks on the same socket.
  await exits.tp.roles.get('A').sync()
  return exits.provider.sent('conversation.item.create')
    .filter((e) => e.item?.type === 'function_call_output' && e.item.call_id === callId)
}

// ---------------------------------------------------------------------------------------------
// Handler behaviours.

/** What a handler does; `make` builds a fresh value (cycles and the like cannot be shared). */
interface Behaviour {
  label: string
  mode: 'return' | 'resolve' | 'late' | 'throw' | 'reject' | 'hang' | 'hang_observe'
  make: () => unknown
  delayMs: number
}

function nested (depth: number, asArray: boolean): unknown {
  let v: unknown = asArray ? [] : {}
  for (let i = 0; i < depth; i++) v = asArray ? [v] : { a: v }
  return v
}

class Decimalish {
  constructor (readonly digits: string) {}
  toJSON (): string { return this.digits }
}

/** Values a handler may return, by label: JSON values and the non-JSON values hosts do return. */
const valueArb: fc.Arbitrary<{ label: string, make: () => unknown }> = fc.oneof(
  fc.jsonValue({ maxDepth: 4 }).map((v) => ({ label: `json ${JSON.stringify(v)?.slice(0, 60)}`, make: () => structuredClone(v) })),
  fc.string({ unit: 'grapheme', maxLength: 40 }).map((s) => ({ label: `string ${JSON.stringify(s)}`, make: () => s })),
  fc.constantFrom(
    { label: 'undefined', make: () => undefined },
    { label: 'null', make: () => null },
    { label: '-0', make: () => -0 },
    { label: 'NaN', make: () => NaN },
    { label: 'Infinity', make: () => -Infinity },
    { label: 'symbol', make: () => Symbol('s') },
    { label: 'function', make: () => function f () {} },
    { label: 'bigint', make: () => 10n },
    { label: 'object with bigint', make: () => ({ n: 1n, ok: true }) },
    { label: 'cycle', make: () => { const o: Json = { a: 1 }; o.self = o; return o } },
    { label: 'Date', make: () => new Date(86_400_000) },
    { label: 'object holding a Date', make: () => ({ at: new Date(0) }) },
    { label: 'Map', make: () => new Map([['k', 1]]) },
    { label: 'Set', make: () => new Set([1]) },
    { label: 'Uint8Array', make: () => new Uint8Array([1, 2, 3]) },
    { label: 'toJSON number', make: () => ({ toJSON: () => 5 }) },
    { label: 'toJSON undefined', make: () => ({ toJSON: () => undefined }) },
    { label: 'class with toJSON', make: () => new Decimalish('1.50') },
    { label: 'class instance', make: () => new (class Point { x = 1; y = 2 })() },
    { label: 'null prototype', make: () => Object.assign(Object.create(null), { a: 1 }) },
    { label: 'sparse array', make: () => [1, , 3] }, // eslint-disable-line no-sparse-arrays
    { label: 'object with undefined and function members', make: () => ({ a: undefined, f () {}, b: [undefined, () => 1] }) },
    { label: '__proto__ key', make: () => JSON.parse('{"__proto__":{"x":1},"b":2}') },
    { label: 'nested __proto__ key', make: () => JSON.parse('{"a":{"__proto__":{"x":1}}}') },
    { label: 'deep array 3000', make: () => nested(3000, true) },
    { label: 'deep object 3000', make: () => nested(3000, false) },
    { label: 'deep object 5000', make: () => nested(5000, false) },
    { label: 'deep object 200000', make: () => nested(200_000, false) },
    { label: 'string 1 MiB', make: () => 'x'.repeat(1024 * 1024) },
    { label: 'object with a 1 MiB string', make: () => ({ s: 'é'.repeat(512 * 1024) }) },
    { label: 'lone surrogate string', make: () => 'a\ud800b' }
  )
)

/** Things a handler may throw, by label, with the error message the docs lead one to expect. */
const thrownArb: fc.Arbitrary<{ label: string, make: () => unknown }> = fc.oneof(
  fc.string({ maxLength: 30 }).map((m) => ({ label: `Error(${JSON.stringify(m)})`, make: () => new Error(m) })),
  fc.string({ maxLength: 30 }).map((m) => ({ label: `string ${JSON.stringify(m)}`, make: () => m })),
  fc.constantFrom(
    { label: 'TypeError', make: () => new TypeError('bad type') },
    { label: 'null', make: () => null },
    { label: 'undefined', make: () => undefined },
    { label: 'number', make: () => 42 },
    { label: 'plain object', make: () => ({ message: 'not an Error' }) },
    { label: 'DOMException', make: () => new DOMException('aborted here', 'AbortError') }
  )
)

/**
 * The values of the bugs the regression tests below document. `TP_LOCAL_SKIP_KNOWN_BUGS=1` leaves
 * them (and boolean subschemas, below) out, to hunt past them and to check mutations; by default
 * the properties meet them too.
 */
const KNOWN_BUG_LABELS = new Set(['undefined', 'bigint', 'object with bigint', 'cycle', 'Date', 'Map', 'Set', 'Uint8Array',
  'toJSON number', 'class with toJSON', 'class instance', 'deep object 5000', 'deep object 200000'])
const SKIP_KNOWN_BUGS = process.env.TP_LOCAL_SKIP_KNOWN_BUGS === '1'
const huntedValueArb = SKIP_KNOWN_BUGS
  ? valueArb.filter((v) => !KNOWN_BUG_LABELS.has(v.label))
  : valueArb

const behaviourArb: fc.Arbitrary<Behaviour> = fc.oneof(
  { weight: 6, arbitrary: fc.record({ v: huntedValueArb, mode: fc.constantFrom('return', 'resolve', 'late'), delayMs: fc.integer({ min: 0, max: 15 }) }) },
  { weight: 3, arbitrary: fc.record({ v: thrownArb, mode: fc.constantFrom('throw', 'reject'), delayMs: fc.integer({ min: 0, max: 15 }) }) },
  { weight: 1, arbitrary: fc.record({ v: fc.constant({ label: 'never', make: () => undefined }), mode: fc.constantFrom('hang', 'hang_observe'), delayMs: fc.constant(0) }) }
).map(({ v, mode, delayMs }) => ({ label: `${mode} ${v.label}`, make: v.make, mode, delayMs }) as Behaviour)

/** The deadline of the tool that runs the `hang` behaviours. */
const SHORT_SECONDS = 0.05

interface Probe {
  behaviours: Map<string, Behaviour>
  invocations: Map<string, number>
  signals: Map<string, AbortSignal[]>
}

function probeHandler (probe: Probe) {
  return (args: unknown, context: { signal: AbortSignal }): unknown => {
    const key = (args as { k: string }).k
    probe.invocations.set(key, (probe.invocations.get(key) ?? 0) + 1)
    const signals = probe.signals.get(key) ?? []
    signals.push(context.signal)
    probe.signals.set(key, signals)
    const b = probe.behaviours.get(key)
    if (b === undefined) throw new Error(`no behaviour for ${key}`)
    switch (b.mode) {
      case 'return': return b.make()
      case 'resolve': return Promise.resolve(b.make())
      case 'late': return sleep(b.delayMs).then(() => b.make())
      case 'throw': throw b.make()
      case 'reject': return sleep(b.delayMs).then(() => { throw b.make() })
      case 'hang': return new Promise(() => {})
      case 'hang_observe': return new Promise((_resolve, reject) => {
        context.signal.addEventListener('abort', () => reject(context.signal.reason), { once: true })
      })
    }
  }
}

const PROBE_PARAMETERS = { type: 'object', properties: { k: { type: 'string' } }, required: ['k'] }

async function registerProbes (tp: Toolport, role: string, probe: Probe): Promise<void> {
  const handler = probeHandler(probe)
  await tp.roles.get(role).registerLocalTool({ name: 'probe', description: 'answers as told', parameters: PROBE_PARAMETERS, handler })
  await tp.roles.get(role).registerLocalTool({
    name: 'probe_short', description: 'answers as told, short deadline', parameters: PROBE_PARAMETERS, handler, timeoutSeconds: SHORT_SECONDS
  })
}

/** The ToolResult's documented properties that a JSON wire carries. */
function wireView (result: ToolResult): Json {
  return { is_error: result.is_error, text: result.text, error: result.error, images: result.images }
}

/** What `JSON.parse(text)` is, or a marker when the text is no JSON. */
function parsedText (text: string): { ok: boolean, value?: unknown } {
  try { return { ok: true, value: JSON.parse(text) } } catch { return { ok: false } }
}

/** Whether two JSON values are equal (compared as their JSON: deep values overflow isDeepStrictEqual). */
function sameJson (a: unknown, b: unknown): boolean {
  try { return JSON.stringify(a) === JSON.stringify(b) } catch { return false }
}

/**
 * Checks one behaviour's result at every exit against the library's result and the documented
 * rules; returns a list of problems (empty when all is well).
 */
async function checkAllExits (exits: Exits, probe: Probe, behaviour: Behaviour): Promise<string[]> {
  const problems: string[] = []
  const key = `k${++serial}`
  probe.behaviours.set(key, behaviour)
  const tool = behaviour.mode === 'hang' || behaviour.mode === 'hang_observe' ? 'probe_short' : 'probe'
  const args = { k: key }
  const raw = JSON.stringify(args)
  // 1. the library
  const lib = await within(exits.tp.callTool('A', { name: tool, call_id: `lib_${key}`, arguments: args }), `callTool ${behaviour.label}`, GUARD_MS)
  // Documented shape of a ToolResult (docs/protocol.md "Model-visible result").
  if (typeof lib.text !== 'string') problems.push(`lib: text is ${typeof lib.text}`)
  if (lib.is_error) {
    if (lib.output !== null) problems.push(`lib: an error's output is ${String(lib.output)}, not null`)
    if (lib.text !== JSON.stringify({ error: lib.error })) problems.push(`lib: error text ${lib.text} is not {"error": …}`)
  }
  // The model a host reads in the docs for the handler's own outcome.
  expectOutcome(behaviour, lib, problems)
  // 2. POST /api/tools/call
  const http = await within(httpCall(exits.url, { role: 'A', name: tool, call_id: `http_${key}`, raw_arguments: raw }), `HTTP ${behaviour.label}`, GUARD_MS)
  if (http.status !== 200) {
    problems.push(`HTTP: status ${http.status} ${http.raw.slice(0, 200)}`)
  } else {
    const body = http.body as Json
    if (!isDeepStrictEqual(wireView(body as ToolResult), wireView(lib))) {
      problems.push(`HTTP result ${JSON.stringify(wireView(body as ToolResult)).slice(0, 300)} differs from callTool's ${JSON.stringify(wireView(lib)).slice(0, 300)}`)
    }
    if (!Object.hasOwn(body, 'output')) problems.push('HTTP: no output member')
    if (!body.is_error) {
      // "Success: text is output as-is when it is a string, else its JSON."
      if (typeof body.output === 'string') {
        if (body.text !== body.output) problems.push(`HTTP: string output ${JSON.stringify(body.output).slice(0, 80)} but text ${JSON.stringify(body.text).slice(0, 80)}`)
      } else {
        const p = parsedText(body.text)
        if (!p.ok || !sameJson(p.value, body.output)) problems.push(`HTTP: text ${String(body.text).slice(0, 80)} is not the JSON of output ${JSON.stringify(body.output)?.slice(0, 80)}`)
      }
    } else if (body.output !== null) {
      problems.push('HTTP: an error result with a non-null output')
    }
  }
  // 3. MCP tools/call through the SDK client
  let mcp: any
  try {
    mcp = await within(exits.mcp.callTool({ name: tool, arguments: args }), `MCP ${behaviour.label}`, GUARD_MS)
  } catch (err) {
    problems.push(`MCP: tools/call failed instead of answering a result: ${(err as Error).message.slice(0, 300)}`)
  }
  if (mcp !== undefined) {
    const text = mcp.content?.[0]?.type === 'text' ? mcp.content[0].text : undefined
    if (text !== lib.text) problems.push(`MCP text ${JSON.stringify(text)?.slice(0, 200)} differs from ${JSON.stringify(lib.text).slice(0, 200)}`)
    if (mcp.isError !== lib.is_error) problems.push(`MCP isError ${String(mcp.isError)} but callTool is_error ${String(lib.is_error)}`)
    if (mcp.content?.length !== 1) problems.push(`MCP: ${String(mcp.content?.length)} content items`)
    // structuredContent "when the output is a JSON object without a top-level __proto__ key".
    if (mcp.structuredContent !== undefined) {
      const p = parsedText(lib.text)
      if (lib.is_error || !p.ok || !sameJson(mcp.structuredContent, p.value)) {
        problems.push(`MCP structuredContent ${JSON.stringify(mcp.structuredContent)?.slice(0, 120)} is not the output the text says`)
      }
    }
  }
  // 4. Realtime
  const items = await within(realtimeCall(exits, tool, raw), `Realtime ${behaviour.label}`, GUARD_MS)
  if (items.length !== 1) problems.push(`Realtime: ${items.length} function_call_output items for one call`)
  else if (items[0]?.item.output !== lib.text) problems.push(`Realtime output ${JSON.stringify(items[0]?.item.output).slice(0, 200)} differs from ${JSON.stringify(lib.text).slice(0, 200)}`)
  // 5. the provider helpers carry the text as it is
  const anthropic = toolResultBlock(lib, 'anthropic', 'tu_1')
  if (anthropic.content !== lib.text || (anthropic.is_error === true) !== lib.is_error) problems.push('toolResultBlock anthropic differs')
  if (toolResultBlock(lib, 'openai-chat', 'c').content !== lib.text) problems.push('toolResultBlock openai-chat differs')
  // The handler ran once per exit.
  const ran = probe.invocations.get(key) ?? 0
  if (ran !== 4) problems.push(`the handler ran ${ran} times for 4 calls`)
  probe.behaviours.delete(key)
  probe.invocations.delete(key)
  probe.signals.delete(key)
  return problems
}

/** The outcome the docs lead a host to expect of its handler. */
function expectOutcome (b: Behaviour, lib: ToolResult, problems: string[]): void {
  if (b.mode === 'hang' || b.mode === 'hang_observe') {
    if (!lib.is_error || !/timed out/.test(lib.error ?? '')) problems.push(`lib: a handler past its deadline answered ${lib.text.slice(0, 120)}`)
    return
  }
  if (b.mode === 'throw' || b.mode === 'reject') {
    if (!lib.is_error) { problems.push('lib: a throwing handler answered a success'); return }
    const thrown = b.make()
    // "a throw becomes a tool error result": its message, the string thrown.
    if (thrown instanceof Error && thrown.message !== '' && lib.error !== thrown.message) problems.push(`lib: error ${JSON.stringify(lib.error)} is not the thrown message ${JSON.stringify(thrown.message)}`)
    if (typeof thrown === 'string' && thrown !== '' && lib.error !== thrown) problems.push(`lib: error ${JSON.stringify(lib.error)} is not the thrown string`)
    if (typeof lib.error !== 'string') problems.push('lib: error is not a string')
    return
  }
  const v = b.make()
  let json: string | undefined
  try {
    json = typeof v === 'string' ? undefined : JSON.stringify(v)
  } catch {
    // README "Embedding": a value JSON cannot encode (a BigInt, a cycle, too deep) is a tool error.
    if (!lib.is_error || !/cannot be encoded as JSON/.test(lib.error ?? '')) problems.push(`lib: an output JSON cannot encode answered ${lib.text.slice(0, 120)}`)
    return
  }
  if (lib.is_error) { problems.push(`lib: a returning handler answered an error ${lib.text.slice(0, 120)}`); return }
  if (typeof v === 'string') {
    if (lib.text !== v) problems.push('lib: a string output is not the text as-is')
    return
  }
  // The output is the JSON value JSON.stringify makes (undefined: null); a string one is the text
  // as-is, any other the text is its JSON.
  const output: unknown = json === undefined ? null : JSON.parse(json)
  const text = typeof output === 'string' ? output : JSON.stringify(output)
  if (lib.text !== text) problems.push(`lib: text ${lib.text.slice(0, 80)} is not the output's JSON ${text.slice(0, 80)}`)
  if (!sameJson(lib.output as Json, output as Json)) problems.push('lib: output is not the JSON value of what the handler returned')
}

test('property: a local tool answers the same ToolResult at every exit (callTool, POST /api/tools/call, MCP, Realtime), once each', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  const probe: Probe = { behaviours: new Map(), invocations: new Map(), signals: new Map() }
  await registerProbes(tp, 'A', probe)
  const exits = await openExits(t, tp, url, 'A')
  const behavioursArb = fc.limitShrink(fc.array(behaviourArb, { minLength: 1, maxLength: 4 }), MAX_SHRINKS)
  await fc.assert(fc.asyncProperty(behavioursArb, async (behaviours) => {
    for (const b of behaviours) {
      const problems = await checkAllExits(exits, probe, b)
      assert.deepEqual(problems, [], `${b.label}: ${problems.join('; ')}`)
    }
  }), { numRuns: runs(25), includeErrorInReport: true })
})

// ---------------------------------------------------------------------------------------------
// Deadlines and cancellation of local tools.

interface TimedCall {
  /** Index into DEADLINES: the tool's timeoutSeconds. */
  deadline: number
  delayMs: number
  /** The handler rejects with its signal's reason when the signal aborts. */
  observe: boolean
  fails: boolean
  /** The caller aborts this many ms after calling; null: never; -1: before calling. */
  abortAt: number | null
}

const DEADLINES = [0.005, 0.02, 0.05, 30] as const

const timedCallArb: fc.Arbitrary<TimedCall> = fc.record({
  deadline: fc.integer({ min: 0, max: DEADLINES.length - 1 }),
  delayMs: fc.integer({ min: 0, max: 60 }),
  observe: fc.boolean(),
  fails: fc.boolean(),
  abortAt: fc.option(fc.integer({ min: -1, max: 60 }), { nil: null })
})

test('property: a local tool call with a random deadline and cancellation is answered once: its own result, a timeout or a cancellation, its signal aborted for that reason', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const { tp } = await startToolport(t, { roles: ['A'] })
  const seen = new Map<string, { signal: AbortSignal, count: number }>()
  const plan = new Map<string, TimedCall>()
  for (const [i, seconds] of DEADLINES.entries()) {
    await tp.roles.get('A').registerLocalTool({
      name: `timed_${i}`,
      timeoutSeconds: seconds,
      parameters: PROBE_PARAMETERS,
      handler: async (args, { signal }) => {
        const key = (args as { k: string }).k
        const entry = seen.get(key)
        seen.set(key, { signal, count: (entry?.count ?? 0) + 1 })
        const call = plan.get(key) as TimedCall
        await new Promise<void>((resolve, reject) => {
          const timer = setTimeout(resolve, call.delayMs)
          if (call.observe) {
            signal.addEventListener('abort', () => { clearTimeout(timer); reject(signal.reason) }, { once: true })
          }
        })
        if (call.fails) throw new Error(`failed ${key}`)
        return { done: key }
      }
    })
  }
  const finished = new Map<string, Array<{ isError: boolean, outcome: string }>>()
  tp.on('call-finished', (e) => {
    const list = finished.get(e.callId) ?? []
    list.push({ isError: e.isError, outcome: e.outcome })
    finished.set(e.callId, list)
  })
  await fc.assert(fc.asyncProperty(fc.array(timedCallArb, { minLength: 1, maxLength: 6 }), async (calls) => {
    const keys = calls.map(() => `t${++serial}`)
    const answers = new Map<string, number>()
    const results = await within(Promise.all(calls.map(async (call, i) => {
      const key = keys[i] as string
      plan.set(key, call)
      const controller = new AbortController()
      if (call.abortAt === -1) controller.abort()
      else if (call.abortAt !== null) setTimeout(() => controller.abort(), call.abortAt)
      const result = await tp.callTool('A', { name: `timed_${call.deadline}`, call_id: key, arguments: { k: key } }, { signal: controller.signal })
      answers.set(key, (answers.get(key) ?? 0) + 1)
      return result
    })), 'the timed calls', GUARD_MS)
    // A handler signal aborted after its call was answered would show now (its timer was cleared).
    await sleep(70)
    for (const [i, call] of calls.entries()) {
      const key = keys[i] as string
      const result = results[i] as ToolResult
      const tool = `timed_${call.deadline}`
      const what = `${key} ${JSON.stringify(call)} → ${result.text}`
      assert.equal(answers.get(key), 1, `${what}: answered ${String(answers.get(key))} times`)
      const ends = finished.get(key) ?? []
      assert.equal(ends.length, 1, `${what}: ${ends.length} call-finished events`)
      assert.equal(ends[0]?.isError, result.is_error, `${what}: call-finished isError`)
      const natural = call.fails
        ? { is_error: true, output: null, error: `failed ${key}`, text: JSON.stringify({ error: `failed ${key}` }) }
        : { is_error: false, output: { done: key }, text: JSON.stringify({ done: key }) }
      const timedOut = `tool '${tool}' timed out after ${DEADLINES[call.deadline]} s`
      const cancelled = `tool '${tool}' call was cancelled`
      // As for a callback call: a deadline is `timeout`, a cancellation `cancelled`.
      const outcome = result.error === timedOut
        ? 'timeout'
        : result.error === cancelled ? 'cancelled' : result.is_error ? 'local_error' : 'ok'
      assert.equal(ends[0]?.outcome, outcome, `${what}: call-finished outcome`)
      const ran = seen.get(key)
      if (call.abortAt === -1) {
        assert.equal(result.error, cancelled, `${what}: a call cancelled before it started`)
        assert.equal(ran, undefined, `${what}: the handler of a call cancelled before it started ran`)
        continue
      }
      assert.equal(ran?.count, 1, `${what}: the handler ran ${String(ran?.count)} times`)
      const signal = ran?.signal as AbortSignal
      if (result.error === timedOut) {
        assert.equal(result.output, null)
        assert.equal(result.text, JSON.stringify({ error: timedOut }))
        assert.equal(signal.aborted, true, `${what}: a timed-out handler's signal is not aborted`)
        assert.equal((signal.reason as DOMException).name, 'TimeoutError', `${what}: signal reason`)
      } else if (result.error === cancelled) {
        assert.notEqual(call.abortAt, null, `${what}: cancelled without a cancellation`)
        assert.equal(result.text, JSON.stringify({ error: cancelled }))
        assert.equal(signal.aborted, true, `${what}: a cancelled handler's signal is not aborted`)
        assert.equal((signal.reason as DOMException).name, 'AbortError', `${what}: signal reason`)
      } else {
        assert.deepEqual({ ...result }, natural, `${what}: neither its own result, a timeout nor a cancellation`)
        assert.equal(signal.aborted, false, `${what}: the handler's signal aborted after its own result was answered`)
      }
      // With the long deadline and no cancellation, nothing but the handler can answer.
      if (call.deadline === DEADLINES.length - 1 && call.abortAt === null) {
        assert.deepEqual({ ...result }, natural, what)
      }
      plan.delete(key)
      seen.delete(key)
      finished.delete(key)
    }
  }), { numRuns: runs(30), includeErrorInReport: true })
})

// ---------------------------------------------------------------------------------------------
// A local tool and a plugin tool of the same name.

const NAMES = ['t1', 't2'] as const
const ROLES = ['A', 'B'] as const
const SOURCES = ['plugin:p1', 'plugin:p2'] as const
const KEYS: Record<string, string> = { K1: 'k1-'.padEnd(40, 'x'), K2: 'k2-'.padEnd(40, 'y') }

type Op =
  | { op: 'local', role: string, name: string, source: string }
  | { op: 'unlocal', role: string, name: string }
  | { op: 'register', name: string, role: string | null, source: string, key: string }
  | { op: 'unregister', name: string, role: string | null, expected: string | undefined, key: string }
  | { op: 'clear', source: string, role: string | null, key: string }
  | { op: 'call', role: string, name: string }

const roleOrNull = fc.option(fc.constantFrom<string>(...ROLES), { nil: null })
const opArb: fc.Arbitrary<Op> = fc.oneof(
  fc.record({ op: fc.constant('local' as const), role: fc.constantFrom<string>(...ROLES), name: fc.constantFrom<string>(...NAMES), source: fc.constantFrom('local', 'plugin:p1') }),
  fc.record({ op: fc.constant('unlocal' as const), role: fc.constantFrom<string>(...ROLES), name: fc.constantFrom<string>(...NAMES) }),
  fc.record({ op: fc.constant('register' as const), name: fc.constantFrom<string>(...NAMES), role: roleOrNull, source: fc.constantFrom<string>(...SOURCES), key: fc.constantFrom('K1', 'K2') }),
  fc.record({ op: fc.constant('unregister' as const), name: fc.constantFrom<string>(...NAMES), role: roleOrNull, expected: fc.option(fc.constantFrom<string>(...SOURCES), { nil: undefined }), key: fc.constantFrom('K1', 'K2') }),
  fc.record({ op: fc.constant('clear' as const), source: fc.constantFrom<string>(...SOURCES), role: roleOrNull, key: fc.constantFrom('K1', 'K2') }),
  fc.record({ op: fc.constant('call' as const), role: fc.constantFrom<string>(...ROLES), name: fc.constantFrom<string>(...NAMES) })
)

interface ModelTool { local: boolean, source: string }

/** docs/protocol.md R5, R15–R18 and "Ownership mode", for local and plugin tools. */
class OwnershipModel {
  readonly roles = new Map<string, Map<string, ModelTool>>(ROLES.map((r) => [r, new Map()]))
  readonly owners = new Map<string, string>()
  constructor (readonly ownership: boolean) {}

  targets (role: string | null): string[] { return role === null ? [...ROLES] : [role] }

  set (role: string, name: string, tool: ModelTool): void {
    const tools = this.roles.get(role) as Map<string, ModelTool>
    tools.delete(name) // a replaced tool moves to the end (R5 Decided)
    tools.set(name, tool)
  }

  hasTools (source: string): boolean {
    return [...this.roles.values()].some((tools) => [...tools.values()].some((t) => t.source === source))
  }

  bound (source: string): string | undefined {
    if (!this.hasTools(source)) this.owners.delete(source)
    return this.owners.get(source)
  }

  allows (source: string, key: string): boolean {
    const bound = this.bound(source)
    return bound === undefined || bound === key
  }
}

function pluginServer (t: TestContext): Promise<string> {
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume()
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ output: `remote${decodeURIComponent(req.url ?? '')}` }))
    })
  })
  t.after(() => new Promise<void>((resolve) => { server.closeAllConnections(); server.close(() => resolve()) }))
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}`)))
}

async function api (url: string, method: 'GET' | 'POST', path: string, body?: unknown, key?: string): Promise<{ status: number, body: any }> {
  const headers: Record<string, string> = {}
  if (body !== undefined) headers['content-type'] = 'application/json'
  if (key !== undefined) headers['x-toolport-plugin-key'] = key
  const res = await httpRequest(`${url}${path}`, { method, headers, ...(body === undefined ? {} : { body: JSON.stringify(body) }) })
  const text = await res.body.text()
  return { status: res.statusCode, body: text === '' ? undefined : JSON.parse(text) }
}

test('property: local tools and plugin tools of the same names follow R5, R15–R18 and ownership mode, over HTTP and the library', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const plugin = await pluginServer(t)
  const opsArb = fc.limitShrink(fc.array(opArb, { minLength: 1, maxLength: 14 }), MAX_SHRINKS)
  await fc.assert(fc.asyncProperty(fc.boolean(), opsArb, async (ownership, ops) => {
    // A fresh Toolport per run: bindings of ownership mode must not carry from one run to the next.
    const tp = await createToolport({ logger: false, roles: [...ROLES], dispatch: { mode: 'inline' }, security: { enforceOwnership: ownership } })
    try {
      const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
      await runOwnershipOps(tp, url, plugin, ownership, ops)
    } finally {
      await tp.close()
    }
  }), { numRuns: runs(40), includeErrorInReport: true })
})

async function runOwnershipOps (tp: Toolport, url: string, plugin: string, ownership: boolean,
  ops: Op[]): Promise<void> {
  const model = new OwnershipModel(ownership)
  for (const [step, op] of ops.entries()) {
    const what = `step ${step} ${JSON.stringify(op)} (ownership ${String(ownership)})`
    switch (op.op) {
      case 'local': {
        // A binding whose tools are all gone has ended: the host's tool does not bring it back.
        model.bound(op.source)
        const outcome = await tp.roles.get(op.role).registerLocalTool({
          name: op.name, source: op.source, handler: () => `local/${op.role}/${op.name}/${op.source}`
        })
        assert.equal(outcome.ok, true, what)
        model.set(op.role, op.name, { local: true, source: op.source })
        break
      }
      case 'unlocal': {
        const outcome = await tp.roles.get(op.role).unregisterLocalTool(op.name)
        const tools = model.roles.get(op.role) as Map<string, ModelTool>
        const was = tools.get(op.name)
        assert.equal(outcome.removed, was?.local === true, `${what}: removed`)
        if (was?.local === true) tools.delete(op.name)
        break
      }
      case 'register': {
        const key = ownership ? KEYS[op.key] : undefined
        const res = await api(url, 'POST', '/api/tools/register', {
          name: op.name, role: op.role, source: op.source, callback_url: `${plugin}/${op.source}/${op.name}`
        }, key)
        if (ownership && !model.allows(op.source, op.key)) {
          assert.equal(res.status, 403, `${what}: ${JSON.stringify(res.body)}`)
          assert.equal(res.body.code, 'TP_ERR_NOT_OWNER', what)
          break
        }
        assert.equal(res.status, 200, `${what}: ${JSON.stringify(res.body)}`)
        const accepted: string[] = []
        const failed: Array<{ role: string, owned_by: string }> = []
        for (const role of model.targets(op.role)) {
          const existing = model.roles.get(role)?.get(op.name)
          if (existing?.local === true || (ownership && existing !== undefined && existing.source !== op.source)) {
            failed.push({ role, owned_by: (existing as ModelTool).source })
            continue
          }
          model.set(role, op.name, { local: false, source: op.source })
          accepted.push(role)
        }
        if (ownership && accepted.length > 0 && model.bound(op.source) === undefined) {
          model.owners.set(op.source, op.key)
        }
        assert.equal(res.body.ok, accepted.length > 0, `${what}: ok ${JSON.stringify(res.body)}`)
        assert.deepEqual(res.body.affected_roles, accepted, `${what}: affected_roles`)
        assert.deepEqual(res.body.failed_roles.map((f: Json) => ({ role: f.role, owned_by: f.owned_by })), failed, `${what}: failed_roles`)
        break
      }
      case 'unregister': {
        const key = ownership ? KEYS[op.key] : undefined
        const res = await api(url, 'POST', '/api/tools/unregister', {
          name: op.name, role: op.role, ...(op.expected === undefined ? {} : { expected_source: op.expected })
        }, key)
        assert.equal(res.status, 200, `${what}: ${JSON.stringify(res.body)}`)
        const removed: string[] = []
        const refused: Array<{ role: string, owned_by: string }> = []
        for (const role of model.targets(op.role)) {
          const tools = model.roles.get(role) as Map<string, ModelTool>
          const existing = tools.get(op.name)
          if (existing === undefined) continue
          if (existing.local || (op.expected !== undefined && existing.source !== op.expected) ||
            (ownership && !model.allows(existing.source, op.key))) {
            refused.push({ role, owned_by: existing.source })
            continue
          }
          tools.delete(op.name)
          removed.push(role)
        }
        assert.equal(res.body.removed, removed.length > 0, `${what}: removed ${JSON.stringify(res.body)}`)
        assert.deepEqual(res.body.affected_roles, removed, `${what}: affected_roles`)
        assert.deepEqual(res.body.refused_roles, refused, `${what}: refused_roles`)
        break
      }
      case 'clear': {
        const key = ownership ? KEYS[op.key] : undefined
        const res = await api(url, 'POST', '/api/tools/clear', { source: op.source, role: op.role }, key)
        if (ownership && !model.allows(op.source, op.key)) {
          assert.equal(res.status, 403, `${what}: ${JSON.stringify(res.body)}`)
          break
        }
        assert.equal(res.status, 200, `${what}: ${JSON.stringify(res.body)}`)
        let removed = 0
        for (const role of model.targets(op.role)) {
          const tools = model.roles.get(role) as Map<string, ModelTool>
          for (const [name, tool] of [...tools]) {
            if (!tool.local && tool.source === op.source) { tools.delete(name); removed++ }
          }
        }
        assert.equal(res.body.removed, removed, `${what}: removed ${JSON.stringify(res.body)}`)
        break
      }
      case 'call': {
        const res = await httpCall(url, { role: op.role, name: op.name, arguments: {} })
        const tool = model.roles.get(op.role)?.get(op.name)
        const lib = await tp.callTool(op.role, { name: op.name, arguments: {} })
        for (const [exit, result] of [['HTTP', res.body], ['callTool', lib]] as const) {
          if (tool === undefined) {
            assert.equal(result.is_error, true, `${what}: ${exit} ${JSON.stringify(result)}`)
            assert.match(result.error, /unknown tool/, `${what}: ${exit}`)
          } else {
            assert.equal(result.text, tool.local ? `local/${op.role}/${op.name}/${tool.source}` : `remote/${tool.source}/${op.name}`,
              `${what}: ${exit} answered by the wrong tool`)
          }
        }
        break
      }
    }
    // GET /api/tools and the library's list agree with the model (R18: registration order).
    const listed = await api(url, 'GET', '/api/tools')
    for (const role of ROLES) {
      const expected = [...(model.roles.get(role) as Map<string, ModelTool>)].map(([name, tool]) => ({
        name, source: tool.source, is_remote: !tool.local, callback_url: tool.local ? null : `${plugin}/${tool.source}/${name}`
      }))
      const view = (rows: Json[]): Json[] => rows.map((r) => ({
        name: r.name, source: r.source, is_remote: r.is_remote, callback_url: r.callback_url
      }))
      assert.deepEqual(view(listed.body.tools_by_role[role]), expected, `${what}: GET /api/tools of ${role}`)
      assert.deepEqual(view(tp.list(role).tools_by_role[role] as unknown as Json[]), expected, `${what}: tp.list(${role})`)
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Definitions for a host's own LLM loop.

const FORMATS = ['openai-chat', 'openai-realtime', 'anthropic', 'gemini', 'mcp'] as const
type Format = typeof FORMATS[number]

/** Property names of the generated schemas (no `__proto__`: fastify refuses it in a body). */
const keyArb = fc.oneof(fc.string({ unit: 'grapheme', minLength: 1, maxLength: 12 }), fc.constantFrom('location', 'a', 'toString', 'constructor'))
  .filter((k) => k !== '__proto__')

/** A subschema Toolport accepts (2020-12, draft-07 or 2019-09 alike). */
const leafSchemaArb: fc.Arbitrary<unknown> = fc.letrec((tie) => ({
  leaf: fc.oneof(
    {
      weight: 4,
      arbitrary: fc.oneof(
        fc.record({ type: fc.constant('string'), maxLength: fc.integer({ min: 0, max: 100 }) }, { requiredKeys: ['type'] }),
        fc.record({ type: fc.constantFrom('integer', 'number'), minimum: fc.integer({ min: -5, max: 5 }) }, { requiredKeys: ['type'] }),
        fc.constant({ type: 'boolean' }),
        fc.record({ enum: fc.uniqueArray(fc.oneof(fc.string({ maxLength: 5 }), fc.integer(), fc.constant(null)), { minLength: 1, maxLength: 4, comparator: 'SameValueZero' }) }),
        fc.record({ type: fc.constant('string'), pattern: fc.constantFrom('^[a-z]+$', '\\d{3}', '^\\p{L}*$') }),
        fc.record({ type: fc.constant('string'), format: fc.constantFrom('email', 'date-time', 'uuid') }),
        fc.record({ description: fc.string({ unit: 'grapheme', maxLength: 30 }) })
      )
    },
    // Boolean subschemas (valid in every dialect); a known bug drops the `properties` holding one.
    { weight: SKIP_KNOWN_BUGS ? 0 : 1, arbitrary: fc.constantFrom(true, false) },
    { weight: 1, arbitrary: fc.record({ type: fc.constant('array'), items: tie('leaf') }) },
    // An array schema without `items` (Python's bare `list`): providers get `items: {}`.
    { weight: 1, arbitrary: fc.constantFrom({ type: 'array' }, { type: ['array', 'null'] }) },
    { weight: 1, arbitrary: fc.record({ type: fc.constant('object'), properties: fc.dictionary(keyArb, tie('leaf'), { maxKeys: 3 }) }) }
  )
})).leaf

/** A `parameters` schema Toolport accepts: mostly object roots, some without `type`, some other roots. */
const parametersArb: fc.Arbitrary<Json> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.dictionary(keyArb, leafSchemaArb, { maxKeys: 5 }).chain((properties) => fc.record({
      type: fc.constant('object'),
      properties: fc.constant(properties),
      required: fc.subarray(Object.keys(properties)),
      additionalProperties: fc.boolean(),
      $schema: fc.constantFrom('https://json-schema.org/draft/2020-12/schema', 'http://json-schema.org/draft-07/schema#', 'https://json-schema.org/draft/2019-09/schema'),
      description: fc.string({ unit: 'grapheme', maxLength: 40 })
    }, { requiredKeys: ['type', 'properties'] }))
  },
  { weight: 1, arbitrary: fc.constant({}) },
  { weight: 1, arbitrary: fc.constant({ type: 'object' }) },
  { weight: 1, arbitrary: fc.dictionary(keyArb, leafSchemaArb, { maxKeys: 3 }).map((properties) => ({ properties })) },
  { weight: 1, arbitrary: fc.constant({ type: ['object', 'null'], properties: { q: { type: 'string' } } }) },
  { weight: 1, arbitrary: fc.constant({ anyOf: [{ type: 'object', required: ['a'] }, { type: 'object', required: ['b'] }] }) },
  // zod's unions: a root oneOf/anyOf of object branches, which OpenAI and Anthropic refuse.
  {
    weight: 1,
    arbitrary: fc.tuple(fc.constantFrom('anyOf', 'oneOf', 'allOf'), fc.array(fc.dictionary(keyArb, leafSchemaArb, { maxKeys: 3 }), { minLength: 1, maxLength: 3 }))
      .chain(([key, branchProperties]) => fc.tuple(...branchProperties.map((props) => fc.subarray(Object.keys(props))))
        .map((requireds) => ({
          [key]: branchProperties.map((properties, i) => ({ type: 'object', properties, required: requireds[i], additionalProperties: false }))
        })))
  },
  { weight: 1, arbitrary: fc.constant({ $defs: { s: { type: 'string' } }, type: 'object', properties: { s: { $ref: '#/$defs/s' } } }) }
)

/** Tool names: any code points, 1–64 of them (R7), some the longest allowed. */
const nameArb = fc.oneof(
  fc.string({ unit: 'binary', minLength: 1, maxLength: 64 }),
  fc.string({ unit: 'grapheme-ascii', minLength: 1, maxLength: 64 }),
  fc.stringMatching(/^[a-zA-Z0-9_-]{1,64}$/),
  fc.string({ unit: fc.constantFrom('😀', 'é', '中', 'a'), minLength: 64, maxLength: 64 })
)

const descriptionArb = fc.oneof(
  { weight: 4, arbitrary: fc.string({ unit: 'grapheme', maxLength: 80 }) },
  { weight: 1, arbitrary: fc.string({ unit: 'binary', maxLength: 80 }) },
  { weight: 1, arbitrary: fc.integer({ min: 1000, max: 16 * 1024 }).map((n) => '説明'.repeat(n).slice(0, n)) }
)

interface DefTool { name: string, description: string, parameters: Json, local: boolean, role: string | null }

const registryArb: fc.Arbitrary<DefTool[]> = fc.uniqueArray(fc.record({
  name: nameArb,
  description: descriptionArb,
  parameters: parametersArb,
  local: fc.boolean(),
  role: fc.constantFrom<string | null>(null, 'D')
}), { maxLength: 7, selector: (t) => t.name })

/**
 * The schema the docs promise the provider sees ("Definitions for your own LLM loop"): an object
 * root as it is; else that with `type: 'object'`, a root `anyOf`/`oneOf`/`allOf` merged into its
 * properties and required, `items: {}` on arrays without `items`, property schemas `true`/`false`
 * in object form (`{}`, `{"not": {}}`).
 */
function expectedSchema (parameters: Json): Json {
  const props = parameters.properties
  const hasBoolean = props !== null && typeof props === 'object' && !Array.isArray(props) &&
    Object.values(props).some((child) => typeof child === 'boolean')
  const combinators = (['allOf', 'anyOf', 'oneOf'] as const).filter((key) => parameters[key] !== undefined)
  if (parameters.type === 'object' && !hasBoolean && combinators.length === 0 && !hasItemlessArray(parameters)) return parameters
  const schema: Json = withItems({ ...parameters, type: 'object' })
  for (const key of combinators) {
    const branches = schema[key] as Json[]
    delete schema[key]
    const properties: Json = { ...(schema.properties ?? {}) }
    // A name several branches give differently is each of them: anyOf (allOf under allOf).
    const forms = new Map<string, Json[]>()
    for (const branch of branches) {
      for (const [name, raw] of Object.entries(branch.properties ?? {})) {
        const child: Json = typeof raw === 'boolean' ? (raw ? {} : { not: {} }) : raw as Json
        const list = forms.get(name) ?? []
        if (!list.some((seen) => JSON.stringify(seen) === JSON.stringify(child))) list.push(child)
        forms.set(name, list)
      }
    }
    for (const [name, list] of forms) properties[name] = list.length === 1 ? list[0] : { [key === 'allOf' ? 'allOf' : 'anyOf']: list }
    const requireds = branches.map((branch) => (branch.required ?? []) as string[])
    const required = key === 'allOf' ? requireds.flat() : requireds[0]!.filter((name) => requireds.every((r) => r.includes(name)))
    if (Object.keys(properties).length > 0) schema.properties = properties
    if (required.length > 0) schema.required = [...new Set([...(schema.required ?? []), ...required])]
  }
  if (schema.properties !== null && typeof schema.properties === 'object' && !Array.isArray(schema.properties)) {
    schema.properties = Object.fromEntries(Object.entries(schema.properties as Json).map(([name, child]) =>
      [name, typeof child === 'boolean' ? (child ? {} : { not: {} }) : child]))
  }
  return schema
}

/** Whether an array schema without `items` sits anywhere in `schema` (as the generators nest them). */
function hasItemlessArray (schema: Json): boolean {
  return JSON.stringify(withItems(schema)) !== JSON.stringify(schema)
}

/** A copy of `schema` with `items: {}` on every array schema without one (the generators' nesting). */
function withItems (schema: Json): Json {
  if (schema === null || typeof schema !== 'object' || Array.isArray(schema)) return schema
  const out: Json = {}
  for (const [key, value] of Object.entries(schema)) {
    if (key === 'properties' && value !== null && typeof value === 'object') {
      out[key] = Object.fromEntries(Object.entries(value as Json).map(([name, child]) => [name, withItems(child)]))
    } else if (key === 'items' || key === '$defs') {
      out[key] = key === 'items' ? withItems(value) : Object.fromEntries(Object.entries(value as Json).map(([n, c]) => [n, withItems(c)]))
    } else if (['allOf', 'anyOf', 'oneOf'].includes(key) && Array.isArray(value)) {
      out[key] = value.map(withItems)
    } else {
      out[key] = value
    }
  }
  const type = out.type
  if ((type === 'array' || (Array.isArray(type) && type.includes('array'))) && out.items === undefined) out.items = {}
  return out
}

/** The README's table ("Definitions for your own LLM loop"), built from the registry's tools in order. */
function expectedDefinitions (format: Format,
  tools: Array<{ name: string, description: string, parameters: Json }>): unknown[] {
  const rows = tools.map((t) => ({ name: t.name, description: t.description, schema: expectedSchema(t.parameters) }))
  switch (format) {
    case 'openai-chat': return rows.map((r) => ({ type: 'function', function: { name: r.name, description: r.description, parameters: r.schema } }))
    case 'openai-realtime': return rows.map((r) => ({ type: 'function', name: r.name, description: r.description, parameters: r.schema }))
    case 'anthropic': return rows.map((r) => ({ name: r.name, description: r.description, input_schema: r.schema }))
    case 'gemini': return rows.length === 0 ? [] : [{ functionDeclarations: rows.map((r) => ({ name: r.name, description: r.description, parametersJsonSchema: r.schema })) }]
    case 'mcp': return rows.map((r) => ({ name: r.name, description: r.description, inputSchema: r.schema }))
  }
}

/** The name each definition of a format carries, in order. */
function definitionNames (format: Format, tools: any[]): string[] {
  switch (format) {
    case 'openai-chat': return tools.map((t) => t.function.name)
    case 'gemini': return tools.length === 0 ? [] : tools[0].functionDeclarations.map((d: Json) => d.name)
    default: return tools.map((t) => t.name)
  }
}

/** A JSON value as plain data (frozen objects and prototypes aside), for deepStrictEqual (key order aside). */
function canon (value: unknown): unknown {
  return JSON.parse(JSON.stringify(value))
}

async function getRaw (url: string): Promise<{ status: number, length: string | undefined, raw: Buffer }> {
  const res = await httpRequest(url)
  const raw = Buffer.from(await res.body.arrayBuffer())
  return { status: res.statusCode, length: res.headers['content-length'] as string | undefined, raw }
}

test('property: definitions of random registries agree in every format with toolDefinitions, GET /api/tools, MCP tools/list and Realtime, stream exactly and keep the documented shape', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['D', 'E'] })
  const mcp = new Client({ name: 'definitions-properties', version: '1.0.0' })
  await mcp.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/D`)))
  t.after(() => mcp.close())
  // A Realtime session of role D; its provider acks each session.update at once.
  const updates: Json[] = []
  let realtime: RealtimeSession | null = null
  realtime = createRealtimeSession({
    toolport: tp,
    role: 'D',
    send: (event: Json) => {
      if (event.type !== 'session.update') return
      updates.push(event)
      setImmediate(() => realtime?.handleServerEvent(JSON.stringify({ type: 'session.updated', session: event.session })))
    }
  })
  t.after(() => realtime?.close())
  await tp.roles.get('D').sync()
  await fc.assert(fc.asyncProperty(fc.limitShrink(registryArb, MAX_SHRINKS), async (registry) => {
    const role = tp.roles.get('D')
    // A clean slate.
    for (const r of [role, tp.roles.get('E')]) {
      for (const name of r.registry.names()) {
        const entry = r.registry.get(name)
        if (entry?.isRemote === false) await r.unregisterLocalTool(name)
        else await tp.unregister({ name, role: r.name })
      }
    }
    for (const tool of registry) {
      if (tool.local) {
        const outcome = await role.registerLocalTool({
          name: tool.name,
          description: tool.description,
          parameters: structuredClone(tool.parameters),
          handler: () => null
        })
        assert.equal(outcome.ok, true)
      } else {
        const res = await api(url, 'POST', '/api/tools/register', {
          name: tool.name, description: tool.description, parameters: tool.parameters, role: tool.role, callback_url: `${url}/never`
        })
        assert.equal(res.status, 200, `register ${JSON.stringify(tool.name)}: ${JSON.stringify(res.body)}`)
        assert.equal(res.body.ok, true)
      }
    }
    const listed = await api(url, 'GET', '/api/tools?role=D')
    const rows = listed.body.tools_by_role.D as Json[]
    assert.deepEqual(rows.map((r) => r.name), registry.map((t) => t.name), 'GET /api/tools: registration order')
    assert.deepEqual(rows.map((r) => r.description), registry.map((t) => t.description), 'GET /api/tools: descriptions')
    for (const format of FORMATS) {
      const expected = expectedDefinitions(format, registry)
      const lib = toolDefinitions(role, format)
      assert.equal(toolDefinitions(role, format), lib, `${format}: memoised until the next change`)
      assert.ok(Object.isFrozen(lib), `${format}: frozen`)
      assert.deepStrictEqual(canon(lib), canon(expected), `${format}: toolDefinitions is the README's shape`)
      const first = await getRaw(`${url}/api/tools/definitions?role=D&format=${format}`)
      assert.equal(first.status, 200, `${format}: ${first.raw.toString().slice(0, 300)}`)
      assert.equal(Number(first.length), first.raw.length, `${format}: Content-Length is the body's length`)
      const text = first.raw.toString('utf8')
      const body = JSON.parse(text)
      assert.equal(text, JSON.stringify(body), `${format}: the streamed body is the JSON of what it says`)
      assert.equal(JSON.stringify(body), JSON.stringify({ ok: true, role: 'D', format, tools: lib }), `${format}: the route answers toolDefinitions`)
      const again = await getRaw(`${url}/api/tools/definitions?role=D&format=${format}`)
      assert.ok(again.raw.equals(first.raw), `${format}: deterministic`)
      // Names are passed as registered: no two tools share one, and each leads back to its tool.
      const names = definitionNames(format, body.tools)
      assert.deepEqual(names, registry.map((t) => t.name), `${format}: names as registered`)
      assert.equal(new Set(names).size, names.length, `${format}: two tools under one name`)
      // Role E got the registrations with \`role: null\` only (R4); often none ("[] with no tools").
      const other = await api(url, 'GET', `/api/tools/definitions?role=E&format=${format}`)
      assert.deepStrictEqual(other.body, canon({ ok: true, role: 'E', format, tools: expectedDefinitions(format, registry.filter((x) => !x.local && x.role === null)) }),
        `${format}: role E`)
    }
    const byDefault = await getRaw(`${url}/api/tools/definitions?role=D`)
    assert.equal(JSON.parse(byDefault.raw.toString()).format, 'openai-chat')
    // MCP tools/list is the mcp format (docs/protocol.md "MCP endpoint": inputSchema = parameters).
    const mcpTools: Json[] = []
    let cursor: string | undefined
    for (let page = 0; page < 50; page++) {
      const listedPage = await within(mcp.listTools(cursor === undefined ? {} : { cursor }), 'MCP tools/list', GUARD_MS)
      mcpTools.push(...listedPage.tools)
      cursor = listedPage.nextCursor
      if (cursor === undefined) break
    }
    const mcpView = mcpTools.map((x) => ({ name: x.name, description: x.description, inputSchema: x.inputSchema }))
    assert.deepStrictEqual(canon(mcpView),
      canon(toolDefinitions(role, 'mcp')), 'MCP tools/list')
    // The Realtime session's last session.update carries the openai-realtime definitions.
    const last = updates[updates.length - 1]
    assert.deepStrictEqual(canon(last?.session.tools), canon(toolDefinitions(role, 'openai-realtime')), 'Realtime session.update tools')
  }), { numRuns: runs(20), includeErrorInReport: true })
})

// ---------------------------------------------------------------------------------------------
// Cases the properties found, shrunk; each failed on the code before its fix.

/** A listening Toolport with role A, local tool `t` whose handler returns `make()`, and an MCP client. */
async function oneLocalTool (t: TestContext, make: () => unknown): Promise<{ tp: Toolport, url: string, mcp: Client }> {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  await tp.roles.get('A').registerLocalTool({ name: 't', handler: make })
  const mcp = new Client({ name: 'local-definitions-regressions', version: '1.0.0' })
  await mcp.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/A`)))
  t.after(() => mcp.close())
  return { tp, url, mcp }
}

/** The MCP answer of `tools/call t`, or the error it failed with. */
async function mcpCall (mcp: Client): Promise<{ result?: any, error?: string }> {
  try {
    return { result: await within(mcp.callTool({ name: 't', arguments: {} }), 'MCP tools/call', GUARD_MS) }
  } catch (err) {
    return { error: (err as Error).message }
  }
}

test('a local tool that returns a class instance answers MCP tools/call with the result every other exit answers, not a JSON-RPC error (docs/protocol.md "Model-visible result": the same text reaches every session)', async (t) => {
  class Forecast { temperature_c = 28; sky = 'clear' }
  const { tp, mcp } = await oneLocalTool(t, () => new Forecast())
  const lib = await tp.callTool('A', { name: 't', arguments: {} })
  assert.deepEqual({ is_error: lib.is_error, text: lib.text }, { is_error: false, text: '{"temperature_c":28,"sky":"clear"}' })
  const answer = await mcpCall(mcp)
  // Before the fix: "MCP error -32602: Invalid tools/call result: … expected record, received Forecast" (the
  // raw handler value goes out as structuredContent; the SDK's result schema refuses it).
  assert.equal(answer.error, undefined, 'tools/call failed')
  assert.deepEqual(answer.result.content, [{ type: 'text', text: lib.text }])
  assert.equal(answer.result.isError, false)
  assert.deepEqual(answer.result.structuredContent, { temperature_c: 28, sky: 'clear' })
})

test('a local tool that returns a Date (or anything whose JSON is a string) answers POST /api/tools/call with the text its string output is (docs/protocol.md "Model-visible result": "text is output as-is when it is a string")', async (t) => {
  const { tp, url, mcp } = await oneLocalTool(t, () => new Date(0))
  const http = await httpCall(url, { role: 'A', name: 't', arguments: {} })
  assert.equal(http.status, 200)
  // Before the fix: {"is_error":false,"output":"1970-01-01T00:00:00.000Z","text":"\"1970-01-01T00:00:00.000Z\""}
  const body = http.body as Json
  assert.ok(typeof body.output === 'string' ? body.text === body.output : sameJson(JSON.parse(body.text), body.output),
    `output ${JSON.stringify(body.output)} and text ${JSON.stringify(body.text)} disagree`)
  const lib = await tp.callTool('A', { name: 't', arguments: {} })
  assert.equal(lib.text, body.text, 'callTool and the route read the same text')
  // And MCP answers a result too (before the fix: -32602 "expected record, received Date").
  const answer = await mcpCall(mcp)
  assert.equal(answer.error, undefined, 'tools/call failed')
  assert.equal(answer.result.content[0].text, lib.text)
})

test('a local tool whose output cannot be encoded as JSON (a BigInt member, a cycle) answers MCP tools/call with the same success the other exits answer (docs/protocol.md "Model-visible result")', async (t) => {
  for (const [label, make] of [
    ['BigInt member', () => ({ count: 1n })],
    ['cycle', () => { const o: Json = { a: 1 }; o.self = o; return o }]
  ] as Array<[string, () => unknown]>) {
    const { tp, url, mcp } = await oneLocalTool(t, make)
    const lib = await tp.callTool('A', { name: 't', arguments: {} })
    const http = await httpCall(url, { role: 'A', name: 't', arguments: {} })
    assert.equal(http.body.text, lib.text, label)
    assert.equal(http.body.is_error, lib.is_error, label)
    const answer = await mcpCall(mcp)
    // Before the fix: BigInt → "MCP error -32603: the response was too large to keep for a resumed stream";
    // cycle → isError true, "the tool's output is nested more than 4096 levels deep".
    assert.equal(answer.error, undefined, `${label}: tools/call failed`)
    assert.deepEqual({ text: answer.result.content[0].text, isError: answer.result.isError },
      { text: lib.text, isError: lib.is_error }, label)
    // README "Embedding": such a value is a tool error saying so, never a text posing as the output.
    assert.equal(lib.is_error, true, label)
    assert.match(lib.error ?? '', /cannot be encoded as JSON/, label)
  }
})

test('a local tool whose handler returns nothing answers the same output (null) and text ("null", its JSON) at callTool and POST /api/tools/call (docs/protocol.md "Model-visible result")', async (t) => {
  const { tp, url } = await oneLocalTool(t, () => undefined)
  const lib = await tp.callTool('A', { name: 't', arguments: {} })
  const http = await httpCall(url, { role: 'A', name: 't', arguments: {} })
  // Before the fix: callTool {output: undefined, text: ""}, the route {"output":null,"text":""}.
  assert.equal(http.body.text, lib.text)
  assert.deepEqual(http.body.output, lib.output, 'the route and callTool answer different outputs')
  // docs/protocol.md "Model-visible result": a success's text is its output's JSON; nothing
  // returned is null, as the plugin SDKs send it.
  assert.deepEqual({ output: lib.output, text: lib.text }, { output: null, text: 'null' })
})

test('ownership mode: a binding that ended with its source\'s last tool does not come back when the host registers a local tool of that source (docs/protocol.md "Ownership mode": the binding ends when the source has no tool left)', async (t) => {
  const { tp } = await startToolport(t, { roles: ['A'], security: { enforceOwnership: true } })
  const k1 = KEYS.K1 as string
  const k2 = KEYS.K2 as string
  const first = await tp.register({ name: 'x', source: 'plugin:p1', callback_url: 'http://127.0.0.1:9/x' }, { pluginKey: k1 })
  assert.equal(first.ok, true)
  const gone = await tp.unregister({ name: 'x' }, { pluginKey: k1 })
  assert.equal(gone.removed, true)
  // plugin:p1 has no tool left: its binding to K1 has ended.
  await tp.roles.get('A').registerLocalTool({ name: 'y', source: 'plugin:p1', handler: () => 'y' })
  // Before the fix: 403 TP_ERR_NOT_OWNER, the ended binding to K1 revived by the host's tool.
  const second = await tp.register({ name: 'z', source: 'plugin:p1', callback_url: 'http://127.0.0.1:9/z' }, { pluginKey: k2 })
    .catch((err: { code?: string }) => ({ ok: false, error: err.code }))
  assert.equal(second.ok, true, `K2's registration: ${JSON.stringify(second)}`)
})

test('definitions keep a `properties` map whose subschemas are booleans (valid JSON Schema), in the object form MCP clients accept: GET /api/tools/definitions and MCP tools/list give the same schema (docs/protocol.md "MCP endpoint": inputSchema = parameters)', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  const registered = { type: 'object', properties: { anything: true, nothing: false, location: { type: 'string' } }, required: ['location'] }
  const parameters = { type: 'object', properties: { anything: {}, nothing: { not: {} }, location: { type: 'string' } }, required: ['location'] }
  const res = await api(url, 'POST', '/api/tools/register', { name: 'search', parameters: registered, callback_url: `${url}/never` })
  assert.equal(res.body.ok, true)
  const anthropic = await api(url, 'GET', '/api/tools/definitions?role=A&format=anthropic')
  // Before the fix: input_schema {type: 'object', required: ['location']}: `properties` dropped.
  assert.deepStrictEqual(anthropic.body.tools[0].input_schema, parameters)
  const mcp = new Client({ name: 'local-definitions-regressions', version: '1.0.0' })
  await mcp.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/A`)))
  t.after(() => mcp.close())
  const listed = await mcp.listTools()
  assert.deepStrictEqual(canon(listed.tools[0]?.inputSchema), parameters)
  assert.deepStrictEqual(canon(toolDefinitions(tp.roles.get('A'), 'openai-chat')[0]?.function.parameters), parameters)
})

test('a host that changes a local tool\'s parameters object after registering it never gets a truncated definitions body: GET /api/tools/definitions is valid JSON of its exact Content-Length, with the schema that validates the calls (README "Definitions for your own LLM loop"; the schema is compiled at registration)', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  const parameters: Json = { type: 'object', properties: { q: { type: 'string' } } }
  await tp.roles.get('A').registerLocalTool({ name: 'm', parameters, handler: () => 1 })
  const first = await getRaw(`${url}/api/tools/definitions?role=A&format=mcp`)
  assert.equal(Number(first.length), first.raw.length)
  // The host goes on using its object (e.g. a schema builder it reuses for the next tool).
  parameters.properties.q.description = 'x'.repeat(100)
  const second = await getRaw(`${url}/api/tools/definitions?role=A&format=mcp`)
  // Before the fix: the size measured for the snapshot is reused, the body is cut at the old
  // Content-Length, mid-JSON ("…{"type":"string","desc").
  let body: any
  assert.doesNotThrow(() => { body = JSON.parse(second.raw.toString('utf8')) }, `not JSON: …${second.raw.toString('utf8').slice(-60)}`)
  // The arguments are checked against the schema compiled at registration: the definitions show that one.
  assert.deepStrictEqual(body.tools[0].inputSchema, { type: 'object', properties: { q: { type: 'string' } } })
  const call = await tp.callTool('A', { name: 'm', arguments: { q: 1 } })
  assert.equal(call.is_error, true, 'validated against the schema as registered')
})
