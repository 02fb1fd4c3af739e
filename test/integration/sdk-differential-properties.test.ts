// Differential properties of the two plugin SDKs (README "Plugin SDK" and "Python plugin SDK":
// the Python package "does the same as the TypeScript SDK"; docs/protocol.md R3, R6–R13, R15, R16).
//
// Every scenario runs through BOTH SDKs against one real Toolport listening on 127.0.0.1: the
// TypeScript SDK (src/plugin) in this process, the Python SDK (python/src) in one real process of
// python/.venv/bin/python running test/fixtures/sdkdiff_plugin.py, which builds plugins from the
// scenarios it reads on stdin (JSON) and answers what happened on stdout. No mocks: real sockets,
// real callback servers, real registrations, real calls through `tp.callTool`.
//
// What must agree, for the same scenario:
// - definition and start (properties "tool definitions" and "plugin options"): random tool names
//   (empty, 64/65 code points, astral, lone surrogates, dot segments, URL syntax), descriptions
//   (very long, lone surrogates, not a string), parameter schemas (valid ones, and ones Toolport
//   refuses: unknown dialects, RE2-incompatible patterns, unresolvable $ref, meta-schema
//   violations, Infinity) and timeouts; plugin ids, roles, Toolport URLs, callback hosts and ports,
//   tokens, plugin keys, durations and body limits. Both SDKs accept or refuse alike, with the same
//   error code at the same stage (construction, or start()); a started plugin has registered the
//   same tools — as Toolport shows them on /api/tools and /api/tools/definitions — and stop()
//   clears them alike;
// - calls (property "calls"): handlers returning strings, objects, numbers, null, nested and huge
//   values, values JSON cannot carry (NaN, ±Infinity, cycles, very deep nesting, lone
//   surrogates), or throwing (the TS `Error` and the Python `ToolError` are the documented pair;
//   a Python exception of another class is documented as `"<Type>: <message>"`), and echo tools
//   whose schemas Toolport has already checked the arguments against: the caller gets the same
//   ToolResult from either SDK;
// - deadlines, cancellation and stop() with calls in flight (test "deadline, cancellation"): the
//   same results, and every abandoned handler is told (TS: its signal aborts; Python: its task is
//   cancelled);
// - start() and stop() states (test "start() and stop() states"): stop() before start(), start()
//   twice, stop() while start() retries, stop() while Toolport is down;
// - Toolport restarts, evictions (R13: both callback servers stop listening, three calls fail),
//   unregister (R15), clear (R16) and roles removed and added, for one role or every role (R4)
//   (property "lifecycle"): both re-register exactly what was lost, announce it alike
//   (`registered`, reasons `start` and `restored`), and stop() alike.
//
// Only what the docs let differ is normalised away: error texts of PluginErrors, the class of a
// non-PluginError, the Python `<Type>: ` prefix, how a number is spelt in a result's `text`, how
// each SDK percent-encodes a tool's path segment (the name it routes is compared), and one
// cosmetic prefix ("invalid arguments: " before "arguments must be a JSON object" in Python).
//
// The regression tests at the end pin each difference the properties found (a minimal example
// each); they fail on the current code and pass once the SDKs agree. TP_PROPERTY_RUNS multiplies
// the runs.
import assert from 'node:assert/strict'
import { spawn, type ChildProcess } from 'node:child_process'
import type { Server } from 'node:http'
import { createInterface } from 'node:readline'
import { after, test, type TestContext } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { isDeepStrictEqual } from 'node:util'
import fc from 'fast-check'
import { request } from 'undici'
import { createToolport, type Toolport } from '../../src/main/index.js'
import type { ToolResult } from '../../src/main/dispatch/result.js'
import { createPlugin, PluginError, type Plugin, type RegisteredEvent } from '../../src/plugin/index.js'
import { checkProperty as check, VENV_PYTHON as PY, pythonMissing, startToolport, waitFor, within } from '../helpers.js'

const RUNS = Math.max(1, Number(process.env.TP_PROPERTY_RUNS ?? '1'))
const FAILING_TIMEOUT_MS = 600_000
/** Shrinking re-runs real plugins in two languages: bounded, so a failure's report comes in time. */
const MAX_SHRINKS = 15

/** waitFor with a message made when the time is up (so it shows the state then). */
async function waitUntil (what: () => string, predicate: () => boolean, timeoutMs: number): Promise<void> {
  try {
    await waitFor('', predicate, timeoutMs)
  } catch {
    throw new Error(`timed out waiting for ${what()}`)
  }
}

/** Hang guard of one start() or stop() (Python imports and binds; the machine is busy). */
const GUARD_MS = 20_000

const PY_FIXTURE = fileURLToPath(new URL('../fixtures/sdkdiff_plugin.py', import.meta.url))
const PY_SRC = fileURLToPath(new URL('../../python/src', import.meta.url))

// ---- Values JSON cannot carry (the fixture decodes the same way) --------------------------------

type Special =
  | { $special: 'nan' | 'inf' | '-inf' | 'negzero' | 'none' | 'cycle' | 'true' }
  | { $special: 'deep', n: number }
  | { $special: 'repeat', s: string, n: number }

function decode (value: unknown): unknown {
  if (Array.isArray(value)) return value.map(decode)
  if (typeof value !== 'object' || value === null) return value
  if (!('$special' in value)) return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, decode(v)]))
  const s = value as Special
  switch (s.$special) {
    case 'nan': return NaN
    case 'inf': return Infinity
    case '-inf': return -Infinity
    case 'negzero': return -0
    case 'none': return undefined
    case 'true': return true
    case 'cycle': {
      const cycle: Record<string, unknown> = { a: 1 }
      cycle.self = cycle
      return cycle
    }
    case 'deep': {
      let deep: unknown[] = []
      for (let i = 0; i < s.n; i++) deep = [deep]
      return deep
    }
    case 'repeat': return s.s.repeat(s.n)
  }
}

// ---- Scenarios ---------------------------------------------------------------------------------

type Behaviour =
  | { return: unknown }
  | { throw: unknown, kind: 'tool' | 'plain' }
  | { echo: true }
  | { fromArgs: true }
  | { sleep: number, then: Behaviour }
  | { hang: true }

interface ToolSpec {
  name: string
  description?: unknown
  parameters?: unknown
  timeoutSeconds?: unknown
  behaviour: Behaviour
}

/** The options both SDKs have, in the TS SDK's spelling (pyOptions converts them). */
interface CommonOptions {
  role?: unknown
  token?: unknown
  pluginKey?: unknown
  host?: unknown
  port?: unknown
  toolportUrl?: unknown
  startTimeoutMs?: unknown
  requestTimeoutMs?: unknown
  pollIntervalMs?: unknown
  maxBackoffMs?: unknown
  maxBodyBytes?: unknown
  watchEvents?: unknown
}

interface Scenario {
  /** The plugin's id: TS `source: 'plugin:<id>'`, Python `Plugin(id)`. */
  id: unknown
  options: CommonOptions
  tools: ToolSpec[]
}

const MS_TO_SECONDS: Array<[keyof CommonOptions, string]> = [
  ['startTimeoutMs', 'start_timeout'], ['requestTimeoutMs', 'request_timeout'],
  ['pollIntervalMs', 'poll_interval'], ['maxBackoffMs', 'max_backoff']
]

/** The same options as Python's keyword arguments (milliseconds become seconds). */
function pyOptions (o: CommonOptions): Record<string, unknown> {
  const out: Record<string, unknown> = {}
  const rename: Array<[keyof CommonOptions, string]> = [['role', 'role'], ['token', 'token'], ['pluginKey', 'plugin_key'],
    ['host', 'host'], ['port', 'port'], ['toolportUrl', 'toolport_url'], ['maxBodyBytes', 'max_body_bytes'],
    ['watchEvents', 'use_events']]
  for (const [ts, py] of rename) if (ts in o) out[py] = o[ts]
  for (const [ts, py] of MS_TO_SECONDS) {
    if (!(ts in o)) continue
    const v = o[ts]
    out[py] = typeof v === 'number' ? v / 1000 : v
  }
  return out
}

function pyTools (tools: ToolSpec[]): Array<Record<string, unknown>> {
  return tools.map((t) => {
    const out: Record<string, unknown> = { name: t.name, behaviour: t.behaviour }
    if ('description' in t) out.description = t.description
    if ('parameters' in t) out.parameters = t.parameters
    if ('timeoutSeconds' in t) out.timeout_seconds = t.timeoutSeconds
    return out
  })
}

// ---- Outcomes ----------------------------------------------------------------------------------

interface ErrorView {
  /** `PluginError`, or the class of anything else thrown */
  class: string
  code?: string | undefined
  status?: number | null | undefined
  toolport_code?: string | null | undefined
  message?: string
}

function tsError (err: unknown): ErrorView {
  if (err instanceof PluginError) {
    return {
      class: 'PluginError',
      code: err.code,
      status: err.statusCode ?? null,
      toolport_code: err.toolportCode ?? null,
      message: err.message
    }
  }
  return { class: (err as Error)?.constructor?.name ?? typeof err, message: String((err as Error)?.message ?? err) }
}

function pyError (e: Record<string, unknown>): ErrorView {
  return e.class === 'PluginError'
    ? {
        class: 'PluginError',
        code: e.code as string,
        status: (e.status as number | null) ?? null,
        toolport_code: (e.toolport_code as string | null) ?? null,
        message: e.message as string
      }
    : { class: e.class as string, message: e.message as string }
}

interface Registration {
  description: string
  parameters: unknown
  /** The callback URL's last path segment (after the random secret), decoded. */
  name: string
  timeoutMs: number
}

interface Outcome {
  /** Where it ended: refused at construction, failed in start(), or started. */
  stage: 'create' | 'start' | 'started'
  error?: ErrorView
  names?: string[]
  roles?: string[]
  /** Toolport's view of the source after start(): role → tool name → registration. */
  registry?: Record<string, Record<string, Registration>>
  stop?: { isCleared: boolean, removed: number, error: ErrorView | null }
  /** How many registrations of the source Toolport holds after a failed start() or after stop(). */
  left?: number
}

/** An outcome without what legitimately differs: error texts and the languages' error classes. */
function comparable (o: Outcome): unknown {
  const strip = (e: ErrorView | null | undefined): unknown => e == null
    ? e
    : e.class === 'PluginError'
      ? { code: e.code, status: e.status, toolport_code: e.toolport_code }
      : { class: 'not a PluginError' }
  const stop = o.stop === undefined ? undefined : { ...o.stop, error: strip(o.stop.error) }
  return { ...o, error: strip(o.error), stop }
}

function assertSameOutcome (ts: Outcome, py: Outcome, what: string): void {
  const a = comparable(ts)
  const b = comparable(py)
  if (isDeepStrictEqual(a, b)) return
  const show = (o: Outcome): string => JSON.stringify({ ...o, registry: o.registry === undefined ? undefined : '…' })
  assert.deepEqual(a, b, `${what}: the SDKs disagree\n  TS: ${show(ts)}\n  Py: ${show(py)}`)
}

// ---- Toolport ----------------------------------------------------------------------------------

interface World { tp: Toolport, url: string, port: number, token?: string }

async function apiGet (world: World, path: string): Promise<{ statusCode: number, body: any }> {
  const res = await request(`${world.url}${path}`, {
    headers: world.token === undefined ? {} : { authorization: `Bearer ${world.token}` }
  })
  return { statusCode: res.statusCode, body: await res.body.json() }
}

/** What Toolport shows of `source` on /api/tools and /api/tools/definitions (and its timeout). */
async function toolportView (world: World, source: string): Promise<Record<string, Record<string, Registration>>> {
  const listed = await apiGet(world, '/api/tools')
  assert.equal(listed.statusCode, 200, JSON.stringify(listed.body))
  const out: Record<string, Record<string, Registration>> = {}
  type Row = { name: string, source: string, callback_url: string, description: string }
  for (const [role, rows] of Object.entries(listed.body.tools_by_role as Record<string, Row[]>)) {
    const mine = rows.filter((row) => row.source === source)
    if (mine.length === 0) continue
    const defs = await apiGet(world, `/api/tools/definitions?role=${encodeURIComponent(role)}&format=openai-realtime`)
    assert.equal(defs.statusCode, 200, JSON.stringify(defs.body))
    const byRole: Record<string, Registration> = {}
    for (const row of mine) {
      const def = (defs.body.tools as Array<{ name: string, description: string }>).find((d) => d.name === row.name)
      const entry = world.tp.roles.get(role).registry.get(row.name)
      assert.ok(def !== undefined && entry !== undefined, `${row.name} is listed and defined`)
      const segment = row.callback_url.slice(row.callback_url.lastIndexOf('/') + 1)
      byRole[row.name] = {
        description: def.description,
        parameters: entry.parameters,
        // Each SDK percent-encodes its own way (TS leaves !'()* as they are); the name it routes is what counts.
        name: /^=\.\.?$/.test(segment) ? segment.slice(1) : decodeURIComponent(segment),
        timeoutMs: entry.timeoutMs
      }
    }
    out[role] = byRole
  }
  return out
}

function countSource (tp: Toolport, source: string): number {
  let n = 0
  for (const rows of Object.values(tp.list().tools_by_role)) n += rows.filter((r) => r.source === source).length
  return n
}

// ---- The Python side ---------------------------------------------------------------------------

interface PyEvent { ev: string, plugin?: string, [key: string]: unknown }

/** The fixture process: one command a line in, its answer (and unasked events) a line out. */
class PyDriver {
  readonly #child: ChildProcess
  readonly #pending = new Map<number, (answer: Record<string, any>) => void>()
  #next = 0
  readonly events: PyEvent[] = []
  stderr = ''
  readonly ready: Promise<void>

  constructor () {
    this.#child = spawn(PY, [PY_FIXTURE], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, PYTHONPATH: PY_SRC, PYTHONWARNINGS: 'ignore', TOOLPORT_URL: '', TOOLPORT_TOKEN_FILE: '' }
    })
    this.#child.stderr?.on('data', (d: Buffer) => { this.stderr = (this.stderr + d.toString()).slice(-20_000) })
    let isReady: () => void = () => {}
    this.ready = new Promise((resolve) => { isReady = resolve })
    createInterface({ input: this.#child.stdout! }).on('line', (line) => {
      const message = JSON.parse(line) as { re?: number, ev?: string }
      if (message.re !== undefined) {
        this.#pending.get(message.re)?.(message)
        this.#pending.delete(message.re)
      } else if (message.ev === 'ready') {
        isReady()
      } else {
        this.events.push(message as PyEvent)
      }
    })
  }

  async send (cmd: Record<string, unknown>, guardMs = GUARD_MS): Promise<Record<string, any>> {
    await within(this.ready, () => `the Python fixture starts (stderr: ${this.stderr})`, 60_000)
    const id = this.#next++
    const answer = new Promise<Record<string, any>>((resolve) => { this.#pending.set(id, resolve) })
    this.#child.stdin!.write(JSON.stringify({ ...cmd, id }) + '\n')
    const got = await within(answer, () => `Python ${String(cmd.op)} (stderr: ${this.stderr.slice(-2000)})`, guardMs)
    if (got.fixture_error !== undefined) throw new Error(`the Python fixture failed: ${String(got.fixture_error)}`)
    return got
  }

  /** The events of one plugin, taken out of the list. */
  take (plugin: string, ev: string): PyEvent[] {
    const taken: PyEvent[] = []
    for (let i = this.events.length - 1; i >= 0; i--) {
      const e = this.events[i] as PyEvent
      if (e.plugin === plugin && e.ev === ev) taken.unshift(...this.events.splice(i, 1))
    }
    return taken
  }

  async close (): Promise<void> {
    if (this.#child.exitCode !== null) return
    const exited = new Promise((resolve) => this.#child.once('exit', resolve))
    this.#child.stdin!.end(JSON.stringify({ op: 'exit', id: -1 }) + '\n')
    await Promise.race([exited, sleep(5000)])
    if (this.#child.exitCode === null) this.#child.kill('SIGKILL')
  }
}

let sharedDriver: PyDriver | null = null
/** One Python process for the whole file (its start-up is the slow part). */
function py (): PyDriver {
  sharedDriver ??= new PyDriver()
  return sharedDriver
}
after(async () => { await sharedDriver?.close() })

let serial = 0
/** A plugin handle unique in this process and the fixture's. */
function nextName (what: string): string { return `${what}-${serial++}` }

// ---- The TypeScript side -----------------------------------------------------------------------

interface Obs { plugin: string, tool: string, what: 'started' | 'cancelled', call_id: string, reason?: string }
const tsObs: Obs[] = []

function tsHandler (plugin: string, tool: string, behaviour: Behaviour) {
  return async (args: Record<string, unknown>, ctx: { callId: string, signal: AbortSignal }): Promise<unknown> => {
    tsObs.push({ plugin, tool, what: 'started', call_id: ctx.callId })
    ctx.signal.addEventListener('abort', () => {
      tsObs.push({ plugin, tool, what: 'cancelled', call_id: ctx.callId, reason: (ctx.signal.reason as Error).name })
    }, { once: true })
    return await behave(behaviour, args, ctx.signal)
  }
}

async function behave (b: Behaviour, args: Record<string, unknown>, signal: AbortSignal): Promise<unknown> {
  if ('return' in b) return decode(b.return)
  if ('throw' in b) {
    const message = decode(b.throw) as string
    throw b.kind === 'plain' ? new TypeError(message) : new Error(message)
  }
  if ('echo' in b) return args
  if ('fromArgs' in b) return await behave(args.b as Behaviour, args, signal)
  if ('sleep' in b) {
    await sleep(b.sleep, undefined, { signal })
    return await behave(b.then, args, signal)
  }
  return await new Promise<never>((_resolve, reject) => {
    signal.addEventListener('abort', () => { reject(signal.reason) }, { once: true })
  })
}

function tsCreate (s: Scenario, plugin: string): { ok: true, plugin: Plugin } | { ok: false, error: ErrorView } {
  const tools: Record<string, unknown> = {}
  for (const tool of s.tools) {
    const def: Record<string, unknown> = { handler: tsHandler(plugin, tool.name, tool.behaviour) }
    if ('description' in tool) def.description = decode(tool.description)
    if ('parameters' in tool) def.parameters = decode(tool.parameters)
    if ('timeoutSeconds' in tool) def.timeoutSeconds = decode(tool.timeoutSeconds)
    tools[tool.name] = def
  }
  const options: Record<string, unknown> = { logger: false, source: `plugin:${String(decode(s.id))}`, tools }
  for (const [k, v] of Object.entries(s.options)) options[k] = decode(v)
  try {
    const created = createPlugin(options as unknown as Parameters<typeof createPlugin>[0])
    created.on('error', () => {})
    return { ok: true, plugin: created }
  } catch (err) {
    return { ok: false, error: tsError(err) }
  }
}

// ---- One scenario through one SDK --------------------------------------------------------------

/** Creates, starts, reads Toolport's view, then (unless `keep`) stops: the TS plugin. */
async function runTs (s: Scenario, world: World, plugin: string, keep = false): Promise<Outcome & { handle?: Plugin }> {
  const made = tsCreate(s, plugin)
  if (!made.ok) return { stage: 'create', error: made.error }
  const source = made.plugin.source
  let started
  try {
    started = await within(made.plugin.start(), 'TS start()', GUARD_MS)
  } catch (err) {
    if ((err as Error).message.includes('(hang guard)')) throw err
    return { stage: 'start', error: tsError(err), left: countSource(world.tp, source) }
  }
  const outcome: Outcome & { handle?: Plugin } = {
    stage: 'started',
    names: [...started.names].sort(),
    roles: [...started.roles].sort(),
    registry: await toolportView(world, source)
  }
  if (keep) return { ...outcome, handle: made.plugin }
  const stopped = await within(made.plugin.stop({ graceMs: 0 }), 'TS stop()', GUARD_MS)
  outcome.stop = {
    isCleared: stopped.isCleared,
    removed: stopped.removed,
    error: stopped.error === null ? null : tsError(stopped.error)
  }
  outcome.left = countSource(world.tp, source)
  return outcome
}

/** The same through the Python SDK. */
async function runPy (s: Scenario, world: World, plugin: string, keep = false): Promise<Outcome> {
  const driver = py()
  const made = await driver.send({ op: 'create', plugin, id_: s.id, options: pyOptions(s.options), tools: pyTools(s.tools) })
  if (made.ok !== true) return { stage: 'create', error: pyError(made.error) }
  const id = String(decode(s.id))
  const source = id.startsWith('plugin:') ? id : `plugin:${id}`
  const started = await driver.send({ op: 'start', plugin })
  if (started.ok !== true) return { stage: 'start', error: pyError(started.error), left: countSource(world.tp, source) }
  const outcome: Outcome = {
    stage: 'started',
    names: [...started.names as string[]].sort(),
    roles: [...started.roles as string[]].sort(),
    registry: await toolportView(world, source)
  }
  if (keep) return outcome
  const stopped = await driver.send({ op: 'stop', plugin, grace: 0 })
  outcome.stop = {
    isCleared: stopped.is_cleared,
    removed: stopped.removed,
    error: stopped.error === null ? null : pyError(stopped.error)
  }
  outcome.left = countSource(world.tp, source)
  return outcome
}

/** Runs `s` through the TS SDK, then the Python SDK, against the same Toolport; asserts they agree. */
async function runBoth (s: Scenario, world: World, what: string): Promise<{ ts: Outcome, py: Outcome }> {
  const ts = await runTs(s, world, nextName('ts'))
  const pyOutcome = await runPy(s, world, nextName('py'))
  assertSameOutcome(ts, pyOutcome, what)
  return { ts, py: pyOutcome }
}

// ---- Results -----------------------------------------------------------------------------------

const NOT_JSON = "the tool's output could not be encoded as JSON"

/**
 * A ToolResult without what the docs let differ: the Python SDK's `<Type>: ` before the message of
 * an exception other than ToolError (README "Python plugin SDK" → Results), the reason text after
 * "could not be encoded as JSON", a port number, and how a number is spelt in `text`.
 */
function comparableResult (r: ToolResult, sdk: 'ts' | 'py'): unknown {
  let error = r.error
  if (error !== undefined) {
    if (sdk === 'py') {
      // Cosmetic, reported: arguments that are not an object (a schema without `type`) read
      // "invalid arguments: arguments must be a JSON object" in Python, without the prefix in TS.
      error = error.replace(/^TypeError: /, '').replace(/^invalid arguments: (arguments must be a JSON object)$/, '$1')
    }
    if (error.startsWith(NOT_JSON)) error = NOT_JSON
    error = error.replace(/127\.0\.0\.1:\d+/g, '127.0.0.1:<port>')
  }
  let text: unknown = r.text
  if (!r.is_error && typeof r.output !== 'string') {
    try {
      text = JSON.stringify(JSON.parse(r.text))
    } catch {}
  }
  const output = r.output === undefined ? undefined : JSON.stringify(r.output)
  return { is_error: r.is_error, output, error, text: r.is_error ? undefined : text }
}

/** Asserts the same result; `names` are the TS and the Python tool's names when they differ. */
function assertSameResult (ts: ToolResult, py: ToolResult, what: string, names?: [string, string]): void {
  const named = (r: ToolResult, name: string | undefined): ToolResult =>
    name === undefined || r.error === undefined ? r : { ...r, error: r.error.replaceAll(`'${name}'`, "'<tool>'") }
  assert.deepEqual(comparableResult(named(py, names?.[1]), 'py'), comparableResult(named(ts, names?.[0]), 'ts'),
    `${what}: the callers got different results\n  TS: ${JSON.stringify(ts).slice(0, 600)}\n  Py: ${JSON.stringify(py).slice(0, 600)}`)
}

/** A TS plugin and a Python plugin of the same tools, started in roles 'ts' and 'py'. */
async function startPair (t: TestContext, world: World, tools: ToolSpec[], options: CommonOptions = {},
  pyToolList: ToolSpec[] = tools): Promise<{
    ts: Plugin, pyPlugin: string, tsName: string, tsEvents: RegisteredEvent[]
  }> {
  const tsName = nextName('ts')
  const made = tsCreate({ id: `sdkdiff-${tsName}`, options: { toolportUrl: world.url, role: 'ts', ...options }, tools }, tsName)
  if (!made.ok) throw new Error(`the TS plugin: ${JSON.stringify(made.error)}`)
  const tsEvents: RegisteredEvent[] = []
  made.plugin.on('registered', (e) => { tsEvents.push(e) })
  t.after(() => made.plugin.stop({ graceMs: 0 }))
  await within(made.plugin.start(), 'TS start()', GUARD_MS)
  const pyPlugin = nextName('py')
  const driver = py()
  const created = await driver.send({
    op: 'create',
    plugin: pyPlugin,
    id_: `sdkdiff-${pyPlugin}`,
    options: pyOptions({ toolportUrl: world.url, role: 'py', ...options }),
    tools: pyTools(pyToolList)
  })
  if (created.ok !== true) throw new Error(`the Python plugin: ${JSON.stringify(created)}`)
  const started = await driver.send({ op: 'start', plugin: pyPlugin })
  if (started.ok !== true) throw new Error(`the Python plugin's start(): ${JSON.stringify(started)}`)
  t.after(() => driver.send({ op: 'stop', plugin: pyPlugin, grace: 0 }))
  return { ts: made.plugin, pyPlugin, tsName, tsEvents }
}

// ---- Generators --------------------------------------------------------------------------------

/** Mostly a valid value, now and then an odd one: one odd option at a time is what shows a difference. */
function pick<T> (valid: readonly T[], odd: readonly T[]): fc.Arbitrary<T> {
  return fc.oneof({ weight: 6, arbitrary: fc.constantFrom(...valid) },
    { weight: 1, arbitrary: fc.constantFrom(...odd) })
}

const NAN = { $special: 'nan' }
const INF = { $special: 'inf' }

/** Strings with the odd parts: astral, combining, controls, and (unit 'binary') lone surrogates. */
const oddString = (maxLength: number): fc.Arbitrary<string> => fc.oneof(
  fc.string({ maxLength }),
  fc.string({ maxLength, unit: 'grapheme' }),
  fc.string({ maxLength: Math.min(maxLength, 6), unit: 'binary' })
)

const toolNameArb: fc.Arbitrary<string> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.constantFrom('get_weather', 'a', '.', '..', '=.', '%41', 'a/b', 'a b', "a(b)!*'~", 'ä', '名前', '🙂',
      'tab\there', 'nl\n', '?#', '1', 'x'.repeat(64), '🙂'.repeat(64))
  },
  { weight: 3, arbitrary: fc.string({ minLength: 1, maxLength: 64, unit: 'grapheme' }).filter((n) => [...n].length <= 64) },
  { weight: 1, arbitrary: fc.constantFrom('', 'x'.repeat(65), '🙂'.repeat(65)) },
  { weight: 1, arbitrary: fc.string({ minLength: 1, maxLength: 4, unit: 'binary' }) }
)

const descriptionArb: fc.Arbitrary<unknown> = fc.oneof(
  { weight: 6, arbitrary: fc.oneof(fc.constantFrom('', 'Get the weather for a city.', 'x\udc00y'), oddString(40)) },
  { weight: 1, arbitrary: fc.constantFrom<unknown>(42, { $special: 'repeat', s: 'd', n: 16 * 1024 }, { $special: 'repeat', s: 'd', n: 16 * 1024 + 1 }) }
)

const timeoutArb: fc.Arbitrary<unknown> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.oneof(fc.constantFrom(30, 300, 0.001, 1e-9), fc.double({ min: 0.001, max: 300, noNaN: true }))
  },
  { weight: 1, arbitrary: fc.constantFrom<unknown>(0, -1, 300.0001, '5', NAN, INF, { $special: 'true' }) }
)

const S = (properties: Record<string, unknown>, extra: Record<string, unknown> = {}): Record<string, unknown> =>
  ({ type: 'object', properties, ...extra })
const DRAFT_07 = 'http://json-schema.org/draft-07/schema#'
const DRAFT_2019 = 'https://json-schema.org/draft/2019-09/schema'

/** Schemas with an edge: refused by Toolport (each for its own reason), or valid in an odd way. */
const SCHEMAS = {
  empty: {},
  noProperties: S({}),
  falseProperty: S({ a: false }),
  trueProperty: S({ a: true }),
  unknownKeyword: { type: 'object', foo: 1 },
  format: S({ a: { type: 'string', format: 'email' } }),
  unicodeClass: S({ a: { type: 'string', pattern: '^\\p{L}+$' } }),
  lookahead: S({ a: { type: 'string', pattern: '(?=a)a' } }),
  pythonEnd: S({ a: { type: 'string', pattern: 'a\\Z' } }),
  posixClass: S({ a: { type: 'string', pattern: '[[:alpha:]]' } }),
  draft07Tuple: { $schema: DRAFT_07, ...S({ a: { type: 'array', items: [{ type: 'string' }], additionalItems: false } }) },
  draft07Definitions: { $schema: DRAFT_07, ...S({ a: { $ref: '#/definitions/s' } }), definitions: { s: { type: 'string' } } },
  draft2019Keyword: { $schema: DRAFT_2019, ...S({ a: { type: 'integer' } }), $recursiveAnchor: true },
  draft04: { $schema: 'http://json-schema.org/draft-04/schema#', type: 'object' },
  missingRef: S({ a: { $ref: '#/$defs/missing' } }),
  ref: S({ a: { $ref: '#/$defs/s' } }, { $defs: { s: { type: 'string' } } }),
  duplicateRequired: S({}, { required: ['a', 'a'] }),
  fractionalCount: S({}, { minProperties: 1.5 }),
  numberAsSchema: S({ a: 5 }),
  unknownType: S({ a: { type: 'strin' } }),
  infinity: S({ a: { type: 'number', maximum: { $special: 'inf' } } }),
  nanDefault: S({ a: { default: { $special: 'nan' } } }),
  hugeNumber: S({ a: { type: 'integer', maximum: 1e308 } }),
  arrayRoot: { type: 'array' },
  typeList: { type: ['object'] },
  tooDeep: S({ a: { $special: 'deep', n: 40 } }),
  tooBig: S({}, { description: { $special: 'repeat', s: 'x', n: 70_000 } })
} satisfies Record<string, Record<string, unknown>>
const ODD_SCHEMAS: Array<Record<string, unknown>> = Object.values(SCHEMAS)

const propertySchemaArb: fc.Arbitrary<Record<string, unknown>> = fc.oneof(
  fc.constantFrom('string', 'integer', 'number', 'boolean', 'array', 'object', 'null').map((type) => ({ type })),
  fc.record({ type: fc.constant('string'), minLength: fc.nat(3), maxLength: fc.integer({ min: 3, max: 10 }) }),
  fc.array(fc.oneof(fc.string({ maxLength: 3 }), fc.integer()), { minLength: 1, maxLength: 3 })
    .map((e) => ({ enum: e })),
  fc.record({ type: fc.constant('string'), pattern: fc.constantFrom('^[a-z]+$', '^\\d+$', '(?i)^abc', '^.{2,4}$', 'é') })
)

const validSchemaArb: fc.Arbitrary<Record<string, unknown>> = fc.record({
  properties: fc.dictionary(fc.string({ minLength: 1, maxLength: 5 }), propertySchemaArb, { maxKeys: 3 }),
  dialect: fc.constantFrom(undefined, DRAFT_07, DRAFT_2019, 'https://json-schema.org/draft/2020-12/schema'),
  closed: fc.boolean()
}).map(({ properties, dialect, closed }) => ({
  ...(dialect === undefined ? {} : { $schema: dialect }),
  ...S(properties),
  ...(closed ? { additionalProperties: false } : {})
}))

const parametersArb: fc.Arbitrary<unknown> = fc.oneof({ weight: 1, arbitrary: fc.constantFrom(...ODD_SCHEMAS) },
  { weight: 3, arbitrary: validSchemaArb })

const toolSpecArb: fc.Arbitrary<ToolSpec> = fc.record({
  name: toolNameArb,
  description: descriptionArb,
  parameters: parametersArb,
  timeoutSeconds: timeoutArb
}, { requiredKeys: ['name'] }).map((t) => ({ ...t, behaviour: { return: 'ok' } }))

/** JSON-ish values a handler returns, with what JSON cannot carry mixed in. */
const { value: valueArb } = fc.letrec<{ value: unknown }>((tie) => ({
  value: fc.oneof({ depthSize: 'small', withCrossShrink: true },
    oddString(12),
    fc.integer(),
    fc.double({ noNaN: true, noDefaultInfinity: true }),
    fc.boolean(),
    fc.constant(null),
    fc.constantFrom({ $special: 'nan' }, { $special: 'inf' }, { $special: '-inf' }, { $special: 'cycle' }),
    fc.array(tie('value'), { maxLength: 3 }),
    fc.dictionary(oddString(4), tie('value'), { maxKeys: 3 }))
}))

/** Error messages: random, and the shapes a careless normalisation would change (spaces, lines, JSON). */
const messageArb: fc.Arbitrary<string> = fc.oneof(oddString(20),
  fc.constantFrom(' padded ', 'line 1\nline 2', '\t', 'ü  ', '{"error":"x"}', 'null', 'e'.repeat(20_000)))

const behaviourArb: fc.Arbitrary<Behaviour> = fc.oneof(
  { weight: 4, arbitrary: valueArb.map((value) => ({ return: value })) },
  {
    weight: 1,
    arbitrary: fc.constantFrom({ return: { $special: 'none' } }, { return: { $special: 'deep', n: 3000 } },
      { return: { $special: 'deep', n: 50 } }, { return: { $special: 'repeat', s: 'é', n: 3 * 1024 * 1024 } },
      { return: { $special: 'repeat', s: 'ab', n: 100_000 } })
  },
  { weight: 2, arbitrary: fc.record({ throw: messageArb.filter((m) => m !== ''), kind: fc.constant('tool' as const) }) },
  { weight: 1, arbitrary: fc.record({ throw: messageArb, kind: fc.constant('plain' as const) }) }
).chain((b) => fc.oneof(fc.constant(b), fc.nat(20).map((ms) => ({ sleep: ms, then: b }))))

/** Patterns and strings where regular-expression engines tend to differ. */
const PATTERNS = ['[[:alpha:]]', '^\\S+$', 'a\\b', '^\\w+$', '^\\d+$', '(?i)^abc$', '^.{2,4}$', '\\s', '^a$', 'é+']
const PATTERN_INPUTS = ['b', 'a\u00a0b', 'a\u000bb', 'aé', 'abc', 'ABC', '\u0661\u0662', 'a\n', '😀😀', 'x y', 'a_b', 'a']

interface CallCase {
  /** the tool: 'behave' (behaviour in the arguments), 'pat<i>' or 'max' */
  tool: string
  arguments?: unknown
  raw_arguments?: string
}

const callCaseArb: fc.Arbitrary<CallCase> = fc.oneof(
  { weight: 4, arbitrary: behaviourArb.map((b) => ({ tool: 'behave', arguments: { b } })) },
  {
    weight: 2,
    arbitrary: fc.record({ i: fc.nat(PATTERNS.length - 1), s: fc.constantFrom(...PATTERN_INPUTS) })
      .map(({ i, s }) => ({ tool: `pat${i}`, arguments: { a: s } }))
  },
  {
    weight: 1,
    arbitrary: fc.bigInt({ min: 2n ** 53n - 2n, max: 2n ** 53n + 2n })
      .map((n) => ({ tool: 'max', raw_arguments: `{"a": ${n}}` }))
  },
  {
    weight: 1,
    arbitrary: fc.constantFrom<unknown>([1], 'x', 5, null, { pad: 'p'.repeat(5000) })
      .map((a) => ({ tool: 'any', arguments: a }))
  }
)

/** The tools of the calls property: one that does what its arguments say, and schema checkers. */
const CALL_TOOLS: ToolSpec[] = [
  { name: 'behave', parameters: { type: 'object' }, behaviour: { fromArgs: true } },
  ...PATTERNS.map((pattern, i) => ({ name: `pat${i}`, parameters: S({ a: { type: 'string', pattern } }), behaviour: { echo: true } as const })),
  { name: 'max', parameters: S({ a: { type: 'integer', maximum: 2 ** 53 } }), behaviour: { echo: true } },
  { name: 'any', parameters: {}, behaviour: { echo: true } }
]

// ---- Plugin options ----------------------------------------------------------------------------

const optionsArb = (port: number): fc.Arbitrary<Scenario> => fc.record({
  id: pick(['sdkdiff-opt', 'ünï', 'x'.repeat(249), '😀'.repeat(124)], ['', 'x'.repeat(250), '😀'.repeat(125), 'a\ud800']),
  options: fc.record({
    role: pick([null, 'main'], ['ghost', '']),
    toolportUrl: pick([`http://127.0.0.1:${port}`, `http://127.0.0.1:${port}/`, `http://localhost:${port}`, `HTTP://127.0.0.1:${port}`], [
      `http://127.0.0.1:${port}/?q=1`, `http://127.0.0.1:${port}#f`, `http://127.1:${port}`, ` http://127.0.0.1:${port} `,
      `http://127.0.0.1:${port}/\t`, `http:\\\\127.0.0.1:${port}`, `http://[::1]:${port}`, `http://0.0.0.0:${port}`,
      `http://u:p@127.0.0.1:${port}`, `ftp://127.0.0.1:${port}`, `http://127.0.0.1:${port}/p/`]),
    host: pick(['127.0.0.1', '127.0.0.2', '::1', '0:0:0:0:0:0:0:1', '::ffff:127.0.0.1'], ['localhost', '0.0.0.0', '127.1', '::1%lo']),
    port: pick<unknown>([0], [65536, -1, 1.5, { $special: 'true' }]),
    token: pick(['x'.repeat(40), 'tök'], ['', '  ', 'a\nb', 't😀']),
    pluginKey: pick(['k'.repeat(32), 'k'.repeat(512)], ['k'.repeat(31), 'k'.repeat(513), 'k k'.repeat(11), 'ключ'.repeat(8)]),
    requestTimeoutMs: pick<unknown>([5000], [NAN, INF, 0]),
    pollIntervalMs: pick<unknown>([1000], [NAN, -1]),
    maxBackoffMs: pick<unknown>([1000], [NAN]),
    maxBodyBytes: pick([1024, 65536], [1, 1023, 0, 1.5]),
    watchEvents: pick<unknown>([true, false], ['yes'])
  }, { requiredKeys: ['toolportUrl'] }).map((o) => ({ ...o, startTimeoutMs: 0 })),
  tools: fc.constant([{ name: 'get_weather', behaviour: { return: 'ok' } }])
})

// ---- Properties --------------------------------------------------------------------------------

test('tool definitions (property): README "Plugin SDK"/"Python plugin SDK" and docs/protocol.md R7, R8 — both SDKs accept or refuse the same tools at the same stage with the same code, and register the same bodies', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['main', 'other'] })
  const scenarioArb = fc.uniqueArray(toolSpecArb, { minLength: 1, maxLength: 3, selector: (tool) => tool.name })
    .map((tools): Scenario => ({
      id: 'sdkdiff-def',
      options: { toolportUrl: world.url, startTimeoutMs: 0, watchEvents: false, pollIntervalMs: 600_000 },
      tools
    }))
  await check(fc.asyncProperty(fc.limitShrink(scenarioArb, MAX_SHRINKS), async (s) => {
    await runBoth(s, world, `tools ${JSON.stringify(s.tools).slice(0, 800)}`)
  }), { numRuns: 30 * RUNS })
})

test('plugin options (property): README "Plugin SDK" and "Python plugin SDK" option tables — the same options are accepted or refused alike, at the same stage, with the same code', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['main', 'other'] })
  await check(fc.asyncProperty(fc.limitShrink(optionsArb(world.port), MAX_SHRINKS), async (s) => {
    await runBoth(s, world, `id ${JSON.stringify(s.id)}, options ${JSON.stringify(s.options)}`)
  }), { numRuns: 25 * RUNS })
})

test('calls (property): docs/protocol.md R9–R12, README "Calls"/"Results" — the same handler behaviour gives the caller the same ToolResult through either SDK', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['ts', 'py'] })
  await startPair(t, world, CALL_TOOLS, { watchEvents: false, pollIntervalMs: 600_000, maxBodyBytes: 4096 })
  let n = 0
  await check(fc.asyncProperty(fc.limitShrink(fc.array(callCaseArb, { minLength: 1, maxLength: 6 }), MAX_SHRINKS),
    async (cases) => {
      for (const c of cases) {
        const call = { name: c.tool, call_id: `c${n++}`, ...('raw_arguments' in c ? { raw_arguments: c.raw_arguments } : { arguments: c.arguments }) }
        const [a, b] = await Promise.all([
          within(world.tp.callTool('ts', call), 'a TS call', GUARD_MS),
          within(world.tp.callTool('py', call), 'a Python call', GUARD_MS)
        ])
        assertSameResult(a, b, `call ${JSON.stringify(call).slice(0, 400)}`)
      }
    }), { numRuns: 25 * RUNS })
})

test('deadline, cancellation and stop() with calls in flight: README "Context" (TS) and "Deadline and cancellation" (Python) — same results, and every abandoned handler is told', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['ts', 'py'] })
  const { ts, pyPlugin, tsName } = await startPair(t, world, [
    { name: 'hang', timeoutSeconds: 0.4, behaviour: { hang: true } },
    { name: 'hang30', behaviour: { hang: true } },
    { name: 'slow', behaviour: { sleep: 300, then: { return: 'done' } } }
  ], { watchEvents: false, pollIntervalMs: 600_000 })
  const driver = py()
  const seen = async (callId: string, what: 'started' | 'cancelled'): Promise<{ ts: Obs, py: PyEvent }> => {
    let tsSeen: Obs | undefined
    let pySeen: PyEvent | undefined
    await waitFor(`both handlers of ${callId} report ${what}`, () => {
      tsSeen = tsObs.find((o) => o.plugin === tsName && o.call_id === callId && o.what === what)
      pySeen = driver.events.find((e) => e.plugin === pyPlugin && e.ev === 'obs' && e.call_id === callId && e.what === what)
      return tsSeen !== undefined && pySeen !== undefined
    }, GUARD_MS)
    return { ts: tsSeen as Obs, py: pySeen as PyEvent }
  }
  const DEADLINE = new Set(['TimeoutError', 'AbortError', 'deadline', 'disconnected'])

  // The deadline passes: Toolport answers with its timeout; both handlers are told.
  const [a, b] = await Promise.all(['ts', 'py'].map((role) => world.tp.callTool(role, { name: 'hang', call_id: 'deadline', arguments: {} })))
  assertSameResult(a as ToolResult, b as ToolResult, 'a call past its deadline')
  assert.match(String(a?.error), /timed out/)
  const late = await seen('deadline', 'cancelled')
  assert.ok(DEADLINE.has(String(late.ts.reason)) && DEADLINE.has(String(late.py.reason)), JSON.stringify(late))

  // The caller cancels: both handlers see Toolport hang up.
  const controllers = [new AbortController(), new AbortController()]
  const cancelled = ['ts', 'py'].map((role, i) => world.tp.callTool(role, { name: 'hang30', call_id: 'cancel', arguments: {} },
    { signal: controllers[i]?.signal }))
  await seen('cancel', 'started')
  for (const c of controllers) c.abort()
  const [c1, c2] = await Promise.all(cancelled)
  assertSameResult(c1 as ToolResult, c2 as ToolResult, 'a cancelled call')
  const gone = await seen('cancel', 'cancelled')
  assert.deepEqual([gone.ts.reason, gone.py.reason], ['AbortError', 'disconnected'])

  // stop() with a grace: the short call finishes, the hanging one ends alike, and its handler is told.
  const inflight = ['ts', 'py'].flatMap((role) => [
    world.tp.callTool(role, { name: 'slow', call_id: 'grace-slow', arguments: {} }),
    world.tp.callTool(role, { name: 'hang30', call_id: 'grace-hang', arguments: {} })
  ])
  await seen('grace-slow', 'started')
  await seen('grace-hang', 'started')
  const [tsStop, pyStop] = await Promise.all([
    within(ts.stop({ graceMs: 1000 }), 'TS stop()', GUARD_MS),
    driver.send({ op: 'stop', plugin: pyPlugin, grace: 1 })
  ])
  assert.deepEqual({ isCleared: pyStop.is_cleared, removed: pyStop.removed, error: pyStop.error },
    { isCleared: tsStop.isCleared, removed: tsStop.removed, error: tsStop.error }, 'stop() results')
  const [tsSlow, tsHang, pySlow, pyHang] = await Promise.all(inflight) as ToolResult[]
  assert.deepEqual(tsSlow, { is_error: false, output: 'done', text: 'done' })
  assertSameResult(tsSlow as ToolResult, pySlow as ToolResult, 'a call that ends within the grace')
  assertSameResult(tsHang as ToolResult, pyHang as ToolResult, 'a call cut off by stop()')
  await seen('grace-hang', 'cancelled')
})

test('start() and stop() states: README "Start and stop" (both SDKs) — stop() before start(), start() twice or after stop(), stop() while start() retries, and stop() while Toolport is down end alike', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['main'] })
  const driver = py()
  const stopView = (r: { isCleared: boolean, removed: number, error: unknown }): unknown =>
    ({ isCleared: r.isCleared, removed: r.removed, error: r.error === null ? null : (r.error as ErrorView).code })
  const pyStopView = (r: Record<string, any>): unknown =>
    stopView({ isCleared: r.is_cleared, removed: r.removed, error: r.error === null ? null : pyError(r.error) })
  const both = async (what: string, s: Scenario, script: {
    ts: (p: Plugin) => Promise<unknown>, py: (name: string) => Promise<unknown>
  }): Promise<void> => {
    const made = tsCreate(s, nextName('ts'))
    assert.ok(made.ok)
    t.after(() => made.plugin.stop({ graceMs: 0 }))
    const name = nextName('py')
    const created = await driver.send({ op: 'create', plugin: name, id_: s.id, options: pyOptions(s.options), tools: pyTools(s.tools) })
    assert.equal(created.ok, true, JSON.stringify(created))
    t.after(() => driver.send({ op: 'stop', plugin: name, grace: 0 }))
    const tsSaw = await script.ts(made.plugin)
    const pySaw = await script.py(name)
    assert.deepEqual(pySaw, tsSaw, `${what}: TS ${JSON.stringify(tsSaw)}, Python ${JSON.stringify(pySaw)}`)
  }
  const startCode = async (p: Promise<unknown>): Promise<string> => {
    try {
      await p
      return 'started'
    } catch (err) {
      return String(tsError(err).code ?? tsError(err).class)
    }
  }
  const pyStartCode = (a: Record<string, any>): string => a.ok === true ? 'started' : String(a.error.code ?? a.error.class)

  await both('stop() before start(), then start()', single(world), {
    ts: async (p) => [stopView(await p.stop()), await startCode(p.start())],
    py: async (n) => [pyStopView(await driver.send({ op: 'stop', plugin: n })), pyStartCode(await driver.send({ op: 'start', plugin: n }))]
  })
  await both('start() twice at once, then stop()', single(world), {
    ts: async (p) => {
      const codes = await Promise.all([startCode(p.start()), startCode(p.start())])
      return [codes.sort(), stopView(await p.stop({ graceMs: 0 }))]
    },
    py: async (n) => {
      const answers = await Promise.all([driver.send({ op: 'start', plugin: n }), driver.send({ op: 'start', plugin: n })])
      return [answers.map(pyStartCode).sort(), pyStopView(await driver.send({ op: 'stop', plugin: n, grace: 0 }))]
    }
  })
  // Toolport is not there: start() retries (startTimeoutMs 10 s) until stop() ends it.
  const down = { ...world, url: `http://127.0.0.1:${world.port + (world.port > 60000 ? -1 : 1)}` }
  await both('stop() while start() retries', single(down, {}, { startTimeoutMs: 10_000, maxBackoffMs: 100, pollIntervalMs: 50 }), {
    ts: async (p) => {
      const starting = startCode(p.start())
      await sleep(200)
      return [stopView(await p.stop({ graceMs: 0 })), await starting]
    },
    py: async (n) => {
      const starting = driver.send({ op: 'start', plugin: n })
      await sleep(200)
      return [pyStopView(await driver.send({ op: 'stop', plugin: n, grace: 0 })), pyStartCode(await starting)]
    }
  })
  // Started, then Toolport goes away: stop() cannot clear, and says so (requestTimeoutMs 2 s).
  const gone = await startToolport(t, { roles: ['main'] })
  const s = single(gone, {}, { requestTimeoutMs: 2000 })
  const tsRun = await runTs(s, gone, nextName('ts'), true)
  const pyName = nextName('py')
  const pyRun = await runPy({ ...s, id: 'sdkdiff-reg-py' }, gone, pyName, true)
  assert.deepEqual([tsRun.stage, pyRun.stage], ['started', 'started'])
  await gone.tp.close()
  const tsStop = stopView(await (tsRun.handle as Plugin).stop({ graceMs: 0 }))
  const pyStop = pyStopView(await driver.send({ op: 'stop', plugin: pyName, grace: 0 }))
  assert.deepEqual(tsStop, { isCleared: false, removed: 0, error: 'TP_ERR_PLUGIN_UNREACHABLE' })
  assert.deepEqual(pyStop, tsStop, 'stop() while Toolport is down')
})

/**
 * The TS plugin's callback server, found among the process's handles by its port: the SDK has no
 * public way to stop listening for a moment, as the Python fixture's `suspend` does (a real
 * http.Server; closing and re-opening it is what a crashed and restarted listener looks like).
 */
function tsServerOn (port: number): Server {
  const handles = (process as unknown as { _getActiveHandles: () => unknown[] })._getActiveHandles()
  const server = handles.find((h) => {
    const s = h as { address?: () => unknown, listen?: unknown }
    if (typeof s.address !== 'function' || typeof s.listen !== 'function') return false
    const address = s.address() as { port?: number } | null
    return address?.port === port
  })
  assert.ok(server !== undefined, `a server listens on ${port}`)
  return server as Server
}

type Step = 'restart' | 'evict' | 'unregister' | 'clear' | 'roles'

test('lifecycle (property): docs/protocol.md R3, R4, R13, R15, R16, R6 — after a Toolport restart, an eviction, an unregister, a clear or roles removed and added, both SDKs register again exactly what was lost and announce it alike; stop() alike', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const ROLES = ['ts', 'py', 'x']
  const first = await startToolport(t, { roles: ROLES })
  const world: World = { ...first }
  t.after(() => world.tp.close())
  const runArb = fc.record({
    // 'fixed': the TS plugin in role 'ts', the Python one in 'py'; 'every': role null, both in every role
    // (their tools named apart: ts_a, py_a…), where 'roles' also adds a role and both must reach it.
    mode: fc.constantFrom('fixed', 'every'),
    steps: fc.array(fc.constantFrom<Step>('restart', 'evict', 'unregister', 'clear', 'roles'), { minLength: 2, maxLength: 4 })
  })
  await check(fc.asyncProperty(fc.limitShrink(runArb, 5), async ({ mode, steps }) => {
    const every = mode === 'every'
    const toolsOf = (prefix: string): ToolSpec[] => ['a', 'b'].map((n, i) => ({ name: `${prefix}${n}`, behaviour: { return: i } }))
    // Polling fast: the TS SDK re-checks a fixed role that comes back only by polling.
    const { ts, pyPlugin, tsEvents } = await startPair(t, world, toolsOf(every ? 'ts_' : ''),
      { pollIntervalMs: 150, maxBackoffMs: 300, ...(every ? { role: null } : {}) }, toolsOf(every ? 'py_' : ''))
    const driver = py()
    const tsPort = Number(new URL(ts.url).port)
    const plain = (name: string): string => name.replace(/^(ts|py)_/, '')
    /** Each SDK's roles → tool names (prefix dropped), as Toolport holds them now. */
    const holdings = (sdk: 'ts' | 'py'): Record<string, string[]> => {
      const out: Record<string, string[]> = {}
      for (const [role, rows] of Object.entries(world.tp.list().tools_by_role)) {
        const mine = rows.filter((r) => every ? r.name.startsWith(`${sdk}_`) : role === sdk).map((r) => plain(r.name)).sort()
        if (mine.length > 0 || every) out[every ? role : 'own'] = mine
      }
      return out
    }
    const complete = (): boolean => {
      const a = holdings('ts')
      return isDeepStrictEqual(a, holdings('py')) && Object.values(a).length > 0 &&
        Object.values(a).every((names) => isDeepStrictEqual(names, ['a', 'b']))
    }
    const announced = (events: Array<Record<string, unknown>>): unknown[] => events
      .map((e) => ({
        names: (e.names as string[]).map(plain).sort(),
        roles: every ? [...e.roles as string[]].sort() : ['own'],
        reason: e.reason
      }))
    const callBoth = async (role: string, name: string, what: string): Promise<ToolResult> => {
      const names: [string, string] = every ? [`ts_${name}`, `py_${name}`] : [name, name]
      const [r1, r2] = await Promise.all([
        world.tp.callTool(every ? role : 'ts', { name: names[0], arguments: {} }),
        world.tp.callTool(every ? role : 'py', { name: names[1], arguments: {} })
      ])
      assertSameResult(r1, r2, what, names)
      return r1
    }
    const pyEvents = (): Array<Record<string, unknown>> => driver.events.filter((e) => e.plugin === pyPlugin && e.ev === 'registered')
    await sleep(300) // the event streams connect
    await waitUntil(() => 'both announce their start', () => tsEvents.length > 0 && pyEvents().length > 0, GUARD_MS)
    assert.deepEqual(announced(driver.take(pyPlugin, 'registered')),
      announced(tsEvents.splice(0) as unknown as Array<Record<string, unknown>>), 'the start events')
    try {
      await lifecycleSteps()
    } finally {
      // A failed run must not leave plugins that register into the next one.
      await Promise.all([ts.stop({ graceMs: 0 }), driver.send({ op: 'stop', plugin: pyPlugin, grace: 0 })])
      if (world.tp.roles.has('late')) world.tp.roles.remove('late')
      for (const source of new Set(Object.values(world.tp.list().tools_by_role).flat().map((r) => r.source))) {
        await world.tp.clear({ source, role: null })
      }
    }
    async function lifecycleSteps (): Promise<void> {
      for (const step of steps) {
        let lost = ['a', 'b']
        if (step === 'restart') {
          await world.tp.close()
          const tp = await createToolport({ logger: false, roles: ROLES, dispatch: { mode: 'inline' } })
          await tp.listen({ host: '127.0.0.1', port: world.port })
          world.tp = tp
        } else if (step === 'evict') {
          const server = tsServerOn(tsPort)
          server.close()
          server.closeAllConnections()
          await driver.send({ op: 'suspend', plugin: pyPlugin })
          // Toolport's pool notices the closed keep-alive sockets (else a call may meet one: "other side closed").
          await sleep(150)
          for (let i = 0; i < 3; i++) await callBoth('x', 'a', 'a call while the plugins are down')
          server.listen(tsPort, '127.0.0.1')
          await driver.send({ op: 'resume', plugin: pyPlugin })
        } else if (step === 'unregister') {
          lost = ['a']
          for (const name of every ? ['ts_a', 'py_a'] : ['a']) await world.tp.unregister({ name, role: null })
        } else if (step === 'clear') {
          for (const source of new Set(Object.values(world.tp.list().tools_by_role).flat().map((r) => r.source))) {
            await world.tp.clear({ source, role: null })
          }
        } else if (every) {
          // A role removed and added again, and a role that did not exist at start (beyond R4).
          for (const role of ['x', 'late']) if (world.tp.roles.has(role)) world.tp.roles.remove(role)
          await sleep(200)
          world.tp.roles.add('x')
          world.tp.roles.add('late')
        } else {
          world.tp.roles.remove('ts')
          world.tp.roles.remove('py')
          await sleep(200)
          world.tp.roles.add('ts')
          world.tp.roles.add('py')
        }
        await waitUntil(() => `both plugins register again after ${step} (TS ${JSON.stringify(holdings('ts'))}, Python ${JSON.stringify(holdings('py'))})`,
          complete, GUARD_MS)
        const restored = (events: Array<Record<string, unknown>>): string[] =>
          [...new Set(events.filter((e) => e.reason === 'restored').flatMap((e) => (e.names as string[]).map(plain)))].sort()
        await waitUntil(() => `both announce ${lost.join()} as restored after ${step} (TS ${JSON.stringify(tsEvents)}, Python ${JSON.stringify(pyEvents())})`, () =>
          isDeepStrictEqual(restored(tsEvents as unknown as Array<Record<string, unknown>>), lost) &&
          isDeepStrictEqual(restored(pyEvents()), lost), GUARD_MS)
        await sleep(100) // a second announcement, if either made one, comes now
        assert.deepEqual(announced(driver.take(pyPlugin, 'registered')),
          announced(tsEvents.splice(0) as unknown as Array<Record<string, unknown>>), `after ${step}: the registered events`)
        for (const name of ['a', 'b']) {
          const r = await callBoth('x', name, `a call after ${step}`)
          assert.equal(r.is_error, false, `after ${step}: ${JSON.stringify(r)}`)
        }
      }
      const [tsStop, pyStop] = await Promise.all([ts.stop({ graceMs: 0 }), driver.send({ op: 'stop', plugin: pyPlugin, grace: 0 })])
      assert.deepEqual({ isCleared: pyStop.is_cleared, removed: pyStop.removed, error: pyStop.error },
        { isCleared: tsStop.isCleared, removed: tsStop.removed, error: tsStop.error }, 'stop() results')
      assert.deepEqual(Object.values(world.tp.list().tools_by_role).flat(), [], 'nothing left after stop()')
    }
  }), { numRuns: 3 * RUNS })
})

// ---- Regressions: each difference the properties found, as a minimal example -------------------

/** One tool, default options, against `world`: the scenario of most regressions. */
function single (world: World, tool: Partial<ToolSpec> = {}, options: CommonOptions = {}, id: unknown = 'sdkdiff-reg'): Scenario {
  return {
    id,
    options: { toolportUrl: world.url, startTimeoutMs: 0, watchEvents: false, pollIntervalMs: 600_000, ...options },
    tools: [{ name: 'get_weather', behaviour: { return: 'ok' }, ...tool }]
  }
}

test('regression (known): a tool name with a lone surrogate is refused by both SDKs at construction (README "Plugin SDK" names; Python refuses it, TS starts and fails with a URIError)', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['main'] })
  const { ts } = await runBoth(single(world, { name: 'a\ud800' }), world, 'a lone surrogate name')
  assert.equal(ts.stage, 'create')
})

test('regression (known): stop() after the plugin\'s one role was removed reports the clear as done in both SDKs (README "Start and stop": { isCleared: true, removed: 0, error: null })', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['main'] })
  const s = single(world, {}, { role: 'main' })
  const ts = await runTs(s, world, nextName('ts'), true)
  const pyName = nextName('py')
  const pyOutcome = await runPy({ ...s, id: 'sdkdiff-reg-py' }, world, pyName, true)
  assert.equal(ts.stage, 'started')
  assert.equal(pyOutcome.stage, 'started')
  world.tp.roles.remove('main')
  const tsStop = await (ts.handle as Plugin).stop({ graceMs: 0 })
  const pyStop = await py().send({ op: 'stop', plugin: pyName, grace: 0 })
  const cleared = { isCleared: true, removed: 0, error: null }
  assert.deepEqual({ isCleared: tsStop.isCleared, removed: tsStop.removed, error: tsStop.error }, cleared)
  assert.deepEqual({ isCleared: pyStop.is_cleared, removed: pyStop.removed, error: pyStop.error }, cleared,
    'Python stop() after its role was removed')
})

test('regression: the TS SDK refuses at createPlugin a JSON Schema that breaks its dialect\'s meta-schema, as Toolport does at registration (README "`parameters` and argument validation"; Python refuses it at once)', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['main'] })
  for (const parameters of [SCHEMAS.duplicateRequired, SCHEMAS.fractionalCount, SCHEMAS.numberAsSchema]) {
    const { ts } = await runBoth(single(world, { parameters }), world, `parameters ${JSON.stringify(parameters)}`)
    assert.equal(ts.stage, 'create')
  }
})

test('regression: a handler output of NaN or ±Infinity is an error result in both SDKs, never a silent null (README "Plugin SDK" → Calls: "an output that cannot be encoded as JSON is an error result too")', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['ts', 'py'] })
  await startPair(t, world, [{ name: 'behave', parameters: { type: 'object' }, behaviour: { fromArgs: true } }], { watchEvents: false })
  for (const value of [{ $special: 'nan' }, { $special: '-inf' }, { a: [1, { $special: 'inf' }] }]) {
    const call = { name: 'behave', arguments: { b: { return: value } } }
    const [a, b] = await Promise.all([world.tp.callTool('ts', call), world.tp.callTool('py', call)])
    assertSameResult(a, b, `returning ${JSON.stringify(value)}`)
    assert.equal(a.is_error, true, `TS: ${JSON.stringify(a)}`)
  }
})

test('regression: a handler output holding a lone surrogate (e.g. an echoed argument) reaches the caller through the Python SDK as through the TS SDK (docs/protocol.md R10)', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['ts', 'py'] })
  await startPair(t, world, [
    { name: 'behave', parameters: { type: 'object' }, behaviour: { fromArgs: true } },
    { name: 'echo', parameters: { type: 'object' }, behaviour: { echo: true } }
  ], { watchEvents: false })
  for (const call of [
    { name: 'behave', arguments: { b: { return: 'a\ud800b' } } },
    { name: 'behave', arguments: { b: { return: { 'k\udc00': 1 } } } },
    { name: 'echo', arguments: { q: 'x\udfff' } }
  ]) {
    const [a, b] = await Promise.all([world.tp.callTool('ts', call), world.tp.callTool('py', call)])
    assertSameResult(a, b, `${JSON.stringify(call)}`)
    assert.equal(b.is_error, false, `Python: ${JSON.stringify(b)}`)
  }
})

test('regression: a handler output nested 600 levels deep (valid JSON, which the TS SDK and Toolport carry) is the output in the Python SDK too, not "could not be encoded as JSON" (docs/protocol.md R10)', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['ts', 'py'] })
  await startPair(t, world, [{ name: 'behave', parameters: { type: 'object' }, behaviour: { fromArgs: true } }], { watchEvents: false })
  const call = { name: 'behave', arguments: { b: { return: { $special: 'deep', n: 600 } } } }
  const [a, b] = await Promise.all([world.tp.callTool('ts', call), world.tp.callTool('py', call)])
  assert.equal(a.is_error, false)
  assertSameResult(a, b, 'an output nested 600 levels deep')
})

test('regression: a ToolError whose message holds a lone surrogate is a tool error with that message in the Python SDK, not an HTTP 500 (docs/protocol.md R11)', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['ts', 'py'] })
  await startPair(t, world, [{ name: 'behave', parameters: { type: 'object' }, behaviour: { fromArgs: true } }], { watchEvents: false })
  const call = { name: 'behave', arguments: { b: { throw: 'bad \ud800 input', kind: 'tool' } } }
  const [a, b] = await Promise.all([world.tp.callTool('ts', call), world.tp.callTool('py', call)])
  assert.equal(a.error, 'bad \ud800 input')
  assertSameResult(a, b, 'a ToolError with a lone surrogate')
})

test('regression: an explicit `parameters` schema is judged by Toolport\'s rules in the Python SDK too — its $schema dialect and RE2 patterns — at construction (README "`parameters` and argument validation")', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['main'] })
  const cases: Array<[string, Record<string, unknown>]> = [
    ['a draft-07 tuple (Toolport takes it; Python refuses)', SCHEMAS.draft07Tuple],
    ['a 2019-09 keyword (Toolport takes it; Python refuses)', SCHEMAS.draft2019Keyword],
    ['an RE2 \\p{L} pattern (Toolport takes it; Python refuses)', SCHEMAS.unicodeClass],
    ['a lookahead (Toolport refuses; Python fails only in start())', SCHEMAS.lookahead],
    ['draft-04 (Toolport refuses; Python fails only in start())', SCHEMAS.draft04],
    ['a $ref that does not resolve', SCHEMAS.missingRef],
    ['Infinity (Python sends a body that is not JSON)', SCHEMAS.infinity]
  ]
  const failures: string[] = []
  for (const [what, parameters] of cases) {
    try {
      await runBoth(single(world, { parameters }), world, what)
    } catch (err) {
      failures.push((err as Error).message.split('\n').slice(0, 3).join(' | '))
    }
  }
  assert.deepEqual(failures, [])
})

test('regression: the Python SDK accepts the arguments Toolport accepted for an explicit schema — RE2 classes, \\S, \\b and integers past 2^53 — as the TS SDK does (README "Arguments are validated … against the very schema registered with Toolport")', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['ts', 'py'] })
  await startPair(t, world, CALL_TOOLS, { watchEvents: false })
  const calls: CallCase[] = [
    { tool: `pat${PATTERNS.indexOf('[[:alpha:]]')}`, arguments: { a: 'b' } },
    { tool: `pat${PATTERNS.indexOf('^\\S+$')}`, arguments: { a: 'a\u00a0b' } },
    { tool: `pat${PATTERNS.indexOf('^\\S+$')}`, arguments: { a: 'a\u000bb' } },
    { tool: `pat${PATTERNS.indexOf('a\\b')}`, arguments: { a: 'aé' } },
    { tool: 'max', raw_arguments: '{"a": 9007199254740993}' }
  ]
  for (const c of calls) {
    const call = { name: c.tool, ...('raw_arguments' in c ? { raw_arguments: c.raw_arguments } : { arguments: c.arguments }) }
    const [a, b] = await Promise.all([world.tp.callTool('ts', call), world.tp.callTool('py', call)])
    assert.equal(a.is_error, false, `Toolport and the TS SDK take ${JSON.stringify(call)}: ${JSON.stringify(a)}`)
    assertSameResult(a, b, JSON.stringify(call))
  }
})

test('regression: the Python SDK refuses a NaN duration at construction as the TS SDK does (with start_timeout=NaN, start() against a Toolport that is down would retry forever; README option tables)', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['main'] })
  for (const option of ['startTimeoutMs', 'requestTimeoutMs', 'pollIntervalMs', 'maxBackoffMs'] as const) {
    const { ts } = await runBoth(single(world, {}, { [option]: { $special: 'nan' } }), world, `${option}: NaN`)
    assert.equal(ts.stage, 'create')
  }
})

test('regression: tokens are visible ASCII only (0x21–0x7E) and at least 32 characters — a token with a line break, only spaces, Latin-1 or beyond, or a short one, is refused at construction by both SDKs (TS used to retry start() as "unreachable"), Toolport\'s config refuses such a token too, and a visible ASCII token authenticates from both (README option tables: token; "Configuration": security.token)', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const plain = await startToolport(t, { roles: ['main'] })
  // No header carries a line break, Toolport reads header bytes as Latin-1 and trims them: refused up front.
  for (const [what, token] of [
    ['a token with a line break', 'abc\ndef'],
    ['a token of spaces only', '   '],
    ['a Latin-1 token', 'ö'.padEnd(40, 'x')],
    ['a token beyond Latin-1', 'tok😀'.padEnd(40, 'x')],
    // Toolport's security.token is at least 32 bytes: a shorter one could never be accepted.
    ['a token of 31 characters', 'x'.repeat(31)]
  ] as const) {
    const { ts } = await runBoth(single(plain, {}, { token }), plain, what)
    assert.equal(ts.stage, 'create', what)
  }
  await assert.rejects(createToolport({ logger: false, dispatch: { mode: 'inline' }, security: { token: 'ö'.padEnd(40, 'x') } }),
    { code: 'TP_ERR_CONFIG' }, 'Toolport\'s config refuses a Latin-1 token')
  await assert.rejects(createToolport({ logger: false, dispatch: { mode: 'inline' }, security: { token: 'x'.repeat(31) } }),
    { code: 'TP_ERR_CONFIG' }, 'Toolport\'s config refuses a token of 31 characters')
  const ascii = '!~'.padEnd(40, 'x')
  const started = await startToolport(t, { roles: ['main'], security: { token: ascii } })
  const world: World = { ...started, token: ascii }
  const { ts } = await runBoth(single(world, {}, { token: ascii }), world, 'a visible ASCII token in token mode')
  assert.equal(ts.stage, 'started')
})

test('regression: a Toolport URL with a query or a fragment reaches the API in the Python SDK as in the TS SDK (README option tables: toolport_url / toolportUrl)', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['main'] })
  for (const url of [`${world.url}/?via=sdk`, `${world.url}#api`]) {
    const { ts } = await runBoth(single(world, {}, { toolportUrl: url }), world, `toolportUrl ${url}`)
    assert.equal(ts.stage, 'started')
  }
})

test('regression: the Python SDK refuses what the TS SDK refuses at construction — an empty tool name (not replaced by the function\'s name), a description that is not a string, a source over 256 UTF-16 units (Toolport\'s count)', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['main'] })
  const failures: string[] = []
  for (const [what, s] of [
    ['an empty tool name', single(world, { name: '' })],
    ['a description that is a number', single(world, { description: 42 })],
    ['a source of 125 astral characters', single(world, {}, {}, '😀'.repeat(125))]
  ] as Array<[string, Scenario]>) {
    try {
      const { ts } = await runBoth(s, world, what)
      assert.equal(ts.stage, 'create')
    } catch (err) {
      failures.push((err as Error).message.split('\n').slice(0, 3).join(' | '))
    }
  }
  assert.deepEqual(failures, [])
})

test('regression: a direct caller\'s malformed body is answered alike by both SDKs — a JSON array, invalid UTF-8, a byte order mark and UTF-16 are 400, and `"arguments": null` beside `raw_arguments` takes the raw text (docs/protocol.md R9)', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const world = await startToolport(t, { roles: ['ts', 'py'] })
  await startPair(t, world, [{ name: 'echo', parameters: { type: 'object' }, behaviour: { echo: true } }], { watchEvents: false })
  const urlOf = (role: string): string => {
    const url = world.tp.list(role).tools_by_role[role]?.find((tool) => tool.name === 'echo')?.callback_url
    assert.ok(typeof url === 'string', role)
    return url
  }
  const call = '{"name":"echo","arguments":{}}'
  const bodies: Array<[string, Buffer, number]> = [
    ['a JSON array', Buffer.from(`[${call}]`), 400],
    ['invalid UTF-8', Buffer.concat([Buffer.from('{"name":"echo","arguments":{"q":"'), Buffer.from([0xff]), Buffer.from('"}}')]), 400],
    ['a byte order mark', Buffer.from(`\ufeff${call}`), 400],
    ['UTF-16', Buffer.from(`\ufeff${call}`, 'utf16le'), 400],
    ['arguments null beside raw_arguments', Buffer.from('{"name":"echo","arguments":null,"raw_arguments":"{\\"q\\":1}"}'), 200]
  ]
  for (const [what, body, status] of bodies) {
    const answers = await Promise.all(['ts', 'py'].map(async (role) => {
      const res = await request(urlOf(role), { method: 'POST', headers: { 'content-type': 'application/json' }, body })
      const text = await res.body.text()
      return { status: res.statusCode, output: res.statusCode === 200 ? JSON.parse(text).output : undefined }
    }))
    const expected = { status, output: status === 200 ? { q: 1 } : undefined }
    assert.deepEqual(answers, [expected, expected], what)
  }
})
