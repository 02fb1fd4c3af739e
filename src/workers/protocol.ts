// The thread contract between the main thread and the callback workers.
//
// Types and constants only: src/main imports this file, and nothing here may import from
// src/main. Everything that crosses a thread boundary is a flat object of strings and numbers:
// structured clone of flat records is cheap, and a deeply nested value returned from a piscina
// task can stall the pool (measured), so bodies always travel as strings.

/** How one callback call ended. The main thread maps each kind to a model-visible result. */
export const OutcomeKind = {
  /** A 2xx reply; `text` holds the body. It may still be a tool-level error (`is_error`). */
  ok: 'ok',
  /** A reply with status >= 300 (3xx is never followed); `text` holds up to 200 characters. */
  http: 'http',
  /** The overall deadline (queueing, connect, headers and body) passed. */
  timeout: 'timeout',
  /** The connection could not be established: refused, unreachable, connect timeout, TLS. */
  connect: 'connect',
  /** The connection broke or the reply was not valid HTTP after the request was sent. */
  protocol: 'protocol',
  /** The reply passed `maxResponseBytes`. */
  tooLarge: 'too_large',
  /** The caller aborted the call. */
  cancelled: 'cancelled',
  /** The dispatcher's queue was full; the callback was not called. */
  busy: 'busy',
  /** A bug or a dead worker; the callback may or may not have run. */
  internal: 'internal',
  /** The callback URL failed the loopback re-check at call time; nothing was sent. */
  refused: 'refused'
} as const
export type OutcomeKind = typeof OutcomeKind[keyof typeof OutcomeKind]

/** One callback call, built once on the main thread. Every field is always set (one shape). */
export interface CallTask {
  /** Dispatcher-local id that pairs the outcome with its caller. */
  id: number
  /** The canonical callback URL (`URL.href`), re-checked against the loopback rule. */
  url: string
  /** `scheme://host:port` with the default port explicit: the pool key and the eviction key. */
  origin: string
  /** Path and query to POST to. */
  path: string
  /** The JSON request body, stringified once on the main thread. */
  body: string
  /** The model's call id, sent as `x-toolport-call-id`. */
  callId: string
  /** Absolute deadline in ms since the epoch (`Date.now()` clock), shared by both threads. */
  deadline: number
  /** The tool's whole budget in ms, for messages ("timed out after 30 s"). */
  timeoutMs: number
  /** Cap on the reply body in bytes. */
  maxResponseBytes: number
}

/** The result of one call, sent back to the main thread. Flat: strings and numbers only. */
export interface CallOutcome {
  id: number
  kind: OutcomeKind
  /** HTTP status when a reply arrived, else 0. */
  status: number
  /**
   * `ok`: what the model reads, already mapped from the reply (src/shared/reply.ts); `http`: the
   * body's first 200 characters; else ''.
   */
  text: string
  /** `ok`: true when `text` is the output's JSON, false when the output is the string `text`. */
  textIsJson: boolean
  /** `ok`: the tool-level error of an `is_error: true` reply (R11), or ''. */
  toolError: string
  /** The reply's content type, lower-cased, or ''. */
  contentType: string
  /** A short description of a failure (error code and message), else ''. */
  message: string
  /** Bytes of reply body read. */
  bytes: number
  /**
   * `ok`: the reply's checked images, flat (mime type, base64 data, prompt or '' per image; see
   * src/shared/images.ts). Present only when there is at least one, so that every other outcome
   * keeps one fixed shape.
   */
  images?: string[]
}

/**
 * A batch of calls for one piscina task. Outcomes stream back as `CallOutcome[]` messages on the
 * worker's parentPort (piscina emits them as the pool's 'message' event), not as the task result.
 */
export interface BatchTask {
  calls: CallTask[]
}

/** Options every worker thread receives through piscina's `workerData`. */
export interface WorkerOptions {
  /** BroadcastChannel name on which the main thread posts ids of calls to cancel. */
  cancelChannel: string
  /** Per-origin connection cap of each thread's undici pools. */
  connectionsPerOrigin: number
  /** Keep-alive idle timeout in ms for callback sockets. */
  keepAliveTimeoutMs: number
  /** Connect timeout in ms (still bounded by each call's deadline). */
  connectTimeoutMs: number
  /** Most images passed on from one reply (default 2). */
  maxImages?: number
  /** Largest base64 image accepted, in bytes (default 2 MiB). */
  maxImageBytes?: number
}

/** Characters of an HTTP error body kept for the model-visible message. */
export const HTTP_ERROR_SNIPPET_CHARS = 200
