// Hostile and dying plugins against origin health (docs/protocol.md R12, R13 and "Eviction";
// README "Eviction", "Dispatch" options; docs/architecture.md "Per-origin bounds"), in pool and
// inline mode, with real worker threads and real sockets on 127.0.0.1.
//
// Several plugin origins each do, per request, what the call's arguments say (answer, refuse by
// having no listener, RST mid-reply, stall after the headers, drip bytes past the deadline, 5xx,
// a wrong Content-Length, oversized headers or body, never answer, answer after the deadline,
// `connection: close`), while random steps bring origins down and up, register tools again
// (which resets an origin's count), unregister them, and re-register while calls are in flight.
// A small model of the documented rule replays what happened, in the order Toolport recorded it
// (its own `call-finished`, `tool-registered` and `origin-evicted` events), and predicts every
// eviction: which call triggers it, the origin, its tools and roles. Beside it: every caller gets
// one answer with the documented error for its failure kind, a healthy plugin is never evicted,
// delayed behind or made busy by a hostile one (hang guards, not timings), `/metrics` and
// `/api/events` agree with what happened, and nothing is left (sockets at the plugins, gauges).
import assert from 'node:assert/strict'
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo, Socket } from 'node:net'
import { mock, test, type TestContext } from 'node:test'
import fc from 'fast-check'
import type { Toolport } from '../../src/main/index.js'
import type { ToolResult } from '../../src/main/dispatch/result.js'
import type { CallFinishedEvent, OriginEvictedEvent, ToolRegisteredEvent, ToolRemovedEvent } from '../../src/main/events.js'
import { kPendingCalls } from '../../src/main/symbols.js'
import { session, startToolport, subscribeEvents, waitFor, within, type FakeSession } from '../helpers.js'

const MODES = ['pool', 'inline'] as const
type Mode = typeof MODES[number]
const ROLES = ['A', 'B'] as const
type Role = typeof ROLES[number]

const RUNS = Math.max(1, Number(process.env.TP_PROPERTY_RUNS ?? '1'))
const FAILING_TIMEOUT_MS = 600_000
const MAX_SHRINKS = 30
const GUARD_MS = 15_000

/** Per-origin bounds of every Toolport here (small, so "busy" happens). */
const IN_FLIGHT = 2
const QUEUED = 2
const BOUND = IN_FLIGHT + QUEUED
const MAX_RESPONSE_BYTES = 16 * 1024
/** The short tools' timeout_seconds; the long ones have 30 s and only end by the plugin's doing. */
const SHORT_SECONDS = 0.15

/** What a plugin does with one request (chosen per call, sent in its arguments). */
const BEHAVIOURS = ['ok', 'tool_error', 'close', 'status_5xx', 'rst', 'bad_length', 'big_headers', 'big_body',

  'stall_headers', 'drip', 'never', 'late', 'hold'] as const
type Behaviour = typeof BEHAVIOURS[number]
/** Behaviours that end without the deadline: the only ones sent to the long tools. */
const ENDING: readonly Behaviour[] = ['ok', 'tool_error', 'close', 'status_5xx', 'rst', 'bad_length', 'big_headers',
  'big_body', 'hold']
type Kind = CallFinishedEvent['outcome']

/** The outcome each behaviour ends in at a reachable origin, when neither busy nor the deadline intervenes. */
const NATURAL: Record<Behaviour, Kind> = {
  ok: 'ok',
  tool_error: 'ok',
  close: 'ok',
  status_5xx: 'http',
  rst: 'protocol',
  bad_length: 'protocol',
  big_headers: 'protocol',
  big_body: 'too_large',
  stall_headers: 'timeout',
  drip: 'timeout',
  never: 'timeout',
  late: 'timeout',
  // Held until the batch's healthy calls are answered, then the socket is destroyed.
  hold: 'protocol'
}

/** What the model reads in `error` for each failure kind (docs/protocol.md "Model-visible result"). */
const ERROR_TEXT: Partial<Record<Kind, RegExp>> = {
  http: /^tool callback returned HTTP 503/,
  timeout: /^tool '[^']+' timed out after /,
  connect: /^tool '[^']+' is unreachable: the connection to its callback failed/,
  protocol: /^tool '[^']+' callback failed: /,
  too_large: new RegExp(`^tool '[^']+' replied with more than ${MAX_RESPONSE_BYTES} bytes`),
  busy: new RegExp(`^tool '[^']+' was not called: Toolport is busy.*${IN_FLIGHT} calls in flight and ${QUEUED} waiting`),
  unknown_tool: /^unknown tool '/
}

// ---------------------------------------------------------------------------------------------
// Plugins

/**
 * What a plugin also does, outside the property (its outcome kind, `protocol`, does not tell it
 * from a broken reply, which the model could not replay): a whole 2xx reply, gzip-encoded.
 */
type ExtraBehaviour = 'gzip'

interface CallArgs { token: string, b: Behaviour | ExtraBehaviour }

class Plugin {
  readonly index: number
  port = 0
  server: Server
  readonly sockets = new Set<Socket>()
  /** Every connection ever accepted. */
  connections = 0
  readonly held = new Set<ServerResponse>()
  /** Tokens received, with how often. */
  readonly received = new Map<string, number>()
  isUp = false
  /**
   * It went down with connections open (always counted so for a keep-alive origin, whose client
   * may not have seen its last ones close yet), and no batch of calls ran since it came up: a
   * keep-alive client may still write a request on one of them before it sees it closed (a
   * broken connection, `protocol`, not a refused one).
   */
  hadSockets = false

  /**
   * False: every reply says `connection: close`, so no idle socket outlives a call and a call to
   * the origin while it is down is always a refused connection. True: keep-alive, where a call
   * may still go out on a socket the plugin closed as it went down.
   */
  readonly keepAlive: boolean

  constructor (index: number, keepAlive: boolean) {
    this.index = index
    this.keepAlive = keepAlive
    this.server = this.#create()
  }

  get origin (): string { return `http://127.0.0.1:${this.port}` }

  #create (): Server {
    const server = createServer({ keepAliveTimeout: 30_000 }, (request, response) => {
      this.#handle(request, response)
    })
    server.on('connection', (socket: Socket) => {
      this.connections++
      this.sockets.add(socket)
      socket.on('close', () => this.sockets.delete(socket))
    })
    return server
  }

  async up (): Promise<void> {
    if (this.isUp) return
    this.server = this.#create()
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject)
      this.server.listen(this.port, '127.0.0.1', () => {
        this.server.off('error', reject)
        resolve()
      })
    })
    this.port = (this.server.address() as AddressInfo).port
    this.isUp = true
  }

  /** No listener any more and every connection gone: a new connection is refused. */
  async down (): Promise<void> {
    if (!this.isUp) return
    this.isUp = false
    // A `connection: close` origin may still hold a spare connection its client opened and never used.
    this.hadSockets = this.keepAlive || this.sockets.size > 0
    this.releaseHeld()
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()))
    for (const socket of this.sockets) socket.destroy()
    await closed
  }

  releaseHeld (): void {
    for (const response of this.held) response.destroy()
    this.held.clear()
  }

  #handle (request: IncomingMessage, response: ServerResponse): void {
    const chunks: Buffer[] = []
    request.on('data', (chunk: Buffer) => chunks.push(chunk))
    request.on('end', () => {
      let args: CallArgs
      try {
        args = JSON.parse(Buffer.concat(chunks).toString('utf8')).arguments
      } catch {
        response.writeHead(400).end()
        return
      }
      this.received.set(args.token, (this.received.get(args.token) ?? 0) + 1)
      if (!this.keepAlive) response.setHeader('connection', 'close')
      this.#behave(args, request, response)
    })
  }

  #behave ({ token, b }: CallArgs, request: IncomingMessage, response: ServerResponse): void {
    const socket = request.socket
    const json = (body: unknown, headers: Record<string, string> = {}): void => {
      if (response.destroyed) return
      const text = JSON.stringify(body)
      response.writeHead(200, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)), ...headers })
      response.end(text)
    }
    const timers: NodeJS.Timeout[] = []
    response.on('close', () => { for (const timer of timers) clearTimeout(timer); clearInterval(timers[0]) })
    switch (b) {
      case 'ok': json({ output: token, is_error: false }); return
      case 'gzip': json({ output: token, is_error: false }, { 'content-encoding': 'gzip' }); return
      case 'tool_error': json({ error: 'nope', is_error: true }); return
      case 'close': json({ output: token, is_error: false }, { connection: 'close' }); return
      case 'status_5xx':
        response.writeHead(503, { 'content-type': 'text/plain' })
        response.end('down for maintenance')
        return
      case 'rst':
        response.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' })
        response.write('{"output":', () => { socket.resetAndDestroy() })
        return
      case 'bad_length':
        response.writeHead(200, { 'content-type': 'application/json', 'content-length': '500' })
        response.write(JSON.stringify({ output: token }), () => { socket.end() })
        return
      case 'big_headers':
        response.writeHead(200, { 'content-type': 'application/json', 'x-padding': 'p'.repeat(80 * 1024) })
        response.end(JSON.stringify({ output: token }))
        return
      case 'big_body': {
        const text = JSON.stringify({ output: 'x'.repeat(MAX_RESPONSE_BYTES * 2) })
        response.writeHead(200, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) })
        response.end(text)
        return
      }
      case 'stall_headers':
        // Ended by the client at its deadline (or by the plugin going down).
        response.writeHead(200, { 'content-type': 'application/json' })
        response.write('')
        return
      case 'drip':
        response.writeHead(200, { 'content-type': 'application/json' })
        response.write('{"output":"')
        timers.push(setInterval(() => { if (!response.destroyed) response.write('.') }, 20))
        return
      case 'never':
        return
      case 'hold':
        this.held.add(response)
        return
      case 'late':
        timers.push(setTimeout(() => json({ output: token, is_error: false }), SHORT_SECONDS * 1000 + 100))
    }
  }

  async close (): Promise<void> {
    this.releaseHeld()
    if (!this.isUp) return
    this.isUp = false
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()))
    this.server.closeAllConnections()
    await closed
  }
}

async function startPlugin (t: TestContext, index: number, keepAlive = true): Promise<Plugin> {
  const plugin = new Plugin(index, keepAlive)
  await plugin.up()
  t.after(() => plugin.close())
  return plugin
}

// ---------------------------------------------------------------------------------------------
// Scenario

/** Hostile origins are 0..HOSTILE-1; the healthy origin is HOSTILE. */
const HOSTILE = 2
const HEALTHY = HOSTILE
/** The tools of a hostile origin: short and long (`plugin:`), and one not of a plugin (never evicted). */
const TOOL_KINDS = ['s', 'l', 'x'] as const
type ToolKind = typeof TOOL_KINDS[number]

function toolName (origin: number, kind: ToolKind): string {
  return origin === HEALTHY ? 'healthy' : `o${origin}_${kind}`
}

interface CallPlan { origin: number, kind: ToolKind, behaviour: Behaviour, role: Role }

type Step =
  /** `down[i]`: hostile origin i has no listener during the batch (else it is up). */
  | { step: 'calls', down: boolean[], calls: CallPlan[], healthy: number, register: null | { origin: number, kind: ToolKind } }
  | { step: 'down', origin: number }
  | { step: 'up', origin: number }
  | { step: 'register', origin: number, kind: ToolKind, role: Role | null }
  | { step: 'unregister', origin: number, kind: ToolKind }

/** A call, its behaviour drawn from the batch's few (so a batch may be all 5xx, or all drips). */
function callArb (behaviours: readonly Behaviour[]): fc.Arbitrary<CallPlan> {
  const short = behaviours.filter((b) => b !== 'hold')
  const long = behaviours.filter((b) => ENDING.includes(b))
  return fc.record({
    origin: fc.integer({ min: 0, max: HOSTILE - 1 }),
    kind: fc.constantFrom<ToolKind>('s', 's', 'l', 'x'),
    role: fc.constantFrom(...ROLES)
  }).chain((plan) => fc.constantFrom(...(plan.kind === 'l' ? (long.length > 0 ? long : ['hold' as const]) : (short.length > 0 ? short : ['never' as const])))
    .map((behaviour) => ({ ...plan, behaviour })))
}

const originArb = fc.integer({ min: 0, max: HOSTILE - 1 })
const stepArb: fc.Arbitrary<Step> = fc.oneof(
  {
    weight: 8,
    arbitrary: fc.record({
      step: fc.constant('calls' as const),
      down: fc.array(fc.boolean(), { minLength: HOSTILE, maxLength: HOSTILE }),
      calls: fc.uniqueArray(fc.constantFrom(...BEHAVIOURS), { minLength: 1, maxLength: 3 })
        .chain((behaviours) => fc.array(callArb(behaviours), { minLength: 1, maxLength: 6 })),
      healthy: fc.integer({ min: 0, max: BOUND }),
      register: fc.option(fc.record({ origin: originArb, kind: fc.constantFrom<ToolKind>('s', 'l') }), { freq: 4 })
    })
  },
  { weight: 1, arbitrary: fc.record({ step: fc.constant('down' as const), origin: originArb }) },
  { weight: 1, arbitrary: fc.record({ step: fc.constant('up' as const), origin: originArb }) },
  {
    weight: 2,
    arbitrary: fc.record({
      step: fc.constant('register' as const),
      origin: originArb,
      kind: fc.constantFrom(...TOOL_KINDS),
      role: fc.constantFrom<Role | null>(null, null, 'A', 'B')
    })
  },
  { weight: 1, arbitrary: fc.record({ step: fc.constant('unregister' as const), origin: originArb, kind: fc.constantFrom(...TOOL_KINDS) }) }
)

const scenarioArb = fc.record({
  threshold: fc.integer({ min: 1, max: 3 }),
  steps: fc.array(stepArb, { minLength: 1, maxLength: 14 })
})

// ---------------------------------------------------------------------------------------------
// The model

/** One thing that happened, in the order Toolport did it (its events, and our own marks). */
type LogItem =
  | { type: 'launch', callId: string }
  | { type: 'register-start', origin: number }
  | { type: 'call', event: CallFinishedEvent }
  | { type: 'registered', event: ToolRegisteredEvent }
  | { type: 'removed', event: ToolRemovedEvent }
  | { type: 'evicted', event: OriginEvictedEvent }

interface Launched {
  plan: CallPlan | null
  name: string
  role: Role
  origin: number
  callId: string
  token: string
  /** The model's expectations when the call was made. */
  expectUnknown: boolean
  expectBusy: boolean
  /** The origin was down when the call was made (and whether it had sockets open as it went). */
  down: boolean
  downHadSockets: boolean
  promise: Promise<ToolResult>
  result?: ToolResult
  settled: boolean
}

class Model {
  readonly threshold: number
  /** origin index → consecutive failures and epoch. */
  readonly failures = new Map<number, number>()
  readonly epochs = new Map<number, number>()
  /** role → tool name → its origin index and whether it is a plugin tool. */
  readonly registry = new Map<Role, Map<string, { origin: number, isPlugin: boolean }>>(
    ROLES.map((r) => [r, new Map()]))

  readonly expectedEvictions: Array<{ origin: number, tools: string[], roles: string[] }> = []
  evictedRegistrations = 0

  constructor (threshold: number) { this.threshold = threshold }

  epoch (origin: number): number { return this.epochs.get(origin) ?? 0 }

  reset (origin: number): void {
    this.failures.set(origin, 0)
    this.epochs.set(origin, this.epoch(origin) + 1)
  }

  /** A call's outcome, recorded against the epoch it was made in; returns the eviction it causes. */
  record (origin: number, kind: Kind, isPlugin: boolean, epoch: number):
  { origin: number, tools: string[], roles: string[] } | null {
    if (epoch !== this.epoch(origin)) return null
    // Any HTTP reply resets, also one over maxResponseBytes (docs/protocol.md "Eviction").
    if (kind === 'ok' || kind === 'http' || kind === 'too_large') {
      this.failures.set(origin, 0)
      return null
    }
    if (kind !== 'connect' || !isPlugin) return null
    const failures = (this.failures.get(origin) ?? 0) + 1
    this.failures.set(origin, failures)
    if (failures < this.threshold) return null
    this.failures.set(origin, 0)
    this.epochs.set(origin, this.epoch(origin) + 1)
    const tools = new Set<string>()
    const roles: string[] = []
    for (const role of ROLES) {
      let lost = false
      for (const [name, entry] of [...this.registry.get(role)!]) {
        if (entry.origin !== origin || !entry.isPlugin) continue
        this.registry.get(role)!.delete(name)
        tools.add(name)
        lost = true
        this.evictedRegistrations++
      }
      if (lost) roles.push(role)
    }
    if (roles.length === 0) return null
    return { origin, tools: [...tools].sort(), roles }
  }
}

// ---------------------------------------------------------------------------------------------
// Helpers

async function metricsText (tp: Toolport): Promise<string> {
  const res = await tp.app.inject({ method: 'GET', url: '/metrics' })
  assert.equal(res.statusCode, 200)
  return res.body
}

function metricValue (text: string, name: string): number {
  const match = new RegExp(`^${name} (\\S+)$`, 'm').exec(text)
  return match === null ? NaN : Number(match[1])
}

/** toolport_calls_total by `role/tool/outcome`. */
function callCounts (text: string): Map<string, number> {
  const counts = new Map<string, number>()
  for (const match of text.matchAll(/^toolport_calls_total\{([^}]*)\} (\S+)$/gm)) {
    const labels = Object.fromEntries([...match[1]!.matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]))
    const key = `${labels.role}/${labels.tool}/${labels.outcome}`
    counts.set(key, (counts.get(key) ?? 0) + Number(match[2]))
  }
  return counts
}

function bump (map: Map<string, number>, key: string): void { map.set(key, (map.get(key) ?? 0) + 1) }

// ---------------------------------------------------------------------------------------------
// One run

let tokenSeq = 0

interface RunStats { calls: number, evictions: number, kinds: Map<string, number> }

/** Runs the steps against a fresh Toolport; throws (assert) where Toolport and the model disagree. */
async function run (t: TestContext, mode: Mode, threshold: number, steps: readonly Step[], plugins: Plugin[],
  stats: RunStats): Promise<void> {
  for (const plugin of plugins) {
    await plugin.up()
    plugin.hadSockets = false // a fresh Toolport has no sockets yet
  }
  const { tp, url } = await startToolport(t, {
    roles: [...ROLES],
    evictionThreshold: threshold,
    dispatch: {
      mode, maxInFlightPerOrigin: IN_FLIGHT, maxQueuedPerOrigin: QUEUED, maxResponseBytes: MAX_RESPONSE_BYTES
    }
  })
  let isClosed = false
  try {
    const log: LogItem[] = []
    tp.on('call-finished', (event) => log.push({ type: 'call', event }))
    tp.on('tool-registered', (event) => log.push({ type: 'registered', event }))
    tp.on('tool-removed', (event) => log.push({ type: 'removed', event }))
    tp.on('origin-evicted', (event) => log.push({ type: 'evicted', event }))
    // A model session per role: after an eviction it must hold exactly the role's tools again.
    const sessions = new Map<Role, FakeSession>(ROLES.map((r) => [r, session(`s${r}`, 'instant')]))
    for (const role of ROLES) tp.roles.get(role).attachSession(sessions.get(role)!)
    const stream = subscribeEvents(url, '?types=evicted,call')
    t.after(stream.close)
    await waitFor('the event stream\'s hello', () => stream.items.some((i) => i.event === 'hello'), GUARD_MS)
    const originOf = new Map(plugins.map((p) => [p.origin, p.index]))

    /** What each role lists now: decides which calls are `unknown_tool` at launch. */
    const listed = new Map<Role, Set<string>>()
    const relist = (): void => {
      for (const role of ROLES) listed.set(role, new Set(tp.list(role).tools_by_role[role]!.map((x) => x.name)))
    }
    const register = async (origin: number, kind: ToolKind, role: Role | null): Promise<void> => {
      log.push({ type: 'register-start', origin })
      const name = toolName(origin, kind)
      const result = await tp.register({
        name,
        callback_url: `${plugins[origin]!.origin}/${name}`,
        source: kind === 'x' ? `host:o${origin}` : `plugin:o${origin}`,
        timeout_seconds: kind === 'l' ? 30 : SHORT_SECONDS,
        parameters: { type: 'object' },
        role
      })
      assert.equal(result.ok, true, JSON.stringify(result))
    }
    for (let origin = 0; origin < HOSTILE; origin++) for (const kind of TOOL_KINDS) await register(origin, kind, null)
    await register(HEALTHY, 'l', null)
    relist()

    const launched: Launched[] = []
    const launch = (plan: CallPlan | null, role: Role, origin: number, perOrigin: Map<number, number>): Launched => {
      const name = plan === null ? 'healthy' : toolName(plan.origin, plan.kind)
      const token = `t${++tokenSeq}`
      const callId = `call_${token}`
      const plugin = plugins[origin]!
      const expectUnknown = !listed.get(role)!.has(name)
      let expectBusy = false
      if (!expectUnknown) {
        const n = perOrigin.get(origin) ?? 0
        expectBusy = n >= BOUND
        perOrigin.set(origin, n + 1)
      }
      log.push({ type: 'launch', callId })
      const promise = tp.callTool(role, { name, arguments: { token, b: plan?.behaviour ?? 'ok' }, call_id: callId })
      const item: Launched = {
        plan,
        name,
        role,
        origin,
        callId,
        token,
        expectUnknown,
        expectBusy,
        down: !plugin.isUp,
        downHadSockets: plugin.hadSockets,
        promise,
        settled: false
      }
      promise.then((result) => { item.result = result; item.settled = true }, () => {})
      launched.push(item)
      return item
    }

    for (const step of steps) {
      switch (step.step) {
        case 'down': await plugins[step.origin]!.down(); break
        case 'up': await plugins[step.origin]!.up(); break
        case 'register': await register(step.origin, step.kind, step.role); relist(); break
        case 'unregister': {
          const result = await tp.unregister({ name: toolName(step.origin, step.kind) })
          assert.equal(result.ok, true)
          relist()
          break
        }
        case 'calls': {
          for (const [origin, isDown] of step.down.entries()) {
            await (isDown ? plugins[origin]!.down() : plugins[origin]!.up())
          }
          const perOrigin = new Map<number, number>()
          const batch = step.calls.map((plan) => launch(plan, plan.role, plan.origin, perOrigin))
          const healthy = Array.from({ length: step.healthy },
            (_, i) => launch(null, ROLES[i % 2]!, HEALTHY, perOrigin))
          // Registered again while the calls are in flight: their failures must not count after it.
          const registering = step.register === null ? null : register(step.register.origin, step.register.kind, null)
          // No head-of-line blocking: the healthy plugin's calls are answered while the held
          // calls (30 s deadline) are still held; those end only when released below.
          await within(Promise.all(healthy.map((c) => c.promise)), 'the healthy plugin\'s calls, beside held ones', GUARD_MS)
          const holds = batch.filter((c) => c.plan?.behaviour === 'hold' && !c.expectUnknown && !c.expectBusy && !c.down)
          for (const call of holds) {
            assert.ok(!call.settled || call.result?.is_error === true,
              `${call.callId} (hold) was answered before its plugin let go: ${JSON.stringify(call.result)}`)
          }
          // Release the held calls: again and again, as queued ones reach their plugin in turn.
          await within((async () => {
            while (!batch.every((c) => c.settled)) {
              for (const plugin of plugins) plugin.releaseHeld()
              await new Promise((resolve) => setTimeout(resolve, 5))
            }
          })(), () =>
            `calls still unanswered: ${batch.filter((c) => !c.settled).map((c) => `${c.callId} ${JSON.stringify(c.plan)}`).join(', ')}`, GUARD_MS)
          if (registering !== null) await within(registering, 'the registration made during calls', GUARD_MS)
          for (const plugin of plugins) {
            plugin.releaseHeld()
            if (plugin.isUp) plugin.hadSockets = false
          }
          relist()
          break
        }
      }
    }
    for (const call of launched) await call.promise

    // ---- Replay what happened, in Toolport's order, through the model of R13.
    const model = new Model(threshold)
    const byId = new Map(launched.map((c) => [c.callId, c]))
    const epochOf = new Map<string, number>()
    const finished = new Map<string, CallFinishedEvent[]>()
    const pendingResets: number[] = []
    const predicted: string[] = []
    const actual: string[] = []
    let evictedRemovals = 0
    const evictionText = (origin: string, tools: readonly string[], roles: readonly string[],
      failures: number): string =>
      JSON.stringify(['evicted', origin, [...tools].sort(), [...roles].sort(), failures])
    for (const item of log) {
      switch (item.type) {
        case 'launch': {
          const call = byId.get(item.callId)!
          epochOf.set(item.callId, model.epoch(call.origin))
          break
        }
        case 'register-start': pendingResets.push(item.origin); break
        case 'registered': {
          const origin = originOf.get(item.event.origin ?? '')
          assert.ok(origin !== undefined, `registered at an unknown origin ${item.event.origin}`)
          // A registration resets its origin once, just before its first role takes the tool.
          const at = pendingResets.indexOf(origin)
          if (at >= 0) {
            pendingResets.splice(at, 1)
            model.reset(origin)
          }
          model.registry.get(item.event.role as Role)!.set(item.event.name, { origin, isPlugin: item.event.source.startsWith('plugin:') })
          break
        }
        case 'removed':
          if (item.event.reason === 'unregister') model.registry.get(item.event.role as Role)!.delete(item.event.name)
          if (item.event.reason === 'evicted') evictedRemovals++
          break
        case 'evicted': {
          const e = item.event
          actual.push(evictionText(e.origin, e.tools, e.roles, e.failures))
          break
        }
        case 'call': {
          const event = item.event
          const call = byId.get(event.callId)
          assert.ok(call !== undefined, `a call-finished event for a call never made: ${event.callId}`)
          finished.set(event.callId, [...(finished.get(event.callId) ?? []), event])
          if (event.outcome !== 'unknown_tool') {
            const isPlugin = event.source?.startsWith('plugin:') ?? false
            const eviction = model.record(call.origin, event.outcome, isPlugin, epochOf.get(event.callId)!)
            if (eviction !== null) {
              predicted.push(evictionText(plugins[eviction.origin]!.origin, eviction.tools, eviction.roles, threshold))
            }
          }
          predicted.push(`call ${event.callId}`)
          actual.push(`call ${event.callId}`)
          break
        }
      }
    }
    // Every eviction exactly where the documented rule puts it: just before the call whose
    // connection failure reached the threshold, naming the origin, its plugin tools and roles.
    assert.deepEqual(actual, predicted, 'evictions (and the calls they came before) differ from docs/protocol.md "Eviction"')
    assert.equal(evictedRemovals, model.evictedRegistrations, 'tool-removed events with reason "evicted"')
    // Their tools are gone from every role; everything else is as registered.
    for (const role of ROLES) {
      const expected = [...model.registry.get(role)!.keys()].sort()
      assert.deepEqual(tp.list(role).tools_by_role[role]!.map((x) => x.name).sort(), expected, `the tools of role ${role}`)
    }

    for (const role of ROLES) {
      const expected = [...model.registry.get(role)!.keys()].sort()
      await waitFor(`the session of role ${role} to hold the role's tools after the evictions`, () =>
        JSON.stringify(sessions.get(role)!.currentNames.sort()) === JSON.stringify(expected), GUARD_MS)
        .catch(() => assert.deepEqual(sessions.get(role)!.currentNames.sort(), expected, `the session of role ${role}`))
    }

    // ---- Every caller: one answer, the documented one for its plugin's behaviour.
    const callCountsSeen = new Map<string, number>()
    for (const call of launched) {
      const events = finished.get(call.callId) ?? []
      assert.equal(events.length, 1, `${call.callId}: ${events.length} call-finished events`)
      const event = events[0]!
      const result = call.result!
      const kind = event.outcome
      const what = `${call.callId} ${call.role}/${call.name} ${JSON.stringify(call.plan)}${call.down ? ' (origin down)' : ''}: ${kind} ${JSON.stringify(result)}`
      bump(callCountsSeen, `${call.role}/${kind === 'unknown_tool' ? '(unknown)' : call.name}/${kind}`)
      stats.calls++
      stats.kinds.set(kind, (stats.kinds.get(kind) ?? 0) + 1)
      const receivedTimes = plugins[call.origin]!.received.get(call.token) ?? 0
      assert.ok(receivedTimes <= 1, `${what}: the plugin got it ${receivedTimes} times`)
      if (call.expectUnknown) {
        assert.equal(kind, 'unknown_tool', what)
      } else if (call.expectBusy) {
        assert.equal(kind, 'busy', what)
      } else {
        assert.notEqual(kind, 'busy', what)
        if (call.plan === null) {
          assert.equal(kind, 'ok', `the healthy plugin: ${what}`)
        } else {
          const allowed = new Set<Kind>(call.down ? ['connect'] : [NATURAL[call.plan.behaviour]])
          if (call.downHadSockets) allowed.add('protocol')
          if (call.plan.kind !== 'l') allowed.add('timeout')
          assert.ok(allowed.has(kind), `${what}: expected one of ${[...allowed].join(', ')}`)
        }
      }
      if (kind === 'busy' || kind === 'unknown_tool' || kind === 'connect') {
        assert.equal(receivedTimes, 0, `${what}: reached its plugin`)
      }
      assert.equal(result.is_error, event.isError, what)
      if (kind === 'ok') {
        const b = call.plan?.behaviour ?? 'ok'
        if (b === 'tool_error') assert.deepEqual([result.is_error, result.error], [true, 'nope'], what)
        else assert.deepEqual([result.is_error, result.output], [false, call.token], what)
      } else {
        assert.equal(result.is_error, true, what)
        const pattern = ERROR_TEXT[kind]
        assert.ok(pattern !== undefined, `${what}: an outcome this test does not expect`)
        assert.match(result.error ?? '', pattern, what)
      }
    }
    for (const plugin of plugins) {
      for (const [token] of plugin.received) {
        if (token.startsWith('t') && !launched.some((c) => c.token === token) && Number(token.slice(1)) > tokenSeq) {
          assert.fail(`plugin ${plugin.index} got a call never made: ${token}`)
        }
      }
    }
    const evictions = log.filter((i) => i.type === 'evicted') as Array<{ type: 'evicted', event: OriginEvictedEvent }>
    stats.evictions += evictions.length
    assert.ok(!evictions.some((e) => e.event.origin === plugins[HEALTHY]!.origin), 'the healthy plugin was evicted')

    // ---- Metrics agree, and nothing is pending.
    const health = tp.health()
    assert.deepEqual([tp[kPendingCalls], health.dispatch.in_flight, health.dispatch.queued], [0, 0, 0], 'calls pending after every call was answered')
    const metrics = await metricsText(tp)
    assert.deepEqual(Object.fromEntries([...callCounts(metrics)].sort()),
      Object.fromEntries([...callCountsSeen].sort()),
      'toolport_calls_total by role, tool and outcome')
    assert.equal(metricValue(metrics, 'toolport_evictions_total'), evictions.length, 'toolport_evictions_total')
    assert.equal(metricValue(metrics, 'toolport_evicted_tools_total'), evictedRemovals, 'toolport_evicted_tools_total')
    assert.equal(metricValue(metrics, 'toolport_calls_in_flight'), 0, 'toolport_calls_in_flight')
    assert.equal(metricValue(metrics, 'toolport_dispatch_queue_depth'), 0, 'toolport_dispatch_queue_depth')
    await waitFor('toolport_reply_buffer_bytes to be 0', () => tp[kPendingCalls] === 0, GUARD_MS)
    assert.equal(metricValue(await metricsText(tp), 'toolport_reply_buffer_bytes'), 0, 'toolport_reply_buffer_bytes')

    // ---- /api/events saw the same evictions and calls.
    await waitFor('the event stream to carry every call and eviction', () =>
      stream.items.filter((i) => i.event === 'call').length >= launched.length &&
      stream.items.filter((i) => i.event === 'evicted').length >= evictions.length, GUARD_MS).catch(() => {})
    const streamed = stream.items.filter((i) => i.event === 'evicted')
      .map((i) => evictionText(i.data.origin, [...new Set<string>(i.data.tools.map((x: { name: string }) => x.name))],
        i.data.roles, i.data.failures))
    assert.deepEqual(streamed,
      evictions.map((e) => evictionText(e.event.origin, e.event.tools, e.event.roles, e.event.failures)),
      '/api/events evicted events')
    const streamedCalls = new Map<string, number>()
    for (const item of stream.items) if (item.event === 'call') bump(streamedCalls, `${item.data.role}/${item.data.tool ?? item.data.name ?? 'null'}/${item.data.outcome}`)
    const expectedCalls = new Map<string, number>()
    for (const call of launched) bump(expectedCalls, `${call.role}/${call.expectUnknown ? 'null' : call.name}/${finished.get(call.callId)![0]!.outcome}`)
    assert.deepEqual(Object.fromEntries([...streamedCalls].sort()), Object.fromEntries([...expectedCalls].sort()), '/api/events call events by role, tool and outcome')
    stream.close()

    // ---- Closed: no socket left open at any plugin.
    isClosed = true
    await tp.close()
    await waitFor('every connection to the plugins to close', () => plugins.every((p) => p.sockets.size === 0), GUARD_MS)
      .catch(() => assert.fail(`sockets still open at the plugins after close(): ${plugins.map((p) => p.sockets.size).join(', ')}`))
  } finally {
    if (!isClosed) await tp.close()
  }
}

for (const mode of MODES) {
  test(`${mode}: property: hostile and dying plugins are evicted exactly by the rule (R13), never delay a healthy one, and leave nothing behind`, { timeout: FAILING_TIMEOUT_MS }, async (t) => {
    // Hostile origin 0 closes every connection after its reply; origin 1 and the healthy one keep them.
    const plugins = await Promise.all(Array.from({ length: HOSTILE + 1 }, (_, i) => startPlugin(t, i, i !== 0)))
    const stats: RunStats = { calls: 0, evictions: 0, kinds: new Map() }
    await fc.assert(fc.asyncProperty(fc.limitShrink(scenarioArb, MAX_SHRINKS), async ({ threshold, steps }) => {
      await run(t, mode, threshold, steps, plugins, stats)
    }), { numRuns: 5 * RUNS, includeErrorInReport: true })
    const kinds = [...stats.kinds].sort(([a], [b]) => a.localeCompare(b)).map(([k, n]) => `${k} ${n}`).join(', ')
    t.diagnostic(`${mode}: ${stats.calls} calls (${kinds}), ${stats.evictions} evictions`)
  })
}

/** Each kind of HTTP reply between two refused connections: its outcome and what the model reads. */
const HTTP_REPLIES = [
  { b: 'status_5xx', what: 'an HTTP error reply', kind: 'http', error: ERROR_TEXT.http! },
  { b: 'big_body', what: 'a reply over maxResponseBytes', kind: 'too_large', error: ERROR_TEXT.too_large! },
  { b: 'gzip', what: 'a reply refused as compressed', kind: 'protocol', error: /reply is compressed/ }
] as const

for (const { b, what, kind, error } of HTTP_REPLIES) {
  test(`R13: ${what} between connection failures resets the count: it is an HTTP reply (README "Eviction"; docs/protocol.md "Eviction")`, async (t) => {
    // README "Eviction": "HTTP errors ... never count; any HTTP reply or a new registration at the
    // origin resets the count." Refused, that reply, refused: with a threshold of 2 nothing is
    // evicted. Before, a too-large or compressed reply left the count as it was, and a plugin that
    // was up was evicted.
    const plugin = await startPlugin(t, 0, false)
    const { tp } = await startToolport(t, { roles: ['A'], evictionThreshold: 2, dispatch: { mode: 'inline', maxResponseBytes: MAX_RESPONSE_BYTES } })
    assert.equal((await tp.register({ name: 'p', callback_url: `${plugin.origin}/p`, source: 'plugin:p', parameters: { type: 'object' } })).ok, true)
    const results: ToolResult[] = []
    const outcomes: string[] = []
    tp.on('call-finished', (event) => outcomes.push(event.outcome))
    const evicted: unknown[] = []
    tp.on('origin-evicted', (event) => evicted.push(event))
    for (const isDown of [true, false, true]) {
      await (isDown ? plugin.down() : plugin.up())
      results.push(await within(tp.callTool('A', { name: 'p', arguments: { token: `r${outcomes.length}`, b } }), 'a call', GUARD_MS))
    }
    assert.deepEqual(outcomes, ['connect', kind, 'connect'])
    assert.match(results[1]!.error ?? '', error)
    assert.deepEqual(evicted, [])
    assert.deepEqual(tp.list('A').tools_by_role.A!.map((x) => x.name), ['p'])
  })
}

test('R13: a registration every role refused does not reset its origin\'s count (docs/protocol.md "Eviction")', async (t) => {
  // Refused, refused, a registration at the origin that no role takes (the name is a local tool's),
  // refused: with a threshold of 3 the third failure evicts. Before, the refused registration
  // reset the count and the dead plugin's tool stayed.
  const plugin = await startPlugin(t, 0, false)
  const { tp } = await startToolport(t, { roles: ['A'], evictionThreshold: 3, dispatch: { mode: 'inline' } })
  await tp.roles.get('A').registerLocalTool({ name: 'local', handler: () => 'local' })
  assert.equal((await tp.register({ name: 'p', callback_url: `${plugin.origin}/p`, source: 'plugin:p', parameters: { type: 'object' } })).ok, true)
  await plugin.down()
  const outcomes: string[] = []
  tp.on('call-finished', (event) => outcomes.push(event.outcome))
  const evicted: OriginEvictedEvent[] = []
  tp.on('origin-evicted', (event) => evicted.push(event))
  const call = async (): Promise<ToolResult> => await within(tp.callTool('A', { name: 'p', arguments: { token: 't', b: 'ok' } }), 'a call', GUARD_MS)
  await call()
  await call()
  const refused = await tp.register({ name: 'local', callback_url: `${plugin.origin}/local`, source: 'plugin:q', parameters: { type: 'object' } })
  assert.equal(refused.ok, false)
  assert.deepEqual(refused.failed_roles.map((f) => f.role), ['A'])
  await call()
  assert.deepEqual(outcomes, ['connect', 'connect', 'connect'])
  assert.deepEqual(evicted.map((e) => e.tools), [['p']])
  assert.deepEqual(tp.list('A').tools_by_role.A!.map((x) => x.name), ['local'])
})

// ---------------------------------------------------------------------------------------------
// Regressions (each failed on the code before its fix): the first found by the property above, the second by
// reading src/main/dispatch/origin-health.ts and its sweep in src/main/runtime.ts

for (const mode of MODES) {
  test(`${mode}: R12: a reply whose headers are too large is the plugin's broken reply, not an internal error of Toolport`, async (t) => {
    // docs/protocol.md R12 and "Model-visible result": a reply that is not valid HTTP after the
    // request was sent is the plugin's failure ("callback failed"); `internal` means a bug in
    // Toolport or a dead worker (src/workers/protocol.ts), which this is not.
    const plugin = await startPlugin(t, 0)
    const { tp } = await startToolport(t, { roles: ['A'], dispatch: { mode } })
    const result = await tp.register({ name: 'big', callback_url: `${plugin.origin}/big`, source: 'plugin:big', parameters: { type: 'object' } })
    assert.equal(result.ok, true)
    const outcomes: string[] = []
    tp.on('call-finished', (event) => outcomes.push(event.outcome))
    const answer = await within(tp.callTool('A', { name: 'big', arguments: { token: 'x', b: 'big_headers' } }), 'the call', GUARD_MS)
    assert.equal(answer.is_error, true)
    assert.deepEqual(outcomes, ['protocol'])
    assert.match(answer.error ?? '', /^tool 'big' callback failed: /)
    assert.doesNotMatch(answer.error ?? '', /internal error in Toolport/)
  })
}

test('R13: a call queued before its tools were unregistered, swept and registered again does not count against the new registration', async (t) => {
  // docs/protocol.md "Eviction": "A call counts against the registration epoch it was dispatched
  // in: failures of calls sent before a re-registration (or an eviction) never count against the
  // tools registered after it." The once-a-minute sweep forgets an origin no tool uses; the
  // registration after it must still start a new epoch.
  mock.timers.enable({ apis: ['setInterval'] })
  t.after(() => mock.timers.reset())
  const plugin = await startPlugin(t, 0)
  const { tp } = await startToolport(t, {
    roles: ['A'],
    evictionThreshold: 1,
    dispatch: { mode: 'inline', maxInFlightPerOrigin: 1, maxQueuedPerOrigin: 4 }
  })
  const body = { name: 'p', callback_url: `${plugin.origin}/p`, source: 'plugin:p', timeout_seconds: 30, parameters: { type: 'object' } }
  assert.equal((await tp.register(body)).ok, true)
  const evicted: unknown[] = []
  tp.on('origin-evicted', (event) => evicted.push(event))
  // One call held at the plugin, one queued behind it (dispatched, in the first registration's epoch).
  const held = tp.callTool('A', { name: 'p', arguments: { token: 'held', b: 'hold' } })
  await waitFor('the held call at the plugin', () => plugin.received.has('held'), GUARD_MS)
  const queued = tp.callTool('A', { name: 'p', arguments: { token: 'queued', b: 'ok' } })
  assert.equal((await tp.unregister({ name: 'p' })).removed, true)
  mock.timers.tick(60_000) // the health sweep: no tool uses the origin now
  assert.equal((await tp.register(body)).ok, true)
  // The plugin dies: the held call breaks, the queued one is sent and refused.
  await plugin.down()
  const [first, second] = await within(Promise.all([held, queued]), 'the two calls', GUARD_MS)
  assert.equal(first.is_error, true)
  assert.match(second.error ?? '', /is unreachable/)
  assert.deepEqual(evicted, [], 'a failure of a call sent before the re-registration evicted it')
  assert.deepEqual(tp.list('A').tools_by_role.A!.map((x) => x.name), ['p'])
})
