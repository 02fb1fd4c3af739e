// A property of the live event stream, GET /api/events (README "Live events: GET /api/events",
// docs/protocol.md "Event stream and instance_id"), against a real Toolport on 127.0.0.1: random
// sequences of register, unregister and clear (for every role or one) over HTTP, tool calls over
// HTTP to a real callback server that answer, fail as tools, fail with HTTP 500, are refused for
// their arguments, name no tool, or find nothing listening (so that an origin is evicted, R13),
// and a role added and removed; some roles have a live MCP session (the official SDK over
// Streamable HTTP), so their changes are `sync` events. Meanwhile subscribers with random
// `?role=` and `?types=` filters read the stream over real sockets, stall, drop their connection
// at random points (some while a request is under way) and come back with the Last-Event-ID they
// last saw, with an id of another instance, or with none.
//
// One unfiltered subscriber that stays from the first event to the last is the oracle:
// - what it gets is what the model of each request says happened, request by request: one
//   `registered` per registration, `unregistered`/`cleared`/`evicted` per origin and source, one
//   `sync` per change of a role with a session, one `call` per call (metadata only, R14), and
//   nothing else; every event but `call` has an id of this instance, in increasing order;
// and every subscriber, the oracle and a crowd of plain ones included, on each connection:
// - gets `hello` first, with this instance's `instance_id` (as in GET /api/health) and version;
//   without a usable Last-Event-ID (none, or one of another instance) `hello` replays nothing and
//   carries the id it resumes from; with its own last id, `hello` has no id and says whether the
//   replay is `complete` or `partial` (the ring of `events.replaySize` events no longer held the
//   oldest missed one) and how many events follow it;
// - then exactly the missed events the ring still holds that pass its filter, then the live
//   events that pass it, in the stream's order, with no gap and no duplicate (a connection the
//   subscriber dropped holds a prefix of that);
// - and over all its connections, events with increasing ids and never one twice.
// `call` events are never replayed (README): the ones sent while a subscriber was away are gone.
// Also: every run is a new Toolport with an instance_id of its own; each call that reached the
// callback server did so once; a run makes far fewer calls than `events.maxCallEventsPerSecond`.
//
// Steps run one after another (each request answered before the next is sent), so the events of
// a step are all published before the next begins, except the syncs of an eviction, which run
// after its call is answered and are waited for. What a connection made during a step (some are)
// may begin anywhere in that step, which the check allows for: its hello's last_event_id says
// where. The checks are on contents and order only; time decides nothing but the hang guards.
//
// Two more tests without random input: a subscriber that stops reading is dropped once it leaves
// `events.maxSubscriberBufferBytes` unread while the others lose nothing, and replays the rest
// when it comes back; and concurrent registrations (cases the property found, fixed since).
import assert from 'node:assert/strict'
import { request as httpRequest, type ClientRequest, type IncomingMessage } from 'node:http'
import { test, type TestContext } from 'node:test'
import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { isDeepStrictEqual } from 'node:util'
import fc from 'fast-check'
import { createParser, type EventSourceMessage } from 'eventsource-parser'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { Toolport } from '../../src/main/index.js'
import { closedPort, type CallbackServer } from '../fixtures/callback-server.js'
import { callbackServer, createTestToolport, httpJson, within, type JsonReply } from '../helpers.js'

/** Generous bounds on waits: a run that does not settle fails instead of hanging the file. */
const GUARD_MS = 10_000
/** Shrinking re-runs real Toolports: bounded, so a failure's report comes within the timeout. */
const MAX_SHRINKS = 30
const FAILING_TIMEOUT_MS = 600_000

const ROLE_POOL = ['Lanlan', 'Mochi', 'Nova'] as const
/** A role added and removed during a run (tp.roles.add / tp.roles.remove). */
const GHOST = 'Ghost'
/** What a `?role=` filter may name: a role of the run, one that is not there (yet), the ghost. */
const FILTER_ROLES = [...ROLE_POOL, GHOST] as const
const NAMES = ['weather', 'search', 'notes'] as const
/** The name a call uses when it names no tool. */
const UNKNOWN_TOOL = 'no_such_tool'
const SOURCES = ['plugin:a', 'plugin:b', 'external'] as const
/** Where a tool's callback goes: a route of the callback server, or a port with nothing listening. */
const ROUTES = ['echo', 'tool-error', 'status/500', 'dead'] as const
type Route = typeof ROUTES[number]
const PARAMETERS = { type: 'object', properties: { n: { type: 'integer' } }, required: ['n'] }
const EVICTION_THRESHOLD = 3

/** Every event type but `hello`, which always comes. */
const TYPES = ['registered', 'unregistered', 'cleared', 'evicted', 'sync', 'call', 'role-added', 'role-removed'] as const
const CHANGE_TYPES: ReadonlySet<string> = new Set(['registered', 'unregistered', 'cleared', 'evicted'])

/** The fields of each event's data, as the README's table lists them. */
const CHANGE_FIELDS = ['origin', 'roles', 'source', 'tools']
const FIELDS: Record<string, string[]> = {
  hello: ['instance_id', 'last_event_id', 'replay', 'replayed', 'version'],
  registered: CHANGE_FIELDS,
  unregistered: CHANGE_FIELDS,
  cleared: CHANGE_FIELDS,
  evicted: [...CHANGE_FIELDS, 'failures'].sort(),
  sync: ['duration_ms', 'error', 'failures', 'ok', 'role', 'sessions'],
  call: ['bytes', 'duration_ms', 'is_error', 'outcome', 'role', 'source', 'tool'],
  'role-added': ['role'],
  'role-removed': ['role']
}

/** One event as a subscriber parsed it. */
interface Item { id: string | undefined, event: string, data: any }

interface Filter { role: string | null, types: readonly string[] | null }

function streamUrl (base: string, filter: Filter): string {
  const url = new URL('/api/events', base)
  if (filter.role !== null) url.searchParams.set('role', filter.role)
  if (filter.types !== null) url.searchParams.set('types', filter.types.join(','))
  return url.href
}

/** Whether an event concerns `role` (README: `?role=NAME` keeps the events that concern that role). */
function concerns (item: Item, role: string): boolean {
  if (CHANGE_TYPES.has(item.event)) return Array.isArray(item.data.roles) && item.data.roles.includes(role)
  return item.data.role === role
}

/** Whether a filter keeps an event (`hello` comes anyway, first). */
function passes (filter: Filter, item: Item): boolean {
  if (filter.types !== null && !filter.types.includes(item.event)) return false
  if (filter.role !== null && !concerns(item, filter.role)) return false
  return true
}

/**
 * What the model predicts of an event: everything but the measured `duration_ms` and `bytes`.
 * The order of `tools` and `roles` within one event is not part of the contract.
 */
function canon (event: string, data: any): string {
  if (CHANGE_TYPES.has(event)) {
    const tools = Array.isArray(data.tools) ? data.tools.map((t: any) => `${t.role}/${t.name}`).sort() : data.tools
    const roles = Array.isArray(data.roles) ? [...data.roles].sort() : data.roles
    return JSON.stringify([event, data.origin, data.source, tools, roles, data.failures ?? null])
  }
  if (event === 'sync') return JSON.stringify([event, data.role, data.sessions, data.ok, data.failures, data.error])
  if (event === 'call') return JSON.stringify([event, data.role, data.tool, data.source, data.outcome, data.is_error])
  return JSON.stringify([event, data.role])
}

/** The number of an id `<instance>-<n>`, and the instance part. */
function splitId (id: string): { tag: string, n: number } {
  const dash = id.lastIndexOf('-')
  return { tag: id.slice(0, dash), n: Number(id.slice(dash + 1)) }
}

function parseData (text: string): any {
  try {
    return JSON.parse(text)
  } catch {
    return { unparsable: text }
  }
}

interface RunState {
  /** Set once the test closes Toolport: streams that end after it did not end early. */
  isClosing: boolean
}

/** One connection to the stream over a real socket (node:http, no agent), parsed with eventsource-parser. */
class Stream {
  readonly items: Item[] = []
  status = 0
  /** The connection has ended. */
  isEnded = false
  /** It ended while the test neither dropped it nor was closing Toolport. */
  isEndedEarly = false
  /** The test dropped it: nothing it would still have read counts. */
  isDropped = false
  isPaused = false
  readonly ended: Promise<void>
  readonly #request: ClientRequest
  #response: IncomingMessage | null = null
  readonly #waiters: Array<() => void> = []

  constructor (url: string, lastEventId: string | undefined, run: RunState) {
    const parser = createParser({
      onEvent: (message: EventSourceMessage) => {
        if (this.isDropped) return
        this.items.push({ id: message.id, event: message.event ?? 'message', data: parseData(message.data) })
        this.#wake()
      }
    })
    const headers: Record<string, string> = { accept: 'text/event-stream' }
    if (lastEventId !== undefined) headers['last-event-id'] = lastEventId
    this.#request = httpRequest(url, { agent: false, headers })
    this.#request.on('error', () => {})
    this.ended = new Promise<void>((resolve) => {
      this.#request.once('close', () => {
        this.isEnded = true
        if (!this.isDropped && !run.isClosing) this.isEndedEarly = true
        this.#wake()
        resolve()
      })
    })
    this.#request.once('response', (response: IncomingMessage) => {
      this.#response = response
      this.status = response.statusCode ?? 0
      response.setEncoding('utf8')
      response.on('data', (chunk: string) => { if (!this.isDropped) parser.feed(chunk) })
      response.on('error', () => {})
      this.#wake()
    })
    this.#request.end()
  }

  /** Waits until `predicate` holds (re-checked on every event), failing after GUARD_MS. */
  async until (what: string, predicate: () => boolean, timeoutMs = GUARD_MS): Promise<void> {
    const deadline = Date.now() + timeoutMs
    while (!predicate()) {
      const left = deadline - Date.now()
      if (left <= 0) {
        throw new Error(`timed out waiting for ${what}; got ${this.items.length} events: ${this.items.slice(-5).map((i) => `${i.id ?? '-'} ${i.event}`).join(', ')}`)
      }
      await Promise.race([new Promise<void>((resolve) => this.#waiters.push(resolve)), sleep(Math.min(left, 50))])
    }
  }

  /** The test drops the connection: what was parsed so far is what this connection got. */
  drop (): void {
    this.isDropped = true
    this.#request.destroy()
  }

  pause (): void {
    this.isPaused = true
    this.#response?.pause()
  }

  resume (): void {
    this.isPaused = false
    this.#response?.resume()
  }

  #wake (): void {
    for (const wake of this.#waiters.splice(0)) wake()
  }
}

type HeaderKind = 'own' | 'foreign' | 'none'

interface Connection {
  stream: Stream
  header: { kind: HeaderKind, id: string | undefined }
  /**
   * Bounds of where in the oracle's record (events after its hello) the subscription began: the
   * events published before the request was sent, and before the step it overlapped ended.
   */
  p0: number
  p1: number
}

class Subscriber {
  readonly connections: Connection[] = []
  constructor (readonly label: string, readonly filter: Filter) {}

  /** The connection open now, if any. */
  get current (): Connection | null {
    const last = this.connections.at(-1)
    return last !== undefined && !last.stream.isDropped && !last.stream.isEnded ? last : null
  }

  /** The id of the last event with an id it received, on any connection. */
  lastId (): string | undefined {
    for (let c = this.connections.length - 1; c >= 0; c--) {
      const items = (this.connections[c] as Connection).stream.items
      for (let i = items.length - 1; i >= 0; i--) {
        const id = (items[i] as Item).id
        if (id !== undefined) return id
      }
    }
    return undefined
  }
}

// ---------------------------------------------------------------------------------------------
// The scenario and the model of what each step makes the stream say.

type Action =
  | { kind: 'register', name: number, role: number | null, source: number, route: Route }
  | { kind: 'unregister', name: number, role: number | null }
  | { kind: 'clear', source: number, role: number | null }
  /**
   * `name` NAMES.length names no tool; with `isPicked`, the tool is one the role has (when it has
   * one). Made `times` times in a row (three connection failures evict, R13).
   */
  | { kind: 'call', role: number, name: number, isPicked: boolean, isValid: boolean, times: number }
  /** Adds the ghost role when it is not there, else removes it. */
  | { kind: 'ghost' }

interface Op {
  sub: number
  /** `away`: drop the connection and come back `steps` steps later; `stall`: stop reading for `steps` steps. */
  kind: 'away' | 'stall'
  steps: number
  /** The Last-Event-ID it comes back with: the last id it saw, an id of another instance, or none. */
  header: HeaderKind
  /** Drop, or come back, while a step's request is under way (after `delayMs`), not before it. */
  isConcurrentDrop: boolean
  isConcurrentBack: boolean
  delayMs: number
}

interface Step { action: Action, ops: Op[] }

interface FilterPlan { role: number | null, types: string[] | null }

interface Scenario {
  roleCount: number
  /** Which of the run's roles have an MCP session. */
  sessions: boolean[]
  replaySize: number
  subscribers: FilterPlan[]
  /** Unfiltered subscribers that only read, all the run long. */
  crowd: number
  steps: Step[]
}

const roleSelArb = fc.option(fc.nat(2), { nil: null, freq: 2 })

const actionArb: fc.Arbitrary<Action> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant('register' as const),
      name: fc.nat(NAMES.length - 1),
      role: roleSelArb,
      source: fc.nat(SOURCES.length - 1),
      route: fc.constantFrom(...ROUTES)
    })
  },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('unregister' as const), name: fc.nat(NAMES.length - 1), role: roleSelArb }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('clear' as const), source: fc.nat(SOURCES.length - 1), role: roleSelArb }) },
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant('call' as const),
      role: fc.nat(3),
      name: fc.nat(NAMES.length),
      isPicked: fc.oneof({ weight: 3, arbitrary: fc.constant(true) }, { weight: 1, arbitrary: fc.constant(false) }),
      isValid: fc.oneof({ weight: 4, arbitrary: fc.constant(true) }, { weight: 1, arbitrary: fc.constant(false) }),
      times: fc.integer({ min: 1, max: 3 })
    })
  },
  { weight: 1, arbitrary: fc.constant<Action>({ kind: 'ghost' }) }
)

const opArb: fc.Arbitrary<Op> = fc.record({
  sub: fc.nat(7),
  kind: fc.oneof({ weight: 4, arbitrary: fc.constant('away' as const) }, { weight: 1, arbitrary: fc.constant('stall' as const) }),
  steps: fc.oneof(
    { weight: 1, arbitrary: fc.integer({ min: 0, max: 3 }) },
    // Long enough, at times, to miss more than a ring of 16 events.
    { weight: 2, arbitrary: fc.integer({ min: 8, max: 30 }) }
  ),
  header: fc.oneof(
    { weight: 6, arbitrary: fc.constant<HeaderKind>('own') },
    { weight: 1, arbitrary: fc.constant<HeaderKind>('foreign') },
    { weight: 1, arbitrary: fc.constant<HeaderKind>('none') }
  ),
  isConcurrentDrop: fc.boolean(),
  isConcurrentBack: fc.boolean(),
  delayMs: fc.integer({ min: 0, max: 3 })
})

const filterArb: fc.Arbitrary<FilterPlan> = fc.record({
  role: fc.option(fc.nat(FILTER_ROLES.length - 1), { nil: null }),
  types: fc.option(fc.tuple(fc.subarray([...TYPES], { minLength: 1 }), fc.boolean())
    .map(([types, withHello]) => withHello ? ['hello', ...types] : types), { nil: null })
})

const scenarioArb: fc.Arbitrary<Scenario> = fc.record({
  roleCount: fc.integer({ min: 1, max: 3 }),
  sessions: fc.array(
    fc.oneof({ weight: 2, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
    { minLength: 3, maxLength: 3 }
  ),
  replaySize: fc.oneof({ weight: 2, arbitrary: fc.constant(16) }, { weight: 1, arbitrary: fc.constant(2048) }),
  subscribers: fc.array(filterArb, { minLength: 1, maxLength: 4 }),
  crowd: fc.integer({ min: 0, max: 8 }),
  steps: fc.array(fc.record({ action: actionArb, ops: fc.array(opArb, { maxLength: 2 }) }),
    { minLength: 1, maxLength: 40, size: 'max' })
})

interface Entry { source: string, origin: string, route: Route }

/** One predicted event; for `call`, what its `bytes` may be. */
interface Expected { canon: string, bytes: 'zero' | 'positive' | 'any' | null }

/** The events one step publishes, from `start` in the oracle's record. */
interface Group { label: string, start: number, expected: Expected[] }

function event (type: string, data: object): Expected {
  return { canon: canon(type, data), bytes: null }
}

/** The contract's view of the registries, the origin health and what each step makes the stream say. */
class Model {
  readonly roles: string[]
  readonly groups: Group[] = []
  /** Events published since the oracle's hello. */
  count = 0
  /** Call ids whose call reaches the callback server (each exactly once). */
  readonly reaching: string[] = []
  readonly #registries = new Map<string, Map<string, Entry>>()
  readonly #sessions: ReadonlySet<string>
  readonly #live: string
  readonly #dead: string
  /** Consecutive connection failures of calls to `plugin:` tools at the dead origin (R13). */
  #deadFailures = 0

  constructor (roles: readonly string[], sessions: ReadonlySet<string>, live: string, dead: string) {
    this.roles = [...roles]
    for (const role of roles) this.#registries.set(role, new Map())
    this.#sessions = sessions
    this.#live = live
    this.#dead = dead
  }

  add (label: string, expected: Expected[]): Group {
    const group = { label, start: this.count, expected }
    this.groups.push(group)
    this.count += expected.length
    return group
  }

  role (index: number): string {
    return this.roles[index % this.roles.length] as string
  }

  targets (selection: number | null): string[] {
    return selection === null ? [...this.roles] : [this.role(selection)]
  }

  registry (role: string): Map<string, Entry> {
    return this.#registries.get(role) as Map<string, Entry>
  }

  originOf (route: Route): string {
    return route === 'dead' ? this.#dead : this.#live
  }

  callbackUrl (route: Route): string {
    return route === 'dead' ? `${this.#dead}/gone` : `${this.#live}/${route}`
  }

  /** A `sync` per role that changed and has a session (docs/protocol.md "Sync"). */
  syncs (changed: readonly string[]): Expected[] {
    return changed.filter((role) => this.#sessions.has(role))
      .map((role) => event('sync', { role, sessions: 1, ok: true, failures: 0, error: null }))
  }

  /** Removals as the stream announces them: one event per origin and source. */
  removals (type: string, removed: ReadonlyArray<{ role: string, name: string, entry: Entry }>,
    failures?: number): Expected[] {
    const batches = new Map<string, { origin: string, source: string, tools: object[], roles: string[] }>()
    for (const { role, name, entry } of removed) {
      const key = `${entry.origin}\0${entry.source}`
      let batch = batches.get(key)
      if (batch === undefined) {
        batch = { origin: entry.origin, source: entry.source, tools: [], roles: [] }
        batches.set(key, batch)
      }
      batch.tools.push({ role, name })
      if (!batch.roles.includes(role)) batch.roles.push(role)
    }
    return [...batches.values()].map((batch) => event(type, failures === undefined ? batch : { ...batch, failures }))
  }

  register (name: string, targets: readonly string[], source: string, route: Route): Expected[] {
    const origin = this.originOf(route)
    for (const role of targets) this.registry(role).set(name, { source, origin, route })
    // Any new registration at an origin resets its count (docs/protocol.md "Eviction").
    if (origin === this.#dead) this.#deadFailures = 0
    return [
      event('registered', { origin, source, tools: targets.map((role) => ({ role, name })), roles: targets }),
      ...this.syncs(targets)
    ]
  }

  unregister (name: string, targets: readonly string[]): { expected: Expected[], removed: boolean } {
    const removed: Array<{ role: string, name: string, entry: Entry }> = []
    for (const role of targets) {
      const entry = this.registry(role).get(name)
      if (entry === undefined) continue
      this.registry(role).delete(name)
      removed.push({ role, name, entry })
    }
    const changed = [...new Set(removed.map((r) => r.role))]
    return { expected: [...this.removals('unregistered', removed), ...this.syncs(changed)], removed: removed.length > 0 }
  }

  clear (source: string, targets: readonly string[]): { expected: Expected[], removed: number } {
    const removed: Array<{ role: string, name: string, entry: Entry }> = []
    for (const role of targets) {
      for (const [name, entry] of this.registry(role)) {
        if (entry.source === source) removed.push({ role, name, entry })
      }
      for (const { name } of removed.filter((r) => r.role === role)) this.registry(role).delete(name)
    }
    const changed = [...new Set(removed.map((r) => r.role))]
    return { expected: [...this.removals('cleared', removed), ...this.syncs(changed)], removed: removed.length }
  }

  /**
   * A call: its `call` event, and when it is the threshold's connection failure at the dead
   * origin, the eviction of every `plugin:` tool there (its syncs run in the background).
   */
  call (role: string, name: string, isValid: boolean, callId: string): {
    expected: Expected[]
    isError: boolean
    background: boolean
  } {
    const entry = this.registry(role).get(name)
    const call = (tool: string | null, source: string | null, outcome: string, isError: boolean,
      bytes: Expected['bytes']): Expected => ({
      canon: canon('call', { role, tool, source, outcome, is_error: isError }),
      bytes
    })
    if (entry === undefined) return { expected: [call(null, null, 'unknown_tool', true, 'zero')], isError: true, background: false }
    if (!isValid) {
      return { expected: [call(name, entry.source, 'invalid_arguments', true, 'zero')], isError: true, background: false }
    }
    switch (entry.route) {
      case 'echo':
        this.reaching.push(callId)
        return { expected: [call(name, entry.source, 'ok', false, 'positive')], isError: false, background: false }
      case 'tool-error':
        this.reaching.push(callId)
        return { expected: [call(name, entry.source, 'ok', true, 'positive')], isError: true, background: false }
      case 'status/500':
        this.reaching.push(callId)
        return { expected: [call(name, entry.source, 'http', true, 'any')], isError: true, background: false }
      case 'dead': {
        const expected = [call(name, entry.source, 'connect', true, 'zero')]
        // Only calls to `plugin:` tools count (docs/protocol.md "Eviction").
        if (!entry.source.startsWith('plugin:')) return { expected, isError: true, background: false }
        this.#deadFailures++
        if (this.#deadFailures < EVICTION_THRESHOLD) return { expected, isError: true, background: false }
        this.#deadFailures = 0
        const removed: Array<{ role: string, name: string, entry: Entry }> = []
        for (const r of this.roles) {
          for (const [n, e] of this.registry(r)) {
            if (e.origin === this.#dead && e.source.startsWith('plugin:')) removed.push({ role: r, name: n, entry: e })
          }
          for (const gone of removed.filter((x) => x.role === r)) this.registry(r).delete(gone.name)
        }
        const changed = [...new Set(removed.map((r) => r.role))]
        const syncs = this.syncs(changed)
        return {
          expected: [...expected, ...this.removals('evicted', removed, EVICTION_THRESHOLD), ...syncs],
          isError: true,
          background: syncs.length > 0
        }
      }
    }
  }

  /** Adds the ghost role, or removes it (with its registry) when it is there. */
  ghost (): { expected: Expected[], isAdded: boolean } {
    if (this.roles.includes(GHOST)) {
      this.roles.splice(this.roles.indexOf(GHOST), 1)
      this.#registries.delete(GHOST)
      return { expected: [event('role-removed', { role: GHOST })], isAdded: false }
    }
    this.roles.push(GHOST)
    this.#registries.set(GHOST, new Map())
    return { expected: [event('role-added', { role: GHOST })], isAdded: true }
  }
}

// ---------------------------------------------------------------------------------------------
// Running a scenario.

interface Shared {
  callback: CallbackServer
  deadOrigin: string
  /** Every instance_id seen so far (each run is a new Toolport). */
  instances: Set<string>
  /** An event id of an earlier run's instance, for Last-Event-ID of "another instance". */
  foreignId: string | null
  runs: number
}

interface Tally {
  runs: number
  steps: number
  events: number
  calls: number
  connections: number
  replays: Map<string, number>
  evictions: number
  syncs: number
  mostSubscribers: number
}

interface Run extends RunState {
  tp: Toolport
  url: string
  instanceId: string
  version: string
  replaySize: number
  foreignId: string
}

/** `promise`, or a failure naming `what` after GUARD_MS. */
async function guarded<T> (promise: Promise<T>, what: string): Promise<T> {
  return await within(promise, what, GUARD_MS)
}

async function expectOk (reply: Promise<JsonReply>, what: string): Promise<JsonReply> {
  const answer = await reply
  assert.equal(answer.statusCode, 200, `${what}: ${JSON.stringify(answer.body)}`)
  return answer
}

/** Opens a connection for `sub` and waits for its hello. */
async function connect (run: Run, sub: Subscriber, kind: HeaderKind, p0: number): Promise<Connection> {
  let id: string | undefined
  if (kind === 'own') id = sub.lastId()
  if (kind === 'foreign') id = run.foreignId
  const header = { kind: id === undefined ? 'none' as const : kind, id }
  const stream = new Stream(streamUrl(run.url, sub.filter), id, run)
  const connection: Connection = { stream, header, p0, p1: p0 }
  sub.connections.push(connection)
  await stream.until(`${sub.label}: hello`, () => stream.items.length > 0 || stream.isEnded)
  assert.equal(stream.status, 200, `${sub.label}: GET /api/events answered ${stream.status}`)
  return connection
}

async function connectMcp (url: string, role: string): Promise<Client> {
  const client = new Client({ name: 'events-properties', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/${encodeURIComponent(role)}`)))
  return client
}

async function runScenario (t: TestContext, shared: Shared, scenario: Scenario, tally: Tally): Promise<void> {
  const roles = ROLE_POOL.slice(0, scenario.roleCount)
  const sessionRoles = new Set(roles.filter((_, i) => scenario.sessions[i] === true))
  const tp = await createTestToolport(t, {
    roles: [...roles],
    evictionThreshold: EVICTION_THRESHOLD,
    events: { replaySize: scenario.replaySize }
  })
  const clients: Client[] = []
  const subscribers: Subscriber[] = []
  const runNumber = ++shared.runs
  try {
    const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
    const health = await expectOk(httpJson(`${url}/api/health`, 'GET'), 'GET /api/health')
    const instanceId = String(health.body.instance_id)
    assert.ok(!shared.instances.has(instanceId), `instance_id ${instanceId} was already used by an earlier Toolport`)
    shared.instances.add(instanceId)
    const run: Run = {
      tp,
      url,
      instanceId,
      version: String(health.body.version),
      replaySize: scenario.replaySize,
      isClosing: false,
      foreignId: shared.foreignId ?? 'deadbeef-1'
    }
    const model = new Model(roles, sessionRoles, shared.callback.origin, shared.deadOrigin)

    // The oracle, before anything happens; then the sessions, whose attach is a sync each.
    const oracle = new Subscriber('oracle', { role: null, types: null })
    subscribers.push(oracle)
    const oracleConnection = await connect(run, oracle, 'none', 0)
    const oracleHello = oracleConnection.stream.items[0] as Item
    assert.notEqual(splitId(run.foreignId).tag, splitId(oracleHello.id ?? '').tag, 'the foreign id is of another instance')
    const barrier = async (): Promise<void> => {
      await oracleConnection.stream.until(`the oracle to get ${model.count} events`,
        () => oracleConnection.stream.items.length >= 1 + model.count || oracleConnection.stream.isEnded)
    }
    for (const role of sessionRoles) {
      clients.push(await connectMcp(url, role))
      model.add(`MCP session on ${role}`, model.syncs([role]))
      await barrier()
    }

    const active = scenario.subscribers.map((plan, i) => new Subscriber(`subscriber ${i} ${JSON.stringify({
      role: plan.role === null ? null : FILTER_ROLES[plan.role],
      types: plan.types
    })}`, { role: plan.role === null ? null : FILTER_ROLES[plan.role] as string, types: plan.types }))
    const crowd = Array.from({ length: scenario.crowd }, (_, i) => new Subscriber(`crowd ${i}`, { role: null, types: null }))
    subscribers.push(...active, ...crowd)
    await Promise.all([...active, ...crowd].map((sub) => connect(run, sub, 'none', model.count)))
    tally.mostSubscribers = Math.max(tally.mostSubscribers, 1 + active.length + crowd.length)

    /** Subscribers away (dropped), until the step they come back at; subscribers not reading, until when. */
    const away = new Map<Subscriber, { until: number, header: HeaderKind, isConcurrent: boolean, delayMs: number }>()
    const stalled = new Map<Subscriber, number>()
    interface Move { kind: 'drop' | 'back' | 'pause' | 'resume', sub: Subscriber, header: HeaderKind, isConcurrent: boolean, delayMs: number }
    /** Does a move; returns the connection it opened, if it opened one. */
    const move = async (m: Move, p0: number): Promise<Connection | null> => {
      const current = m.sub.current
      switch (m.kind) {
        case 'drop':
          current?.stream.drop()
          return null
        case 'pause':
          current?.stream.pause()
          return null
        case 'resume':
          current?.stream.resume()
          return null
        case 'back':
          return await connect(run, m.sub, m.header, p0)
      }
    }

    let calls = 0
    const perform = async (action: Action): Promise<boolean> => {
      switch (action.kind) {
        case 'register': {
          const name = NAMES[action.name] as string
          const source = SOURCES[action.source] as string
          const targets = model.targets(action.role)
          const body: Record<string, unknown> = {
            name, source, callback_url: model.callbackUrl(action.route), parameters: PARAMETERS
          }
          if (action.role !== null) body.role = targets[0]
          const reply = await expectOk(httpJson(`${url}/api/tools/register`, 'POST', body), 'register')
          assert.equal(reply.body.ok, true, JSON.stringify(reply.body))
          model.add(`register ${JSON.stringify(body)}`, model.register(name, targets, source, action.route))
          return false
        }
        case 'unregister': {
          const name = NAMES[action.name] as string
          const targets = model.targets(action.role)
          const body: Record<string, unknown> = { name }
          if (action.role !== null) body.role = targets[0]
          const reply = await expectOk(httpJson(`${url}/api/tools/unregister`, 'POST', body), 'unregister')
          const { expected, removed } = model.unregister(name, targets)
          assert.equal(reply.body.removed, removed, `unregister ${JSON.stringify(body)}: the model says removed ${String(removed)}`)
          model.add(`unregister ${JSON.stringify(body)}`, expected)
          return false
        }
        case 'clear': {
          const source = SOURCES[action.source] as string
          const targets = model.targets(action.role)
          const body: Record<string, unknown> = { source }
          if (action.role !== null) body.role = targets[0]
          const reply = await expectOk(httpJson(`${url}/api/tools/clear`, 'POST', body), 'clear')
          const { expected, removed } = model.clear(source, targets)
          assert.equal(reply.body.removed, removed, `clear ${JSON.stringify(body)}: the model says ${removed} removed`)
          model.add(`clear ${JSON.stringify(body)}`, expected)
          return false
        }
        case 'call': {
          const role = model.role(action.role)
          const has = [...model.registry(role).keys()]
          const name = action.isPicked && has.length > 0
            ? has[action.name % has.length] as string
            : NAMES[action.name] ?? UNKNOWN_TOOL
          let background = false
          for (let i = 0; i < action.times; i++) {
            const callId = `run${runNumber}-call${++calls}`
            const body: Record<string, unknown> = {
              role, name, call_id: callId, arguments: action.isValid ? { n: 1 } : { n: 'one' }
            }
            const reply = await expectOk(httpJson(`${url}/api/tools/call`, 'POST', body), 'call')
            const answer = model.call(role, name, action.isValid, callId)
            assert.equal(reply.body.is_error, answer.isError, `call ${JSON.stringify(body)}: ${JSON.stringify(reply.body)}`)
            model.add(`call ${JSON.stringify(body)}`, answer.expected)
            // An eviction's syncs run after its call is answered: let them land before the next call.
            if (answer.background) await barrier()
            background ||= answer.background
          }
          return background
        }
        case 'ghost': {
          const { expected, isAdded } = model.ghost()
          if (isAdded) tp.roles.add(GHOST)
          else assert.equal(tp.roles.remove(GHOST), true)
          model.add(isAdded ? `add role ${GHOST}` : `remove role ${GHOST}`, expected)
          return false
        }
      }
    }

    for (const [i, step] of scenario.steps.entries()) {
      // At most one move per subscriber and step.
      const moves: Move[] = []
      const busy = new Set<Subscriber>()
      for (const [sub, back] of away) {
        if (back.until !== i) continue
        away.delete(sub)
        busy.add(sub)
        moves.push({ kind: 'back', sub, header: back.header, isConcurrent: back.isConcurrent, delayMs: back.delayMs })
      }
      for (const [sub, until] of stalled) {
        if (until !== i) continue
        stalled.delete(sub)
        busy.add(sub)
        moves.push({ kind: 'resume', sub, header: 'none', isConcurrent: false, delayMs: 0 })
      }
      for (const op of step.ops) {
        const sub = active[op.sub % active.length] as Subscriber
        if (busy.has(sub) || away.has(sub) || stalled.has(sub) || sub.current === null) continue
        busy.add(sub)
        if (op.kind === 'away') {
          moves.push({ kind: 'drop', sub, header: 'none', isConcurrent: op.isConcurrentDrop, delayMs: op.delayMs })
          away.set(sub, {
            until: i + 1 + op.steps, header: op.header, isConcurrent: op.isConcurrentBack, delayMs: op.delayMs
          })
        } else {
          moves.push({ kind: 'pause', sub, header: 'none', isConcurrent: false, delayMs: 0 })
          stalled.set(sub, i + 1 + op.steps)
        }
      }
      for (const m of moves.filter((m) => !m.isConcurrent)) await move(m, model.count)
      const before = model.count
      const opened: Connection[] = []
      const [background] = await Promise.all([
        perform(step.action),
        ...moves.filter((m) => m.isConcurrent).map(async (m) => {
          await sleep(m.delayMs)
          const connection = await move(m, before)
          if (connection !== null) opened.push(connection)
        })
      ])
      for (const connection of opened) connection.p1 = model.count
      // An eviction's syncs run after its call is answered: let them land before the next step.
      if (background) await barrier()
    }

    // The end: everyone reads again, the oracle gets every event, the away come back.
    for (const sub of subscribers) sub.current?.stream.resume()
    await barrier()
    for (const [sub, back] of away) await connect(run, sub, back.header, model.count)
    const record = oracleConnection.stream.items.slice(1)
    checkOracle(run, model, oracleConnection.stream.items)
    const ledger = new Ledger(oracleHello, record)
    for (const sub of subscribers) {
      const last = sub.connections.at(-1) as Connection
      const hello = last.stream.items[0] as Item
      const replayed = Number(hello.data.replayed)
      const lengths = ledger.starts(last, hello).map((p) => ledger.live(p, sub.filter).length)
      // Nothing to wait for when the hello is already wrong: checkSubscriber says how.
      if (lengths.length === 0 || !Number.isSafeInteger(replayed)) continue
      const liveLength = Math.min(...lengths)
      await last.stream.until(`${sub.label}: every event of its last connection`,
        () => last.stream.items.length >= 1 + replayed + liveLength || last.stream.isEnded)
    }
    for (const client of clients.splice(0)) await client.close()
    run.isClosing = true
    await tp.close()
    await guarded(Promise.all(subscribers.flatMap((sub) => sub.connections.map(async (c) => { await c.stream.ended }))),
      'event streams still open after Toolport closed')

    for (const sub of subscribers) checkSubscriber(run, ledger, sub)
    // Each call that reached the plugin did so once, and no other did.
    const prefix = `run${runNumber}-`
    const reached = shared.callback.requests.map((r) => String(parseData(r.body).call_id))
      .filter((id) => id.startsWith(prefix)).sort()
    assert.deepEqual(reached, [...model.reaching].sort(), 'the calls that reached the callback server')

    tally.runs++
    tally.steps += scenario.steps.length
    tally.events += record.length
    tally.calls += calls
    for (const item of record) {
      if (item.event === 'evicted') tally.evictions++
      if (item.event === 'sync') tally.syncs++
    }
    for (const sub of subscribers) {
      tally.connections += sub.connections.length
      for (const c of sub.connections) {
        const replay = String((c.stream.items[0] as Item).data.replay)
        tally.replays.set(replay, (tally.replays.get(replay) ?? 0) + 1)
      }
    }
    const lastId = oracle.lastId()
    if (lastId !== undefined) shared.foreignId = lastId
  } finally {
    for (const client of clients) await client.close().catch(() => {})
    for (const sub of subscribers) for (const c of sub.connections) c.stream.drop()
    await tp.close()
  }
}

/** The oracle's record is, step by step, what the model says each step published. */
function checkOracle (run: Run, model: Model, items: readonly Item[]): void {
  const hello = items[0] as Item
  const record = items.slice(1)
  assert.equal(record.length, model.count,
    `the oracle got ${record.length} events after hello, the steps published ${model.count}: ${record.slice(model.count).map((i) => `${i.event} ${JSON.stringify(i.data)}`).join('; ')}`)
  const tag = splitId(hello.id ?? '').tag
  let previous = splitId(hello.id ?? '').n
  for (const [i, item] of record.entries()) {
    const what = `oracle event ${i} (${item.event} ${JSON.stringify(item.data)})`
    assert.ok(FIELDS[item.event] !== undefined && item.event !== 'hello', `${what}: not an event type of the stream here`)
    assert.deepEqual(Object.keys(item.data).sort(), FIELDS[item.event], `${what}: its fields`)
    if (item.event === 'call') {
      assert.equal(item.id, undefined, `${what}: a call event has no id`)
      continue
    }
    assert.ok(item.id !== undefined, `${what}: has an id`)
    const { tag: itsTag, n } = splitId(item.id)
    assert.equal(itsTag, tag, `${what}: an id of this instance`)
    assert.ok(Number.isSafeInteger(n) && n > previous, `${what}: id ${item.id} after ${previous}`)
    previous = n
    if (item.event === 'sync') assert.ok(Number.isFinite(item.data.duration_ms) && item.data.duration_ms >= 0, what)
  }
  for (const group of model.groups) {
    const got = record.slice(group.start, group.start + group.expected.length)
    assert.deepEqual(got.map((item) => canon(item.event, item.data)).sort(), group.expected.map((e) => e.canon).sort(),
      `the events of step "${group.label}"`)
    for (const item of got) {
      if (item.event !== 'call') continue
      const expected = group.expected.find((e) => e.canon === canon(item.event, item.data)) as Expected
      const bytes = item.data.bytes
      assert.ok(Number.isSafeInteger(bytes) && bytes >= 0, `${group.label}: bytes ${bytes}`)
      if (expected.bytes === 'zero') assert.equal(bytes, 0, `${group.label}: no callback reply was read`)
      if (expected.bytes === 'positive') assert.ok(bytes > 0, `${group.label}: the callback's reply was read`)
      assert.ok(Number.isFinite(item.data.duration_ms) && item.data.duration_ms >= 0, `${group.label}: duration_ms`)
    }
  }
  assert.equal(hello.data.instance_id, run.instanceId)
}

/** The oracle's record, indexed: which event each id is, and how many had ids before each position. */
class Ledger {
  /** The events with an id, in order. */
  readonly withId: Item[] = []
  readonly #record: readonly Item[]
  /** id → how many events with an id were published up to and including it (the oracle's hello: 0). */
  readonly #counts = new Map<string, number>()
  /** Events with an id among the first p of the record. */
  readonly #before: number[] = [0]

  constructor (hello: Item, record: readonly Item[]) {
    this.#record = record
    this.#counts.set(hello.id as string, 0)
    for (const item of record) {
      if (item.id !== undefined) {
        this.withId.push(item)
        this.#counts.set(item.id, this.withId.length)
      }
      this.#before.push(this.withId.length)
    }
  }

  count (id: string | undefined): number | undefined {
    return id === undefined ? undefined : this.#counts.get(id)
  }

  /**
   * Where in the record a connection's live events may begin: a position within its bounds at
   * which exactly as many events with an id had been published as its hello says.
   */
  starts (connection: Connection, hello: Item): number[] {
    const k = this.count(hello.data.last_event_id)
    const found: number[] = []
    for (let p = connection.p0; p <= connection.p1 && p <= this.#record.length; p++) {
      if (this.#before[p] === k) found.push(p)
    }
    return found
  }

  live (p: number, filter: Filter): Item[] {
    return this.#record.slice(p).filter((item) => passes(filter, item))
  }
}

function brief (items: readonly Item[]): string {
  return items.map((i) => `${i.id ?? '-'} ${i.event}`).join(', ')
}

/** Every connection of a subscriber got what the contract says, and its events never repeat or go back. */
function checkSubscriber (run: Run, ledger: Ledger, sub: Subscriber): void {
  let previous = -1
  for (const [c, connection] of sub.connections.entries()) {
    const what = `${sub.label}, connection ${c} (Last-Event-ID: ${connection.header.id ?? 'none'}, ${connection.header.kind})`
    const items = connection.stream.items
    assert.equal(connection.stream.isEndedEarly, false, `${what}: the stream ended while the subscriber was reading it`)
    const hello = items[0] as Item
    assert.equal(hello.event, 'hello', `${what}: hello comes first`)
    assert.deepEqual(Object.keys(hello.data).sort(), FIELDS.hello, `${what}: hello's fields`)
    assert.equal(hello.data.instance_id, run.instanceId, `${what}: hello's instance_id is GET /api/health's`)
    assert.equal(hello.data.version, run.version, `${what}: hello's version is GET /api/health's`)
    const newest = ledger.count(hello.data.last_event_id)
    assert.ok(newest !== undefined, `${what}: hello's last_event_id ${hello.data.last_event_id} is an id of this stream`)

    let replay: Item[] = []
    const own = connection.header.kind === 'own' ? ledger.count(connection.header.id) : undefined
    if (connection.header.kind === 'own') {
      assert.ok(own !== undefined, `${what}: its Last-Event-ID is an id it was sent`)
      // The ring holds the last replaySize events; the first missed one is the own + 1st.
      const oldest = Math.max(0, newest - run.replaySize)
      replay = ledger.withId.slice(Math.max(own, oldest), newest).filter((item) => passes(sub.filter, item))
      assert.equal(hello.id, undefined, `${what}: a replaying hello has no id`)
      assert.equal(hello.data.replay, own >= oldest ? 'complete' : 'partial',
        `${what}: missed events ${own + 1}..${newest}, the ring holds ${oldest + 1}..${newest}`)
    } else {
      // None, or an id of another instance: nothing replayed, and hello carries where it resumes.
      assert.equal(hello.data.replay, 'none', what)
      assert.equal(hello.id, hello.data.last_event_id, `${what}: hello carries the id it resumes from`)
    }
    assert.equal(hello.data.replayed, replay.length, `${what}: replayed`)
    assert.deepEqual(items.slice(1, 1 + replay.length), replay, `${what}: the replay is the missed events the ring holds`)

    const live = items.slice(1 + replay.length)
    const isLast = c === sub.connections.length - 1
    const starts = ledger.starts(connection, hello)
    assert.ok(starts.length > 0, `${what}: hello's last_event_id is not where the connection began (positions ${connection.p0}..${connection.p1})`)
    const fits = starts.some((p) => {
      const expected = ledger.live(p, sub.filter)
      // The last connection was read to the end; one the subscriber dropped holds a prefix.
      return isDeepStrictEqual(live, isLast ? expected : expected.slice(0, live.length))
    })
    if (!fits) {
      const expected = ledger.live(starts[0] as number, sub.filter)
      assert.deepEqual(brief(live), brief(isLast ? expected : expected.slice(0, live.length)),
        `${what}: the live events are the stream's, filtered, from where it began, without gap or duplicate`)
      assert.deepEqual(live, isLast ? expected : expected.slice(0, live.length), what)
    }

    // Over all its connections: increasing ids, none twice.
    for (const item of items.slice(1)) {
      assert.notEqual(item.event, 'hello', `${what}: hello comes once, first`)
      if (item.id === undefined) continue
      const { n } = splitId(item.id)
      assert.ok(n > previous, `${what}: event ${item.id} after ${previous}`)
      previous = n
    }
  }
}

test('property: under random changes, calls, filters, drops and reconnects every subscriber gets every event its filter keeps, in order, once', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const callback = await callbackServer(t)
  const shared: Shared = {
    callback,
    deadOrigin: `http://127.0.0.1:${await closedPort()}`,
    instances: new Set(),
    foreignId: null,
    runs: 0
  }
  const tally: Tally = {
    runs: 0,
    steps: 0,
    events: 0,
    calls: 0,
    connections: 0,
    replays: new Map(),
    evictions: 0,
    syncs: 0,
    mostSubscribers: 0
  }
  await fc.assert(fc.asyncProperty(fc.limitShrink(scenarioArb, MAX_SHRINKS), async (scenario) => {
    await runScenario(t, shared, scenario, tally)
  }), { numRuns: 20, includeErrorInReport: true })
  const replays = [...tally.replays].sort(([a], [b]) => a.localeCompare(b)).map(([k, n]) => `${k} ${n}`).join(', ')
  t.diagnostic(`${tally.runs} runs, ${tally.steps} steps, ${tally.calls} calls, ${tally.events} events (${tally.evictions} evicted, ${tally.syncs} sync), ${tally.connections} connections (hello replay: ${replays}), up to ${tally.mostSubscribers} subscribers at once`)
})

test('a subscriber that stops reading is dropped past maxSubscriberBufferBytes, a reading one loses nothing, and the dropped one replays the rest when it comes back', { timeout: 120_000 }, async (t) => {
  // The ring holds every event of this test, so the comeback's replay is complete.
  const tp = await createTestToolport(t, {
    roles: ['Lanlan'],
    events: { replaySize: 262_144, maxSubscriberBufferBytes: 1024 }
  })
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  const state: RunState = { isClosing: false }
  const reader = new Stream(`${url}/api/events`, undefined, state)
  const stalled = new Stream(`${url}/api/events`, undefined, state)
  t.after(() => {
    state.isClosing = true
    reader.drop()
    stalled.drop()
  })
  await reader.until('hello', () => reader.items.length > 0)
  await stalled.until('hello', () => stalled.items.length > 0)
  assert.equal((stalled.items[0] as Item).id, (reader.items[0] as Item).id, 'both start from the same event')
  stalled.pause()

  // Role events are the cheapest to make (in-process, ~190 bytes each with a 128-character name).
  // The kernel's socket buffers take some MB before Toolport's own buffer fills; bounded at
  // 200 000 events (about 37 MB), stopping once the subscriber is dropped.
  let published = 0
  let stats = await expectOk(httpJson(`${url}/api/console/stats`, 'GET'), 'stats')
  for (let round = 0; round < 400 && stats.body.events.dropped === 0; round++) {
    for (let i = 0; i < 250; i++) {
      const name = `${published / 2 + i}-`.padEnd(128, 'x')
      tp.roles.add(name)
      tp.roles.remove(name)
    }
    published += 500
    await reader.until(`the reader to get ${published} events`, () => reader.items.length >= 1 + published || reader.isEnded)
    stats = await expectOk(httpJson(`${url}/api/console/stats`, 'GET'), 'stats')
  }
  assert.equal(stats.body.events.dropped, 1, `the stalled subscriber was dropped (${published} events published)`)
  assert.equal(stats.body.events.subscribers, 1, 'the reader is still subscribed')

  // The reader got every event, in order, each once.
  const all = reader.items.slice(1)
  assert.equal(all.length, published)
  let previous = splitId((reader.items[0] as Item).id as string).n
  for (const item of all) {
    assert.ok(item.event === 'role-added' || item.event === 'role-removed', item.event)
    const { n } = splitId(item.id as string)
    assert.ok(n > previous, `${item.id} after ${previous}`)
    previous = n
  }

  // The dropped subscriber reads what reached it before its connection was closed: a prefix.
  stalled.resume()
  await guarded(stalled.ended, 'the dropped subscriber\'s connection to end')
  assert.equal(stalled.isEndedEarly, true, 'Toolport ended the stalled subscriber\'s connection')
  const got = stalled.items.slice(1)
  assert.ok(got.length < published, `it got ${got.length} of ${published} events`)
  assert.deepEqual(got, all.slice(0, got.length), 'what it got is the stream, in order, without gap')

  // It comes back with the last id it saw and is sent exactly the rest.
  const lastSeen = got.at(-1)?.id ?? (stalled.items[0] as Item).id
  const back = new Stream(`${url}/api/events`, lastSeen, state)
  t.after(() => back.drop())
  const rest = published - got.length
  await back.until(`the ${rest} events it missed`, () => back.items.length >= 1 + rest || back.isEnded)
  const hello = back.items[0] as Item
  assert.equal(hello.event, 'hello')
  assert.equal(hello.data.replay, 'complete')
  assert.equal(hello.data.replayed, rest)
  assert.deepEqual(back.items.slice(1), all.slice(got.length))
})

/**
 * Registrations at once through the library (tp.register, as a host that embeds Toolport makes
 * them; over HTTP the same happens whenever the requests arrive while the schema compiles);
 * returns the `registered` events the stream sent for them.
 */
async function concurrentRegistrations (t: TestContext, bodies: ReadonlyArray<Record<string, unknown>>): Promise<{
  events: Item[]
  tp: Toolport
}> {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  const state: RunState = { isClosing: false }
  const stream = new Stream(`${url}/api/events?types=registered,role-added`, undefined, state)
  t.after(() => {
    state.isClosing = true
    stream.drop()
  })
  await stream.until('hello', () => stream.items.length > 0)
  // A schema no tool has had in this process: the registrations share its first compile.
  const parameters = { type: 'object', properties: { [`p${randomUUID().replaceAll('-', '')}`]: { type: 'string' } } }
  const answers = await Promise.all(bodies.map((body) => tp.register({ ...body, parameters })))
  for (const answer of answers) assert.equal(answer.ok, true, JSON.stringify(answer))
  tp.roles.add('Marker')
  await stream.until('the marker', () => stream.items.some((item) => item.event === 'role-added') || stream.isEnded)
  return { events: stream.items.filter((item) => item.event === 'registered'), tp }
}

test('concurrent registrations of two tools of one plugin are announced one registered event each', async (t) => {
  const { events } = await concurrentRegistrations(t, [
    { name: 'first', callback_url: 'http://127.0.0.1:9333/first', source: 'plugin:p' },
    { name: 'second', callback_url: 'http://127.0.0.1:9333/second', source: 'plugin:p' }
  ])
  assert.deepEqual(events.map((e) => e.data.tools.map((tool: any) => tool.name)).sort(), [['first'], ['second']])
})

test('concurrent registrations of one name from two origins are announced in the order the registry took them', async (t) => {
  const { events, tp } = await concurrentRegistrations(t, [9001, 9002, 9001].map((port) => ({
    name: 'x',
    callback_url: `http://127.0.0.1:${port}/x`,
    source: 'plugin:p'
  })))
  const holds = tp.list('Lanlan').tools_by_role.Lanlan?.[0]?.callback_url
  assert.equal(holds, 'http://127.0.0.1:9001/x')
  assert.equal(events.at(-1)?.data.origin, 'http://127.0.0.1:9001', 'the last registered event names the origin the registry holds')
  for (const e of events) assert.deepEqual(e.data.tools, [{ role: 'Lanlan', name: 'x' }], 'one registration per event')
})
