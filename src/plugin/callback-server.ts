// The plugin's own callback server (docs/protocol.md R9–R12, R14): node:http on a loopback address.
//
// node:http rather than fastify: one route, no plugins, and the SDK must not pull a logger or
// a framework into every plugin process. The server answers every call that reaches a tool with
// HTTP 200 and the `{output, is_error}` envelope (docs/protocol.md R10, R11): an HTTP error would also become a
// tool error (R12), but a worse one for the model ("returned HTTP 500" instead of the reason).
// HTTP errors are kept for requests that are not Toolport calls at all.
//
// Calls carry the user's conversation (R14), so the server only answers Toolport: it is bound to
// loopback, every tool path carries a random secret segment a web page cannot guess, the Host
// header must name loopback (a DNS-rebound page sends its own name), a browser's Origin header is
// refused, and bodies must be `application/json` (a cross-site "simple" request cannot be).
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { createServer } from 'node:http'
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import type { AddressInfo, Socket } from 'node:net'
import { z } from 'zod'
import { isLoopbackAddress } from '../shared/loopback.js'
import { PLUGIN_ERROR_CODES, PluginError } from './errors.js'
import type { PluginLogger, ResolvedTool, ToolCallContext } from './options.js'
import { errorText, MAX_TIMER_MS, thrownText } from '../shared/util.js'
import { splitImages, ToolError } from './results.js'

export interface CallbackServerOptions {
  host: string
  port: number
  maxBodyBytes: number
  tools: ReadonlyMap<string, ResolvedTool>
  logger: PluginLogger
}

/** The `{output, is_error}` / `{error, is_error}` envelope (docs/protocol.md R10, R11), as JSON text. */
type Envelope = string

// Reasons the handler's signal gives; DOMException names match what fetch and timers use.
const DEADLINE_NAME = 'TimeoutError'
const DISCONNECT_NAME = 'AbortError'
/**
 * Toolport's deadline runs out before the plugin's own clock says so, by the time the call took to
 * arrive (more on a busy machine): a hang-up within this of the deadline (within a quarter of a
 * deadline shorter than four times this) is the deadline.
 */
const DEADLINE_SLACK_MS = 1000

export class CallbackServer {
  readonly #server: Server
  readonly #options: CallbackServerOptions
  /** `/<secret>/tools/`: every callback path starts with it. */
  readonly #prefix: string
  readonly #sockets = new Set<Socket>()
  /**
   * Responses not yet finished, and their sockets: the only sockets close() waits for (a socket
   * may carry several, pipelined), and the answers it has end their connections.
   */
  readonly #responses = new Map<ServerResponse, Socket>()
  #isClosing = false
  #url = ''

  constructor (options: CallbackServerOptions) {
    this.#options = options
    // 128 bits: unguessable by a page probing loopback ports, and URL-safe as it is.
    this.#prefix = `/${randomBytes(16).toString('base64url')}/tools/`
    this.#server = createServer({ requireHostHeader: true }, (req, res) => { this.#onRequest(req, res) })
    // Below Toolport's 4 s client keep-alive would race it; Node's default 5 s (with the
    // Keep-Alive hint it sends) lets Toolport's pool close idle sockets first.
    this.#server.keepAliveTimeout = 5000
    this.#server.on('connection', (socket: Socket) => {
      this.#sockets.add(socket)
      socket.once('close', () => { this.#sockets.delete(socket) })
    })
  }

  /** `http://host:port` once listening, e.g. `http://127.0.0.1:41234`. */
  get url (): string { return this.#url }

  /** The callback URL of one tool (the canonical form Toolport stores and lists). */
  callbackUrl (name: string): string {
    return new URL(this.#prefix + segmentOf(name), this.#url).href
  }

  /**
   * Listens on the configured host and port; resolves to the base URL. A port that is taken (or an
   * address the machine does not have) rejects with TP_ERR_PLUGIN_LISTEN, the system error as its
   * `cause` (README "Plugin SDK": the SDK throws only `PluginError`s).
   */
  async listen (): Promise<string> {
    const { host, port } = this.#options
    const authority = host.includes(':') ? `[${host}]` : host
    this.#server.listen({ host, port })
    try {
      await once(this.#server, 'listening')
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code
      throw new PluginError(PLUGIN_ERROR_CODES.listen,
        `the callback server cannot listen on ${authority}:${port}: ${code ?? errorText(err)}` +
        (code === 'EADDRINUSE' ? ' (the port is in use)' : ''), { cause: err })
    }
    const bound = (this.#server.address() as AddressInfo).port
    // The URL parser's spelling of the address: `[::1]` for `0:0:0:0:0:0:0:1`, as callbackUrl()
    // and Toolport write it.
    const hostname = new URL(`http://${authority}`).hostname
    this.#url = `http://${hostname}:${bound}`
    return this.#url
  }

  /**
   * Stops accepting connections and waits up to `graceMs` for calls in flight; then closes every
   * socket, which aborts the remaining handlers' signals (they see Toolport disconnect). A socket
   * with no request being answered (idle, or still sending its headers) is closed at once: a
   * closing server no longer times out headers, so one such socket would hold the whole grace.
   * A call answered during the grace ends its connection with its answer, so close() resolves
   * once the last call is answered, not when the keep-alive timeout lets its socket go.
   */
  async close (graceMs: number): Promise<void> {
    if (!this.#server.listening) return
    this.#isClosing = true
    // close() also closes idle connections (Node ≥ 19); the loop below ends the half-sent ones.
    const closed = new Promise<void>((resolve) => { this.#server.close(() => { resolve() }) })
    const answering = new Set(this.#responses.values())
    for (const socket of this.#sockets) if (!answering.has(socket)) socket.destroy()
    // `Connection: close` on every answer still to come; one whose head is already out ends its
    // socket once it is done (#onRequest).
    for (const res of this.#responses.keys()) if (!res.headersSent) res.shouldKeepAlive = false
    let timer: NodeJS.Timeout | undefined
    // Infinity (or anything past setTimeout's largest delay, which would fire at once) waits as
    // long as a timer can; NaN or a negative grace is none.
    const delay = typeof graceMs === 'number' && graceMs > 0 ? Math.min(graceMs, MAX_TIMER_MS) : 0
    const grace = new Promise<void>((resolve) => { timer = setTimeout(resolve, delay) })
    await Promise.race([closed, grace])
    clearTimeout(timer)
    for (const socket of this.#sockets) socket.destroy()
    await closed
  }

  #onRequest (req: IncomingMessage, res: ServerResponse): void {
    const socket = req.socket
    this.#responses.set(res, socket)
    if (this.#isClosing) res.shouldKeepAlive = false
    res.once('close', () => {
      this.#responses.delete(res)
      // Closing, and its socket's last answer is out: the socket would otherwise idle until its
      // keep-alive ends.
      if (this.#isClosing && ![...this.#responses.values()].includes(socket)) socket.end()
    })
    const path = (req.url ?? '').split('?', 1)[0] as string
    const refusal = this.#refusal(req, path)
    if (refusal !== null) {
      req.resume()
      sendPlain(res, refusal[0], refusal[1])
      return
    }
    const name = nameOf(path.slice(this.#prefix.length))
    const tool = this.#options.tools.get(name)
    if (tool === undefined) {
      req.resume()
      sendPlain(res, 404, 'no such tool')
      return
    }
    readBody(req, this.#options.maxBodyBytes).then((body) => {
      if (body === null) {
        sendPlain(res, 413, `the body is larger than ${this.#options.maxBodyBytes} bytes`, true)
        return
      }
      this.#call(tool, body, req, res).catch((err: unknown) => {
        // #call answers every outcome itself; reaching this is a bug in the SDK, not the tool.
        this.#options.logger.error?.(`internal error answering a call of '${tool.name}': ${errorText(err)}`)
        if (!res.headersSent) sendPlain(res, 500, 'internal error in the plugin SDK')
      })
    }, () => { res.destroy() })
  }

  /** [status, text] when the request (whose URL path is `path`) is not a Toolport call, else null. */
  #refusal (req: IncomingMessage, path: string): [number, string] | null {
    // Node keeps the first of two Host (or Content-Type) headers; the Python SDK's parser refuses
    // the request, as RFC 9112 §3.2 asks for Host. Judged on the raw lines, before either is read.
    const duplicate = duplicateHeader(req.rawHeaders)
    if (duplicate !== null) return [400, `more than one ${duplicate} header`]
    if (!isLoopbackHost(req.headers.host)) return [403, 'the Host header must name a loopback address']
    if (req.headers.origin !== undefined) return [403, 'browser requests are not accepted']
    if (!path.startsWith(this.#prefix)) return [404, 'not found']
    if (req.method !== 'POST') return [405, 'only POST']
    const type = (req.headers['content-type'] ?? '').split(';', 1)[0]?.trim().toLowerCase()
    if (type !== 'application/json') return [415, 'the body must be application/json']
    return null
  }

  async #call (tool: ResolvedTool, bodyBytes: Buffer, req: IncomingMessage, res: ServerResponse): Promise<void> {
    let body: { arguments?: unknown, raw_arguments?: unknown, call_id?: unknown }
    // What the Python SDK answers too: a body that is not UTF-8 (no byte replaced), or holds a
    // byte order mark, or is not one JSON object, is no call.
    let bodyText: string
    try {
      bodyText = UTF8.decode(bodyBytes)
    } catch {
      sendPlain(res, 400, 'the body is not valid UTF-8')
      return
    }
    try {
      body = JSON.parse(bodyText)
    } catch {
      sendPlain(res, 400, 'the body is not valid JSON')
      return
    }
    if (typeof body !== 'object' || body === null || Array.isArray(body)) {
      sendPlain(res, 400, 'the body must be a JSON object (docs/protocol.md R9)')
      return
    }
    const headerCallId = req.headers['x-toolport-call-id']
    const callId = typeof body.call_id === 'string'
      ? body.call_id
      : typeof headerCallId === 'string' ? headerCallId : ''
    const deadlineMs = deadlineOf(req.headers['x-toolport-deadline-ms'], tool.timeoutSeconds)

    // The call is live from here, before its arguments are checked (a zod refinement may await):
    // the deadline counts from the call's arrival (as ctx.deadlineMs says), and a caller who
    // hangs up while the arguments are still being checked is noticed.
    const controller = new AbortController()
    const deadlinePassed = (): void => {
      controller.abort(new DOMException(`the call's deadline of ${deadlineMs} ms passed`, DEADLINE_NAME))
    }
    const arrivedAt = performance.now()
    const timer = setTimeout(deadlinePassed, deadlineMs)
    // 'close' on the response fires when the socket goes away; before the reply is finished that
    // means Toolport gave up on the call: cancelled, or at its deadline, which it counted from a
    // little before the call arrived here. A hang-up that close to the deadline is the deadline,
    // so the signal's reason does not depend on which of the two clocks ran out first.
    const onClose = (): void => {
      if (res.writableFinished) return
      if (performance.now() - arrivedAt >= deadlineMs - Math.min(DEADLINE_SLACK_MS, deadlineMs / 4)) deadlinePassed()
      else controller.abort(new DOMException('Toolport closed the connection', DISCONNECT_NAME))
    }
    res.once('close', onClose)
    let envelope: Envelope
    try {
      envelope = await this.#answer(tool, body, { name: tool.name, callId, deadlineMs, signal: controller.signal })
    } finally {
      clearTimeout(timer)
      res.removeListener('close', onClose)
    }
    // Nobody is listening any more: the connection is gone.
    if (res.destroyed) return
    send(res, envelope)
  }

  /** Checks the arguments, then runs the handler: the envelope to answer with. */
  async #answer (tool: ResolvedTool, body: { arguments?: unknown, raw_arguments?: unknown },
    ctx: ToolCallContext): Promise<Envelope> {
    let args: unknown = body.arguments
    // `null` as absent, as in the Python SDK: the raw text is then the arguments.
    if ((args === undefined || args === null) && typeof body.raw_arguments === 'string') {
      try {
        args = JSON.parse(body.raw_arguments === '' ? '{}' : body.raw_arguments)
      } catch {
        return errorEnvelope('arguments are not valid JSON')
      }
    }
    args ??= {}
    if (tool.schema !== null) {
      // Validated here even though Toolport checked the JSON Schema: refinements, transforms and
      // defaults exist only in zod, and the handler is typed with the schema's output.
      let parsed
      try {
        parsed = await z.safeParseAsync(tool.schema, args)
      } catch (err) {
        // A transform or refinement that throws (JSON.parse of a string field, a check that throws
        // instead of returning false): zod lets it through. It judged these arguments, so the model
        // is told as for any refusal; the log gets its type only, as for a handler's throw.
        this.#options.logger.debug?.(`tool '${tool.name}' (call ${JSON.stringify(ctx.callId)}): its schema threw ${err instanceof Error ? err.name : typeof err}`)
        return errorEnvelope(`invalid arguments: ${thrownText(err)}`)
      }
      if (!parsed.success) return errorEnvelope(`invalid arguments: ${z.prettifyError(parsed.error)}`)
      args = parsed.data
    } else if (typeof args !== 'object' || args === null || Array.isArray(args)) {
      return errorEnvelope('arguments must be a JSON object')
    } else if (tool.validate !== null && !tool.validate(args)) {
      const problems = (tool.validate.errors ?? []).slice(0, 5)
        .map((e) => `${e.instancePath === '' ? '(root)' : e.instancePath} ${e.message ?? 'is invalid'}`).join('; ')
      return errorEnvelope(`invalid arguments: ${problems === '' ? 'invalid' : problems}`)
    }
    // The caller left, or the deadline passed, while the arguments were checked: nobody waits for
    // the handler's answer any more, so it is not run at all.
    if (ctx.signal.aborted) return errorEnvelope(thrownText(ctx.signal.reason))

    try {
      return outputEnvelope(await tool.handler(args, ctx))
    } catch (err) {
      // Its type only: a handler's message may quote the call's arguments, which are never logged.
      this.#options.logger.debug?.(`tool '${tool.name}' (call ${JSON.stringify(ctx.callId)}) threw ${err instanceof Error ? err.name : typeof err}`)
      if (err instanceof ToolError) return toolErrorEnvelope(err)
      return errorEnvelope(thrownText(err))
    }
  }
}

function outputEnvelope (result: unknown): Envelope {
  const { output, images } = splitImages(result)
  // undefined (a handler that returns nothing) is sent as null: the key must be there (R10).
  const reply = images.length === 0
    ? { output: output === undefined ? null : output, is_error: false }
    : { output: output === undefined ? null : output, is_error: false, images }
  const envelope = encodeWithOutput(reply, output)
  return typeof envelope === 'string' ? envelope : errorEnvelope(`the tool's output could not be encoded as JSON: ${envelope.problem}`)
}

/** A ToolError's reply: its message as `error`, its output (unless none) beside it. */
function toolErrorEnvelope (err: ToolError): Envelope {
  const message = errorText(err)
  if (err.output === undefined || err.output === null) return errorEnvelope(message)
  const envelope = encodeWithOutput({ error: message, output: err.output, is_error: true }, err.output)
  return typeof envelope === 'string'
    ? envelope
    : errorEnvelope(`${message} (its output could not be encoded as JSON: ${envelope.problem})`)
}

/** `reply` as JSON, or what keeps its `output` from being JSON (BigInt, a cycle, NaN…). */
function encodeWithOutput (reply: object, output: unknown): Envelope | { problem: string } {
  let envelope: Envelope
  try {
    envelope = JSON.stringify(reply)
  } catch (err) {
    // BigInt, a cycle, or too deep: the model gets a readable error, not a broken reply.
    return { problem: thrownText(err) }
  }
  // JSON.stringify writes NaN and ±Infinity as `null`: an output that is not JSON would reach the
  // model as another value (README "Plugin SDK" → Calls). Only a text with `null` in it can hide
  // one, so most outputs cost one substring search.
  if (output !== null && output !== undefined && envelope.includes('null')) {
    const bad = nonFiniteNumber(output)
    if (bad !== undefined) return { problem: `${String(bad)} is not a JSON number` }
  }
  return envelope
}

/**
 * The first NaN or ±Infinity that JSON.stringify would write as `null` in `value`, or undefined.
 * JSON.stringify itself walks the value again, with a replacer that sees every value it encodes
 * (after `toJSON`; a `Number` object unwrapped here as JSON.stringify unwraps it), so the walk is
 * exactly the encoder's. Called only after JSON.stringify succeeded: no cycle, no overflow.
 */
function nonFiniteNumber (value: unknown): number | undefined {
  let found: number | undefined
  try {
    // Wrapped as the envelope wraps it, so that a root `toJSON` gets the same key ('output').
    JSON.stringify({ output: value }, (_key, item: unknown) => {
      const number = item instanceof Number ? Number(item) : item
      if (typeof number === 'number' && !Number.isFinite(number)) {
        found = number
        throw NON_FINITE
      }
      return item
    })
  } catch {
    // NON_FINITE, or a `toJSON` that throws on its second call: only `found` matters.
  }
  return found
}

const NON_FINITE = Symbol('non-finite number')

function errorEnvelope (error: string): Envelope {
  return JSON.stringify({ error, is_error: true })
}

function send (res: ServerResponse, envelope: Envelope): void {
  res.writeHead(200, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(envelope),
    'cache-control': 'no-store'
  })
  res.end(envelope)
}

function sendPlain (res: ServerResponse, status: number, text: string, isClosing = false): void {
  res.writeHead(status, {
    'content-type': 'text/plain; charset=utf-8',
    'content-length': Buffer.byteLength(text),
    ...(isClosing ? { connection: 'close' } : {})
  })
  res.end(text)
}

/**
 * The handler's budget in ms: Toolport's header when it is a positive integer, else the tool's
 * timeout (at least 1 ms, as Toolport rounds it); at most setTimeout's largest delay, past which
 * the timer would fire at once.
 */
function deadlineOf (header: string | string[] | undefined, timeoutSeconds: number): number {
  const value = typeof header === 'string' && /^\d+$/.test(header) ? Number(header) : 0
  return Math.min(value > 0 ? value : Math.max(1, Math.round(timeoutSeconds * 1000)), MAX_TIMER_MS)
}

/** 'Host' or 'Content-Type' when the request has more than one such line, else null. */
function duplicateHeader (rawHeaders: string[]): string | null {
  let hosts = 0
  let types = 0
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = (rawHeaders[i] as string).toLowerCase()
    if (name === 'host' && ++hosts > 1) return 'Host'
    if (name === 'content-type' && ++types > 1) return 'Content-Type'
  }
  return null
}

/**
 * A Host header the server answers: `localhost` (ASCII, any case), a dotted-decimal IPv4 address
 * (four parts, no leading zeros) or a bracketed IPv6 address, both checked for loopback below by
 * isLoopbackAddress, then optionally `:` and a port. Nothing else: no userinfo, path, trailing dot,
 * legacy IPv4 spelling (`127.1`, `0x7f.0.0.1`) or space. The Python SDK's `_HOST_HEADER`
 * (python/src/toolport_plugin/_loopback.py) is the same expression.
 */
const HOST_HEADER = /^(?:localhost|((?:0|[1-9][0-9]{0,2})(?:\.(?:0|[1-9][0-9]{0,2})){3})|\[([0-9a-f:.]+)\])(?::([0-9]{1,5}))?$/i

/**
 * True when a Host header names loopback: `localhost`, a dotted-decimal 127/8 address or a
 * bracketed `::1` (or `::ffff:127.x.y.z`), with an optional port of 1 to 65535. Parsed here rather
 * than by the WHATWG URL parser, which reads userinfo and paths and normalises `127.1`.
 */
function isLoopbackHost (host: string | undefined): boolean {
  const match = HOST_HEADER.exec(host ?? '')
  if (match === null) return false
  const [, ipv4, ipv6, port] = match
  if (port !== undefined && !(Number(port) >= 1 && Number(port) <= 65535)) return false
  if (ipv4 !== undefined) return isLoopbackAddress(ipv4)
  if (ipv6 !== undefined) return ipv6.includes(':') && isLoopbackAddress(ipv6)
  return true
}

/**
 * The body as text; null when its declared length passes `maxBytes` (nothing is read, and the 413
 * closes the connection). A chunked body that grows past it rejects, and the socket is dropped.
 */
async function readBody (req: IncomingMessage, maxBytes: number): Promise<Buffer | null> {
  const declared = Number(req.headers['content-length'])
  if (Number.isFinite(declared) && declared > maxBytes) return null
  const chunks: Buffer[] = []
  let size = 0
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length
    if (size > maxBytes) throw new Error(`the body is larger than ${maxBytes} bytes`)
    chunks.push(chunk)
  }
  return Buffer.concat(chunks)
}

/** Strict UTF-8 that keeps a byte order mark (which JSON.parse then refuses, as JSON has none). */
const UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true })

const DOT_MARK = '='
/** The segments of the names `.` and `..` (see segmentOf). */
const DOT_SEGMENT = `${DOT_MARK}.`
const DOT_DOT_SEGMENT = `${DOT_MARK}..`

/**
 * A tool's path segment: its name percent-encoded (`encodeURIComponent`), or `=.` / `=..` for
 * the names `.` and `..`, which URL resolution would drop as dot segments (Toolport stores the
 * canonical URL, and every call would miss the tool). `=` is always encoded otherwise, so no other
 * name makes those segments. The Python SDK spells them the same way.
 */
function segmentOf (name: string): string {
  const encoded = encodeURIComponent(name)
  return encoded === '.' || encoded === '..' ? `${DOT_MARK}${encoded}` : encoded
}

/** The name a raw path segment routes to, decoded once; '' (no tool) when it does not decode. */
function nameOf (segment: string): string {
  if (segment === DOT_SEGMENT || segment === DOT_DOT_SEGMENT) return segment.slice(DOT_MARK.length)
  try {
    return decodeURIComponent(segment)
  } catch {
    return ''
  }
}
