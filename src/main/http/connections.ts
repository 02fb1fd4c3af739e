// Connection pressure: any local process can open sockets to the API and hold them idle. With only
// Node's `server.maxConnections`, 1030 idle sockets lock every client out, token or not, for as
// long as they are kept open: new connections are dropped at accept, before a request (and its
// token) could be seen.
//
// So the server keeps a reserve. Once the open connections reach
// `limits.maxConnections - limits.reservedConnections` (pressure):
// - each new connection closes the connection that has been idle longest (no request in flight;
//   a socket that never sent a complete request head counts as idle), so idle sockets can never
//   fill the reserve and a new client always gets in;
// - in token mode, sockets that have presented the valid token are closed only when no other idle
//   socket is left, so a token holder's keep-alive socket outlives an attacker's;
// - idle sockets are closed after `limits.pressureIdleTimeoutMs` instead of the usual keep-alive
//   timeout.
// A request in flight is never cut. Answers 401 and 403 carry `Connection: close` (see
// error-handler.ts), so a refused client holds no socket either.
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'

export interface ConnectionPressureOptions {
  /** The hard cap (`server.maxConnections`): Node drops connections beyond it at accept. */
  maxConnections: number
  /** Connections kept free for new clients: idle sockets are shed above `max - reserved`. */
  reservedConnections: number
  /** Idle timeout of every socket while under pressure. */
  pressureIdleTimeoutMs: number
}

interface SocketState {
  /** Requests received and not yet answered on this socket (pipelining allows more than one). */
  busy: number
  /**
   * Responses of pipelined requests waiting behind the one being answered. When the socket
   * closes, Node ends the response it is writing but never these: a file each one streams (the
   * console's, the docs') would stay open for good. They are ended with the socket.
   */
  queued: Set<ServerResponse> | null
  /** The response of the last request that arrived with no other waiting (Node writes it first). */
  first: ServerResponse | null
  /** When the socket was accepted, or last finished a response (performance.now()). */
  idleSince: number
  /** Token mode: the socket presented the valid token. */
  isTrusted: boolean
}

const kState = Symbol('toolport.connectionState')

/** Requests one socket may have waiting for their answers at once; past it the socket is closed. */
const MAX_PIPELINED = 32

/** Watches an HTTP server's sockets and sheds idle ones under pressure. */
export class ConnectionPressure {
  readonly #sockets = new Map<Socket, SocketState>()
  readonly #threshold: number
  readonly #idleTimeoutMs: number
  #pressureUntil = 0
  #sweeper: NodeJS.Timeout | null = null
  /** Sockets closed because of pressure (for tests and logs). */
  shed = 0

  constructor (server: Server, options: ConnectionPressureOptions) {
    this.#threshold = Math.max(1, options.maxConnections - options.reservedConnections)
    this.#idleTimeoutMs = options.pressureIdleTimeoutMs
    server.on('connection', (socket: Socket) => { this.#onConnection(socket) })
    server.on('request', (request: IncomingMessage, response: ServerResponse) => { this.#onRequest(request, response) })
    server.once('close', () => { this.#stopSweeper() })
  }

  /** Open connections. */
  get size (): number { return this.#sockets.size }

  /** Whether the server is under pressure now. */
  get isUnderPressure (): boolean { return this.#sockets.size >= this.#threshold }

  /** Marks the socket of a request that passed the token check (token mode). */
  markTrusted (socket: Socket | null | undefined): void {
    if (socket === null || socket === undefined) return
    const state = this.#sockets.get(socket)
    if (state !== undefined) state.isTrusted = true
  }

  #onConnection (socket: Socket): void {
    const state: SocketState = { busy: 0, queued: null, first: null, idleSince: performance.now(), isTrusted: false }
    this.#sockets.set(socket, state)
    socket.once('close', () => {
      this.#sockets.delete(socket)
      if (state.first !== null) endWithSocket(state.first)
      if (state.queued !== null) for (const response of [...state.queued]) endWithSocket(response)
    })
    // This socket is the newest, hence the last an idle-shed would choose.
    if (this.#sockets.size > this.#threshold) this.#shedOne(socket)
    if (this.isUnderPressure) this.#startSweeper()
  }

  #onRequest (request: IncomingMessage, response: ServerResponse): void {
    const state = this.#sockets.get(request.socket)
    if (state === undefined) return
    state.busy++
    ;(response as ServerResponse & { [kState]?: SocketState })[kState] = state
    response.once('close', onResponseClose)
    if (state.busy === 1) {
      state.first = response
      return
    }
    (state.queued ??= new Set()).add(response)
    // No client here pipelines this deep (browsers and undici do not pipeline at all): each
    // request queued holds its answer, and a file for a static one, until its turn. Node still
    // parses what the socket already read, so later requests come here too: queued, and ended
    // with the socket.
    if (state.busy > MAX_PIPELINED) request.socket.destroy()
  }

  /** Closes the longest-idle socket, untrusted ones first; never `keep` or one with a request in flight. */
  #shedOne (keep: Socket): void {
    let victim: Socket | null = null
    let victimState: SocketState | null = null
    for (const [socket, state] of this.#sockets) {
      if (socket === keep || state.busy > 0) continue
      if (victimState === null || isBetterVictim(state, victimState)) {
        victim = socket
        victimState = state
      }
    }
    if (victim === null) return
    this.shed++
    this.#sockets.delete(victim)
    victim.destroy()
  }

  #startSweeper (): void {
    if (this.#sweeper !== null) return
    this.#sweeper = setInterval(() => { this.#sweep() }, Math.max(10, Math.floor(this.#idleTimeoutMs / 2)))
    this.#sweeper.unref()
  }

  #stopSweeper (): void {
    if (this.#sweeper === null) return
    clearInterval(this.#sweeper)
    this.#sweeper = null
  }

  /**
   * Under pressure: closes every socket idle for longer than the short timeout. Pressure lingers
   * for two idle timeouts after the count falls below the threshold, so sockets that arrived in
   * the same burst are timed out too instead of keeping the server at the edge of the cap.
   */
  #sweep (): void {
    const now = performance.now()
    if (this.isUnderPressure) {
      this.#pressureUntil = now + 2 * this.#idleTimeoutMs
    } else if (now > this.#pressureUntil) {
      this.#stopSweeper()
      return
    }
    const oldest = now - this.#idleTimeoutMs
    for (const [socket, state] of this.#sockets) {
      if (state.busy === 0 && state.idleSince < oldest) {
        this.shed++
        this.#sockets.delete(socket)
        socket.destroy()
      }
    }
  }
}

/** Untrusted before trusted; then the one idle longest. */
function isBetterVictim (state: SocketState, current: SocketState): boolean {
  if (state.isTrusted !== current.isTrusted) return !state.isTrusted
  return state.idleSince < current.idleSince
}

function onResponseClose (this: ServerResponse & { [kState]?: SocketState }): void {
  const state = this[kState]
  if (state === undefined) return
  state.busy--
  state.idleSince = performance.now()
  state.queued?.delete(this)
  if (state.first === this) state.first = null
}

/**
 * Ends a response whose socket closed before it was written: a pipelined one waiting its turn,
 * which Node never ends, is destroyed and told `close` (as Node tells the response it was
 * writing), so whoever streams into it (fastify's send of a file) destroys its source; and a
 * stream piped into any of them later (a static file found after the client left) is closed at
 * once instead of waiting for good.
 */
function endWithSocket (response: ServerResponse): void {
  if (response.writableFinished) return
  response.once('pipe', onPipeAfterClose)
  // The response Node was writing (it has the socket): Node tells it `close` itself.
  if (response.socket !== null) return
  response.destroy()
  response.emit('close')
}

function onPipeAfterClose (source: NodeJS.ReadableStream): void {
  (source as NodeJS.ReadableStream & { destroy: () => void }).destroy()
}
