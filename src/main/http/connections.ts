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
//
// Unsent answers: a client that stops reading holds its answer in Toolport's memory (a call's
// answer can be ~12× its callback's reply: the text JSON-escaped, twice). `UnsentAnswers` bounds
// what such clients hold: an answer still not taken `limits.answerStallTimeoutMs` after it was
// written is cut (its socket closed), and past `limits.maxUnsentAnswerBytes` of answers waiting,
// the ones waiting longest whose clients took nothing since they were last looked at are cut,
// never the one just written. Streamed answers are watched where they are made (streamed-json.ts).
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import { unsentBytes } from '../../shared/util.js'

export interface ConnectionPressureOptions extends UnsentAnswersOptions {
  /** The hard cap (`server.maxConnections`): Node drops connections beyond it at accept. */
  maxConnections: number
  /** Connections kept free for new clients: idle sockets are shed above `max - reserved`. */
  reservedConnections: number
  /** Idle timeout of every socket while under pressure. */
  pressureIdleTimeoutMs: number
}

export interface UnsentAnswersOptions {
  /** Most bytes of written answers their clients have not taken yet, all sockets together. */
  maxUnsentAnswerBytes: number
  /** Longest a written answer may wait for its client to take it. */
  answerStallTimeoutMs: number
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
  /** 'prefinish' listener of every response: ended, so its client may now have to take it. */
  readonly #onAnswerWritten: (this: ServerResponse) => void

  constructor (server: Server, options: ConnectionPressureOptions) {
    this.#threshold = Math.max(1, options.maxConnections - options.reservedConnections)
    this.#idleTimeoutMs = options.pressureIdleTimeoutMs
    const answers = new UnsentAnswers(options)
    this.#onAnswerWritten = function onAnswerWritten (this: ServerResponse): void { answers.written(this) }
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
    // 'prefinish' fires once, when the response is ended: `on`, which wraps nothing.
    response.on('prefinish', this.#onAnswerWritten)
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

/** Answers smaller than this are not followed: Node and the kernel's buffers take them at once. */
const FOLLOWED_ANSWER_BYTES = 64 * 1024

interface UnsentAnswer {
  socket: Socket
  /** What the answer holds in memory: the socket's buffered bytes, as last looked at. */
  bytes: number
  /** How much the socket had still to send, as last looked at (`unsentBytes`). */
  pending: number
  timer: NodeJS.Timeout
}

/** Bounds the answers that clients which stopped reading leave in memory (see the top of the file). */
class UnsentAnswers {
  /** Answers written and not yet taken, oldest first. */
  readonly #waiting = new Map<ServerResponse, UnsentAnswer>()
  readonly #maxBytes: number
  readonly #stallMs: number
  #bytes = 0
  /** 'close' listener of a followed response: taken (every byte handed to the kernel), or gone. */
  readonly #onTaken: (this: ServerResponse) => void

  constructor (options: UnsentAnswersOptions) {
    this.#maxBytes = options.maxUnsentAnswerBytes
    this.#stallMs = options.answerStallTimeoutMs
    const answers = this
    this.#onTaken = function onAnswerTaken (this: ServerResponse): void { answers.release(this) }
  }

  /**
   * `response` was ended: what its socket has not sent yet is its client's to take. Followed
   * until taken, unless small enough for Node's and the kernel's buffers to take at once.
   */
  written (response: ServerResponse): void {
    const socket = response.socket
    if (socket === null || socket.destroyed) return
    const bytes = socket.writableLength
    if (bytes < FOLLOWED_ANSWER_BYTES) return
    const timer = setTimeout(cutStalled, this.#stallMs, this, response)
    timer.unref()
    this.#waiting.set(response, { socket, bytes, pending: unsentBytes(socket), timer })
    this.#bytes += bytes
    response.once('close', this.#onTaken)
    if (this.#bytes > this.#maxBytes) this.#makeRoom(response)
  }

  /**
   * Over the budget: cuts the answers waiting longest whose clients took nothing since they were
   * last looked at, never `newest` (a large answer to a client that reads is taken in a moment)
   * and never one that is being taken (its bytes are counted again, as they are now). Answers
   * that all move are let be: each is still cut if it is not taken within `answerStallTimeoutMs`.
   */
  #makeRoom (newest: ServerResponse): void {
    for (const [response, answer] of this.#waiting) {
      if (this.#bytes <= this.#maxBytes) return
      if (response === newest) continue
      const pending = unsentBytes(answer.socket)
      if (pending < answer.pending) {
        answer.pending = pending
        const bytes = answer.socket.writableLength
        this.#bytes += bytes - answer.bytes
        answer.bytes = bytes
        continue
      }
      this.cutAnswer(response, answer)
    }
  }

  /** Stops following `response` (taken, or its socket closed). */
  release (response: ServerResponse): void {
    const answer = this.#waiting.get(response)
    if (answer === undefined) return
    clearTimeout(answer.timer)
    this.#waiting.delete(response)
    this.#bytes -= answer.bytes
  }

  /** Closes the socket of an answer its client did not take. */
  cutAnswer (response: ServerResponse, answer = this.#waiting.get(response)): void {
    if (answer === undefined) return
    this.release(response)
    answer.socket.destroy()
  }
}

function cutStalled (answers: UnsentAnswers, response: ServerResponse): void {
  answers.cutAnswer(response)
}
