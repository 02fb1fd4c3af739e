// A role's sync to its live model sessions: serialised, coalesced, never regressing, with a timeout.
//
// Invariants (docs/protocol.md "Sync"):
// - At most one sync of a role runs at a time, so a session never sees two pushes overlap.
// - Each sync pushes the snapshot current when it *starts*; since syncs run one after another,
//   a later push always carries a snapshot at least as new as an earlier one (no regression).
// - A caller that arrives while a sync runs cannot be served by it (its change may be missing
//   from that snapshot), so it waits for the next one; every caller that arrives during the same
//   running sync shares that one next sync (coalescing): N concurrent mutations cost ≤ 2 syncs.
// - A sync that throws or passes `timeoutMs` fails for its callers; nothing is rolled back.
import type { ToolDefinition } from './tool-registry.js'
import { errorText, noop } from '../../shared/util.js'

/** What a host implements (or an adapter provides) to be a role's live model session. */
export interface ModelSession {
  readonly id: string
  /**
   * Replaces the tool set the model sees. Resolve once the session has it; reject on failure.
   * `signal` aborts when the sync times out: stop work and do not apply this snapshot late.
   */
  syncTools (tools: readonly ToolDefinition[], signal: AbortSignal): Promise<void>
}

/** How one sync ended; `error` is '' on success. */
export interface SyncOutcome {
  ok: boolean
  error: string
  /** Sessions that did not take the tools (set when `ok` is false). */
  failedSessions?: number
}

const SYNC_OK: SyncOutcome = Object.freeze({ ok: true, error: '' })
/** Why a sync failed once the runtime closed. */
export const CLOSED_ERROR = 'Toolport closed before the sessions took the tools'

/** The sources a sync reads when it starts. */
export interface SyncSource {
  definitions (): readonly ToolDefinition[]
  sessions (): readonly ModelSession[]
}

/** Told about every sync that actually ran (sessions present), once, with its duration. */
export type SyncObserver = (outcome: SyncOutcome, durationMs: number, sessions: number) => void

/**
 * One session's pushes. A push that outlives its sync's timeout keeps running (a session may
 * ignore the signal), so pushes are also serialised per session: the next one waits for it, and
 * every sync that arrives meanwhile shares that one next push, which reads the newest tools when
 * it starts. A session that honours its abort signal therefore never sees two pushes overlap,
 * nor an older list after a newer one.
 */
interface SessionSlot {
  running: Promise<string> | null
  queued: Promise<string> | null
  /** The signal of the newest sync waiting for the queued push. */
  signal: AbortSignal | null
}

export class RoleSync {
  readonly #source: SyncSource
  readonly #timeoutMs: number
  readonly #observer: SyncObserver | null
  readonly #slots = new WeakMap<ModelSession, SessionSlot>()
  #running: Promise<SyncOutcome> | null = null
  #next: Promise<SyncOutcome> | null = null
  #count = 0
  /** Set by `close()`: no sync starts any more. */
  #isClosed = false
  /** Ends the sync that runs now (its pushes aborted), for `close()` and `dropSessions()`. */
  #stopRunning: ((why: 'closed' | 'dropped') => void) | null = null

  constructor (source: SyncSource, timeoutMs: number, observer: SyncObserver | null = null) {
    this.#source = source
    this.#timeoutMs = timeoutMs
    this.#observer = observer
  }

  /** Syncs started so far (for tests and metrics). */
  get count (): number { return this.#count }

  /**
   * The runtime closed: the sync in flight ends at once as failed (its sessions' signal aborts, its
   * timer is cleared), and no later sync pushes to the sessions or starts a timer.
   */
  close (): void {
    this.#isClosed = true
    this.#stopRunning?.('closed')
  }

  /**
   * The role's sessions were all dropped (the role was removed): the sync in flight ends at once
   * (their signal aborts, its timer is cleared) as a sync of a role without sessions does, done.
   */
  dropSessions (): void {
    this.#stopRunning?.('dropped')
  }

  /** Resolves once a sync that started after this call has finished. Never rejects. */
  request (): Promise<SyncOutcome> {
    if (this.#next !== null) return this.#next
    const running = this.#running
    if (running === null) return this.#start()
    const startNext = (): Promise<SyncOutcome> => {
      this.#next = null
      return this.#start()
    }
    // #run never rejects, but chain on both outcomes anyway: a rejected link here would wedge
    // every later mutation of the role.
    const next = running.then(startNext, startNext)
    this.#next = next
    return next
  }

  #start (): Promise<SyncOutcome> {
    const run = this.#run()
    this.#running = run
    const clear = (): void => {
      if (this.#running === run) this.#running = null
    }
    run.then(clear, clear)
    return run
  }

  async #run (): Promise<SyncOutcome> {
    const sessions = this.#source.sessions()
    // A role with no session syncs trivially and counts as accepted (docs/protocol.md "Sync").
    if (sessions.length === 0) return SYNC_OK
    if (this.#isClosed) return { ok: false, error: CLOSED_ERROR, failedSessions: sessions.length }
    this.#count++
    const started = performance.now()
    let outcome: SyncOutcome
    try {
      outcome = await this.#sync(sessions)
    } catch (err) {
      outcome = { ok: false, error: `sync failed: ${errorText(err)}`, failedSessions: sessions.length }
    }
    try {
      this.#observer?.(outcome, performance.now() - started, sessions.length)
    } catch {
      // The observer emits events to host code; a throwing listener must not break the sync.
    }
    return outcome
  }

  async #sync (sessions: readonly ModelSession[]): Promise<SyncOutcome> {
    const controller = new AbortController()
    let timer: NodeJS.Timeout | undefined
    const timedOut = new Promise<'timeout' | 'closed' | 'dropped'>((resolve) => {
      timer = setTimeout(resolve, this.#timeoutMs, 'timeout')
      this.#stopRunning = resolve
    })
    const settled: boolean[] = new Array(sessions.length).fill(false)
    const pushes = sessions.map((session, i) => this.#push(session, controller.signal).then((result) => {
      settled[i] = true
      return result
    }))
    try {
      const result = await Promise.race([Promise.all(pushes), timedOut])
      if (result === 'dropped') {
        controller.abort(new Error('the session left its role'))
        return SYNC_OK
      }
      if (result === 'timeout' || result === 'closed') {
        const why = result === 'timeout' ? `sync timed out after ${this.#timeoutMs} ms` : CLOSED_ERROR
        controller.abort(new Error(why))
        const pending = sessions.filter((_, i) => settled[i] !== true).map((s) => s.id)
        return { ok: false, error: `${why} (session ${pending.join(', ')})`, failedSessions: pending.length }
      }
      const failures = result.filter((r) => r !== '')
      return failures.length === 0
        ? SYNC_OK
        : {
            ok: false,
            error: failures.join('; '),
            failedSessions: failures.length
          }
    } finally {
      clearTimeout(timer)
      this.#stopRunning = null
    }
  }

  /** Pushes the newest tools to one session, after any push to it that is still running. */
  #push (session: ModelSession, signal: AbortSignal): Promise<string> {
    let slot = this.#slots.get(session)
    if (slot === undefined) {
      slot = { running: null, queued: null, signal: null }
      this.#slots.set(session, slot)
    }
    if (slot.running === null) return this.#startPush(session, slot, signal)
    slot.signal = signal
    if (slot.queued !== null) return slot.queued
    const owner = slot
    const startQueued = (): Promise<string> => {
      owner.queued = null
      const latest = owner.signal as AbortSignal
      owner.signal = null
      if (latest.aborted) return Promise.resolve(`session ${session.id}: sync timed out`)
      return this.#startPush(session, owner, latest)
    }
    // The running push has already outlived a sync's timeout (syncs of a role never overlap, so
    // only a timed-out push can still run here). Wait for it at most half a timeout more: a
    // session that ignores the abort signal and stays stuck is abandoned rather than allowed to
    // block every later sync, and the new push keeps half its sync's budget.
    slot.queued = Promise.race([slot.running, delay(this.#timeoutMs / 2)]).then(startQueued, startQueued)
    return slot.queued
  }

  #startPush (session: ModelSession, slot: SessionSlot, signal: AbortSignal): Promise<string> {
    const run = pushTo(session, this.#source.definitions(), signal)
    slot.running = run
    run.then(() => {
      if (slot.running === run) slot.running = null
    }, noop)
    return run
  }
}

function delay (ms: number): Promise<void> {
  return new Promise((resolve) => { setTimeout(resolve, ms).unref() })
}

/** Pushes to one session; resolves '' on success or a message naming the session. Never rejects. */
async function pushTo (session: ModelSession, tools: readonly ToolDefinition[], signal: AbortSignal): Promise<string> {
  try {
    await session.syncTools(tools, signal)
    return ''
  } catch (err) {
    return `session ${session.id}: ${errorText(err)}`
  }
}
