// A model test of the registries and their sync (docs/protocol.md R4–R8, R15–R18, "Sync" and
// "MCP endpoint"; docs/architecture.md "The path of a registration"; SECURITY.md "Ownership
// mode"), against a real Toolport on 127.0.0.1. Random sequences of register (new names, and names
// registered again with another description, schema or source), unregister (with and without
// `expected_source`) and clear, for every role or one, over HTTP and through the library, by two
// plugin keys and the host, some issued at once, in ownership mode or not; between them MCP
// clients (the official SDK over Streamable HTTP, on the Toolport's own /mcp/<role>) and Realtime
// adapters (on a stand-in provider over `ws`, as test/integration/realtime.test.ts has) attach and
// leave, the host swaps a Realtime session for a new one (`replaceSessions`) or removes a role and
// adds it again. A Map per role (and, in ownership mode, the owner of each source) is the model of
// what the contract says Toolport holds; role B also has a local tool, which the API can neither
// replace nor remove (R5, R15, R16).
//
// After each step:
// - tp.list() and GET /api/tools are the model, and each request's answer (or 401/403) is the
//   model's. For requests issued at once, both are those of SOME serial order of the requests: a
//   mutation is atomic on the event loop (docs/protocol.md "Sync"). Every registration has a
//   callback URL of its own, so the listing tells which of two registrations of a name won;
// - every Realtime session's provider was sent the role's tools before the requests returned: its
//   last session.update holds exactly them, and it was sent one per change of the role (between 1
//   and the number of requests that changed it, for requests at once: they may share a sync), and
//   none when the role did not change. A session its role no longer has is sent nothing more;
// - every MCP session got list_changed for each change of its role, counted the same way, and none
//   for changes of other roles (README "MCP: one endpoint per role": to every session of the role
//   that has listed before), and its tools/list is the role's registry: names, descriptions, input
//   schemas, in registration order;
// - a session attached now is given the current tools; the role's live sessions are exactly the
//   ones attached and not yet gone.
// When an MCP session leaves (DELETE, or a 404 once its role is gone), its event stream has ended,
// so the notices it got are counted in full. At the end of each run every session has left its
// role, one `sync-finished` came for every sync that started (none is still running), and no sync
// failed. The tests at the end are cases the property found (bugs since fixed), shrunk.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { once } from 'node:events'
import type { AddressInfo } from 'node:net'
import { isDeepStrictEqual } from 'node:util'
import fc from 'fast-check'
import { request as httpRequest } from 'undici'
import { WebSocket, WebSocketServer } from 'ws'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import { createRealtimeSession, createToolport, type RealtimeSession, type Toolport } from '../../src/main/index.js'
import { kSyncCount } from '../../src/main/symbols.js'
import { httpJson, mcpModelSessionId, within } from '../helpers.js'

type Json = Record<string, any>

const ROLES = ['A', 'B', 'C'] as const
type RoleName = typeof ROLES[number]
/** 'clock' is also role B's local tool. */
const NAMES = ['alpha', 'beta', 'gamma', 'clock'] as const
const SOURCES = ['plugin:one', 'plugin:two', 'external'] as const
type Source = typeof SOURCES[number]
/** Role B's in-process tool. Its source is a plugin's tag: a clear of that source leaves it (R16). */
const LOCAL = { role: 'B', name: 'clock', source: 'plugin:one', description: 'The host\'s clock.' } as const
/** `undefined`: the field is left out (the description is then ''). */
const DESCRIPTIONS = [undefined, 'Get the weather.', 'Get the weather — in °C, for one city.'] as const
/** `undefined`: the field is left out (docs/protocol.md "Register": the empty object schema). */
const SCHEMAS: ReadonlyArray<Json | undefined> = [
  undefined,
  { type: 'object', properties: { location: { type: 'string' } }, required: ['location'] },
  // No `type`: listed with `type: 'object'` (README "MCP: one endpoint per role").
  { properties: { q: { type: 'string', maxLength: 20 } } },
  { type: 'object', properties: { n: { type: 'integer', minimum: 0 } }, additionalProperties: false }
]
const DEFAULT_PARAMETERS = { type: 'object', properties: {} }

/**
 * Bounds on waits, so that a request, a notice or a stream that never comes fails the run instead
 * of hanging it: a request may wait for a sync up to its timeout (syncTimeoutMs, 10 s); anything
 * else comes within milliseconds on loopback.
 */
const REQUEST_GUARD_MS = 15_000
const GUARD_MS = 5_000
/** Requests in one run (steps are cut once they would pass it). */
const MAX_OPS = 30
const NUM_RUNS = 25
/** Shrinking replays runs against a fresh Toolport each: a bounded number keeps a failure's report quick. */
const MAX_SHRINKS = 200
const FAILING_TIMEOUT_MS = 600_000

/** `undefined`: the `role` field is left out; `null`: sent as null. Both mean every current role (R4). */
type Target = RoleName | null | undefined
type Via = 'http' | 'library'
/**
 * Who asks, for ownership mode (SECURITY.md "Ownership mode"): a plugin key, sent as
 * X-Toolport-Plugin-Key or as the library's `pluginKey`, or the host (no key; over HTTP, a
 * request without one). Outside ownership mode the key is ignored.
 */
type Key = 'k0' | 'k1' | 'host'
const PLUGIN_KEYS: Record<Exclude<Key, 'host'>, string> = { k0: 'k0-'.padEnd(43, 'a'), k1: 'k1-'.padEnd(43, 'b') }

type Op =
  | {
    kind: 'register'
    name: string
    /** 'default': the `source` field is left out (`external`). */
    source: Source | 'default'
    role: Target
    description: number
    schema: number
    via: Via
    key: Key
  }
  | { kind: 'unregister', name: string, role: Target, expectedSource: Source | undefined, via: Via, key: Key }
  | { kind: 'clear', source: Source, role: Target, via: Via, key: Key }

type SessionKind = 'mcp' | 'realtime'

type Step =
  /** One request, or 2–4 issued at once. */
  | { kind: 'ops', ops: Op[] }
  | { kind: 'attach', role: RoleName, session: SessionKind }
  /** The live session at `pick` modulo their number leaves. */
  | { kind: 'detach', pick: number }
  /**
   * The host swaps the live Realtime session at `pick` modulo their number for a new one with
   * `replaceSessions` (README "Rebuilding a role's sessions").
   */
  | { kind: 'replace', pick: number }
  /** The host removes the role and adds it again: it starts empty (README, R4). */
  | { kind: 'rebuild', role: RoleName }

interface Scenario {
  /** `security.enforceOwnership` */
  ownership: boolean
  sessions: Array<{ role: RoleName, session: SessionKind }>
  steps: Step[]
}

const viaArb = fc.constantFrom<Via>('http', 'library')
const keyArb = fc.constantFrom<Key>('k0', 'k1', 'host')
const targetArb = fc.constantFrom<Target>(undefined, null, 'A', 'B', 'C')
const sourceArb = fc.constantFrom(...SOURCES)

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant('register' as const),
      name: fc.constantFrom(...NAMES),
      source: fc.constantFrom<Source | 'default'>(...SOURCES, 'default'),
      role: targetArb,
      description: fc.nat(DESCRIPTIONS.length - 1),
      schema: fc.nat(SCHEMAS.length - 1),
      via: viaArb,
      key: keyArb
    })
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant('unregister' as const),
      name: fc.constantFrom(...NAMES),
      role: targetArb,
      expectedSource: fc.option(sourceArb, { nil: undefined }),
      via: viaArb,
      key: keyArb
    })
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant('clear' as const), source: sourceArb, role: targetArb, via: viaArb, key: keyArb
    })
  }
)

const attachArb = fc.record({
  role: fc.constantFrom(...ROLES),
  session: fc.constantFrom<SessionKind>('mcp', 'mcp', 'realtime')
})

const stepArb: fc.Arbitrary<Step> = fc.oneof(
  { weight: 6, arbitrary: opArb.map((op): Step => ({ kind: 'ops', ops: [op] })) },
  { weight: 3, arbitrary: fc.array(opArb, { minLength: 2, maxLength: 4 }).map((ops): Step => ({ kind: 'ops', ops })) },
  { weight: 1, arbitrary: attachArb.map((a): Step => ({ kind: 'attach', ...a })) },
  { weight: 1, arbitrary: fc.nat(7).map((pick): Step => ({ kind: 'detach', pick })) },
  { weight: 1, arbitrary: fc.nat(7).map((pick): Step => ({ kind: 'replace', pick })) },
  { weight: 1, arbitrary: fc.constantFrom(...ROLES).map((role): Step => ({ kind: 'rebuild', role })) }
)

const scenarioArb: fc.Arbitrary<Scenario> = fc.record({
  ownership: fc.boolean(),
  sessions: fc.array(attachArb, { minLength: 1, maxLength: 3 }),
  steps: fc.array(stepArb, { minLength: 1, maxLength: 24, size: 'medium' }).map(capOps)
})

/** The steps up to MAX_OPS requests in all. */
function capOps (steps: Step[]): Step[] {
  let ops = 0
  const kept: Step[] = []
  for (const step of steps) {
    if (step.kind === 'ops') {
      if (ops + step.ops.length > MAX_OPS) break
      ops += step.ops.length
    }
    kept.push(step)
  }
  return kept
}

// ─── The model ──────────────────────────────────────────────────────────────────────────────────

interface Entry {
  name: string
  description: string
  parameters: Json
  source: string
  callback_url: string | null
  is_remote: boolean
}

interface Model {
  /** Each role's registry in registration order, and the roles in creation order (Maps' insertion order). */
  roles: Map<RoleName, Map<string, Entry>>
  ownership: boolean
  /** Ownership mode: the owner each source is bound to. */
  owners: Map<string, Key>
}

function emptyModel (ownership: boolean): Model {
  const model: Model = { roles: new Map(ROLES.map((r) => [r, new Map()])), ownership, owners: new Map() }
  model.roles.get(LOCAL.role)?.set(LOCAL.name, {
    name: LOCAL.name,
    description: LOCAL.description,
    parameters: DEFAULT_PARAMETERS,
    source: LOCAL.source,
    callback_url: null,
    is_remote: false
  })
  return model
}

function cloneModel (model: Model): Model {
  return {
    roles: new Map([...model.roles].map(([role, tools]) => [role, new Map(tools)])),
    ownership: model.ownership,
    owners: new Map(model.owners)
  }
}

/** The roles a request reaches: the one named, or every current role in creation order (R4). */
function targets (model: Model, role: Target): readonly RoleName[] {
  return role === undefined || role === null ? [...model.roles.keys()] : [role]
}

function toolsOf (model: Model, role: RoleName): Map<string, Entry> {
  return model.roles.get(role) as Map<string, Entry>
}

/**
 * SECURITY.md "Ownership mode": "A binding ends with the source's last tool": any tool of the
 * source in any role (the local tool, whose tag is a plugin's, keeps `plugin:one` bound).
 */
function release (model: Model, source: string): void {
  for (const tools of model.roles.values()) {
    for (const entry of tools.values()) if (entry.source === source) return
  }
  model.owners.delete(source)
}

/** Whether `key` may change the tools of `source`: the host may change any; a plugin key a free source or its own. */
function allows (model: Model, source: string, key: Key): boolean {
  if (key === 'host') return true
  release(model, source)
  const bound = model.owners.get(source)
  return bound === undefined || bound === key
}

/** An HTTP error answer, as `issue` reports one (a library call's thrown error alike). */
function errorReply (status: number, code: string): Json {
  return { status, code }
}

/** Stands for a `failed_roles` entry's `error`, whose wording the contract leaves open. */
const ANY_ERROR = '<error>'

/**
 * Applies one request to the model as docs/protocol.md says, returning the answer it must get
 * and the roles it changed (every sync succeeds here, so those are its `affected_roles`).
 */
function apply (model: Model, op: Op, callback: string): { reply: Json, changed: RoleName[] } {
  const changed: RoleName[] = []
  if (model.ownership && op.via === 'http' && op.key === 'host') {
    // An API client is never the host: without a plugin key it is refused before anything.
    return { reply: errorReply(401, 'TP_ERR_PLUGIN_KEY_REQUIRED'), changed }
  }
  switch (op.kind) {
    case 'register': {
      const entry: Entry = {
        name: op.name,
        description: DESCRIPTIONS[op.description] ?? '',
        parameters: SCHEMAS[op.schema] ?? DEFAULT_PARAMETERS,
        source: op.source === 'default' ? 'external' : op.source,
        callback_url: callback,
        is_remote: true
      }
      if (model.ownership) {
        // A binding whose tools are all gone ends before anyone registers, the host included.
        release(model, entry.source)
        // A source bound to another key: 403, and nothing changes.
        if (!allows(model, entry.source, op.key)) return { reply: errorReply(403, 'TP_ERR_NOT_OWNER'), changed }
      }
      const failed: Json[] = []
      for (const role of targets(model, op.role)) {
        const tools = toolsOf(model, role)
        const existing = tools.get(op.name)
        // R5: a local tool is never replaced over the API, and in ownership mode neither is
        // another source's tool: that role is in failed_roles, with owned_by.
        if (existing !== undefined && (!existing.is_remote || (model.ownership && existing.source !== entry.source))) {
          failed.push({ role, error: ANY_ERROR, owned_by: existing.source })
          continue
        }
        // R5: registering a name again replaces it, and the replaced tool moves to the end.
        tools.delete(op.name)
        tools.set(op.name, entry)
        changed.push(role)
      }
      // The first accepted registration of a free source binds it to its key (or to the host).
      if (model.ownership && changed.length > 0 && !model.owners.has(entry.source)) {
        model.owners.set(entry.source, op.key)
      }
      // R8: ok when at least one role accepted; else ok false with the documented error.
      const reply: Json = { ok: changed.length > 0, registered: op.name, affected_roles: changed, failed_roles: failed }
      if (changed.length === 0) reply.error = 'no role accepted the registration'
      return { reply, changed }
    }
    case 'unregister': {
      const refused: Json[] = []
      for (const role of targets(model, op.role)) {
        const tools = toolsOf(model, role)
        const existing = tools.get(op.name)
        if (existing === undefined) continue
        // R15: local tools are always refused; with expected_source, so is another source's tool;
        // in ownership mode, so is a tool whose source is bound to another key.
        if (!existing.is_remote || (op.expectedSource !== undefined && existing.source !== op.expectedSource) ||
          (model.ownership && !allows(model, existing.source, op.key))) {
          refused.push({ role, owned_by: existing.source })
          continue
        }
        tools.delete(op.name)
        changed.push(role)
      }
      // R17: ok (no sync fails here), `removed` a boolean.
      const reply = {
        ok: true, removed: changed.length > 0, affected_roles: changed, failed_roles: [], refused_roles: refused
      }
      return { reply, changed }
    }
    case 'clear': {
      // R16: clearing a source bound to another key is a 403.
      if (model.ownership && !allows(model, op.source, op.key)) return { reply: errorReply(403, 'TP_ERR_NOT_OWNER'), changed }
      let removed = 0
      for (const role of targets(model, op.role)) {
        const tools = toolsOf(model, role)
        let here = 0
        for (const [name, entry] of [...tools]) {
          // R16: local tools are never cleared, whatever their source tag.
          if (entry.is_remote && entry.source === op.source) {
            tools.delete(name)
            here++
          }
        }
        if (here > 0) changed.push(role)
        removed += here
      }
      // R17: `removed` a count.
      return { reply: { ok: true, removed, affected_roles: changed, failed_roles: [] }, changed }
    }
  }
}

/** GET /api/tools's `tools_by_role` for the model (R18: registration order). */
function listingOf (model: Model): Json {
  const byRole: Json = {}
  for (const [role, tools] of model.roles) {
    byRole[role] = [...tools.values()].map((e) => ({
      name: e.name, description: e.description, source: e.source, callback_url: e.callback_url, is_remote: e.is_remote
    }))
  }
  return byRole
}

/** A schema as sessions are given it: `type: 'object'` added when the plugin's lacks it. */
function objectRoot (parameters: Json): Json {
  return parameters.type === 'object' ? parameters : { ...parameters, type: 'object' }
}

/** What an MCP client's tools/list holds for a role (README "MCP: one endpoint per role"). */
function mcpToolsOf (model: Model, role: RoleName): Json[] {
  return [...toolsOf(model, role).values()].map((e) => ({
    name: e.name, description: e.description, inputSchema: objectRoot(e.parameters)
  }))
}

/** What a Realtime session.update carries for a role (the `openai-realtime` definitions). */
function realtimeToolsOf (model: Model, role: RoleName): Json[] {
  return [...toolsOf(model, role).values()].map((e) => ({
    type: 'function', name: e.name, description: e.description, parameters: objectRoot(e.parameters)
  }))
}

function permutations (n: number): number[][] {
  if (n === 0) return [[]]
  const out: number[][] = []
  for (const rest of permutations(n - 1)) {
    for (let at = 0; at <= rest.length; at++) out.push([...rest.slice(0, at), n - 1, ...rest.slice(at)])
  }
  return out
}

// ─── Requests ───────────────────────────────────────────────────────────────────────────────────

function bodyOf (op: Op, callback: string): Json {
  const role = op.role === undefined ? {} : { role: op.role }
  switch (op.kind) {
    case 'register': {
      const description = DESCRIPTIONS[op.description]
      const parameters = SCHEMAS[op.schema]
      return {
        name: op.name,
        callback_url: callback,
        ...(op.source === 'default' ? {} : { source: op.source }),
        ...(description === undefined ? {} : { description }),
        ...(parameters === undefined ? {} : { parameters }),
        ...role
      }
    }
    case 'unregister':
      return {
        name: op.name,
        ...role,
        ...(op.expectedSource === undefined ? {} : { expected_source: op.expectedSource })
      }
    case 'clear':
      return { source: op.source, ...role }
  }
}

/**
 * Sends one request and answers its reply as JSON: a library call's result as the route would send
 * it, and an error (HTTP, or thrown by the library) as `errorReply` has it.
 */
async function issue (tp: Toolport, url: string, op: Op, callback: string): Promise<Json> {
  const body = bodyOf(op, callback)
  if (op.via === 'http') {
    const res = await httpRequest(`${url}/api/tools/${op.kind}`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        ...(op.key === 'host' ? {} : { 'x-toolport-plugin-key': PLUGIN_KEYS[op.key] })
      },
      body: JSON.stringify(body)
    })
    const reply = await res.body.json() as Json
    if (res.statusCode === 200) return reply
    assert.equal(reply.statusCode, res.statusCode, `${op.kind} ${JSON.stringify(body)}: ${JSON.stringify(reply)}`)
    return errorReply(res.statusCode, String(reply.code))
  }
  const options = op.key === 'host' ? {} : { pluginKey: PLUGIN_KEYS[op.key] }
  try {
    const result = op.kind === 'register'
      ? await tp.register(body, options)
      : op.kind === 'unregister' ? await tp.unregister(body, options) : await tp.clear(body, options)
    return JSON.parse(JSON.stringify(result)) as Json
  } catch (err) {
    const { statusCode, code } = err as { statusCode?: unknown, code?: unknown }
    if (typeof statusCode !== 'number' || typeof code !== 'string') throw err
    return errorReply(statusCode, code)
  }
}

/** A `failed_roles` entry's error must be a message; its wording is left open (ANY_ERROR). */
function normalizeReply (reply: Json): Json {
  if (!Array.isArray(reply.failed_roles)) return reply
  const failed = reply.failed_roles.map((f: Json) => {
    assert.equal(typeof f.error, 'string', `failed_roles entry ${JSON.stringify(f)}`)
    assert.notEqual(f.error, '', `failed_roles entry ${JSON.stringify(f)}`)
    return { ...f, error: ANY_ERROR }
  })
  return { ...reply, failed_roles: failed }
}

async function guard<T> (promise: Promise<T>, what: string, ms = GUARD_MS): Promise<T> {
  return await within(promise, what, ms)
}

/** Lets every promise job queued by data already received run (stream pipes, SDK handlers). */
async function settle (): Promise<void> {
  for (let i = 0; i < 3; i++) await new Promise((resolve) => setImmediate(resolve))
}

// ─── Sessions ───────────────────────────────────────────────────────────────────────────────────

interface McpLive {
  kind: 'mcp'
  role: RoleName
  id: string
  client: Client
  transport: StreamableHTTPClientTransport
  /** list_changed notifications received so far. */
  notices: number
  /** Bounds on `notices` from the changes of its role so far. */
  lower: number
  upper: number
  /** Resolves once the event stream (GET) has ended. */
  streamEnded: Promise<void>
  waiters: Array<() => void>
}

interface RealtimeLive {
  kind: 'realtime'
  role: RoleName
  id: string
  session: RealtimeSession
  ws: WebSocket
  /** Every client event the provider received from this session. */
  events: Json[]
  /** The session.updates the provider has answered (session.updated): the tools the model has. */
  acked: Json[]
  /** Created with `attach: false` and attached by `replaceSessions`. */
}

type Live = McpLive | RealtimeLive

/** What the provider saw of one session: every client event, and the session.updates it has answered. */
interface ProviderRecord {
  events: Json[]
  acked: Json[]
}

/**
 * A stand-in Realtime provider on 127.0.0.1: each connection (path /<session id>) has its client
 * events recorded, and every session.update is answered with session.updated echoing its session,
 * as the provider's documented sequence goes, a few milliseconds later (0–8 ms, in a fixed cycle).
 * The wait changes nothing for a sync that waits for the answer, as Toolport's must (README "The
 * OpenAI-Realtime adapter": the sync resolves on the matching session.updated), and lets syncs of
 * requests issued at once overlap.
 */
class Provider {
  readonly #server: WebSocketServer
  readonly #records = new Map<string, ProviderRecord>()

  constructor (server: WebSocketServer) {
    this.#server = server
    server.on('connection', (socket, request) => {
      const record = this.recordOf((request.url ?? '/').slice(1))
      socket.on('message', (data) => {
        const event = JSON.parse(String(data)) as Json
        record.events.push(event)
        if (event.type !== 'session.update') return
        setTimeout(() => {
          record.acked.push(event)
          socket.send(JSON.stringify({ type: 'session.updated', event_id: `evt_${record.acked.length}`, session: event.session }))
        }, (record.events.length * 7) % 9)
      })
    })
  }

  get url (): string {
    return `ws://127.0.0.1:${(this.#server.address() as AddressInfo).port}`
  }

  recordOf (id: string): ProviderRecord {
    let record = this.#records.get(id)
    if (record === undefined) {
      record = { events: [], acked: [] }
      this.#records.set(id, record)
    }
    return record
  }

  async close (): Promise<void> {
    for (const client of this.#server.clients) client.terminate()
    await new Promise<void>((resolve) => this.#server.close(() => resolve()))
  }
}

async function startProvider (t: TestContext): Promise<Provider> {
  const server = new WebSocketServer({ host: '127.0.0.1', port: 0 })
  await once(server, 'listening')
  const provider = new Provider(server)
  t.after(() => provider.close())
  return provider
}

/** Session ids are unique in the file (the provider keys its records by them). */
let serial = 0

/**
 * An MCP client of `role` on the Toolport's /mcp endpoint. Its fetch is the global one, watched:
 * the event stream (GET) counts as open once its answer's headers arrived (the server registers
 * the stream before it sends them), and as ended once its body has.
 */
async function attachMcp (tp: Toolport, url: string, role: RoleName): Promise<McpLive> {
  let opened = (): void => {}
  const streamOpen = new Promise<void>((resolve) => { opened = resolve })
  let ended = (): void => {}
  const streamEnded = new Promise<void>((resolve) => { ended = resolve })
  const watched = async (input: string | URL, init?: RequestInit): Promise<Response> => {
    const response = await fetch(input, init)
    if (init?.method !== 'GET' || !response.ok || response.body === null) return response
    opened()
    const reader = response.body.getReader()
    const body = new ReadableStream<Uint8Array>({
      async pull (controller) {
        try {
          const { value, done } = await reader.read()
          if (done) {
            controller.close()
            ended()
          } else {
            controller.enqueue(value)
          }
        } catch (err) {
          controller.error(err)
          ended()
        }
      },
      async cancel (reason) {
        ended()
        await reader.cancel(reason)
      }
    })
    return new Response(body, { status: response.status, statusText: response.statusText, headers: response.headers })
  }
  const client = new Client({ name: 'registry-properties', version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(`${url}/mcp/${role}`), { fetch: watched })
  const live: McpLive = {
    kind: 'mcp', role, id: '', client, transport, notices: 0, lower: 0, upper: 0, streamEnded, waiters: []
  }
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => {
    live.notices++
    for (const wake of live.waiters.splice(0)) wake()
  })
  await guard(client.connect(transport), `MCP session of ${role}: connect`)
  live.id = mcpModelSessionId(tp, role, transport.sessionId)
  await guard(streamOpen, `MCP session of ${role}: its event stream`)
  return live
}

async function untilNotices (live: McpLive, n: number, what: string): Promise<void> {
  while (live.notices < n) {
    await guard(new Promise<void>((resolve) => { live.waiters.push(resolve) }),
      `${what}: ${live.notices} list_changed of at least ${n}`)
  }
}

/**
 * A Realtime adapter of `role` for a host socket to the provider. `attach: false` leaves attaching
 * to the caller (`replaceSessions`).
 */
async function attachRealtime (tp: Toolport, provider: Provider, role: RoleName, attach = true): Promise<RealtimeLive> {
  const id = `realtime-${++serial}`
  const ws = new WebSocket(`${provider.url}/${id}`)
  await guard(once(ws, 'open'), `Realtime session of ${role}: socket`)
  const session = createRealtimeSession({
    toolport: tp,
    role,
    id,
    attach,
    send: (event) => { ws.send(JSON.stringify(event)) }
  })
  ws.on('message', (data) => session.handleServerEvent(String(data)))
  return { kind: 'realtime', role, id, session, ws, ...provider.recordOf(id) }
}

function updatesOf (live: RealtimeLive): Json[] {
  for (const event of live.events) assert.equal(event.type, 'session.update', `${live.id} sent ${event.type}`)
  return live.events
}

function closeRealtime (live: RealtimeLive): void {
  live.session.close()
  live.ws.close()
}

// ─── A run ──────────────────────────────────────────────────────────────────────────────────────

interface Tally {
  runs: number
  /** Runs in ownership mode. */
  ownershipRuns: number
  /** Requests answered 401 or 403. */
  refused: number
  steps: number
  ops: number
  groups: number
  /** Groups issued at once whose answers and registries more than one serial order explains. */
  ambiguous: number
  /** Groups issued at once that took effect in another order than they were issued in. */
  reordered: number
  attached: number
  replaced: number
  rebuilt: number
  notices: number
  updates: number
}

/** A Realtime session its role no longer has (swapped out, or its role was removed): it must be sent nothing more. */
interface Orphan {
  live: RealtimeLive
  updates: number
}

class Run {
  readonly tp: Toolport
  readonly url: string
  readonly provider: Provider
  readonly tally: Tally
  model: Model
  readonly live: Live[] = []
  readonly orphans: Orphan[] = []
  /** `sync-finished` events per role name, the failed ones, and the syncs of removed Role objects. */
  readonly finished = new Map<string, number>()
  readonly failedSyncs: Json[] = []
  readonly retiredSyncs = new Map<string, number>()
  #callbacks = 0

  constructor (tp: Toolport, url: string, provider: Provider, tally: Tally, ownership: boolean) {
    this.model = emptyModel(ownership)
    this.tp = tp
    this.url = url
    this.provider = provider
    this.tally = tally
    tp.on('sync-finished', (event) => {
      this.finished.set(event.role, (this.finished.get(event.role) ?? 0) + 1)
      if (!event.ok) this.failedSyncs.push(event)
    })
  }

  realtimeLive (): RealtimeLive[] {
    return this.live.filter((l): l is RealtimeLive => l.kind === 'realtime')
  }

  async step (step: Step, where: string): Promise<void> {
    const before = new Map(this.realtimeLive().map((l) => [l, updatesOf(l).length]))
    /** The role whose sessions this step may send the role's tools again (an attach or swap syncs it). */
    let synced: RoleName | null = null
    switch (step.kind) {
      case 'ops':
        await this.ops(step.ops, before, where)
        break
      case 'attach':
        await this.attach(step.role, step.session, where)
        synced = step.role
        break
      case 'detach':
        if (this.live.length > 0) await this.detach(this.live[step.pick % this.live.length] as Live, where)
        break
      case 'replace': {
        const realtime = this.realtimeLive()
        const previous = realtime[step.pick % Math.max(1, realtime.length)]
        if (previous !== undefined) {
          await this.replace(previous, where)
          synced = previous.role
        }
        break
      }
      case 'rebuild':
        await this.rebuild(step.role, where)
        break
    }
    if (step.kind !== 'ops') {
      for (const [live, count] of before) {
        if (live.role === synced || !this.live.includes(live)) continue
        assert.equal(updatesOf(live).length, count, `${where}: ${live.id} of role ${live.role} was sent session.update`)
      }
    }
    for (const orphan of this.orphans) {
      assert.equal(updatesOf(orphan.live).length, orphan.updates,
        `${where}: ${orphan.live.id}, no longer a session of role ${orphan.live.role}, was sent session.update`)
    }
    await this.checkState(where)
  }

  async ops (ops: readonly Op[], before: ReadonlyMap<RealtimeLive, number>, where: string): Promise<void> {
    this.tally.ops += ops.length
    if (ops.length > 1) this.tally.groups++
    const callbacks = ops.map((op) => op.kind === 'register' ? `http://127.0.0.1:9333/tools/r${++this.#callbacks}` : '')
    const replies = await guard(Promise.all(ops.map((op, i) => issue(this.tp, this.url, op, callbacks[i] as string))),
      `${where}: the requests`, REQUEST_GUARD_MS)
    // Read at once, in the turn the last answer arrived: nothing else has run since.
    const listing = JSON.parse(JSON.stringify(this.tp.list().tools_by_role)) as Json
    const actual = { listing, replies: replies.map(normalizeReply) }

    // The answers and the registries are those of some serial order of the requests.
    const orders = ops.length === 1 ? [[0]] : permutations(ops.length)
    const outcomes = orders.map((order) => {
      const model = cloneModel(this.model)
      const expected: Json[] = new Array(ops.length)
      const changes = new Map<RoleName, number>()
      for (const i of order) {
        const { reply, changed } = apply(model, ops[i] as Op, callbacks[i] as string)
        expected[i] = reply
        for (const role of changed) changes.set(role, (changes.get(role) ?? 0) + 1)
      }
      return { model, expected: { listing: listingOf(model), replies: expected }, changes }
    })
    const matching = outcomes.filter((o) => isDeepStrictEqual(actual, o.expected))
    if (matching.length === 0) {
      // Fails, showing the difference from the order the requests were issued in.
      assert.deepEqual(actual, outcomes[0]?.expected,
        `${where}: no serial order of the requests explains their answers and the registries`)
    }
    this.tally.refused += replies.filter((r) => r.status !== undefined).length
    if (matching.length > 1) this.tally.ambiguous++
    if (!matching.includes(outcomes[0] as typeof outcomes[number])) this.tally.reordered++
    // Every matching order has these answers, so the same affected_roles: the same changes.
    const { model, changes } = matching[0] as typeof outcomes[number]
    this.model = model

    // Realtime: the provider was sent the role's tools before the requests returned.
    for (const [live, count] of before) {
      const updates = updatesOf(live)
      const sent = updates.length - count
      const changedBy = changes.get(live.role) ?? 0
      this.tally.updates += sent
      const what = `${where}: ${live.id} of role ${live.role}`
      if (changedBy === 0) {
        assert.equal(sent, 0, `${what} was sent ${sent} session.update, yet its role did not change`)
        continue
      }
      assert.ok(sent >= 1 && sent <= changedBy,
        `${what} was sent ${sent} session.update for ${changedBy} changes of its role (1 to ${changedBy} expected) by the time the requests returned`)
      assert.equal(live.acked.length, updates.length, `${what}: a session.update was not answered yet when the requests returned`)
      assert.deepEqual(live.acked.at(-1)?.session?.tools, realtimeToolsOf(this.model, live.role),
        `${what}: the last session.update answered before the requests returned holds the role's tools`)
    }
    // MCP: one list_changed per change of the role, or fewer for requests that shared a sync.
    for (const live of this.live) {
      if (live.kind !== 'mcp') continue
      const changedBy = changes.get(live.role) ?? 0
      if (changedBy > 0) {
        live.lower += 1
        live.upper += changedBy
      }
    }
  }

  async attach (role: RoleName, kind: SessionKind, where: string): Promise<void> {
    this.tally.attached++
    const what = `${where}: a new ${kind} session of ${role}`
    if (kind === 'mcp') {
      const live = await attachMcp(this.tp, this.url, role)
      this.live.push(live)
      const { tools, nextCursor } = await guard(live.client.listTools(), `${what}: tools/list`)
      assert.equal(nextCursor, undefined)
      assert.deepEqual(tools, mcpToolsOf(this.model, role), `${what} lists the current tools`)
    } else {
      const live = await attachRealtime(this.tp, this.provider, role)
      this.live.push(live)
      // Attaching sends the role's tools at once (Role.attachSession); this sync starts after it.
      const outcome = await guard(this.tp.roles.get(role).sync(), `${what}: a sync`, REQUEST_GUARD_MS)
      assert.deepEqual(outcome, { ok: true, error: '' })
      assert.ok(live.acked.length >= 1, `${what} was given its role's tools`)
      assert.deepEqual(live.acked[0]?.session?.tools, realtimeToolsOf(this.model, role), `${what} was given the current tools`)
    }
    // The attach-time sync reached the role's other sessions too: let it finish before the next
    // step counts what they are sent (the MCP ones have listed these tools: no notice).
    await guard(this.tp.roles.get(role).sync(), `${what}: a sync`, REQUEST_GUARD_MS)
  }

  /** README "Rebuilding a role's sessions": swap the sessions, resolved once the new one has the tools. */
  async replace (previous: RealtimeLive, where: string): Promise<void> {
    this.tally.replaced++
    const what = `${where}: ${previous.id} of role ${previous.role} swapped for a new session`
    const next = await attachRealtime(this.tp, this.provider, previous.role, false)
    const outcome = await guard(this.tp.roles.get(previous.role).replaceSessions([previous.session], [next.session]),
      `${what}: replaceSessions`, REQUEST_GUARD_MS)
    assert.deepEqual(outcome, { ok: true, error: '' }, what)
    this.live.splice(this.live.indexOf(previous), 1, next)
    this.orphans.push({ live: previous, updates: updatesOf(previous).length })
    assert.deepEqual(next.acked.at(-1)?.session?.tools, realtimeToolsOf(this.model, next.role),
      `${what}: the new session has the role's tools when replaceSessions resolves`)
  }

  /**
   * Removes the role and adds it again. Its Realtime sessions are dropped with it (RoleManager.remove)
   * and must be sent nothing more. Each of its MCP sessions makes a request while the role is gone:
   * it is answered 404 and the session has ended (docs/protocol.md "MCP endpoint"; the case of a
   * session with no request while the role is gone is a test at the end of this file).
   */
  async rebuild (role: RoleName, where: string): Promise<void> {
    this.tally.rebuilt++
    const old = this.tp.roles.get(role)
    this.retiredSyncs.set(role, (this.retiredSyncs.get(role) ?? 0) + old[kSyncCount])
    assert.equal(this.tp.roles.remove(role), true)
    for (const live of this.live.filter((l) => l.role === role)) {
      const what = `${where}: ${live.id} of the removed role ${role}`
      this.live.splice(this.live.indexOf(live), 1)
      if (live.kind === 'realtime') {
        this.orphans.push({ live, updates: updatesOf(live).length })
        continue
      }
      await assert.rejects(guard(live.client.listTools(), `${what}: tools/list`),
        (err: unknown) => err instanceof StreamableHTTPError && err.code === 404, `${what}: tools/list is a 404`)
      await guard(live.streamEnded, `${what}: the end of its event stream`)
      await settle()
      this.checkNoticeCount(live, what)
      this.tally.notices += live.notices
      await live.client.close()
    }
    this.tp.roles.add(role)
    // A new role: empty, and last in creation order.
    this.model.roles.delete(role)
    this.model.roles.set(role, new Map())
  }

  async detach (live: Live, where: string): Promise<void> {
    const what = `${where}: ${live.id} of role ${live.role} leaving`
    this.live.splice(this.live.indexOf(live), 1)
    if (live.kind === 'mcp') {
      await guard(live.transport.terminateSession(), `${what}: DELETE`)
      // The server ends the event stream with the session: every notice sent on it has arrived.
      await guard(live.streamEnded, `${what}: the end of its event stream`)
      await settle()
      this.checkNoticeCount(live, what)
      this.tally.notices += live.notices
      await live.client.close()
    } else {
      // close() alone detaches it, also one swapped in by replaceSessions (a test at the end of this file).
      closeRealtime(live)
    }
    assert.ok(!this.tp.roles.get(live.role).sessions().some((s) => s.id === live.id), `${what}: detached from its role`)
  }

  checkNoticeCount (live: McpLive, what: string): void {
    assert.ok(live.notices >= live.lower && live.notices <= live.upper,
      `${what}: ${live.notices} list_changed received; its role's changes call for ${live.lower} to ${live.upper}`)
  }

  /** After every step: the registries, GET /api/tools, each role's sessions, and what each MCP session lists. */
  async checkState (where: string): Promise<void> {
    const listing = listingOf(this.model)
    assert.deepEqual(JSON.parse(JSON.stringify(this.tp.list())), { ok: true, tools_by_role: listing },
      `${where}: tp.list() is the model`)
    const http = await httpJson(`${this.url}/api/tools`, 'GET')
    assert.equal(http.statusCode, 200)
    assert.deepEqual(http.body, { ok: true, tools_by_role: listing }, `${where}: GET /api/tools is the model`)
    for (const role of ROLES) {
      const attached = this.tp.roles.get(role).sessions().map((s) => s.id).sort()
      const expected = this.live.filter((l) => l.role === role).map((l) => l.id).sort()
      assert.deepEqual(attached, expected, `${where}: the live sessions of role ${role}`)
    }
    for (const live of this.live) {
      if (live.kind !== 'mcp') continue
      const what = `${where}: ${live.id} of role ${live.role}`
      await untilNotices(live, live.lower, what)
      this.checkNoticeCount(live, what)
      const { tools, nextCursor } = await guard(live.client.listTools(), `${what}: tools/list`)
      assert.equal(nextCursor, undefined)
      assert.deepEqual(tools, mcpToolsOf(this.model, live.role), `${what}: tools/list is its role's registry`)
    }
  }

  /** Every session leaves; every sync that started has finished, and none failed. */
  async finish (where: string): Promise<void> {
    while (this.live.length > 0) await this.detach(this.live[0] as Live, where)
    for (const role of ROLES) {
      const r = this.tp.roles.get(role)
      assert.deepEqual(r.sessions(), [], `${where}: role ${role} has no session left`)
      const started = (this.retiredSyncs.get(role) ?? 0) + r[kSyncCount]
      assert.equal(this.finished.get(role) ?? 0, started,
        `${where}: role ${role} started ${started} syncs and ${this.finished.get(role) ?? 0} finished`)
    }
    assert.deepEqual(this.failedSyncs, [], `${where}: no sync failed`)
  }

  /** Leaves nothing behind, whatever happened (after a failure too). */
  async close (): Promise<void> {
    for (const live of this.live.splice(0)) {
      if (live.kind === 'mcp') await live.client.close().catch(() => {})
      else closeRealtime(live)
    }
    for (const orphan of this.orphans.splice(0)) closeRealtime(orphan.live)
  }
}

async function runScenario (scenario: Scenario, provider: Provider, tally: Tally): Promise<void> {
  const tp = await createToolport({
    roles: [...ROLES],
    logger: false,
    dispatch: { mode: 'inline' },
    security: { enforceOwnership: scenario.ownership }
  })
  let run: Run | null = null
  try {
    const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
    run = new Run(tp, url, provider, tally, scenario.ownership)
    await tp.roles.get(LOCAL.role).registerLocalTool({
      name: LOCAL.name,
      description: LOCAL.description,
      source: LOCAL.source,
      parameters: DEFAULT_PARAMETERS,
      handler: () => 'noon'
    })
    tally.runs++
    if (scenario.ownership) tally.ownershipRuns++
    for (const [i, spec] of scenario.sessions.entries()) {
      await run.attach(spec.role, spec.session, `session ${i}`)
    }
    await run.checkState('start')
    for (const [i, step] of scenario.steps.entries()) {
      tally.steps++
      await run.step(step, `step ${i} ${JSON.stringify(step)}`)
    }
    await run.finish('end')
  } finally {
    await run?.close()
    await tp.close()
  }
}

test('R4-R8, R15-R18, "Sync": property: after random registers, unregisters and clears, one at a time and at once, every registry is the model and every MCP and Realtime session of a changed role was told before the requests returned', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const provider = await startProvider(t)
  const tally: Tally = {
    runs: 0,
    ownershipRuns: 0,
    refused: 0,
    steps: 0,
    ops: 0,
    groups: 0,
    ambiguous: 0,
    reordered: 0,
    attached: 0,
    replaced: 0,
    rebuilt: 0,
    notices: 0,
    updates: 0
  }
  const started = performance.now()
  await fc.assert(fc.asyncProperty(fc.limitShrink(scenarioArb, MAX_SHRINKS), async (scenario) => {
    await runScenario(scenario, provider, tally)
  }), { numRuns: NUM_RUNS, includeErrorInReport: true })
  t.diagnostic(`${tally.runs} runs (${tally.ownershipRuns} in ownership mode), ${tally.steps} steps, ` +
    `${tally.ops} requests (${tally.refused} answered 401 or 403; ${tally.groups} groups issued at once, ` +
    `${tally.ambiguous} of them explained by more than one serial order, ${tally.reordered} taking effect in ` +
    `another order than issued), ${tally.attached} sessions attached, ` +
    `${tally.replaced} swapped, ${tally.rebuilt} roles rebuilt, ${tally.notices} list_changed, ` +
    `${tally.updates} session.update, in ${Math.round(performance.now() - started)} ms`)
})

// ─── Found by the property, shrunk ──────────────────────────────────────────────────────────────

test('MCP: an MCP session whose role is removed and added again before its next request either ends or becomes a session of the new role, told of its changes', async (t) => {
  const tp = await createToolport({ roles: ['A'], logger: false, dispatch: { mode: 'inline' } })
  t.after(() => tp.close())
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  const live = await attachMcp(tp, url, 'A')
  t.after(() => live.client.close())
  assert.deepEqual((await live.client.listTools()).tools, [])

  tp.roles.remove('A')
  tp.roles.add('A')
  const reply = await httpJson(`${url}/api/tools/register`, 'POST', { name: 'x', callback_url: 'http://127.0.0.1:9333/x' })
  assert.deepEqual(reply.body, { ok: true, registered: 'x', affected_roles: ['A'], failed_roles: [] })

  // Either the session ended with its role: its next request is a 404 …
  const listed = await live.client.listTools().catch((err: unknown) => err)
  if (listed instanceof StreamableHTTPError) {
    assert.equal(listed.code, 404)
    return
  }
  // … or it is a session of the role now there: attached to it, and told of the registration.
  assert.deepEqual((listed as { tools: Json[] }).tools.map((d) => d.name), ['x'])
  assert.deepEqual(tp.roles.get('A').sessions().map((s) => s.id), [live.id],
    'the session that lists role A\'s tools is one of role A\'s sessions')
  await untilNotices(live, 1, 'the registration in the role added again')
})

test('Realtime: an adapter swapped in with replaceSessions leaves its role on close(), so later changes of the role sync', async (t) => {
  const tp = await createToolport({ roles: ['A'], logger: false, dispatch: { mode: 'inline' } })
  t.after(() => tp.close())
  const provider = await startProvider(t)
  const role = tp.roles.get('A')
  const previous = await attachRealtime(tp, provider, 'A')
  await role.sync()
  const next = await attachRealtime(tp, provider, 'A', false)
  assert.deepEqual(await role.replaceSessions([previous.session], [next.session]), { ok: true, error: '' })
  // README "The OpenAI-Realtime adapter": the host closes the session when its socket closes.
  closeRealtime(previous)
  closeRealtime(next)
  assert.deepEqual(role.sessions().map((s) => s.id), [],
    'a closed adapter is none of its role\'s sessions (RealtimeSession.close: "Detaches from the role")')
  const result = await tp.register({ name: 'x', callback_url: 'http://127.0.0.1:9333/x' })
  assert.deepEqual(JSON.parse(JSON.stringify(result)), { ok: true, registered: 'x', affected_roles: ['A'], failed_roles: [] })
})

test('Ownership: a source whose last tool is gone is free, and the host that registers it then binds it: the old plugin key can no longer change it', async (t) => {
  const tp = await createToolport({
    roles: ['A'], logger: false, dispatch: { mode: 'inline' }, security: { enforceOwnership: true }
  })
  t.after(() => tp.close())
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  const asK0 = (op: Op, callback = ''): Promise<Json> => issue(tp, url, op, callback)
  const k0 = { role: 'A' as const, via: 'http' as const, key: 'k0' as const }
  assert.equal((await asK0({ kind: 'register', name: 'alpha', source: 'external', description: 0, schema: 0, ...k0 },
    'http://127.0.0.1:9333/alpha')).ok, true)
  // The key's last tool of the source goes: "the source is then free" (SECURITY.md "Ownership mode").
  assert.equal((await asK0({ kind: 'unregister', name: 'alpha', expectedSource: undefined, ...k0 })).removed, true)
  // "The host owns everything … the sources it registers first are bound to it, and no plugin key can change them."
  const host = await tp.register({ name: 'beta', source: 'external', callback_url: 'http://127.0.0.1:9333/beta' })
  assert.equal(host.ok, true)

  const unregister = await asK0({ kind: 'unregister', name: 'beta', expectedSource: undefined, ...k0 })
  assert.deepEqual(unregister, {
    ok: true, removed: false, affected_roles: [], failed_roles: [], refused_roles: [{ role: 'A', owned_by: 'external' }]
  })
  assert.deepEqual(await asK0({ kind: 'clear', source: 'external', ...k0 }), errorReply(403, 'TP_ERR_NOT_OWNER'))
  assert.deepEqual(tp.list('A').tools_by_role.A?.map((row) => row.name), ['beta'])
})
