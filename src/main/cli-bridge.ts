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
// - A call is sent again on a new session only when it surely never ran: Toolport refused it for a
//   session it no longer has (404), or no connection was made. A session found gone is retired,
//   not closed under the calls still on it: they get their own answer or their own 404.
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
import { MCP_SERVER_INFO, mcpInstructions, rpcError } from './sessions/mcp-info.js'
import { RoleNotFoundError } from './errors.js'
import { roleNameProblem } from './config.js'
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
 * A retired upstream (its session gone) is closed once its last request settles, or this long
 * after it was retired: an answer Toolport sent before the session ended is in by then, and a
 * request still waiting never gets one (its session cannot be resumed).
 */
const RETIRED_CLOSE_MS = 2_000

/** One upstream session: the SDK client and the bridge's requests on it. */
interface Upstream {
  readonly client: Client
  /** tools/list and tools/call requests waiting on it. */
  requests: number
  closeTimer: NodeJS.Timeout | undefined
}

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

/**
 * A bridge option that can never work: `setting` names it, the message says why (and is meant to
 * follow the name the caller gave the setting, e.g. `--url` or `TOOLPORT_URL`).
 */
export class BridgeSettingError extends TypeError {
  readonly setting: 'url' | 'role'

  constructor (setting: 'url' | 'role', message: string) {
    super(message)
    this.setting = setting
  }
}

/** `<base>/mcp/<role>`, keeping a path prefix the base URL may have. */
export function bridgeEndpoint (url: string, role: string): URL {
  let base: URL
  try {
    base = new URL(url)
  } catch {
    throw new BridgeSettingError('url', `is not a URL (got ${JSON.stringify(url)})`)
  }
  if (base.protocol !== 'http:' &&
    base.protocol !== 'https:') throw new BridgeSettingError('url', `must be http or https (got ${url})`)
  // The rule of the role names a Toolport accepts: `..` would name the server root here, not a role.
  const problem = roleNameProblem(role)
  if (problem !== undefined) throw new BridgeSettingError('role', `${JSON.stringify(role)} is not a role name: ${problem}`)
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
  #upstream: Upstream | null = null
  /** Upstreams dropped (retired): no new request goes to one, and it closes once its `requests` is 0. */
  readonly #retired = new Set<Upstream>()
  #connecting: Promise<Upstream | null> | null = null
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
    // An upstream JSON-RPC error is answered as Toolport sent it (throwForwardable).
    this.#server.setRequestHandler(ListToolsRequestSchema, async (request) =>
      await this.#listTools(request).catch(throwForwardable))
    this.#server.setRequestHandler(CallToolRequestSchema, async (request, extra) =>
      await this.#callTool(request, extra).catch(throwForwardable))
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
    for (const retired of this.#retired) this.#closeRetired(retired)
    if (upstream !== null) await endUpstream(upstream.client)
    await this.#server.close().catch(noop)
    this.#resolveClosed()
  }

  async #listTools (request: ListToolsRequest): Promise<ListToolsResult> {
    for (let attempt = 1; ; attempt++) {
      const upstream = await this.#ready()
      if (upstream === null) return { tools: [] }
      try {
        return await this.#on(upstream, async (client) => await client.listTools(request.params))
      } catch (err) {
        if (!isTransportFailure(err)) throw err
        this.#dropUpstream(upstream, err)
        // Listing is idempotent: after any transport failure, reconnect and try once more.
        if (attempt > 1) throw err
      }
    }
  }

  async #callTool (request: CallToolRequest, extra: RequestHandlerExtra<ServerRequest,
    ServerNotification>): Promise<CallToolResult> {
    const options = { signal: extra.signal, timeout: this.#options.callTimeoutMs ?? 330_000 }
    for (let attempt = 1; ; attempt++) {
      const upstream = await this.#ready()
      if (upstream === null) return unreachableResult(this.endpoint)
      try {
        return await this.#on(upstream, async (client) =>
          await client.callTool(request.params, CallToolResultSchema, options) as CallToolResult)
      } catch (err) {
        if (extra.signal.aborted || !isTransportFailure(err)) throw err
        this.#dropUpstream(upstream, err)
        // Retry only when the call surely never ran: Toolport refused it for a session it no
        // longer has (a restart, the role removed), or no connection was made. Anything else
        // might have run the tool once already.
        const neverRan = isSessionGone(err) || isConnectFailure(err)
        if (!neverRan) return lostResult(this.endpoint)
        if (attempt > 1) throw err
      }
    }
  }

  /** Runs one request on `upstream`, counted so that a retired upstream closes once it is idle. */
  async #on<T> (upstream: Upstream, request: (client: Client) => Promise<T>): Promise<T> {
    upstream.requests++
    try {
      return await request(upstream.client)
    } finally {
      upstream.requests--
      if (upstream.requests === 0) this.#closeRetired(upstream)
    }
  }

  /** The connected upstream, connecting now if needed; null when Toolport is unreachable. */
  async #ready (): Promise<Upstream | null> {
    if (this.#upstream !== null) return this.#upstream
    return await this.#connect(false)
  }

  async #connect (isFirst: boolean): Promise<Upstream | null> {
    if (this.#connecting !== null) return await this.#connecting
    this.#connecting = this.#open(isFirst)
    try {
      return await this.#connecting
    } finally {
      this.#connecting = null
    }
  }

  async #open (isFirst: boolean): Promise<Upstream | null> {
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
    const upstream: Upstream = { client, requests: 0, closeTimer: undefined }
    this.#upstream = upstream
    this.#reconnectDelayMs = RECONNECT_MIN_MS
    this.#log(`toolport mcp: connected to ${this.endpoint.href}`)
    // The tool set may differ from what the client last listed (a new or restarted Toolport).
    if (!isFirst) this.#announceChange()
    return upstream
  }

  /**
   * Stops using `upstream` after `err` (and only it: a newer one that calls made together already
   * moved to stays). One whose session is gone (404) is retired: the requests still on it get
   * their own answer or their own 404 (which is retried), instead of being cut short by its close
   * as if they might have run. After any other failure (Toolport unreachable) it closes at once,
   * ending the requests on it.
   */
  #dropUpstream (upstream: Upstream, err: unknown): void {
    if (this.#upstream !== upstream) return
    this.#upstream = null
    this.#log(`toolport mcp: lost the upstream session: ${describe(err)}`)
    this.#retired.add(upstream)
    if (!isSessionGone(err) || upstream.requests === 0) {
      this.#closeRetired(upstream)
      return
    }
    upstream.closeTimer = setTimeout(() => { this.#closeRetired(upstream) }, RETIRED_CLOSE_MS)
    upstream.closeTimer.unref()
  }

  #closeRetired (upstream: Upstream): void {
    if (!this.#retired.delete(upstream)) return
    clearTimeout(upstream.closeTimer)
    upstream.client.close().catch(noop)
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
      await upstream.client.ping({ timeout: 10_000 })
    } catch (err) {
      if (this.#upstream !== upstream) return
      this.#dropUpstream(upstream, err)
      this.#scheduleReconnect()
    }
  }

  #announceChange (): void {
    if (this.#isClosed) return
    this.#server.sendToolListChanged().catch(noop)
  }
}

function isTransportFailure (err: unknown): boolean {
  if (err instanceof McpError) return err.code === ErrorCode.ConnectionClosed
  // fetch rejects with a TypeError for every network-level failure.
  return err instanceof StreamableHTTPError || err instanceof TypeError
}

/**
 * Throws what a bridge handler failed with, an upstream JSON-RPC error as Toolport sent it (its
 * code, data and message). The client's McpError message carries an "MCP error <code>: " prefix,
 * which the downstream client's McpError would add a second time.
 */
function throwForwardable (err: unknown): never {
  if (!(err instanceof McpError)) throw err
  const prefix = `MCP error ${err.code}: `
  const message = err.message.startsWith(prefix) ? err.message.slice(prefix.length) : err.message
  throw rpcError(err.code, message, err.data)
}

/** Ends an upstream session politely (DELETE, so Toolport detaches it at once), then closes it. */
async function endUpstream (client: Client): Promise<void> {
  const transport = client.transport
  if (transport instanceof StreamableHTTPClientTransport) await transport.terminateSession().catch(noop)
  await client.close().catch(noop)
}

function unreachableResult (endpoint: URL): CallToolResult {
  return toolError(`Toolport is not reachable at ${endpoint.origin}; the tool was not called`)
}

/** A call whose connection was lost after it was sent: it may have run. */
function lostResult (endpoint: URL): CallToolResult {
  return toolError(`the connection to Toolport at ${endpoint.origin} was lost during the call; the tool may have run`)
}

/** A tool error the model reads: `{"error": message}`. */
function toolError (message: string): CallToolResult {
  return { content: [{ type: 'text', text: JSON.stringify({ error: message }) }], isError: true }
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
