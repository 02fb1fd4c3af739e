// The Dispatcher: runs callback calls in a piscina worker pool (default) or inline.
//
// Pool mode, per call (STYLE §4, issue "Dispatch"):
// 1. `dispatch()` admits the call (or answers `busy` at once when `maxPending` calls are in
//    flight) and queues its fixed-shape CallTask.
// 2. The calls of one event-loop turn are flushed together on `setImmediate`, in batches of at
//    most `maxBatch`, one piscina task per batch: one postMessage round trip (~80 µs measured)
//    is shared by the whole turn instead of paid per call.
// 3. The worker streams outcomes back per call on its parentPort (piscina re-emits them as the
//    pool's 'message' event) as each finishes, coalesced per turn, so a fast call never waits
//    for a slow one in the same batch. Point to point: a BroadcastChannel would copy every
//    outcome into every other worker too.
// 4. Cancellation is a message on a BroadcastChannel (the main thread does not know which
//    thread runs a call), never piscina's abort signal: aborting a running task kills its thread
//    and every keep-alive socket in it.
// 5. Each batch also has a deadline on the main thread (its latest call's deadline plus a
//    grace), so a stuck or dead worker can never leave a caller waiting forever.
import { BroadcastChannel, type Worker } from 'node:worker_threads'
import { randomUUID } from 'node:crypto'
import { Piscina } from 'piscina'
import type { BatchTask, CallOutcome, CallTask, OutcomeKind, WorkerOptions } from '../../workers/protocol.js'
import { CallbackClient } from '../../workers/callback-client.js'
import type { DispatchOptions } from '../config.js'

/** How long past a batch's latest deadline the main thread waits before declaring its calls lost. */
const BATCH_GRACE_MS = 1_000

/** The calls of one piscina task; the timer is cleared when the last of them is answered. */
interface Batch {
  calls: CallTask[]
  remaining: number
  timer: NodeJS.Timeout | undefined
}

/** A call admitted and not yet answered. It is its own abort listener (no closure per call). */
class PendingCall {
  readonly task: CallTask
  readonly resolve: (outcome: CallOutcome) => void
  readonly signal: AbortSignal | undefined
  readonly owner: Dispatcher
  /** Set once the call has left the main-thread queue for a worker. */
  batch: Batch | null = null
  /** performance.now() when admitted, and when handed to the pool (inline: the same). */
  readonly dispatchedAt: number
  sentAt: number

  constructor (owner: Dispatcher, task: CallTask, resolve: (outcome: CallOutcome) => void, signal: AbortSignal | undefined) {
    this.owner = owner
    this.task = task
    this.resolve = resolve
    this.signal = signal
    this.dispatchedAt = performance.now()
    this.sentAt = this.dispatchedAt
  }

  handleEvent (): void {
    this.owner.abort(this.task.id)
  }
}

/**
 * Told how long each answered call waited on the main thread before it was handed to the pool
 * (batching turn; 0 inline) and how long it took from there (postMessage, worker, callback).
 */
export type DispatchObserver = (queueMs: number, callbackMs: number, kind: OutcomeKind) => void

/** Everything the dispatcher needs to build a call; `id` is assigned by the dispatcher. */
export type CallRequest = Omit<CallTask, 'id'>

export class Dispatcher {
  readonly #options: DispatchOptions
  readonly #observer: DispatchObserver | null
  readonly #pending = new Map<number, PendingCall>()
  #queue: CallTask[] = []
  #flushScheduled = false
  #nextId = 1
  #closing = false
  #drained: (() => void) | null = null
  // Pool mode
  readonly #pool: Piscina | null = null
  readonly #cancel: BroadcastChannel | null = null
  // Inline mode
  readonly #client: CallbackClient | null = null

  constructor (options: DispatchOptions, observer: DispatchObserver | null = null) {
    this.#options = options
    this.#observer = observer
    if (options.mode === 'inline') {
      this.#client = new CallbackClient({
        connectionsPerOrigin: options.connectionsPerOrigin,
        keepAliveTimeoutMs: options.keepAliveTimeoutMs,
        connectTimeoutMs: options.connectTimeoutMs,
        maxImages: options.maxImages,
        maxImageBytes: options.maxImageBytes
      })
      return
    }
    const workerData: WorkerOptions = {
      cancelChannel: `toolport:cancel:${randomUUID()}`,
      connectionsPerOrigin: options.connectionsPerOrigin,
      keepAliveTimeoutMs: options.keepAliveTimeoutMs,
      connectTimeoutMs: options.connectTimeoutMs,
      maxImages: options.maxImages,
      maxImageBytes: options.maxImageBytes
    }
    this.#cancel = new BroadcastChannel(workerData.cancelChannel)
    this.#cancel.unref()
    this.#pool = new Piscina({
      filename: workerFile(),
      workerData,
      minThreads: options.threads,
      maxThreads: options.threads,
      // 'sync' (the default) parks idle workers in Atomics.wait, so their event loop cannot see a
      // plugin closing an idle keep-alive socket and the next call fails with "other side closed".
      atomics: 'disabled',
      concurrentTasksPerWorker: options.concurrentTasksPerWorker,
      // Threads hold keep-alive sockets: never let them idle out.
      idleTimeout: 2 ** 31 - 1,
      // Admission is bounded by maxPending above; piscina's own queue never needs to refuse.
      maxQueue: Infinity
    })
    this.#pool.on('message', (outcomes: CallOutcome[]) => { this.#onResults(outcomes) })
  }

  get mode (): 'pool' | 'inline' { return this.#options.mode }

  /** The pool's worker threads (empty inline); for health reporting and tests. */
  get threads (): readonly Worker[] {
    return this.#pool === null ? [] : this.#pool.threads
  }

  /** Calls admitted and not yet answered. */
  get pending (): number { return this.#pending.size }

  /** Calls waiting to be handed to a worker (this turn's batch plus piscina's queue). */
  get queued (): number {
    return this.#queue.length + (this.#pool?.queueSize ?? 0)
  }

  /** The pool's utilisation (0–1, piscina's measure); 0 inline. */
  get utilization (): number {
    return this.#pool?.utilization ?? 0
  }

  /**
   * Performs one callback call. Never rejects: every failure is an outcome. An aborted `signal`
   * answers `cancelled` at once and tells the worker to stop the request.
   */
  dispatch (request: CallRequest, signal?: AbortSignal): Promise<CallOutcome> {
    const id = this.#nextId++
    if (this.#closing) return Promise.resolve(failure(id, 'busy', 'Toolport is closing'))
    if (this.#pending.size >= this.#options.maxPending) {
      return Promise.resolve(failure(id, 'busy', `${this.#options.maxPending} calls in flight`))
    }
    if (signal?.aborted === true) return Promise.resolve(failure(id, 'cancelled', 'aborted before dispatch'))
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
    return new Promise<CallOutcome>((resolve) => {
      const call = new PendingCall(this, task, resolve, signal)
      this.#pending.set(id, call)
      signal?.addEventListener('abort', call, { once: true })
      if (this.#client !== null) {
        // The client stops the request on the caller's signal itself; `abort()` answers at once.
        this.#client.call(task, signal).then(this.#onOutcome, (err: unknown) => {
          // Unreachable (the client never rejects), but a bug must still answer the caller.
          this.settle(failure(id, 'internal', (err as Error)?.message ?? 'unknown error'))
        })
        return
      }
      this.#queue.push(task)
      if (!this.#flushScheduled) {
        this.#flushScheduled = true
        setImmediate(flushDispatcher, this)
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
    if (this.#pending.size > 0) {
      let timer: NodeJS.Timeout | undefined
      await Promise.race([
        new Promise<void>((resolve) => { this.#drained = resolve }),
        new Promise<void>((resolve) => { timer = setTimeout(resolve, graceMs) })
      ])
      clearTimeout(timer)
      for (const id of [...this.#pending.keys()]) this.abort(id)
    }
    if (this.#pool !== null) await this.#pool.destroy()
    this.#cancel?.close()
    if (this.#client !== null) await this.#client.close()
  }

  /** Sends the queued calls of this turn to the pool, in batches of at most `maxBatch`. */
  flush (): void {
    this.#flushScheduled = false
    const queue = this.#queue
    if (queue.length === 0) return
    this.#queue = []
    const max = this.#options.maxBatch
    for (let start = 0; start < queue.length; start += max) {
      this.#runBatch(queue.length <= max ? queue : queue.slice(start, start + max))
    }
  }

  #runBatch (calls: CallTask[]): void {
    const pool = this.#pool
    if (pool === null) return
    const batch: Batch = { calls, remaining: calls.length, timer: undefined }
    let latest = 0
    const now = performance.now()
    for (const task of calls) {
      const call = this.#pending.get(task.id) as PendingCall
      call.batch = batch
      call.sentAt = now
      if (task.deadline > latest) latest = task.deadline
    }
    // The main thread's own deadline for the batch (see 5. above).
    // Left ref'd on purpose: it lives only while the batch has unanswered calls (settle() clears
    // it), and it keeps a script that awaits a call alive even while the worker (which piscina
    // unrefs once its task resolves) still has the outcome in flight.
    batch.timer = setTimeout(settleBatch, Math.max(0, latest - Date.now()) + BATCH_GRACE_MS,
      this, calls, 'timeout', 'no answer from the worker by the deadline')
    const task: BatchTask = { calls }
    // The task's settlement and the outcomes travel on different ports with no order between
    // them (measured: 65% of single-call batches resolve before their outcome arrives), so a
    // resolved task settles nothing; the outcomes (or the timer) do.
    pool.run(task).then(noop, (err: unknown) => {
      // The worker died or threw (a bug): its calls may or may not have reached the plugin. Give
      // outcomes it posted before dying one turn to arrive before answering the rest.
      setImmediate(settleBatch, this, calls, 'internal', `worker failed: ${(err as Error)?.message ?? 'unknown error'}`)
    })
  }

  #onResults (outcomes: CallOutcome[]): void {
    if (!Array.isArray(outcomes)) return
    for (let i = 0; i < outcomes.length; i++) this.settle(outcomes[i] as CallOutcome)
  }

  /** Answers a call as cancelled at once and tells whoever runs it to stop. */
  abort (id: number): void {
    const call = this.#pending.get(id)
    if (call === undefined) return
    if (call.batch === null && this.#client === null) {
      const index = this.#queue.indexOf(call.task)
      if (index !== -1) this.#queue.splice(index, 1)
    } else if (this.#cancel !== null) {
      this.#cancel.postMessage([id])
    }
    // Inline: the client listens to the caller's signal; on close() the client's pools are destroyed.
    this.settle(failure(id, 'cancelled', 'the caller aborted the call'))
  }

  readonly #onOutcome = (outcome: CallOutcome): void => { this.settle(outcome) }

  /** Answers a pending call once; later outcomes for the same id are ignored. */
  settle (outcome: CallOutcome): void {
    const call = this.#pending.get(outcome.id)
    if (call === undefined) return
    this.#pending.delete(outcome.id)
    call.signal?.removeEventListener('abort', call)
    const batch = call.batch
    if (batch !== null && --batch.remaining === 0) clearTimeout(batch.timer)
    if (this.#observer !== null) {
      this.#observer(call.sentAt - call.dispatchedAt, performance.now() - call.sentAt, outcome.kind)
    }
    call.resolve(outcome)
    if (this.#drained !== null && this.#pending.size === 0) this.#drained()
  }

  /** True when the call is still waiting for its outcome. */
  isPending (id: number): boolean {
    return this.#pending.has(id)
  }
}

function flushDispatcher (dispatcher: Dispatcher): void {
  dispatcher.flush()
}

function settleBatch (dispatcher: Dispatcher, calls: CallTask[], kind: OutcomeKind, message: string): void {
  for (const task of calls) {
    if (dispatcher.isPending(task.id)) dispatcher.settle(failure(task.id, kind, message))
  }
}

/** A flat outcome for a failure decided on the main thread. */
export function failure (id: number, kind: OutcomeKind, message: string): CallOutcome {
  return { id, kind, status: 0, text: '', textIsJson: false, toolError: '', contentType: '', message, bytes: 0 }
}

function noop (): void {}

/** The worker task file next to this module, with this module's extension (`.ts` under tsx). */
function workerFile (): string {
  const extension = import.meta.url.endsWith('.ts') ? '.ts' : '.js'
  return new URL(`../../workers/call-task${extension}`, import.meta.url).href
}
