// A property test of the MCP surfaces (docs/protocol.md "MCP endpoint"; README "MCP: one endpoint
// per role" and `toolport mcp`): the official SDK's Client over Streamable HTTP on a real listening
// Toolport (pool dispatch, worker threads), and the stdio bridge spawned as a real process through
// the SDK's StdioClientTransport, both against a real plugin on 127.0.0.1.
//
// The HTTP property runs random interleavings of: sessions opened on three roles, ended by DELETE
// or abandoned (the client goes away without one); tools/call of the session's own tools answered
// (at once or up to 120 ms later) with a JSON result, text, a tool error, an image, an HTTP 500,
// or never (then cancelled by the client once the plugin has it, or timed out by a short
// `timeout_seconds`); calls cancelled by the client at random times; calls of another role's tool
// or of no tool; network drops of a session's event streams, the client's own reconnections doing
// the rest (`Last-Event-ID` where it has one; `mcp.retryIntervalMs` is 40 ms); a tool change of a
// role, sometimes just before or during a drop; and a session's role removed and added again.
// After every run:
// - every call was answered exactly once (counted on the wire), with the text, images, `isError`
//   and `structuredContent` its plugin's reply maps to, and reached its plugin exactly once and
//   only for a tool of the session's role; a call of another role's tool or of no tool is the
//   JSON-RPC error -32602, naming only the session's own tools, and reaches no plugin;
// - a call the client cancelled got no answer when nothing else could have ended it, and its
//   plugin request was closed (the plugin saw the disconnect); a timed-out call is an `isError`
//   result naming the timeout, its plugin request closed too;
// - a call in flight when its session is ended by Toolport (its role removed) is answered (an
//   error) instead of being left to the client's own timeout; later requests of that session are
//   404; a session ended by DELETE is 404 at once and leaves its role;
// - a session of a role that changed was told (`list_changed`), drops or not; its tools/list is its
//   own role's tools only;
// - nothing is left behind: no call pending in the dispatcher, no plugin request held, no MCP call
//   budget held (`mcp.maxCalls` equals the calls of one run, so a budget not given back refuses a
//   later run's call), and each live session holds at most its one event stream (GET) once its
//   calls are answered; an ended or abandoned session holds none.
// The bridge property runs calls of the same kinds through one spawned `toolport mcp`, with
// Toolport restarted on the same port, the bridge's role removed and added again, and tool changes
// between them: every call answered once and mapped the same, cancellation reaching the plugin,
// the list_changed forwarded, and Toolport holding exactly the bridge's one session, with at most
// one event stream, once the calls are answered.
//
// The tests after the properties are the cases the properties found, shrunk; each says what it
// checks and where that is done.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { EventEmitter } from 'node:events'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { isDeepStrictEqual } from 'node:util'
import fc from 'fast-check'
import { Agent, fetch as undiciFetch, request as httpRequest } from 'undici'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js'
import { ErrorCode, McpError, ToolListChangedNotificationSchema, type CallToolResult } from '@modelcontextprotocol/sdk/types.js'
import { createToolport, type Toolport } from '../../src/main/index.js'
import { kPendingCalls } from '../../src/main/symbols.js'
import { listenOnLoopback, toolportCliArgs, within } from '../helpers.js'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))

const ROLES = ['A', 'B', 'C'] as const
type RoleName = typeof ROLES[number]

/** The short tools' `timeout_seconds`; the others have 30 s. */
const SHORT_SECONDS = 0.15
/** `mcp.retryIntervalMs`: SDK clients reconnect a dropped stream after this (default 2 s). */
const RETRY_MS = 40
/**
 * The SDK's own timeout for one request. Every call of a run ends within ~0.3 s (replies within
 * 120 ms, hanging calls cancelled or timed out): one still unanswered after this was lost.
 */
const CALL_TIMEOUT_MS = 2_500
/** Bounds on waits, so that what never comes fails the run instead of hanging the file. */
const GUARD_MS = 5_000
const SETTLE_MS = 1_500
/** Calls in one HTTP run, and `mcp.maxCalls`: a budget a run does not give back refuses a later call. */
const MAX_CALLS = 12
/** Shrinking replays real runs; a bounded number keeps a failure's report quick. */
const MAX_SHRINKS = 10
const FAILING_TIMEOUT_MS = 300_000

/** A 1×1 PNG: an image the plugin returns, which MCP answers as `image` content after the text. */
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=='

// ---------------------------------------------------------------------------------------------
// The plugin: one callback server for every role's tools, doing what each call's arguments say.

const BEHAVIOURS = ['json', 'text', 'tool_error', 'status_500', 'image', 'hang'] as const
type Behaviour = typeof BEHAVIOURS[number]

interface CallArguments { token: string, behaviour: Behaviour, delay_ms: number }

/** What the plugin saw of one call (by its token). */
interface Seen {
  /** The tool the callback body named. */
  tool: string
  /** Requests that carried the token. */
  count: number
  /** The plugin wrote its reply. */
  answered: boolean
  /** The request was closed before the plugin's reply was written: Toolport stopped it. */
  closedUnanswered: boolean
}

interface Plugin {
  url: string
  readonly seen: Map<string, Seen>
  /** Requests open now. */
  readonly active: number
  /** Resolves once a request with this token has arrived. */
  arrived: (token: string) => Promise<void>
  /** Destroys the requests it still holds (after a run that failed). */
  dropHeld: () => void
}

async function startPlugin (t: TestContext): Promise<Plugin> {
  const seen = new Map<string, Seen>()
  const events = new EventEmitter()
  events.setMaxListeners(0)
  const held = new Set<ServerResponse>()
  const server = createServer((request: IncomingMessage, response: ServerResponse) => {
    held.add(response)
    let entry: Seen | undefined
    response.once('close', () => {
      held.delete(response)
      if (entry !== undefined && !response.writableFinished) entry.closedUnanswered = true
    })
    const chunks: Buffer[] = []
    request.on('data', (chunk: Buffer) => { chunks.push(chunk) })
    request.on('end', () => {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { name: string, arguments: CallArguments }
      const { token, behaviour, delay_ms: delayMs } = body.arguments
      const current = seen.get(token) ?? { tool: body.name, count: 0, answered: false, closedUnanswered: false }
      entry = current
      current.count++
      seen.set(token, current)
      events.emit('arrived', token)
      if (behaviour === 'hang') return
      setTimeout(() => {
        if (response.destroyed) return
        current.answered = true
        reply(response, behaviour, token)
      }, delayMs)
    })
  })
  server.keepAliveTimeout = 120_000
  return {
    url: await listenOnLoopback(t, server),
    seen,
    get active () { return held.size },
    async arrived (token) {
      while (!seen.has(token)) {
        await new Promise<void>((resolve) => {
          const onArrived = (): void => { events.off('arrived', onArrived); resolve() }
          events.on('arrived', onArrived)
        })
      }
    },
    dropHeld () {
      for (const response of [...held]) response.socket?.destroy()
    }
  }
}

function reply (response: ServerResponse, behaviour: Exclude<Behaviour, 'hang'>, token: string): void {
  const send = (status: number, type: string, body: string): void => {
    response.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body) })
    response.end(body)
  }
  switch (behaviour) {
    case 'json':
      return send(200, 'application/json', JSON.stringify({ output: { token, n: 1 }, is_error: false }))
    case 'text':
      return send(200, 'text/plain; charset=utf-8', `plain ${token}`)
    case 'tool_error':
      return send(200, 'application/json', JSON.stringify({ is_error: true, error: `refused ${token}`, output: { token } }))
    case 'status_500':
      return send(500, 'text/plain', `failed ${token}`)
    case 'image':
      return send(200, 'application/json', JSON.stringify({ output: { token }, images: [{ data_b64: PNG, mime: 'image/png' }] }))
  }
}

/** What an MCP client must get for a call its plugin answered (README "MCP", "Tool results"). */
function expectedResult (behaviour: Exclude<Behaviour, 'hang'>, token: string): CallToolResult {
  switch (behaviour) {
    case 'json':
      return { content: [{ type: 'text', text: JSON.stringify({ token, n: 1 }) }], isError: false, structuredContent: { token, n: 1 } }
    case 'text':
      return { content: [{ type: 'text', text: `plain ${token}` }], isError: false }
    case 'tool_error':
      return { content: [{ type: 'text', text: JSON.stringify({ error: `refused ${token}`, output: { token } }) }], isError: true }
    case 'status_500':
      return {
        content: [{ type: 'text', text: JSON.stringify({ error: `tool callback returned HTTP 500: failed ${token}` }) }],
        isError: true
      }
    case 'image':
      return {
        content: [{ type: 'text', text: JSON.stringify({ token }) }, { type: 'image', data: PNG, mimeType: 'image/png' }],
        isError: false,
        structuredContent: { token }
      }
  }
}

/** The parts of a CallToolResult the contract fixes (the SDK may add `_meta`). */
function resultShape (result: CallToolResult): CallToolResult {
  const shape: CallToolResult = { content: result.content, isError: result.isError }
  if (result.structuredContent !== undefined) shape.structuredContent = result.structuredContent
  return shape
}

const toolOf = (role: string, isShort: boolean): string => `${role}_${isShort ? 'short' : 'call'}`
const EXTRA = (role: string): string => `${role}_extra`

/** Registers a role's two call tools (30 s and SHORT_SECONDS), in that order. */
async function registerCallTools (tp: Toolport, role: string, plugin: Plugin): Promise<void> {
  for (const isShort of [false, true]) {
    const result = await tp.register({
      name: toolOf(role, isShort),
      role,
      callback_url: `${plugin.url}/call`,
      timeout_seconds: isShort ? SHORT_SECONDS : 30,
      parameters: { type: 'object', properties: { token: { type: 'string' } }, required: ['token'] }
    })
    assert.equal(result.ok, true, result.error)
  }
}

/** Open `GET /mcp/…` requests (event streams) per Mcp-Session-Id, as the server sees them. */
function watchEventStreams (tp: Toolport): Map<string, number> {
  const open = new Map<string, number>()
  tp.app.server.on('request', (request: IncomingMessage, response: ServerResponse) => {
    const id = request.headers['mcp-session-id']
    if (request.method !== 'GET' || request.url?.startsWith('/mcp/') !== true || typeof id !== 'string') return
    open.set(id, (open.get(id) ?? 0) + 1)
    response.once('close', () => { open.set(id, (open.get(id) ?? 1) - 1) })
  })
  return open
}

// ---------------------------------------------------------------------------------------------
// What a client sent and got, counted on the wire: the transport's own send and onmessage.

interface Traffic {
  /**
   * JSON-RPC responses that arrived, by the token of the call they answer: each as `result <json>`
   * or `error <json>`.
   */
  responses: Map<string, string[]>
  /** Tokens of the calls the client sent notifications/cancelled for. */
  cancelled: Set<string>
  /** notifications/tools/list_changed that arrived. */
  notices: number
}

/** Wraps a connected client's transport to count its traffic (the client's Protocol stays in charge). */
function watchTraffic (transport: Transport): Traffic {
  const traffic: Traffic = { responses: new Map(), cancelled: new Set(), notices: 0 }
  const tokens = new Map<string | number, string>()
  const send = transport.send.bind(transport)
  transport.send = async (message, options) => {
    const m = message as { id?: string | number, method?: string, params?: Record<string, any> }
    const token: unknown = m.params?.arguments?.token
    if (m.method === 'tools/call' && m.id !== undefined && typeof token === 'string') tokens.set(m.id, token)
    if (m.method === 'notifications/cancelled') {
      const cancelled = tokens.get(m.params?.requestId as string | number)
      if (cancelled !== undefined) traffic.cancelled.add(cancelled)
    }
    await send(message, options)
  }
  const receive = transport.onmessage
  transport.onmessage = (message, extra) => {
    const m = message as { id?: string | number, method?: string, result?: unknown, error?: unknown }
    if (m.method === 'notifications/tools/list_changed') traffic.notices++
    if (m.id !== undefined && m.method === undefined) {
      const token = tokens.get(m.id)
      if (token !== undefined) {
        const answer = `${m.error === undefined ? 'result' : 'error'} ${JSON.stringify(m.result ?? m.error)}`
        traffic.responses.set(token, [...(traffic.responses.get(token) ?? []), answer])
      }
    }
    receive?.(message, extra)
  }
  return traffic
}

// ---------------------------------------------------------------------------------------------
// An SDK client over Streamable HTTP whose event streams the test can drop, as a network would.

interface StreamEntry {
  /** A GET without Last-Event-ID: the session's standalone stream, opened fresh. */
  isFreshGet: boolean
  /** A complete SSE event has reached the client on it (for a POST: its priming event). */
  hasEvent: boolean
  controller: AbortController
}

type SessionState = 'live' | 'deleted' | 'abandoned' | 'dead'

/** An MCP client the property calls tools through: a session over HTTP, or the bridge's stdio client. */
interface Caller {
  /** For messages, e.g. `s3(A)`. */
  readonly label: string
  /** The role whose tools it gets. */
  readonly role: RoleName
  readonly client: Client
  readonly traffic: Traffic
  state: SessionState
}

let sessionCount = 0

class HttpSession implements Caller {
  readonly label: string
  readonly role: RoleName
  readonly client: Client
  readonly transport: StreamableHTTPClientTransport
  readonly agent: Agent
  readonly streams = new Set<StreamEntry>()
  traffic!: Traffic
  sessionId = ''
  state: SessionState = 'live'

  constructor (url: string, role: RoleName) {
    this.label = `s${++sessionCount}(${role})`
    this.role = role
    // Its own connections: a client is the connection that initialized (README "MCP"), and a drop
    // cuts only this client's streams.
    this.agent = new Agent({ keepAliveTimeout: 30_000 })
    this.client = new Client({ name: 'mcp-properties', version: '1.0.0' })
    this.client.setNotificationHandler(ToolListChangedNotificationSchema, () => {})
    this.transport = new StreamableHTTPClientTransport(new URL(`${url}/mcp/${role}`), {
      fetch: droppableFetch(this.agent, this.streams) as unknown as typeof fetch
    })
    // Reconnection failures after the session ended are expected noise.
    this.transport.onerror = () => {}
  }

  async connect (): Promise<void> {
    await this.client.connect(this.transport)
    this.transport.onerror = () => {}
    this.client.onerror = () => {}
    this.traffic = watchTraffic(this.transport)
    this.sessionId = this.transport.sessionId as string
  }

  /** A network drop: every stream that can be resumed is cut (a POST only after its priming event). */
  drop (requestStreamsFirst: boolean): number {
    const all = [...this.streams].filter((s) => s.isFreshGet || s.hasEvent)
    all.sort((a, b) => Number(a.isFreshGet) - Number(b.isFreshGet))
    if (!requestStreamsFirst) all.reverse()
    for (const stream of all) {
      this.streams.delete(stream)
      stream.controller.abort()
    }
    return all.length
  }

  /** DELETE, then close the client. */
  async terminate (): Promise<void> {
    this.state = 'deleted'
    await this.transport.terminateSession()
    await this.close()
  }

  /** The client goes away without DELETE. */
  async abandon (): Promise<void> {
    this.state = 'abandoned'
    await this.close()
  }

  async close (): Promise<void> {
    await this.client.close().catch(() => {})
    await this.agent.destroy().catch(() => {})
  }
}

/**
 * `fetch` through `agent` whose event-stream responses are noted in `streams` (until they end) with
 * an AbortController that cuts them like a network failure (the socket is destroyed).
 */
function droppableFetch (agent: Agent, streams: Set<StreamEntry>) {
  return async (input: string | URL, init?: RequestInit): Promise<Response> => {
    const controller = new AbortController()
    const signal = init?.signal == null ? controller.signal : AbortSignal.any([init.signal, controller.signal])
    const response = await undiciFetch(input, { ...(init as object), signal, dispatcher: agent })
    const body = response.body
    if (body === null || response.headers.get('content-type')?.startsWith('text/event-stream') !== true) {
      return response as unknown as Response
    }
    const headers = new Headers(init?.headers)
    const entry: StreamEntry = {
      isFreshGet: (init?.method ?? 'GET') === 'GET' && !headers.has('last-event-id'),
      hasEvent: false,
      controller
    }
    streams.add(entry)
    const reader = body.getReader()
    const decoder = new TextDecoder()
    let text = ''
    // Pulled only when the client reads: a chunk passed on here is in the client's hands.
    const wrapped = new ReadableStream<Uint8Array>({
      async pull (out) {
        try {
          const { value, done } = await reader.read()
          if (done) {
            streams.delete(entry)
            out.close()
            return
          }
          if (!entry.hasEvent) {
            text += decoder.decode(value, { stream: true })
            entry.hasEvent = text.includes('\n\n')
          }
          out.enqueue(value)
        } catch (err) {
          streams.delete(entry)
          out.error(err)
        }
      },
      async cancel (reason) {
        streams.delete(entry)
        await reader.cancel(reason)
      }
    }, { highWaterMark: 0 })
    const { status, statusText } = response
    return new Response(wrapped, { status, statusText, headers: new Headers([...response.headers]) })
  }
}

/** A raw request on a session's id, as a client that kept it would send: its status. */
async function statusOf (url: string, role: string, sessionId: string): Promise<number> {
  const res = await httpRequest(`${url}/mcp/${role}`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-session-id': sessionId,
      'mcp-protocol-version': '2025-11-25'
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
  })
  await res.body.dump()
  return res.statusCode
}

/** Polls `check` until it returns '' (all is well); throws its last complaint after `timeoutMs`. */
async function eventually (check: () => string | Promise<string>, timeoutMs = SETTLE_MS): Promise<void> {
  const until = Date.now() + timeoutMs
  for (;;) {
    const problem = await check()
    if (problem === '') return
    if (Date.now() > until) throw new Error(problem)
    await sleep(10)
  }
}

function errorText (err: unknown): string {
  return err instanceof Error ? `${err.constructor.name}: ${err.message}` : String(err)
}

/** The SDK rejected the request itself after CALL_TIMEOUT_MS: no answer ever came. */
function isClientTimeout (err: unknown): boolean {
  return err instanceof McpError && err.code === ErrorCode.RequestTimeout && err.message.includes('Request timed out')
}

// ---------------------------------------------------------------------------------------------
// The scenarios.

/** `own`/`short`: the session's role's 30 s / short tool; `other_role`: another role's; `unknown`: no tool's. */
type Target = 'own' | 'short' | 'other_role' | 'unknown'

type Cancel =
  | { at: 'none' }
  /** The client aborts `ms` after the plugin got the request. */
  | { at: 'arrival', ms: number }
  /** The client aborts `ms` after making the call (only for calls that end on their own). */
  | { at: 'after', ms: number }

interface CallPlan {
  /** Index (modulo) among the run's sessions that are live or whose role was removed. */
  session: number
  target: Target
  behaviour: Behaviour
  delayMs: number
  cancel: Cancel
}

type Step =
  | { kind: 'call', plan: CallPlan }
  | { kind: 'open', role: RoleName }
  /** The live session at `session` (modulo) ends, once its calls are answered. */
  | { kind: 'end', session: number, how: 'delete' | 'abandon' }
  /**
   * The live session's streams drop (requests' streams first, or its GET stream first); with
   * `change`, its role's tools change just before (the notice may be on its way) or just after
   * (while the streams are down).
   */
  | { kind: 'drop', session: number, requestStreamsFirst: boolean, change: 'none' | 'before' | 'after' }
  /** The role's tools change (a tool registered again with a new description, R5). */
  | { kind: 'change', role: RoleName }
  /**
   * `waitMs` later, the host removes the role of the live session at `session` (modulo) and adds
   * it again; its tools are registered again.
   */
  | { kind: 'rebuild', session: number, waitMs: number }
  | { kind: 'pause', ms: number }

interface Scenario {
  sessions: RoleName[]
  steps: Step[]
}

const roleArb = fc.constantFrom(...ROLES)

const cancelArb: fc.Arbitrary<Cancel> = fc.oneof(
  { weight: 5, arbitrary: fc.constant<Cancel>({ at: 'none' }) },
  { weight: 2, arbitrary: fc.nat(80).map((ms): Cancel => ({ at: 'arrival', ms })) },
  { weight: 2, arbitrary: fc.nat(40).map((ms): Cancel => ({ at: 'after', ms })) }
)

const callArb: fc.Arbitrary<CallPlan> = fc.record({
  session: fc.nat(7),
  target: fc.constantFrom<Target>('own', 'own', 'own', 'own', 'short', 'short', 'other_role', 'unknown'),
  behaviour: fc.constantFrom(...BEHAVIOURS),
  // Mostly quick; some slow enough to be in flight when streams drop.
  delayMs: fc.oneof({ weight: 4, arbitrary: fc.nat(30) }, { weight: 1, arbitrary: fc.integer({ min: 50, max: 120 }) }),
  cancel: cancelArb
}).map(normalise)

/**
 * A call of no plugin is never cancelled; a hanging call is cancelled only once its request
 * arrived (a notifications/cancelled that overtakes its request on another connection is
 * ignored, MCP "Cancellation"), and one of the 30 s tool always is, so that every call ends.
 */
function normalise (plan: CallPlan): CallPlan {
  if (plan.target === 'other_role' || plan.target === 'unknown') return { ...plan, cancel: { at: 'none' } }
  if (plan.behaviour !== 'hang') return plan
  if (plan.cancel.at === 'after') return { ...plan, cancel: { at: 'arrival', ms: plan.cancel.ms } }
  if (plan.cancel.at === 'none' && plan.target === 'own') return { ...plan, cancel: { at: 'arrival', ms: 0 } }
  return plan
}

const stepArb: fc.Arbitrary<Step> = fc.oneof(
  { weight: 12, arbitrary: callArb.map((plan): Step => ({ kind: 'call', plan })) },
  { weight: 1, arbitrary: roleArb.map((role): Step => ({ kind: 'open', role })) },
  {
    weight: 2,
    arbitrary: fc.record({ session: fc.nat(7), how: fc.constantFrom<'delete' | 'abandon'>('delete', 'delete', 'abandon') })
      .map((s): Step => ({ kind: 'end', ...s }))
  },
  {
    weight: 2,
    arbitrary: fc.record({
      session: fc.nat(7),
      requestStreamsFirst: fc.boolean(),
      change: fc.constantFrom<'none' | 'before' | 'after'>('none', 'before', 'after')
    }).map((s): Step => ({ kind: 'drop', ...s }))
  },
  { weight: 2, arbitrary: roleArb.map((role): Step => ({ kind: 'change', role })) },
  {
    weight: 2,
    arbitrary: fc.record({ session: fc.nat(7), waitMs: fc.nat(40) }).map((s): Step => ({ kind: 'rebuild', ...s }))
  },
  { weight: 3, arbitrary: fc.integer({ min: 1, max: 30 }).map((ms): Step => ({ kind: 'pause', ms })) }
)

const scenarioArb: fc.Arbitrary<Scenario> = fc.record({
  sessions: fc.array(roleArb, { minLength: 1, maxLength: 3 }),
  steps: fc.array(stepArb, { minLength: 1, maxLength: 24, size: 'medium' }).map(capCalls)
})

/** The steps up to MAX_CALLS calls. */
function capCalls (steps: Step[]): Step[] {
  let calls = 0
  return steps.filter((step) => step.kind !== 'call' || ++calls <= MAX_CALLS)
}

// ---------------------------------------------------------------------------------------------
// A run of a scenario against the HTTP endpoint.

interface CallRecord {
  plan: CallPlan
  token: string
  caller: Caller
  tool: string
  /** The session's state when the call was made. */
  stateAtCall: SessionState
  /** Toolport ended the session (its role was removed) while the call was unanswered. */
  endedInFlight: boolean
  /** The session's streams were dropped while the call was unanswered. */
  droppedInFlight: boolean
  /**
   * Its session was ended by Toolport (role removed, Toolport restarted) after the client
   * cancelled it: the end's answer to it may cross the client's notifications/cancelled.
   */
  endedAfterCancel: boolean
  /** The client aborted the call before it was answered. */
  clientAborted: boolean
  isSettled: boolean
  outcome: { ok: true, result: CallToolResult } | { ok: false, error: unknown } | undefined
  done: Promise<void>
}

/**
 * Makes one call through `caller` as `plan` says (not awaited: `done` settles with it), and
 * cancels it when the plan says so.
 */
function makeCall (caller: Caller, plan: CallPlan, token: string, plugin: Plugin,
  timers: NodeJS.Timeout[]): CallRecord {
  const other = ROLES.find((role) => role !== caller.role) as RoleName
  const tool = plan.target === 'own'
    ? toolOf(caller.role, false)
    : plan.target === 'short'
      ? toolOf(caller.role, true)
      : plan.target === 'other_role' ? toolOf(other, false) : 'no_such_tool'
  const args: CallArguments = { token, behaviour: plan.behaviour, delay_ms: plan.delayMs }
  const controller = new AbortController()
  const record: CallRecord = {
    plan,
    token,
    caller,
    tool,
    stateAtCall: caller.state,
    endedInFlight: false,
    droppedInFlight: false,
    endedAfterCancel: false,
    clientAborted: false,
    isSettled: false,
    outcome: undefined,
    done: Promise.resolve()
  }
  const abort = (): void => {
    if (record.isSettled) return
    record.clientAborted = true
    controller.abort(new Error(`cancelled by the test (${token})`))
  }
  record.done = caller.client.callTool({ name: tool, arguments: { ...args } }, undefined,
    { signal: controller.signal, timeout: CALL_TIMEOUT_MS })
    .then((result) => { record.outcome = { ok: true, result: result as CallToolResult } },
      (error: unknown) => { record.outcome = { ok: false, error } })
    .finally(() => { record.isSettled = true })
  if (plan.cancel.at === 'after') {
    timers.push(setTimeout(abort, plan.cancel.ms))
  } else if (plan.cancel.at === 'arrival') {
    const ms = plan.cancel.ms
    Promise.race([plugin.arrived(token).then(() => true), record.done.then(() => false)])
      .then((hasArrived) => { if (hasArrived) timers.push(setTimeout(abort, ms)) }, () => {})
  }
  return record
}

interface HttpWorld {
  tp: Toolport
  url: string
  plugin: Plugin
  /** Open event streams per session id, as the server sees them. */
  streams: Map<string, number>
  /** The model: each role's tools in registration order. */
  tools: Map<RoleName, string[]>
  /** Sessions the property abandoned: they stay attached for the reconnect grace (30 s). */
  abandoned: Set<string>
  runs: number
  extraVersion: number
  tally: Map<string, number>
}

async function startHttpWorld (t: TestContext): Promise<HttpWorld> {
  const plugin = await startPlugin(t)
  const tp = await createToolport({
    roles: [...ROLES],
    logger: false,
    dispatch: { mode: 'pool', closeGraceMs: 0 },
    mcp: { retryIntervalMs: RETRY_MS, maxCalls: MAX_CALLS }
  })
  t.after(() => tp.close())
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  const tools = new Map<RoleName, string[]>()
  for (const role of ROLES) {
    await registerCallTools(tp, role, plugin)
    tools.set(role, [toolOf(role, false), toolOf(role, true)])
  }
  const streams = watchEventStreams(tp)
  return { tp, url, plugin, streams, tools, abandoned: new Set(), runs: 0, extraVersion: 0, tally: new Map() }
}

function count (world: HttpWorld, key: string, n = 1): void {
  countIn(world.tally, key, n)
}

function countIn (tally: Map<string, number>, key: string, n = 1): void {
  tally.set(key, (tally.get(key) ?? 0) + n)
}

class HttpRun {
  readonly world: HttpWorld
  readonly run: number
  readonly sessions: HttpSession[] = []
  readonly calls: CallRecord[] = []
  /** For each change: the live sessions of its role and the notices each had got before it. */
  readonly changes: Array<{ session: HttpSession, before: number }> = []
  readonly timers: NodeJS.Timeout[] = []

  constructor (world: HttpWorld) {
    this.world = world
    this.run = ++world.runs
  }

  async open (role: RoleName): Promise<void> {
    const session = new HttpSession(this.world.url, role)
    this.sessions.push(session)
    await within(session.connect(), `${session.label}: initialize`, GUARD_MS)
    const { tools } = await session.client.listTools()
    assert.deepEqual(tools.map((tool) => tool.name), this.world.tools.get(role),
      `${session.label}: tools/list is its role's tools, in registration order`)
  }

  call (plan: CallPlan): void {
    const candidates = this.sessions.filter((s) => s.state === 'live' || s.state === 'dead')
    if (candidates.length === 0) return
    const session = candidates[plan.session % candidates.length] as HttpSession
    this.calls.push(makeCall(session, plan, `r${this.run}-c${this.calls.length}`, this.world.plugin, this.timers))
  }

  live (): HttpSession[] {
    return this.sessions.filter((s) => s.state === 'live')
  }

  async end (pick: number, how: 'delete' | 'abandon'): Promise<void> {
    const live = this.live()
    if (live.length === 0) return
    const session = live[pick % live.length] as HttpSession
    const calls = this.calls.filter((c) => c.caller === session)
    await within(Promise.all(calls.map((c) => c.done)), `${session.label}: its calls before it ends`, CALL_TIMEOUT_MS + GUARD_MS)
    // And its cancellations went out: a client that goes away before its notifications/cancelled
    // is sent leaves the call running until the session's reconnect grace ends (README "MCP").
    const { plugin } = this.world
    await eventually(() => calls.some((c) => {
      const seen = plugin.seen.get(c.token)
      return c.clientAborted && seen !== undefined && !seen.answered && !seen.closedUnanswered
    })
      ? `${session.label}: a call it cancelled is still open at its plugin`
      : '')
    const role = this.world.tp.roles.get(session.role)
    if (how === 'abandon') {
      await session.abandon()
      this.world.abandoned.add(session.sessionId)
      count(this.world, 'abandoned')
      return
    }
    await within(session.terminate(), `${session.label}: DELETE`, GUARD_MS)
    count(this.world, 'deleted')
    // README "MCP": a session ends, and leaves its role, on DELETE; its id is then unknown (404).
    assert.ok(!role.sessions().some((s) => (s as { sessionId?: string }).sessionId === session.sessionId), `${session.label} left its role on DELETE`)
    assert.equal(await statusOf(this.world.url, session.role, session.sessionId), 404, `${session.label}: a request after DELETE`)
  }

  async drop (pick: number, requestStreamsFirst: boolean, change: 'none' | 'before' | 'after'): Promise<void> {
    const live = this.live()
    if (live.length === 0) return
    const session = live[pick % live.length] as HttpSession
    if (change === 'before') await this.change(session.role)
    for (const call of this.calls) if (call.caller === session && !call.isSettled) call.droppedInFlight = true
    count(this.world, 'streams dropped', session.drop(requestStreamsFirst))
    if (change === 'after') await this.change(session.role)
  }

  async change (role: RoleName): Promise<void> {
    for (const session of this.live()) {
      if (session.role === role) this.changes.push({ session, before: session.traffic.notices })
    }
    const { tp, plugin } = this.world
    const result = await tp.register({
      name: EXTRA(role),
      role,
      description: `version ${++this.world.extraVersion}`,
      callback_url: `${plugin.url}/extra`
    })
    assert.equal(result.ok, true, result.error)
    // R5: registered again, it moves to the end.
    const tools = (this.world.tools.get(role) as string[]).filter((name) => name !== EXTRA(role))
    this.world.tools.set(role, [...tools, EXTRA(role)])
  }

  async rebuild (pick: number): Promise<void> {
    const live = this.live()
    if (live.length === 0) return
    const role = (live[pick % live.length] as HttpSession).role
    for (const session of live) {
      if (session.role !== role) continue
      session.state = 'dead'
      for (const call of this.calls) {
        if (call.caller !== session) continue
        if (!call.isSettled) call.endedInFlight = true
        if (call.clientAborted) call.endedAfterCancel = true
      }
    }
    const { tp, plugin } = this.world
    tp.roles.remove(role)
    tp.roles.add(role)
    await registerCallTools(tp, role, plugin)
    this.world.tools.set(role, [toolOf(role, false), toolOf(role, true)])
    count(this.world, 'rebuilds')
  }

  async execute (scenario: Scenario): Promise<void> {
    for (const role of scenario.sessions) await this.open(role)
    for (const step of scenario.steps) {
      switch (step.kind) {
        case 'call': this.call(step.plan); break
        case 'open': await this.open(step.role); break
        case 'end': await this.end(step.session, step.how); break
        case 'drop': await this.drop(step.session, step.requestStreamsFirst, step.change); break
        case 'change': await this.change(step.role); break
        case 'rebuild':
          await sleep(step.waitMs)
          await this.rebuild(step.session)
          break
        case 'pause': await sleep(step.ms); break
      }
    }
    await within(Promise.all(this.calls.map((c) => c.done)),
      () => `calls never settled: ${this.calls.filter((c) => !c.isSettled).map((c) => c.token).join(', ')}`,
      CALL_TIMEOUT_MS + GUARD_MS)
  }

  async check (): Promise<void> {
    const { tp, plugin, streams } = this.world
    // A cancelled or timed-out call's plugin request is closed (README: "the plugin's request is closed").
    await eventually(() => plugin.active === 0 ? '' : `${plugin.active} plugin requests still open after every call was answered`)
    // Dropped streams, and streams that ended without a result, are reconnected after RETRY_MS: let them.
    await sleep(RETRY_MS * 4)
    for (const call of this.calls) checkCall(call, plugin, this.world.tally)
    for (const { session, before } of this.changes) {
      if (session.state !== 'live') continue
      await eventually(() => session.traffic.notices > before
        ? ''
        : `${session.label} was not told of a change of its role (list_changed; ${session.traffic.notices} notices in all)`)
    }
    for (const session of this.live()) {
      const { tools } = await within(session.client.listTools(), `${session.label}: tools/list`, GUARD_MS)
      assert.deepEqual(tools.map((tool) => tool.name), this.world.tools.get(session.role),
        `${session.label}: tools/list is its own role's tools`)
      // Its id is not a session of another role's endpoint.
      const other = ROLES[(ROLES.indexOf(session.role) + 1) % ROLES.length] as RoleName
      assert.equal(await statusOf(this.world.url, other, session.sessionId), 404, `${session.label}: its id on /mcp/${other}`)
    }
    await eventually(() => {
      const problems: string[] = []
      for (const session of this.sessions) {
        const open = streams.get(session.sessionId) ?? 0
        const most = session.state === 'live' ? 1 : 0
        if (open > most) {
          problems.push(`${session.label} (${session.state}) holds ${open} event streams (GET), at most ${most} expected once its calls are answered`)
        }
      }
      return problems.join('; ')
    })
    // Every session of the run ends; only the abandoned stay attached (until the reconnect grace).
    for (const session of this.live()) await within(session.terminate(), `${session.label}: DELETE`, GUARD_MS)
    const ids = new Set(this.sessions.map((s) => s.sessionId))
    for (const role of ROLES) {
      for (const s of tp.roles.get(role).sessions()) {
        const sessionId = (s as { sessionId?: string }).sessionId ?? ''
        if (ids.has(sessionId) && !this.world.abandoned.has(sessionId)) assert.fail(`${sessionId} is still a session of role ${role} after it ended`)
      }
    }
    await eventually(() => {
      const open = this.sessions.filter((s) => (streams.get(s.sessionId) ?? 0) > 0)
      return open.length === 0 ? '' : `ended sessions still hold event streams: ${open.map((s) => s.label).join(', ')}`
    })
    await eventually(() => tp[kPendingCalls] === 0 && tp.health().dispatch.in_flight === 0
      ? ''
      : `${tp[kPendingCalls]} calls still pending in the dispatcher`)
  }

  async dispose (): Promise<void> {
    for (const timer of this.timers) clearTimeout(timer)
    await Promise.all(this.sessions.map((s) => s.close()))
    this.world.plugin.dropHeld()
  }
}

/**
 * How many answers a call got, counting an identical repeat of a JSON-RPC error once: the SDK
 * client takes only a *result* as the end of a request's stream, so it resumes a stream that ended
 * with an error (Last-Event-ID: its priming event) and the server replays the error it asked for;
 * the client's Protocol drops the repeat. A result twice, or two different answers, is a bug.
 */
function answers (traffic: Traffic, token: string, what: string): number {
  const list = traffic.responses.get(token) ?? []
  const distinct = new Set(list)
  assert.ok(distinct.size <= 1, `${what}: answered ${distinct.size} different ways: ${list.join(' / ')}`)
  assert.ok(list.length <= 1 || list[0]?.startsWith('error ') === true, `${what}: its result came ${list.length} times`)
  return distinct.size
}

/** Checks one answered call against its plan (see the file comment); `tally` counts how it ended. */
function checkCall (call: CallRecord, plugin: Plugin, tally: Map<string, number>): void {
  const { plan, token, caller: session, tool } = call
  const what = `call ${token} of ${tool} on ${session.label} ${JSON.stringify(plan)}`
  const outcome = call.outcome
  assert.ok(outcome !== undefined, `${what} never settled`)
  const seen = plugin.seen.get(token)
  const responses = answers(session.traffic, token, what)
  const got = outcome.ok ? JSON.stringify(outcome.result) : errorText(outcome.error)
  if (seen !== undefined) {
    assert.equal(seen.count, 1, `${what} reached its plugin ${seen.count} times`)
    assert.equal(seen.tool, tool, `${what} reached its plugin as another tool`)
    assert.ok(tool.startsWith(`${session.role}_`), `${what}: a session of role ${session.role} ran another role's tool`)
  }
  if (call.stateAtCall === 'dead') {
    // Its role was removed: the session is gone (404) and the call reaches nothing.
    const isGone = !outcome.ok && outcome.error instanceof StreamableHTTPError && outcome.error.code === 404
    assert.ok(!outcome.ok && (call.clientAborted || isGone),
      `${what}: a session whose role was removed answered ${got}`)
    assert.equal(seen, undefined, `${what}: reached a plugin`)
    countIn(tally, 'calls on ended sessions')
    return
  }
  if (call.endedInFlight) {
    // Toolport ended the session under it (its role was removed): the call is answered (an error,
    // or a 404 when its request came after the end), not left to the client's own timeout, unless
    // its stream was down then (the answer has no way to the client once the session is gone).
    assert.ok(call.droppedInFlight || !(!outcome.ok && isClientTimeout(outcome.error)),
      `${what}: in flight when its role was removed, and never answered: the client's own timeout ended it after ${CALL_TIMEOUT_MS} ms`)
    if (seen !== undefined && !seen.answered) assert.ok(seen.closedUnanswered, `${what}: its plugin request was never closed`)
    countIn(tally, 'ended in flight')
    return
  }
  if (plan.target === 'other_role' || plan.target === 'unknown') {
    assert.ok(!outcome.ok && outcome.error instanceof McpError && outcome.error.code === ErrorCode.InvalidParams,
      `${what}: expected the JSON-RPC error -32602, got ${got}`)
    const message = (outcome.error as McpError).message
    const named = /unknown tool '([^']*)'; available tools: (.*)$/.exec(message)
    assert.ok(named !== null && named[1] === tool, `${what}: ${message}`)
    // The tools it names are the session's role's own (README: "naming the available tools").
    const own = [toolOf(session.role, false), toolOf(session.role, true), EXTRA(session.role)]
    const available = (named[2] as string).split(', ')
    assert.ok(available.every((name) => own.includes(name)) && available.includes(toolOf(session.role, false)),
      `${what}: a session of role ${session.role} was told of other tools: ${message}`)
    assert.equal(seen, undefined, `${what}: reached a plugin`)
    assert.equal(responses, 1, `${what}: answered ${responses} times`)
    countIn(tally, 'unknown-tool errors')
    return
  }
  if (call.clientAborted) {
    assert.ok(!outcome.ok, `${what}: the client cancelled it, yet it resolved`)
    assert.ok(session.traffic.cancelled.has(token), `${what}: the client sent no notifications/cancelled`)
    if (seen !== undefined) {
      assert.ok(seen.answered || seen.closedUnanswered, `${what}: cancelled, but its plugin request was never closed`)
    }
    if (plan.behaviour === 'hang' && plan.target === 'own' && !call.endedAfterCancel) {
      // Nothing but the cancellation could end it: MCP "Cancellation", no response.
      assert.equal(responses, 0, `${what}: a cancelled call was answered: ${session.traffic.responses.get(token)?.join(' / ')}`)
      assert.ok(seen?.closedUnanswered === true, `${what}: the plugin did not see its request closed`)
    }
    countIn(tally, 'cancelled')
    return
  }
  assert.ok(outcome.ok, `${what}: expected a result, got ${got}`)
  assert.equal(responses, 1, `${what}: answered ${responses} times`)
  const timedOut: CallToolResult = {
    content: [{ type: 'text', text: JSON.stringify({ error: `tool '${tool}' timed out after ${SHORT_SECONDS} s` }) }],
    isError: true
  }
  const shape = resultShape(outcome.result)
  // A short tool's 150 ms may pass before its call is sent, on a loaded machine: it then never
  // reaches its plugin (docs/protocol.md R12: "one deadline covers queueing, connect, …").
  const expiredUnsent = plan.target === 'short' && plan.behaviour !== 'hang' && seen === undefined &&
    isDeepStrictEqual(shape, timedOut)
  assert.ok(seen !== undefined || expiredUnsent, `${what}: never reached its plugin; got ${got}`)
  if (seen === undefined) {
    countIn(tally, 'timed out before sent')
  } else if (plan.behaviour === 'hang') {
    assert.deepEqual(shape, timedOut, `${what}: the short tool's deadline`)
    assert.ok(seen.closedUnanswered, `${what}: timed out, but its plugin request was never closed`)
    countIn(tally, 'timed out')
  } else if (plan.target === 'short' && isDeepStrictEqual(shape, timedOut)) {
    // A slow reply may come just after the short deadline.
    countIn(tally, 'timed out')
  } else {
    assert.deepEqual(shape, expectedResult(plan.behaviour, token), what)
    countIn(tally, plan.behaviour)
  }
}

function describeTally (t: TestContext, tally: Map<string, number>): void {
  t.diagnostic([...tally].sort(([a], [b]) => a.localeCompare(b)).map(([k, n]) => `${k} ${n}`).join(', '))
}

test('MCP over Streamable HTTP: property: under random sessions, calls, cancellations, timeouts, drops, changes and role removals every call is answered once and rightly, and nothing is left behind', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const world = await startHttpWorld(t)
  await fc.assert(fc.asyncProperty(fc.limitShrink(scenarioArb, MAX_SHRINKS), async (scenario) => {
    const run = new HttpRun(world)
    try {
      await run.execute(scenario)
      await run.check()
      count(world, 'calls', run.calls.length)
      count(world, 'sessions', run.sessions.length)
    } finally {
      await run.dispose()
    }
  }), { numRuns: 12, includeErrorInReport: true })
  describeTally(t, world.tally)
})

// ---------------------------------------------------------------------------------------------
// The stdio bridge: one `toolport mcp --role A` process for the whole property, spawned as an MCP
// client application launches it, against Toolports that restart on one port.

type BridgeStep =
  | { kind: 'call', plan: CallPlan }
  /** Toolport closes and a new one starts on the same port (runtime-only registrations, R3). */
  | { kind: 'restart' }
  /** The host removes the bridge's role and adds it again. */
  | { kind: 'rebuild' }
  | { kind: 'change' }
  | { kind: 'pause', ms: number }

const BRIDGED: RoleName = 'A'

const bridgeStepArb: fc.Arbitrary<BridgeStep> = fc.oneof(
  { weight: 10, arbitrary: callArb.map((plan): BridgeStep => ({ kind: 'call', plan })) },
  { weight: 1, arbitrary: fc.constant<BridgeStep>({ kind: 'restart' }) },
  { weight: 1, arbitrary: fc.constant<BridgeStep>({ kind: 'rebuild' }) },
  { weight: 1, arbitrary: fc.constant<BridgeStep>({ kind: 'change' }) },
  { weight: 2, arbitrary: fc.integer({ min: 1, max: 30 }).map((ms): BridgeStep => ({ kind: 'pause', ms })) }
)

interface BridgeWorld {
  plugin: Plugin
  port: number
  tp: Toolport
  url: string
  /** Open event streams per session id on the current Toolport. */
  streams: Map<string, number>
  /** The bridged role's tools, as the current Toolport has them. */
  tools: string[]
  caller: Caller
  stderr: () => string
  toolports: Toolport[]
  runs: number
  extraVersion: number
  tally: Map<string, number>
}

/** A Toolport for the bridge on `port` (0: any), with both roles' call tools. */
async function startBridgeToolport (world: Pick<BridgeWorld, 'plugin' | 'toolports'>, port: number): Promise<{
  tp: Toolport,
  url: string,
  streams: Map<string, number>
}> {
  const tp = await createToolport({
    roles: ['A', 'B'],
    logger: false,
    dispatch: { mode: 'inline', closeGraceMs: 0 },
    mcp: { retryIntervalMs: RETRY_MS }
  })
  world.toolports.push(tp)
  const { url } = await tp.listen({ host: '127.0.0.1', port })
  for (const role of ['A', 'B']) await registerCallTools(tp, role, world.plugin)
  return { tp, url, streams: watchEventStreams(tp) }
}

async function startBridgeWorld (t: TestContext): Promise<BridgeWorld> {
  const plugin = await startPlugin(t)
  const toolports: Toolport[] = []
  t.after(async () => { for (const tp of toolports) await tp.close() })
  const first = await startBridgeToolport({ plugin, toolports }, 0)
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [...toolportCliArgs(), 'mcp', '--role', BRIDGED, '--url', first.url],
    cwd: ROOT,
    stderr: 'pipe'
  })
  let stderr = ''
  transport.stderr?.on('data', (chunk: Buffer) => { stderr += chunk.toString('utf8') })
  const client = new Client({ name: 'mcp-properties-bridge', version: '1.0.0' })
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => {})
  // t.after hooks run in order: the bridge stops before the Toolports close.
  t.after(() => client.close())
  await client.connect(transport)
  const caller: Caller = { label: `bridge(${BRIDGED})`, role: BRIDGED, client, traffic: watchTraffic(transport), state: 'live' }
  return {
    plugin,
    port: Number(new URL(first.url).port),
    ...first,
    tools: [toolOf(BRIDGED, false), toolOf(BRIDGED, true)],
    caller,
    stderr: () => stderr,
    toolports,
    runs: 0,
    extraVersion: 0,
    tally: new Map()
  }
}

async function runBridgeScenario (world: BridgeWorld, steps: BridgeStep[]): Promise<void> {
  const run = ++world.runs
  const calls: CallRecord[] = []
  const timers: NodeJS.Timeout[] = []
  const { caller, plugin } = world
  /** Notices the bridge's client had when a change it must be told of happened. */
  let noticesBefore = -1
  const settle = async (): Promise<void> => {
    await within(Promise.all(calls.map((c) => c.done)),
      () => `calls through the bridge never settled: ${calls.filter((c) => !c.isSettled).map((c) => c.token).join(', ')}`,
      CALL_TIMEOUT_MS + GUARD_MS)
  }
  try {
    // Listed first: Toolport tells a session of changes only once it has listed (README "MCP").
    await within(caller.client.listTools(), 'tools/list through the bridge', GUARD_MS)
    for (const step of steps) {
      switch (step.kind) {
        case 'call':
          calls.push(makeCall(caller, step.plan, `b${run}-c${calls.length}`, plugin, timers))
          break
        case 'pause':
          await sleep(step.ms)
          break
        case 'change': {
          if (noticesBefore < 0) noticesBefore = caller.traffic.notices
          const result = await world.tp.register({
            name: EXTRA(BRIDGED),
            role: BRIDGED,
            description: `version ${++world.extraVersion}`,
            callback_url: `${plugin.url}/extra`
          })
          assert.equal(result.ok, true, result.error)
          world.tools = [...world.tools.filter((name) => name !== EXTRA(BRIDGED)), EXTRA(BRIDGED)]
          break
        }
        case 'restart': {
          // Between calls: a call in flight when Toolport goes away is the last regression test.
          await settle()
          for (const call of calls) if (call.clientAborted) call.endedAfterCancel = true
          if (noticesBefore < 0) noticesBefore = caller.traffic.notices
          await world.tp.close()
          const next = await startBridgeToolport(world, world.port)
          Object.assign(world, next)
          world.tools = [toolOf(BRIDGED, false), toolOf(BRIDGED, true)]
          countIn(world.tally, 'restarts')
          break
        }
        case 'rebuild':
          await settle()
          for (const call of calls) if (call.clientAborted) call.endedAfterCancel = true
          if (noticesBefore < 0) noticesBefore = caller.traffic.notices
          world.tp.roles.remove(BRIDGED)
          world.tp.roles.add(BRIDGED)
          await registerCallTools(world.tp, BRIDGED, plugin)
          world.tools = [toolOf(BRIDGED, false), toolOf(BRIDGED, true)]
          countIn(world.tally, 'rebuilds')
          break
      }
    }
    await settle()
    await eventually(() => plugin.active === 0 ? '' : `${plugin.active} plugin requests still open after every call through the bridge was answered`)
    await sleep(RETRY_MS * 4)
    for (const call of calls) checkCall(call, plugin, world.tally)
    countIn(world.tally, 'calls', calls.length)
    // The bridge lists the current role's tools (re-initializing after a restart or a rebuild)…
    const { tools } = await within(caller.client.listTools(), 'tools/list through the bridge', GUARD_MS)
    assert.deepEqual(tools.map((tool) => tool.name), world.tools, 'tools/list through the bridge is its role\'s tools')
    // …and told its client to re-list after a change, a restart or a rebuild.
    if (noticesBefore >= 0) {
      await eventually(() => caller.traffic.notices > noticesBefore
        ? ''
        : 'the bridge did not pass on a list_changed after its role\'s tools changed')
    }
    // Toolport holds exactly the bridge's one session, and it at most one event stream.
    await eventually(() => {
      const sessions = world.tp.roles.get(BRIDGED).sessions()
      if (sessions.length !== 1 || world.tp.roles.get('B').sessions().length !== 0) {
        return `Toolport holds ${sessions.length} sessions of role ${BRIDGED} for the one bridge`
      }
      const open = world.streams.get((sessions[0] as { sessionId?: string }).sessionId ?? '') ?? 0
      return open <= 1 ? '' : `the bridge's session holds ${open} event streams (GET) once its calls are answered`
    })
    assert.equal(world.tp[kPendingCalls], 0, 'no call pending in the dispatcher')
  } catch (err) {
    throw new Error(`${(err as Error).message}\nbridge stderr:\n${world.stderr().slice(-2000)}`, { cause: err })
  } finally {
    for (const timer of timers) clearTimeout(timer)
    plugin.dropHeld()
  }
}

test('toolport mcp (the stdio bridge): property: under random calls, cancellations, timeouts, Toolport restarts on its port, role removals and changes every call is answered once and rightly, and Toolport holds one session', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const world = await startBridgeWorld(t)
  const steps = fc.array(bridgeStepArb, { minLength: 1, maxLength: 14 })
    .map((list) => { let calls = 0; return list.filter((s) => s.kind !== 'call' || ++calls <= 8) })
  await fc.assert(fc.asyncProperty(fc.limitShrink(steps, MAX_SHRINKS), async (list) => {
    await runBridgeScenario(world, list)
  }), { numRuns: 6, includeErrorInReport: true })
  describeTally(t, world.tally)
})

// ---------------------------------------------------------------------------------------------
// Cases the properties found, shrunk.

/** A listening Toolport with roles A and B, its plugin's call tools, and its event streams watched. */
async function smallWorld (t: TestContext): Promise<{
  tp: Toolport,
  url: string,
  plugin: Plugin,
  streams: Map<string, number>
}> {
  const plugin = await startPlugin(t)
  const tp = await createToolport({
    roles: ['A', 'B'],
    logger: false,
    dispatch: { mode: 'inline', closeGraceMs: 0 },
    mcp: { retryIntervalMs: RETRY_MS }
  })
  t.after(() => tp.close())
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  for (const role of ['A', 'B']) await registerCallTools(tp, role, plugin)
  return { tp, url, plugin, streams: watchEventStreams(tp) }
}

async function sessionOf (t: TestContext, url: string, role: RoleName): Promise<HttpSession> {
  const session = new HttpSession(url, role)
  t.after(() => session.close())
  await session.connect()
  await session.client.listTools()
  return session
}

/** Fails unless the session holds at most one event stream once the client's reconnections are done. */
async function assertOneStream (streams: Map<string, number>, session: HttpSession, why: string): Promise<void> {
  await sleep(RETRY_MS * 5)
  await eventually(() => {
    const open = streams.get(session.sessionId) ?? 0
    return open <= 1 ? '' : `${why}: the session holds ${open} event streams (GET); only its one standalone stream should be left`
  }, 500)
}

// A request stream that has nothing more to send is not held open once the client resumes it.
// Toolport ends a cancelled call's stream without an answer (sessions/mcp.ts #onCancelled); the SDK
// client, holding the stream's priming event id, resumes it with GET Last-Event-ID after `retry`.
// That resume must not be held open for good (one connection, keep-alive timer and stream per
// cancelled call, until the session ends): it is refused, as the stream has nothing left to send
// (endFinishedStreamsOnResume).
test('a cancelled call leaves no event stream behind: the client\'s resumed stream of it is not held open', async (t) => {
  const { url, plugin, streams } = await smallWorld(t)
  const session = await sessionOf(t, url, 'A')
  const controller = new AbortController()
  const call = session.client.callTool({ name: toolOf('A', false), arguments: { token: 'x1', behaviour: 'hang', delay_ms: 0 } },
    undefined, { signal: controller.signal })
  await within(plugin.arrived('x1'), 'the call at the plugin', GUARD_MS)
  controller.abort()
  await assert.rejects(call)
  await eventually(() => plugin.seen.get('x1')?.closedUnanswered === true ? '' : 'the plugin request was not closed')
  assert.equal(session.traffic.responses.get('x1'), undefined, 'no answer for a cancelled call')
  await assertOneStream(streams, session, 'after one cancelled call')
})

// The same for a call answered with a JSON-RPC error (an unknown tool, -32602). The SDK client
// takes only a result as the end of a request's stream, so it resumes the stream after the error;
// that resume must not be held open, as above.
test('a call answered with a JSON-RPC error (unknown tool) leaves no event stream behind', async (t) => {
  const { url, streams } = await smallWorld(t)
  const session = await sessionOf(t, url, 'A')
  await assert.rejects(session.client.callTool({ name: 'no_such_tool', arguments: { token: 'x2' } }),
    (err: unknown) => err instanceof McpError && err.code === ErrorCode.InvalidParams)
  await assertOneStream(streams, session, 'after one unknown-tool call')
})

// The same for a call whose stream dropped before its answer: the client resumes it and gets the
// stored answer (as docs/protocol.md promises), and the resumed GET then ends instead of being
// held open.
test('a dropped call stream resumed with Last-Event-ID gets its answer, and is then not held open', async (t) => {
  const { url, plugin, streams } = await smallWorld(t)
  const session = await sessionOf(t, url, 'A')
  // Answered 10 ms after it arrived, while the client waits RETRY_MS (40 ms) to resume.
  const call = session.client.callTool({ name: toolOf('A', false), arguments: { token: 'x3', behaviour: 'json', delay_ms: 10 } })
  await within(plugin.arrived('x3'), 'the call at the plugin', GUARD_MS)
  assert.ok(session.drop(true) >= 1, 'the call\'s stream dropped')
  const result = await within(call, 'the answer on the resumed stream', GUARD_MS) as CallToolResult
  assert.deepEqual(resultShape(result), expectedResult('json', 'x3'))
  await assertOneStream(streams, session, 'after one resumed call')
})

// A change made while a session's event stream is down is announced on the event stream the client
// reopens, even when it first resumes a *call's* stream (GET with that stream's Last-Event-ID):
// only the standalone stream is the session's event stream (McpSession.handle, sessions/mcp.ts),
// and a fresh one is sent list_changed while the client's list is out of date (#announceIfStale;
// docs/protocol.md "MCP endpoint": "a tool change is never lost to a dropped stream").
test('a change made while the event stream is down is announced when it reopens, even after a call\'s stream was resumed first', async (t) => {
  const { tp, url, plugin } = await smallWorld(t)
  const endpoint = `${url}/mcp/A`
  const { post, session } = await rawListedSession(endpoint)
  // A call is in flight; its stream drops after its priming event (no event stream is open).
  const call = await post({ jsonrpc: '2.0', id: 3, method: 'tools/call', params: { name: toolOf('A', false), arguments: { token: 'x4', behaviour: 'hang', delay_ms: 0 } } }, session)
  const priming = await readUntil(call.body, /id: (\S+)\n/)
  call.body.destroy()
  await within(plugin.arrived('x4'), 'the call at the plugin', GUARD_MS)
  // The role changes meanwhile.
  const changed = await tp.register({ name: EXTRA('A'), role: 'A', callback_url: `${plugin.url}/extra` })
  assert.equal(changed.ok, true)
  // The client resumes the call's stream first, then opens its event stream.
  const resumed = await httpRequest(endpoint, { method: 'GET', headers: { ...session, accept: 'text/event-stream', 'last-event-id': priming[1] as string } })
  assert.equal(resumed.statusCode, 200)
  const events = await httpRequest(endpoint, { method: 'GET', headers: { ...session, accept: 'text/event-stream' } })
  assert.equal(events.statusCode, 200)
  try {
    await within(readUntil(events.body, /notifications\/tools\/list_changed/), 'list_changed on the reopened event stream', 1_000)
  } finally {
    resumed.body.destroy()
    events.body.destroy()
  }
})

// A change notice on its way when the event stream drops is not lost when the client had no event
// id on that stream yet (it reopens without Last-Event-ID, so nothing is replayed): the sync wrote
// it to the stream the server still had, and the fresh stream is sent list_changed because the
// client's list is out of date (sessions/mcp.ts #announceIfStale).
test('a change notice on its way when the event stream drops is sent again on the stream the client reopens', async (t) => {
  const { tp, url, plugin } = await smallWorld(t)
  const endpoint = `${url}/mcp/A`
  const { session } = await rawListedSession(endpoint)
  const first = await httpRequest(endpoint, { method: 'GET', headers: { ...session, accept: 'text/event-stream' } })
  assert.equal(first.statusCode, 200)
  // The change is announced on the open stream, which drops before the client reads it.
  const changed = await tp.register({ name: EXTRA('A'), role: 'A', callback_url: `${plugin.url}/extra` })
  assert.equal(changed.ok, true)
  first.body.destroy()
  await sleep(50)
  // The client reopens its event stream; it never had an event id on it.
  const events = await httpRequest(endpoint, { method: 'GET', headers: { ...session, accept: 'text/event-stream' } })
  assert.equal(events.statusCode, 200)
  try {
    await within(readUntil(events.body, /notifications\/tools\/list_changed/), 'list_changed on the reopened event stream', 1_000)
  } finally {
    events.body.destroy()
  }
})

/**
 * A session opened with raw HTTP requests (no SDK client): initialize, notifications/initialized
 * and one tools/list, each answer read to its end, so the client's list is up to date. `post`
 * sends a JSON-RPC message to `endpoint`; `session` is the headers that name the session.
 */
async function rawListedSession (endpoint: string): Promise<{
  post: (body: unknown, headers?: Record<string, string>) => ReturnType<typeof httpRequest>
  session: Record<string, string>
}> {
  const version = '2025-11-25'
  const post = async (body: unknown, headers: Record<string, string> = {}) => await httpRequest(endpoint, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
    body: JSON.stringify(body)
  })
  const init = await post({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: version, capabilities: {}, clientInfo: { name: 'raw', version: '1' } } })
  const session = { 'mcp-session-id': init.headers['mcp-session-id'] as string, 'mcp-protocol-version': version }
  await init.body.dump()
  await (await post({ jsonrpc: '2.0', method: 'notifications/initialized' }, session)).body.dump()
  await (await post({ jsonrpc: '2.0', id: 2, method: 'tools/list' }, session)).body.dump()
  return { post, session }
}

/** Reads a response body until `pattern` matches what came so far; the match. */
async function readUntil (body: AsyncIterable<unknown>, pattern: RegExp): Promise<RegExpExecArray> {
  let text = ''
  for await (const chunk of body) {
    text += String(chunk)
    const match = pattern.exec(text)
    if (match !== null) return match
  }
  throw new Error(`the stream ended without ${String(pattern)}: ${text}`)
}

// A call in flight when Toolport ends its session (its role removed; the same on close) is answered
// at once with a JSON-RPC error (McpSession.close, #answerRunning in sessions/mcp.ts), instead of
// its answer being dropped with the aborted handler as for a cancelled request, which would leave
// the client, which cancelled nothing, to its own request timeout (60 s by default in the SDK;
// this test gives it 2.5 s). Its plugin request is closed.
test('a call in flight when its session\'s role is removed is answered at once, not left to the client\'s timeout', async (t) => {
  const { tp, url, plugin } = await smallWorld(t)
  const session = await sessionOf(t, url, 'B')
  const call = session.client.callTool({ name: toolOf('B', false), arguments: { token: 'x5', behaviour: 'hang', delay_ms: 0 } },
    undefined, { timeout: CALL_TIMEOUT_MS })
  const settled = call.then(() => 'answered', (err: unknown) => isClientTimeout(err) ? 'never answered (client timeout)' : 'answered')
  await within(plugin.arrived('x5'), 'the call at the plugin', GUARD_MS)
  tp.roles.remove('B')
  assert.equal(await settled, 'answered')
  await eventually(() => plugin.seen.get('x5')?.closedUnanswered === true ? '' : 'the plugin request was not closed')
})

// The same through the bridge when Toolport restarts: the bridge's upstream call is answered when
// Toolport closes, and the bridge passes that answer on at once, instead of its client waiting for
// the bridge's next ping (every 15 s) to find the session gone.
test('toolport mcp: a call in flight when Toolport restarts is answered at once', async (t) => {
  const world = await startBridgeWorld(t)
  const call = world.caller.client.callTool({ name: toolOf(BRIDGED, false), arguments: { token: 'x6', behaviour: 'hang', delay_ms: 0 } },
    undefined, { timeout: 60_000 })
  call.catch(() => {})
  await within(world.plugin.arrived('x6'), 'the call at the plugin', GUARD_MS)
  await world.tp.close()
  await within(call.then(() => {}, () => {}), 'an answer to the call through the bridge after Toolport closed', 3_000)
})

// Calls made together through the bridge after its upstream session was lost (its role removed and
// added again; the same after a Toolport restart) are all retried on one new session: each got a
// 404 for the old session, so none ran. The first 404 must not close the old client under the
// others (cli-bridge.ts #dropUpstream retires it), which would reject their requests with
// "Connection closed", a failure the bridge cannot tell from a call that may have run.
test('toolport mcp: calls made together after the bridge\'s session was lost are all retried on one new session', async (t) => {
  const world = await startBridgeWorld(t)
  const tokens = ['y1', 'y2', 'y3']
  const first = await world.caller.client.callTool({ name: toolOf(BRIDGED, false), arguments: { token: 'y0', behaviour: 'json', delay_ms: 0 } })
  assert.deepEqual(resultShape(first as CallToolResult), expectedResult('json', 'y0'))
  world.tp.roles.remove(BRIDGED)
  world.tp.roles.add(BRIDGED)
  await registerCallTools(world.tp, BRIDGED, world.plugin)
  const results = await within(Promise.all(tokens.map(async (token) => await world.caller.client.callTool({
    name: toolOf(BRIDGED, false),
    arguments: { token, behaviour: 'json', delay_ms: 0 }
  }))), 'the calls through the bridge', GUARD_MS)
  for (const [i, token] of tokens.entries()) {
    assert.deepEqual(resultShape(results[i] as CallToolResult), expectedResult('json', token), `call ${token}`)
  }
  await sleep(RETRY_MS * 4)
  assert.equal(world.tp.roles.get(BRIDGED).sessions().length, 1, 'one session for the one bridge')
})
