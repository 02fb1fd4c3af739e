// The callback client: one undici Pool per callback origin (connector pinned to loopback,
// src/shared/loopback-connector.ts), one CallAttempt per call (src/shared/call-attempt.ts), and a
// flat outcome for every ending.
//
// Used by the worker thread's lane (one client per worker) and by the dispatcher's inline mode (one
// client on the main thread), so it must never throw or reject: every failure a plugin can cause
// is a `CallOutcome` kind. It imports nothing from src/main.
//
// Running calls live in a slot array indexed by the call id modulo `slotSpace`, not in a Map that
// gains and loses an entry per call: the dispatcher's ids are `generation × slotSpace + slot`, so
// two running calls never share an index, and a reused array keeps the young generation from
// promoting Map entries on every scavenge. Ids from elsewhere that do collide fall back to a Map.
import { Pool } from 'undici'
import type { buildConnector } from 'undici'
import { checkCallbackUrl } from './loopback.js'
import { createLoopbackConnector } from './loopback-connector.js'
import { CallAttempt } from './call-attempt.js'
import type { CallOwner, OriginShare } from './call-attempt.js'
import type { CancelSignal } from './cancel.js'
import { ReplyBudget } from './reply-budget.js'
import { OutcomeKind } from '../workers/protocol.js'
import { DEFAULT_IMAGE_LIMITS, type ImageLimits } from './images.js'
import type { CallOutcome, CallTask } from '../workers/protocol.js'

export interface CallbackClientOptions {
  /** Connection cap of each origin's pool (undici `connections`). */
  connectionsPerOrigin: number
  /** Idle keep-alive timeout of callback sockets; also caps a server's longer keep-alive hint. */
  keepAliveTimeoutMs: number
  /** TCP (and TLS handshake) connect timeout; each call's deadline still applies on top. */
  connectTimeoutMs: number
  /** Size of the running-call slot array (the dispatcher's slot space); default 4096. */
  slotSpace?: number
  /** The shared reply-byte budget (`ReplyBudget.create`); default: a budget of its own, 256 MiB. */
  replyBudget?: SharedArrayBuffer
  /** This thread's share of the budget (`ReplyBudget.createShare`), when another thread may reclaim it. */
  replyShare?: SharedArrayBuffer
  /**
   * The `localhost` ports last reached over ::1 (`createLocalhostV6Ports`), shared by every thread
   * that calls callbacks; default: this client's own.
   */
  localhostV6Ports?: SharedArrayBuffer
  /**
   * Most reply bytes the calls to one origin hold at once on this thread (src/shared/call-attempt.ts
   * `OriginShare`); default: half the budget.
   */
  maxOriginReplyBytes?: number
  /**
   * Replies whose model-visible text is at least this many bytes end with the text as bytes
   * (`CallOutcome.textBytes`, `text` ''), for a thread that only passes them on; default: never.
   */
  largeTextBytes?: number | undefined
  /** Most images passed on from one reply (default 2; src/shared/images.ts). */
  maxImages?: number | undefined
  /** Largest base64 image accepted, in bytes (default 2 MiB). */
  maxImageBytes?: number | undefined
}

// Distinct callback URLs whose re-check verdict is remembered per thread.
const CHECKED_URLS_MAX = 4096
const MAX_TIMER_MS = 2 ** 31 - 1
const DEFAULT_SLOT_SPACE = 4096
const DEFAULT_REPLY_BUDGET = 256 * 1024 * 1024

/**
 * Calls plugin callbacks over keep-alive HTTP/1.1, one lazily created undici `Pool` per origin.
 * Never uses the global dispatcher, `fetch`, or proxy settings from the environment; never follows
 * redirects, never retries (a callback is not idempotent), never decompresses.
 *
 * @example
 * const client = new CallbackClient({ connectionsPerOrigin: 64, keepAliveTimeoutMs: 4000, connectTimeoutMs: 2000 })
 * const outcome = await client.call(task) // never rejects
 * await client.close()
 */
export class CallbackClient implements CallOwner {
  /** One pool per callback origin; the sweep drops those idle since the previous sweep. */
  readonly #pools = new Map<string, OriginPool>()
  #sweeper: ReturnType<typeof setInterval> | null = null
  /** Calls in flight at `id % slotSpace`, for `cancel()`; colliding ids in `#overflow`. */
  readonly #slots: (CallAttempt | undefined)[]
  readonly #slotSpace: number
  readonly #overflow = new Map<number, CallAttempt>()
  readonly budget: ReplyBudget
  readonly maxOriginReplyBytes: number
  readonly imageLimits: ImageLimits
  readonly largeTextBytes: number
  #running = 0
  /** Callback URLs that passed the loopback re-check, with their origin (bounded). */
  readonly #checkedOrigins = new Map<string, string>()
  readonly #options: Readonly<CallbackClientOptions>
  readonly #connector: buildConnector.connector
  #isClosed = false

  constructor (options: CallbackClientOptions) {
    this.#options = options
    this.#connector = createLoopbackConnector(options.connectTimeoutMs, options.localhostV6Ports)
    this.#slotSpace = options.slotSpace ?? DEFAULT_SLOT_SPACE
    this.#slots = new Array<CallAttempt | undefined>(this.#slotSpace).fill(undefined)
    this.budget = new ReplyBudget(options.replyBudget ?? ReplyBudget.create(DEFAULT_REPLY_BUDGET), options.replyShare)
    this.maxOriginReplyBytes = options.maxOriginReplyBytes ?? Math.floor(this.budget.limit / 2)
    this.largeTextBytes = options.largeTextBytes ?? Number.POSITIVE_INFINITY
    this.imageLimits = {
      maxImages: options.maxImages ?? DEFAULT_IMAGE_LIMITS.maxImages,
      maxImageBytes: options.maxImageBytes ?? DEFAULT_IMAGE_LIMITS.maxImageBytes
    }
  }

  /**
   * POSTs `task.body` to the task's callback and resolves with how it ended. Never rejects.
   * `signal` aborts the call (kind 'cancelled'); the deadline is `task.deadline`.
   */
  call (task: CallTask, signal?: CancelSignal): Promise<CallOutcome> {
    return new Promise<CallOutcome>((resolve) => { this.start(task, resolve, signal) })
  }

  /**
   * Like `call`, without a promise: `onOutcome` is called exactly once with how the call ended
   * (possibly synchronously, for a call refused before it was sent).
   */
  start (task: CallTask, onOutcome: (outcome: CallOutcome) => void, signal?: CancelSignal): void {
    const attempt = new CallAttempt(task, signal, onOutcome, this)
    this.#running++
    const slot = task.id % this.#slotSpace
    if (this.#slots[slot] === undefined) this.#slots[slot] = attempt
    else this.#overflow.set(task.id, attempt)
    try {
      this.#start(attempt, task)
    } catch (err) {
      // A bug, not a plugin failure; still an outcome, never a rejection.
      attempt.onResponseError(undefined, err instanceof Error ? err : new Error(String(err)))
    }
  }

  /** CallOwner: a call settled; free its slot. */
  release (attempt: CallAttempt): void {
    this.#running--
    const slot = attempt.task.id % this.#slotSpace
    if (this.#slots[slot] === attempt) this.#slots[slot] = undefined
    else this.#overflow.delete(attempt.task.id)
  }

  /**
   * Stops a running call by task id (it answers 'cancelled'); false when it is not running here.
   * The worker's cancel messages use this instead of an AbortController per call (4.4 µs each).
   */
  cancel (id: number): boolean {
    const slotted = this.#slots[id % this.#slotSpace]
    const attempt = slotted !== undefined && slotted.task.id === id ? slotted : this.#overflow.get(id)
    if (attempt === undefined) return false
    attempt.handleEvent()
    return true
  }

  /** Calls started and not yet settled. */
  get running (): number {
    return this.#running
  }

  /** Callback origins with a connection pool now (idle ones are dropped by the sweep). */
  get origins (): number {
    return this.#pools.size
  }

  /** Destroys every pool and its sockets; calls in flight end as 'cancelled'. */
  async close (): Promise<void> {
    this.#isClosed = true
    this.#stopSweeping()
    const pools = [...this.#pools.values()].map((entry) => entry.pool)
    this.#pools.clear()
    await Promise.all(pools.map(destroyPool))
  }

  #start (attempt: CallAttempt, task: CallTask): void {
    if (this.#isClosed) {
      attempt.stop(OutcomeKind.cancelled, 'TP_CLIENT_CLOSED', 'the callback client is closed')
      return
    }
    // Re-check at call time on the canonical form (docs/protocol.md R14): the task crossed a thread
    // boundary, and the pool key must be the checked origin, not merely a string beside it.
    // The verdict is cached per URL (3–4 µs a check, measured), keeping the re-check off the hot path.
    let origin = this.#checkedOrigins.get(task.url)
    if (origin === undefined) {
      const checked = checkCallbackUrl(task.url)
      if (!checked.ok) {
        attempt.stop(OutcomeKind.refused, 'TP_URL_REFUSED', checked.problem)
        return
      }
      origin = checked.parts.origin
      if (this.#checkedOrigins.size >= CHECKED_URLS_MAX) this.#checkedOrigins.clear()
      this.#checkedOrigins.set(task.url, origin)
    }
    if (origin !== task.origin) {
      attempt.stop(OutcomeKind.refused, 'TP_URL_REFUSED', 'task origin does not match its url')
      return
    }
    // Capped at setTimeout's limit (~24.8 days): a larger delay would fire at once.
    const remainingMs = Math.min(Math.floor(task.deadline - Date.now()), MAX_TIMER_MS)
    if (!(remainingMs > 0)) {
      attempt.stop(OutcomeKind.timeout, 'TP_DEADLINE', 'the deadline passed before the call was sent')
      return
    }
    const entry = this.#pool(origin)
    if (!attempt.arm(remainingMs, entry)) return
    entry.pool.dispatch({
      method: 'POST',
      path: task.path,
      headers: {
        'content-type': 'application/json',
        accept: 'application/json',
        'user-agent': 'toolport',
        'x-toolport-call-id': callIdHeader(task.callId),
        'x-toolport-deadline-ms': String(remainingMs)
      },
      body: task.body,
      // Belt and braces under our own timer: neither may outlive the call's budget.
      headersTimeout: remainingMs,
      bodyTimeout: remainingMs,
      idempotent: false
    }, attempt)
  }

  #pool (origin: string): OriginPool {
    let entry = this.#pools.get(origin)
    if (entry === undefined) {
      const connector = this.#connector
      const share: OriginShare = { held: 0, connecting: 0, connectingSince: 0 }
      const pool = new Pool(origin, {
        connections: this.#options.connectionsPerOrigin,
        pipelining: 1,
        keepAliveTimeout: this.#options.keepAliveTimeoutMs,
        // A server's `Keep-Alive: timeout=N` hint may shorten our idle timeout, never lengthen it.
        keepAliveMaxTimeout: this.#options.keepAliveTimeoutMs,
        // Counts the connects under way, for a call that expires waiting on one (CallAttempt.expire).
        connect (options, callback) {
          if (share.connecting++ === 0) share.connectingSince = performance.now()
          connector(options, (err, socket) => {
            share.connecting--
            // The types pair the callback's arguments as (null, socket) | (error, null).
            if (err === null) callback(null, socket as NonNullable<typeof socket>)
            else callback(err, null)
          })
        }
      })
      entry = Object.assign(share, { pool, used: true })
      this.#pools.set(origin, entry)
      if (this.#sweeper === null) {
        const everyMs = Math.min(Math.max(this.#options.keepAliveTimeoutMs, MIN_SWEEP_MS), MAX_SWEEP_MS)
        this.#sweeper = setInterval(() => { this.#sweep() }, everyMs)
        this.#sweeper.unref()
      }
    }
    entry.used = true
    return entry
  }

  /**
   * Drops the pools of origins not called since the previous sweep that hold no socket and no
   * request: plugins restart on fresh ports, and each port's pool would otherwise stay for the
   * life of the process. One flag written per call, instead of a count per origin kept per call.
   */
  #sweep (): void {
    for (const [origin, entry] of this.#pools) {
      if (entry.used) {
        entry.used = false
        continue
      }
      const stats = entry.pool.stats
      if (stats.connected !== 0 || stats.size !== 0) continue // its keep-alive sockets close first
      this.#pools.delete(origin)
      entry.pool.close().catch(ignore)
    }
    if (this.#pools.size === 0) this.#stopSweeping()
  }

  #stopSweeping (): void {
    if (this.#sweeper !== null) clearInterval(this.#sweeper)
    this.#sweeper = null
  }
}

interface OriginPool extends OriginShare {
  readonly pool: Pool
  /** Called since the previous sweep. */
  used: boolean
}

// Sweep period: the keep-alive timeout (after which an idle origin holds no socket), within these.
const MIN_SWEEP_MS = 250
const MAX_SWEEP_MS = 60_000

function destroyPool (pool: Pool): Promise<void> {
  return pool.destroy().catch(ignore)
}

function ignore (): void {}

/**
 * `x-toolport-call-id`: the call id percent-encoded (docs/protocol.md R9), so that any id the
 * body carries makes a valid header (a newline, a NUL or `日本` would not) and reads back the same
 * on every plugin. The ids models use (letters, digits, `_`, `-`, `.`) are sent as they are.
 */
function callIdHeader (callId: string): string {
  return encodeURIComponent(callId.toWellFormed())
}
