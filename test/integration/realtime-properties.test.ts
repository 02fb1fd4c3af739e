// A property of the OpenAI-Realtime adapter (src/main/sessions/realtime.ts; README "The
// OpenAI-Realtime adapter"; docs/protocol.md "Sync", R8), against a real Toolport whose tools call
// a real plugin on 127.0.0.1. There is no OpenAI server here: each session's provider side is
// played by the test, as test/integration/realtime.test.ts does, with the event schema of the
// OpenAI Realtime API (beta and GA names): response.created, response.output_item.added,
// conversation.item.created/added, response.function_call_arguments.delta/done,
// response.output_item.done, response.done (completed; cancelled with status_details
// turn_detected after input_audio_buffer.speech_started; failed; incomplete), plus the
// `response.cancelled` of providers without response.done status, `error` events (with the
// update's event_id, another event's, none) and `session.updated` acknowledgements. The sessions
// talk over a `ws` socket (the host feeds each message to handleServerEvent as text, bytes or an
// object) or in-process, the provider answering a turn later or inside `send` itself; the host's
// `send` returns nothing, a promise, or throws now and then (a real host may do any of these).
//
// Each run draws 1–3 sessions on two roles (flat or nested dialect, autoRespond on or off, a
// rate limit or none; joined by createRealtimeSession, attach() or replaceSessions; an
// acknowledgement mode: at once, late, without tools, after an unrelated error, rejected with a
// provider code, or never), each with a script: responses of 0–4 function calls (tools that
// answer, answer a tool error, answer HTTP 500, answer late or never; unknown names; invalid JSON
// or schema-invalid arguments), their events in legal but varied orders (arguments.done before or
// after output_item.done, or only one of them, or only in response.done's output; name-less
// arguments.done), duplicated; two responses at once; barge-in at a random point of a response
// (before its calls, while they run, after they answered); a late response.cancelled for a
// completed response; replays of earlier events; unrelated server events and garbage;
// registrations and unregistrations of the session's role mid-response (syncs are session.update
// round trips, acknowledged or not); close() at random points, inside a response, or from inside
// `send` (a host that finds its socket closed).
//
// A model reads the events in the order the adapter was handed them, with the registry as it was
// at that moment, and says what must follow. Checked after each run:
// - each call_id runs (reaches Toolport: `call-finished`) at most once, and exactly once when it
//   was announced before its response ended cancelled and before close(); its plugin sees it at
//   most once, and exactly once when it answered; a call refused by the rate limit never runs;
// - a call is answered `cancelled` exactly when its response was cancelled (or the session
//   closed) before the call finished; every plugin request ends, answered or closed by Toolport
//   (a cancelled call's plugin sees the disconnect; a hanging one is always closed);
// - every call of a completed response that finished before close() gets exactly one
//   function_call_output with its call_id and its own result's text (the plugin's reply, the
//   unknown-tool or invalid-arguments error, the rate-limit refusal), sent only after its
//   response.done; none for a cancelled or failed response;
// - exactly one response.create per completed response with outputs (when autoRespond; for
//   responses whose calls were all refused by the rate limit, only the first, with tool_choice
//   none), right after that response's last output; none with autoRespond false;
// - nothing at all is sent after close();
// - each registration's and unregistration's outcome is what the role's sessions answered:
//   ok when every one acknowledged, else the role in failed_roles with the provider's code, the
//   ack timeout, or the session closed under it; the last session.update of every live session
//   holds exactly the role's tools, in its dialect (and sessionFields);
// - close() leaves no call running and detaches from the role; nothing hangs (hang guards).
// A failing case found (seed, path) may need a few replays: the plugin's answers race the script.
// The tests after the property pin the bugs it found, shrunk.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { EventEmitter, once } from 'node:events'
import { createServer, type ServerResponse } from 'node:http'
import { Session as InspectorSession } from 'node:inspector/promises'
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import fc from 'fast-check'
import { WebSocket, WebSocketServer } from 'ws'
import {
  createRealtimeSession, type CallFinishedEvent, type RealtimeClientEvent, type RealtimeSession,
  type RegisterResult, type Toolport, type UnregisterResult
} from '../../src/main/index.js'
import { kPendingCalls } from '../../src/main/symbols.js'
import { createTestToolport, listenOnLoopback, within } from '../helpers.js'

type Json = Record<string, any>

const ROLES = ['A', 'B'] as const
type RoleName = typeof ROLES[number]

/** Tools every role has, each a route of the plugin. */
const STABLE = ['ok', 'toolerr', 'fail500', 'slow', 'hang'] as const
/** Tools the scripts register and unregister for their role mid-response. */
const CHURN = ['extra0', 'extra1'] as const
type Churn = typeof CHURN[number]
/** `nope` is a name no role ever has. */
type ToolName = typeof STABLE[number] | Churn | 'nope'
const ROUTES: Record<string, string> = {
  ok: '/ok', toolerr: '/toolerr', fail500: '/500', slow: '/slow', hang: '/hang', extra0: '/ok', extra1: '/ok'
}
const PARAMETERS = {
  type: 'object',
  properties: { n: { type: 'integer' }, d: { type: 'integer', minimum: 0, maximum: 100 } },
  required: ['n'],
  additionalProperties: false
}

/** ackTimeoutMs of sessions whose provider never acknowledges, and of every other one. */
const SILENT_ACK_MS = 40
const ACK_MS = 3_000
/** Toolport's syncTimeoutMs: longer than any ackTimeoutMs, so a missing ack is the adapter's error. */
const SYNC_TIMEOUT_MS = 5_000
/** A rate-limit window far longer than a run: once full, every later call of the session is refused. */
const RATE_WINDOW_MS = 600_000
const SCRIPT_GUARD_MS = 15_000
const SETTLE_GUARD_MS = 8_000
const NUM_RUNS = 45
const MAX_SHRINKS = 40
const FAILING_TIMEOUT_MS = 600_000

/** One clock for every recorded happening of a run: handled events, sent events, finished calls, close(). */
let clock = 0
function tick (): number {
  return ++clock
}

// ---------------------------------------------------------------------------------------------
// The plugin: one HTTP server on 127.0.0.1, a route per behaviour, noting what each call id did.

interface PluginCall {
  arrivals: number
  /** Replies the plugin sent. */
  answered: number
  /** Requests whose connection Toolport closed before the plugin answered. */
  closedEarly: number
  /** The body's call_id was not the x-toolport-call-id header. */
  mismatch: boolean
}

interface Plugin {
  url: string
  calls: Map<string, PluginCall>
  /** Requests open now. */
  readonly active: number
}

async function startPlugin (t: TestContext): Promise<Plugin> {
  const calls = new Map<string, PluginCall>()
  const held = new Set<ServerResponse>()
  let active = 0
  const server = createServer((request, response) => {
    const id = String(request.headers['x-toolport-call-id'])
    let record = calls.get(id)
    if (record === undefined) {
      record = { arrivals: 0, answered: 0, closedEarly: 0, mismatch: false }
      calls.set(id, record)
    }
    const call = record
    call.arrivals++
    active++
    held.add(response)
    let isAnswered = false
    response.once('close', () => {
      active--
      held.delete(response)
      if (!isAnswered) call.closedEarly++
    })
    const reply = (status: number, type: string, body: string): void => {
      if (isAnswered || response.destroyed) return
      isAnswered = true
      call.answered++
      response.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body) })
      response.end(body)
    }
    const chunks: Buffer[] = []
    request.on('data', (chunk: Buffer) => { chunks.push(chunk) })
    request.on('end', () => {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { call_id: string, arguments: { n: number, d?: number } }
      if (body.call_id !== id) call.mismatch = true
      const answer = (): void => {
        reply(200, 'application/json', JSON.stringify({ output: { call: id, n: body.arguments.n }, is_error: false }))
      }
      switch (request.url) {
        case '/ok':
          setTimeout(answer, body.arguments.d ?? 0)
          break
        case '/slow':
          setTimeout(answer, 15 + (body.arguments.d ?? 0))
          break
        case '/toolerr':
          reply(200, 'application/json', JSON.stringify({ is_error: true, error: `refused ${id}` }))
          break
        case '/500':
          reply(500, 'text/plain', `failed ${id}`)
          break
        case '/hang':
          break
        default:
          reply(404, 'text/plain', 'no such route')
      }
    })
  })
  server.keepAliveTimeout = 120_000
  return {
    url: await listenOnLoopback(t, server, () => { for (const response of held) response.socket?.destroy() }),
    calls,
    get active () { return active }
  }
}

// ---------------------------------------------------------------------------------------------
// Scenarios.

/**
 * `ws`: a socket; `direct`: in-process, the provider answering on a later turn; `sync`: in-process,
 * the provider answering session.update inside `send` (re-entering handleServerEvent).
 */
type Transport = 'ws' | 'direct' | 'sync'
/** What the host's `send` returns: nothing, a promise settled a turn later, or it throws now and then. */
type SendMode = 'sync' | 'async' | 'throws'
/** How the adapter joins its role: createRealtimeSession, `attach: false` + attach(), or replaceSessions. */
type AttachVia = 'auto' | 'attach' | 'replace'
/** How the host hands a message to handleServerEvent. */
type Feed = 'string' | 'buffer' | 'object'
/**
 * How the provider answers session.update: session.updated echoing the session (at once, or
 * 3–15 ms late, or after an `error` about another event), session.updated without a tool list
 * (matched to the oldest update), an `error` naming the update's event_id, or nothing.
 */
type AckMode = 'ack' | 'late' | 'bare' | 'noisy' | 'reject' | 'silent'
const FAILING_ACKS: ReadonlySet<AckMode> = new Set(['reject', 'silent'])
type ArgsKind = 'valid' | 'badjson' | 'invalid'
/** Which events announce a call, in order (output_item.added and the delta always come first). */
type Announce = 'args-first' | 'item-first' | 'args-only' | 'item-only' | 'done-only'
/**
 * `incomplete`: response.done status incomplete (e.g. max_output_tokens), cut short like a barge-in
 * but not cancelled: the calls it completed are answered.
 */
type Ending = 'completed' | 'incomplete' | 'cancelled' | 'failed' | 'cancelled-event'

interface CallPlan {
  tool: ToolName
  args: ArgsKind
  n: number
  /** The plugin's delay (ms) for ok and slow. */
  d: number
  announce: Announce
  /** arguments.done without `name` (the adapter takes it from output_item.added). */
  nameless: boolean
  /** Pause before this call's events. */
  gapMs: number
  /** Each announcing event is played twice. */
  dupe: boolean
}

interface ResponsePlan {
  kind: 'response'
  calls: CallPlan[]
  ending: Ending
  /** For a response that does not complete: the fraction of its events played before it ends. */
  cut: number
  /** response.done lists the output items (else an empty output). */
  listsOutput: boolean
  /** Pause before the response ends (its calls run meanwhile). */
  preEndMs: number
  /** close() right before the response's last event. */
  closeInside: boolean
  /** After it completed, a provider announces it cancelled all the same (too late to matter). */
  lateCancel: boolean
}

type Step =
  | ResponsePlan
  /** Two responses whose events interleave (an out-of-band response beside the conversation's). */
  | { kind: 'parallel', first: ResponsePlan, second: ResponsePlan }
  | { kind: 'wait', ms: number }
  | { kind: 'mutate', op: 'register' | 'unregister', tool: Churn }
  | { kind: 'noise', variant: number }
  /** Plays again the response event at `pick` modulo those played so far. */
  | { kind: 'replay', pick: number }
  | { kind: 'close' }

interface SessionPlan {
  role: RoleName
  transport: Transport
  sendMode: SendMode
  attachVia: AttachVia
  feed: Feed
  api: 'beta' | 'ga'
  dialect: 'flat' | 'nested'
  autoRespond: boolean
  /** maxCalls per RATE_WINDOW_MS, or no limit. */
  rateLimit: number | false
  ack: AckMode
  /**
   * The host closes the session inside `send` of its k-th output or response.create (it found its
   * socket closed), or never.
   */
  closeOnSend: number | null
  /** sessionFields `{type: 'realtime'}` (OpenAI GA). */
  gaFields: boolean
  steps: Step[]
}

const callArb: fc.Arbitrary<CallPlan> = fc.record({
  tool: fc.oneof(
    { weight: 4, arbitrary: fc.constantFrom<ToolName>('ok', 'slow') },
    { weight: 3, arbitrary: fc.constantFrom<ToolName>('toolerr', 'fail500', 'hang') },
    { weight: 2, arbitrary: fc.constantFrom<ToolName>('extra0', 'extra1') },
    { weight: 1, arbitrary: fc.constant<ToolName>('nope') }
  ),
  args: fc.oneof({ weight: 8, arbitrary: fc.constant<ArgsKind>('valid') }, { weight: 1, arbitrary: fc.constantFrom<ArgsKind>('badjson', 'invalid') }),
  n: fc.integer({ min: 0, max: 999 }),
  d: fc.integer({ min: 0, max: 12 }),
  announce: fc.constantFrom<Announce>('args-first', 'item-first', 'args-only', 'item-only', 'done-only'),
  nameless: fc.boolean(),
  gapMs: fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 8 })),
  dupe: fc.boolean()
})

const responseArb: fc.Arbitrary<ResponsePlan> = fc.record({
  calls: fc.oneof({ weight: 1, arbitrary: fc.constant<CallPlan[]>([]) }, { weight: 6, arbitrary: fc.array(callArb, { minLength: 1, maxLength: 4, size: 'max' }) }),
  ending: fc.oneof(
    { weight: 3, arbitrary: fc.constant<Ending>('completed') },
    { weight: 2, arbitrary: fc.constant<Ending>('cancelled') },
    { weight: 1, arbitrary: fc.constantFrom<Ending>('failed', 'cancelled-event', 'incomplete') }
  ),
  cut: fc.integer({ min: 0, max: 1000 }).map((n) => n / 1000),
  listsOutput: fc.oneof({ weight: 4, arbitrary: fc.constant(true) }, { weight: 1, arbitrary: fc.constant(false) }),
  preEndMs: fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 25 })),
  closeInside: fc.oneof({ weight: 15, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
  lateCancel: fc.oneof({ weight: 8, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) })
}).map((plan): ResponsePlan => ({
  kind: 'response',
  ...plan,
  // A plugin that never answers is only called where a barge-in or close() ends the call.
  calls: plan.calls.map((call) => call.tool === 'hang' && (plan.ending === 'completed' || plan.ending === 'incomplete') && !plan.closeInside
    ? { ...call, tool: 'slow' }
    : call)
}))

const stepArb: fc.Arbitrary<Step> = fc.oneof(
  { weight: 12, arbitrary: responseArb },
  { weight: 2, arbitrary: fc.record({ first: responseArb, second: responseArb }).map((pair): Step => ({ kind: 'parallel', ...pair })) },
  { weight: 2, arbitrary: fc.integer({ min: 0, max: 20 }).map((ms): Step => ({ kind: 'wait', ms })) },
  {
    weight: 4,
    arbitrary: fc.record({ op: fc.constantFrom<'register' | 'unregister'>('register', 'unregister'), tool: fc.constantFrom(...CHURN) })
      .map((m): Step => ({ kind: 'mutate', ...m }))
  },
  { weight: 2, arbitrary: fc.integer({ min: 0, max: 6 }).map((variant): Step => ({ kind: 'noise', variant })) },
  { weight: 2, arbitrary: fc.nat().map((pick): Step => ({ kind: 'replay', pick })) },
  { weight: 1, arbitrary: fc.constant<Step>({ kind: 'close' }) }
)

const sessionArb: fc.Arbitrary<SessionPlan> = fc.record({
  role: fc.constantFrom(...ROLES),
  transport: fc.constantFrom<Transport>('ws', 'direct', 'sync'),
  sendMode: fc.constantFrom<SendMode>('sync', 'async', 'throws'),
  attachVia: fc.oneof({ weight: 3, arbitrary: fc.constant<AttachVia>('auto') }, { weight: 1, arbitrary: fc.constantFrom<AttachVia>('attach', 'replace') }),
  feed: fc.constantFrom<Feed>('string', 'buffer', 'object'),
  api: fc.constantFrom<'beta' | 'ga'>('beta', 'ga'),
  dialect: fc.constantFrom<'flat' | 'nested'>('flat', 'nested'),
  autoRespond: fc.oneof({ weight: 4, arbitrary: fc.constant(true) }, { weight: 1, arbitrary: fc.constant(false) }),
  rateLimit: fc.oneof(
    { weight: 4, arbitrary: fc.constant<false>(false) },
    { weight: 1, arbitrary: fc.integer({ min: 1, max: 3 }) }
  ),
  ack: fc.oneof(
    { weight: 6, arbitrary: fc.constantFrom<AckMode>('ack', 'late', 'bare', 'noisy') },
    { weight: 1, arbitrary: fc.constantFrom<AckMode>('reject', 'silent') }
  ),
  gaFields: fc.boolean(),
  closeOnSend: fc.oneof(
    { weight: 6, arbitrary: fc.constant(null) },
    { weight: 1, arbitrary: fc.integer({ min: 1, max: 4 }) }
  ),
  steps: fc.array(stepArb, { minLength: 2, maxLength: 7, size: 'max' })
})

const scenarioArb = fc.array(sessionArb, { minLength: 1, maxLength: 3 })

// ---------------------------------------------------------------------------------------------
// The host and the provider of one session.

interface Sent {
  seq: number
  event: Json
}

interface Handled {
  seq: number
  /** null: not a JSON object (the adapter ignores it). */
  event: Json | null
  /** The role's tool names when the adapter was handed the event. */
  names: string[]
}

interface Env {
  tp: Toolport
  plugin: Plugin
  wss: WebSocketServer
  /** Server-side sockets by the path their client connected to. */
  sockets: EventEmitter
  finished: Map<string, Array<{ seq: number, outcome: CallFinishedEvent['outcome'] }>>
  /** What the runs did, for the diagnostic line (a property that exercises nothing passes too). */
  tally: Map<string, number>
}

function count (env: Env, key: string, n = 1): void {
  env.tally.set(key, (env.tally.get(key) ?? 0) + n)
}

let serial = 0

class Link extends EventEmitter {
  readonly plan: SessionPlan
  readonly id: string
  readonly env: Env
  session: RealtimeSession | null = null
  /** Client events the adapter sent, in order. */
  readonly sent: Sent[] = []
  /** Server events handed to the adapter, in order. */
  readonly handled: Handled[] = []
  /** Response events played, for replays. */
  readonly history: Json[] = []
  played = 0
  createdSeq = Infinity
  closeSeq = Infinity
  /** close() came from inside `send`. */
  closedInSend = false
  readonly #timers = new Set<NodeJS.Timeout>()
  /** Server events that came before the adapter existed. */
  readonly #early: Array<[string, Buffer | null]> = []
  /** Outputs and response.create sent, and those of them whose send threw. */
  #responseEvents = 0
  #sends = 0
  #client: WebSocket | null = null
  #server: WebSocket | null = null
  #isTornDown = false

  constructor (env: Env, plan: SessionPlan, id: string) {
    super()
    this.env = env
    this.plan = plan
    this.id = id
  }

  async open (): Promise<void> {
    if (this.plan.transport === 'ws') {
      const address = this.env.wss.address() as AddressInfo
      const accepted = once(this.env.sockets, this.id) as Promise<[WebSocket]>
      const client = new WebSocket(`ws://127.0.0.1:${address.port}/${this.id}`)
      this.#client = client
      const [server] = await accepted
      this.#server = server
      if (client.readyState !== WebSocket.OPEN) await once(client, 'open')
      client.on('message', (data: Buffer) => { this.#deliver(data.toString('utf8'), data) })
      server.on('message', (data: Buffer) => { this.#onClientEvent(JSON.parse(data.toString('utf8')) as Json) })
    }
    const plan = this.plan
    this.createdSeq = tick()
    this.session = createRealtimeSession({
      toolport: this.env.tp,
      role: plan.role,
      id: this.id,
      send: (event) => this.#send(event),
      dialect: plan.dialect,
      autoRespond: plan.autoRespond,
      ackTimeoutMs: plan.ack === 'silent' ? SILENT_ACK_MS : ACK_MS,
      rateLimit: plan.rateLimit === false ? false : { maxCalls: plan.rateLimit, windowMs: RATE_WINDOW_MS },
      ...(plan.gaFields ? { sessionFields: { type: 'realtime' } } : {}),
      attach: plan.attachVia === 'auto'
    })
    // A provider answering inside send (the `sync` transport) answered the first session.update
    // before createRealtimeSession returned: the host hands it over now.
    for (const [text, raw] of this.#early.splice(0)) this.#deliver(text, raw)
    if (plan.attachVia === 'attach') this.session.attach()
    if (plan.attachVia === 'replace') this.env.tp.roles.get(plan.role).replaceSessions([], [this.session]).catch(() => {})
  }

  /** Plays server events (objects get an event_id unless they have one; strings go as they are). */
  play (...events: Array<Json | string>): void {
    for (const event of events) {
      const text = typeof event === 'string' ? event : JSON.stringify({ event_id: `evt_${++serial}`, ...event })
      if (typeof event !== 'string' && /^(response|conversation)\./.test(String(event.type))) {
        this.history.push(JSON.parse(text) as Json)
      }
      this.played++
      if (this.#server !== null) this.#server.send(text)
      else this.#deliver(text, null)
    }
  }

  /** Resolves once the adapter has been handed every event played so far. */
  async drained (): Promise<void> {
    while (this.handled.length < this.played) await once(this, 'handled')
  }

  close (): void {
    if (this.closeSeq === Infinity) this.closeSeq = tick()
    // A second close() is a no-op.
    this.session?.close()
  }

  teardown (): void {
    this.#isTornDown = true
    for (const timer of this.#timers) clearTimeout(timer)
    this.#client?.terminate()
    this.#server?.terminate()
  }

  later (ms: number, fn: () => void): void {
    const timer = setTimeout(() => {
      this.#timers.delete(timer)
      if (!this.#isTornDown) fn()
    }, ms)
    this.#timers.add(timer)
  }

  #send (event: RealtimeClientEvent): void | Promise<void> {
    const text = JSON.stringify(event)
    this.sent.push({ seq: tick(), event: JSON.parse(text) as Json })
    if (this.#client !== null) {
      this.#client.send(text)
    } else if (this.plan.transport === 'sync') {
      this.#onClientEvent(JSON.parse(text) as Json)
    } else {
      setImmediate(() => {
        if (!this.#isTornDown) this.#onClientEvent(JSON.parse(text) as Json)
      })
    }
    if (event.type !== 'session.update' && ++this.#responseEvents === this.plan.closeOnSend && this.closeSeq === Infinity) {
      this.closedInSend = true
      this.close()
    }
    // The event went out; a host's send may still answer late, or fail (e.g. a socket closing).
    switch (this.plan.sendMode) {
      case 'sync':
        return
      case 'async':
        return new Promise((resolve) => { setImmediate(resolve) })
      case 'throws':
        if (event.type !== 'session.update' && ++this.#sends % 2 === 0) throw new Error('the socket is closing')
    }
  }

  /** The host: hands one message to the adapter, noting the registry as it is now. */
  #deliver (text: string, raw: Buffer | null): void {
    if (this.session === null) {
      this.#early.push([text, raw])
      return
    }
    let event: Json | null = null
    try {
      const value: unknown = JSON.parse(text)
      if (typeof value === 'object' && value !== null && !Array.isArray(value)) event = value as Json
    } catch {}
    const names = this.env.tp.roles.get(this.plan.role).registry.names()
    this.handled.push({ seq: tick(), event, names })
    const feed = this.plan.feed
    const input = feed === 'object' && event !== null ? event : feed === 'buffer' ? (raw ?? Buffer.from(text)) : text
    this.session?.handleServerEvent(input)
    this.emit('handled')
  }

  /** The provider: answers session.update as its mode says. */
  #onClientEvent (event: Json): void {
    if (event.type !== 'session.update') return
    const updated = { type: 'session.updated', session: { object: 'realtime.session', id: `sess_${this.id}`, ...event.session } }
    switch (this.plan.ack) {
      case 'ack':
        this.play(updated)
        break
      case 'late':
        this.later(3 + (serial % 13), () => { this.play(updated) })
        break
      case 'bare':
        this.play({ type: 'session.updated', session: { object: 'realtime.session', id: `sess_${this.id}`, model: 'gpt-realtime' } })
        break
      case 'noisy':
        this.play(providerError('invalid_request_error', 'invalid_value', 'Unknown parameter.', `evt_client_${serial}`), updated)
        break
      case 'reject':
        this.play(providerError('invalid_request_error', 'invalid_value', 'Invalid tool schema.', String(event.event_id), 'session.tools'))
        break
      case 'silent':
        break
    }
  }
}

function providerError (type: string, code: string | null, message: string, eventId: string | null,
  param: string | null = null): Json {
  return { type: 'error', error: { type, code, message, param, event_id: eventId } }
}

// ---------------------------------------------------------------------------------------------
// Playing a script.

interface Mutation {
  role: RoleName
  op: 'register' | 'unregister'
  tool: Churn
  startSeq: number
  endSeq: number
  /** The registry changed (an unregister of an absent tool syncs nothing). */
  changed: boolean
  result: RegisterResult | UnregisterResult | null
  promise: Promise<void>
}

/** Polls until `predicate` holds; throws naming `what` after `timeoutMs`. */
async function until (what: string | (() => string), predicate: () => boolean,
  timeoutMs = SETTLE_GUARD_MS): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`${typeof what === 'string' ? what : what()} (within ${timeoutMs} ms)`)
    await sleep(2)
  }
}

function ids (link: Link, r: number, i: number): { callId: string, itemId: string } {
  return { callId: `call_${link.id}_${r}_${i}`, itemId: `item_${link.id}_${r}_${i}` }
}

function argumentText (call: CallPlan): string {
  switch (call.args) {
    case 'valid':
      return JSON.stringify({ n: call.n, d: call.d })
    case 'badjson':
      return `{"n":${call.n},`
    case 'invalid':
      return JSON.stringify({ n: `x${call.n}` })
  }
}

interface CallEvents {
  added: Json
  announcing: Json[]
  item: Json
}

function callEvents (link: Link, responseId: string, r: number, i: number, call: CallPlan): CallEvents {
  const { callId, itemId } = ids(link, r, i)
  const args = argumentText(call)
  const item = { id: itemId, object: 'realtime.item', type: 'function_call', status: 'completed', call_id: callId, name: call.tool, arguments: args }
  const added = {
    type: 'response.output_item.added',
    response_id: responseId,
    output_index: i,
    item: { ...item, status: 'in_progress', arguments: '' }
  }
  const argsDone = {
    type: 'response.function_call_arguments.done',
    response_id: responseId,
    item_id: itemId,
    output_index: i,
    call_id: callId,
    arguments: args,
    ...(call.nameless ? {} : { name: call.tool })
  }
  const itemDone = { type: 'response.output_item.done', response_id: responseId, output_index: i, item }
  const order: Record<Announce, Json[]> = {
    'args-first': [argsDone, itemDone],
    'item-first': [itemDone, argsDone],
    'args-only': [argsDone],
    'item-only': [itemDone],
    'done-only': []
  }
  return { added, announcing: order[call.announce], item }
}

async function playResponse (link: Link, plan: ResponsePlan, r: number): Promise<void> {
  const responseId = `resp_${link.id}_${r}`
  const isCompleted = plan.ending === 'completed'
  // The events before the end: response.created, then each call's in turn.
  const calls = plan.calls.map((call, i) => ({ call, events: callEvents(link, responseId, r, i, call) }))
  const total = 1 + calls.reduce((sum, c) => sum + 3 + c.events.announcing.length, 0)
  const cut = isCompleted ? total : Math.floor(plan.cut * (total + 1))
  let index = 0
  const next = (): boolean => index++ < cut
  if (next()) link.play({ type: 'response.created', response: { id: responseId, object: 'realtime.response', status: 'in_progress', output: [] } })
  // Per call: whether output_item.added, arguments.done, output_item.done were played.
  const states: Array<{ added: boolean, args: boolean, done: boolean }> = []
  for (const { call, events } of calls) {
    const state = { added: false, args: false, done: false }
    states.push(state)
    if (call.gapMs > 0 && index < cut) {
      await link.drained()
      await sleep(call.gapMs)
    }
    if (next()) {
      link.play(events.added)
      state.added = true
    }
    if (next()) {
      const created = link.plan.api === 'beta' ? 'conversation.item.created' : 'conversation.item.added'
      link.play({ type: created, previous_item_id: null, item: events.added.item })
    }
    if (next()) {
      link.play({
        type: 'response.function_call_arguments.delta',
        response_id: responseId,
        item_id: events.item.id,
        output_index: events.added.output_index,
        call_id: events.item.call_id,
        delta: events.item.arguments
      })
    }
    for (const event of events.announcing) {
      if (!next()) break
      link.play(event)
      if (call.dupe) link.play(event)
      if (event.type === 'response.output_item.done') state.done = true
      else state.args = true
    }
  }
  await link.drained()
  if (plan.preEndMs > 0) await sleep(plan.preEndMs)
  if (plan.closeInside) link.close()
  const outputItems = calls.flatMap(({ events }, i) => {
    const state = states[i] as { added: boolean, args: boolean, done: boolean }
    if (isCompleted) return [events.item]
    if (!state.added) return []
    return [state.done || state.args ? events.item : { ...events.item, status: 'incomplete', arguments: '' }]
  })
  const output = plan.listsOutput ? outputItems : []
  switch (plan.ending) {
    case 'completed':
      link.play({ type: 'response.done', response: { id: responseId, object: 'realtime.response', status: 'completed', status_details: null, output } })
      break
    case 'incomplete':
    case 'cancelled':
    case 'failed': {
      if (plan.ending === 'cancelled') link.play({ type: 'input_audio_buffer.speech_started', audio_start_ms: 1000 + r, item_id: `item_user_${link.id}_${r}` })
      // Items cut short end incomplete (never run), then the response ends.
      for (const [i, { events }] of calls.entries()) {
        const state = states[i] as { added: boolean, args: boolean, done: boolean }
        if (state.added && !state.done && !state.args) {
          link.play({ type: 'response.output_item.done', response_id: responseId, output_index: i, item: { ...events.item, status: 'incomplete', arguments: '' } })
        }
      }
      const details = {
        cancelled: { type: 'cancelled', reason: 'turn_detected' },
        failed: { type: 'failed', error: { type: 'server_error', code: 'internal_error' } },
        incomplete: { type: 'incomplete', reason: 'max_output_tokens' }
      }[plan.ending]
      link.play({ type: 'response.done', response: { id: responseId, object: 'realtime.response', status: plan.ending, status_details: details, output } })
      break
    }
    case 'cancelled-event':
      link.play({ type: 'response.cancelled', response_id: responseId })
      break
  }
  if (plan.lateCancel && plan.ending !== 'cancelled-event') {
    await link.drained()
    await sleep(plan.preEndMs % 4)
    link.play({ type: 'response.cancelled', response_id: responseId })
  }
  await link.drained()
}

function playNoise (link: Link, variant: number): void {
  switch (variant) {
    case 0: {
      // An error about one of the host's own other events (e.g. a response.create while a response is active).
      const last = link.sent.findLast((s) => s.event.type !== 'session.update')
      link.play(providerError('invalid_request_error', 'conversation_already_has_active_response',
        'Conversation already has an active response.', String(last?.event.event_id ?? 'evt_host_1')))
      break
    }
    case 1:
      link.play(providerError('server_error', null, 'The server had an error.', null))
      break
    case 2:
      link.play({ type: 'rate_limits.updated', rate_limits: [{ name: 'requests', limit: 1000, remaining: 999, reset_seconds: 60 }] })
      break
    case 3:
      link.play({ type: 'input_audio_buffer.speech_started', audio_start_ms: 5, item_id: 'item_user_noise' })
      break
    case 4:
      link.play('{"type":"response.done","response":', '[1,2,3]', '42')
      break
    case 5:
      // The host's own session.update was acknowledged: tools that are none of the role's.
      link.play({ type: 'session.updated', session: { object: 'realtime.session', tools: [{ type: 'function', name: 'host_only_tool' }] } })
      break
    default:
      link.play({ type: 'response.output_audio_transcript.delta', response_id: 'resp_other', item_id: 'item_other', delta: 'hi' })
  }
}

async function mutate (env: Env, link: Link, op: 'register' | 'unregister', tool: Churn, mutations: Mutation[]): Promise<void> {
  const role = link.plan.role
  const registry = env.tp.roles.get(role).registry
  const startSeq = tick()
  const mutation: Mutation = {
    role, op, tool, startSeq, endSeq: Infinity, changed: true, result: null, promise: Promise.resolve()
  }
  if (op === 'register') {
    // The registry changes once the schema is compiled (tool-registered, in that turn); the
    // script goes on then, not after the sync. (Another session's unregister may undo it at once.)
    let onRegistered: (event: { role: string, name: string }) => void = () => {}
    const applied = new Promise<void>((resolve) => {
      onRegistered = (event) => { if (event.role === role && event.name === tool) resolve() }
      env.tp.on('tool-registered', onRegistered)
    })
    mutation.promise = env.tp.register({
      name: tool, callback_url: `${env.plugin.url}${ROUTES[tool] as string}`, role, source: 'plugin:churn', parameters: PARAMETERS
    }).then((result) => {
      mutation.endSeq = tick()
      mutation.result = result
    })
    mutations.push(mutation)
    try {
      await within(Promise.race([applied, mutation.promise]), `registering ${tool} in ${role}`, SETTLE_GUARD_MS)
    } finally {
      env.tp.off('tool-registered', onRegistered)
    }
  } else {
    mutation.changed = registry.get(tool) !== undefined
    mutation.promise = env.tp.unregister({ name: tool, role }).then((result) => {
      mutation.endSeq = tick()
      mutation.result = result
    })
    mutations.push(mutation)
  }
}

async function runScript (env: Env, link: Link, mutations: Mutation[]): Promise<void> {
  let r = 0
  for (const step of link.plan.steps) {
    switch (step.kind) {
      case 'response':
        await playResponse(link, step, r++)
        break
      case 'parallel': {
        const first = r++
        const second = r++
        await Promise.all([
          playResponse(link, step.first, first),
          sleep(second % 3).then(() => playResponse(link, step.second, second))
        ])
        break
      }
      case 'wait':
        await sleep(step.ms)
        break
      case 'mutate':
        await mutate(env, link, step.op, step.tool, mutations)
        break
      case 'noise':
        playNoise(link, step.variant)
        break
      case 'replay':
        if (link.history.length > 0) link.play(link.history[step.pick % link.history.length] as Json)
        break
      case 'close':
        link.close()
        break
    }
    await link.drained()
  }
}

// ---------------------------------------------------------------------------------------------
// The model: what the adapter must have done, from the events it was handed.

interface ModelResponse {
  id: string
  ended: 'completed' | 'cancelled' | null
  endSeq: number
  calls: ModelCall[]
  /** For a response whose calls were all refused: whether it gets the one response.create. */
  refusedCreate: boolean
}

interface ModelCall {
  callId: string
  name: string | undefined
  args: string
  /** The role had the tool when the call was announced. */
  present: boolean
  refused: boolean
  response: ModelResponse
}

function str (value: unknown): string | undefined {
  return typeof value === 'string' && value !== '' ? value : undefined
}

function runModel (link: Link): { calls: Map<string, ModelCall>, responses: Map<string, ModelResponse> } {
  const calls = new Map<string, ModelCall>()
  const responses = new Map<string, ModelResponse>()
  const itemNames = new Map<string, string>()
  const { rateLimit, autoRespond } = link.plan
  let admitted = 0
  let hasNoticed = false
  const response = (id: string): ModelResponse => {
    let state = responses.get(id)
    if (state === undefined) {
      state = { id, ended: null, endSeq: Infinity, calls: [], refusedCreate: false }
      responses.set(id, state)
    }
    return state
  }
  const announce = (handled: Handled, callId: unknown, name: unknown, args: unknown, responseId: unknown): void => {
    const id = str(callId)
    if (id === undefined || calls.has(id)) return
    const state = response(str(responseId) ?? `loose:${id}`)
    const call: ModelCall = {
      callId: id,
      name: str(name),
      args: str(args) ?? '{}',
      present: str(name) !== undefined && handled.names.includes(str(name) as string),
      refused: false,
      response: state
    }
    calls.set(id, call)
    if (state.ended === 'cancelled') return
    if (rateLimit !== false && admitted >= rateLimit) {
      call.refused = true
    } else {
      admitted++
      hasNoticed = false
    }
    state.calls.push(call)
  }
  const announceItem = (handled: Handled, value: unknown, responseId: unknown): void => {
    const item = value as Json | undefined
    if (typeof item !== 'object' || item === null || item.type !== 'function_call' || item.status === 'incomplete') return
    announce(handled, item.call_id, item.name, item.arguments, responseId ?? item.response_id)
  }
  const end = (handled: Handled, id: unknown, isCancelled: boolean): void => {
    if (str(id) === undefined) return
    const state = response(str(id) as string)
    if (state.ended !== null) return
    state.ended = isCancelled ? 'cancelled' : 'completed'
    state.endSeq = handled.seq
    if (!isCancelled && autoRespond && state.calls.length > 0 && state.calls.every((c) => c.refused)) {
      // The first all-refused round is asked for an answer without tools; later ones get nothing.
      state.refusedCreate = !hasNoticed
      hasNoticed = true
    }
  }
  for (const handled of link.handled) {
    const event = handled.event
    if (handled.seq > link.closeSeq || event === null || typeof event.type !== 'string') continue
    switch (event.type) {
      case 'response.output_item.added':
      case 'conversation.item.created':
      case 'conversation.item.added': {
        const item = event.item as Json | undefined
        if (item?.type === 'function_call' && str(item.id) !== undefined && str(item.name) !== undefined) itemNames.set(item.id, item.name)
        break
      }
      case 'response.function_call_arguments.done':
        announce(handled, event.call_id, str(event.name) ?? itemNames.get(String(event.item_id)), event.arguments,
          event.response_id)
        break
      case 'response.output_item.done':
        announceItem(handled, event.item, event.response_id)
        break
      case 'response.done': {
        const id = event.response?.id
        const status = event.response?.status
        const isCancelled = status === 'cancelled' || status === 'failed'
        if (!isCancelled && Array.isArray(event.response?.output)) {
          for (const item of event.response.output) announceItem(handled, item, id)
        }
        end(handled, id, isCancelled)
        break
      }
      case 'response.cancelled':
        end(handled, event.response_id ?? event.response?.id, true)
        break
    }
  }
  for (const [id, state] of responses) {
    // Calls outside any response complete on their own (none are played here).
    if (id.startsWith('loose:')) state.ended ??= 'completed'
  }
  return { calls, responses }
}

/** The text the model must read for a call that ran and finished on its own. */
function expectedText (call: ModelCall): string | RegExp {
  const id = call.callId
  if (call.refused) return /^\{"error":"tool call limit reached: \d+ calls in 600 s\. Do not call tools again now; answer the user without them\."\}$/
  if (!call.present) return new RegExp(`^\\{"error":"unknown tool '${call.name ?? ''}'; `)
  let args: Json
  try {
    args = JSON.parse(call.args) as Json
  } catch {
    return /^\{"error":"arguments are not valid JSON/
  }
  if (typeof args.n !== 'number') return /^\{"error":".*"\}$/
  switch (call.name) {
    case 'toolerr':
      return JSON.stringify({ error: `refused ${id}` })
    case 'fail500':
      return JSON.stringify({ error: `tool callback returned HTTP 500: failed ${id}` })
    case 'hang':
      return /^\{"error":"tool 'hang' timed out/
    default:
      return JSON.stringify({ call: id, n: args.n })
  }
}

/** The outcome a call that ran ends in when nothing stops it. */
function naturalOutcome (call: ModelCall): CallFinishedEvent['outcome'] {
  if (!call.present) return 'unknown_tool'
  try {
    const args = JSON.parse(call.args) as Json
    if (typeof args.n !== 'number') return 'invalid_arguments'
  } catch {
    return 'invalid_arguments'
  }
  if (call.name === 'fail500') return 'http'
  if (call.name === 'hang') return 'timeout'
  return 'ok'
}

function isRemote (call: ModelCall): boolean {
  const outcome = naturalOutcome(call)
  return outcome !== 'unknown_tool' && outcome !== 'invalid_arguments'
}

// ---------------------------------------------------------------------------------------------
// Checks.

function checkLink (env: Env, link: Link): void {
  const { calls, responses } = runModel(link)
  const plan = link.plan
  const what = (text: string): string => `${link.id} (${JSON.stringify({ ...plan, steps: undefined })}): ${text}`

  // Nothing at all is sent after close().
  const late = link.sent.filter((s) => s.seq > link.closeSeq)
  assert.deepEqual(late.map((s) => s.event.type), [], what('client events sent after close()'))

  // Which calls ran (call-finished), and how they ended.
  const finishedSeq = new Map<string, number>()
  for (const [callId, ends] of env.finished) {
    if (!callId.startsWith(`call_${link.id}_`)) continue
    const call = calls.get(callId)
    assert.ok(call !== undefined && !call.refused && call.response.calls.includes(call),
      what(`${callId} ran (${ends.map((e) => e.outcome).join(', ')}) though it must not have`))
    assert.equal(ends.length, 1, what(`${callId} ran ${ends.length} times (${ends.map((e) => e.outcome).join(', ')})`))
    finishedSeq.set(callId, (ends[0] as { seq: number }).seq)
  }
  for (const call of calls.values()) {
    const ran = !call.refused && call.response.calls.includes(call)
    const record = env.plugin.calls.get(call.callId)
    const arrivals = record?.arrivals ?? 0
    assert.ok(record?.mismatch !== true, what(`${call.callId}: the plugin's body call_id is not its header's`))
    assert.ok(arrivals <= 1, what(`${call.callId} reached its plugin ${arrivals} times`))
    if (!ran) {
      assert.equal(arrivals, 0, what(`${call.callId} was not to run, yet reached its plugin`))
      continue
    }
    const seq = finishedSeq.get(call.callId)
    assert.ok(seq !== undefined, what(`${call.callId} was announced in time (response ${call.response.id} ${String(call.response.ended)}) but never ran`))
    const outcome = env.finished.get(call.callId)?.[0]?.outcome
    const stopped = (call.response.ended === 'cancelled' && call.response.endSeq < seq) || link.closeSeq < seq
    if (stopped && isRemote(call)) {
      // Its plugin request, if it was written before the abort, is closed (or was answered): the
      // run's settling waits for every request to end, and the test's end for late arrivals.
      assert.equal(outcome, 'cancelled', what(`${call.callId} finished after its response was cancelled or the session closed, but ended '${String(outcome)}'`))
    } else {
      assert.equal(outcome, naturalOutcome(call), what(`${call.callId} (${call.name ?? '-'}, ${call.args}) ended '${String(outcome)}'`))
      if (isRemote(call)) {
        assert.ok(record !== undefined && record.arrivals === 1 && record.answered === 1,
          what(`${call.callId} ended '${String(outcome)}' without its plugin answering it once`))
      } else {
        assert.equal(arrivals, 0, what(`${call.callId} (${String(outcome)}) reached its plugin`))
      }
    }
  }

  // function_call_output: exactly the calls of completed responses, once both the response
  // completed and the call finished (its trigger), before close(). When the host closed the
  // session inside send, whatever was due with the same trigger as the event being sent may be
  // missing; nothing due later may come.
  const trigger = (call: ModelCall): number =>
    Math.max(call.response.endSeq, call.refused ? 0 : (finishedSeq.get(call.callId) ?? Infinity))
  let closeTrigger = link.closeSeq
  if (link.closedInSend) {
    const at = link.sent.findIndex((sent) => sent.seq > link.closeSeq)
    const closing = link.sent[(at === -1 ? link.sent.length : at) - 1]?.event
    const callId = closing?.type === 'conversation.item.create'
      ? String(closing.item?.call_id)
      : String(link.sent.findLast((sent) => sent.seq < link.closeSeq && sent.event.type === 'conversation.item.create')?.event.item?.call_id)
    const call = calls.get(callId)
    assert.ok(call !== undefined, what(`the host closed the session while sending ${JSON.stringify(closing)}`))
    closeTrigger = closing?.type === 'conversation.item.create' ? trigger(call) : Math.max(...call.response.calls.map(trigger))
  }
  /** Outputs that may come, and whether each must. */
  const outputs = new Map<string, { call: ModelCall, isRequired: boolean }>()
  for (const state of responses.values()) {
    if (state.ended !== 'completed') continue
    for (const call of state.calls) {
      const at = trigger(call)
      if (at <= closeTrigger) outputs.set(call.callId, { call, isRequired: at < closeTrigger })
    }
  }
  const outputSeq = new Map<string, number>()
  for (const { seq, event } of link.sent) {
    if (event.type !== 'conversation.item.create') continue
    assert.equal(typeof event.event_id, 'string', what('an output without event_id'))
    const item = event.item as Json
    assert.deepEqual(Object.keys(item).sort(), ['call_id', 'output', 'type'], what(`output item ${JSON.stringify(item)}`))
    assert.equal(item.type, 'function_call_output')
    const callId = String(item.call_id)
    assert.ok(!outputSeq.has(callId), what(`two function_call_output for ${callId}`))
    outputSeq.set(callId, seq)
    const call = outputs.get(callId)?.call
    const known = calls.get(callId)
    assert.ok(call !== undefined, what(`an output for ${callId}, which must get none (${JSON.stringify(known === undefined
      ? null
      : { response: known.response.id, ended: known.response.ended, refused: known.refused })})`))
    assert.ok(seq > call.response.endSeq, what(`the output for ${callId} was sent before its response completed`))
    const expected = expectedText(call)
    if (typeof expected === 'string') assert.equal(item.output, expected, what(`output of ${callId}`))
    else assert.match(String(item.output), expected, what(`output of ${callId}`))
  }
  count(env, 'outputs', outputSeq.size)
  count(env, 'cancelled calls', [...finishedSeq.keys()].filter((id) => env.finished.get(id)?.[0]?.outcome === 'cancelled').length)
  count(env, 'calls run', finishedSeq.size)
  count(env, 'refused', [...calls.values()].filter((c) => c.refused).length)
  count(env, 'responses completed', [...responses.values()].filter((r) => r.ended === 'completed' && r.calls.length > 0).length)
  count(env, 'responses cancelled', [...responses.values()].filter((r) => r.ended === 'cancelled' && r.calls.length > 0).length)
  const missing = [...outputs].filter(([id, o]) => o.isRequired && !outputSeq.has(id)).map(([id]) => id)
  assert.deepEqual(missing, [], what('calls of completed responses without a function_call_output'))

  // response.create: one per completed response with outputs, right after its last output.
  const created = new Set<string>()
  for (const [i, { seq, event }] of link.sent.entries()) {
    if (event.type !== 'response.create') continue
    assert.ok(plan.autoRespond, what('response.create with autoRespond false'))
    const previous = link.sent[i - 1]?.event
    assert.equal(previous?.type, 'conversation.item.create', what('a response.create not right after an output'))
    const state = outputs.get(String(previous?.item?.call_id))?.call.response as ModelResponse
    assert.ok(!created.has(state.id), what(`two response.create for ${state.id}`))
    created.add(state.id)
    count(env, 'response.create')
    for (const call of state.calls) {
      assert.ok((outputSeq.get(call.callId) ?? Infinity) < seq, what(`response.create for ${state.id} before the output of ${call.callId}`))
    }
    const refusedOnly = state.calls.every((c) => c.refused)
    if (refusedOnly && plan.dialect === 'flat') assert.deepEqual(event.response, { tool_choice: 'none' }, what('the refused round\'s response.create'))
    else assert.equal(event.response, undefined, what(`response.create of ${state.id}: ${JSON.stringify(event)}`))
  }
  for (const state of responses.values()) {
    if (state.ended !== 'completed' || state.calls.length === 0) continue
    const at = Math.max(...state.calls.map(trigger))
    const isDue = plan.autoRespond && (state.calls.every((c) => c.refused) ? state.refusedCreate : true)
    // Due with the trigger close() came in: it may have gone out before the closing event or not at all.
    const expected = isDue && at <= closeTrigger
    if (at === closeTrigger && expected) continue
    assert.equal(created.has(state.id), expected, what(`response ${state.id} (${state.calls.length} calls) ${expected ? 'got no' : 'got a'} response.create`))
  }

  // Every session.update carries the role's tools in the session's dialect.
  const eventIds = new Set<string>()
  for (const { event } of link.sent) {
    if (event.type !== 'session.update') continue
    assert.ok(!eventIds.has(event.event_id), what('two session.update with one event_id'))
    eventIds.add(event.event_id)
    assert.equal(event.session.type, plan.gaFields ? 'realtime' : undefined)
    for (const tool of event.session.tools as Json[]) {
      if (plan.dialect === 'flat') assert.deepEqual(Object.keys(tool).sort(), ['description', 'name', 'parameters', 'type'])
      else assert.deepEqual(Object.keys(tool).sort(), ['function', 'type'])
    }
  }
}

function toolNames (update: Json | undefined): string[] {
  return ((update?.session?.tools ?? []) as Json[]).map((tool) => String(tool.name ?? tool.function?.name))
}

function checkMutation (env: Env, links: readonly Link[], mutation: Mutation): void {
  const result = mutation.result
  assert.ok(result !== null)
  const what = `${mutation.op} ${mutation.tool} in ${mutation.role}: ${JSON.stringify(result)}`
  if ('removed' in result) assert.equal(result.removed, mutation.changed, what)
  if (!mutation.changed) {
    assert.deepEqual(result.failed_roles, [], what)
    return
  }
  const relevant = links.filter((l) =>
    l.plan.role === mutation.role && l.createdSeq < mutation.endSeq && l.closeSeq > mutation.startSeq)
  const closing = relevant.filter((l) => l.closeSeq < mutation.endSeq)
  const failing = relevant.filter((l) => FAILING_ACKS.has(l.plan.ack))
  count(env, result.failed_roles.length === 0 ? 'syncs ok' : 'syncs failed')
  assert.equal(result.ok, mutation.op === 'unregister' || result.failed_roles.length === 0, what)
  if (failing.length === 0 && closing.length === 0) {
    assert.deepEqual(result.failed_roles, [], `${what}: every session of the role acknowledged`)
    assert.deepEqual(result.affected_roles, [mutation.role], what)
    return
  }
  for (const failed of result.failed_roles) {
    assert.equal(failed.role, mutation.role, what)
    for (const part of failed.error.split('; ')) {
      const match = /^session (\S+): (.*)$/.exec(part)
      const link = relevant.find((l) => l.id === match?.[1])
      assert.ok(match !== null && link !== undefined, `${what}: a failure of no session of the role`)
      const message = match[2] as string
      const explained =
        (link.plan.ack === 'reject' && /^session\.update rejected \(invalid_value\): Invalid tool schema\.$/.test(message)) ||
        (link.plan.ack === 'silent' && new RegExp(`^no session\\.updated within ${SILENT_ACK_MS} ms$`).test(message)) ||
        (link.closeSeq < mutation.endSeq && message === 'the realtime session is closed')
      assert.ok(explained, `${what}: '${part}' (session ack mode ${link.plan.ack})`)
    }
  }
  for (const link of failing) {
    if (link.createdSeq < mutation.startSeq && link.closeSeq > mutation.endSeq) {
      assert.ok(result.failed_roles.some((f) => f.error.includes(`session ${link.id}: `)),
        `${what}: session ${link.id} (${link.plan.ack}) did not take the tools, yet the role is not failed for it`)
    }
  }
}

// ---------------------------------------------------------------------------------------------
// One run.

let runs = 0

async function runScenario (env: Env, plans: readonly SessionPlan[]): Promise<{ links: Link[], calls: number }> {
  const run = ++runs
  const links = plans.map((plan, k) => new Link(env, plan, `r${run}s${k}`))
  const mutations: Mutation[] = []
  try {
    for (const link of links) await link.open()
    await within(Promise.all(links.map((link) => runScript(env, link, mutations))), 'the scripts', SCRIPT_GUARD_MS)
    await within(Promise.all(mutations.map((m) => m.promise)), 'registrations and unregistrations', SETTLE_GUARD_MS)
    // Everything that runs ends: calls answer or are cancelled, plugin requests are answered or
    // closed. (A request written before its call was cancelled may reach the plugin after Toolport
    // answered the call: the plugin then sees it closed.)
    const settled = (): boolean => links.every((l) => l.session?.runningCalls === 0) && env.tp[kPendingCalls] === 0 &&
      env.plugin.active === 0 && [...env.plugin.calls.values()].every((c) => c.answered + c.closedEarly === c.arrivals)
    await until(() => `calls still running: ${links.map((l) => `${l.id} ${l.session?.runningCalls}`).join(', ')}; pending ${env.tp[kPendingCalls]}; plugin open ${env.plugin.active}`,
      settled)
    await sleep(1)
    // The live sessions hold the role's tools, once its sync settled.
    for (const role of ROLES) {
      const live = links.filter((l) => l.plan.role === role && l.closeSeq === Infinity)
      if (live.length === 0) continue
      await within(env.tp.roles.get(role).sync(), `the final sync of ${role}`, SETTLE_GUARD_MS)
      const names = env.tp.roles.get(role).registry.names()
      for (const link of live) {
        const last = link.sent.findLast((s) => s.event.type === 'session.update')?.event
        assert.deepEqual(toolNames(last), names, `${link.id}: the last session.update holds the role's tools`)
        await link.drained()
      }
    }
    for (const link of links) {
      count(env, link.closedInSend ? 'closed inside send' : link.closeSeq < Infinity ? 'closed by the script' : 'open to the end')
      link.close()
      assert.equal(link.session?.runningCalls, 0)
      assert.ok(!env.tp.roles.get(link.plan.role).sessions().includes(link.session as RealtimeSession), `${link.id} left its role on close()`)
    }
    for (const link of links) checkLink(env, link)
    for (const mutation of mutations) checkMutation(env, links, mutation)
    return { links, calls: links.reduce((sum, l) => sum + runModel(l).calls.size, 0) }
  } finally {
    for (const link of links) {
      link.close()
      link.teardown()
    }
    await Promise.allSettled(mutations.map((m) => m.promise))
    for (const tool of CHURN) await env.tp.unregister({ name: tool })
    for (const key of [...env.finished.keys()]) if (key.startsWith(`call_r${run}s`)) env.finished.delete(key)
  }
}

async function startEnv (t: TestContext): Promise<Env> {
  const tp = await createTestToolport(t, { roles: [...ROLES], syncTimeoutMs: SYNC_TIMEOUT_MS })
  const plugin = await startPlugin(t)
  for (const name of STABLE) {
    const result = await tp.register({
      name, callback_url: `${plugin.url}${ROUTES[name] as string}`, source: 'plugin:stable', parameters: PARAMETERS, timeout_seconds: 2
    })
    assert.equal(result.ok, true, result.error)
  }
  const wss = new WebSocketServer({ host: '127.0.0.1', port: 0 })
  await once(wss, 'listening')
  const sockets = new EventEmitter()
  wss.on('connection', (socket, request) => { sockets.emit(String(request.url).slice(1), socket) })
  t.after(() => new Promise<void>((resolve) => {
    for (const client of wss.clients) client.terminate()
    wss.close(() => resolve())
  }))
  const finished: Env['finished'] = new Map()
  tp.on('call-finished', (event) => {
    const ends = finished.get(event.callId) ?? []
    ends.push({ seq: tick(), outcome: event.outcome })
    finished.set(event.callId, ends)
  })
  return { tp, plugin, wss, sockets, finished, tally: new Map() }
}

test('property: random provider event sequences on several Realtime sessions run each call once, answer exactly the completed responses, and stop at barge-in and close()', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const env = await startEnv(t)
  let totalCalls = 0
  let totalSessions = 0
  await fc.assert(fc.asyncProperty(fc.limitShrink(scenarioArb, MAX_SHRINKS), async (plans) => {
    const { links, calls } = await runScenario(env, plans)
    totalCalls += calls
    totalSessions += links.length
  }), { numRuns: NUM_RUNS, includeErrorInReport: true })
  const tally = [...env.tally].map(([k, n]) => `${k} ${n}`).join(', ')
  // A request written just before its call was cancelled may reach the plugin after the run
  // settled: every request ever made is closed by Toolport or answered (a hanging one, closed).
  await until(() => `plugin requests left open: ${[...env.plugin.calls].filter(([, c]) => c.answered + c.closedEarly !== c.arrivals).map(([id]) => id).join(', ')}`,
    () => env.plugin.active === 0 &&
      [...env.plugin.calls.values()].every((c) => c.answered + c.closedEarly === c.arrivals))
  t.diagnostic(`${NUM_RUNS} runs, ${totalSessions} sessions, ${totalCalls} calls announced; ${tally}`)
})

// ---------------------------------------------------------------------------------------------
// Cases the property found, shrunk.

/** Reads a private field's description (e.g. `Map(2)`) through the inspector. */
async function privateField (object: object, name: string): Promise<string> {
  const inspector = new InspectorSession()
  inspector.connect()
  const key = `__realtimeProbe${++serial}`
  ;(globalThis as Record<string, unknown>)[key] = object
  try {
    const { result } = await inspector.post('Runtime.evaluate', { expression: `globalThis.${key}` })
    const properties = await inspector.post('Runtime.getProperties', { objectId: result.objectId as string, ownProperties: true })
    // Node 20's types lack the protocol's privateProperties.
    const { privateProperties } = properties as {
      privateProperties?: Array<{ name: string, value?: { description?: string } }>
    }
    const field = privateProperties?.find((p) => p.name === name)
    assert.ok(field !== undefined, `no private field ${name}`)
    return String(field.value?.description)
  } finally {
    delete (globalThis as Record<string, unknown>)[key]
    inspector.disconnect()
  }
}

/**
 * The plan of a session the regression tests below drive by hand (no steps): role A, the direct
 * transport, sync sends, GA events, auto-respond, no rate limit; the host closes it inside `send`
 * of its `closeOnSend`-th output or response.create, or never (null).
 */
function plainPlan (closeOnSend: number | null): SessionPlan {
  return {
    role: 'A',
    transport: 'direct',
    sendMode: 'sync',
    attachVia: 'auto',
    feed: 'object',
    api: 'ga',
    dialect: 'flat',
    autoRespond: true,
    rateLimit: false,
    ack: 'ack',
    closeOnSend,
    gaFields: false,
    steps: []
  }
}

// A response cancelled (barge-in) while one of its calls runs is forgotten once the call is back.
// #endResponse leaves it in #responses while the call runs; #onCallFinished drops the aborted
// call's result and must then #forget it, or the response stays in #responses (an unbounded Map:
// every other finished response moves to the bounded #finished) for as long as the session lives:
// one ResponseState per barge-in during a tool call. (The same for a state #response() makes for
// a late event of a response that ended cancelled.)
test('a response cancelled while its call runs is forgotten once the call ends, as completed ones are', async (t) => {
  const env = await startEnv(t)
  const link = new Link(env, plainPlan(null), 'leak')
  t.after(() => { link.close(); link.teardown() })
  await link.open()
  const session = link.session as RealtimeSession
  const call = (r: number, tool: string): void => {
    link.play({ type: 'response.function_call_arguments.done', response_id: `resp_${r}`, item_id: `item_${r}`, call_id: `call_leak_${r}`, name: tool, arguments: '{"n":1}' })
  }
  // Control: a completed response is forgotten once its output is sent.
  call(0, 'ok')
  link.play({ type: 'response.done', response: { id: 'resp_0', status: 'completed', output: [] } })
  await until('the completed call', () => link.sent.some((s) => s.event.type === 'response.create'))
  assert.equal(await privateField(session, '#responses'), 'Map(0)')
  // Barge-in while the call runs: the plugin sees the request closed, the call is answered cancelled.
  for (let r = 1; r <= 3; r++) {
    call(r, 'hang')
    await until('the plugin request', () => env.plugin.calls.get(`call_leak_${r}`)?.arrivals === 1)
    link.play({ type: 'response.done', response: { id: `resp_${r}`, status: 'cancelled', status_details: { type: 'cancelled', reason: 'turn_detected' }, output: [] } })
  }
  await until('the cancelled calls to end', () => session.runningCalls === 0 && env.plugin.active === 0)
  assert.deepEqual([1, 2, 3].map((r) => env.finished.get(`call_leak_${r}`)?.map((e) => e.outcome)), [['cancelled'], ['cancelled'], ['cancelled']])
  assert.equal(await privateField(session, '#responses'), 'Map(0)', 'the cancelled responses are still held in #responses')
})

// (The property checks it too, with closeOnSend.) close() inside the host's `send` (a host that
// finds its socket closed while sending, or whose in-process provider answers an output with an
// event that makes it close) stops the adapter's sending: #endResponse sends the response's held
// outputs in a loop and then calls #maybeRespond, and #deliver calls #sendOutput then
// #maybeRespond, so each of those looks at #isClosed again: none of the rest of the outputs and no
// response.create go out after close().
test('a session closed inside send (while it sends a completed response\'s outputs) sends nothing more', async (t) => {
  const env = await startEnv(t)
  const args = (r: string, c: string, name: string): Json => ({
    type: 'response.function_call_arguments.done', response_id: r, item_id: `item_${c}`, call_id: c, name, arguments: '{"n":1}'
  })
  const done = (r: string): Json => ({ type: 'response.done', response: { id: r, status: 'completed', output: [] } })
  const sentAfterClose = (link: Link): string[] => link.sent.filter((s) => s.seq > link.closeSeq).map((s) => `${s.event.type} ${s.event.item?.call_id ?? ''}`.trim())

  // Two calls answered before response.done: their outputs are held, then sent in one loop.
  const held = new Link(env, plainPlan(1), 'closeheld')
  t.after(() => { held.close(); held.teardown() })
  await held.open()
  held.play(args('resp_h', 'call_held_1', 'ok'), args('resp_h', 'call_held_2', 'ok'))
  await until('the held calls', () => env.finished.has('call_held_1') && env.finished.has('call_held_2') && held.session?.runningCalls === 0)
  held.play(done('resp_h'))
  assert.ok(held.closeSeq < Infinity, 'the host closed the session on its first output')

  // One call answered after response.done: its output goes out at once, then response.create.
  const late = new Link(env, plainPlan(1), 'closelate')
  t.after(() => { late.close(); late.teardown() })
  await late.open()
  late.play(args('resp_l', 'call_late_1', 'slow'), done('resp_l'))
  await until('the late call', () => late.closeSeq < Infinity && late.session?.runningCalls === 0)
  await sleep(5)
  assert.deepEqual({ held: sentAfterClose(held), late: sentAfterClose(late) }, { held: [], late: [] }, 'sent after close()')
})

// attach() of a closed adapter (attach: false, the host attaching after an await during which its
// socket closed) does not join its role: if it did, every later sync of the role would fail with
// "the realtime session is closed", and every registration for the role would answer ok: false
// until the host detached it by hand.
test('attach() after close() leaves the closed session out of its role: later registrations are not failed by it', async (t) => {
  const env = await startEnv(t)
  const sent: RealtimeClientEvent[] = []
  const session = createRealtimeSession({ toolport: env.tp, role: 'A', attach: false, send: (event) => { sent.push(event) } })
  session.close()
  session.attach()
  assert.ok(!env.tp.roles.get('A').sessions().includes(session), 'the closed session is attached to its role')
  const result = await env.tp.register({ name: 'extra0', callback_url: `${env.plugin.url}/ok`, role: 'A', parameters: PARAMETERS })
  assert.deepEqual(result.failed_roles, [])
  assert.deepEqual(sent, [], 'a closed session sends nothing')
})
