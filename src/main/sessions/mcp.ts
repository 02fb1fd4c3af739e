// Per-role MCP endpoint sessions: each MCP client session is a ModelSession of its
// role, built on the official SDK's low-level `Server` and `StreamableHTTPServerTransport`.
//
// - The sync is `notifications/tools/list_changed` on the client's event stream (its GET): MCP
//   clients pull the list, so a session "has" a change once the client has been told to re-list.
// - `tools/list` reads the registry snapshot live; `tools/call` runs `Runtime.callTool` with the
//   request's abort signal, which the SDK aborts on `notifications/cancelled` and on close.
// - A session attaches to its role once the client has initialized, and detaches when it ends:
//   DELETE, the client going away (its event stream closed and not reopened within a grace
//   period), inactivity, the role being removed, eviction (sessions full), or the server closing.
// - Streams are resumable: each session keeps a bounded event store, POST streams start with a
//   priming event (an event id, empty data, `retry`), and a client that reconnects with
//   `Last-Event-ID` is sent what it missed, tool-list changes included. A request's stream ends
//   once nothing more will be sent on it (answered, or cancelled), a resumed one too.
// - Only the standalone GET stream is the session's event stream (a GET with the Last-Event-ID of a
//   request's stream is that request's): each fresh one is sent `list_changed` when the tools
//   differ from what the client last listed, so a notice lost with a dropped stream is sent again.
// - A session Toolport ends (role removed, server close) first answers its running calls with a
//   JSON-RPC error, so that no client waits for its own timeout; eviction never picks a session
//   with a call running.
// - Bounds: sessions in all, sessions per client, calls in flight per session, per client and
//   for all MCP sessions together, so one MCP client cannot take the dispatcher's whole budget.
//   A client is the TCP connection (peer address and port) that sent `initialize`: on loopback
//   every process has the same address, and nothing a client sends identifies it better.
import { EventEmitter } from 'node:events'
import { randomUUID } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import type { Server } from '@modelcontextprotocol/sdk/server/index.js'
import type { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import type {
  CallToolRequest, CallToolResult, JSONRPCMessage, ListToolsRequest, ListToolsResult, RequestId,
  ServerNotification, ServerRequest
} from '@modelcontextprotocol/sdk/types.js'
import type { RequestHandlerExtra } from '@modelcontextprotocol/sdk/shared/protocol.js'
import type { Runtime } from '../runtime.js'
import type { ModelSession } from '../roles/sync.js'
import type { ToolDefinition } from '../roles/tool-registry.js'
import { kJsonArguments, kRefuseCall } from '../symbols.js'
import type { ToolResult } from '../dispatch/result.js'
import { isPlainObject, noop, unsentBytes } from '../../shared/util.js'
import { checkedRequest, MCP_SERVER_INFO, mcpInstructions, rpcError } from './mcp-info.js'
import { loadMcpSdk, mcpSdk } from './mcp-sdk.js'
import { jsonDepth } from '../schemas.js'
import { toolDefinitions } from './definitions.js'
import {
  BoundedEventStore, isStandaloneEventId, isStandaloneStream, streamOfEventId, type EventStoreLimits
} from './event-store.js'

export interface McpSessionsOptions {
  /** A session with no open event stream and no request for this long ends (default 10 min). */
  idleTimeoutMs?: number
  /**
   * After its event stream closed, a session ends unless the client reopens it or sends a request
   * within this long (default 30 s). SDK clients reconnect a dropped stream within seconds.
   */
  reconnectGraceMs?: number
  /**
   * Most sessions at once, all roles together (default 256). When full, an `initialize` evicts
   * the least recently active session with no request in flight and no call running (one without
   * an event stream first, a session of the last 5 s that has not yet opened one counting as one
   * with); only when every session is that busy does it get 503.
   */
  maxSessions?: number
  /**
   * Most sessions one client holds (default 32): its next `initialize` evicts its own least
   * recently active session with no request in flight and no call running, else gets 503.
   */
  maxSessionsPerClient?: number
  /** Most `tools/call` in flight in one session; beyond it a call answers a tool error (default 32). */
  maxCallsPerSession?: number
  /** Most `tools/call` in flight over all sessions of one client (default 128). */
  maxCallsPerClient?: number
  /** Most `tools/call` in flight over every MCP session (default: a quarter of `dispatch.maxPending`). */
  maxCalls?: number
  /** The `retry` (ms) a resumable stream's priming event suggests to the client (default 2000). */
  retryIntervalMs?: number
  /** Bounds of each session's event store (default 512 events, 256 KiB). */
  eventStore?: EventStoreLimits
}
// Each bound above defaults to the runtime's `mcp` option of the same name (config.ts).

/** Why a session ended. */
export type McpCloseReason = 'deleted' | 'idle' | 'evicted' | 'role-removed' | 'closed'

export interface McpSessionOpenedEvent { role: string, sessionId: string }
export interface McpSessionClosedEvent { role: string, sessionId: string, reason: McpCloseReason }

export interface McpSessionsEvents {
  'session-opened': [McpSessionOpenedEvent]
  'session-closed': [McpSessionClosedEvent]
}

/**
 * How long a new session that has never had an event stream is ranked, for eviction, as one that
 * has. A client opens its stream right after `initialize` (and `notifications/initialized`); until
 * then it looks like an abandoned session, and clients connecting at once to a full server would
 * each evict the one before it mid-handshake, leaving one connected.
 */
const HANDSHAKE_GRACE_MS = 5000

/**
 * Longest a change waits for its `list_changed` to leave for a client's socket: a client that
 * reads takes it in well under a millisecond; one whose socket fills with it has stopped reading.
 */
const FLUSH_WAIT_MS = 1000

/** Defaults of the options that are not in the runtime's `mcp` options (config.ts has the others). */
const DEFAULTS = { idleTimeoutMs: 600_000, reconnectGraceMs: 30_000 }

/**
 * A `tools/list` page holds at most this many bytes of JSON (and at least one tool). Each answer is
 * one event of a stream, and clients bound an event: the MCP Python SDK's default is 1 MiB.
 */
const LIST_PAGE_BYTES = 768 * 1024

/**
 * An object output whose text is longer than this (UTF-8) is sent as text only, without the same
 * output again as `structuredContent` (no tool here declares an `outputSchema`, so the text is
 * what clients read): the two would double the event, past the bound clients set on one (above).
 */
const MAX_STRUCTURED_TEXT_BYTES = 256 * 1024

/**
 * JSON-RPC "internal error": the answer to a call whose session ended under it. Never -32000,
 * which SDK clients (the stdio bridge among them) take for a lost connection.
 */
const RPC_INTERNAL_ERROR = -32603

/** Why a session ended, as the answer to the calls it had running tells the client. */
const ENDED_BECAUSE: Record<McpCloseReason, string> = {
  deleted: 'the client ended it',
  idle: 'it was idle',
  evicted: 'it was evicted to make room for another',
  'role-removed': 'its role was removed',
  closed: 'Toolport is shutting down'
}

type ResolvedOptions = Required<Omit<McpSessionsOptions, 'eventStore'>> & { eventStore: EventStoreLimits }

/** Calls in flight per session, per client and in all: one counter set per McpSessions. */
class CallBudget {
  readonly #options: ResolvedOptions
  readonly #perClient = new Map<string, number>()
  #total = 0

  constructor (options: ResolvedOptions) {
    this.#options = options
  }

  /** Takes one call for `session`; '' on success, else why not (the tool error text). */
  acquire (session: McpSession): string {
    const o = this.#options
    if (session.callsInFlight >= o.maxCallsPerSession) {
      return `too many calls in flight on this MCP session (${o.maxCallsPerSession}); try again when some have answered`
    }
    const client = this.#perClient.get(session.client) ?? 0
    if (client >= o.maxCallsPerClient) {
      return `too many calls in flight from this MCP client (${o.maxCallsPerClient}); try again when some have answered`
    }
    if (this.#total >= o.maxCalls) return 'Toolport is busy (too many MCP calls in flight); try again shortly'
    this.#perClient.set(session.client, client + 1)
    this.#total++
    return ''
  }

  release (session: McpSession): void {
    const client = (this.#perClient.get(session.client) ?? 1) - 1
    if (client <= 0) this.#perClient.delete(session.client)
    else this.#perClient.set(session.client, client)
    this.#total--
  }
}

/**
 * The MCP sessions of one server, keyed by `Mcp-Session-Id`. The HTTP routes (http/mcp-routes.ts) route
 * each request to its session; this class owns their lifecycle.
 *
 * @example
 * const sessions = new McpSessions(tp)
 * const session = await sessions.open('Lanlan'); await session?.handle(req, res, body)
 */
export class McpSessions extends EventEmitter<McpSessionsEvents> {
  readonly #runtime: Runtime
  readonly #options: ResolvedOptions
  readonly #budget: CallBudget
  readonly #sessions = new Map<string, McpSession>()
  /** Sessions created but not yet initialized (counted against maxSessions, closed on closeAll). */
  readonly #starting = new Set<McpSession>()
  #closed = false

  constructor (runtime: Runtime, options: McpSessionsOptions = {}) {
    super()
    this.#runtime = runtime
    runtime.on('role-removed', this.#onRoleRemoved)
    // Explicit options win over the runtime's `mcp` options, which have the defaults.
    const mcp = runtime.options.mcp
    this.#options = {
      idleTimeoutMs: options.idleTimeoutMs ?? DEFAULTS.idleTimeoutMs,
      reconnectGraceMs: options.reconnectGraceMs ?? DEFAULTS.reconnectGraceMs,
      maxSessions: options.maxSessions ?? mcp.maxSessions,
      maxSessionsPerClient: options.maxSessionsPerClient ?? mcp.maxSessionsPerClient,
      maxCallsPerSession: options.maxCallsPerSession ?? mcp.maxCallsPerSession,
      maxCallsPerClient: options.maxCallsPerClient ?? mcp.maxCallsPerClient,
      maxCalls: options.maxCalls ?? mcp.maxCalls ?? Math.max(1, Math.floor(runtime.options.dispatch.maxPending / 4)),
      retryIntervalMs: options.retryIntervalMs ?? mcp.retryIntervalMs,
      eventStore: options.eventStore ?? { maxEvents: mcp.eventStoreMaxEvents, maxBytes: mcp.eventStoreMaxBytes }
    }
    this.#budget = new CallBudget(this.#options)
  }

  /** Initialized sessions now open. */
  get size (): number { return this.#sessions.size }

  /** The initialized session with this id, or undefined. */
  get (sessionId: string): McpSession | undefined {
    return this.#sessions.get(sessionId)
  }

  /** Open sessions of one role, or of every role. */
  list (role?: string): McpSession[] {
    const all = [...this.#sessions.values()]
    return role === undefined ? all : all.filter((s) => s.role === role)
  }

  /**
   * A new session of `role` for an `initialize` request from `client` (see the file comment), or
   * null when closing or full of sessions that all have a request in flight or a call running. Makes room first by
   * evicting (see `maxSessions`, `maxSessionsPerClient`). The session joins the map and attaches
   * to its role once that request succeeds; otherwise it closes.
   */
  async open (role: string, client = ''): Promise<McpSession | null> {
    // Before the checks: they and the session's creation must see the same counts.
    await loadMcpSdk()
    if (this.#closed) return null
    const mine = this.list().filter((s) => s.client === client)
    let starting = 0
    for (const s of this.#starting) if (s.client === client) starting++
    if (mine.length + starting >= this.#options.maxSessionsPerClient && !(await this.#evictOne(mine))) return null
    if (this.#sessions.size + this.#starting.size >= this.#options.maxSessions &&
      !(await this.#evictOne(this.list()))) {
      return null
    }
    const session = new McpSession(this.#runtime, role, client, this.#options, this.#budget, {
      initialized: (s) => this.#initialized(s),
      closed: (s, reason, wasInitialized) => this.#ended(s, reason, wasInitialized)
    })
    this.#starting.add(session)
    await session.start()
    return session
  }

  /** Ends every session (server close); their running calls are aborted. */
  async closeAll (): Promise<void> {
    this.#closed = true
    this.#runtime.off('role-removed', this.#onRoleRemoved)
    const all = [...this.#starting, ...this.#sessions.values()]
    await Promise.allSettled(all.map((s) => s.close('closed')))
  }

  /**
   * A removed role's sessions end with it, at once: left open, a session would go on answering
   * from whichever role of that name is there at its next request (one added again, say) without
   * being one of its sessions, so never told of its changes.
   */
  readonly #onRoleRemoved = ({ role }: { role: string }): void => {
    for (const session of [...this.#starting, ...this.#sessions.values()]) {
      if (session.role !== role) continue
      // Forgotten now, so that its next request is a 404 even before close() is done.
      this.#forget(session)
      session.close('role-removed').catch(noop)
    }
  }

  #forget (session: McpSession): void {
    this.#starting.delete(session)
    if (this.#sessions.get(session.sessionId) === session) this.#sessions.delete(session.sessionId)
  }

  /**
   * Ends the least recently active of `candidates` that has no request in flight and no call
   * running (one whose stream dropped still runs, and its client may resume for the answer),
   * preferring one without an event stream; false when every candidate is busy. A session already
   * ending is nobody's room twice: `initialize`s at once each end a session of their own.
   */
  async #evictOne (candidates: readonly McpSession[]): Promise<boolean> {
    let victim: McpSession | undefined
    const now = performance.now()
    for (const s of candidates) {
      if (s.isEnding || s.requestsInFlight > 0 || s.callsInFlight > 0) continue
      if (victim === undefined || evictsBefore(s, victim, now)) victim = s
    }
    if (victim === undefined) return false
    this.#runtime.log.info({ role: victim.role, session: victim.sessionId }, 'MCP session evicted to make room')
    await victim.close('evicted')
    return true
  }

  #initialized (session: McpSession): void {
    this.#starting.delete(session)
    this.#sessions.set(session.sessionId, session)
    this.#runtime.log.info({ role: session.role, session: session.sessionId, id: session.id }, 'MCP session opened')
    if (this.listenerCount('session-opened') > 0) {
      this.emit('session-opened', {
        role: session.role,
        sessionId: session.sessionId
      })
    }
  }

  #ended (session: McpSession, reason: McpCloseReason, wasInitialized: boolean): void {
    this.#forget(session)
    if (!wasInitialized) return
    this.#runtime.log.info({ role: session.role, session: session.sessionId, reason }, 'MCP session closed')
    if (this.listenerCount('session-closed') > 0) {
      this.emit('session-closed', { role: session.role, sessionId: session.sessionId, reason })
    }
  }
}

/**
 * True when `a` should be evicted before `b`: one without an event stream first, then the least
 * recently active. A session still in its handshake counts as one with a stream (see
 * `HANDSHAKE_GRACE_MS`).
 */
function evictsBefore (a: McpSession, b: McpSession, now: number): boolean {
  const aStreams = a.hasStreamOrIsNew(now)
  if (aStreams !== b.hasStreamOrIsNew(now)) return !aStreams
  return a.lastActive < b.lastActive
}

interface SessionHooks {
  initialized: (session: McpSession) => void
  closed: (session: McpSession, reason: McpCloseReason, wasInitialized: boolean) => void
}

/**
 * One MCP client session of one role: a `ModelSession` whose sync tells the client to re-list.
 * Create it through `McpSessions.open`.
 */
export class McpSession implements ModelSession {
  /**
   * The ModelSession id, `mcp-<uuid>`, as sync errors name it (in `failed_roles`, `sync` events and
   * the console). A random id of its own, not the `Mcp-Session-Id`: those messages reach other
   * plugins and event readers, and the session id is the handle that reads the session's streams.
   */
  readonly id: string
  /** The `Mcp-Session-Id` the client sends. */
  readonly sessionId: string
  readonly role: string
  /** The client that opened it (peer address and port of the `initialize` request). */
  readonly client: string
  readonly #runtime: Runtime
  readonly #options: ResolvedOptions
  readonly #budget: CallBudget
  readonly #hooks: SessionHooks
  readonly #server: Server
  readonly #transport: StreamableHTTPServerTransport
  /** The transport's books of requests and streams; undefined if the SDK's internals differ. */
  readonly #books: TransportBooks | undefined
  /** The protocol version negotiated at `initialize`. */
  #protocolVersion = ''
  /**
   * Whether the request being handed to the transport is HTTP/1.x with x ≥ 1 (chunked framing;
   * HTTP/2 forbids the header). Set only while `handleRequest` runs synchronously.
   */
  #isChunkable = false
  #calls = 0
  #lastActive = performance.now()
  readonly #createdAt = this.#lastActive
  #detach: (() => void) | null = null
  /** The snapshot the client last listed; null until its first `tools/list`. */
  #listed: readonly ToolDefinition[] | null = null
  /** Standalone GET streams open: the session's event stream. */
  #streams = 0
  /** The response of the event stream (the first standalone GET open; the SDK refuses others). */
  #eventStream: ServerResponse | null = null
  /** Other requests in flight (a GET resuming a request's stream among them). */
  #requests = 0
  readonly #eventStore: BoundedEventStore
  /** `tools/call` requests running and not cancelled, each with its handler's abort signal. */
  readonly #running = new Map<RequestId, AbortSignal>()
  /** Set once close() has begun. */
  #closing: Promise<void> | null = null
  #hadStream = false
  #idleTimer: NodeJS.Timeout | undefined
  #closeReason: McpCloseReason = 'closed'
  #isInitialized = false
  #isClosed = false

  constructor (runtime: Runtime, role: string, client: string, options: ResolvedOptions, budget: CallBudget,
    hooks: SessionHooks) {
    this.sessionId = randomUUID()
    this.id = `mcp-${randomUUID()}`
    this.role = role
    this.client = client
    this.#runtime = runtime
    this.#options = options
    this.#budget = budget
    this.#hooks = hooks
    const sessionId = this.sessionId
    const { Server, StreamableHTTPServerTransport, types } = mcpSdk()
    this.#eventStore = new BoundedEventStore(options.eventStore)
    this.#transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => sessionId,
      onsessioninitialized: () => this.#onInitialized(),
      // A valid DELETE, before the transport closes: its running calls are answered as close()'s
      // are, not left to wait for their client's request timeout.
      onsessionclosed: () => this.#answerRunning('deleted'),
      eventStore: this.#eventStore,
      retryInterval: options.retryIntervalMs
    })
    this.#books = transportBooks(this.#transport)
    primeByNegotiatedVersion(this.#transport, () => this.#protocolVersion)
    streamWithoutReadAhead(this.#transport, () => this.#isChunkable)
    endFinishedStreamsOnResume(this.#transport, this.#books, this.#eventStore)
    this.#server = new Server({ ...MCP_SERVER_INFO }, {
      capabilities: { tools: { listChanged: true } },
      instructions: mcpInstructions(role)
    })
    this.#server.setRequestHandler(checkedRequest(types.ListToolsRequestSchema), (request) => this.#listTools(request))
    this.#server.setRequestHandler(checkedRequest(types.CallToolRequestSchema),
      (request, extra) => this.#callTool(request, extra))
    this.#server.onclose = () => this.#onClosed()
    this.#server.onerror = (err) => {
      // Protocol noise (a client's 406, a bad message) is the client's problem: debug only, and
      // without the SDK's message, which quotes what the client sent (a whole JSON-RPC message, a
      // header's value): the log holds metadata only (SECURITY.md).
      this.#runtime.log.debug({ role, session: sessionId, error: err.name }, 'MCP transport error')
    }
  }

  /**
   * The id of a request in `body` (one message or a batch) that a request in flight holds, or
   * that another request of the same batch has, if any.
   */
  #idInFlight (body: unknown): RequestId | undefined {
    const inFlight = this.#books?.requests
    if (inFlight === undefined) return undefined
    const isBatch = Array.isArray(body)
    if (!isBatch && inFlight.size === 0) return undefined
    const seen = isBatch ? new Set<RequestId>() : null
    for (const message of isBatch ? body as unknown[] : [body]) {
      const { id, method } = message as { id?: RequestId, method?: unknown }
      if (typeof method !== 'string' || id === undefined) continue
      if (inFlight.has(id) || seen?.has(id) === true) return id
      seen?.add(id)
    }
    return undefined
  }

  get isInitialized (): boolean { return this.#isInitialized }
  get isClosed (): boolean { return this.#isClosed }

  /** True once close() has begun. */
  get isEnding (): boolean { return this.#closing !== null || this.#isClosed }
  /** `tools/call` requests running now. */
  get callsInFlight (): number { return this.#calls }
  /** HTTP requests other than event streams being served now. */
  get requestsInFlight (): number { return this.#requests }
  /** Whether an event stream (the standalone GET) is open. */
  get hasStream (): boolean { return this.#streams > 0 }

  /**
   * Whether eviction ranks this session with those that have an event stream: it has one open, or
   * it never had one and began less than `HANDSHAKE_GRACE_MS` before `now` (a `performance.now()`).
   */
  hasStreamOrIsNew (now: number): boolean {
    return this.#streams > 0 || (!this.#hadStream && now - this.#createdAt < HANDSHAKE_GRACE_MS)
  }

  /** `performance.now()` of the last request's start or end. */
  get lastActive (): number { return this.#lastActive }

  /** Connects the SDK server to its transport; call once before the first `handle`. */
  async start (): Promise<void> {
    await this.#server.connect(this.#transport)
  }

  /**
   * Serves one HTTP request of this session (POST, GET event stream, DELETE). Resolves when the
   * response has ended; for a GET, when the event stream closes.
   */
  async handle (request: IncomingMessage, response: ServerResponse, body: unknown): Promise<void> {
    if (request.method === 'POST') {
      const reused = this.#idInFlight(body)
      if (reused !== undefined) {
        // JSON-RPC ids of requests in flight must differ; the transport routes answers by id, so a
        // second request with one would take the first one's answer and leave its stream open.
        response.writeHead(400, { 'content-type': 'application/json' }).end(JSON.stringify({
          jsonrpc: '2.0',
          error: { code: -32600, message: `Invalid Request: the id ${JSON.stringify(reused)} is in use by a request in flight in this session or its batch` },
          id: null
        }))
        return
      }
    }
    const header = request.headers['last-event-id']
    const lastEventId = request.method === 'GET' && typeof header === 'string' ? header : ''
    const isResume = lastEventId !== ''
    // The event stream is the standalone GET, opened fresh or resumed; a GET resuming a request's
    // stream (Last-Event-ID of a POST's event) belongs to that request.
    const isStream = request.method === 'GET' && (!isResume || isStandaloneEventId(lastEventId))
    if (request.method === 'DELETE') this.#closeReason = 'deleted'
    if (this.#protocolVersion === '' && mcpSdk().types.isInitializeRequest(body)) {
      const requested = body.params.protocolVersion
      const { SUPPORTED_PROTOCOL_VERSIONS, LATEST_PROTOCOL_VERSION } = mcpSdk().types
      this.#protocolVersion = SUPPORTED_PROTOCOL_VERSIONS.includes(requested) ? requested : LATEST_PROTOCOL_VERSION
    }
    this.#lastActive = performance.now()
    clearTimeout(this.#idleTimer)
    if (isStream) {
      this.#streams++
      this.#hadStream = true
      this.#eventStream ??= response
    } else {
      this.#requests++
    }
    try {
      // Read by streamWithoutReadAhead while handleRequest runs synchronously, before any await.
      this.#isChunkable = request.httpVersionMajor === 1 && request.httpVersionMinor >= 1
      // What the transport writes before this turn of the event loop ends (the headers, the
      // priming event, an answer that is already there) leaves in one write, not one each.
      const socket = response.socket
      if (socket !== null && !socket.destroyed) {
        socket.cork()
        setImmediate(uncork, socket)
      }
      const handled = this.#transport.handleRequest(request, response, body)
      this.#isChunkable = false
      // The transport registers a fresh GET's event stream synchronously inside handleRequest,
      // and queues what is sent on it until the headers go out: a change the client has not
      // been told of on a stream it still has can be announced now and reaches it first thing.
      // (A resumed event stream is replayed what it missed instead.)
      if (isStream && !isResume) this.#announceIfStale()
      await handled
    } finally {
      this.#lastActive = performance.now()
      if (isStream) this.#streams--
      else this.#requests--
      if (this.#eventStream === response) this.#eventStream = null
      if (request.method === 'DELETE' && !this.#isClosed) this.#closeReason = 'closed'
      if (!this.#isInitialized) {
        // A session lives only if its first request, `initialize`, succeeded.
        await this.close('closed')
      } else {
        this.#armIdle()
      }
    }
  }

  /**
   * ModelSession: tells the client its list changed. Resolves once the notification is written
   * to the client's event stream (handed to its socket, not only queued: the API call that made
   * the change answers after it); with no stream open it resolves once it is stored (the next
   * `tools/list` reads the registry live): a client that resumes its stream is replayed it, and
   * one that opens a new stream is sent a fresh one (#announceIfStale).
   */
  async syncTools (tools: readonly ToolDefinition[], signal: AbortSignal): Promise<void> {
    // Nothing to announce to a client that never listed, or that listed exactly this snapshot.
    if (this.#isClosed || this.#listed === null || this.#listed === tools) return
    signal.throwIfAborted()
    try {
      // A client that stopped reading its stream (the socket already has bytes it could not send)
      // is not waited for: it would hold every change to its role; the notice is queued for it.
      const socket = this.#eventStream?.socket ?? null
      const isBackedUp = socket !== null && unsentBytes(socket) > 0
      await this.#server.sendToolListChanged()
      if (socket !== null && !isBackedUp) await flushed(socket, signal)
    } catch (err) {
      // A session that ended meanwhile (DELETE, disconnect) has nothing left to sync.
      if (this.#isClosed) return
      throw err
    }
  }

  /**
   * Ends the session: its running calls are answered with a JSON-RPC error (see #answerRunning)
   * and aborted, its streams closed, its role detached. Only the first call's reason counts.
   */
  async close (reason: McpCloseReason = 'closed'): Promise<void> {
    this.#closing ??= this.#close(reason)
    await this.#closing
  }

  async #close (reason: McpCloseReason): Promise<void> {
    if (this.#isClosed) return
    this.#closeReason = reason
    await this.#answerRunning(reason)
    // Server.close closes the transport, whose onclose ends in #onClosed.
    await this.#server.close()
    // A transport that never started has no onclose to fire.
    this.#onClosed()
  }

  /**
   * Answers every running call with a JSON-RPC error before the session ends: closing the SDK
   * server aborts their handlers, and the SDK drops an aborted handler's answer as it does a
   * cancelled one's, which would leave each client waiting for its own request timeout. Sent
   * while the transport is open, each answer ends its request's stream; a call whose stream is
   * down has it stored (its client cannot resume a session that ended). The handler's own answer
   * comes after the session closed, and is dropped.
   */
  async #answerRunning (reason: McpCloseReason): Promise<void> {
    if (this.#running.size === 0) return
    const message = `the MCP session ended before the call finished (${ENDED_BECAUSE[reason]}); the call was cancelled`
    const ids = [...this.#running.keys()]
    this.#running.clear()
    await Promise.all(ids.map((id) => {
      const answer = { jsonrpc: '2.0', id, error: { code: RPC_INTERNAL_ERROR, message } } as JSONRPCMessage
      return this.#transport.send(answer).catch(noop)
    }))
  }

  #onInitialized (): void {
    const role = this.#runtime.roles.find(this.role)
    // An `initialize` that raced close(): the session never opens (it ends after this request).
    if (role === undefined || this.#isClosed || this.#runtime.closed) return
    this.#isInitialized = true
    this.#detach = role.attachSession(this)
    this.#hooks.initialized(this)
  }

  #onClosed (): void {
    if (this.#isClosed) return
    this.#isClosed = true
    clearTimeout(this.#idleTimer)
    this.#detach?.()
    this.#detach = null
    this.#hooks.closed(this, this.#closeReason, this.#isInitialized)
  }

  #listTools (request: ListToolsRequest): ListToolsResult {
    const tools = this.#runtime.roles.get(this.role).registry.definitions()
    this.#listed = tools
    // The frozen, memoised MCP form of this snapshot; the SDK only serialises it.
    const all = toolDefinitions(tools, 'mcp') as ListToolsResult['tools']
    return listPage(all, request.params?.cursor)
  }

  async #callTool (request: CallToolRequest, extra: RequestHandlerExtra<ServerRequest,
    ServerNotification>): Promise<CallToolResult> {
    const { name } = request.params
    const args = request.params.arguments ?? {}
    const { requestId, signal } = extra
    if (this.#closing !== null) throw rpcError(RPC_INTERNAL_ERROR, 'the MCP session is ending; the tool was not called')
    this.#running.set(requestId, signal)
    if (signal.aborted) this.#onCancelled(requestId, signal)
    else signal.addEventListener('abort', () => { this.#onCancelled(requestId, signal) }, { once: true })
    try {
      const isKnown = this.#runtime.roles.find(this.role)?.registry.get(name) !== undefined
      if (!isKnown) {
        // Still through the runtime, so the call is counted and reported like any other.
        const result = await this.#runtime.callTool(this.role, { name, arguments: args },
          { signal, [kJsonArguments]: true })
        // MCP's "unknown tool" is a protocol error, not a tool result.
        throw invalidParams(result.error ?? `unknown tool '${name}'`)
      }
      const refused = this.#budget.acquire(this)
      // Through the runtime too, so the refused call is counted and reported like any other.
      if (refused !== '') return toCallToolResult(this.#runtime[kRefuseCall](this.role, name, refused))
      this.#calls++
      try {
        const result = await this.#runtime.callTool(this.role, { name, arguments: args },
          { signal, [kJsonArguments]: true })
        return sendableResult(toCallToolResult(result))
      } finally {
        this.#calls--
        this.#budget.release(this)
      }
    } finally {
      if (this.#running.get(requestId) === signal) this.#running.delete(requestId)
      if (this.#isInitialized) this.#armIdle()
    }
  }

  /**
   * A running call was cancelled (`notifications/cancelled`): it gets no answer (MCP
   * "Cancellation"; the SDK drops its handler's), so nothing more will be sent on its request's
   * stream. Once the SDK has dropped it, the request leaves the transport's books and its stream
   * ends, so that neither side holds it open waiting, and a client that resumes it is refused
   * (endFinishedStreamsOnResume). Not on close: the session's end answers and ends everything.
   */
  #onCancelled (requestId: RequestId, signal: AbortSignal): void {
    if (this.#running.get(requestId) === signal) this.#running.delete(requestId)
    if (this.#closing !== null || this.#isClosed) return
    const books = this.#books
    const streamId = books?.requests.get(requestId)
    // After the SDK's own answer path has run: an answer already on its way is left to it.
    setImmediate(() => {
      if (this.#isClosed) return
      if (books === undefined) {
        this.#transport.closeSSEStream(requestId)
        return
      }
      if (streamId === undefined || books.requests.get(requestId) !== streamId || books.responses.has(requestId)) return
      // A batch's stream ends once every other request on it has its answer too.
      const others = requestsOnStream(books, streamId).filter((id) => id !== requestId)
      if (!others.every((id) => books.responses.has(id))) {
        books.requests.delete(requestId)
        return
      }
      this.#transport.closeSSEStream(requestId)
      for (const id of [requestId, ...others]) {
        books.requests.delete(id)
        books.responses.delete(id)
      }
      books.resumable?.delete(streamId)
    })
  }

  /**
   * On a fresh event stream: `list_changed` when the role's tools differ from what the client
   * last listed. A notice sent on a stream that dropped before the client read it, or stored
   * while no stream was open, is not lost then; a second notice is harmless (the client lists).
   */
  #announceIfStale (): void {
    const current = this.#runtime.roles.find(this.role)?.registry.definitions()
    if (this.#listed === null || current === undefined || current === this.#listed) return
    this.#server.sendToolListChanged().catch(noop)
  }

  /**
   * Starts the idle timer once nothing is open and no call runs: a call whose own stream dropped
   * (a network blip) still runs, and its client may resume that stream to get the answer.
   */
  #armIdle (): void {
    if (this.#isClosed || this.#streams > 0 || this.#requests > 0 || this.#running.size > 0) return
    clearTimeout(this.#idleTimer)
    const ms = this.#hadStream ? this.#options.reconnectGraceMs : this.#options.idleTimeoutMs
    this.#idleTimer = setTimeout(closeIdle, ms, this)
    this.#idleTimer.unref()
  }
}

/**
 * A ToolResult as MCP's CallToolResult: the model's text, one `image` content item per image the
 * tool returned, `isError`, and the object output as is.
 */
export function toCallToolResult (result: ToolResult): CallToolResult {
  const content: CallToolResult['content'] = [{ type: 'text', text: result.text }]
  if (result.images !== undefined) {
    for (const image of result.images) {
      content.push({
        type: 'image',
        data: image.data_base64,
        mimeType: image.mime_type
      })
    }
  }
  const out: CallToolResult = { content, isError: result.is_error }
  // A top-level `__proto__` key would not survive: the SDK re-validates the result, and zod's
  // rebuilt object turns that key into a prototype. The text carries it.
  if (!result.is_error && isPlainObject(result.output) && !Object.hasOwn(result.output, '__proto__')) {
    out.structuredContent = result.output
  }
  return out
}

/** Deeper output than this is not sent as `structuredContent` (JSON.stringify would overflow the stack). */
const MAX_STRUCTURED_DEPTH = 4096

/**
 * A result the transport can encode and clients can take: the output is in the text too, so it is
 * left out of `structuredContent` when there it would double a long answer (past
 * MAX_STRUCTURED_TEXT_BYTES) or nest too deep for JSON.stringify (a reply nested 200 000 levels
 * would make the response vanish). `POST /api/tools/call` answers such outputs as their text too.
 */
function sendableResult (result: CallToolResult): CallToolResult {
  if (result.structuredContent === undefined) return result
  const text = (result.content[0] as { text: string }).text
  if (isLongerThan(text, MAX_STRUCTURED_TEXT_BYTES) ||
    jsonDepth(result.structuredContent, MAX_STRUCTURED_DEPTH) > MAX_STRUCTURED_DEPTH) {
    delete result.structuredContent
  }
  return result
}

/** Whether `text` is longer than `bytes` in UTF-8 (counted only when its length cannot tell). */
function isLongerThan (text: string, bytes: number): boolean {
  // A UTF-16 unit is 1 to 3 UTF-8 bytes (a surrogate pair is 4 for 2 units).
  if (text.length > bytes) return true
  if (text.length * 3 <= bytes) return false
  return Buffer.byteLength(text) > bytes
}

const definitionBytes = new WeakMap<object, number>()

/** How many bytes of JSON (UTF-8) one listed tool is (memoised: listed tools are frozen). */
export function bytesOf (tool: object): number {
  let bytes = definitionBytes.get(tool)
  if (bytes === undefined) {
    bytes = Buffer.byteLength(JSON.stringify(tool))
    definitionBytes.set(tool, bytes)
  }
  return bytes
}

/** The JSON-RPC "invalid params" error a request handler throws. */
function invalidParams (message: string): Error {
  return rpcError(mcpSdk().types.ErrorCode.InvalidParams, message)
}

/**
 * One `tools/list` page from `cursor` (the index of its first tool): pages hold about
 * LIST_PAGE_BYTES so a huge list is sent in parts the client fetches with `nextCursor`,
 * instead of one response too large to encode.
 */
function listPage (all: ListToolsResult['tools'], cursor: string | undefined): ListToolsResult {
  let start = 0
  if (cursor !== undefined) {
    if (!/^\d{1,9}$/.test(cursor) || Number(cursor) > all.length) {
      throw invalidParams(`invalid cursor ${JSON.stringify(cursor)}; list again without one`)
    }
    start = Number(cursor)
  }
  let end = start
  let bytes = 0
  while (end < all.length) {
    bytes += bytesOf(all[end] as object)
    if (bytes > LIST_PAGE_BYTES && end > start) break
    end++
  }
  if (start === 0 && end === all.length) return { tools: all }
  const page: ListToolsResult = { tools: all.slice(start, end) }
  if (end < all.length) page.nextCursor = String(end)
  return page
}

/**
 * The SDK sends the priming event of a resumable stream only when the request's
 * MCP-Protocol-Version header is 2025-11-25 or later; a client that negotiated such a version at
 * `initialize` but labels a request older (the conformance runner's raw requests do) could then
 * not resume it. Prime by the newer of the two. Guarded: if the SDK's internals differ, its own
 * behaviour stays.
 */
function primeByNegotiatedVersion (transport: StreamableHTTPServerTransport, negotiated: () => string): void {
  wrapInnerMethod(transport, 'writePrimingEvent', (original) => function writePrimingEvent (controller, encoder,
    streamId, version) {
    const session = negotiated()
    return original(controller, encoder, streamId, session > version ? session : version)
  })
}

/**
 * The SDK's Node transport answers through @hono/node-server, which reads ahead into a streamed
 * body before writing the headers, hoping the body ends soon enough to send it with a
 * Content-Length: it takes one chunk, and when a second is not ready at once it waits a
 * `setTimeout(0)` (a millisecond or more) for it. Every event stream here starts with its priming
 * event, so every MCP POST and GET paid that wait (measured: once per `tools/call`, ~1 ms of a
 * lone caller's latency). An event stream never ends soon; hono skips the read-ahead for a
 * response that says `Transfer-Encoding: chunked`, the framing node uses for it anyway on
 * HTTP/1.1. Set only for HTTP/1.1 (an HTTP/1.0 client cannot read chunked framing, and HTTP/2
 * forbids the header); others are answered as the SDK answers them. `isChunkable` is read when
 * the SDK calls in, synchronously inside the session's `handleRequest`: were a later SDK to call in
 * after an await, it would read false and change nothing. If the SDK's internals differ, its own
 * behaviour stays (wrapInnerMethod).
 */
function streamWithoutReadAhead (transport: StreamableHTTPServerTransport, isChunkable: () => boolean): void {
  wrapInnerMethod(transport, 'handleRequest', (original) => async function handleRequest (request, options) {
    const chunkable = isChunkable()
    const response = await original(request, options)
    if (chunkable && response.body !== null && !response.headers.has('transfer-encoding') &&
      (response.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
      response.headers.set('transfer-encoding', 'chunked')
    }
    return response
  })
}

/**
 * A request stream that has nothing more to send (every request on it answered, or cancelled)
 * could still be resumed with `Last-Event-ID` of one of its events, and the SDK then holds the
 * resumed GET open for good: nothing ends it, and the SDK client resumes every request stream
 * that ended without a *result* (a JSON-RPC error, a cancelled call, a stream that dropped).
 * Here such a resume is sent what the stream has left (its stored answer), then ends; with
 * nothing left it is refused with a 400, after which SDK clients stop retrying. A request still
 * running is resumed as the SDK does it (its answer ends the stream). If the SDK's internals
 * differ, its own behaviour stays.
 */
function endFinishedStreamsOnResume (transport: StreamableHTTPServerTransport, books: TransportBooks | undefined,
  store: BoundedEventStore): void {
  if (books === undefined) return
  const isFinished = (streamId: string): boolean => requestsOnStream(books, streamId).length === 0
  wrapInnerMethod(transport, 'replayEvents', (original) => async function replayEvents (lastEventId) {
    const streamId = streamOfEventId(lastEventId)
    if (streamId === undefined || isStandaloneStream(streamId)) return await original(lastEventId)
    if (isFinished(streamId) && !store.hasEventsAfter(lastEventId)) {
      const message = 'Bad Request: that stream has ended and has nothing more to send'
      return new Response(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message }, id: null }), {
        status: 400,
        headers: { 'content-type': 'application/json' }
      })
    }
    const response = await original(lastEventId)
    // Finished before or while it was replayed: what the replay missed is sent on the client's
    // next resume.
    if (response.ok && isFinished(streamId)) {
      books.streams.get(streamId)?.cleanup?.()
      // The SDK marks a replayed stream resumable again; a finished one stays so until the session
      // ends (a day-long session would keep every stream id it resumed).
      books.resumable?.delete(streamId)
    }
    return response
  })
}

/** The SDK transport's books of requests and streams (internals), or undefined if they differ. */
interface TransportBooks {
  /** Request id → the id of the stream its answer goes on, while it is unanswered. */
  requests: Map<RequestId, string>
  /** Answers of a batch's requests, kept until every request on its stream has one. */
  responses: Map<RequestId, unknown>
  /** Open streams by id, each with the cleanup that ends it. */
  streams: Map<string, { cleanup?: () => void }>
  resumable: Set<string> | undefined
}

function transportBooks (transport: StreamableHTTPServerTransport): TransportBooks | undefined {
  const inner = innerTransport<Record<string, unknown>>(transport)
  const requests = inner?._requestToStreamMapping
  const responses = inner?._requestResponseMap
  const streams = inner?._streamMapping
  const resumable = inner?._resumableStreams
  if (!(requests instanceof Map) || !(responses instanceof Map) || !(streams instanceof Map)) return undefined
  return {
    requests: requests as TransportBooks['requests'],
    responses,
    streams: streams as TransportBooks['streams'],
    resumable: resumable instanceof Set ? resumable as Set<string> : undefined
  }
}

/** The requests on stream `streamId` that are not yet answered (or whose batch is not), in the books' order. */
function requestsOnStream (books: TransportBooks, streamId: string): RequestId[] {
  const ids: RequestId[] = []
  for (const [id, stream] of books.requests) if (stream === streamId) ids.push(id)
  return ids
}

/** The methods of the SDK transport's inner web-standard transport that this file wraps. */
interface InnerTransport {
  writePrimingEvent: (controller: unknown, encoder: unknown, streamId: string, version: string) => Promise<void>
  handleRequest: (request: Request, options?: unknown) => Promise<Response>
  replayEvents: (lastEventId: string) => Promise<Response>
}

/**
 * Replaces one method of the SDK transport's inner transport with `wrap(original)`, `original`
 * bound to it. Does nothing when the SDK's internals differ (no inner transport, no such
 * method): the SDK's own behaviour stays.
 */
function wrapInnerMethod<K extends keyof InnerTransport> (transport: StreamableHTTPServerTransport, name: K,
  wrap: (original: InnerTransport[K]) => InnerTransport[K]): void {
  const inner = innerTransport<InnerTransport>(transport)
  const original = inner?.[name]
  if (inner === undefined || typeof original !== 'function') return
  inner[name] = wrap(original.bind(inner) as InnerTransport[K])
}

/** The SDK transport's inner web-standard transport (internals); undefined if the SDK's internals differ. */
function innerTransport<T extends object> (transport: StreamableHTTPServerTransport): Partial<T> | undefined {
  return (transport as unknown as { _webStandardTransport?: Partial<T> })._webStandardTransport
}

function uncork (socket: Socket): void {
  socket.uncork()
}

function closeIdle (session: McpSession): void {
  session.close('idle').catch(noop)
}

/**
 * Resolves once everything written to an event stream's `socket` so far has left for the client.
 * The transport's write only queues a chunk (Node sends a chunked response's writes at the next
 * tick), so without this the API call's answer, written at once, went out first. A write's
 * callback comes after every earlier write's; an empty one adds no byte to the stream. Waited
 * for FLUSH_WAIT_MS at most: a client whose socket fills with this very notice has stopped
 * reading, and the next change does not wait for it at all (see syncTools).
 */
async function flushed (socket: Socket, signal: AbortSignal): Promise<void> {
  if (socket.destroyed || socket.writableLength === 0) return
  signal.throwIfAborted()
  await new Promise<void>((resolve, reject) => {
    const done = (): void => {
      clearTimeout(timer)
      signal.removeEventListener('abort', onAbort)
      resolve()
    }
    const onAbort = (): void => {
      clearTimeout(timer)
      reject(signal.reason)
    }
    const timer = setTimeout(done, FLUSH_WAIT_MS)
    signal.addEventListener('abort', onAbort, { once: true })
    // An error means the stream is gone: nothing is left to wait for (the session ends).
    socket.write('', done)
  })
}
