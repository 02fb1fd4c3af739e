// Prometheus metrics (prom-client), one Registry per Runtime so that two instances in one process
// never share or clash; the process's own metrics (CPU, memory, GC, event loop) come from one
// registry shared by every instance. Labels are bounded: roles that exist (a removed role's series
// are dropped), tool names registered now (at most `limits.maxToolsPerRole` × roles of them, more
// count as `(other)`) and the last STALE_TOOL_NAMES names that left every role, outcome kinds;
// never call ids, argument values or a name that matched no tool.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client'
import type { EventEmitter } from 'node:events'
import type { ToolportEvents } from './events.js'
import type { OutcomeKind } from '../workers/protocol.js'
import { LocalCounter, LocalHistogram } from './local-metrics.js'
import { kFromRemovedRole } from './symbols.js'

/** What the metrics read when scraped. */
export interface MetricsSource {
  events: EventEmitter<ToolportEvents>
  pendingCalls: () => number
  queuedCalls: () => number
  poolUtilization: () => number
  poolThreads: () => number
  bufferedReplyBytes: () => number
  replyBudgetBytes: () => number
  registrySizes: () => Iterable<[string, number]>
  /** How many distinct tool names `toolport_calls_total` may label at once (beyond: `(other)`). */
  maxToolLabels: () => number
  /** Whether `role` holds a tool named `name` now (local or remote). */
  hasTool: (role: string, name: string) => boolean
  /** Whether any role holds a tool named `name` now. */
  isRegistered: (name: string) => boolean
}

/**
 * Tool names no role holds any more whose `toolport_calls_total` series are kept (the longest gone
 * are dropped first): a tool that came and went between two scrapes is still seen.
 */
export const STALE_TOOL_NAMES = 256

/**
 * The process's default metrics, collected once: prom-client's collector installs a process-wide
 * GC observer that is never removed, so one per Runtime kept every closed Runtime alive and made
 * each garbage collection notify one more observer.
 */
let processMetrics: Registry | null = null
function processRegistry (): Registry {
  if (processMetrics === null) {
    processMetrics = new Registry()
    collectDefaultMetrics({ register: processMetrics })
  }
  return processMetrics
}

const LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300]

/** A label-less gauge whose value is read from `read` at scrape time. */
function scrapedGauge (registers: Registry[], name: string, help: string, read: () => number): void {
  new Gauge({ // eslint-disable-line no-new
    name,
    help,
    registers,
    collect () { this.set(read()) }
  })
}

export class Metrics {
  readonly registry = new Registry()
  // Per call: counted locally, read by the registry when scraped (src/main/local-metrics.ts).
  readonly #queueSeconds: LocalHistogram
  readonly #callbackSeconds: LocalHistogram
  readonly #process: Registry

  constructor (source: MetricsSource) {
    const registers = [this.registry]
    this.#process = processRegistry()
    const calls = new LocalCounter(this.registry, 'toolport_calls_total',
      'Tool calls answered, by role, tool and outcome', ['role', 'tool', 'outcome'] as const)
    const callSeconds = new LocalHistogram(this.registry, 'toolport_call_duration_seconds',
      'Whole tool call, from callTool to the result', 'outcome', LATENCY_BUCKETS)
    this.#queueSeconds = new LocalHistogram(this.registry, 'toolport_dispatch_queue_seconds',
      'Time a callback call waited on the main thread before it was handed to a worker', 'outcome', LATENCY_BUCKETS)
    this.#callbackSeconds = new LocalHistogram(this.registry, 'toolport_dispatch_callback_seconds',
      'Time from handing a call to a worker (or the inline client) to its outcome: worker and callback', 'outcome',
      LATENCY_BUCKETS)
    // No origin label: plugins restarting on fresh ports would grow it without bound.
    const evictions = new Counter({
      name: 'toolport_evictions_total',
      help: 'Callback origins whose plugin tools were evicted after consecutive connection failures',
      registers
    })
    const evictedTools = new Counter({
      name: 'toolport_evicted_tools_total',
      help: 'Tool registrations removed by evictions (summed over roles)',
      registers
    })
    const syncSeconds = new Histogram({
      name: 'toolport_sync_duration_seconds',
      help: 'Duration of a role\'s sync to its model sessions',
      labelNames: ['role'] as const,
      buckets: LATENCY_BUCKETS,
      registers
    })
    const syncFailures = new Counter({
      name: 'toolport_sync_failures_total',
      help: 'Role syncs that failed or timed out',
      labelNames: ['role'] as const,
      registers
    })
    // Gauges are read when scraped, so the hot path pays nothing for them.
    scrapedGauge(registers, 'toolport_calls_in_flight', 'Callback calls admitted and not yet answered',
      source.pendingCalls)
    scrapedGauge(registers, 'toolport_dispatch_queue_depth',
      'Calls waiting to be handed to a worker: behind their origin\'s in-flight bound or in this turn\'s batch',
      source.queuedCalls)
    scrapedGauge(registers, 'toolport_pool_utilization',
      'Worker threads\' event-loop utilisation since the previous scrape (0-1, averaged); 0 in inline mode',
      source.poolUtilization)
    scrapedGauge(registers, 'toolport_reply_buffer_bytes',
      'Callback reply bytes being received and held right now, over all threads', source.bufferedReplyBytes)
    scrapedGauge(registers, 'toolport_reply_buffer_limit_bytes',
      'The budget on held reply bytes (dispatch.maxBufferedReplyBytes)', source.replyBudgetBytes)
    scrapedGauge(registers, 'toolport_pool_threads', 'Worker threads in the pool; 0 in inline mode', source.poolThreads)
    new Gauge({ // eslint-disable-line no-new
      name: 'toolport_registry_tools',
      help: 'Tools registered per role',
      labelNames: ['role'] as const,
      registers,
      collect () {
        this.reset()
        for (const [role, size] of source.registrySizes()) this.set({ role }, size)
      }
    })

    // Tool names with series, and the roles they have them in. A name no role holds any more
    // (unregistered, cleared, evicted) keeps its series for a while, so that a scrape still sees
    // the calls of a tool that came and went between two scrapes; past STALE_TOOL_NAMES such
    // names, the longest gone lose their series. So plugins that register, are called and
    // unregister ever new names (or restart under new ones) keep a bounded number of series, and
    // only names registered now count towards the cap beyond which a name is `(other)`.
    const toolLabels = new Map<string, Set<string>>()
    /** Names no role holds, oldest first. */
    const staleNames = new Set<string>()
    const markStale = (name: string): void => {
      staleNames.delete(name)
      staleNames.add(name)
      for (const oldest of staleNames) {
        if (staleNames.size <= STALE_TOOL_NAMES) break
        staleNames.delete(oldest)
        toolLabels.delete(oldest)
        calls.remove({ tool: oldest })
      }
    }
    /** The `tool` label of a call of `name` in `role` that ended just now. */
    const toolLabel = (role: string, name: string, toolSource: string): string => {
      // A name that matches no tool (no source) is the model's free text: unbounded, so not a label.
      if (toolSource === '') return '(unknown)'
      // Its own role first: the common case costs one lookup, not one per role.
      const isHeld = source.hasTool(role, name) || source.isRegistered(name)
      let roles = toolLabels.get(name)
      if (roles === undefined) {
        if (isHeld && toolLabels.size - staleNames.size >= source.maxToolLabels()) return '(other)'
        roles = new Set()
        toolLabels.set(name, roles)
        // Its tool left while the call ran: counted, and gone with the other stale names.
        if (!isHeld) markStale(name)
      } else if (isHeld) {
        staleNames.delete(name)
      }
      roles.add(role)
      return name
    }
    source.events.on('call-finished', (event) => {
      const outcome = event.outcome
      // The whole call's duration is not labelled by role; the role-labelled count of a role
      // removed while the call ran would bring the role's series back for good, or count it under
      // a new role of the same name.
      callSeconds.observe(outcome, event.durationMs / 1000)
      if ((event as unknown as Record<symbol, unknown>)[kFromRemovedRole] === true) return
      calls.inc(event.role, toolLabel(event.role, event.name, event.source), outcome)
    })
    source.events.on('origin-evicted', () => { evictions.inc() })
    // One `tool-removed` per registration an eviction removed: `origin-evicted` names the tools
    // and the roles, not which tool was in which role.
    source.events.on('tool-removed', (event) => {
      if (event.reason === 'evicted') evictedTools.inc()
      // Replaced (by another registration, or a local tool), the name goes on in its role.
      if (toolLabels.has(event.name) && !source.isRegistered(event.name)) markStale(event.name)
    })
    source.events.on('sync-finished', (event) => {
      syncSeconds.observe({ role: event.role }, event.durationMs / 1000)
      if (!event.ok) syncFailures.inc({ role: event.role })
    })
    // Roles come and go at run time (agents named per conversation): a removed role's series go
    // with it, so their number follows the roles that exist, not every role there ever was.
    source.events.on('role-removed', ({ role }) => {
      calls.remove({ role })
      for (const [name, roles] of toolLabels) {
        if (!roles.delete(role)) continue
        if (roles.size === 0) {
          toolLabels.delete(name)
          staleNames.delete(name)
        } else if (!source.isRegistered(name)) {
          // Its last holder was this role: the name left every role with it.
          markStale(name)
        }
      }
      syncSeconds.remove({ role })
      syncFailures.remove({ role })
    })
  }

  /** The dispatcher's observer: queue and callback time of each answered callback call. */
  readonly observeDispatch = (queueMs: number, callbackMs: number, kind: OutcomeKind): void => {
    this.#queueSeconds.observe(kind, queueMs / 1000)
    this.#callbackSeconds.observe(kind, callbackMs / 1000)
  }

  /** The Prometheus text exposition. */
  async text (): Promise<string> {
    const text = await Registry.merge([this.#process, this.registry]).metrics()
    // prom-client spells a NaN (an event-loop lag with no samples yet) `Nan`; the format's is `NaN`.
    return text.includes(' Nan\n') ? text.replaceAll(' Nan\n', ' NaN\n') : text
  }

  get contentType (): string {
    return this.registry.contentType
  }
}
