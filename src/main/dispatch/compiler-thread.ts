// The main thread's side of the schema compiler thread (src/workers/schema-compiler.ts): the
// queues of compile jobs, whose requesters take turns, the thread's time budget and its
// replacement (docs/architecture.md "Argument validation"). The cache in front of it is
// src/main/dispatch/validators.ts.
import { Worker } from 'node:worker_threads'
import type { CompileJob, CompileReply, CompilerNotice } from '../../workers/schema-compiler.js'
import { workerModule, type WorkerModule } from './worker-module.js'
import { noop } from '../../shared/util.js'

/**
 * How long the compiler thread may take to start a job it was sent (warming the job's dialect or
 * RE2 first, ~50–65 ms of CPU each, once per thread): past it the thread is taken as stuck and
 * replaced. Not a plugin's budget, which runs from the start of the compile.
 */
const START_BOUND_MS = 10_000
/** Heap of the compiler thread: a schema that needs more is refused, the process is unharmed. */
const COMPILER_HEAP_MB = 256
/**
 * How long a schema that ran past `limits.maxSchemaCompileMs` is refused at once when sent again.
 * Not for good, as refusals that do not depend on time are: a schema close to its budget may
 * have run past it only because the machine was busy for a moment.
 */
const OVER_TIME_REMEMBERED_MS = 10 * 60_000

/**
 * A reply as the cache sees it: `overBudget` for a schema refused by a budget (time, code size,
 * memory); `rememberMs`, how long the refusal is remembered: Infinity when sending the schema
 * again would be refused again, OVER_TIME_REMEMBERED_MS past the time budget (which a busy
 * machine may have caused), 0 for refusals that say nothing of the schema (a thread that failed
 * for another reason).
 */
export type CompileOutcome = { ok: true, code: string } | {
  ok: false,
  problem: string,
  overBudget: boolean,
  rememberMs: number
}

/** A compile waiting for its turn, or running. */
export interface QueuedJob {
  job: CompileJob
  budgetMs: number
  resolve: (outcome: CompileOutcome) => void
  outcome: Promise<CompileOutcome>
  /** The requesters whose queues hold it: several when they sent the same schema. */
  requesters: string[]
  /** It has left the queues (running or answered): joining it queues nothing. */
  taken: boolean
}

/**
 * The compiler thread, started on first use. Jobs run one at a time: each requester has its
 * own queue, and the requesters with jobs waiting take turns, one job each (round robin). A
 * requester's wait is therefore bounded by one job per other requester, however many jobs any of
 * them has queued. The thread is unref'd while idle, so it never keeps a process alive, and is
 * replaced after it is terminated (a job over its time budget) or dies (a job over its heap).
 */
export class SchemaCompiler {
  #worker: Worker | null = null
  #ready = false
  /**
   * Waiting jobs by requester, in the order the requesters take their turns (a Map iterates in
   * insertion order). Only jobs not yet taken, and never an empty queue.
   */
  #queues = new Map<string, QueuedJob[]>()
  /**
   * The queue of the requester whose job runs (its jobs queued meanwhile go there too): it goes
   * to the back of the line when that job ends, so a requester that comes while it runs is served
   * before its next job.
   */
  #parked: { requester: string, queue: QueuedJob[] } | null = null
  #current: QueuedJob | null = null
  #timer: NodeJS.Timeout | null = null
  #nextId = 1
  jobs = 0

  warmUp (): void {
    if (this.#worker === null) this.#start().unref()
  }

  compile (job: CompileJob, budgetMs: number, requester: string): QueuedJob {
    let resolve: (outcome: CompileOutcome) => void = noop
    const outcome = new Promise<CompileOutcome>((_resolve) => { resolve = _resolve })
    const queued: QueuedJob = {
      job: { ...job, id: this.#nextId++ },
      budgetMs,
      resolve,
      outcome,
      requesters: [requester],
      taken: false
    }
    this.#enqueue(queued, requester)
    this.#pump()
    return queued
  }

  /** Queues a waiting job for one more requester too: it runs at the first of their turns. */
  join (queued: QueuedJob, requester: string): void {
    if (queued.taken || queued.requesters.includes(requester)) return
    queued.requesters.push(requester)
    this.#enqueue(queued, requester)
  }

  #enqueue (queued: QueuedJob, requester: string): void {
    const queue = this.#parked?.requester === requester ? this.#parked.queue : this.#queues.get(requester)
    if (queue === undefined) this.#queues.set(requester, [queued])
    else queue.push(queued)
  }

  /** Whether a job waits for its turn. */
  get #waiting (): boolean {
    return this.#queues.size > 0 || (this.#parked !== null && this.#parked.queue.length > 0)
  }

  /** The next job: the oldest of the requester whose turn it is. */
  #take (): QueuedJob | null {
    const first = this.#queues.entries().next()
    if (first.done === true) return null
    const [requester, queue] = first.value
    const next = queue.shift() as QueuedJob
    this.#queues.delete(requester)
    this.#parked = { requester, queue }
    next.taken = true
    // Shared with other requesters (the same schema): it leaves their queues too, as their turn.
    for (const other of next.requesters) {
      const theirs = other === requester ? undefined : this.#queues.get(other)
      const at = theirs?.indexOf(next) ?? -1
      if (theirs === undefined || at === -1) continue
      theirs.splice(at, 1)
      if (theirs.length === 0) this.#queues.delete(other)
    }
    return next
  }

  /** The requester whose job has ended goes to the back of the line, behind those that came meanwhile. */
  #unpark (): void {
    const parked = this.#parked
    if (parked === null) return
    this.#parked = null
    if (parked.queue.length > 0) this.#queues.set(parked.requester, parked.queue)
  }

  #pump (): void {
    if (this.#current !== null || !this.#waiting) return
    const worker = this.#worker ?? this.#start()
    worker.ref()
    if (!this.#ready) return // #onMessage pumps again once the thread has loaded
    const next = this.#take()
    if (next === null) return
    this.#current = next
    this.jobs++
    this.#setTimer(START_BOUND_MS, () => {
      this.#fail(`the schema compiler thread did not start compiling it in ${START_BOUND_MS} ms`, false, 0)
    })
    worker.postMessage(next.job)
  }

  #setTimer (ms: number, onTimeout: () => void): void {
    if (this.#timer !== null) clearTimeout(this.#timer)
    this.#timer = setTimeout(onTimeout, ms)
  }

  #start (): Worker {
    const module = workerModule('schema-compiler')
    const worker = new Worker(compilerBootstrap(module), {
      eval: true,
      execArgv: module.execArgv,
      resourceLimits: { maxOldGenerationSizeMb: COMPILER_HEAP_MB },
      stdout: false,
      stderr: false
    })
    this.#worker = worker
    this.#ready = false
    worker.on('message', (message: CompileReply | CompilerNotice) => { this.#onMessage(worker, message) })
    worker.on('error', (err: Error & { code?: string }) => {
      if (worker !== this.#worker) return
      const outOfMemory = err.code === 'ERR_WORKER_OUT_OF_MEMORY'
      this.#fail(outOfMemory ? `compiling it needs more than ${COMPILER_HEAP_MB} MB of memory` : `the schema compiler thread failed: ${err.message}`,
        outOfMemory, outOfMemory ? Infinity : 0)
    })
    worker.on('exit', () => {
      if (worker !== this.#worker) return
      this.#fail('the schema compiler thread stopped', false, 0)
    })
    return worker
  }

  #onMessage (worker: Worker, message: CompileReply | CompilerNotice): void {
    if (worker !== this.#worker) return
    if ('ready' in message) {
      this.#ready = true
      if (!this.#waiting) worker.unref()
      this.#pump()
      return
    }
    const current = this.#current
    if ('started' in message) {
      // The budget is for compiling the schema: it runs from here, not from the send.
      if (current?.job.id !== message.started) return
      this.#setTimer(current.budgetMs, () => {
        // Remembered for a while: sent again at once, it would only take the thread again.
        this.#fail(`compiling it took longer than the budget of ${current.budgetMs} ms (limits.maxSchemaCompileMs)`,
          true, OVER_TIME_REMEMBERED_MS)
      })
      return
    }
    if (current === null || current.job.id !== message.id) return
    if (!message.ok && message.broken === true) {
      // The thread cannot compile another schema with a pattern: answered, and the thread replaced.
      this.#fail(message.problem, message.overBudget === true, Infinity)
      return
    }
    this.#settle(message.ok
      ? { ok: true, code: message.code }
      : { ok: false, problem: message.problem, overBudget: message.overBudget === true, rememberMs: Infinity })
  }

  /** Answers the running job (or, while the thread was starting, the next one) and replaces the thread. */
  #fail (problem: string, overBudget: boolean, rememberMs: number): void {
    const worker = this.#worker
    this.#worker = null
    this.#ready = false
    if (worker !== null) worker.terminate().catch(noop)
    const failed = this.#current ?? this.#take()
    this.#current = null
    if (failed !== null) this.#settle({ ok: false, problem, overBudget, rememberMs }, failed)
    else this.#pump()
  }

  #settle (outcome: CompileOutcome, job: QueuedJob | null = this.#current): void {
    if (this.#timer !== null) clearTimeout(this.#timer)
    this.#timer = null
    this.#current = null
    job?.resolve(outcome)
    this.#unpark()
    if (!this.#waiting) this.#worker?.unref()
    this.#pump()
  }
}

/**
 * The compiler thread's entry: imports the compiler module. Under a TypeScript loader (tsx, in
 * tests and the bench) the module may be a .ts file (see worker-module.ts), and a worker thread
 * does not reliably get the loader's hooks from `--import`, so the entry then registers tsx's hooks
 * in the thread first. (Exported for the compiler thread's contract test.)
 */
export function compilerBootstrap (module: WorkerModule): string {
  const register = module.typescript ? `(await import(${JSON.stringify(import.meta.resolve('tsx/esm/api'))})).register();` : ''
  return `(async () => { ${register} await import(${JSON.stringify(module.url)}) })().catch((err) => { throw err })`
}
