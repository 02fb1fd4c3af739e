// The Dispatcher: runs callback calls on the pool's worker threads (default) or inline.
//
// Per call (docs/architecture.md "Dispatch"):
// 1. `dispatch()` admits the call into a slot of a fixed table (or answers `busy` at once when
//    `maxPending` calls are admitted). The id is `generation × slotSpace + slot`, so an outcome
//    that arrives after its slot was reused never matches the newer call, and no Map gains and
//    loses an entry per call (those entries survived scavenges and made most of the GC work).
// 2. Each callback origin has bounds of its own: at most `maxInFlightPerOrigin` of its calls are
//    with a worker at once, at most `maxQueuedPerOrigin` more wait here in order, and beyond that
//    its callers are answered `busy`. A plugin that never answers thus fills only its own bounds:
//    another plugin's calls never wait behind it.
// 3. Pool mode: each worker has a lane (a MessageChannel of its own; piscina still owns the
//    worker's lifecycle). The calls of one event-loop turn are posted on the least busy lane as
//    one flat array on `setImmediate`, and outcomes come back on the lane, coalesced per turn.
//    No piscina task is involved, so no task slot is held while calls wait on the network.
// 4. Cancellation is a message on the call's lane, never piscina's abort signal: aborting a
//    running task kills its thread and every keep-alive socket in it.
// 5. One sweep a second (only while calls are admitted) answers calls that outlived their
//    deadline by a grace, so a stuck or dead worker can never leave a caller waiting forever; a
//    lane whose worker exits answers its calls at once.
import type { MessagePort, Worker } from 'node:worker_threads'
import { Piscina } from 'piscina'
import { LANE_CALLS, LANE_CANCEL, OUTCOME_STRIDE, pushTask, readOutcome } from '../../workers/protocol.js'
import type { CallOutcome, CallTask, LaneHello, OutcomeKind, WorkerOptions } from '../../workers/protocol.js'
import type { CallbackClient, CallbackClientOptions } from '../../shared/callback-client.js'
import { ReplyBudget } from '../../shared/reply-budget.js'
import { createLocalhostV6Ports } from '../../shared/loopback.js'
import type { CancelSignal } from '../../shared/cancel.js'
import type { DispatchOptions } from '../config.js'
import { workerModule } from './worker-module.js'
import { errorText, noop } from '../../shared/util.js'

/**
 * Replies whose text is at least this many bytes stay bytes until someone reads the result's text
 * (src/main/dispatch/result.ts): from a worker they cross as a transferred buffer, and no thread
 * builds a large string that a caller may never read; shorter ones are cheaper as strings.
 */
const LARGE_TEXT_BYTES = 16 * 1024

/** How long past a call's deadline the main thread waits for its outcome before declaring it lost. */
const DEADLINE_GRACE_MS = 1_000
const SWEEP_MS = 1_000
/** Idle origin entries are forgotten once more than this many exist. */
const ORIGINS_KEPT = 1_024

// Slot states.
const FREE = 0
/** Waiting behind its origin's in-flight bound. */
const QUEUED = 1
/** In this turn's outbox (pool mode), not yet posted on a lane. */
const OUTBOX = 2
/** With a worker (or the inline client). */
const SENT = 3

/**
 * The inline client's class, loaded by `loadInlineClient()`. Its module loads undici (~0.05–0.1 s
 * of CPU): pool mode never needs it on the main thread, so it is not a static import.
 */
let InlineClient: typeof CallbackClient | null = null

/**
 * Loads the inline client's module. `createToolport()` and `listen()` wait for it when the mode is
 * inline (`Dispatcher.ready`), so no call waits for it; a dispatcher built before it loaded holds
 * its first calls until it has.
 */
export async function loadInlineClient (): Promise<void> {
  InlineClient ??= (await import('../../shared/callback-client.js')).CallbackClient
}

/** The bounds of one callback origin. */
class OriginBound {
  inFlight = 0
  queued = 0
  /** Ids waiting, oldest first, from `head`; entries whose call ended meanwhile are skipped. */
  queue: number[] = []
  head = 0
  /**
   * True while `#pump` sends this origin's queue. Inline, a call sent to an already-aborted signal
   * (or a closed client) is answered synchronously, and that answer pumps again: without this the
   * pump recursed once per queued call, and with ~700 queued behind one abort it overflowed the
   * stack between a slot's release and its caller's answer, losing the calls in between.
   */
  pumping = false
}

/** A worker's lane: the main thread's end of its MessageChannel. */
interface Lane {
  port: MessagePort
  index: number
  inFlight: number
  isOpen: boolean
  /** The worker's share of the reply budget, given back once the worker is gone. */
  replyShare: SharedArrayBuffer
  /** Its worker exited and every call it held is answered: a new worker's lane takes its index. */
  isDrained: boolean
}

/**
 * What the calls to one origin may hold of the reply budget on one of `threads` threads: half the
 * budget over all threads, so that a plugin stalled in the middle of many large replies leaves the
 * other half to the others (src/shared/call-attempt.ts `OriginShare`); never less than one whole
 * reply, which the budget is there to admit.
 */
function originReplyShare (options: DispatchOptions, threads: number): number {
  return Math.max(Math.floor(options.maxBufferedReplyBytes / 2 / threads), options.maxResponseBytes)
}

/** The abort listener of one slot, created once per slot and reused by every call in it. */
class SlotListener {
  readonly abortSlot: (slot: number) => void
  readonly slot: number
  constructor (abortSlot: (slot: number) => void, slot: number) {
    this.abortSlot = abortSlot
    this.slot = slot
  }

  handleEvent (): void {
    this.abortSlot(this.slot)
  }
}

/**
 * Told how long each answered call waited on the main thread before it was handed to a worker
 * (batching turn and origin queue; ~0 inline) and how long it took from there.
 */
export type DispatchObserver = (queueMs: number, callbackMs: number, kind: OutcomeKind) => void

/** Everything the dispatcher needs to build a call; `id` is assigned by the dispatcher. */
export type DispatchRequest = Omit<CallTask, 'id'>

/** Who reads the pool's utilisation: each keeps its own window (see `Dispatcher.utilization`). */
export type UtilizationReader = 'metrics' | 'health'

export class Dispatcher {
  readonly #options: DispatchOptions
  readonly #observer: DispatchObserver | null
  readonly #budget: SharedArrayBuffer
  readonly #replyBudget: ReplyBudget
  // The slot table: parallel arrays indexed by slot.
  readonly #space: number
  readonly #ids: Float64Array
  readonly #state: Uint8Array
  readonly #requests: (DispatchRequest | null)[]
  readonly #resolves: (((outcome: CallOutcome) => void) | null)[]
  readonly #signals: (CancelSignal | undefined)[]
  readonly #listeners: (SlotListener | undefined)[]
  readonly #bounds: (OriginBound | null)[]
  readonly #lanesOf: Int32Array
  readonly #admittedAt: Float64Array
  readonly #sentAt: Float64Array
  readonly #free: Int32Array
  #freeTop: number
  #generation = 1
  /** The last generation whose ids are exact (lastGeneration). */
  readonly #lastGeneration: number
  #pending = 0
  readonly #origins = new Map<string, OriginBound>()
  #sweep: NodeJS.Timeout | null = null
  #closing = false
  #drained: (() => void) | null = null
  // Pool mode
  readonly #pool: Piscina | null = null
  readonly #lanes: Lane[] = []
  #outbox: number[] = []
  #outboxCalls = 0
  #isFlushScheduled = false
  /** Each reader's previous reading per worker: a health probe does not shorten a scrape's window. */
  readonly #elu: Record<UtilizationReader, Map<Worker, EventLoopUtilization>> = {
    metrics: new Map(),
    health: new Map()
  }

  // Inline mode
  readonly #inline: boolean
  #client: CallbackClient | null = null
  /** Calls sent before the inline client's module loaded (ids, in order). */
  #waiting: number[] = []
  /** Why the inline client's module could not load, once it failed. */
  #clientError: string | null = null
  /** Resolves once the dispatcher can send: at once in pool mode, when the inline client exists inline. */
  readonly ready: Promise<void>

  constructor (options: DispatchOptions, observer: DispatchObserver | null = null) {
    this.#options = options
    this.#observer = observer
    let space = 1
    while (space < options.maxPending) space *= 2
    this.#space = space
    this.#lastGeneration = lastGeneration(space)
    this.#ids = new Float64Array(space)
    this.#state = new Uint8Array(space)
    this.#requests = new Array<DispatchRequest | null>(space).fill(null)
    this.#resolves = new Array<((outcome: CallOutcome) => void) | null>(space).fill(null)
    this.#signals = new Array<CancelSignal | undefined>(space).fill(undefined)
    this.#listeners = new Array<SlotListener | undefined>(space).fill(undefined)
    this.#bounds = new Array<OriginBound | null>(space).fill(null)
    this.#lanesOf = new Int32Array(space).fill(-1)
    this.#admittedAt = new Float64Array(space)
    this.#sentAt = new Float64Array(space)
    this.#free = new Int32Array(space)
    // Lowest slots first, so a light load keeps touching the same few entries.
    for (let i = 0; i < space; i++) this.#free[i] = space - 1 - i
    this.#freeTop = space
    this.#budget = ReplyBudget.create(options.maxBufferedReplyBytes)
    this.#replyBudget = new ReplyBudget(this.#budget)
    this.#inline = options.mode === 'inline'
    if (this.#inline) {
      const clientOptions: CallbackClientOptions = {
        connectionsPerOrigin: options.connectionsPerOrigin,
        keepAliveTimeoutMs: options.keepAliveTimeoutMs,
        connectTimeoutMs: options.connectTimeoutMs,
        largeTextBytes: LARGE_TEXT_BYTES,
        maxImages: options.maxImages,
        maxImageBytes: options.maxImageBytes,
        slotSpace: space,
        replyBudget: this.#budget,
        maxOriginReplyBytes: originReplyShare(options, 1)
      }
      if (InlineClient !== null) {
        this.#client = new InlineClient(clientOptions)
        this.ready = Promise.resolve()
      } else {
        this.ready = loadInlineClient().then(() => { this.#startInlineClient(clientOptions) }, (err: unknown) => {
          // A module of Toolport itself that cannot load is a broken install: createToolport()
          // and listen() reject with it, and every call (held or later) is answered with it.
          const reason = `the inline callback client could not be loaded: ${errorText(err)}`
          this.#clientError = reason
          const waiting = this.#waiting
          this.#waiting = []
          for (const id of waiting) this.#settle(failure(id, 'internal', reason))
          throw err
        })
        this.ready.catch(noop)
      }
      return
    }
    this.ready = Promise.resolve()
    const workerData: WorkerOptions = {
      slotSpace: space,
      replyBudget: this.#budget,
      // One for every thread: a thread that has not yet reached a plugin on ::1 (or one started
      // to replace another) must not try 127.0.0.1 first, where another process may listen.
      localhostV6Ports: createLocalhostV6Ports(),
      maxOriginReplyBytes: originReplyShare(options, options.threads),
      connectionsPerOrigin: options.connectionsPerOrigin,
      keepAliveTimeoutMs: options.keepAliveTimeoutMs,
      connectTimeoutMs: options.connectTimeoutMs,
      largeTextBytes: LARGE_TEXT_BYTES,
      maxImages: options.maxImages,
      maxImageBytes: options.maxImageBytes
    }
    const worker = workerModule('call-task')
    this.#pool = new Piscina({
      filename: worker.url,
      execArgv: worker.execArgv,
      workerData,
      minThreads: options.threads,
      maxThreads: options.threads,
      // 'sync' (the default) parks idle workers in Atomics.wait, so their event loop cannot see a
      // plugin closing an idle keep-alive socket and the next call fails with "other side closed".
      atomics: 'disabled',
      // Threads hold keep-alive sockets: never let them idle out.
      idleTimeout: 2 ** 31 - 1
    })
    this.#pool.on('message', (message: unknown) => { this.#onWorkerMessage(message) })
    // A worker that dies is replaced by piscina; its lane's 'close' answers its calls. Without a
    // listener, piscina's 'error' event would crash the process.
    this.#pool.on('error', noop)
  }

  get mode (): 'pool' | 'inline' { return this.#options.mode }

  /** The pool's worker threads (empty inline); for health reporting and tests. */
  get threads (): readonly Worker[] {
    return this.#pool === null ? [] : this.#pool.threads
  }

  /** Calls admitted and not yet answered. */
  get pending (): number { return this.#pending }

  /** Calls admitted but not yet with a worker: behind their origin's bound, or in this turn's batch. */
  get queued (): number {
    let queued = this.#outboxCalls
    for (const bound of this.#origins.values()) queued += bound.queued
    return queued
  }

  /**
   * The workers' event-loop utilisation (0–1) since `reader`'s previous reading, averaged over the
   * threads; 0 inline.
   */
  utilization (reader: UtilizationReader): number {
    const threads = this.threads
    const baselines = this.#elu[reader]
    if (threads.length === 0) return 0
    let sum = 0
    for (const worker of threads) {
      const previous = baselines.get(worker)
      const now = worker.performance.eventLoopUtilization()
      const share = previous === undefined
        ? now.utilization
        : worker.performance.eventLoopUtilization(now, previous).utilization
      // Read from this thread, a worker's active time can step back a little between readings.
      sum += Math.min(1, Math.max(0, share))
      baselines.set(worker, now)
    }
    for (const worker of baselines.keys()) if (!threads.includes(worker)) baselines.delete(worker)
    return sum / threads.length
  }

  /** Reply bytes being received right now, over every thread (see `dispatch.maxBufferedReplyBytes`). */
  get bufferedReplyBytes (): number {
    return this.#replyBudget.used
  }

  /**
   * Performs one callback call. Never rejects: every failure is an outcome. An aborted `signal`
   * answers `cancelled` at once and tells the worker to stop the request.
   */
  dispatch (request: DispatchRequest, signal?: CancelSignal): Promise<CallOutcome> {
    if (this.#closing) return Promise.resolve(failure(0, 'busy', 'Toolport is closing'))
    if (this.#freeTop === 0 || this.#pending >= this.#options.maxPending) {
      return Promise.resolve(failure(0, 'busy', `${this.#options.maxPending} calls in flight`))
    }
    if (signal?.aborted === true) return Promise.resolve(failure(0, 'cancelled', 'aborted before dispatch'))
    const bound = this.#bound(request.origin)
    const limits = this.#options
    if (bound.inFlight >= limits.maxInFlightPerOrigin && bound.queued >= limits.maxQueuedPerOrigin) {
      return Promise.resolve(failure(0, 'busy',
        `its callback already has ${bound.inFlight} calls in flight and ${bound.queued} waiting`))
    }
    return new Promise<CallOutcome>((resolve) => {
      const slot = this.#free[--this.#freeTop] as number
      const id = this.#generation * this.#space + slot
      this.#generation = nextGeneration(this.#generation, this.#lastGeneration)
      this.#ids[slot] = id
      this.#requests[slot] = request
      this.#resolves[slot] = resolve
      this.#bounds[slot] = bound
      this.#admittedAt[slot] = performance.now()
      if (this.#pending++ === 0) this.#armSweep()
      if (signal !== undefined) {
        this.#signals[slot] = signal
        let listener = this.#listeners[slot]
        if (listener === undefined) {
          listener = new SlotListener(this.#abortSlotNow, slot)
          this.#listeners[slot] = listener
        }
        signal.addEventListener('abort', listener, { once: true })
      }
      if (bound.inFlight < limits.maxInFlightPerOrigin) {
        bound.inFlight++
        this.#send(slot, id)
      } else {
        this.#state[slot] = QUEUED
        bound.queued++
        bound.queue.push(id)
      }
    })
  }

  /**
   * Stops admitting calls, lets in-flight calls finish for up to `graceMs`, then cancels the rest
   * and destroys the pool and its sockets. No handle stays open afterwards.
   */
  async close (graceMs = this.#options.closeGraceMs): Promise<void> {
    if (this.#closing) return
    this.#closing = true
    if (this.#pending > 0) {
      let timer: NodeJS.Timeout | undefined
      await Promise.race([
        new Promise<void>((resolve) => { this.#drained = resolve }),
        new Promise<void>((resolve) => { timer = setTimeout(resolve, graceMs) })
      ])
      clearTimeout(timer)
      // Queued calls first: answering a running call pumps its origin's queue, which would send
      // a queued call to its plugin only to cancel it a moment later.
      for (let slot = 0; slot < this.#space; slot++) {
        if (this.#state[slot] === QUEUED) this.#abortSlot(slot)
      }
      for (let slot = 0; slot < this.#space; slot++) {
        if (this.#state[slot] !== FREE) this.#abortSlot(slot)
      }
    }
    if (this.#sweep !== null) clearInterval(this.#sweep)
    this.#sweep = null
    for (const lane of this.#lanes) {
      lane.isOpen = false
      lane.port.close()
    }
    if (this.#pool !== null) {
      await this.#pool.destroy()
      // The workers are gone, with whatever reply bytes they held when destroyed.
      for (const lane of this.#lanes) this.#replyBudget.reclaim(lane.replyShare)
    }
    if (this.#inline) await this.ready.catch(noop)
    if (this.#client !== null) await this.#client.close()
  }

  /** Makes the inline client once its module has loaded and sends the calls that waited for it. */
  #startInlineClient (options: CallbackClientOptions): void {
    const client = new (InlineClient as typeof CallbackClient)(options)
    this.#client = client
    const waiting = this.#waiting
    this.#waiting = []
    for (const id of waiting) {
      const slot = id % this.#space
      // A call cancelled meanwhile was answered already (its slot may hold a newer call).
      if (this.#state[slot] === SENT && this.#ids[slot] === id) this.#startInline(client, slot, id)
    }
  }

  /** Answers the call in `slot` as cancelled at once and tells whoever runs it to stop. */
  #abortSlot (slot: number): void {
    const state = this.#state[slot]
    if (state === FREE) return
    const id = this.#ids[slot] as number
    if (state === SENT && !this.#inline) {
      const lane = this.#lanes[this.#lanesOf[slot] as number]
      if (lane !== undefined && lane.isOpen) lane.port.postMessage([LANE_CANCEL, id])
    }
    // Inline: the client listens to the caller's signal; on close() the client's pools are destroyed.
    this.#settle(failure(id, 'cancelled', 'the caller aborted the call'))
  }

  /** Answers a pending call once; outcomes for a call already answered (or a reused slot) are ignored. */
  #settle (outcome: CallOutcome): void {
    const slot = outcome.id % this.#space
    const state = this.#state[slot]
    if (state === FREE || this.#ids[slot] !== outcome.id) return
    const resolve = this.#resolves[slot] as (outcome: CallOutcome) => void
    const signal = this.#signals[slot]
    if (signal !== undefined) {
      signal.removeEventListener('abort', this.#listeners[slot] as SlotListener)
      this.#signals[slot] = undefined
    }
    const bound = this.#bounds[slot] as OriginBound
    if (state === QUEUED) {
      bound.queued--
    } else {
      bound.inFlight--
      if (state === SENT) {
        const lane = this.#lanesOf[slot] as number
        if (lane >= 0) (this.#lanes[lane] as Lane).inFlight--
      } else {
        this.#outboxCalls--
      }
    }
    if (this.#observer !== null) {
      const sentAt = state === SENT ? this.#sentAt[slot] as number : performance.now()
      this.#observer(sentAt - (this.#admittedAt[slot] as number), performance.now() - sentAt, outcome.kind)
    }
    this.#state[slot] = FREE
    this.#requests[slot] = null
    this.#resolves[slot] = null
    this.#bounds[slot] = null
    this.#lanesOf[slot] = -1
    this.#free[this.#freeTop++] = slot
    this.#pending--
    // The caller first: whatever sending the next queued call does, this call is answered.
    resolve(outcome)
    if (bound.queued > 0 && bound.inFlight < this.#options.maxInFlightPerOrigin) this.#pump(bound)
    if (this.#pending === 0) {
      this.#sweep?.unref()
      this.#drained?.()
    }
  }

  /** Sends queued calls of an origin while it has room under its in-flight bound. */
  #pump (bound: OriginBound): void {
    // A call answered while this loop sends (see OriginBound.pumping) frees its room here: the
    // loop goes on instead of a nested pump.
    if (bound.pumping) return
    bound.pumping = true
    const max = this.#options.maxInFlightPerOrigin
    const queue = bound.queue
    try {
      while (bound.inFlight < max && bound.head < queue.length) {
        const id = queue[bound.head++] as number
        const slot = id % this.#space
        if (this.#state[slot] !== QUEUED || this.#ids[slot] !== id) continue
        bound.queued--
        bound.inFlight++
        this.#send(slot, id)
      }
    } finally {
      bound.pumping = false
    }
    if (bound.head === queue.length) {
      bound.queue = []
      bound.head = 0
    } else if (bound.head > 1024 && bound.head * 2 > queue.length) {
      bound.queue = queue.slice(bound.head)
      bound.head = 0
    }
  }

  #send (slot: number, id: number): void {
    if (this.#inline) {
      this.#state[slot] = SENT
      this.#sentAt[slot] = this.#admittedAt[slot] as number
      if (this.#client !== null) this.#startInline(this.#client, slot, id)
      else if (this.#clientError === null) this.#waiting.push(id)
      else this.#settle(failure(id, 'internal', this.#clientError))
      return
    }
    this.#state[slot] = OUTBOX
    this.#outbox.push(id)
    this.#outboxCalls++
    if (this.#pending === 1 && !this.#isFlushScheduled) {
      // The only call in flight: no other call of this turn can join its batch that is not
      // already waiting for an answer, so it goes now instead of one event-loop turn later
      // (a lone caller's latency; under load `pending` is never 1 and calls batch per turn).
      this.#flush()
      return
    }
    if (!this.#isFlushScheduled) {
      this.#isFlushScheduled = true
      setImmediate(this.#flushNow)
    }
  }

  #startInline (client: CallbackClient, slot: number, id: number): void {
    const request = this.#requests[slot] as DispatchRequest
    const task: CallTask = {
      id,
      url: request.url,
      origin: request.origin,
      path: request.path,
      body: request.body,
      callId: request.callId,
      deadline: request.deadline,
      timeoutMs: request.timeoutMs,
      maxResponseBytes: request.maxResponseBytes
    }
    // The client stops the request on the caller's signal itself; `#abortSlot()` answers at once.
    client.start(task, this.#onOutcome, this.#signals[slot])
  }

  // Bound once per dispatcher: the slot listeners and timers call these without a closure per call.
  readonly #onOutcome = (outcome: CallOutcome): void => { this.#settle(outcome) }
  readonly #abortSlotNow = (slot: number): void => { this.#abortSlot(slot) }
  readonly #flushNow = (): void => { this.#flush() }
  readonly #sweepNow = (): void => { this.#sweepLost() }

  /** Posts this turn's calls on the lanes, in batches of at most `maxBatch`, each on the least busy lane. */
  #flush (): void {
    this.#isFlushScheduled = false
    const outbox = this.#outbox
    if (outbox.length === 0) return
    const lanes = this.#lanes
    if (!lanes.some(isOpen)) return // no worker is ready yet: the next lane to open flushes
    this.#outbox = []
    const max = this.#options.maxBatch
    const now = performance.now()
    let message: unknown[] | null = null
    let lane: Lane | null = null
    let count = 0
    for (const id of outbox) {
      const slot = id % this.#space
      if (this.#state[slot] !== OUTBOX || this.#ids[slot] !== id) continue
      if (message === null || lane === null) {
        lane = leastBusy(lanes)
        message = [LANE_CALLS]
        count = 0
      }
      pushTask(message, id, this.#requests[slot] as DispatchRequest)
      this.#state[slot] = SENT
      this.#lanesOf[slot] = lane.index
      this.#sentAt[slot] = now
      this.#outboxCalls--
      lane.inFlight++
      if (++count === max) {
        lane.port.postMessage(message)
        message = null
      }
    }
    if (message !== null && lane !== null) lane.port.postMessage(message)
  }

  #onWorkerMessage (message: unknown): void {
    const hello = message as Partial<LaneHello> | null
    const port = hello?.toolportLane
    const replyShare = hello?.replyShare
    if (port === undefined || !(replyShare instanceof SharedArrayBuffer) || this.#closing) {
      port?.close()
      return
    }
    // The lane of a worker that exited is replaced, not kept: the pool replaces every worker that
    // exits, and the lanes (each with its port and reply share) must not pile up with them.
    const drained = this.#lanes.findIndex(isDrained)
    const index = drained === -1 ? this.#lanes.length : drained
    const lane: Lane = { port, index, inFlight: 0, isOpen: true, replyShare, isDrained: false }
    this.#lanes[index] = lane
    port.on('message', (outcomes: unknown) => { this.#onOutcomes(outcomes) })
    port.on('close', () => { this.#onLaneClosed(lane) })
    // The sweep timer keeps the process alive while calls are pending; the lane itself must not.
    port.unref()
    if (this.#outbox.length > 0) this.#flush()
  }

  #onOutcomes (message: unknown): void {
    if (!Array.isArray(message)) return
    for (let i = 0; i + OUTCOME_STRIDE <= message.length; i += OUTCOME_STRIDE) this.#settle(readOutcome(message, i))
  }

  /** A worker exited (crash or destroy): its calls may or may not have reached their plugins. */
  #onLaneClosed (lane: Lane): void {
    lane.isOpen = false
    // close() closes the lanes itself while their workers still run: it reclaims after destroying them.
    if (this.#closing) return
    // The worker exited: what it held of the reply budget would otherwise stay taken for good.
    this.#replyBudget.reclaim(lane.replyShare)
    // Give outcomes it posted before exiting one turn to arrive before answering the rest.
    setImmediate(() => {
      for (let slot = 0; slot < this.#space; slot++) {
        if (this.#state[slot] === SENT && this.#lanesOf[slot] === lane.index) {
          this.#settle(failure(this.#ids[slot] as number, 'internal', 'worker failed: its thread exited'))
        }
      }
      // No call is SENT on it any more, so its index is free (a slot's lane is read only while SENT).
      lane.isDrained = true
    })
  }

  #armSweep (): void {
    if (this.#sweep === null) this.#sweep = setInterval(this.#sweepNow, SWEEP_MS)
    // Ref'd while calls are pending: a script awaiting a call stays alive even though piscina
    // unrefs its idle workers and the lanes are unref'd.
    this.#sweep.ref()
  }

  /** Answers calls whose deadline passed by more than the grace without an outcome. */
  #sweepLost (): void {
    if (this.#pending === 0) return
    const now = Date.now()
    for (let slot = 0; slot < this.#space; slot++) {
      const state = this.#state[slot]
      if (state === FREE) continue
      const request = this.#requests[slot] as DispatchRequest
      const id = this.#ids[slot] as number
      if (state === QUEUED && now >= request.deadline) {
        this.#settle(failure(id, 'timeout',
          'the deadline passed while the call waited behind its callback\'s other calls'))
      } else if (now >= request.deadline + DEADLINE_GRACE_MS) {
        this.#settle(failure(id, 'timeout', 'no answer from the worker by the deadline'))
      }
    }
  }

  #bound (origin: string): OriginBound {
    let bound = this.#origins.get(origin)
    if (bound === undefined) {
      if (this.#origins.size >= ORIGINS_KEPT) {
        for (const [key, value] of this.#origins) {
          if (value.inFlight === 0 && value.queued === 0) this.#origins.delete(key)
        }
      }
      bound = new OriginBound()
      this.#origins.set(origin, bound)
    }
    return bound
  }
}

type EventLoopUtilization = ReturnType<Worker['performance']['eventLoopUtilization']>

function isOpen (lane: Lane): boolean {
  return lane.isOpen
}

function isDrained (lane: Lane): boolean {
  return lane.isDrained
}

function leastBusy (lanes: readonly Lane[]): Lane {
  let best: Lane | null = null
  for (const lane of lanes) {
    if (lane.isOpen && (best === null || lane.inFlight < best.inFlight)) best = lane
  }
  return best as Lane
}

/** A flat outcome for a failure decided on the main thread. */
export function failure (id: number, kind: OutcomeKind, message: string): CallOutcome {
  return { id, kind, status: 0, text: '', textIsJson: false, toolError: '', contentType: '', message, bytes: 0 }
}

/**
 * The last generation of a slot table of `space` slots whose ids are exact. A call's id is
 * `generation × space + slot`, and its slot is read back as `id % space`: past 2^53 a double
 * loses the slot's bits, and no outcome would find its call again (every call would wait
 * forever: after 2^33 calls with `maxPending` 1 000 000). The generation wraps to 1 before that;
 * the ids it reuses are of calls long answered.
 */
export function lastGeneration (space: number): number {
  return Math.floor(Number.MAX_SAFE_INTEGER / space) - 1
}

/** The generation after `generation`: 1 again after `last` (lastGeneration). */
export function nextGeneration (generation: number, last: number): number {
  return generation >= last ? 1 : generation + 1
}
