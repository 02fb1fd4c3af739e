// One callback call in flight: the undici dispatch handler, the AbortSignal listener, the
// deadline and the settle-once state (used by src/shared/callback-client.ts on either thread).
//
// Why `Pool.dispatch` with a handler object instead of `Pool.request`: an aborted `request()` that
// is still queued settles only when a connection picks it up, and then undici aborts it by
// destroying that (healthy, keep-alive) socket. Here the deadline settles the call at once, and a
// request that expired in the queue is dropped without writing and without losing the socket (see
// `onRequestStart`). It also skips request()'s per-reply AsyncResource and Readable. The handler
// is the call's only per-call object besides the headers: it counts bytes as they arrive, takes
// them from the shared reply-byte budget, settles exactly once, and is also the AbortSignal
// listener (`handleEvent`).
import type { Dispatcher } from 'undici'
import { readReply } from './reply.js'
import type { ImageLimits } from './images.js'
import type { ReplyBudget } from './reply-budget.js'
import type { CancelSignal } from './cancel.js'
import { classifyError, describeError } from './call-errors.js'
import { ENCODED_REPLY_CODE, HTTP_ERROR_SNIPPET_CHARS, OutcomeKind } from '../workers/protocol.js'
import type { CallOutcome, CallTask } from '../workers/protocol.js'

// BOM-stripping, non-fatal UTF-8 decoding, as the WHATWG `decode` does; invalid bytes become
// U+FFFD. Stateless between calls because each decode() is given a whole body.
const utf8 = new TextDecoder('utf-8')
const EMPTY_BODY = new Uint8Array(0)

// An error status keeps only a snippet; 4 bytes per character covers any UTF-8 text.
const SNIPPET_BYTES = HTTP_ERROR_SNIPPET_CHARS * 4

/** What a call needs from the client that runs it. */
export interface CallOwner {
  readonly budget: ReplyBudget
  /** Most reply bytes the calls to one origin hold at once on this thread (see `OriginShare`). */
  readonly maxOriginReplyBytes: number
  /** The checks a reply's `images` pass (src/shared/images.ts). */
  readonly imageLimits: ImageLimits
  /** Texts of at least this many bytes stay bytes (`CallOutcome.textBytes`); Infinity: never. */
  readonly largeTextBytes: number
  /** The call has settled: forget it (its slot may be reused). */
  release: (attempt: CallAttempt) => void
}

/** What the calls to one callback origin share on this thread. */
export interface OriginShare {
  /**
   * Reply bytes they hold. The budget is shared by every plugin; each origin may hold only its
   * share of it, so that one plugin that stalls in the middle of many large replies cannot leave
   * no room for the replies of the others.
   */
  held: number
  /** Connects to the origin under way. */
  connecting: number
  /** Since when (`performance.now()`) `connecting` has not fallen to 0. */
  connectingSince: number
}

/**
 * A call whose deadline passes while its origin has not accepted a connection for most of it
 * counts as one that could not connect (as a connect timeout does), once the deadline was at least
 * this long: on loopback a listening process accepts in microseconds (a full accept queue is what
 * hangs a connect), and a deadline shorter than this says more of the tool's timeout than of the
 * plugin.
 */
const CONNECT_WAIT_COUNTS_MS = 1000

/** Why a call was stopped from our side; passed to undici as the abort reason. */
export class CallStoppedError extends Error {
  readonly code: string
  constructor (code: string, message: string) {
    super(message)
    this.name = 'CallStoppedError'
    this.code = code
  }
}

/** Every outcome is built here, so all of them share one shape (field set and order). */
export function createOutcome (id: number, kind: OutcomeKind, status: number, text: string,
  contentType: string, message: string, bytes: number, textIsJson = false, toolError = ''): CallOutcome {
  return { id, kind, status, text, textIsJson, toolError, contentType, message, bytes }
}

function firstHeader (value: string | string[] | undefined): string {
  if (value === undefined) return ''
  return typeof value === 'string' ? value : (value[0] ?? '')
}

/**
 * The codings of a reply's `Content-Encoding` other than `identity`, lower-cased, '' if none. Every
 * line of the header counts (`identity` on one line, `gzip` on the next is still gzip).
 */
function contentCoding (value: string | string[] | undefined): string {
  if (value === undefined) return ''
  const joined = (typeof value === 'string' ? value : value.join(',')).toLowerCase()
  if (joined.trim() === '' || joined.trim() === 'identity') return '' // the usual cases, without a split
  return joined.split(',').map((coding) => coding.trim()).filter((coding) => coding !== '' && coding !== 'identity').join(', ')
}

function onDeadline (attempt: CallAttempt): void {
  attempt.expire()
}

/**
 * One call in flight: the undici dispatch handler, the AbortSignal listener and the settle-once
 * state. Settling is idempotent because undici may report an error after we already settled
 * (e.g. the abort we caused) and the deadline can race the last body chunk.
 */
export class CallAttempt implements Dispatcher.DispatchHandler {
  readonly task: CallTask
  readonly #onOutcome: (outcome: CallOutcome) => void
  readonly #signal: CancelSignal | undefined
  readonly #owner: CallOwner
  #timer: NodeJS.Timeout | undefined = undefined
  #controller: Dispatcher.DispatchController | null = null
  #settledBy: CallStoppedError | null = null
  #isSettled = false
  #status = 0
  #contentType = ''
  #bytes = 0
  #chunks: Buffer[] = []
  #keptBytes = 0
  /** Its origin's share; set by `arm`. */
  #share: OriginShare | null = null

  constructor (task: CallTask, signal: CancelSignal | undefined, onOutcome: (outcome: CallOutcome) => void,
    owner: CallOwner) {
    this.task = task
    this.#signal = signal
    this.#onOutcome = onOutcome
    this.#owner = owner
  }

  /**
   * Arms the deadline and the caller's signal, and counts the reply's bytes in `share` (its
   * origin's); false when the call already ended.
   */
  arm (remainingMs: number, share: OriginShare): boolean {
    this.#share = share
    if (this.#signal !== undefined) {
      if (this.#signal.aborted) {
        this.stop(OutcomeKind.cancelled, 'TP_CANCELLED', 'the call was cancelled before it was sent')
        return false
      }
      this.#signal.addEventListener('abort', this, { once: true })
    }
    this.#timer = setTimeout(onDeadline, remainingMs, this)
    return true
  }

  /**
   * The deadline passed. If the request was never handed a connection while connects to its
   * origin stayed under way for at least half the deadline, the origin did not accept in time
   * (`connect`, which counts towards eviction). Else a timeout: a request queued behind busy
   * connections of a live plugin is one.
   */
  expire (): void {
    const share = this.#share
    const timeoutMs = this.task.timeoutMs
    if (this.#controller === null && share !== null && share.connecting > 0 && timeoutMs >= CONNECT_WAIT_COUNTS_MS &&
      performance.now() - share.connectingSince >= timeoutMs / 2) {
      this.stop(OutcomeKind.connect, 'TP_CONNECT_DEADLINE',
        `the callback's origin accepted no connection within ${this.task.timeoutMs} ms`)
      return
    }
    this.stop(OutcomeKind.timeout, 'TP_DEADLINE', `no complete reply within ${this.task.timeoutMs} ms`)
  }

  /** AbortSignal listener (EventListener object form: no closure per call). */
  handleEvent (): void {
    this.stop(OutcomeKind.cancelled, 'TP_CANCELLED', 'the call was cancelled')
  }

  /** Ends the call from our side (deadline, cancel, cap) and tears down its request. */
  stop (kind: OutcomeKind, code: string, message: string): void {
    if (this.#isSettled) return
    const reason = new CallStoppedError(code, message)
    this.#settledBy = reason
    this.#settle(createOutcome(this.task.id, kind, this.#status, '', this.#contentType,
      `${code}: ${message}`, this.#bytes))
    // Re-enters onResponseError synchronously, which is ignored: we are settled.
    // Without a controller the request is still queued; onRequestStart will drop it.
    this.#controller?.abort(reason)
  }

  onRequestStart (controller: Dispatcher.DispatchController): void {
    if (this.#settledBy !== null) {
      // The deadline passed (or the caller cancelled) while the request waited for a
      // connection. Throwing here makes undici fail the request before writing it and keep the
      // socket; `controller.abort()` would destroy a healthy keep-alive socket instead.
      throw this.#settledBy
    }
    this.#controller = controller
  }

  onResponseStart (controller: Dispatcher.DispatchController, statusCode: number,
    headers: Record<string, string | string[] | undefined>): void {
    if (statusCode < 200) return // 1xx informational: the real reply follows
    this.#status = statusCode
    this.#contentType = firstHeader(headers['content-type']).toLowerCase()
    if (statusCode < 300) {
      // We never send Accept-Encoding and never inflate (a gzip bomb must stay small), so an
      // encoded body would reach the model as binary noise: refuse it with a clear reason.
      const encoding = contentCoding(headers['content-encoding'])
      if (encoding !== '') {
        this.stop(OutcomeKind.protocol, ENCODED_REPLY_CODE,
          `the reply is compressed (content-encoding: ${encoding.slice(0, 40)}); reply uncompressed`)
        return
      }
      // A declared length over the cap needs no reading at all.
      const declared = Number(firstHeader(headers['content-length']))
      if (declared > this.task.maxResponseBytes) this.#tooLarge()
    }
  }

  onResponseData (controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.#isSettled) return
    this.#bytes += chunk.length
    if (this.#status >= 300) {
      // An error reply is drained (to keep the socket) up to the cap, but only its snippet is kept.
      if (this.#keptBytes < SNIPPET_BYTES && !this.#keep(chunk)) return
      if (this.#bytes > this.task.maxResponseBytes) this.#finishHttpError('TP_TOO_LARGE_ERROR_BODY')
      return
    }
    if (this.#bytes > this.task.maxResponseBytes) {
      this.#tooLarge()
      return
    }
    this.#keep(chunk)
  }

  /**
   * Keeps a chunk if its origin's share and the shared reply budget have room for it; else ends
   * the call (`memory`).
   */
  #keep (chunk: Buffer): boolean {
    const budget = this.#owner.budget
    const share = this.#share as OriginShare
    const max = this.#owner.maxOriginReplyBytes
    const overShare = share.held + chunk.length > max
    if (overShare || !budget.take(chunk.length)) {
      const holders = overShare
        ? `from this callback's origin already hold its share (${max} bytes) of Toolport's budget`
        : 'already hold Toolport\'s budget'
      this.stop(OutcomeKind.memory, 'TP_REPLY_BUDGET', `the reply was dropped after ${this.#keptBytes} bytes: replies ` +
        `being received ${holders} of ${budget.limit} bytes (dispatch.maxBufferedReplyBytes); try again shortly`)
      return false
    }
    share.held += chunk.length
    this.#chunks.push(chunk)
    this.#keptBytes += chunk.length
    return true
  }

  onResponseEnd (): void {
    if (this.#isSettled) return
    if (this.#status >= 300) {
      this.#finishHttpError('')
      return
    }
    // Read the reply here, on the thread that received it (the worker in pool mode), so the
    // main thread gets finished strings (docs/protocol.md R10–R12; src/shared/reply.ts). The
    // bytes are scanned, not parsed, and decoded once: only the slice the model reads.
    const body = this.#body()
    const reply = readReply(body, this.#contentType, this.#owner.imageLimits, this.#owner.largeTextBytes)
    const outcome = createOutcome(this.task.id, OutcomeKind.ok, this.#status, reply.text,
      this.#contentType, '', this.#bytes, reply.textIsJson, reply.toolError)
    if (reply.images !== undefined) outcome.images = reply.images
    if (reply.bytes !== undefined) {
      // The text is handed to another thread by moving its buffer, so it must own that buffer
      // alone: a body joined from several chunks is a fresh buffer of its own (Buffer.concat of
      // more than 4 KiB never uses the shared pool); a single chunk is a view into the socket's
      // read buffer, so its text is copied out.
      outcome.textBytes = this.#chunks.length > 1 && isWholeBuffer(body) ? reply.bytes : copyBytes(reply.bytes)
    }
    this.#settle(outcome)
  }

  onResponseError (controller: Dispatcher.DispatchController | undefined, err: Error): void {
    if (this.#isSettled) return
    this.#settle(createOutcome(this.task.id, classifyError(err), this.#status, '',
      this.#contentType, describeError(err), this.#bytes))
  }

  #tooLarge (): void {
    this.stop(OutcomeKind.tooLarge, 'TP_TOO_LARGE', `reply exceeds ${this.task.maxResponseBytes} bytes`)
  }

  /** Settles with status and snippet; `stopCode` set means the body was cut (over the cap). */
  #finishHttpError (stopCode: string): void {
    let text = this.#decode()
    if (text.length > HTTP_ERROR_SNIPPET_CHARS) {
      // Do not cut a surrogate pair in half.
      const end = HTTP_ERROR_SNIPPET_CHARS - (isHighSurrogate(text.charCodeAt(HTTP_ERROR_SNIPPET_CHARS - 1)) ? 1 : 0)
      text = text.slice(0, end)
    }
    const message = `HTTP_STATUS: ${this.#status}`
    this.#settle(createOutcome(this.task.id, OutcomeKind.http, this.#status, text, this.#contentType,
      message, this.#bytes))
    if (stopCode !== '') this.#controller?.abort(new CallStoppedError(stopCode, 'error body over the cap'))
  }

  #decode (): string {
    return utf8.decode(this.#body())
  }

  /** The kept body as one buffer (the chunks as they arrived, joined once). */
  #body (): Uint8Array {
    const chunks = this.#chunks
    if (chunks.length === 0) return EMPTY_BODY
    return chunks.length === 1 ? chunks[0] as Buffer : Buffer.concat(chunks, this.#keptBytes)
  }

  #settle (outcome: CallOutcome): void {
    if (this.#isSettled) return
    this.#isSettled = true
    if (this.#timer !== undefined) clearTimeout(this.#timer)
    this.#signal?.removeEventListener('abort', this)
    this.#owner.release(this)
    this.#chunks = []
    this.#owner.budget.give(this.#keptBytes)
    if (this.#share !== null) this.#share.held -= this.#keptBytes
    this.#keptBytes = 0
    this.#onOutcome(outcome)
  }
}

/** True when `bytes` spans the whole of its buffer (nothing else can be viewing that buffer's memory). */
function isWholeBuffer (bytes: Uint8Array): boolean {
  return bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength
}

function copyBytes (bytes: Uint8Array): Uint8Array {
  const copy = new Uint8Array(bytes.byteLength)
  copy.set(bytes)
  return copy
}

function isHighSurrogate (code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff
}
