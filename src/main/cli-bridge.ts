// The stdio bridge behind `toolport mcp --role NAME [--url …]` : a stdio MCP server
// for clients that only launch stdio servers, forwarding to a running Toolport's /mcp/:role with
// the SDK's Client over Streamable HTTP.
//
// - tools/list and tools/call are forwarded as they are (results, `isError`, `structuredContent`);
//   a downstream cancellation cancels the upstream call (the SDK sends notifications/cancelled).
// - Upstream `notifications/tools/list_changed` is forwarded downstream, so the client re-lists.
// - Toolport may start after the bridge, or restart (registrations are runtime only, docs/protocol.md R3):
//   the bridge reconnects with backoff, re-initializes a lost session, and tells the client to
//   re-list. While Toolport is unreachable the list is empty and calls are model-visible errors.
// - stdout carries the protocol only; diagnostics go to `log` (stderr in the CLI).
import type { Readable, Writable } from 'node:stream'
import { Server } from '@modelcontextprotocol/sdk/server/index.js'
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  CallToolRequestSchema, CallToolResultSchema, ErrorCode, ListToolsRequestSchema, McpError,
  ToolListChangedNotificationSchema,
  type CallToolRequest, type CallToolResult, type ListToolsRequest, type ListToolsResult,
  type ServerNotification, type ServerRequest
} from '@modelcontextprotocol/sdk/types.js'
import type { RequestHandlerExtra } from '@modelcontextprotocol/sdk/shared/protocol.js'
import { MCP_SERVER_INFO, mcpInstructions } from './sessions/mcp-info.js'
import { RoleNotFoundError } from './errors.js'
import { noop } from '../shared/util.js'

export interface BridgeOptions {
  /** The role whose tools the client gets. */
  role: string
  /** Base URL of the running Toolport, e.g. `http://127.0.0.1:3917`. */
  url: string
  /** Extra headers on every upstream request (e.g. `authorization` in token mode). */
  headers?: Record<string, string>
  /** Where the MCP client talks (default process.stdin / process.stdout). */
  stdin?: Readable
  stdout?: Writable
  /** Diagnostics, one line each (default: none). Never stdout: it carries the protocol. */
  log?: (line: string) => void
  /** Longest wait for one forwarded tool call (default 330 s: Toolport's 300 s cap plus margin). */
  callTimeoutMs?: number
  /** How often an idle upstream is pinged to notice a Toolport that went away (default 15 s). */
  pingIntervalMs?: number
}

export interface Bridge {
  /** The upstream endpoint, `<url>/mcp/<role>`. */
  readonly endpoint: URL
  /** Resolves once the bridge has stopped (stdin ended, or `close()`). */
  readonly closed: Promise<void>
  /** Stops the bridge: ends the upstream session (DELETE) and the stdio server. */
  close (): Promise<void>
}

const RECONNECT_MIN_MS = 1_000
const RECONNECT_MAX_MS = 30_000

/**
 * Starts the stdio bridge. Rejects with TP_ERR_ROLE_NOT_FOUND when the role does not exist on the
 * Toolport it reached; an unreachable Toolport is not an error (the bridge keeps trying).
 *
 * @example
 * const bridge = await startBridge({ role: 'Lanlan', url: 'http://127.0.0.1:3917', log: (l) => process.stderr.write(l +
 * '\n') })
 * await bridge.closed
 */
export async function startBridge (options: BridgeOptions): Promise<Bridge> {
  const bridge = new StdioBridge(options)
  await bridge.start()
  return bridge
}

/** `<base>/mcp/<role>`, keeping a path prefix the base URL may have. */
export function bridgeEndpoint (url: string, role: string): URL {
  const base = new URL(url)
  if (base.protocol !== 'http:' &&
    base.protocol !== 'https:') throw new TypeError(`--url must be http or https (got ${url})`)
  if (!base.pathname.endsWith('/')) base.pathname += '/'
  return new URL(`mcp/${encodeURIComponent(role)}`, base)
}

class StdioBridge implements Bridge {
  readonly endpoint: URL
  readonly closed: Promise<void>
  readonly #options: BridgeOptions
  readonly #server: Server
  readonly #stdio: StdioServerTransport
  readonly #log: (line: string) => void
  #upstream: Client | null = null
  #connecting: Promise<Client | null> | null = null
  #reconnectTimer: NodeJS.Timeout | undefined
  #reconnectDelayMs = RECONNECT_MIN_MS
  #pingTimer: NodeJS.Timeout | undefined
  #isClosed = false
  #resolveClosed: () => void = noop

  constructor (options: BridgeOptions) {
    this.#options = options
    this.endpoint = bridgeEndpoint(options.url, options.role)
    this.#log = options.log ?? noop
    this.closed = new Promise((resolve) => { this.#resolveClosed = resolve })
    this.#stdio = new StdioServerTransport(options.stdin, options.stdout)
    this.#server = new Server({ ...MCP_SERVER_INFO }, {
      capabilities: { tools: { listChanged: true } },
      instructions: mcpInstructions(options.role)
    })
    this.#server.setRequestHandler(ListToolsRequestSchema, (request) => this.#listTools(request))
    this.#server.setRequestHandler(CallToolRequestSchema, (request, extra) => this.#callTool(request, extra))
    this.#server.onclose = () => { this.close().catch(noop) }
  }

  async start (): Promise<void> {
    // A misconfigured role fails fast; an absent Toolport does not (it may start later).
    const upstream = await this.#connect(true)
    if (upstream === null) this.#scheduleReconnect()
    await this.#server.connect(this.#stdio)
    const stdin = this.#options.stdin ?? process.stdin
    // StdioServerTransport does not watch for the end of its input: the client is gone then.
    stdin.once('end', () => { this.close().catch(noop) })
    stdin.once('close', () => { this.close().catch(noop) })
    const every = this.#options.pingIntervalMs ?? 15_000
    this.#pingTimer = setInterval(() => { this.#ping().catch(noop) }, every)
    this.#pingTimer.unref()
  }

  async close (): Promise<void> {
    if (this.#isClosed) return await this.closed
    this.#isClosed = true
    clearTimeout(this.#reconnectTimer)
    clearInterval(this.#pingTimer)
    const upstream = this.#upstream
    this.#upstream = null
    if (upstream !== null) await endUpstream(upstream)
    await this.#server.close().catch(noop)
    this.#resolveClosed()
  }

  async #listTools (request: ListToolsRequest): Promise<ListToolsResult> {
    const attempt = async (): Promise<ListToolsResult> => {
      const upstream = await this.#ready()
      if (upstream === null) return { tools: [] }
      return await upstream.listTools(request.params)
    }
    try {
      return await attempt()
    } catch (err) {
      // Listing is idempotent: after any transport failure, reconnect and try once more.
      if (!this.#isTransportFailure(err)) throw err
      this.#dropUpstream(err)
      return await attempt()
    }
  }

  async #callTool (request: CallToolRequest, extra: RequestHandlerExtra<ServerRequest,
    ServerNotification>): Promise<CallToolResult> {
    const options = { signal: extra.signal, timeout: this.#options.callTimeoutMs ?? 330_000 }
    const attempt = async (): Promise<CallToolResult> => {
      const upstream = await this.#ready()
      if (upstream === null) return unreachableResult(this.endpoint)
      return await upstream.callTool(request.params, CallToolResultSchema, options) as CallToolResult
    }
    try {
      return await attempt()
    } catch (err) {
      if (extra.signal.aborted || !this.#isTransportFailure(err)) throw err
      this.#dropUpstream(err)
      // Retry only when the call surely never ran: the session was unknown upstream (Toolport
      // restarted) or no connection was made. Anything else might have run the tool once already.
      if (!isSessionGone(err) && !isConnectFailure(err)) return unreachableResult(this.endpoint)
      return await attempt()
    }
  }

  /** The connected upstream, connecting now if needed; null when Toolport is unreachable. */
  async #ready (): Promise<Client | null> {
    if (this.#upstream !== null) return this.#upstream
    return await this.#connect(false)
  }

  async #connect (isFirst: boolean): Promise<Client | null> {
    if (this.#connecting !== null) return await this.#connecting
    this.#connecting = this.#open(isFirst)
    try {
      return await this.#connecting
    } finally {
      this.#connecting = null
    }
  }

  async #open (isFirst: boolean): Promise<Client | null> {
    if (this.#isClosed) return null
    const client = new Client({ name: 'toolport-bridge', version: MCP_SERVER_INFO.version })
    client.setNotificationHandler(ToolListChangedNotificationSchema, () => this.#announceChange())
    const transport = new StreamableHTTPClientTransport(this.endpoint, {
      requestInit: { headers: { ...this.#options.headers } }
    })
    try {
      await client.connect(transport)
    } catch (err) {
      await client.close().catch(noop)
      if (isRoleNotFound(err)) {
        this.#log(`toolport mcp: role '${this.#options.role}' does not exist on the Toolport at ${this.endpoint.origin}`)
        if (isFirst) throw new RoleNotFoundError(this.#options.role)
      } else {
        this.#log(`toolport mcp: cannot reach ${this.endpoint.href}: ${describe(err)}`)
      }
      return null
    }
    if (this.#isClosed) {
      await endUpstream(client)
      return null
    }
    this.#upstream = client
    this.#reconnectDelayMs = RECONNECT_MIN_MS
    this.#log(`toolport mcp: connected to ${this.endpoint.href}`)
    // The tool set may differ from what the client last listed (a new or restarted Toolport).
    if (!isFirst) this.#announceChange()
    return client
  }

  #dropUpstream (err: unknown): void {
    const upstream = this.#upstream
    if (upstream === null) return
    this.#upstream = null
    this.#log(`toolport mcp: lost the upstream session: ${describe(err)}`)
    upstream.close().catch(noop)
  }

  #scheduleReconnect (): void {
    if (this.#isClosed || this.#reconnectTimer !== undefined) return
    const delay = this.#reconnectDelayMs
    this.#reconnectDelayMs = Math.min(delay * 2, RECONNECT_MAX_MS)
    this.#reconnectTimer = setTimeout(() => {
      this.#reconnectTimer = undefined
      if (this.#upstream !== null) return
      this.#connect(false).then((client) => { if (client === null) this.#scheduleReconnect() }, noop)
    }, delay)
  }

  async #ping (): Promise<void> {
    if (this.#isClosed || this.#connecting !== null) return
    const upstream = this.#upstream
    if (upstream === null) {
      this.#scheduleReconnect()
      return
    }
    try {
      await upstream.ping({ timeout: 10_000 })
    } catch (err) {
      if (this.#upstream !== upstream) return
      this.#dropUpstream(err)
      this.#scheduleReconnect()
    }
  }

  #announceChange (): void {
    if (this.#isClosed) return
    this.#server.sendToolListChanged().catch(noop)
  }

  #isTransportFailure (err: unknown): boolean {
    if (err instanceof McpError) return err.code === ErrorCode.ConnectionClosed
    // fetch rejects with a TypeError for every network-level failure.
    return err instanceof StreamableHTTPError || err instanceof TypeError
  }
}

/** Ends an upstream session politely (DELETE, so Toolport detaches it at once), then closes it. */
async function endUpstream (client: Client): Promise<void> {
  const transport = client.transport
  if (transport instanceof StreamableHTTPClientTransport) await transport.terminateSession().catch(noop)
  await client.close().catch(noop)
}

function unreachableResult (endpoint: URL): CallToolResult {
  const text = JSON.stringify({ error: `Toolport is not reachable at ${endpoint.origin}; the tool was not called` })
  return { content: [{ type: 'text', text }], isError: true }
}

function isSessionGone (err: unknown): boolean {
  return err instanceof StreamableHTTPError && err.code === 404
}

function isRoleNotFound (err: unknown): boolean {
  return err instanceof StreamableHTTPError && err.code === 404 && err.message.includes('TP_ERR_ROLE_NOT_FOUND')
}

/** fetch failed before any request was sent (refused, unreachable, connect timeout). */
function isConnectFailure (err: unknown): boolean {
  if (!(err instanceof TypeError)) return false
  const code = (err.cause as { code?: unknown } | undefined)?.code
  return code === 'ECONNREFUSED' || code === 'ENOTFOUND' || code === 'EHOSTUNREACH' || code === 'ENETUNREACH' ||
    code === 'UND_ERR_CONNECT_TIMEOUT'
}

function describe (err: unknown): string {
  if (!(err instanceof Error)) return String(err)
  const code = (err.cause as { code?: unknown } | undefined)?.code
  return typeof code === 'string' ? `${err.message} (${code})` : err.message
}
