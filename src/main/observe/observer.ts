// What the console reads: the event hub, call statistics, and the few facts the registry does not
// keep (each role's last sync, recent evictions, recent calls). One Observer per runtime, made
// when its HTTP routes are first registered, fed by the runtime's events; every store is bounded.
import type { Runtime } from '../runtime.js'
import type { Role } from '../roles/role.js'
import type { ToolEntry } from '../roles/tool-registry.js'
import { CallStats, type StatsSnapshot } from './call-stats.js'
import { EventHub } from './event-hub.js'
import { kOnClose, kOriginFailures } from '../symbols.js'

/** Recent calls kept for the console's table (metadata only). */
const RECENT_CALLS = 100
/** Evictions remembered for the console. */
const RECENT_EVICTIONS = 50
/** Tools charted besides the total. */
const CHARTED_TOOLS = 12

export interface LastSync {
  at: string
  duration_ms: number
  ok: boolean
  sessions: number
  failures: number
  error: string | null
}

export interface EvictionRecord {
  at: string
  origin: string
  tools: string[]
  roles: string[]
  failures: number
}

export interface RecentCall {
  at: string
  role: string
  tool: string | null
  source: string | null
  outcome: string
  is_error: boolean
  duration_ms: number
  bytes: number
}

export interface ConsoleTool {
  name: string
  description: string
  source: string
  callback_url: string | null
  origin: string | null
  is_remote: boolean
  timeout_seconds: number
}

/** `GET /api/console/state`: the registry as the console shows it. */
export interface ConsoleState {
  instance_id: string
  version: string
  uptime_seconds: number
  token_mode: boolean
  /** Each role's `tools` is frozen and shared by the reads of one registry revision. */
  roles: Array<{ name: string, sessions: number, last_sync: LastSync | null, tools: readonly ConsoleTool[] }>
  origins: Array<{ origin: string, sources: string[], roles: string[], tools: number, failures: number }>
  evictions: EvictionRecord[]
  calls: RecentCall[]
}

/** `GET /api/console/stats`: what changes every second. */
export interface ConsoleStats {
  now: number
  pool: ReturnType<Runtime['health']>['dispatch']
  events: { subscribers: number, dropped: number, last_event_id: string }
  stats: StatsSnapshot
}

export class Observer {
  readonly hub: EventHub
  readonly stats = new CallStats()
  readonly #runtime: Runtime
  readonly #lastSync = new Map<string, LastSync>()
  /** Each entry's row, shared by every role it is in (entries are immutable). */
  readonly #rows = new WeakMap<ToolEntry, ConsoleTool>()
  /** Each role's rows at its registry's revision: frozen, so its measured JSON size is remembered. */
  readonly #roleRows = new WeakMap<Role, { revision: number, rows: readonly ConsoleTool[] }>()
  readonly #evictions: EvictionRecord[] = []
  /** A ring of the last calls; `at` is formatted only when the state is read (off the call path). */
  readonly #calls: Array<(Omit<RecentCall, 'at'> & { atMs: number }) | undefined> = new Array(RECENT_CALLS)
  #callCount = 0

  constructor (runtime: Runtime) {
    this.#runtime = runtime
    this.hub = new EventHub(runtime, runtime.instanceId, runtime.options.events, (role) => runtime.roles.has(role))
    runtime.on('call-finished', (e) => {
      // No source: the name matched no tool, the model's free text.
      const source = e.source === '' || e.source === undefined ? null : e.source
      const tool = source === null ? null : e.name
      this.stats.record(e.role, tool, e.durationMs, e.isError)
      this.#calls[this.#callCount++ % RECENT_CALLS] = {
        atMs: Date.now(),
        role: e.role,
        tool,
        source,
        outcome: e.outcome,
        is_error: e.isError,
        duration_ms: Math.round(e.durationMs * 1000) / 1000,
        bytes: e.bytes ?? 0
      }
    })
    runtime.on('sync-finished', (e) => {
      this.#lastSync.set(e.role, {
        at: new Date().toISOString(),
        duration_ms: Math.round(e.durationMs * 1000) / 1000,
        ok: e.ok,
        sessions: e.sessions,
        failures: e.failures ?? (e.ok ? 0 : e.sessions),
        error: e.ok ? null : e.error
      })
    })
    runtime.on('role-removed', (e) => { this.#lastSync.delete(e.role) })
    runtime.on('origin-evicted', (e) => {
      this.#evictions.unshift({
        at: new Date().toISOString(),
        origin: e.origin,
        tools: e.tools,
        roles: e.roles,
        failures: e.failures
      })
      if (this.#evictions.length > RECENT_EVICTIONS) this.#evictions.length = RECENT_EVICTIONS
    })
  }

  state (): ConsoleState {
    const runtime = this.#runtime
    const health = runtime.health()
    const origins = new Map<string, { sources: Set<string>, roles: Set<string>, tools: number }>()
    const roles: ConsoleState['roles'] = []
    for (const role of runtime.roles.list()) {
      for (const entry of role.registry.entries()) {
        if (entry.origin === '') continue
        let origin = origins.get(entry.origin)
        if (origin === undefined) {
          origin = { sources: new Set(), roles: new Set(), tools: 0 }
          origins.set(entry.origin, origin)
        }
        origin.sources.add(entry.source)
        origin.roles.add(role.name)
        origin.tools++
      }
      roles.push({
        name: role.name,
        sessions: role.sessions().length,
        last_sync: this.#lastSync.get(role.name) ?? null,
        tools: this.#toolsOf(role)
      })
    }
    const calls: RecentCall[] = []
    for (let i = Math.max(0, this.#callCount - RECENT_CALLS); i < this.#callCount; i++) {
      const { atMs, ...call } = this.#calls[i % RECENT_CALLS] as Omit<RecentCall, 'at'> & { atMs: number }
      calls.push({ at: new Date(atMs).toISOString(), ...call })
    }
    return {
      instance_id: runtime.instanceId,
      version: health.version,
      uptime_seconds: health.uptime_seconds,
      token_mode: runtime.options.security.token !== undefined,
      roles,
      origins: [...origins].map(([origin, o]) => ({
        origin,
        sources: [...o.sources],
        roles: [...o.roles],
        tools: o.tools,
        failures: runtime[kOriginFailures](origin)
      })),
      evictions: this.#evictions,
      calls
    }
  }

  /** The role's rows at its current revision, built once per revision. */
  #toolsOf (role: Role): readonly ConsoleTool[] {
    const revision = role.registry.revision
    const known = this.#roleRows.get(role)
    if (known !== undefined && known.revision === revision) return known.rows
    const rows: ConsoleTool[] = []
    for (const entry of role.registry.entries()) {
      let row = this.#rows.get(entry)
      if (row === undefined) {
        row = Object.freeze({
          name: entry.name,
          description: entry.description,
          source: entry.source,
          callback_url: entry.callbackUrl,
          origin: entry.origin === '' ? null : entry.origin,
          is_remote: entry.isRemote,
          timeout_seconds: entry.timeoutMs / 1000
        })
        this.#rows.set(entry, row)
      }
      rows.push(row)
    }
    const frozen = Object.freeze(rows)
    this.#roleRows.set(role, { revision, rows: frozen })
    return frozen
  }

  liveStats (): ConsoleStats {
    return {
      now: Date.now(),
      pool: this.#runtime.health().dispatch,
      events: { subscribers: this.hub.subscribers, dropped: this.hub.dropped, last_event_id: this.hub.lastEventId },
      stats: this.stats.snapshot(CHARTED_TOOLS)
    }
  }

  close (): void {
    this.hub.close()
  }
}

const observers = new WeakMap<Runtime, Observer>()

/** The runtime's observer, made on first use (one per runtime, however many apps mount its routes). */
export function observerOf (runtime: Runtime): Observer {
  let observer = observers.get(runtime)
  if (observer === undefined) {
    const created = new Observer(runtime)
    observers.set(runtime, created)
    // Its event streams end with the runtime, also in a host's app that stays up.
    runtime[kOnClose](async () => { created.close() })
    observer = created
  }
  return observer
}
