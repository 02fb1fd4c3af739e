// Per-role MCP endpoint sessions: each MCP client session is a ModelSession of its
// role, built on the official SDK's low-level `Server` and `StreamableHTTPServerTransport`.
//
// - The sync is `notifications/tools/list_changed` on the client's event stream (its GET): MCP
//   clients pull the list, so a session "has" a change once the client has been told to re-list.
// - `tools/list` reads the registry snapshot live; `tools/call` runs `Runtime.callTool` with the
//   request's abort signal, which the SDK aborts on `notifications/cancelled` and on close.
// - A session attaches to its role once the client has initialized, and detaches when it ends:
//   DELETE, the client going away (its event stream closed and not reopened within a grace
//   period), inactivity, the role being removed, or the server closing.
import { EventEmitter } from 'node:events'
import { randomUUID } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { Server } from '@modelcontextprotocol/sdk/server/index.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import {
  CallToolRequestSchema, ListToolsRequestSchema,
  type CallToolRequest, type CallToolResult, type ListToolsResult, type ServerNotification, type ServerRequest
} from '@modelcontextprotocol/sdk/types.js'
import type { RequestHandlerExtra } from '@modelcontextprotocol/sdk/shared/protocol.js'
import type { Runtime } from '../runtime.js'
import type { ModelSession } from '../roles/sync.js'
import type { ToolDefinition } from '../roles/tool-registry.js'
import type { ToolResult } from '../dispatch/result.js'
import { isPlainObject, noop } from '../../shared/util.js'
import { VERSION } from '../version.js'
import { toolDefinitions } from './definitions.js'

/** The name and version Toolport gives MCP clients in `initialize`. */
export const MCP_SERVER_INFO = Object.freeze({ name: 'toolport', version: VERSION })

/** What an MCP client is told about a role's server (the endpoint's sessions and the stdio bridge). */
export function mcpInstructions (role: string): string {
  return `The tools of the Toolport role '${role}'. The list changes while you run: tools/list again when notified.`
}

export interface McpSessionsOptions {
  /** A session with no open event stream and no request for this long ends (default 10 min). */
  idleTimeoutMs?: number
  /**
   * After its event stream closed, a session ends unless the client reopens it or sends a request
   * within this long (default 30 s). SDK clients reconnect a dropped stream within seconds.
   */
  reconnectGraceMs?: number
  /** Most sessions at once, all roles together; an `initialize` beyond it gets 503 (default 256). */
  maxSessions?: number
}

/** Why a session ended. */
export type McpCloseReason = 'deleted' | 'idle' | 'role-removed' | 'closed'

export interface McpSessionOpenedEvent { role: string, sessionId: string }
export interface McpSessionClosedEvent { role: string, sessionId: string, reason: McpCloseReason }

export interface McpSessionsEvents {
  'session-opened': [McpSessionOpenedEvent]
  'session-closed': [McpSessionClosedEvent]
}

const DEFAULTS = { idleTimeoutMs: 600_000, reconnectGraceMs: 30_000, maxSessions: 256 }

/**
 * The MCP sessions of one server, keyed by `Mcp-Session-Id`. The HTTP routes (http/mcp.ts) route
 * each request to its session; this class owns their lifecycle.
 *
 * @example
 * const sessions = new McpSessions(tp)
 * const session = await sessions.open('Lanlan'); await session?.handle(req, res, body)
 */
export class McpSessions extends EventEmitter<McpSessionsEvents> {
  readonly #runtime: Runtime
  readonly #options: Required<McpSessionsOptions>
  readonly #sessions = new Map<string, McpSession>()
  /** Sessions created but not yet initialized (counted against maxSessions, closed on closeAll). */
  readonly #starting = new Set<McpSession>()
  #closed = false

  constructor (runtime: Runtime, options: McpSessionsOptions = {}) {
    super()
    this.#runtime = runtime
    this.#options = {
      idleTimeoutMs: options.idleTimeoutMs ?? DEFAULTS.idleTimeoutMs,
      reconnectGraceMs: options.reconnectGraceMs ?? DEFAULTS.reconnectGraceMs,
      maxSessions: options.maxSessions ?? DEFAULTS.maxSessions
    }
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
   * A new session of `role` for an `initialize` request, or null when closing or full. It joins
   * the map and attaches to its role once that request succeeds; otherwise it closes.
   */
  async open (role: string): Promise<McpSession | null> {
    if (this.#closed || this.#sessions.size + this.#starting.size >= this.#options.maxSessions) return null
    const session = new McpSession(this.#runtime, role, this.#options, {
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
    const all = [...this.#starting, ...this.#sessions.values()]
    await Promise.allSettled(all.map((s) => s.close('closed')))
  }

  #initialized (session: McpSession): void {
    this.#starting.delete(session)
    this.#sessions.set(session.sessionId, session)
    this.#runtime.log.info({ role: session.role, session: session.sessionId }, 'MCP session opened')
    if (this.listenerCount('session-opened') > 0) this.emit('session-opened', { role: session.role, sessionId: session.sessionId })
  }

  #ended (session: McpSession, reason: McpCloseReason, wasInitialized: boolean): void {
    this.#starting.delete(session)
    if (this.#sessions.get(session.sessionId) === session) this.#sessions.delete(session.sessionId)
    if (!wasInitialized) return
    this.#runtime.log.info({ role: session.role, session: session.sessionId, reason }, 'MCP session closed')
    if (this.listenerCount('session-closed') > 0) {
      this.emit('session-closed', { role: session.role, sessionId: session.sessionId, reason })
    }
  }
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
  /** The ModelSession id (`mcp-<session id>`), as `failed_roles` errors name it. */
  readonly id: string
  /** The `Mcp-Session-Id` the client sends. */
  readonly sessionId: string
  readonly role: string
  readonly #runtime: Runtime
  readonly #options: Required<McpSessionsOptions>
  readonly #hooks: SessionHooks
  readonly #server: Server
  readonly #transport: StreamableHTTPServerTransport
  #detach: (() => void) | null = null
  /** The snapshot the client last listed; null until its first `tools/list`. */
  #listed: readonly ToolDefinition[] | null = null
  /** A change arrived while the client had no event stream: announce it when one opens. */
  #hasPendingNotice = false
  /** GET requests in flight: each is an open event stream. */
  #streams = 0
  /** Other requests in flight. */
  #requests = 0
  #hadStream = false
  #idleTimer: NodeJS.Timeout | undefined
  #closeReason: McpCloseReason = 'closed'
  #isInitialized = false
  #isClosed = false

  constructor (runtime: Runtime, role: string, options: Required<McpSessionsOptions>, hooks: SessionHooks) {
    this.sessionId = randomUUID()
    this.id = `mcp-${this.sessionId}`
    this.role = role
    this.#runtime = runtime
    this.#options = options
    this.#hooks = hooks
    const sessionId = this.sessionId
    this.#transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => sessionId,
      onsessioninitialized: () => this.#onInitialized()
    })
    this.#server = new Server({ ...MCP_SERVER_INFO }, {
      capabilities: { tools: { listChanged: true } },
      instructions: mcpInstructions(role)
    })
    this.#server.setRequestHandler(ListToolsRequestSchema, () => this.#listTools())
    this.#server.setRequestHandler(CallToolRequestSchema, (request, extra) => this.#callTool(request, extra))
    this.#server.onclose = () => this.#onClosed()
    this.#server.onerror = (err) => {
      // Protocol noise (a client's 406, a bad message) is the client's problem: debug only.
      this.#runtime.log.debug({ role, session: sessionId, message: err.message }, 'MCP transport error')
    }
  }

  get isInitialized (): boolean { return this.#isInitialized }
  get isClosed (): boolean { return this.#isClosed }

  /** Connects the SDK server to its transport; call once before the first `handle`. */
  async start (): Promise<void> {
    await this.#server.connect(this.#transport)
  }

  /**
   * Serves one HTTP request of this session (POST, GET event stream, DELETE). Resolves when the
   * response has ended; for a GET, when the event stream closes.
   */
  async handle (request: IncomingMessage, response: ServerResponse, body: unknown): Promise<void> {
    const isStream = request.method === 'GET'
    if (request.method === 'DELETE') this.#closeReason = 'deleted'
    clearTimeout(this.#idleTimer)
    if (isStream) {
      this.#streams++
      this.#hadStream = true
    } else {
      this.#requests++
    }
    try {
      const handled = this.#transport.handleRequest(request, response, body)
      // The transport registers a GET's event stream synchronously inside handleRequest, and
      // queues what is sent on it until the headers go out: a change that found no stream can
      // be announced now and reaches the client first thing.
      if (isStream) this.#flushNotice()
      await handled
    } finally {
      if (isStream) this.#streams--
      else this.#requests--
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
   * to the client's event stream; with no stream open it resolves at once (the next `tools/list`
   * reads the registry live) and the notification follows when the client opens one.
   */
  async syncTools (tools: readonly ToolDefinition[], signal: AbortSignal): Promise<void> {
    // Nothing to announce to a client that never listed, or that listed exactly this snapshot.
    if (this.#isClosed || this.#listed === null || this.#listed === tools) return
    if (this.#streams === 0) {
      this.#hasPendingNotice = true
      return
    }
    signal.throwIfAborted()
    try {
      await this.#server.sendToolListChanged()
    } catch (err) {
      // A session that ended meanwhile (DELETE, disconnect) has nothing left to sync.
      if (this.#isClosed) return
      throw err
    }
  }

  /** Ends the session: its running calls are aborted, its streams closed, its role detached. */
  async close (reason: McpCloseReason = 'closed'): Promise<void> {
    if (this.#isClosed) return
    this.#closeReason = reason
    // Server.close closes the transport, whose onclose ends in #onClosed.
    await this.#server.close()
    // A transport that never started has no onclose to fire.
    this.#onClosed()
  }

  #onInitialized (): void {
    const role = this.#runtime.roles.find(this.role)
    if (role === undefined || this.#isClosed) return
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

  #listTools (): ListToolsResult {
    const tools = this.#runtime.roles.get(this.role).registry.definitions()
    this.#listed = tools
    this.#hasPendingNotice = false
    // The frozen, memoised MCP form of this snapshot; the SDK only serialises it.
    return { tools: toolDefinitions(tools, 'mcp') as ListToolsResult['tools'] }
  }

  async #callTool (request: CallToolRequest, extra: RequestHandlerExtra<ServerRequest, ServerNotification>): Promise<CallToolResult> {
    const { name } = request.params
    const args = request.params.arguments ?? {}
    const result = await this.#runtime.callTool(this.role, { name, arguments: args }, { signal: extra.signal })
    if (extra.signal.aborted) {
      // A cancelled request gets no response (MCP "Cancellation"; the SDK drops it): end the
      // request's event stream too, so neither side holds it open waiting.
      this.#transport.closeSSEStream(extra.requestId)
    }
    return toCallToolResult(result)
  }

  #flushNotice (): void {
    if (!this.#hasPendingNotice) return
    this.#hasPendingNotice = false
    const current = this.#runtime.roles.find(this.role)?.registry.definitions()
    if (this.#listed === null || current === undefined || current === this.#listed) return
    this.#server.sendToolListChanged().catch(noop)
  }

  #armIdle (): void {
    if (this.#isClosed || this.#streams > 0 || this.#requests > 0) return
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
    for (const image of result.images) content.push({ type: 'image', data: image.data_base64, mimeType: image.mime_type })
  }
  const out: CallToolResult = { content, isError: result.is_error }
  if (!result.is_error && isPlainObject(result.output)) out.structuredContent = result.output
  return out
}

function closeIdle (session: McpSession): void {
  session.close('idle').catch(noop)
}
