// A role (a character or agent): its tool registry, its live model sessions and its sync queue.
import type { EventEmitter } from 'node:events'
import { emitChangeEnd, type RemovalReason, type ToolportEvents } from '../events.js'
import { ToolEntry, ToolRegistry, type LocalToolHandler, type ToolListing } from './tool-registry.js'
import { CLOSED_ERROR, RoleSync, type ModelSession, type SyncOutcome } from './sync.js'
import { checkedParameters, localToolSchema, parseOrThrow, type JsonSchemaObject, type RegistrationLimits } from '../schemas.js'
import { noop } from '../../shared/util.js'
import { compileValidator, DEFAULT_SCHEMA_BUDGETS, type SchemaBudgets } from '../dispatch/validators.js'
import { kRoleClosed, kRoleRemoved, kSyncCount } from '../symbols.js'
import { ClosedError, ConfigError, RoleNotFoundError } from '../errors.js'

/** A tool that runs in-process, registered by the host (never over HTTP). */
export interface LocalToolOptions {
  name: string
  description?: string | undefined
  /** JSON Schema of the arguments; the empty-object schema when omitted. */
  parameters?: JsonSchemaObject | undefined
  /** Lifecycle tag; `local` when omitted. */
  source?: string | undefined
  /** Deadline for one call (default 30 s). */
  timeoutSeconds?: number | undefined
  handler: LocalToolHandler
}

export interface RoleOptions {
  syncTimeoutMs: number
  events: EventEmitter<ToolportEvents>
  /** Compile budgets of local tools' `parameters` (the runtime's `limits`). */
  schemaBudgets?: SchemaBudgets | undefined
  /** Size limits of local tools, as of registrations (the runtime's `limits`; none when unset). */
  registrationLimits?: RegistrationLimits | undefined
  /**
   * Called in the turn a local tool of `source` is added, before it is: ownership mode releases a
   * binding whose tools are all gone, which the local tool would otherwise bring back in force.
   */
  beforeLocalTool?: ((source: string) => void) | undefined
}

/**
 * One role. Its registry changes synchronously (atomic on the event loop); `sync()` then pushes
 * the newest snapshot to every attached session.
 *
 * @example
 * const detach = tp.roles.get('Lanlan').attachSession({ id: 's1', syncTools: async (tools) => {} })
 */
export class Role {
  static #serials = 0
  readonly name: string
  /** Unique per Role object in the process: a role removed and added again is a new one. */
  readonly serial = ++Role.#serials
  readonly registry = new ToolRegistry()
  readonly #sessions = new Set<ModelSession>()
  #sessionList: readonly ModelSession[] = []
  readonly #sync: RoleSync
  readonly #events: EventEmitter<ToolportEvents>
  readonly #schemaBudgets: SchemaBudgets
  readonly #registrationLimits: RegistrationLimits | undefined
  readonly #beforeLocalTool: ((source: string) => void) | undefined
  /** Its runtime closed (`kRoleClosed`). */
  #isClosed = false
  /** It was removed from its runtime (`kRoleRemoved`). */
  #isRemoved = false

  constructor (name: string, options: RoleOptions) {
    this.name = name
    this.#events = options.events
    this.#schemaBudgets = options.schemaBudgets ?? DEFAULT_SCHEMA_BUDGETS
    this.#registrationLimits = options.registrationLimits
    this.#beforeLocalTool = options.beforeLocalTool
    this.#sync = new RoleSync({
      definitions: () => this.registry.definitions(),
      sessions: () => this.#sessionList
    }, options.syncTimeoutMs, (outcome, durationMs, sessions) => {
      this.#onSyncFinished(outcome, durationMs,
        sessions)
    })
  }

  /** Syncs started so far (sessions present); for tests. */
  get [kSyncCount] (): number { return this.#sync.count }

  /**
   * The runtime closed: the role takes no local tool, a session attached now is never synced, and
   * the sync in flight ends (its sessions' signal aborts); none starts after it.
   */
  [kRoleClosed] (): void {
    this.#isClosed = true
    this.#sync.close()
  }

  /**
   * The role was removed from its runtime: its sessions are dropped (its sync in flight ends, their
   * signal aborts, and it counts as done, as a role without sessions syncs), and a reference kept to
   * it takes no tool and no session.
   */
  [kRoleRemoved] (): void {
    this.#isRemoved = true
    this.#sessions.clear()
    this.#sessionList = []
    this.#sync.dropSessions()
  }

  /** Throws TP_ERR_ROLE_NOT_FOUND once the role was removed, TP_ERR_CLOSED once its runtime closed. */
  #assertLive (): void {
    if (this.#isRemoved) throw new RoleNotFoundError(this.name)
    if (this.#isClosed) throw new ClosedError()
  }

  /**
   * Attaches a live model session; returns a function that detaches it. The session is sent the
   * role's current tools at once (a failure is reported as a `sync-failed` event).
   */
  attachSession (session: ModelSession): () => void {
    assertModelSession(session, 'attachSession')
    if (this.#sessions.has(session)) return () => this.#detach(session)
    if (this.#isRemoved) throw new RoleNotFoundError(this.name)
    // A session that opens while the runtime shuts down (a socket's 'open' racing close()) is
    // not an error of the host's: it is not attached, and nothing is ever pushed to it.
    if (this.#isClosed) return noop
    this.#sessions.add(session)
    this.#sessionList = [...this.#sessions]
    this.sync().catch(noop)
    return () => this.#detach(session)
  }

  /**
   * Swaps model sessions in one step while the role and its registry stay: detaches `previous`,
   * attaches `next` (a session in both stays), then syncs and resolves with that sync's outcome,
   * so `next` has the role's tools (plugin tools included) when it resolves. The way to rebuild
   * a character's sessions: removing and adding the role instead drops every plugin's tools.
   *
   * @example
   * await tp.roles.get('Lanlan').replaceSessions([oldSession], [newSession])
   */
  async replaceSessions (previous: readonly ModelSession[], next: readonly ModelSession[]): Promise<SyncOutcome> {
    for (const session of next) assertModelSession(session, 'replaceSessions')
    if (this.#isRemoved && next.some((session) => !this.#sessions.has(session))) throw new RoleNotFoundError(this.name)
    const keep = new Set(next)
    for (const session of previous) {
      if (!keep.has(session)) this.#sessions.delete(session)
    }
    // After close(), as attachSession: a new session is not attached, and did not take the tools.
    let refused = 0
    for (const session of next) {
      if (!this.#isClosed) this.#sessions.add(session)
      else if (!this.#sessions.has(session)) refused++
    }
    this.#sessionList = [...this.#sessions]
    if (refused > 0) return { ok: false, error: CLOSED_ERROR, failedSessions: refused }
    return await this.sync()
  }

  /** Detaches a session (as the function `attachSession` returned does); true when it was attached. */
  detachSession (session: ModelSession): boolean {
    const had = this.#sessions.has(session)
    this.#detach(session)
    return had
  }

  /** The attached sessions, in attach order. */
  sessions (): readonly ModelSession[] {
    return this.#sessionList
  }

  /** Pushes the current tools to every session (coalesced with concurrent requests). */
  sync (): Promise<SyncOutcome> {
    return this.#sync.request()
  }

  /** Once per sync that ran (however many callers shared it). */
  #onSyncFinished (outcome: SyncOutcome, durationMs: number, sessions: number): void {
    // A role's last event is its `role-removed`: a sync that ends after it (the removal ended it)
    // is not reported, so no listener keeps state for a role that is gone. The mutation waiting
    // on the sync still gets its outcome.
    if (this.#isRemoved) return
    if (this.#events.listenerCount('sync-finished') > 0) {
      const failures = outcome.ok ? 0 : outcome.failedSessions ?? sessions
      this.#events.emit('sync-finished', {
        role: this.name,
        ok: outcome.ok,
        error: outcome.error,
        durationMs,
        sessions,
        failures
      })
    }
    if (!outcome.ok && this.#events.listenerCount('sync-failed') > 0) {
      this.#events.emit('sync-failed', { role: this.name, error: outcome.error })
    }
  }

  /**
   * Registers an in-process tool (replacing any tool of that name) and syncs.
   * Local tools are listed with `is_remote: false`, and the HTTP API cannot replace or remove them.
   */
  async registerLocalTool (options: LocalToolOptions): Promise<SyncOutcome> {
    this.#assertLive()
    const entry = await buildLocalEntry(options, this.#schemaBudgets, this.#registrationLimits)
    // Also after the schema's compile: the role may have been removed, or the runtime closed, meanwhile.
    this.#assertLive()
    this.#beforeLocalTool?.(entry.source)
    const previous = this.registry.set(entry)
    if (previous !== undefined) this.emitRemoved(previous, 'replaced')
    if (this.#events.listenerCount('tool-registered') > 0) {
      this.#events.emit('tool-registered', {
        role: this.name,
        name: entry.name,
        source: entry.source,
        isRemote: false,
        origin: ''
      })
    }
    emitChangeEnd(this.#events)
    return await this.sync()
  }

  /** Removes an in-process tool; resolves with whether it was there, after the sync. */
  async unregisterLocalTool (name: string): Promise<SyncOutcome & { removed: boolean }> {
    // A removal announced under a removed role's name would read as one from a new role of that name.
    if (this.#isRemoved) throw new RoleNotFoundError(this.name)
    const entry = this.registry.get(name)
    if (entry === undefined || entry.isRemote) return { ok: true, error: '', removed: false }
    this.registry.delete(name)
    this.emitRemoved(entry, 'local')
    emitChangeEnd(this.#events)
    return { ...(await this.sync()), removed: true }
  }

  /** Rows for `GET /api/tools`, in registration order. */
  tools (): readonly ToolListing[] {
    return this.registry.listing()
  }

  /** Emits `tool-removed` for an entry that left this role (only when someone listens). */
  emitRemoved (entry: ToolEntry, reason: RemovalReason): void {
    if (this.#events.listenerCount('tool-removed') > 0) {
      this.#events.emit('tool-removed', {
        role: this.name,
        name: entry.name,
        source: entry.source,
        reason,
        origin: entry.origin
      })
    }
  }

  #detach (session: ModelSession): void {
    if (this.#sessions.delete(session)) this.#sessionList = [...this.#sessions]
  }
}

/** Throws TP_ERR_CONFIG unless `session` has what a sync reads: an `id` and a `syncTools` function. */
function assertModelSession (session: unknown, method: string): asserts session is ModelSession {
  const candidate = session as Partial<ModelSession> | null
  if (typeof candidate !== 'object' || candidate === null || typeof candidate.id !== 'string' ||
    typeof candidate.syncTools !== 'function') {
    throw new ConfigError(`${method}: a session must be an object with an \`id\` string and a \`syncTools(tools, signal)\` function`)
  }
}

async function buildLocalEntry (options: LocalToolOptions, budgets: SchemaBudgets,
  limits: RegistrationLimits | undefined): Promise<ToolEntry> {
  // The registration rules and size limits, shared with the HTTP API; a bad field is a 422 naming it.
  const valid = parseOrThrow(localToolSchema, options)
  // A copy: the host may go on using its object (a schema builder reused for the next tool), and
  // the schema listed and measured must stay the one compiled here.
  const parameters = checkedParameters(valid, limits)
  const validator = await compileValidator(parameters, budgets)
  return new ToolEntry({
    name: valid.name,
    description: valid.description,
    parameters,
    source: valid.source,
    timeoutMs: Math.max(1, Math.round(valid.timeoutSeconds * 1000)),
    handler: options.handler,
    validator
  })
}
