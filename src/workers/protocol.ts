// The thread contract between the main thread and the callback workers.
//
// Types, constants and the lane encoding only (no imports at all): src/main imports this file, and nothing here may
// import from src/main. Each worker has a lane, a MessageChannel of its own (piscina still owns
// the worker's lifecycle): the main thread posts the calls of one event-loop turn on it as one
// flat array, and the worker posts the outcomes of one turn back the same way. A flat positional
// array of strings and numbers is cheaper to structured-clone and to read than one object per
// call (measured), and bodies travel as strings (a deeply nested value would stall the clone),
// except a large reply text, which travels as bytes whose buffer is moved (`pushOutcome`).
import type { MessagePort } from 'node:worker_threads'

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
  /**
   * The reply was dropped: buffering it would pass Toolport's budget of reply bytes held at once
   * (`dispatch.maxBufferedReplyBytes`) while other calls' replies fill it.
   */
  memory: 'memory',
  /** The callback URL failed the loopback re-check at call time; nothing was sent. */
  refused: 'refused'
} as const
export type OutcomeKind = typeof OutcomeKind[keyof typeof OutcomeKind]

/**
 * The code of a 2xx reply refused for its `Content-Encoding` (an outcome `protocol` whose message
 * starts with it): unlike a broken reply, the origin did answer over HTTP (origin health resets).
 */
export const ENCODED_REPLY_CODE = 'TP_ENCODED_REPLY'

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
  /** The model's call id, sent (percent-encoded) as `x-toolport-call-id` and as is in the body. */
  callId: string
  /** Absolute deadline in ms since the epoch (`Date.now()` clock), shared by both threads. */
  deadline: number
  /** The tool's whole budget in ms, for messages ("timed out after 30 s"). */
  timeoutMs: number
  /** Cap on the reply body in bytes. */
  maxResponseBytes: number
}

/**
 * The result of one call, sent back to the main thread. Flat: strings, numbers and booleans. To add
 * a field (e.g. a reply's images as a JSON string), append it here, in `createOutcome`
 * (src/shared/call-attempt.ts), in `pushOutcome`/`readOutcome` below, and raise OUTCOME_STRIDE.
 */
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
  /**
   * `ok`, from a client created with `largeTextBytes`: a large `text` as UTF-8 bytes instead (and
   * `text` is ''), decoded without BOM stripping only when someone reads the result's text. The
   * lane carries them as a transferred buffer.
   */
  textBytes?: Uint8Array
}

/** Options every worker thread receives through piscina's `workerData`. */
export interface WorkerOptions {
  /**
   * Call ids are `generation × slotSpace + slot` (the dispatcher's slot table), so a worker can
   * keep its running calls in a slot array of this size too.
   */
  slotSpace: number
  /** The reply-byte budget shared by every thread (src/shared/reply-budget.ts). */
  replyBudget: SharedArrayBuffer
  /** The `localhost` ports last reached over ::1, shared by every thread (src/shared/loopback-connector.ts). */
  localhostV6Ports: SharedArrayBuffer
  /** Most reply bytes the calls to one origin hold at once on this thread. */
  maxOriginReplyBytes: number
  /** Per-origin connection cap of each thread's undici pools. */
  connectionsPerOrigin: number
  /** Keep-alive idle timeout in ms for callback sockets. */
  keepAliveTimeoutMs: number
  /** Connect timeout in ms (still bounded by each call's deadline). */
  connectTimeoutMs: number
  /** Replies whose text is at least this many bytes reach the main thread as bytes (`textBytes`). */
  largeTextBytes?: number
  /** Most images passed on from one reply (default 2). */
  maxImages?: number
  /** Largest base64 image accepted, in bytes (default 2 MiB). */
  maxImageBytes?: number
}

/** Characters of an HTTP error body kept for the model-visible message. */
export const HTTP_ERROR_SNIPPET_CHARS = 200

// ---- Lanes -----------------------------------------------------------------------------------
//
// The worker announces its lane once, at start, on its parentPort (piscina re-emits it as the
// pool's 'message' event): `{ toolportLane: port, replyShare }` with the port transferred. After that only
// flat arrays travel on the lane:
//   main → worker: [LANE_CALLS, ...TASK_STRIDE fields per call]  or  [LANE_CANCEL, id, id, …]
//   worker → main: [...OUTCOME_STRIDE fields per outcome]

/** The worker's first message: its end of the lane's other port, and its share of the reply budget. */
export interface LaneHello {
  toolportLane: MessagePort
  /** `ReplyBudget.createShare()`: what this thread holds, given back by the main thread if it exits. */
  replyShare: SharedArrayBuffer
}

export const LANE_CALLS = 0
export const LANE_CANCEL = 1

/** Fields per call in a LANE_CALLS message. */
export const TASK_STRIDE = 9

/** Appends a call's fields to a lane message (the order `readTask` reads them in). */
export function pushTask (out: unknown[], id: number, task: Omit<CallTask, 'id'>): void {
  out.push(id, task.url, task.origin, task.path, task.body, task.callId, task.deadline, task.timeoutMs,
    task.maxResponseBytes)
}

/** The call at field offset `i` of a LANE_CALLS message. */
export function readTask (m: readonly unknown[], i: number): CallTask {
  return {
    id: m[i] as number,
    url: m[i + 1] as string,
    origin: m[i + 2] as string,
    path: m[i + 3] as string,
    body: m[i + 4] as string,
    callId: m[i + 5] as string,
    deadline: m[i + 6] as number,
    timeoutMs: m[i + 7] as number,
    maxResponseBytes: m[i + 8] as number
  }
}

/** Fields per outcome in a worker → main message. */
export const OUTCOME_STRIDE = 10

/**
 * Appends an outcome's fields to a lane message. A `textBytes` text travels as its Uint8Array,
 * whose buffer (the client's alone) is added to `transfer`: moved, not copied, by postMessage.
 */
export function pushOutcome (out: unknown[], o: CallOutcome, transfer: ArrayBuffer[]): void {
  let text: string | Uint8Array = o.text
  if (o.textBytes !== undefined) {
    // The client made sure nothing else uses this buffer (src/shared/call-attempt.ts).
    transfer.push(o.textBytes.buffer as ArrayBuffer)
    text = o.textBytes
  }
  out.push(o.id, o.kind, o.status, text, o.textIsJson, o.toolError, o.contentType, o.message, o.bytes, o.images ??
    null)
}

export function readOutcome (m: readonly unknown[], i: number): CallOutcome {
  const text = m[i + 3] as string | Uint8Array
  const outcome: CallOutcome = {
    id: m[i] as number,
    kind: m[i + 1] as OutcomeKind,
    status: m[i + 2] as number,
    text: typeof text === 'string' ? text : '',
    textIsJson: m[i + 4] as boolean,
    toolError: m[i + 5] as string,
    contentType: m[i + 6] as string,
    message: m[i + 7] as string,
    bytes: m[i + 8] as number
  }
  const images = m[i + 9] as string[] | null
  if (images !== null) outcome.images = images
  if (typeof text !== 'string') outcome.textBytes = text
  return outcome
}
