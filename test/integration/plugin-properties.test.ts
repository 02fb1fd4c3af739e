// A property of the TypeScript plugin SDK (src/plugin, README "Plugin SDK"), against a real
// Toolport listening on 127.0.0.1 and real sockets: random sequences of what plugin authors and
// hosts do. Two plugin slots, each holding at most one running plugin at a time (a new plugin
// object per start, as the README asks), with a random role (every role, 'A', or 'C', which may
// not exist) and a random subset of four tools: `echo` (zod, returns its input, or nothing),
// `fail` (throws), `slow` (a 0.25 s deadline) and `wait` (30 s; waits until told or aborted).
// Steps: a plugin starts (also a plugin of the same source starting before the previous one has
// stopped), stops (with or without grace), Toolport is closed and a new one listens on the same
// port (plugins stop and start, roles change while it is down), roles 'B' and 'C' come and go,
// the host unregisters or clears a plugin's tools (as an eviction or an R15 unregister would),
// takes a name over with its own registration (R5) and gives it back, and batches of concurrent
// calls arrive: answered, thrown, refused for their arguments, past their deadline, abandoned by
// their caller, and in flight while a plugin stops, Toolport restarts or tools are removed.
//
// Half of the runs poll fast (pollIntervalMs 100), half never in a run's time (only the event
// stream can explain a repair, README "Keeping registrations alive"). Some runs give every role a
// live model session whose syncs take a few ms (as MCP or Realtime ones do), and some steps run
// back to back, a few ms apart, without settling in between (checks then overlap events, each
// other and stop()). After every step settles:
// - Toolport's registry is what the plugins declare: each running plugin's tools in each of its
//   roles, at its own callback URL and source; a name the host took over stays the host's (the
//   SDK leaves it alone); nothing of a stopped plugin; with events only, a loss that no event
//   names (a role re-added for a plugin of one role, a taken-over name given back) may stay;
// - every running plugin watches the event stream, and Toolport has exactly one stream per
//   running plugin (none left behind by a stopped one);
// - each tool a running plugin lost and registered again was announced by a `registered` event
//   (`restored`), and `start` announced every tool once, first.
// Each call reaches the handler of the plugin that held the name when it was made, exactly once
// (never a stopped plugin's, never a handler when the arguments were refused or the name was
// not there), with its call id, name and a deadline within the tool's; its result is the
// handler's output or thrown message; a handler whose caller went away (cancelled, deadline,
// Toolport closed, plugin stopped) sees its signal abort (AbortError unless its deadline came
// first), and a call in flight when a plugin stops with enough grace finishes.
// stop() never rejects, takes at most about graceMs, clears what the plugin registered
// (`removed` counts it) or reports the failure while Toolport is down; after it the plugin's
// port refuses connections, its API connections are closed, and it never sends Toolport a
// request again (and none registered after its own clear); start() of a plugin whose role does
// not exist rejects at once (R6) and leaves nothing behind; only the documented errors are
// emitted, each with a cause in the run; and at the end of a run no socket, server or ref'd
// timer is left.
//
// Six bugs found while running the property are pinned by the regression tests at the end (a
// minimal deterministic case each; the last bug, two). The property no longer steps around them:
// see AWAIT_WATCH_AFTER_START, MAX_EVENTS_ONLY_RESTARTS and ROLE_REMOVED_MID_CHECK_FAILS.
// TOOLPORT_PLUGIN_PROPERTY_RUNS=300 runs a longer search.
import assert from 'node:assert/strict'
import { once } from 'node:events'
import type { IncomingMessage } from 'node:http'
import { connect, type Socket } from 'node:net'
import { test, type TestContext } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { isDeepStrictEqual } from 'node:util'
import fc from 'fast-check'
import { z } from 'zod'
import { createToolport, type Toolport } from '../../src/main/index.js'
import type { ToolResult } from '../../src/main/dispatch/result.js'
import {
  createPlugin, PLUGIN_ERROR_CODES, PluginError, type Plugin, type RegisteredEvent, type StartResult
} from '../../src/plugin/index.js'
import { closedPort } from '../fixtures/callback-server.js'
import { waitFor, within } from '../helpers.js'

/** Bounds on waits: a run that does not settle fails instead of hanging the file. */
const SETTLE_MS = 4000
const STEP_GUARD_MS = 15_000
/** How long after its caller went away a handler may take to see its signal abort. */
const ABORT_SEEN_MS = 2000
/** Shrinking re-runs real Toolports and plugins: bounded, so a failure's report comes in time. */
const MAX_SHRINKS = 25
const FAILING_TIMEOUT_MS = 600_000
/** Runs per test run (15 take ~5–8 s on 2 cores); TOOLPORT_PLUGIN_PROPERTY_RUNS=300 for a longer search. */
const NUM_RUNS = Number(process.env.TOOLPORT_PLUGIN_PROPERTY_RUNS ?? 15)

/**
 * Whether finishStart() waits for the watch's first `hello` before the next step. False: steps
 * also come between start() and the watch's connection, and the check on its first `hello`
 * (regression test "R15: a tool unregistered just after start() resolved" below) must repair
 * what they removed.
 */
const AWAIT_WATCH_AFTER_START = false
/**
 * How often a run that relies on events restarts Toolport. 100: as often as its steps say; the
 * watch's reconnection backoff starts over once a stream is up, so every restart is seen as soon
 * as the first (regression tests "R3: the third Toolport restart" and "start() before Toolport"
 * below).
 */
const MAX_EVENTS_ONLY_RESTARTS = 100
/**
 * Whether a role removed in a hurry may leave any loss until the next poll. False: a check skips
 * a role removed under it and goes on, and a check asked for meanwhile runs even after a failed
 * one (regression test "R4: a role removed while the plugin registers" below), so with events
 * only every loss is repaired at once.
 */
const ROLE_REMOVED_MID_CHECK_FAILS = false

/** 'A' always exists; 'B' and 'C' come and go. */
const ROLES = ['A', 'B', 'C'] as const
type RoleName = typeof ROLES[number]
/** A plugin's role: every role, 'A' (always there), or 'C' (maybe not). */
type PluginRole = null | 'A' | 'C'
const KINDS = ['echo', 'fail', 'slow', 'wait'] as const
type Kind = typeof KINDS[number]
const SLOTS = 2
const SLOW_SECONDS = 0.25
/** A handler that waits this long waits for its signal. */
const FOREVER_MS = 60_000
/** Poll settings: fast, or never within a run (only the event stream explains a repair). */
const FAST_POLL = { pollIntervalMs: 100, maxBackoffMs: 200 }
const EVENTS_ONLY = { pollIntervalMs: 600_000, maxBackoffMs: 200 }
const HOST_SOURCE = 'external'

const toolName = (slot: number, kind: Kind): string => `s${slot}_${kind}`
const sourceOf = (slot: number): string => `plugin:s${slot}`

// ---------------------------------------------------------------------------------------------
// Scenarios

interface PluginPlan { role: PluginRole, kinds: Kind[] }
/**
 * `long`: the handler runs until its connection goes; only for a call in flight while its plugin
 * stops or Toolport closes (else it is `ok`).
 */
type How = 'ok' | 'invalid' | 'hang' | 'abort' | 'long'
interface CallPlan {
  slot: number
  kind: Kind
  /** Index into the roles that exist when the call is made. */
  role: number
  how: How
  /** slow/wait `ok`: the handler's sleep; wait `abort`: when the caller aborts. */
  ms: number
  n: number
}
/** What may happen while Toolport is down. */
type GapStep =
  | { op: 'start', slot: number, plan: PluginPlan }
  | { op: 'stop', slot: number, graceMs: number }
  | { op: 'role', role: 'B' | 'C' }
/** What may run while calls are in flight. */
type ThenStep =
  | { op: 'stop', slot: number, graceMs: number }
  | { op: 'restart', during: GapStep[] }
  | { op: 'unregister', slot: number, kind: Kind, role: RoleName | null }
  | { op: 'clear', slot: number, role: RoleName | null }
type Step =
  | ThenStep
  | { op: 'start', slot: number, plan: PluginPlan, isOverlapping: boolean }
  | { op: 'role', role: 'B' | 'C' }
  /** Steps run back to back, without settling in between: checks overlap events and each other. */
  | { op: 'hurry', steps: HurriedStep[], delaysMs: number[] }
  | { op: 'takeover', slot: number, kind: Kind, role: RoleName | null }
  | { op: 'release', slot: number, kind: Kind }
  | { op: 'calls', calls: CallPlan[], then: ThenStep | null }
type HurriedStep =
  | { op: 'role', role: 'B' | 'C' }
  | { op: 'stop', slot: number, graceMs: number }
  | { op: 'unregister', slot: number, kind: Kind, role: RoleName | null }
  | { op: 'clear', slot: number, role: RoleName | null }
  | { op: 'restart', during: GapStep[] }
interface Scenario {
  isEventsOnly: boolean
  /** Each role has a live model session whose syncs take up to this long (0: no session). */
  syncMs: number
  hasB: boolean
  hasC: boolean
  initial: Array<PluginPlan | null>
  steps: Step[]
}

const slotArb = fc.nat(SLOTS - 1)
const kindArb = fc.constantFrom(...KINDS)
const planArb: fc.Arbitrary<PluginPlan> = fc.record({
  role: fc.oneof({ weight: 3, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: fc.constantFrom('A' as const, 'C' as const) }),
  kinds: fc.subarray([...KINDS], { minLength: 1 })
})
const roleOrAllArb = fc.option(fc.constantFrom(...ROLES), { nil: null, freq: 2 })
const callArb: fc.Arbitrary<CallPlan> = fc.record({
  slot: slotArb,
  kind: kindArb,
  role: fc.nat(2),
  pick: fc.nat(3),
  ms: fc.integer({ min: 0, max: 60 }),
  n: fc.nat(3)
}).map(({ slot, kind, role, pick, ms, n }) => {
  const hows: Record<Kind, How[]> = {
    echo: ['ok', 'ok', 'ok', 'invalid'],
    fail: ['ok'],
    slow: ['ok', 'ok', 'ok', 'hang'],
    wait: ['ok', 'abort', 'long', 'abort']
  }
  const choices = hows[kind]
  return { slot, kind, role, how: choices[pick % choices.length] as How, ms, n }
})
const gapStepArb: fc.Arbitrary<GapStep> = fc.oneof(
  fc.record({ op: fc.constant('start' as const), slot: slotArb, plan: planArb }),
  fc.record({ op: fc.constant('stop' as const), slot: slotArb, graceMs: fc.constant(0) }),
  fc.record({ op: fc.constant('role' as const), role: fc.constantFrom('B' as const, 'C' as const) })
)
const thenStepArb: fc.Arbitrary<ThenStep> = fc.oneof(
  fc.record({ op: fc.constant('stop' as const), slot: slotArb, graceMs: fc.constantFrom(0, 300) }),
  fc.record({ op: fc.constant('restart' as const), during: fc.array(gapStepArb, { maxLength: 2 }) }),
  fc.record({ op: fc.constant('unregister' as const), slot: slotArb, kind: kindArb, role: roleOrAllArb }),
  fc.record({ op: fc.constant('clear' as const), slot: slotArb, role: roleOrAllArb })
)
const hurriedArb: fc.Arbitrary<HurriedStep> = fc.oneof(
  { weight: 3, arbitrary: fc.record({ op: fc.constant('role' as const), role: fc.constantFrom('B' as const, 'C' as const) }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('unregister' as const), slot: slotArb, kind: kindArb, role: roleOrAllArb }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('clear' as const), slot: slotArb, role: roleOrAllArb }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('restart' as const), during: fc.constant<GapStep[]>([]) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('stop' as const), slot: slotArb, graceMs: fc.constant(0) }) }
)
const stepArb: fc.Arbitrary<Step> = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.record({
      op: fc.constant('hurry' as const),
      steps: fc.array(hurriedArb, { minLength: 2, maxLength: 4 }),
      delaysMs: fc.array(fc.integer({ min: 0, max: 25 }), { minLength: 4, maxLength: 4 })
    })
  },
  { weight: 3, arbitrary: fc.record({ op: fc.constant('start' as const), slot: slotArb, plan: planArb, isOverlapping: fc.boolean() }) },
  { weight: 3, arbitrary: thenStepArb },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('role' as const), role: fc.constantFrom('B' as const, 'C' as const) }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('takeover' as const), slot: slotArb, kind: kindArb, role: roleOrAllArb }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('release' as const), slot: slotArb, kind: kindArb }) },
  {
    weight: 4,
    arbitrary: fc.record({
      op: fc.constant('calls' as const),
      calls: fc.array(callArb, { minLength: 1, maxLength: 5 }),
      then: fc.option(thenStepArb, { nil: null, freq: 2 })
    })
  }
)
const scenarioArb: fc.Arbitrary<Scenario> = fc.record({
  isEventsOnly: fc.boolean(),
  syncMs: fc.constantFrom(0, 0, 5, 20),
  hasB: fc.boolean(),
  hasC: fc.boolean(),
  initial: fc.tuple(planArb, fc.option(planArb, { nil: null })),
  steps: fc.array(stepArb, { minLength: 1, maxLength: 8 })
})

// ---------------------------------------------------------------------------------------------
// Plugins as the property runs them

interface Invocation {
  tag: string
  /** The tool whose handler ran, and the name its ctx said. */
  name: string
  ctxName: string
  callId: string
  deadlineMs: number
  /** The signal's reason's name once it aborted the handler, else null. */
  abortedWith: string | null
  isEnded: boolean
}

type InstanceState = 'starting' | 'running' | 'failed' | 'stopped'

interface Instance {
  slot: number
  tag: string
  plan: PluginPlan
  plugin: Plugin
  names: string[]
  key: string
  state: InstanceState
  starting: Promise<StartResult | PluginError> | null
  /** Its `registered` events, with the step each came in. */
  registeredEvents: Array<{ event: RegisteredEvent, step: number }>
  errors: PluginError[]
  /** Index in the request log when stop() resolved. */
  stoppedAt: number | null
  port: number
}

interface LoggedRequest { key: string | undefined, method: string, path: string }

interface Counts {
  runs: number
  steps: number
  calls: number
  restarts: number
  restored: number
  aborted: number
  failedStarts: number
}

class Run {
  readonly scenario: Scenario
  readonly port: number
  readonly deadOrigin: string
  readonly runId: number
  readonly counts: Counts
  tp: Toolport | null = null
  /** Every Toolport of the run (closed at the end). */
  readonly toolports: Toolport[] = []
  readonly roles = new Set<RoleName>(['A'])
  /** Names the host registered itself, per role (a takeover, R5). */
  readonly host = new Map<RoleName, Set<string>>()
  /** Losses only a poll would repair (no event names the plugin), per instance: `role\0name`. */
  readonly gaps = new Map<Instance, Set<string>>()
  readonly slots: Array<Instance | null> = Array.from({ length: SLOTS }, () => null)
  readonly instances: Instance[] = []
  readonly invocations = new Map<string, Invocation[]>()
  readonly requests: LoggedRequest[] = []
  /** Toolport's open sockets that carried a request with each plugin key. */
  readonly sockets = new Map<string, Set<Socket>>()
  /** Roles a plugin of one role saw removed (its checks may then fail with 404). */
  readonly removedRoles = new Set<RoleName>()
  /** Tools of running plugins that left Toolport during this step: each must come back as `restored`. */
  lost: Array<{ instance: Instance, role: RoleName, name: string }> = []
  step = 0
  #generation = 0
  #callSeq = 0
  hadRestart = false
  restarts = 0
  roleRemovals = 0
  isHurrying = false

  constructor (scenario: Scenario, port: number, deadOrigin: string, runId: number, counts: Counts) {
    this.scenario = scenario
    this.port = port
    this.deadOrigin = deadOrigin
    this.runId = runId
    this.counts = counts
    if (scenario.hasB) this.roles.add('B')
    if (scenario.hasC) this.roles.add('C')
  }

  get isEventsOnly (): boolean { return this.scenario.isEventsOnly }

  // -- Toolport -------------------------------------------------------------------------------

  async up (): Promise<void> {
    const tp = await createToolport({
      roles: ROLES.filter((r) => this.roles.has(r)),
      logger: false,
      dispatch: { mode: 'inline', closeGraceMs: 100 }
    })
    this.toolports.push(tp)
    // What leaves the registry of a running plugin must come back (see settle()).
    tp.on('tool-removed', ({ role, name, source, reason }) => {
      const instance = this.slots.find((i) => i !== null && sourceOf(i.slot) === source)
      if (reason !== 'replaced' && instance?.state === 'running') this.lost.push({ instance, role: role as RoleName, name })
    })
    // Every request any plugin sends, in order, with its plugin key (the event stream's have none),
    // and the sockets they came on.
    tp.app.server.on('request', (req: IncomingMessage) => {
      const key = req.headers['x-toolport-plugin-key']
      if (typeof key === 'string') {
        let open = this.sockets.get(key)
        if (open === undefined) this.sockets.set(key, (open = new Set()))
        if (!open.has(req.socket)) {
          open.add(req.socket)
          const set = open
          req.socket.once('close', () => { set.delete(req.socket) })
        }
      }
      this.requests.push({ key: typeof key === 'string' ? key : undefined, method: req.method ?? '', path: req.url ?? '' })
    })
    for (const role of tp.roles.names()) this.attachSession(tp, role)
    await tp.listen({ host: '127.0.0.1', port: this.port })
    this.tp = tp
    this.host.clear()
    this.gaps.clear()
  }

  /** A live model session of the role (as an MCP or Realtime one): every change waits for its sync. */
  attachSession (tp: Toolport, role: string): void {
    const { syncMs } = this.scenario
    if (syncMs === 0) return
    tp.roles.get(role).attachSession({
      id: `session-${role}`,
      syncTools: async (_tools, signal) => { await sleep(Math.random() * syncMs, undefined, { signal }) }
    })
  }

  async down (): Promise<void> {
    const tp = this.tp
    assert.ok(tp !== null)
    this.tp = null
    this.hadRestart = true
    await within(tp.close(), 'Toolport close()', STEP_GUARD_MS)
  }

  // -- plugins --------------------------------------------------------------------------------

  newInstance (slot: number, plan: PluginPlan): Instance {
    const gen = this.#generation++
    const tag = `s${slot}#${gen}`
    const names = plan.kinds.map((kind) => toolName(slot, kind))
    const key = `key-${this.runId}-${tag}`.padEnd(40, 'k')
    // Assertions inside a handler would only become tool errors: record, check afterwards.
    const record = (name: string, ctx: { callId: string, deadlineMs: number, name: string }): Invocation => {
      const invocation: Invocation = {
        tag, name, ctxName: ctx.name, callId: ctx.callId, deadlineMs: ctx.deadlineMs, abortedWith: null, isEnded: false
      }
      const list = this.invocations.get(ctx.callId)
      if (list === undefined) this.invocations.set(ctx.callId, [invocation])
      else list.push(invocation)
      return invocation
    }
    const waitOrAbort = (name: string) => async (args: Record<string, unknown>,
      ctx: { callId: string, deadlineMs: number, name: string, signal: AbortSignal }): Promise<unknown> => {
      const invocation = record(name, ctx)
      try {
        await sleep(Number(args.ms), undefined, { signal: ctx.signal })
      } catch {
        invocation.abortedWith = (ctx.signal.reason as Error | undefined)?.name ?? 'unknown'
        invocation.isEnded = true
        throw ctx.signal.reason
      }
      invocation.isEnded = true
      return { slept: args.ms, tag }
    }
    const msSchema = { type: 'object', properties: { ms: { type: 'integer', minimum: 0 } }, required: ['ms'] }
    const all = {
      echo: {
        description: 'Echoes n.',
        parameters: z.object({ n: z.number().int().min(0) }),
        handler: ({ n }: { n: number }, ctx: { callId: string, deadlineMs: number, name: string }) => {
          record(toolName(slot, 'echo'), ctx).isEnded = true
          // undefined is sent as null (README "Plugin SDK": `undefined` → `null`).
          return n === 0 ? undefined : { n, callId: ctx.callId, tag }
        }
      },
      fail: {
        description: 'Always fails.',
        parameters: { type: 'object', properties: {} },
        handler: (_args: unknown, ctx: { callId: string, deadlineMs: number, name: string }) => {
          record(toolName(slot, 'fail'), ctx).isEnded = true
          throw new Error(`failed ${ctx.callId}`)
        }
      },
      slow: { parameters: msSchema, timeoutSeconds: SLOW_SECONDS, handler: waitOrAbort(toolName(slot, 'slow')) },
      wait: { parameters: msSchema, timeoutSeconds: 30, handler: waitOrAbort(toolName(slot, 'wait')) }
    }
    const tools: Record<string, unknown> = {}
    for (const kind of plan.kinds) tools[toolName(slot, kind)] = all[kind]
    const poll = this.isEventsOnly ? EVENTS_ONLY : FAST_POLL
    const plugin = createPlugin({
      toolportUrl: `http://127.0.0.1:${this.port}`,
      source: sourceOf(slot),
      role: plan.role,
      pluginKey: key,
      logger: false,
      ...poll,
      requestTimeoutMs: 3000,
      tools: tools as never
    })
    const instance: Instance = {
      slot,
      tag,
      plan,
      plugin,
      names,
      key,
      state: 'starting',
      starting: null,
      registeredEvents: [],
      errors: [],
      stoppedAt: null,
      port: 0
    }
    plugin.on('registered', (event) => { instance.registeredEvents.push({ event, step: this.step }) })
    plugin.on('error', (err) => { instance.errors.push(err) })
    this.instances.push(instance)
    return instance
  }

  /** Calls start(); the promise resolves to the result or the PluginError it rejected with. */
  beginStart (instance: Instance): void {
    assert.equal(this.slots[instance.slot], null)
    this.slots[instance.slot] = instance
    instance.starting = instance.plugin.start().then((result) => result, (err: unknown) => {
      assert.ok(err instanceof PluginError, `start() rejects with a PluginError: ${String(err)}`)
      return err
    })
  }

  /** The roles a plugin's tools belong in now. */
  targets (instance: Instance): RoleName[] {
    const role = instance.plan.role
    if (role === null) return ROLES.filter((r) => this.roles.has(r))
    return this.roles.has(role) ? [role] : []
  }

  /** Waits for a start() that Toolport can answer now, and checks what it resolved to. */
  async finishStart (instance: Instance): Promise<void> {
    assert.ok(this.tp !== null && instance.starting !== null)
    const outcome = await within(instance.starting, `${instance.tag}: start()`, STEP_GUARD_MS)
    instance.starting = null
    const role = instance.plan.role
    if (role !== null && !this.roles.has(role)) {
      // R6: an unknown role is a 404, and start() rejects at once: nothing is left behind.
      assert.ok(outcome instanceof PluginError, `${instance.tag}: start() with the missing role ${role} rejects`)
      assert.equal(outcome.code, PLUGIN_ERROR_CODES.refused)
      assert.equal(outcome.statusCode, 404)
      assert.equal(outcome.toolportCode, 'TP_ERR_ROLE_NOT_FOUND')
      instance.state = 'failed'
      this.slots[instance.slot] = null
      this.counts.failedStarts++
      assert.equal(instance.plugin.isRunning, false)
      await assertRefused(instance, 'after a failed start()')
      await assert.rejects(instance.plugin.start(), { code: PLUGIN_ERROR_CODES.state })
      instance.stoppedAt = this.requests.length
      return
    }
    assert.ok(!(outcome instanceof PluginError), `${instance.tag}: start() failed: ${String(outcome)}`)
    instance.state = 'running'
    instance.port = Number(new URL(outcome.url).port)
    assert.equal(outcome.url, instance.plugin.url)
    assert.deepEqual(outcome.names, instance.names, 'start() resolves to every tool')
    assert.deepEqual([...outcome.roles].sort(), this.targets(instance), 'start() resolves to the roles that took the tools')
    assert.equal(instance.plugin.isRunning, true)
    assert.deepEqual(instance.plugin.toolNames, instance.names)
    // start() registered every tool with its role: a name the host held there is the plugin's now (R5).
    for (const role of this.targets(instance)) for (const name of instance.names) this.host.get(role)?.delete(name)
    const starts = instance.registeredEvents.filter(({ event }) => event.reason === 'start')
    assert.equal(starts.length, 1, 'one `registered` event with reason start')
    assert.equal(instance.registeredEvents[0]?.event.reason, 'start', '`start` comes first')
    assert.deepEqual(starts[0]?.event.names, instance.names)
    if (AWAIT_WATCH_AFTER_START) {
      await this.until(`${instance.tag} watches the event stream`, () => instance.plugin.isWatchingEvents ? '' : 'not watching')
    }
  }

  async stop (instance: Instance, graceMs: number): Promise<void> {
    const wasStarting = instance.state === 'starting'
    const isUp = this.tp !== null
    const before = isUp ? this.rowsOf(instance) : 0
    // A loss the model lets stay (a `may`) may be repaired by a check still running now.
    const repairable = this.gaps.get(instance)?.size ?? 0
    const stopping = Date.now()
    const result = await within(instance.plugin.stop({ graceMs }), `${instance.tag}: stop()`, STEP_GUARD_MS)
    // Calls in flight get graceMs, then their connections are closed (README "Start and stop").
    assert.ok(Date.now() - stopping <= graceMs + 2000, `${instance.tag}: stop({ graceMs: ${graceMs} }) took ${Date.now() - stopping} ms`)
    instance.stoppedAt = this.requests.length
    if (this.slots[instance.slot] === instance) this.slots[instance.slot] = null
    instance.state = 'stopped'
    if (wasStarting && instance.starting !== null) {
      const outcome = await within(instance.starting, `${instance.tag}: start() after stop()`, STEP_GUARD_MS)
      assert.ok(outcome instanceof PluginError, 'start() interrupted by stop() rejects')
      assert.equal(outcome.code, PLUGIN_ERROR_CODES.state)
      instance.starting = null
    }
    this.gaps.delete(instance)
    // stop() never rejects (README); it reports what the clear did.
    if (wasStarting) {
      assert.deepEqual(result, { isCleared: false, removed: 0, error: null }, 'nothing was registered, nothing to clear')
    } else if (isUp && instance.plan.role !== null && !this.roles.has(instance.plan.role)) {
      // Its one role is gone, and its tools with it: nothing was left to clear, which is no failure
      // (regression test "stop() of a plugin whose role was removed" below).
      assert.deepEqual({ ...result, error: result.error?.message ?? null },
        { isCleared: true, removed: 0, error: null }, `${instance.tag}: stop() without its role`)
    } else if (isUp) {
      assert.equal(result.error, null, `${instance.tag}: stop() could not clear: ${String(result.error)}`)
      assert.equal(result.isCleared, true)
      // In a hurry, a check may still be registering what a step just removed: stop() waits for it.
      const most = this.isHurrying ? KINDS.length * this.targets(instance).length : before + repairable
      assert.ok(result.removed >= before && result.removed <= most,
        `${instance.tag}: stop() removed ${result.removed}, its source had ${before} in its roles (at most ${most})`)
    } else {
      assert.equal(result.isCleared, false)
      assert.equal(result.removed, 0)
      assert.ok(result.error instanceof PluginError)
      assert.equal(result.error.code, PLUGIN_ERROR_CODES.unreachable)
    }
    assert.equal(instance.plugin.isRunning, false)
    assert.equal(instance.plugin.isWatchingEvents, false)
    assert.deepEqual(await instance.plugin.stop(), result, 'stop() again answers the same')
    await assert.rejects(instance.plugin.start(), { code: PLUGIN_ERROR_CODES.state }, 'a plugin starts once')
    if (instance.port !== 0) await assertRefused(instance, 'after stop()')
    // Its connections to Toolport's API are closed too (the event stream's: see settle()).
    await this.until(`${instance.tag}'s API connections close after stop()`, () => {
      const open = this.sockets.get(instance.key)?.size ?? 0
      return open === 0 ? '' : `${open} open`
    }, 1000)
  }

  /** How many rows Toolport lists with the instance's source in the instance's roles. */
  rowsOf (instance: Instance): number {
    assert.ok(this.tp !== null)
    let count = 0
    const listed = this.tp.list().tools_by_role
    for (const role of this.targets(instance)) {
      for (const row of listed[role] ?? []) if (row.source === sourceOf(instance.slot)) count++
    }
    return count
  }

  // -- the model ------------------------------------------------------------------------------

  /** Who holds `name` in `role` now, as Toolport lists it: an instance's tag, 'host', '?url', or null. */
  holder (role: RoleName, name: string): string | null {
    assert.ok(this.tp !== null)
    const row = this.tp.list().tools_by_role[role]?.find((r) => r.name === name)
    if (row === undefined) return null
    return this.ownerOf(row.source, row.callback_url)
  }

  ownerOf (source: string | undefined, url: string | null | undefined): string {
    if (source === HOST_SOURCE) return 'host'
    for (const instance of this.instances) {
      if (source !== sourceOf(instance.slot) || instance.plugin.url === '') continue
      for (const name of instance.names) if (instance.plugin.callbackUrl(name) === url) return instance.tag
    }
    return `?${source ?? ''} ${url ?? ''}`
  }

  runningInstances (): Instance[] {
    return this.slots.filter((i): i is Instance => i !== null && i.state === 'running')
  }

  /** Expected holder per role and name; `may` marks a loss only a poll would repair. */
  expected (): Map<RoleName, Map<string, { owner: string, may: boolean }>> {
    const out = new Map<RoleName, Map<string, { owner: string, may: boolean }>>()
    for (const role of ROLES) if (this.roles.has(role)) out.set(role, new Map())
    for (const [role, names] of this.host) for (const name of names) out.get(role)?.set(name, { owner: 'host', may: false })
    for (const instance of this.runningInstances()) {
      const gaps = this.gaps.get(instance)
      for (const role of this.targets(instance)) {
        const byName = out.get(role) as Map<string, { owner: string, may: boolean }>
        for (const name of instance.names) {
          if (byName.has(name)) continue
          byName.set(name, { owner: instance.tag, may: gaps?.has(`${role}\0${name}`) === true })
        }
      }
    }
    return out
  }

  /** '' when Toolport's registry is what the model expects, else what differs. */
  registryDiff (): string {
    assert.ok(this.tp !== null)
    const problems: string[] = []
    const roles = this.tp.roles.names().sort()
    const modelRoles = ROLES.filter((r) => this.roles.has(r))
    if (!isDeepStrictEqual(roles, modelRoles)) problems.push(`roles ${roles.join(',')} (expected ${modelRoles.join(',')})`)
    const listed = this.tp.list().tools_by_role
    for (const [role, byName] of this.expected()) {
      const actual = new Map((listed[role] ?? []).map((row) => [row.name, this.ownerOf(row.source, row.callback_url)]))
      for (const [name, { owner, may }] of byName) {
        const got = actual.get(name)
        if (got === owner) continue
        if (got === undefined && may) continue
        problems.push(`${role}/${name}: ${got ?? 'missing'} (expected ${owner}${may ? ' or missing' : ''})`)
      }
      for (const [name, got] of actual) if (!byName.has(name)) problems.push(`${role}/${name}: ${got} (expected missing)`)
    }
    return problems.join('; ')
  }

  /** The instance's losses in the roles it targets, for a loss no event names (events-only runs). */
  addGaps (instance: Instance, role: RoleName, names: readonly string[]): void {
    if (!this.isEventsOnly) return
    let set = this.gaps.get(instance)
    if (set === undefined) this.gaps.set(instance, (set = new Set()))
    for (const name of names) set.add(`${role}\0${name}`)
  }

  /** An event named the instance: its next check restores every loss (README). */
  trigger (instance: Instance): void {
    this.gaps.delete(instance)
  }

  instanceByTag (tag: string | null): Instance | undefined {
    return this.instances.find((i) => i.tag === tag)
  }

  /** Polls `problem` (an empty string when fine) until it is empty; fails with it after `ms`. */
  async until (what: string, problem: () => string | Promise<string>, ms = SETTLE_MS): Promise<void> {
    const deadline = Date.now() + ms
    for (;;) {
      const text = await problem()
      if (text === '') return
      if (Date.now() > deadline) assert.fail(`step ${this.step}: ${what}: ${text}`)
      await sleep(10)
    }
  }

  /** After a step: the registry, the watches, the restored events. */
  async settle (): Promise<void> {
    if (this.tp === null) return
    const tp = this.tp
    await this.until('the registry is what the plugins declare', () => this.registryDiff())
    await this.until('every running plugin watches the event stream, and no other stream is open', async () => {
      const running = this.runningInstances()
      const off = running.filter((i) => !i.plugin.isWatchingEvents).map((i) => i.tag)
      if (off.length > 0) return `not watching: ${off.join(', ')}`
      const stats = await tp.app.inject({ method: 'GET', url: '/api/console/stats' })
      const subscribers = (JSON.parse(stats.body) as { events: { subscribers: number } }).events.subscribers
      return subscribers === running.length ? '' : `${subscribers} event streams for ${running.length} running plugins`
    })
    // What a running plugin lost and registered again during the step was announced as `restored`.
    await this.until('each tool registered again is announced (`registered`, reason restored)', () => {
      const expected = this.expected()
      const missing = new Set<string>()
      for (const { instance, role, name } of this.lost) {
        const want = expected.get(role)?.get(name)
        if (instance.state !== 'running' || want?.owner !== instance.tag || want.may) continue
        const isAnnounced = instance.registeredEvents.some(({ event, step }) =>
          step === this.step && event.reason === 'restored' && event.names.includes(name) && event.roles.includes(role))
        if (!isAnnounced) missing.add(`${instance.tag} ${role}/${name}`)
      }
      return [...missing].join(', ')
    })
    this.counts.restored += new Set(this.lost.map((l) => `${l.instance.tag} ${l.role}/${l.name}`)).size
    for (const instance of this.instances) {
      for (const { event } of instance.registeredEvents) {
        assert.ok(event.names.length > 0 && event.names.every((n) => instance.names.includes(n)), `${instance.tag}: names of its own`)
        assert.ok(event.roles.every((r) => (ROLES as readonly string[]).includes(r)), `${instance.tag}: known roles`)
      }
    }
  }

  // -- steps ----------------------------------------------------------------------------------

  async runStep (step: Step): Promise<void> {
    switch (step.op) {
      case 'start': return await this.startStep(step.slot, step.plan, step.isOverlapping)
      case 'stop': return await this.stopStep(step.slot, step.graceMs)
      case 'restart': return await this.restartStep(step.during)
      case 'role': return this.roleStep(step.role)
      case 'unregister': return await this.unregisterStep(step.slot, step.kind, step.role)
      case 'clear': return await this.clearStep(step.slot, step.role)
      case 'takeover': return await this.takeoverStep(step.slot, step.kind, step.role)
      case 'release': return await this.releaseStep(step.slot, step.kind)
      case 'calls': return await this.callsStep(step.calls, step.then)
      case 'hurry': {
        const removedBefore = this.roleRemovals
        this.isHurrying = true
        try {
          for (const [i, hurried] of step.steps.entries()) {
            if (i > 0) await sleep(step.delaysMs[i] ?? 0)
            await this.runStep(hurried)
          }
        } finally {
          this.isHurrying = false
        }
        if (this.roleRemovals > removedBefore && ROLE_REMOVED_MID_CHECK_FAILS) {
          // A check that met the removed role stops there, and a check asked for meanwhile is
          // dropped (regression test "R4: a role removed while …" below): until the next poll,
          // any loss may stay.
          for (const instance of this.runningInstances()) {
            for (const role of this.targets(instance)) this.addGaps(instance, role, instance.names)
          }
        }
      }
    }
  }

  async startStep (slot: number, plan: PluginPlan, isOverlapping: boolean): Promise<void> {
    const old = this.slots[slot] ?? null
    if (old !== null && !isOverlapping) await this.stop(old, 0)
    const instance = this.newInstance(slot, plan)
    if (old !== null && isOverlapping) {
      // A new process of the same plugin starts before the old one has stopped: the old one's
      // clear (R16, by source) takes the new one's tools too, and the `cleared` event names the
      // source, so the new one registers them again.
      this.slots[slot] = null
      this.beginStart(instance)
      await this.finishStart(instance)
      await this.stop(old, 0)
      if (instance.state === 'running') this.trigger(instance)
      return
    }
    this.beginStart(instance)
    await this.finishStart(instance)
  }

  async stopStep (slot: number, graceMs: number): Promise<void> {
    const instance = this.slots[slot]
    if (instance === null || instance === undefined) return
    await this.stop(instance, graceMs)
  }

  async restartStep (during: GapStep[]): Promise<void> {
    if (this.isEventsOnly && this.restarts >= MAX_EVENTS_ONLY_RESTARTS) return
    this.restarts++
    this.counts.restarts++
    const runningBefore = new Set(this.runningInstances())
    await this.down()
    for (const step of during) {
      if (step.op === 'start') {
        // A plugin that starts before Toolport: start() retries, within maxBackoffMs even with
        // events only (regression test "start() before Toolport retries within maxBackoffMs"
        // below), until it answers.
        if (this.slots[step.slot] !== null) continue
        this.beginStart(this.newInstance(step.slot, step.plan))
      } else if (step.op === 'stop') {
        const instance = this.slots[step.slot]
        if (instance !== null && instance !== undefined) await this.stop(instance, step.graceMs)
      } else {
        this.toggleRole(step.role)
      }
    }
    await this.up()
    for (const instance of this.slots) {
      if (instance !== null && instance.state === 'starting') await this.finishStart(instance)
    }
    // A new instance_id on the stream: every running plugin checks (R3) and registers again.
    for (const instance of this.runningInstances()) {
      this.trigger(instance)
      if (!runningBefore.has(instance)) continue
      for (const role of this.targets(instance)) {
        for (const name of instance.names) this.lost.push({ instance, role, name })
      }
    }
  }

  toggleRole (role: 'B' | 'C'): void {
    if (this.roles.has(role)) {
      this.roles.delete(role)
      this.host.delete(role)
      this.removedRoles.add(role)
      this.roleRemovals++
      if (this.tp !== null) assert.equal(this.tp.roles.remove(role), true)
      for (const gaps of this.gaps.values()) for (const key of [...gaps]) if (key.startsWith(`${role}\0`)) gaps.delete(key)
      return
    }
    this.roles.add(role)
    if (this.tp !== null) {
      this.tp.roles.add(role)
      this.attachSession(this.tp, role)
    }
    for (const instance of this.runningInstances()) {
      // `role-added` makes a plugin of every role check (R4 alone would not reach the role); a
      // plugin of this one role hears nothing and waits for its poll.
      if (instance.plan.role === null) {
        this.trigger(instance)
        for (const name of instance.names) this.lost.push({ instance, role, name })
      } else if (instance.plan.role === role) this.addGaps(instance, role, instance.names)
    }
  }

  roleStep (role: 'B' | 'C'): void {
    this.toggleRole(role)
  }

  /** The running instance that declares `name`, if any. */
  declarer (name: string): Instance | undefined {
    return this.runningInstances().find((i) => i.names.includes(name))
  }

  /** A host's removal of `name` from `role` as Toolport had it: who is told, who is not. */
  noteRemoval (role: RoleName, name: string, holder: string | null): void {
    if (holder === null) return
    if (holder === 'host') {
      this.host.get(role)?.delete(name)
      // The `unregistered` event names the host's origin and source, not the plugin's.
      const instance = this.declarer(name)
      if (instance !== undefined && this.targets(instance).includes(role)) this.addGaps(instance, role, [name])
      return
    }
    const instance = this.instanceByTag(holder)
    if (instance !== undefined && instance.state === 'running') this.trigger(instance)
  }

  async unregisterStep (slot: number, kind: Kind, role: RoleName | null): Promise<void> {
    if (this.tp === null || (role !== null && !this.roles.has(role))) return
    const name = toolName(slot, kind)
    const roles = role === null ? ROLES.filter((r) => this.roles.has(r)) : [role]
    const holders = roles.map((r) => [r, this.holder(r, name)] as const)
    const answer = await this.tp.unregister({ name, role })
    assert.equal(answer.ok, true)
    assert.equal(answer.removed, holders.some(([, h]) => h !== null))
    for (const [r, h] of holders) this.noteRemoval(r, name, h)
  }

  async clearStep (slot: number, role: RoleName | null): Promise<void> {
    if (this.tp === null || (role !== null && !this.roles.has(role))) return
    const answer = await this.tp.clear({ source: sourceOf(slot), role })
    assert.equal(answer.ok, true)
    const instance = this.slots[slot]
    if (answer.removed > 0 && instance !== null && instance !== undefined && instance.state === 'running') this.trigger(instance)
  }

  async takeoverStep (slot: number, kind: Kind, role: RoleName | null): Promise<void> {
    if (this.tp === null || (role !== null && !this.roles.has(role))) return
    const name = toolName(slot, kind)
    const roles = role === null ? ROLES.filter((r) => this.roles.has(r)) : [role]
    const answer = await this.tp.register({
      name,
      callback_url: `${this.deadOrigin}/takeover/${name}`,
      source: HOST_SOURCE,
      role,
      parameters: { type: 'object' }
    })
    assert.equal(answer.ok, true)
    for (const r of roles) {
      let names = this.host.get(r)
      if (names === undefined) this.host.set(r, (names = new Set()))
      names.add(name)
    }
  }

  async releaseStep (slot: number, kind: Kind): Promise<void> {
    if (this.tp === null) return
    const name = toolName(slot, kind)
    const roles = ROLES.filter((r) => this.roles.has(r))
    const holders = roles.map((r) => [r, this.holder(r, name)] as const)
    await this.tp.unregister({ name, expected_source: HOST_SOURCE })
    for (const [r, h] of holders) if (h === 'host') this.noteRemoval(r, name, h)
  }

  // -- calls ----------------------------------------------------------------------------------

  async callsStep (plans: CallPlan[], then: ThenStep | null): Promise<void> {
    if (this.tp === null) return
    const tp = this.tp
    const roles = ROLES.filter((r) => this.roles.has(r))
    // A `long` call is one that its plugin's stop() or Toolport's close() will end.
    const isEnded = (slot: number): boolean => then !== null && (then.op === 'restart' || (then.op === 'stop' && then.slot === slot))
    const made = plans.map((planned) => {
      const plan = planned.how === 'long' && !isEnded(planned.slot) ? { ...planned, how: 'ok' as const } : planned
      const role = roles[plan.role % roles.length] as RoleName
      const name = toolName(plan.slot, plan.kind)
      const callId = `call-${this.runId}-${this.#callSeq++}`
      const args = plan.kind === 'echo'
        ? { n: plan.how === 'invalid' ? 'x' : plan.n }
        : plan.kind === 'fail' ? {} : { ms: plan.how === 'ok' ? plan.ms : FOREVER_MS }
      const controller = new AbortController()
      // The holder the call finds: Toolport looks the name up before its first await.
      const holder = this.holder(role, name)
      const call: MadeCall = { plan, role, name, callId, holder, result: null, isInFlightAtThen: false }
      const answer = tp.callTool(role, { name, arguments: args, call_id: callId }, { signal: controller.signal })
      call.promise = answer.then((result) => {
        call.result = result
        return result
      })
      if (plan.how === 'abort') setTimeout(() => { controller.abort() }, plan.ms)
      this.counts.calls++
      return call
    })
    if (then !== null) {
      // Each call is answered or has reached its handler before the step runs beside them.
      await this.until('calls reach their handlers', () => made.filter((c) => c.result === null && !this.invocations.has(c.callId))
        .map((c) => c.callId).join(', '))
      for (const call of made) call.isInFlightAtThen = call.result === null
      const stopping = then.op === 'stop' ? this.slots[then.slot] : null
      await this.runStep(then)
      await within(Promise.all(made.map((c) => c.promise)), 'calls in flight are answered', STEP_GUARD_MS)
      for (const call of made) this.checkCall(call, then, stopping ?? null)
    } else {
      await within(Promise.all(made.map((c) => c.promise)), 'calls are answered', STEP_GUARD_MS)
      for (const call of made) this.checkCall(call, null, null)
    }
    // Every handler that was waiting sees its signal abort once its caller is gone.
    await this.until('every handler whose caller went away sees its signal abort', () => made.flatMap((c) =>
      (this.invocations.get(c.callId) ?? []).filter((i) => !i.isEnded).map((i) => `${c.callId} (${c.plan.kind} ${c.plan.how}, ${i.tag})`))
      .join(', '), ABORT_SEEN_MS)
    for (const call of made) this.checkAbort(call, then)
  }

  checkCall (call: MadeCall, then: ThenStep | null, stopping: Instance | null): void {
    const { plan, callId, holder } = call
    const result = call.result as ToolResult
    const invocations = this.invocations.get(callId) ?? []
    const what = `${callId} ${plan.kind}/${plan.how} in ${call.role}, held by ${holder ?? 'nobody'}`
    assert.ok(invocations.length <= 1, `${what}: its handler ran ${invocations.length} times`)
    const invocation = invocations[0]
    if (invocation !== undefined) {
      // The right handler: the plugin that held the name when the call was made.
      assert.equal(invocation.tag, holder, `${what}: reached ${invocation.tag}`)
      assert.equal(invocation.name, call.name)
      assert.equal(invocation.ctxName, call.name, 'ctx.name')
      const budget = plan.kind === 'slow' ? SLOW_SECONDS * 1000 : 30_000
      assert.ok(invocation.deadlineMs > 0 && invocation.deadlineMs <= budget, `${what}: deadlineMs ${invocation.deadlineMs}`)
    }
    const instance = this.instanceByTag(holder)
    if (holder === null || holder === 'host' || instance === undefined) {
      assert.equal(result.is_error, true, `${what}: ${result.text}`)
      assert.equal(invocations.length, 0, `${what}: no handler runs`)
      if (holder === null) assert.match(result.error ?? '', /^unknown tool/)
      return
    }
    if (plan.kind === 'echo' && plan.how === 'invalid') {
      // Refused by Toolport against the registered JSON Schema (R9): the plugin is not called.
      assert.equal(result.is_error, true, `${what}: ${result.text}`)
      assert.equal(invocations.length, 0, `${what}: the handler never runs for refused arguments`)
      return
    }
    // A call in flight while its plugin stopped without grace, or Toolport closed, may fail; a
    // plugin that stops with grace lets it finish (README "Start and stop").
    const isDisrupted = call.isInFlightAtThen && then !== null &&
      ((then.op === 'stop' && stopping === instance && then.graceMs === 0) || then.op === 'restart')
    if (isDisrupted && result.is_error) return
    if (plan.how === 'abort' || plan.how === 'hang' || plan.how === 'long') {
      assert.equal(result.is_error, true, `${what}: ${result.text}`)
      if (plan.how !== 'abort') assert.equal(invocations.length, 1, `${what}: the handler ran`)
      return
    }
    assert.equal(invocations.length, 1, `${what}: the handler runs exactly once (${result.text})`)
    switch (plan.kind) {
      case 'echo':
        assert.equal(result.is_error, false, `${what}: ${result.text}`)
        assert.deepEqual(result.output, plan.n === 0 ? null : { n: plan.n, callId, tag: holder })
        return
      case 'fail':
        assert.equal(result.is_error, true)
        assert.equal(result.error, `failed ${callId}`)
        return
      case 'slow':
      case 'wait':
        assert.equal(result.is_error, false, `${what}: ${result.text}`)
        assert.deepEqual(result.output, { slept: plan.ms, tag: holder })
    }
  }

  checkAbort (call: MadeCall, then: ThenStep | null): void {
    const invocation = this.invocations.get(call.callId)?.[0]
    if (invocation === undefined || invocation.abortedWith === null) return
    this.counts.aborted++
    const { plan } = call
    if ((plan.how === 'abort' && !call.isInFlightAtThen) || plan.how === 'long') {
      // The caller cancelled, or the connection was closed, long before the 30 s deadline.
      assert.equal(invocation.abortedWith, 'AbortError', `${call.callId}: the handler's signal says why`)
    } else {
      assert.ok(['AbortError', 'TimeoutError'].includes(invocation.abortedWith), `${call.callId}: ${invocation.abortedWith}`)
    }
    if (plan.how === 'ok' && plan.kind === 'wait' && then?.op === 'stop' && then.graceMs > 0 && call.isInFlightAtThen) {
      assert.fail(`${call.callId}: a handler that ends within stop()'s grace was aborted (${invocation.abortedWith})`)
    }
  }

  // -- end of run -----------------------------------------------------------------------------

  async finish (): Promise<void> {
    if (this.tp === null) await this.up()
    for (const instance of [...this.slots]) {
      if (instance === null) continue
      if (instance.state === 'starting') await this.finishStart(instance)
      if (instance.state === 'running') await this.stop(instance, 0)
    }
    this.step++
    this.lost = []
    await this.settle()
    const tp = this.tp as Toolport
    assert.deepEqual(Object.values(tp.list().tools_by_role).flat().filter((row) => row.source !== HOST_SOURCE), [],
      'every plugin stopped: none of their tools is left')
    await this.down()
    this.checkRequests()
    this.checkErrors()
  }

  /** After stop(): no request; before it: no registration after the plugin's clear. */
  checkRequests (): void {
    for (const instance of this.instances) {
      const mine = this.requests.map((r, i) => ({ ...r, i })).filter((r) => r.key === instance.key)
      const late = mine.filter((r) => instance.stoppedAt !== null && r.i >= instance.stoppedAt)
      assert.deepEqual(late.map((r) => `${r.method} ${r.path}`), [], `${instance.tag} sent requests after stop()`)
      const clear = mine.findIndex((r) => r.path.endsWith('/api/tools/clear'))
      if (clear >= 0) {
        const after = mine.slice(clear + 1).filter((r) => r.path.endsWith('/api/tools/register'))
        assert.equal(after.length, 0, `${instance.tag} registered after its own clear`)
      }
    }
  }

  /** Only the documented errors, and only when something explains them. */
  checkErrors (): void {
    for (const instance of this.instances) {
      for (const err of instance.errors) {
        assert.ok(err instanceof PluginError)
        const what = `${instance.tag}: error event ${err.code} ${err.message}`
        if (err.code === PLUGIN_ERROR_CODES.unreachable) {
          assert.ok(this.hadRestart, `${what}, though Toolport never went away`)
        } else if (err.code === PLUGIN_ERROR_CODES.refused) {
          // Its one role removed: its checks list that role. (A plugin of every role skips a role
          // removed under its check, and stop() takes the 404 of its role for nothing to clear.)
          const role = instance.plan.role
          const isMissingRole = err.statusCode === 404 && err.toolportCode === 'TP_ERR_ROLE_NOT_FOUND' &&
            role !== null && this.removedRoles.has(role)
          const isClosing = (err.statusCode ?? 0) >= 500 && this.hadRestart
          assert.ok(isMissingRole || isClosing, what)
        } else {
          assert.fail(what)
        }
      }
    }
  }
}

interface MadeCall {
  plan: CallPlan
  role: RoleName
  name: string
  callId: string
  holder: string | null
  result: ToolResult | null
  isInFlightAtThen: boolean
  promise?: Promise<ToolResult>
}

/** The stopped plugin's callback port refuses connections: its server is closed. */
async function assertRefused (instance: Instance, when: string): Promise<void> {
  if (instance.port === 0) {
    if (instance.plugin.url === '') return
    instance.port = Number(new URL(instance.plugin.url).port)
  }
  const code = await new Promise<string>((resolve) => {
    const socket = connect({ host: '127.0.0.1', port: instance.port })
    socket.once('connect', () => { socket.destroy(); resolve('connected') })
    socket.once('error', (err: NodeJS.ErrnoException) => { resolve(err.code ?? 'error') })
  })
  assert.equal(code, 'ECONNREFUSED', `${instance.tag}: its callback server still accepts connections ${when}`)
}

/** Sockets, servers and ref'd timers of the process (what would keep it alive or leak). */
function handles (): Map<string, number> {
  const counts = new Map<string, number>()
  for (const kind of process.getActiveResourcesInfo()) {
    if (kind === 'TCPSocketWrap' || kind === 'TCPServerWrap' || kind === 'Timeout') counts.set(kind, (counts.get(kind) ?? 0) + 1)
  }
  return counts
}

function handleGrowth (baseline: Map<string, number>): string {
  const grown: string[] = []
  for (const [kind, n] of handles()) if (n > (baseline.get(kind) ?? 0)) grown.push(`${kind} ${baseline.get(kind) ?? 0} → ${n}`)
  return grown.join(', ')
}

async function runScenario (scenario: Scenario, port: number, deadOrigin: string, runId: number,
  counts: Counts): Promise<void> {
  const baseline = handles()
  const run = new Run(scenario, port, deadOrigin, runId, counts)
  counts.runs++
  try {
    await run.up()
    for (const [slot, plan] of scenario.initial.entries()) {
      if (plan === null) continue
      run.beginStart(run.newInstance(slot, plan))
      await run.finishStart(run.slots[slot] ?? run.instances.at(-1) as Instance)
    }
    await run.settle()
    for (const step of scenario.steps) {
      run.step++
      run.lost = []
      counts.steps++
      await within(run.runStep(step), `step ${run.step} ${JSON.stringify(step)}`, STEP_GUARD_MS)
      await run.settle()
    }
    await run.finish()
    await run.until('no socket, server or timer is left once every plugin stopped and Toolport closed',
      () => handleGrowth(baseline), 3000)
  } finally {
    // A failed run leaves nothing running behind for the next one (or the next test file).
    for (const instance of run.instances) await instance.plugin.stop({ graceMs: 0 })
    for (const tp of run.toolports) await tp.close()
  }
}

test('property: under random plugin starts, stops, Toolport restarts, role changes, host removals and calls, the registry is what the plugins declare and every call reaches its handler once', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const port = await closedPort()
  const deadOrigin = `http://127.0.0.1:${await closedPort()}`
  const counts: Counts = { runs: 0, steps: 0, calls: 0, restarts: 0, restored: 0, aborted: 0, failedStarts: 0 }
  let runId = 0
  await fc.assert(fc.asyncProperty(fc.limitShrink(scenarioArb, MAX_SHRINKS), async (scenario) => {
    await runScenario(scenario, port, deadOrigin, runId++, counts)
  }), { numRuns: NUM_RUNS, includeErrorInReport: true })
  t.diagnostic(`${counts.runs} runs, ${counts.steps} steps, ${counts.calls} calls (${counts.aborted} handlers aborted), ${counts.restarts} Toolport restarts, ${counts.restored} restored events, ${counts.failedStarts} starts refused`)
})

// ---------------------------------------------------------------------------------------------
// Regression tests of bugs found while running the property (each a minimal deterministic case).

/** A Toolport listening on 127.0.0.1 (`port`, or any), inline dispatch; closed after the test. */
async function listening (t: TestContext, roles: string[], port = 0): Promise<{
  tp: Toolport
  url: string
  port: number
}> {
  const tp = await createToolport({ roles, logger: false, dispatch: { mode: 'inline' } })
  t.after(() => tp.close())
  const address = await tp.listen({ host: '127.0.0.1', port })
  return { tp, url: address.url, port: address.port }
}

/** A plugin that relies on the event stream alone: no poll comes within a test's time. */
function eventsOnlyPlugin (t: TestContext, toolportUrl: string, names: string[],
  extra: { maxBackoffMs?: number, requestTimeoutMs?: number } = {}): Plugin {
  const tools: Record<string, { handler: () => string }> = {}
  for (const name of names) tools[name] = { handler: () => name }
  const plugin = createPlugin({
    toolportUrl,
    source: 'plugin:regression',
    logger: false,
    pollIntervalMs: 600_000,
    maxBackoffMs: extra.maxBackoffMs ?? 200,
    ...(extra.requestTimeoutMs === undefined ? {} : { requestTimeoutMs: extra.requestTimeoutMs }),
    tools
  })
  plugin.on('error', () => {})
  t.after(() => plugin.stop({ graceMs: 0 }))
  return plugin
}

function toolsIn (tp: Toolport, role: string): string[] {
  return (tp.list(role).tools_by_role[role] ?? []).map((row) => row.name).sort()
}

async function watching (plugin: Plugin): Promise<void> {
  await waitFor('the plugin watches the event stream', () => plugin.isWatchingEvents, 5000)
}

// The callback server watches for the caller hanging up (and starts the deadline) when the call
// arrives, before its arguments are checked: a caller that goes away while an async zod
// refinement runs is noticed, and the handler is skipped or sees ctx.signal abort, instead of
// running until its own deadline.
test('a handler sees its caller go away (AbortError) even when the caller left while an async zod refinement checked the arguments', async (t) => {
  const { tp, url } = await listening(t, ['A'])
  // Registered first, so it runs first: the handler must not outlive the test by its deadline.
  const testOver = new AbortController()
  t.after(() => { testOver.abort() })
  const state = { isRefined: false, isStarted: false, isEnded: false, reason: '' }
  const plugin = createPlugin({
    toolportUrl: url,
    source: 'plugin:refined',
    logger: false,
    tools: {
      checked: {
        timeoutSeconds: 10,
        // A refinement that takes time: a database lookup, a permission check…
        parameters: z.object({ ms: z.number() }).refine(async ({ ms }) => {
          await sleep(ms)
          state.isRefined = true
          return true
        }),
        handler: async (_args, { signal }) => {
          state.isStarted = true
          if (!signal.aborted) await Promise.race([once(signal, 'abort'), once(testOver.signal, 'abort')])
          state.reason = signal.aborted ? (signal.reason as Error).name : 'not aborted'
          state.isEnded = true
          return null
        }
      }
    }
  })
  t.after(() => plugin.stop({ graceMs: 0 }))
  await plugin.start()
  // The caller gives up after 50 ms, while the refinement still runs (200 ms).
  const result = await tp.callTool('A', { name: 'checked', arguments: { ms: 200 } }, { signal: AbortSignal.timeout(50) })
  assert.equal(result.is_error, true)
  assert.match(result.error ?? '', /cancelled/)
  await waitFor('the refinement to end', () => state.isRefined, 1500)
  await sleep(20)
  // The SDK may skip the handler of a call already abandoned, or run it with its signal aborted.
  await waitFor('the handler to see its caller gone (its deadline is 10 s away)', () => !state.isStarted || state.isEnded, 1500)
  if (state.isStarted) assert.equal(state.reason, 'AbortError')
})

// Tool names are any 1–64 characters: `.` and `..` too, which a URL would drop as dot segments
// (Toolport stores the canonical callback URL, so every call of such a tool would miss it), and
// names that look percent-encoded, whose own `%41` must not be decoded twice.
test('R7: tools named ".", "..", "a%41b" and "a/b" are each registered at a URL of their own and reach their own handler', async (t) => {
  const { tp, url } = await listening(t, ['A'])
  const names = ['.', '..', 'a%41b', 'aAb', 'a/b', 'x\ny']
  const tools: Record<string, { handler: () => string }> = {}
  for (const name of names) tools[name] = { handler: () => `handled ${name}` }
  const plugin = createPlugin({ toolportUrl: url, source: 'plugin:names', logger: false, tools })
  t.after(() => plugin.stop({ graceMs: 0 }))
  await plugin.start()
  const rows = tp.list('A').tools_by_role.A ?? []
  assert.deepEqual(rows.map((row) => row.name).sort(), [...names].sort())
  assert.equal(new Set(rows.map((row) => row.callback_url)).size, names.length, 'one callback URL per tool')
  for (const name of names) {
    const result = await tp.callTool('A', { name, arguments: {} })
    assert.equal(result.is_error, false, `${JSON.stringify(name)}: ${result.error ?? ''}`)
    assert.equal(result.output, `handled ${name}`, JSON.stringify(name))
  }
})

// The watch starts after start()'s registrations, so an event in between (an unregister, an
// eviction, a Toolport restart) is published to no one: the watch's first `hello` runs a check,
// which registers again whatever went missing meanwhile, without waiting for the next poll.
test('R15: a tool unregistered just after start() resolved is registered again at once, not at the next poll', async (t) => {
  const { tp, url } = await listening(t, ['A'])
  const plugin = eventsOnlyPlugin(t, url, ['weather'])
  await plugin.start()
  // Before the watch's first hello: its `unregistered` event is published to no one.
  await tp.unregister({ name: 'weather' })
  await watching(plugin)
  await waitFor('weather to be registered again', () => toolsIn(tp, 'A').includes('weather'), 1500)
})

// A stream cut by Toolport's close() ("other side closed") after its `hello` is not counted as a
// failure to connect: the watch reconnects soon and its backoff starts over, so each restart is
// seen (the new instance_id) as quickly as the first, instead of each doubling the wait (0.5–1,
// 1–2, 2–4, 4–8 s…, up to maxBackoffMs).
test('R3: the third Toolport restart is seen as soon as the first (the watch\'s backoff starts over once connected)', async (t) => {
  const port = await closedPort()
  let { tp, url } = await listening(t, ['A'], port)
  const plugin = eventsOnlyPlugin(t, url, ['weather'], { maxBackoffMs: 30_000 })
  await plugin.start()
  for (let restart = 1; restart <= 3; restart++) {
    await watching(plugin)
    await tp.close()
    tp = (await listening(t, ['A'], port)).tp
    const back = Date.now()
    const current = tp
    await waitFor(`restart ${restart}: weather to be registered again`, () => toolsIn(current, 'A').includes('weather'), 1800)
    t.diagnostic(`restart ${restart}: registered again after ${Date.now() - back} ms`)
  }
})

// maxBackoffMs is kept as given, even below pollIntervalMs: with a long poll interval, start()'s
// retries (and the watch's reconnections) wait at most maxBackoffMs, so start() resolves soon
// after Toolport listens, not when startTimeoutMs is nearly spent.
test('start() before Toolport retries within maxBackoffMs, even with a longer pollIntervalMs', async (t) => {
  const port = await closedPort()
  const plugin = createPlugin({
    toolportUrl: `http://127.0.0.1:${port}`,
    source: 'plugin:early',
    logger: false,
    pollIntervalMs: 60_000,
    maxBackoffMs: 200,
    startTimeoutMs: 10_000,
    tools: { weather: { handler: () => 'sunny' } }
  })
  t.after(() => plugin.stop({ graceMs: 0 }))
  let isStarted = false
  const starting = plugin.start().then(() => { isStarted = true }, () => {})
  await sleep(300)
  const { tp } = await listening(t, ['A'], port)
  await waitFor('start() to resolve within a few maxBackoffMs of Toolport listening', () => isStarted, 1500)
  await starting
  assert.deepEqual(toolsIn(tp, 'A'), ['weather'])
})

// Clearing a role that no longer exists answers 404 TP_ERR_ROLE_NOT_FOUND; none of the plugin's
// tools is left (they went with the role), so stop() reports a clear that removed nothing
// (isCleared true, removed 0) and emits no `error`.
test('stop() of a plugin whose role was removed reports nothing left to clear, not a failure', async (t) => {
  const { tp, url } = await listening(t, ['A', 'C'])
  const plugin = createPlugin({
    toolportUrl: url,
    source: 'plugin:gone',
    role: 'C',
    logger: false,
    tools: { weather: { handler: () => 'sunny' } }
  })
  const errors: PluginError[] = []
  plugin.on('error', (err) => { errors.push(err) })
  await plugin.start()
  tp.roles.remove('C')
  const result = await plugin.stop({ graceMs: 0 })
  assert.deepEqual({ ...result, error: result.error?.message ?? null }, { isCleared: true, removed: 0, error: null })
  assert.deepEqual(errors.map((e) => e.message), [])
})

// In a check, a registration answered 404 because its role was just removed skips that role and
// the check goes on (no failure, no `error`), so the plugin's other tools still reach the other
// new role without waiting for the next poll.
test('R4: a role removed while the plugin registers its tools there does not keep them from another new role', async (t) => {
  const { tp, url } = await listening(t, ['A'])
  const plugin = eventsOnlyPlugin(t, url, ['t1', 't2'])
  const errors: PluginError[] = []
  plugin.on('error', (err) => { errors.push(err) })
  await plugin.start()
  await watching(plugin)
  let open = (): void => {}
  const gate = new Promise<void>((resolve) => { open = resolve })
  t.after(() => { open() })
  tp.roles.add('B')
  tp.roles.add('C')
  // C's live session takes its time: the plugin's registration of t1 in C waits for it.
  tp.roles.get('C').attachSession({ id: 'slow', syncTools: async () => { await gate } })
  await waitFor('t1 to be registered in C (its sync waits)', () => toolsIn(tp, 'C').includes('t1'), 3000)
  // The plugin's check goes on with t2 in B, which is gone by then.
  tp.roles.remove('B')
  open()
  await waitFor('t1 and t2 in C', () => toolsIn(tp, 'C').length === 2, 1000)
  // B is skipped: the check did not fail for it.
  assert.deepEqual(errors.map((e) => e.message), [])
})

// A check asked for (by an event) while another check runs is run right after it, even when that
// check failed: the event came after the failing check began, so its failure answers nothing
// about what the event named. (Dropping it would leave that loss for the failed check's backoff,
// up to maxBackoffMs: 30 s here.)
test('R4: a role added while a check was failing gets the plugin\'s tools at once, not after the failed check\'s backoff', async (t) => {
  const { tp, url } = await listening(t, ['A', 'B'])
  let open = (): void => {}
  const gate = new Promise<void>((resolve) => { open = resolve })
  t.after(() => { open() })
  // B's live session: once armed, it takes its time over any tool set with t1 in it.
  let isArmed = false
  tp.roles.get('B').attachSession({
    id: 'slow',
    syncTools: async (tools) => { if (isArmed && tools.some((tool) => tool.name === 't1')) await gate }
  })
  const plugin = eventsOnlyPlugin(t, url, ['t1', 't2'], { maxBackoffMs: 30_000, requestTimeoutMs: 1000 })
  const errors: PluginError[] = []
  plugin.on('error', (err) => { errors.push(err) })
  await plugin.start()
  await watching(plugin)
  isArmed = true
  await tp.unregister({ name: 't1', role: 'B' })
  // The plugin's check registers t1 in B again; the answer waits for B's sync, past requestTimeoutMs.
  await waitFor('t1 to be registered in B (its sync waits)', () => toolsIn(tp, 'B').includes('t1'), 3000)
  // Meanwhile role C is added: the `role-added` event asks for another check.
  tp.roles.add('C')
  await waitFor('the check to fail (its registration timed out)', () => errors.length > 0, 3000)
  open()
  await waitFor('t1 and t2 in C', () => toolsIn(tp, 'C').length === 2, 1500)
})
