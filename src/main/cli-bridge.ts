// The stdio bridge behind `toolport mcp --role NAME [--url …]` : a stdio MCP server
// for clients that only launch stdio servers, forwarding to a running Toolport's /mcp/:role with
// the SDK's Client over Streamable HTTP.
//
// - tools/list and tools/call are forwarded as they are (results, `isError`, `structuredContent`);
//   a downstream cancellation cancels the upstream call (the SDK sends notifications/cancelled).
// - Upstream `notifications/tools/list_changed` is forwarded downstream, so the client re-lists.
// - Toolport may start after the bridge, or restart (registrations are runtime only, docs/protocol.md R3):
//   the bridge reconnects with backoff, re-initializes a lost session, and tells the client to
//   re-list. While Toolport is unreachable the list is empty and calls are model-visible errors
//   that say why (unreachable, the token refused, the role gone, no room for a session).
// - A request Toolport refuses with an HTTP error status other than 404 (413 too large or too
//   deep, 400, 401, 403, 415, …) never ran: its JSON-RPC error is answered as Toolport sent it
//   (docs/protocol.md "MCP endpoint"), and the session, which is fine, is kept.
// - A call is sent again on a new session only when it surely never ran: Toolport refused it for a
//   session it no longer has (404), or no connection was made. A session found gone is retired,
//   not closed under the calls still on it: they get their own answer or their own 404.
// - stdin and stdout are the bridge's own line transport (StdioLineTransport): every line that is
//   not a JSON-RPC message is answered with a JSON-RPC error with id null, as /mcp/:role answers
//   such a body; a line too long to take is refused the same way; an answer too long for the MCP
//   SDK's stdio client to read is never written.
// - stdout carries the protocol only; diagnostics go to `log` (stderr in the CLI).
import { setMaxListeners } from 'node:events'
import type { Readable, Writable } from 'node:stream'
import { Server } from '@modelcontextprotocol/sdk/server/index.js'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { STDIO_DEFAULT_MAX_BUFFER_SIZE } from '@modelcontextprotocol/sdk/shared/stdio.js'
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js'
import {
  CallToolRequestSchema, CallToolResultSchema, ErrorCode, JSONRPCMessageSchema, ListToolsRequestSchema, McpError,
  ToolListChangedNotificationSchema, isInitializeRequest, isJSONRPCErrorResponse, isJSONRPCRequest,
  isJSONRPCResultResponse,
  type CallToolRequest, type CallToolResult, type JSONRPCMessage, type JSONRPCRequest,
  type ListToolsRequest, type ListToolsResult,
  type RequestId, type ServerNotification, type ServerRequest
} from '@modelcontextprotocol/sdk/types.js'
import type { RequestHandlerExtra } from '@modelcontextprotocol/sdk/shared/protocol.js'
import { checkedRequest, MCP_SERVER_INFO, mcpInstructions, readJsonRpcBody, rpcError } from './sessions/mcp-info.js'
import { roleNameProblem } from './config.js'
import { errorText, isPlainObject, noop } from '../shared/util.js'

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
  /**
   * Stops the bridge when aborted (the CLI's SIGINT and SIGTERM), as the end of stdin does, also
   * while it is still making its first connection.
   */
  signal?: AbortSignal
}

export interface Bridge {
  /** The upstream endpoint, `<url>/mcp/<role>`. */
  readonly endpoint: URL
  /** Resolves once the bridge has stopped (stdin ended, `signal` aborted, or `close()`). */
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
/**
 * Longest wait for a new upstream session (initialize and initialized): a Toolport that is up but
 * does not answer counts as unreachable after it, so that the client gets its initialize answer.
 */
const CONNECT_TIMEOUT_MS = 10_000
/** Longest wait for the DELETE that ends the upstream session when the bridge stops. */
const END_SESSION_TIMEOUT_MS = 2_000
/**
 * The longest line the bridge reads from stdin (its newline not counted): the MCP SDK's own stdio
 * transports' cap. Toolport takes far less in one request (`limits.maxBodyBytes`).
 */
const MAX_STDIN_LINE_BYTES = STDIO_DEFAULT_MAX_BUFFER_SIZE
/**
 * The longest line the bridge writes to stdout, its newline included. The MCP SDK's
 * StdioClientTransport gives up on its client when what it holds unread passes
 * STDIO_DEFAULT_MAX_BUFFER_SIZE (10 MiB): a whole line but its newline, plus the rest of the pipe
 * read (64 KiB at most) that brought the newline.
 */
const MAX_STDOUT_LINE_BYTES = STDIO_DEFAULT_MAX_BUFFER_SIZE - 64 * 1024
/** JSON-RPC 2.0 error codes (JSON-RPC 2.0 §5.1), as the MCP SDK names them. */
const RPC_PARSE_ERROR = ErrorCode.ParseError
const RPC_INVALID_REQUEST = ErrorCode.InvalidRequest
const RPC_INTERNAL_ERROR = ErrorCode.InternalError

/**
 * Whether `message` is an `initialize` request: its method is looked at first, so a `tools/call`
 * (whose arguments may be large) is never run through the whole initialize schema.
 */
function isInitialize (message: JSONRPCMessage): message is JSONRPCRequest {
  return isJSONRPCRequest(message) && message.method === 'initialize' && isInitializeRequest(message)
}

/** One upstream session: the SDK client and the bridge's requests on it. */
interface Upstream {
  readonly client: Client
  /** tools/list and tools/call requests waiting on it. */
  requests: number
  closeTimer: NodeJS.Timeout | undefined
}

/**
 * Starts the stdio bridge. Rejects with the Toolport's refusal (a BridgeRefusedError with its
 * code) when the role does not exist on the Toolport it reached (TP_ERR_ROLE_NOT_FOUND) or that
 * Toolport refuses the bridge's token or the bridge itself (TP_ERR_UNAUTHORIZED, …), and with a
 * BridgeSettingError for `url` when a Toolport answers there but has no MCP route under it
 * (TP_ERR_ROUTE_NOT_FOUND: a path such as `/api` in the URL); an unreachable Toolport is not an
 * error (the bridge keeps trying).
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

/**
 * The Toolport refused the bridge's first session with 401 or 403 (a token it does not take, none
 * given in token mode, a Host it does not accept) or 404 TP_ERR_ROLE_NOT_FOUND (no such role):
 * trying again cannot help. `code` is the TP_ERR_* code Toolport answered (docs/protocol.md
 * "Errors of the API itself").
 */
export class BridgeRefusedError extends Error {
  readonly code: string | undefined
  readonly statusCode: number

  constructor (message: string, statusCode: number, code: string | undefined) {
    super(message)
    this.statusCode = statusCode
    this.code = code
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
  // Quoting nothing of the URL: it may hold a password.
  if (base.username !== '' || base.password !== '') {
    throw new BridgeSettingError('url', 'must not hold credentials (user:password@); in token mode give --token-file')
  }
  if (base.protocol !== 'http:' &&
    base.protocol !== 'https:') throw new BridgeSettingError('url', `must be http or https (got ${base.protocol})`)
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
  readonly #stdio: StdioLineTransport
  readonly #log: (line: string) => void
  #upstream: Upstream | null = null
  /** Upstreams dropped (retired): no new request goes to one, and it closes once its `requests` is 0. */
  readonly #retired = new Set<Upstream>()
  #connecting: Promise<Upstream | null> | null = null
  /** The client of a connection being made: closed to cut it short when the bridge stops. */
  #opening: Client | undefined
  /** Why the last connection failed, as a tool error tells the model (null: none failed since). */
  #lastFailure: string | null = null
  #reconnectTimer: NodeJS.Timeout | undefined
  #reconnectDelayMs = RECONNECT_MIN_MS
  #pingTimer: NodeJS.Timeout | undefined
  #isClosed = false
  #resolveClosed: () => void = noop
  readonly #onStop = (): void => { this.close().catch(noop) }

  constructor (options: BridgeOptions) {
    this.#options = options
    this.endpoint = bridgeEndpoint(options.url, options.role)
    this.#log = options.log ?? noop
    this.closed = new Promise((resolve) => { this.#resolveClosed = resolve })
    // Reads from now on: the end of stdin stops the bridge even while its first connection is made.
    this.#stdio = new StdioLineTransport(options.stdin ?? process.stdin, options.stdout ?? process.stdout,
      this.#log, this.#onStop)
    this.#server = new Server({ ...MCP_SERVER_INFO }, {
      capabilities: { tools: { listChanged: true } },
      instructions: mcpInstructions(options.role)
    })
    // An upstream JSON-RPC error is answered as Toolport sent it (throwForwardable).
    this.#server.setRequestHandler(checkedRequest(ListToolsRequestSchema), async (request) =>
      await this.#listTools(request).catch(throwForwardable))
    this.#server.setRequestHandler(checkedRequest(CallToolRequestSchema), async (request, extra) =>
      await this.#callTool(request, extra).catch(throwForwardable))
    this.#server.onclose = () => { this.close().catch(noop) }
  }

  async start (): Promise<void> {
    const signal = this.#options.signal
    if (signal?.aborted === true) return await this.close()
    signal?.addEventListener('abort', this.#onStop, { once: true })
    // A misconfigured role or a refused token fails fast; an absent Toolport does not (it may start
    // later). The client's initialize is answered after this first attempt, so that a client that
    // lists at once finds the session there.
    let upstream: Upstream | null
    try {
      upstream = await this.#connect(true)
    } catch (err) {
      await this.close()
      throw err
    }
    if (this.#isClosed) return
    if (upstream === null) this.#scheduleReconnect()
    await this.#server.connect(this.#stdio)
    const every = this.#options.pingIntervalMs ?? 15_000
    this.#pingTimer = setInterval(() => { this.#ping().catch(noop) }, every)
    this.#pingTimer.unref()
  }

  async close (): Promise<void> {
    if (this.#isClosed) return await this.closed
    this.#isClosed = true
    this.#options.signal?.removeEventListener('abort', this.#onStop)
    clearTimeout(this.#reconnectTimer)
    clearInterval(this.#pingTimer)
    // A connection under way is cut short (its fetch aborted): it may wait on a Toolport that does
    // not answer.
    this.#opening?.close().catch(noop)
    const upstream = this.#upstream
    this.#upstream = null
    for (const retired of this.#retired) this.#closeRetired(retired)
    await Promise.all([
      upstream === null ? undefined : endUpstream(upstream.client, this.endpoint, this.#options.headers),
      this.#connecting?.catch(noop)
    ])
    await this.#server.close().catch(noop)
    await this.#stdio.close()
    this.#resolveClosed()
  }

  async #listTools (request: ListToolsRequest): Promise<ListToolsResult> {
    for (let attempt = 1; ; attempt++) {
      const upstream = await this.#ready()
      if (upstream === null) return { tools: [] }
      try {
        return await this.#on(upstream, async (client) => await client.listTools(request.params))
      } catch (err) {
        const refusal = refusalOf(err)
        if (refusal !== undefined) throw this.#refused('tools/list', refusal)
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
      if (upstream === null) return toolError(`${this.#lastFailure ?? this.#unreachable()}; the tool was not called`)
      let result: CallToolResult
      try {
        result = await this.#on(upstream, async (client) =>
          await client.callTool(request.params, CallToolResultSchema, options) as CallToolResult)
      } catch (err) {
        if (extra.signal.aborted) throw err
        // Refused before it ran (its session is fine and kept): Toolport's JSON-RPC error, or a
        // tool error saying why.
        const refusal = refusalOf(err)
        if (refusal !== undefined) {
          const refused = this.#refused('tools/call', refusal)
          if (refusal.rpc !== undefined) throw refused
          return toolError(`${refused.message}; the tool was not called`)
        }
        if (!isTransportFailure(err)) throw err
        this.#dropUpstream(upstream, err)
        // Retry only when the call surely never ran: Toolport refused it for a session it no
        // longer has (a restart, the role removed), or no connection was made. Anything else
        // might have run the tool once already.
        const neverRan = isSessionGone(err) || isConnectFailure(err)
        if (!neverRan) return lostResult(this.endpoint)
        if (attempt > 1) throw err
        continue
      }
      return result
    }
  }

  /**
   * A refusal of `method` as the stdio client is answered: Toolport's JSON-RPC error as it sent
   * it, or an error naming the HTTP status and Toolport's TP_ERR_* code.
   */
  #refused (method: string, refusal: Refusal): Error {
    const { status, rpc } = refusal
    if (rpc !== undefined) {
      this.#log(`toolport mcp: Toolport refused ${method} (HTTP ${status}, JSON-RPC error ${rpc.code}: ${rpc.message})`)
      return rpcError(rpc.code, rpc.message, rpc.data)
    }
    const message = `the Toolport at ${this.endpoint.origin} refused ${method} (${describeRefusal(refusal)})`
    this.#log(`toolport mcp: ${message}`)
    return rpcError(RPC_INTERNAL_ERROR, message)
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
      requestInit: { headers: { ...this.#options.headers } },
      fetch: fetchOnLongLivedSignal
    })
    // Closing the client aborts its requests: a Toolport that is up but does not answer cannot
    // hold the bridge (or its stop) longer than this.
    let timedOut = false
    const timer = setTimeout(() => {
      timedOut = true
      client.close().catch(noop)
    }, CONNECT_TIMEOUT_MS)
    this.#opening = client
    try {
      await client.connect(transport)
    } catch (err) {
      await client.close().catch(noop)
      // Cut short by close(): nothing failed.
      if (this.#isClosed) return null
      this.#failed(timedOut ? null : err, isFirst)
      return null
    } finally {
      clearTimeout(timer)
      this.#opening = undefined
    }
    if (this.#isClosed) {
      await endUpstream(client, this.endpoint, this.#options.headers)
      return null
    }
    const upstream: Upstream = { client, requests: 0, closeTimer: undefined }
    this.#upstream = upstream
    this.#lastFailure = null
    this.#reconnectDelayMs = RECONNECT_MIN_MS
    this.#log(`toolport mcp: connected to ${this.endpoint.href}`)
    // The tool set may differ from what the client last listed (a new or restarted Toolport).
    if (!isFirst) this.#announceChange()
    return upstream
  }

  /**
   * Records why a connection failed (`err`; null when it timed out), which the tool errors tell the
   * model until one succeeds. At the first connection a role Toolport does not have, a URL under
   * which Toolport has no MCP route, and a refusal of the bridge itself (401, 403), are thrown:
   * the bridge cannot work.
   */
  #failed (err: unknown, isFirst: boolean): void {
    const origin = this.endpoint.origin
    if (err === null) {
      this.#lastFailure = `the Toolport at ${origin} did not answer within ${CONNECT_TIMEOUT_MS / 1000} s`
      this.#log(`toolport mcp: ${this.#lastFailure}`)
      return
    }
    const notFound = notFoundCode(err)
    if (notFound === 'TP_ERR_ROLE_NOT_FOUND') {
      const what = `the role '${this.#options.role}' does not exist on the Toolport at ${origin}`
      // Thrown, not logged too: the CLI prints it with its code, once.
      if (isFirst) throw new BridgeRefusedError(what, 404, notFound)
      this.#lastFailure = `${what} (${notFound})`
      this.#log(`toolport mcp: ${this.#lastFailure}`)
      return
    }
    if (notFound === 'TP_ERR_ROUTE_NOT_FOUND') {
      // A Toolport answered, but not with its MCP route: the URL's path is not where Toolport's
      // routes are (`--url …/api`). Trying again cannot help, and "not reachable" would mislead.
      const where = `has no MCP endpoint at ${this.endpoint.href} (HTTP 404 ${notFound})`
      if (isFirst) {
        throw new BridgeSettingError('url', `${this.#options.url} reaches a Toolport that ${where}: give the URL ` +
          `Toolport is served at, without a path of its routes (e.g. ${origin})`)
      }
      this.#lastFailure = `the Toolport at ${origin} ${where}`
      this.#log(`toolport mcp: ${this.#lastFailure}`)
      return
    }
    const refusal = refusalOf(err)
    if (refusal === undefined) {
      this.#lastFailure = this.#unreachable()
      this.#log(`toolport mcp: cannot reach ${this.endpoint.href}: ${describe(err)}`)
      return
    }
    const { status } = refusal
    const hasToken = Object.keys(this.#options.headers ?? {}).some((name) => name.toLowerCase() === 'authorization')
    let what: string
    let advice = ''
    if (status === 401 && hasToken) {
      what = 'refused the bridge\'s token'
    } else if (status === 401) {
      what = 'runs in token mode'
      advice = '; give the bridge its token with --token-file'
    } else if (status === 403) {
      what = 'refused the bridge'
    } else if (status === 503) {
      what = 'has no room for a new MCP session'
    } else {
      what = 'refused a new MCP session'
    }
    if (isFirst && (status === 401 || status === 403)) {
      // Reported with its TP_ERR_* code (the CLI names it), as a role Toolport does not have.
      const message = refusal.message ?? refusal.rpc?.message
      throw new BridgeRefusedError(`the Toolport at ${origin} ${what} (HTTP ${status}` +
        `${message === undefined ? '' : `: ${message}`})${advice}`, status, refusal.code ?? (status === 401 ? 'TP_ERR_UNAUTHORIZED' : undefined))
    }
    this.#lastFailure = `the Toolport at ${origin} ${what} (${describeRefusal(refusal)})${advice}`
    this.#log(`toolport mcp: ${this.#lastFailure}`)
  }

  #unreachable (): string {
    return `Toolport is not reachable at ${this.endpoint.href}`
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

/**
 * MCP's stdio transport for the bridge's client, in place of the SDK's StdioServerTransport, which
 * answers nothing to a line that is not a JSON-RPC message and stops reading for good at a line
 * over its buffer's cap. Each line (newline-delimited UTF-8, a trailing CR dropped) is a JSON-RPC
 * message or a batch of them; what is not gets a JSON-RPC error with id null (JSON-RPC 2.0 §5), as
 * /mcp/:role answers such a body (docs/protocol.md "MCP endpoint"):
 * - not JSON: -32700; JSON that is not a JSON-RPC message, an empty batch, a batch of more than
 *   MAX_BATCH_MESSAGES (mcp-info.ts) or with an initialize among others: -32600;
 * - a line over MAX_STDIN_LINE_BYTES: -32600, and its bytes are skipped up to its end;
 * - a second initialize: -32600 "Server already initialized", with its id;
 * - a batch's messages are handled one by one, each request answered on its own line.
 * Blank lines are skipped. Lines are read from construction on (so that the end of stdin is seen
 * at once) and handed on from start(), when the server is attached. An answer too long for
 * MAX_STDOUT_LINE_BYTES is replaced by a JSON-RPC error. stdin ending or failing, and stdout
 * failing (EPIPE: the client is gone), call `onGone`.
 */
class StdioLineTransport implements Transport {
  onclose?: () => void
  onerror?: (error: Error) => void
  onmessage?: Transport['onmessage']
  readonly #stdin: Readable
  readonly #stdout: Writable
  readonly #log: (line: string) => void
  readonly #onGone: () => void
  /** What was read before start(), run by it in order; null once started. */
  #backlog: Array<() => void> | null = []
  /** The current line's bytes so far. */
  #pieces: Buffer[] = []
  #pieceBytes = 0
  /** Inside a line over MAX_STDIN_LINE_BYTES: its bytes are dropped up to its newline. */
  #skipping = false
  #initialized = false
  /** Ids of requests handed to the server and not answered yet (nor cancelled). */
  readonly #inFlight = new Set<RequestId>()
  #isClosed = false
  #outputGone = false
  /** Set while stdout's buffer is full: writes wait for it to drain. */
  #draining: Promise<void> | null = null

  constructor (stdin: Readable, stdout: Writable, log: (line: string) => void, onGone: () => void) {
    this.#stdin = stdin
    this.#stdout = stdout
    this.#log = log
    this.#onGone = onGone
    stdin.on('data', this.#onData)
    stdin.on('end', this.#onEnd)
    stdin.on('close', this.#onEnd)
    stdin.on('error', this.#onInputError)
    // Kept after close(): a write still under way may fail later, and must not crash the process.
    stdout.on('error', this.#onOutputError)
  }

  async start (): Promise<void> {
    const backlog = this.#backlog ?? []
    this.#backlog = null
    for (const task of backlog) task()
  }

  async close (): Promise<void> {
    if (this.#isClosed) return
    this.#isClosed = true
    this.#backlog = null
    this.#pieces = []
    this.#stdin.off('data', this.#onData)
    this.#stdin.off('end', this.#onEnd)
    this.#stdin.off('close', this.#onEnd)
    this.#stdin.off('error', this.#onInputError)
    // Not reading lets the process exit; another reader of the stream keeps it flowing.
    if (this.#stdin.listenerCount('data') === 0) this.#stdin.pause()
    this.onclose?.()
  }

  async send (message: JSONRPCMessage): Promise<void> {
    const answered = responseId(message)
    if (answered !== undefined) this.#inFlight.delete(answered)
    const line = `${JSON.stringify(message)}\n`
    const bytes = Buffer.byteLength(line)
    if (bytes <= MAX_STDOUT_LINE_BYTES) {
      await this.#write(line)
      return
    }
    const id = responseId(message)
    if (id !== undefined && isJSONRPCResultResponse(message) && Array.isArray(message.result.content)) {
      // A tool result: without its structuredContent (the same output as text), or else a tool
      // error saying it ran but cannot be sent (README "toolport mcp").
      const result = { ...message.result } as CallToolResult
      if (result.structuredContent !== undefined) {
        delete result.structuredContent
        const textOnly = `${JSON.stringify({ ...message, result })}\n`
        if (Buffer.byteLength(textOnly) <= MAX_STDOUT_LINE_BYTES) {
          this.#log(`toolport mcp: a tool result of ${bytes} bytes is answered without its structuredContent (over stdio a line is at most ${MAX_STDOUT_LINE_BYTES} bytes)`)
          await this.#write(textOnly)
          return
        }
      }
      const problem = `the tool ran, but its result (${bytes} bytes of JSON) is too large to send over stdio ` +
        `(at most ${MAX_STDOUT_LINE_BYTES} bytes)`
      this.#log(`toolport mcp: ${problem}`)
      await this.#write(`${JSON.stringify({ jsonrpc: '2.0', id, result: toolError(problem) })}\n`)
      return
    }
    const problem = `an answer of ${bytes} bytes is more than a line on stdout may carry (${MAX_STDOUT_LINE_BYTES} bytes)`
    this.#log(`toolport mcp: ${problem}${id === undefined ? '; not sent' : '; answered with an error instead'}`)
    if (id === undefined) return
    await this.#write(`${JSON.stringify({ jsonrpc: '2.0', id, error: { code: RPC_INTERNAL_ERROR, message: `Internal error: ${problem}` } })}\n`)
  }

  readonly #onData = (chunk: Buffer | string): void => {
    let rest = typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : chunk
    while (rest.length > 0) {
      const end = rest.indexOf(0x0a)
      const piece = end === -1 ? rest : rest.subarray(0, end)
      rest = end === -1 ? rest.subarray(rest.length) : rest.subarray(end + 1)
      if (!this.#skipping) {
        if (this.#pieceBytes + piece.length > MAX_STDIN_LINE_BYTES) {
          this.#pieces = []
          this.#pieceBytes = 0
          this.#skipping = true
          this.#queue(() => { this.#lineTooLong() })
        } else if (piece.length > 0) {
          this.#pieces.push(piece)
          this.#pieceBytes += piece.length
        }
      }
      if (end === -1) continue
      if (this.#skipping) {
        this.#skipping = false
        continue
      }
      const line = Buffer.concat(this.#pieces, this.#pieceBytes)
      this.#pieces = []
      this.#pieceBytes = 0
      this.#queue(() => { this.#line(line) })
    }
  }

  readonly #onEnd = (): void => {
    // A last line without its newline is no message (MCP stdio: messages end with a newline).
    this.#onGone()
  }

  readonly #onInputError = (err: Error): void => {
    this.#log(`toolport mcp: cannot read stdin: ${describe(err)}`)
    this.#onGone()
  }

  readonly #onOutputError = (err: Error): void => {
    if (this.#outputGone) return
    this.#outputGone = true
    this.#log(`toolport mcp: cannot write to stdout (${describe(err)}): the client is gone`)
    this.#onGone()
  }

  /** Runs `task` now, or from start() on if the server is not attached yet. */
  #queue (task: () => void): void {
    if (this.#isClosed) return
    if (this.#backlog === null) task()
    else this.#backlog.push(task)
  }

  #lineTooLong (): void {
    this.#refuse(RPC_INVALID_REQUEST, `Invalid Request: a line longer than ${MAX_STDIN_LINE_BYTES} bytes`)
  }

  #line (bytes: Buffer): void {
    const text = bytes.toString('utf8').replace(/\r$/, '')
    if (text.trim() === '') return
    let value: unknown
    try {
      value = JSON.parse(text)
    } catch (err) {
      this.#refuse(RPC_PARSE_ERROR, `Parse error: the line is not JSON: ${errorText(err)}`)
      return
    }
    const messages = readJsonRpcBody(value, JSONRPCMessageSchema, isInitialize)
    if (typeof messages === 'string') {
      this.#refuse(RPC_INVALID_REQUEST, messages)
      return
    }
    for (const message of messages) this.#deliver(message)
  }

  #deliver (message: JSONRPCMessage): void {
    if (isInitialize(message)) {
      // One session per bridge, initialized once, as /mcp/:role refuses a second initialize.
      if (this.#initialized) {
        this.#write(`${JSON.stringify({
          jsonrpc: '2.0', id: message.id, error: { code: RPC_INVALID_REQUEST, message: 'Invalid Request: Server already initialized' }
        })}\n`).catch(noop)
        return
      }
      this.#initialized = true
    }
    if (isJSONRPCRequest(message)) {
      // As /mcp/<role> refuses it: the server routes answers and cancellations by id, so a second
      // request with the id of one in flight would take over the first one's cancellation.
      if (this.#inFlight.has(message.id)) {
        this.#refuse(RPC_INVALID_REQUEST, `Invalid Request: the id ${JSON.stringify(message.id)} is in use by a request in flight`)
        return
      }
      this.#inFlight.add(message.id)
    } else {
      // A cancelled request is not answered (MCP): its id is free again.
      const cancelled = cancelledId(message)
      if (cancelled !== undefined) this.#inFlight.delete(cancelled)
    }
    this.onmessage?.(message)
  }

  /** Answers a line that could not be read as a request: a JSON-RPC error with id null. */
  #refuse (code: number, message: string): void {
    this.#log(`toolport mcp: refused a line on stdin: ${message.slice(0, 200)}`)
    this.#write(`${JSON.stringify({ jsonrpc: '2.0', id: null, error: { code, message } })}\n`).catch(noop)
  }

  async #write (line: string): Promise<void> {
    const stdout = this.#stdout
    if (this.#outputGone || stdout.destroyed || !stdout.writable) return
    if (stdout.write(line)) return
    this.#draining ??= new Promise<void>((resolve) => {
      const done = (): void => {
        stdout.off('drain', done)
        stdout.off('close', done)
        stdout.off('error', done)
        this.#draining = null
        resolve()
      }
      stdout.on('drain', done)
      stdout.on('close', done)
      stdout.on('error', done)
    })
    await this.#draining
  }
}

/** The request a `notifications/cancelled` names, or undefined (another message, or none named). */
function cancelledId (message: JSONRPCMessage): RequestId | undefined {
  if (!('method' in message) || message.method !== 'notifications/cancelled' || 'id' in message) return undefined
  const id = (message.params as { requestId?: unknown } | undefined)?.requestId
  return typeof id === 'string' || typeof id === 'number' ? id : undefined
}

/** The id of a response (what a too-long answer is answered in place of); undefined for others. */
function responseId (message: JSONRPCMessage): RequestId | undefined {
  if (isJSONRPCResultResponse(message) || isJSONRPCErrorResponse(message)) return message.id
  return undefined
}

/** An HTTP error status Toolport answered a request with (not 404: see isSessionGone). */
interface Refusal {
  status: number
  /** The JSON-RPC error in its body, when it is one (/mcp/:role's own errors). */
  rpc?: { code: number, message: string, data?: unknown }
  /** The TP_ERR_* code and message of its body, when it is a Toolport error. */
  code?: string
  message?: string
}

/** Where the SDK's StreamableHTTPError for a refused POST puts the body it was answered. */
const REFUSED_POST = 'Error POSTing to endpoint: '

/**
 * A request Toolport refused with an HTTP error status other than 404: it never ran. Undefined for
 * anything else (a 404 is a session or role gone; a network failure may come after the request ran).
 * The body is read from the error's message, where the MCP SDK puts it; without it (another SDK
 * wording) the refusal is still one, only without Toolport's own error.
 */
function refusalOf (err: unknown): Refusal | undefined {
  if (!(err instanceof StreamableHTTPError)) return undefined
  const status = err.code
  if (status === undefined || status < 300 || status === 404) return undefined
  const body = refusedBody(err)
  if (!isPlainObject(body)) return { status }
  const error = body.error
  if (isPlainObject(error) && typeof error.code === 'number' && Number.isInteger(error.code) &&
    typeof error.message === 'string') {
    return { status, rpc: { code: error.code, message: error.message, ...('data' in error ? { data: error.data } : {}) } }
  }
  return {
    status,
    ...(typeof body.code === 'string' ? { code: body.code } : {}),
    ...(typeof body.message === 'string' ? { message: body.message } : {})
  }
}

/** The JSON body of a refused POST, read from the error's message; undefined without one. */
function refusedBody (err: StreamableHTTPError): unknown {
  const at = err.message.indexOf(REFUSED_POST)
  if (at === -1) return undefined
  try {
    return JSON.parse(err.message.slice(at + REFUSED_POST.length))
  } catch {
    return undefined
  }
}

/** `HTTP 401 TP_ERR_UNAUTHORIZED: <message>`, as much of it as the refusal has. */
function describeRefusal ({ status, rpc, code, message }: Refusal): string {
  if (rpc !== undefined) return `HTTP ${status}: ${rpc.message}`
  const head = code === undefined ? `HTTP ${status}` : `HTTP ${status} ${code}`
  return message === undefined ? head : `${head}: ${message}`
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

/**
 * Ends an upstream session: closes the client, then sends its DELETE (so Toolport detaches it at
 * once, and ends a call still running), waiting END_SESSION_TIMEOUT_MS at most.
 *
 * In that order: a DELETE sent through the open client ends its streams from Toolport's side (a
 * call's stream with an error), which the SDK client (1.x) takes for drops to resume, with up to
 * two retries 2 s and 4 s later each, of which its close() cancels only the last one scheduled:
 * the bridge's process stayed up ~4 s after its client went away. A client closed first cuts its
 * streams itself, and resumes nothing.
 */
async function endUpstream (client: Client, endpoint: URL,
  headers: Readonly<Record<string, string>> | undefined): Promise<void> {
  const transport = client.transport
  const sessionId = transport instanceof StreamableHTTPClientTransport ? transport.sessionId : undefined
  const version = transport instanceof StreamableHTTPClientTransport ? transport.protocolVersion : undefined
  await client.close().catch(noop)
  if (sessionId === undefined) return
  try {
    const answer = await fetch(endpoint, {
      method: 'DELETE',
      headers: { ...headers, 'mcp-session-id': sessionId, ...(version === undefined ? {} : { 'mcp-protocol-version': version }) },
      redirect: 'manual',
      signal: AbortSignal.timeout(END_SESSION_TIMEOUT_MS)
    })
    await answer.body?.cancel()
  } catch {
    // Toolport gone or slow: it ends the session by itself (its client gone, the server closing).
  }
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

/**
 * The TP_ERR_* code of a 404 Toolport answered (TP_ERR_ROLE_NOT_FOUND, TP_ERR_ROUTE_NOT_FOUND), or
 * undefined: another 404 is a session gone (or a server that is not Toolport).
 */
function notFoundCode (err: unknown): string | undefined {
  if (!(err instanceof StreamableHTTPError) || err.code !== 404) return undefined
  const body = refusedBody(err)
  return isPlainObject(body) && typeof body.code === 'string' ? body.code : undefined
}

/**
 * The global fetch, for a transport that sends every request of its session with one signal.
 * Node's fetch leaves one abort listener per request on that signal until the request is
 * garbage-collected (then it is removed: nothing leaks), so past 1500 calls between two
 * collections Node wrote a MaxListenersExceededWarning to stderr on every call, into the MCP
 * host's log. The count is unbounded on the transport's own signal only (setting it again is a
 * property write).
 */
const fetchOnLongLivedSignal = async (url: string | URL, init?: RequestInit): Promise<Response> => {
  if (init?.signal != null) setMaxListeners(0, init.signal)
  return await fetch(url, init)
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
  // The SDK client's schema check of an answer: a server that is not Toolport (nor MCP). Its
  // message is the whole issue dump, a hundred lines and more per retry.
  if (Array.isArray((err as { issues?: unknown }).issues)) {
    return 'it answered something that is not a JSON-RPC message (is this the URL of a Toolport?)'
  }
  const code = (err as { code?: unknown }).code ?? (err.cause as { code?: unknown } | undefined)?.code
  return typeof code === 'string' ? `${err.message} (${code})` : err.message
}
