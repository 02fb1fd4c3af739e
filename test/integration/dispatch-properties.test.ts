// A property of the whole call path (docs/architecture.md "The path of a call" and "Dispatch"),
// in pool and inline mode: random mixes of calls to several real plugins on 127.0.0.1, under
// small per-origin bounds, with random cancellation and short deadlines. Whatever the mix, every
// caller is answered exactly once, with its own reply or a failure its plugin's behaviour allows;
// the calls whose plugin's answer reached them were never more at once at their plugin than the
// in-flight bound; a "busy" call is answered only at a full origin and never reaches its plugin;
// and once the calls are answered nothing is pending, queued, held by a plugin or counted in the
// reply-byte budget. A second property closes Toolport in the middle of such a mix ("close()" in
// docs/architecture.md "Dispatch"). Each run's calls are made on real timers, so a failing case
// found (seed, path) may need a few replays to fail again.
import assert from 'node:assert/strict'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { Worker } from 'node:worker_threads'
import { test, type TestContext } from 'node:test'
import fc from 'fast-check'
import type { Toolport } from '../../src/main/index.js'
import type { ToolResult } from '../../src/main/dispatch/result.js'
import type { CallFinishedEvent } from '../../src/main/events.js'
import { kPendingCalls, kWorkerThreads } from '../../src/main/symbols.js'
import { createTestToolport, listenOnLoopback, waitFor, within } from '../helpers.js'

const MODES = ['pool', 'inline'] as const
type Mode = typeof MODES[number]

/** What a plugin does with a call; chosen per call and sent in its arguments. */
const BEHAVIOURS = ['json', 'text', 'tool_error', 'status_500', 'destroy', 'hang'] as const
type Behaviour = typeof BEHAVIOURS[number]

/** How a call ended, as its `call-finished` event says. */
type Kind = CallFinishedEvent['outcome']

/** The outcome a behaviour ends in when nothing else (busy, cancel, deadline) intervenes. */
const NATURAL: Record<Behaviour, Kind | null> = {
  json: 'ok',
  text: 'ok',
  tool_error: 'ok',
  status_500: 'http',
  destroy: 'protocol',
  hang: null
}

/** The short tools' `timeout_seconds`; the others have 30 s. */
const SHORT_SECONDS = 0.2

/** Generous bounds on waits: a run that does not settle fails instead of hanging the file. */
const RUN_GUARD_MS = 15_000
const DRAIN_GUARD_MS = 5_000
/**
 * Shrinking re-runs real calls, and a failing run may wait out a guard: a bounded number of
 * shrinks keeps a failure's report (seed, path, smallest case found) within the test's timeout.
 */
const MAX_SHRINKS = 40
const FAILING_TIMEOUT_MS = 600_000

interface Bounds {
  maxInFlightPerOrigin: number
  maxQueuedPerOrigin: number
}

/** Each reused Toolport has one of these (a pool per set of bounds pays one worker start). */
const BOUNDS: readonly Bounds[] = [
  { maxInFlightPerOrigin: 1, maxQueuedPerOrigin: 2 },
  { maxInFlightPerOrigin: 2, maxQueuedPerOrigin: 0 },
  { maxInFlightPerOrigin: 4, maxQueuedPerOrigin: 3 }
]

type Abort =
  | { at: 'none' }
  /** The signal is aborted before `callTool` is called. */
  | { at: 'before' }
  /** Aborted right after `callTool` returned, in the same turn. */
  | { at: 'sync' }
  /** Aborted `ms` after `callTool` returned. */
  | { at: 'later', ms: number }

interface CallPlan {
  plugin: number
  behaviour: Behaviour
  delayMs: number
  /** Called through the tool with the short timeout. */
  isShort: boolean
  abort: Abort
  /** When the call is made, from the start of the run. */
  startMs: number
}

const abortArb: fc.Arbitrary<Abort> = fc.oneof(
  { arbitrary: fc.constant<Abort>({ at: 'none' }), weight: 4 },
  { arbitrary: fc.constant<Abort>({ at: 'before' }), weight: 1 },
  { arbitrary: fc.constant<Abort>({ at: 'sync' }), weight: 1 },
  { arbitrary: fc.integer({ min: 0, max: 60 }).map((ms): Abort => ({ at: 'later', ms })), weight: 3 }
)

/**
 * One call, made up to `maxStartMs` into its run. `mustEnd`: a call that hangs needs a way to end
 * (its signal or the short deadline), except where close() ends it.
 */
function callArb (plugins: number, maxStartMs: number, mustEnd: boolean): fc.Arbitrary<CallPlan> {
  return fc.record({
    plugin: fc.integer({ min: 0, max: plugins - 1 }),
    behaviour: fc.constantFrom(...BEHAVIOURS),
    delayMs: fc.integer({ min: 0, max: 30 }),
    isShort: fc.boolean(),
    abort: abortArb,
    startMs: fc.oneof(fc.constant(0), fc.integer({ min: 0, max: maxStartMs }))
  }).map((plan) => mustEnd && plan.behaviour === 'hang' && plan.abort.at === 'none' ? { ...plan, isShort: true } : plan)
}

/** What a call's arguments carry to the plugin. */
interface CallArguments {
  token: string
  behaviour: Behaviour
  delay_ms: number
}

/**
 * A plugin on 127.0.0.1 that does what each call's arguments say, and notes what it sees: each
 * request from its arrival until it ended (the plugin answered or destroyed the socket, or the
 * client closed it), and how often each call's token reached it.
 */
interface Plugin {
  origin: string
  /** Requests being handled now. */
  readonly active: number
  /**
   * The most requests the plugin was handling at once since `forget()`, counting only the calls
   * in `delivered`: those its answer (reply or closed socket) ended. A call that Toolport stopped
   * (cancelled, timed out) is left out: its caller is answered and its slot freed at once, so the
   * next queued call may reach the plugin before the plugin sees the stopped one's socket close.
   */
  peak: (delivered: ReadonlySet<string>) => number
  /** Requests that reached the plugin, by call id (each call's id is its token). */
  readonly received: Map<string, number>
  /** Calls whose `x-toolport-call-id`, body `call_id` and token did not agree. */
  readonly mismatches: string[]
  /** Destroys the sockets of the requests it still holds (after a run that failed). */
  dropHeld: () => void
  /** Forgets the requests that have ended. */
  forget: () => void
}

/** One request as the plugin saw it, on its own clock (a counter: every event has its own tick). */
interface Span {
  token: string
  start: number
  end: number
}

async function startPlugin (t: TestContext): Promise<Plugin> {
  let active = 0
  let clock = 0
  let spans: Span[] = []
  const received = new Map<string, number>()
  const mismatches: string[] = []
  const held = new Set<ServerResponse>()
  const server = createServer((request: IncomingMessage, response: ServerResponse) => {
    active++
    const header = String(request.headers['x-toolport-call-id'])
    const span: Span = { token: header, start: ++clock, end: -1 }
    spans.push(span)
    held.add(response)
    const end = (): void => {
      if (span.end !== -1) return
      span.end = ++clock
      active--
      held.delete(response)
    }
    response.once('close', end)
    received.set(header, (received.get(header) ?? 0) + 1)
    const chunks: Buffer[] = []
    request.on('data', (chunk: Buffer) => { chunks.push(chunk) })
    request.on('end', () => {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { call_id: string, arguments: CallArguments }
      const args = body.arguments
      if (body.call_id !== header || args.token !== header) mismatches.push(header)
      if (args.behaviour === 'hang') return
      setTimeout(() => {
        if (span.end !== -1) return // the client went away meanwhile
        end()
        const token = args.token
        switch (args.behaviour) {
          case 'json':
            send(response, 200, 'application/json', JSON.stringify({ output: { token }, is_error: false }))
            break
          case 'text':
            send(response, 200, 'text/plain', `plain ${token}`)
            break
          case 'tool_error':
            send(response, 200, 'application/json', JSON.stringify({ is_error: true, error: `refused ${token}` }))
            break
          case 'status_500':
            send(response, 500, 'text/plain', `failed ${token}`)
            break
          case 'destroy':
            request.socket.destroy()
            break
        }
      }, args.delay_ms)
    })
  })
  // Longer than any run: an idle keep-alive socket is never closed under a call by this server.
  server.keepAliveTimeout = 120_000
  return {
    origin: await listenOnLoopback(t, server),
    get active () { return active },
    peak (delivered) {
      const ticks: number[] = []
      for (const span of spans) if (delivered.has(span.token)) ticks.push(span.start, -span.end)
      ticks.sort((a, b) => Math.abs(a) - Math.abs(b))
      let now = 0
      let most = 0
      for (const tick of ticks) {
        now += tick > 0 ? 1 : -1
        if (now > most) most = now
      }
      return most
    },
    received,
    mismatches,
    dropHeld () {
      for (const response of [...held]) response.socket?.destroy()
    },
    forget () {
      spans = spans.filter((span) => span.end === -1)
    }
  }
}

function send (response: ServerResponse, status: number, contentType: string, body: string): void {
  response.writeHead(status, { 'content-type': contentType, 'content-length': Buffer.byteLength(body) })
  response.end(body)
}

/** Numbers runs and warm-up calls, so that every token is unique in the file. */
let runs = 0

function toolName (plugin: number, isShort: boolean): string {
  return isShort ? `p${plugin}_short` : `p${plugin}`
}

/** A Toolport with two tools per plugin (30 s and SHORT_SECONDS), recording each call's outcome kinds. */
async function startToolport (t: TestContext, mode: Mode, bounds: Bounds, plugins: readonly Plugin[],
  closeGraceMs = 5_000): Promise<{ tp: Toolport, finished: Map<string, Kind[]> }> {
  const tp = await createTestToolport(t, {
    roles: ['r'],
    dispatch: { mode, ...bounds, closeGraceMs }
  })
  for (const [i, plugin] of plugins.entries()) {
    for (const isShort of [false, true]) {
      const result = await tp.register({
        name: toolName(i, isShort),
        callback_url: `${plugin.origin}/call`,
        timeout_seconds: isShort ? SHORT_SECONDS : 30,
        parameters: { type: 'object' }
      })
      assert.equal(result.ok, true, result.error)
    }
  }
  // One call first, so that in pool mode the worker has started and its lane is open when a run begins.
  const token = `warm-up-${++runs}`
  const args: CallArguments = { token, behaviour: 'json', delay_ms: 0 }
  const warm = await tp.callTool('r', { name: toolName(0, false), call_id: token, arguments: args })
  assert.deepEqual(warm.output, { token }, warm.error)
  const finished = new Map<string, Kind[]>()
  tp.on('call-finished', (event) => {
    const kinds = finished.get(event.callId)
    if (kinds === undefined) finished.set(event.callId, [event.outcome])
    else kinds.push(event.outcome)
  })
  return { tp, finished }
}

/** One call as it went. */
interface Observed {
  plan: CallPlan
  token: string
  result: ToolResult
  /** Calls to its plugin made and not yet answered when it was made (an upper bound of the dispatcher's count). */
  outstandingAtCall: number
  /** Made after close() began. */
  isAfterClose: boolean
}

/**
 * Makes the calls of `plans` at their start times and resolves once every one is answered;
 * `onStart` runs when the first calls have been made. Rejects, naming the calls without an
 * answer, if they are not all answered within RUN_GUARD_MS.
 */
async function makeCalls (tp: Toolport, plans: readonly CallPlan[], state: { isClosing: boolean },
  onStart: () => void = () => {}): Promise<Observed[]> {
  const run = ++runs
  const outstanding = new Map<number, number>()
  const unanswered = new Set<string>()
  const timers: NodeJS.Timeout[] = []
  const calls = plans.map((plan, i) => new Promise<Observed>((resolve) => {
    const token = `t${run}-${i}`
    const go = (): void => {
      const controller = new AbortController()
      if (plan.abort.at === 'before') controller.abort()
      const outstandingAtCall = outstanding.get(plan.plugin) ?? 0
      const isAfterClose = state.isClosing
      const args: CallArguments = { token, behaviour: plan.behaviour, delay_ms: plan.delayMs }
      unanswered.add(token)
      const promise = tp.callTool('r', { name: toolName(plan.plugin, plan.isShort), call_id: token, arguments: args },
        { signal: controller.signal })
      // A call aborted before it was made is never admitted; every other one is counted until answered.
      const counted = plan.abort.at !== 'before'
      if (counted) outstanding.set(plan.plugin, outstandingAtCall + 1)
      if (plan.abort.at === 'sync') controller.abort()
      if (plan.abort.at === 'later') timers.push(setTimeout(() => { controller.abort() }, plan.abort.ms))
      promise.then((result) => {
        unanswered.delete(token)
        if (counted) outstanding.set(plan.plugin, (outstanding.get(plan.plugin) as number) - 1)
        resolve({ plan, token, result, outstandingAtCall, isAfterClose })
      }, (err: unknown) => {
        // callTool throws only for an unknown role: a failure of this test, reported as a result.
        unanswered.delete(token)
        resolve({ plan, token, result: { is_error: true, output: null, error: `threw: ${String(err)}`, text: '' }, outstandingAtCall, isAfterClose })
      })
    }
    if (plan.startMs === 0) go()
    else timers.push(setTimeout(go, plan.startMs))
  }))
  onStart()
  try {
    return await within(Promise.all(calls), () => `${unanswered.size} calls unanswered (${[...unanswered].join(', ')})`,
      RUN_GUARD_MS)
  } finally {
    for (const timer of timers) clearTimeout(timer)
  }
}

/** Polls `check` until it returns '' (all is well); throws its last complaint after `timeoutMs`. */
async function eventually (check: () => string | Promise<string>, timeoutMs = DRAIN_GUARD_MS): Promise<void> {
  const until = Date.now() + timeoutMs
  for (;;) {
    const problem = await check()
    if (problem === '') return
    if (Date.now() > until) throw new Error(problem)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

async function replyBufferBytes (tp: Toolport): Promise<number> {
  // The registry itself, not GET /metrics: it answers after close() too.
  assert.ok(tp.metrics !== null, 'metrics are on')
  const text = await tp.metrics.text()
  const match = /^toolport_reply_buffer_bytes (\d+)$/m.exec(text)
  assert.ok(match !== null, 'the metrics have toolport_reply_buffer_bytes')
  return Number(match[1])
}

/** The kinds a call may end in; `closing`: close() may have cancelled or refused it. */
function allowedKinds (observed: Observed, closing: boolean): Set<Kind> {
  const { plan } = observed
  if (observed.isAfterClose) return new Set(['busy'])
  if (plan.abort.at === 'before') return new Set(['cancelled'])
  const kinds = new Set<Kind>(['busy'])
  if (plan.abort.at === 'sync') return kinds.add('cancelled')
  const natural = NATURAL[plan.behaviour]
  if (natural !== null) kinds.add(natural)
  if (plan.abort.at === 'later' || closing) kinds.add('cancelled')
  if (plan.isShort) kinds.add('timeout')
  return kinds
}

/** Checks one answered call against its plan; `kind` is what its `call-finished` event said. */
function checkCall (observed: Observed, kind: Kind, plugin: Plugin, bounds: Bounds, closing: boolean): void {
  const { plan, token, result } = observed
  const what = `call ${token} ${JSON.stringify(plan)}${observed.isAfterClose ? ' (after close began)' : ''}`
  const allowed = allowedKinds(observed, closing)
  assert.ok(allowed.has(kind), `${what} ended '${kind}': ${result.error ?? result.text}; allowed: ${[...allowed].join(', ')}`)
  const received = plugin.received.get(token) ?? 0
  assert.ok(received <= 1, `${what} reached its plugin ${received} times`)
  switch (kind) {
    case 'ok':
      // Exactly its own reply: no other call's token.
      if (plan.behaviour === 'json') {
        assert.equal(result.is_error, false, what)
        assert.deepEqual(result.output, { token }, what)
        assert.equal(result.text, JSON.stringify({ token }), what)
      } else if (plan.behaviour === 'text') {
        assert.equal(result.is_error, false, what)
        assert.equal(result.output, `plain ${token}`, what)
        assert.equal(result.text, `plain ${token}`, what)
      } else {
        assert.equal(result.is_error, true, what)
        assert.equal(result.error, `refused ${token}`, what)
        assert.equal(result.output, null, what)
      }
      assert.equal(received, 1, `${what} was answered by its plugin, so it reached it`)
      break
    case 'http':
      assert.equal(result.is_error, true, what)
      assert.equal(result.error, `tool callback returned HTTP 500: failed ${token}`, what)
      assert.equal(received, 1, `${what} was answered by its plugin, so it reached it`)
      break
    case 'protocol':
      assert.equal(result.is_error, true, what)
      assert.match(result.error ?? '', /callback failed/, what)
      assert.equal(received, 1, `${what}: its plugin closed the socket, so it reached it`)
      break
    case 'cancelled':
      assert.equal(result.is_error, true, what)
      assert.match(result.error ?? '', /call was cancelled/, what)
      if (plan.abort.at === 'before') assert.equal(received, 0, `${what} was aborted before it was made, yet reached its plugin`)
      break
    case 'timeout':
      assert.equal(result.is_error, true, what)
      assert.match(result.error ?? '', new RegExp(`timed out after ${SHORT_SECONDS} s`), what)
      break
    case 'busy':
      assert.equal(result.is_error, true, what)
      assert.match(result.error ?? '', /was not called: Toolport is busy|shutting down/, what)
      assert.equal(received, 0, `${what} was answered busy, yet reached its plugin`)
      if (!closing) {
        // Only a full origin answers busy here (maxPending is far away), and its counts are the bounds.
        const full = bounds.maxInFlightPerOrigin + bounds.maxQueuedPerOrigin
        assert.ok(observed.outstandingAtCall >= full,
          `${what} was answered busy with at most ${observed.outstandingAtCall} calls to its plugin unanswered (bounds: ${full})`)
        assert.ok(result.error?.includes(`already has ${bounds.maxInFlightPerOrigin} calls in flight and ${bounds.maxQueuedPerOrigin} waiting`),
          `${what}: ${result.error}`)
      }
      break
  }
}

interface RunChecks {
  /** close() may have cancelled or refused the calls. */
  closing: boolean
}

/** Every call answered exactly once and as its plan allows; nothing left pending, queued, held or buffered. */
async function checkRun (tp: Toolport, finished: Map<string, Kind[]>, observed: readonly Observed[],
  plugins: readonly Plugin[], bounds: Bounds, { closing }: RunChecks): Promise<void> {
  assert.equal(tp[kPendingCalls], 0, 'no call is pending once every caller was answered')
  const health = tp.health()
  assert.equal(health.dispatch.in_flight, 0)
  assert.equal(health.dispatch.queued, 0)
  const delivered = new Set<string>()
  for (const call of observed) {
    const kinds = finished.get(call.token) ?? []
    assert.equal(kinds.length, 1, `call ${call.token} finished ${kinds.length} times (${kinds.join(', ')})`)
    const kind = kinds[0] as Kind
    checkCall(call, kind, plugins[call.plan.plugin] as Plugin, bounds, closing)
    if (kind === 'ok' || kind === 'http' || kind === 'protocol') delivered.add(call.token)
    finished.delete(call.token)
  }
  // A request whose caller was answered (cancelled, timed out) is stopped at the plugin too.
  await eventually(() => {
    const holding = plugins.map((p, i) => p.active > 0 ? `plugin ${i}: ${p.active}` : '').filter((s) => s !== '')
    return holding.length === 0 ? '' : `requests of answered calls still held by their plugins (${holding.join(', ')})`
  })
  for (const [i, plugin] of plugins.entries()) {
    assert.deepEqual(plugin.mismatches, [], `plugin ${i}: call ids that did not match their body`)
    const peak = plugin.peak(delivered)
    assert.ok(peak <= bounds.maxInFlightPerOrigin,
      `plugin ${i} handled ${peak} requests at once, over maxInFlightPerOrigin ${bounds.maxInFlightPerOrigin}`)
  }
  await eventually(async () => {
    const bytes = await replyBufferBytes(tp)
    return bytes === 0 ? '' : `toolport_reply_buffer_bytes is ${bytes} after every call was answered`
  })
}

/** Leaves the plugins clean for the next run, whatever this one did. */
async function resetPlugins (plugins: readonly Plugin[]): Promise<void> {
  for (const plugin of plugins) plugin.dropHeld()
  await eventually(() => plugins.every((p) => p.active === 0) ? '' : 'plugins still hold requests after a reset')
  for (const plugin of plugins) plugin.forget()
}

interface Tally {
  runs: number
  calls: number
  kinds: Map<string, number>
}

function tally (into: Tally, observed: readonly Observed[], finished: ReadonlyMap<string, Kind[]>): void {
  into.runs++
  into.calls += observed.length
  for (const call of observed) {
    const kind = finished.get(call.token)?.[0] ?? '?'
    into.kinds.set(kind, (into.kinds.get(kind) ?? 0) + 1)
  }
}

function describeTally (t: TestContext, mode: Mode, counted: Tally): void {
  const kinds = [...counted.kinds].sort(([a], [b]) => a.localeCompare(b)).map(([k, n]) => `${k} ${n}`).join(', ')
  t.diagnostic(`${mode}: ${counted.runs} runs, ${counted.calls} calls (${kinds})`)
}

for (const mode of MODES) {
  test(`${mode}: property: under random calls, bounds, cancellations and deadlines every caller gets exactly its own answer`, { timeout: FAILING_TIMEOUT_MS }, async (t) => {
    const plugins = await Promise.all([0, 1, 2].map(() => startPlugin(t)))
    // One Toolport per set of bounds, made on first use and reused by every run that draws it.
    const toolports = new Map<Bounds, Promise<{ tp: Toolport, finished: Map<string, Kind[]> }>>()
    const counted: Tally = { runs: 0, calls: 0, kinds: new Map() }
    const scenario = fc.limitShrink(fc.integer({ min: 2, max: 3 }).chain((count) => fc.record({
      bounds: fc.constantFrom(...BOUNDS),
      plans: fc.array(callArb(count, 150, true), { minLength: 1, maxLength: 120, size: 'medium' })
    })), MAX_SHRINKS)
    await fc.assert(fc.asyncProperty(scenario, async ({ bounds, plans }) => {
      let started = toolports.get(bounds)
      if (started === undefined) {
        started = startToolport(t, mode, bounds, plugins)
        toolports.set(bounds, started)
      }
      const { tp, finished } = await started
      try {
        const observed = await makeCalls(tp, plans, { isClosing: false })
        tally(counted, observed, finished)
        await checkRun(tp, finished, observed, plugins, bounds, { closing: false })
      } finally {
        await resetPlugins(plugins)
        finished.clear()
      }
    }), { numRuns: 25, includeErrorInReport: true })
    describeTally(t, mode, counted)
  })

  test(`${mode}: property: close() in the middle of random calls answers every caller exactly once, and later callers "busy"`, { timeout: FAILING_TIMEOUT_MS }, async (t) => {
    const plugins = await Promise.all([0, 1].map(() => startPlugin(t)))
    const counted: Tally = { runs: 0, calls: 0, kinds: new Map() }
    const scenario = fc.limitShrink(fc.record({
      bounds: fc.constantFrom(...BOUNDS),
      closeGraceMs: fc.constantFrom(0, 20),
      closeAfterMs: fc.integer({ min: 0, max: 50 }),
      // Hanging calls need no way to end of their own: close() ends them.
      plans: fc.array(callArb(2, 40, false), { minLength: 1, maxLength: 60, size: 'medium' })
    }), MAX_SHRINKS)
    // Pool mode: close() destroys workers that may be holding part of a reply; the bytes they
    // held are given back all the same (the last tests of this file).
    const checks: RunChecks = { closing: true }
    await fc.assert(fc.asyncProperty(scenario, async ({ bounds, closeGraceMs, closeAfterMs, plans }) => {
      // A fresh Toolport per run: close() is what is tested.
      const { tp, finished } = await startToolport(t, mode, bounds, plugins, closeGraceMs)
      try {
        const state = { isClosing: false }
        let closed: Promise<void> = Promise.resolve()
        let closeTimer: NodeJS.Timeout | undefined
        const observed = await makeCalls(tp, plans, state, () => {
          closeTimer = setTimeout(() => {
            state.isClosing = true
            closed = tp.close()
          }, closeAfterMs)
        })
        // Every call was answered; close() has begun, unless they all were before its time came.
        clearTimeout(closeTimer)
        if (!state.isClosing) {
          state.isClosing = true
          closed = tp.close()
        }
        await closed
        tally(counted, observed, finished)
        await checkRun(tp, finished, observed, plugins, bounds, checks)
        // Closed: a call now is refused without reaching its plugin.
        const late = await makeCalls(tp, [{ plugin: 0, behaviour: 'json', delayMs: 0, isShort: false, abort: { at: 'none' }, startMs: 0 }],
          state)
        await checkRun(tp, finished, late, plugins, bounds, checks)
      } finally {
        await tp.close()
        await resetPlugins(plugins)
      }
    }), { numRuns: 8, includeErrorInReport: true })
    describeTally(t, mode, counted)
  })
}

/** A plugin that sends the first 1000 bytes of a reply and then holds it. */
async function startPartialPlugin (t: TestContext): Promise<string> {
  const server = createServer((request: IncomingMessage, response: ServerResponse) => {
    request.resume()
    response.writeHead(200, { 'content-type': 'application/json' })
    response.write(`{"output":"${'a'.repeat(1000)}`)
  })
  return `${await listenOnLoopback(t, server)}/partial`
}

async function startPartialToolport (t: TestContext, budget: number): Promise<Toolport> {
  const tp = await createTestToolport(t, { roles: ['r'], dispatch: { mode: 'pool', maxBufferedReplyBytes: budget, closeGraceMs: 50 } })
  const result = await tp.register({ name: 'partial', callback_url: await startPartialPlugin(t), parameters: { type: 'object' } })
  assert.equal(result.ok, true, result.error)
  return tp
}

test('pool: the reply bytes a worker holds are given back when its thread exits mid-reply, so exits never shrink the budget', async (t) => {
  // A budget of four held replies: without the bytes given back, the fifth exit's call would be
  // refused with TP_REPLY_BUDGET instead of reaching its reply's first bytes.
  const tp = await startPartialToolport(t, 4096)
  for (let exit = 1; exit <= 6; exit++) {
    await waitFor('a worker thread', () => tp[kWorkerThreads].length > 0)
    const call = tp.callTool('r', { name: 'partial', arguments: {} })
    await eventually(async () => await replyBufferBytes(tp) > 0 ? '' : `exit ${exit}: the reply's first bytes were not counted`)
    // The thread exits as a crashed one would (as in dispatch.test.ts).
    await (tp[kWorkerThreads][0] as Worker).terminate()
    const result = await call
    assert.equal(result.is_error, true)
    assert.match(result.error ?? '', /internal error/, `exit ${exit}`)
    await eventually(async () => {
      const bytes = await replyBufferBytes(tp)
      return bytes === 0 ? '' : `exit ${exit}: toolport_reply_buffer_bytes is ${bytes} after the call was answered and its thread is gone`
    })
  }
})

test('pool: close() destroying a worker mid-reply gives the bytes it held back', async (t) => {
  const tp = await startPartialToolport(t, 1024 * 1024)
  const call = tp.callTool('r', { name: 'partial', arguments: {} })
  await eventually(async () => await replyBufferBytes(tp) > 0 ? '' : 'the reply\'s first bytes were not counted')
  await tp.close()
  assert.equal((await call).is_error, true)
  assert.equal(await replyBufferBytes(tp), 0)
})
