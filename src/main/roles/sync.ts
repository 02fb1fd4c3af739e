// A role's sync to its live model sessions: serialised, coalesced, never regressing, with a timeout.
//
// Invariants (DESIGN "Sync"):
// - At most one sync of a role runs at a time, so a session never sees two pushes overlap.
// - Each sync pushes the snapshot current when it *starts*; since syncs run one after another,
//   a later push always carries a snapshot at least as new as an earlier one (no regression).
// - A caller that arrives while a sync runs cannot be served by it (its change may be missing
//   from that snapshot), so it waits for the next one; every caller that arrives during the same
//   running sync shares that one next sync (coalescing): N concurrent mutations cost ≤ 2 syncs.
// - A sync that throws or passes `timeoutMs` fails for its callers; nothing is rolled back.
import type { ToolDefinition } from './tool-registry.js'

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
}

const SYNC_OK: SyncOutcome = Object.freeze({ ok: true, error: '' })

/** The sources a sync reads when it starts. */
export interface SyncSource {
  definitions (): readonly ToolDefinition[]
  sessions (): readonly ModelSession[]
}

/** Told about every sync that actually ran (sessions present), once, with its duration. */
export type SyncObserver = (outcome: SyncOutcome, durationMs: number, sessions: number) => void

export class RoleSync {
  readonly #source: SyncSource
  readonly #timeoutMs: number
  readonly #observer: SyncObserver | null
  #running: Promise<SyncOutcome> | null = null
  #next: Promise<SyncOutcome> | null = null
  #count = 0

  constructor (source: SyncSource, timeoutMs: number, observer: SyncObserver | null = null) {
    this.#source = source
    this.#timeoutMs = timeoutMs
    this.#observer = observer
  }

  /** Syncs started so far (for tests and metrics). */
  get count (): number { return this.#count }

  /** Resolves once a sync that started after this call has finished. Never rejects. */
  request (): Promise<SyncOutcome> {
    if (this.#next !== null) return this.#next
    const running = this.#running
    if (running === null) return this.#start()
    const next = running.then(() => {
      this.#next = null
      return this.#start()
    })
    this.#next = next
    return next
  }

  #start (): Promise<SyncOutcome> {
    const run = this.#run()
    this.#running = run
    run.then(() => {
      if (this.#running === run) this.#running = null
    }, noop)
    return run
  }

  async #run (): Promise<SyncOutcome> {
    const sessions = this.#source.sessions()
    // A role with no session syncs trivially and counts as accepted (DESIGN).
    if (sessions.length === 0) return SYNC_OK
    this.#count++
    const started = performance.now()
    const outcome = await this.#push(sessions)
    this.#observer?.(outcome, performance.now() - started, sessions.length)
    return outcome
  }

  async #push (sessions: readonly ModelSession[]): Promise<SyncOutcome> {
    const tools = this.#source.definitions()
    const controller = new AbortController()
    let timer: NodeJS.Timeout | undefined
    const timedOut = new Promise<'timeout'>((resolve) => {
      timer = setTimeout(resolve, this.#timeoutMs, 'timeout')
    })
    const pushes = sessions.map((session) => pushTo(session, tools, controller.signal))
    try {
      const result = await Promise.race([Promise.all(pushes), timedOut])
      if (result === 'timeout') {
        controller.abort(new Error(`sync timed out after ${this.#timeoutMs} ms`))
        const pending = await pendingSessions(sessions, pushes)
        return { ok: false, error: `sync timed out after ${this.#timeoutMs} ms (session ${pending.join(', ')})` }
      }
      const failures = result.filter((r) => r !== '')
      return failures.length === 0 ? SYNC_OK : { ok: false, error: failures.join('; ') }
    } finally {
      clearTimeout(timer)
    }
  }
}

/** Pushes to one session; resolves '' on success or a message naming the session. */
async function pushTo (session: ModelSession, tools: readonly ToolDefinition[], signal: AbortSignal): Promise<string> {
  try {
    await session.syncTools(tools, signal)
    return ''
  } catch (err) {
    return `session ${session.id}: ${errorText(err)}`
  }
}

/** The ids of the sessions whose push has not settled yet (checked after one macrotask turn). */
async function pendingSessions (sessions: readonly ModelSession[], pushes: Promise<string>[]): Promise<string[]> {
  const settled = new Set<number>()
  pushes.forEach((p, i) => { p.then(() => settled.add(i), noop) })
  await new Promise((resolve) => setImmediate(resolve))
  const out: string[] = []
  sessions.forEach((s, i) => { if (!settled.has(i)) out.push(s.id) })
  return out.length > 0 ? out : sessions.map((s) => s.id)
}

/** A one-line description of a thrown value, never a stack trace. */
export function errorText (err: unknown): string {
  if (err instanceof Error) return err.message === '' ? err.name : err.message
  if (typeof err === 'string') return err
  return 'unknown error'
}

function noop (): void {}
