// Runtime: roles, register/unregister/clear/list, callTool, events, close — the one object the
// HTTP routes, the CLI and embedding hosts talk to.
import { EventEmitter } from 'node:events'
import { randomUUID } from 'node:crypto'
import type { Worker } from 'node:worker_threads'
import type { Logger } from 'pino'
import { parseOptions, type ResolvedOptions, type ToolportOptions } from './config.js'
import { ClosedError, limitExceeded, validationError } from './errors.js'
import { emitChangeEnd, type ToolportEvents } from './events.js'
import { RoleManager } from './roles/roles.js'
import type { Role } from './roles/role.js'
import { ToolEntry, type ToolListing } from './roles/tool-registry.js'
import type { SyncOutcome } from './roles/sync.js'
import { checkedParameters, clearSchema, parseOrThrow, registerSchema, unregisterSchema } from './schemas.js'
import type {
  ClearResult, FailedRole, HealthReport, RefusedRole, RegisterResult, UnregisterResult
} from './schemas.js'
import { Dispatcher } from './dispatch/dispatcher.js'
import { OriginHealth, originVerdict } from './dispatch/origin-health.js'
import { checkArguments, readArguments } from './dispatch/arguments.js'
import { compileValidator, warmUpSchemaCompiler } from './dispatch/validators.js'
import { errorResult, outcomeToResult, type ToolResult } from './dispatch/result.js'
import { runLocalTool } from './dispatch/local-tool.js'
import { callListeners, errorText, noop } from '../shared/util.js'
import type { CallOutcome } from '../workers/protocol.js'
import { Metrics } from './metrics.js'
import { ownerOf, SourceOwners, type Owner } from './ownership.js'
import { VERSION } from './version.js'
import { createLogger } from './logger.js'
import { kCloseRoles, kDispatchMode, kFromRemovedRole, kDispatchReady, kJsonArguments, kOnClose, kOriginFailures, kPendingCalls, kRefuseCall, kWorkerThreads } from './symbols.js'
import type { CancelSignal } from '../shared/cancel.js'

/** How often origin-health entries of origins without tools are forgotten. */
const HEALTH_SWEEP_MS = 60_000
/** Names listed in an "unknown tool" error (a role may hold thousands). */
const UNKNOWN_TOOL_NAMES = 20

export type { ClearResult, FailedRole, HealthReport, RefusedRole, RegisterResult, UnregisterResult }

/**
 * Result of `list` (docs/protocol.md R18). Not inferred from `listResultSchema`: the listings are
 * the registry's own read-only objects, handed out without a copy.
 */
export interface ListResult {
  ok: true
  tools_by_role: Record<string, readonly ToolListing[]>
}

/** Which tools `list` answers (`GET /api/tools?source=…&name=…`); both given: tools matching both. */
export interface ListFilter {
  /** Only the tools of this source. */
  source?: string | null | undefined
  /** Only the tools of these names. */
  names?: readonly string[] | null | undefined
}

/** A model's tool call (`raw_arguments` wins over `arguments`: docs/protocol.md R9). */
export interface ToolCall {
  name: string
  call_id?: string | undefined
  /** The parsed arguments; ignored when `raw_arguments` is given. */
  arguments?: unknown
  /** The model's argument text (JSON). */
  raw_arguments?: string | undefined
}

/** Who asks for a register, unregister or clear (ownership mode, see SECURITY.md). */
export interface MutationOptions {
  /**
   * The plugin's key (the HTTP routes pass `X-Toolport-Plugin-Key`). In ownership mode a source
   * is bound to the key that first registered it. Without a key the caller is the embedding
   * host, which may change any source.
   */
  pluginKey?: string | undefined
}

export interface CallToolOptions {
  /**
   * Aborting it answers the call as cancelled at once and stops the callback request. An
   * AbortSignal, or anything with its `aborted`, `addEventListener` and `removeEventListener`
   * for 'abort' (`CancelSignal`).
   */
  signal?: CancelSignal | undefined
  /** Internal: the arguments were just parsed from JSON (see kJsonArguments). */
  [kJsonArguments]?: boolean
}

/**
 * The registry and dispatcher of one Toolport instance. Create it with `createToolport`.
 *
 * @example
 * const tp = await createToolport({ roles: ['Lanlan'] })
 * await tp.register({ name: 'get_weather', callback_url: 'http://127.0.0.1:9333/tools/get_weather' })
 */
export class Runtime extends EventEmitter<ToolportEvents> {
  readonly options: ResolvedOptions
  readonly roles: RoleManager
  readonly log: Logger
  readonly #dispatcher: Dispatcher
  readonly #health: OriginHealth
  readonly #background = new Set<Promise<unknown>>()
  /** What routes mounted on this runtime end once it has closed (event streams, MCP sessions). */
  readonly #closeHooks = new Set<() => Promise<void>>()
  readonly #startedAt = Date.now()
  /** Random per Runtime (so per process start), in `/api/health` and the event stream's `hello`. */
  readonly instanceId: string = randomUUID()
  readonly #sweeper: NodeJS.Timeout
  /** Cancel functions of the local tool calls running now. */
  readonly #localCalls = new Set<() => void>()
  /** Prometheus metrics, or null when `metrics: false`. */
  readonly metrics: Metrics | null
  /** Ownership mode: the owner each source is bound to. */
  readonly #owners: SourceOwners
  #closed = false
  #closing: Promise<void> | undefined

  constructor (options: ToolportOptions = {}, logger?: Logger) {
    super()
    this.options = parseOptions(options)
    this.log = logger ?? createLogger(this.options.logger)
    this.roles = new RoleManager({
      syncTimeoutMs: this.options.syncTimeoutMs,
      events: this,
      schemaBudgets: this.options.limits,
      registrationLimits: this.options.limits,
      beforeLocalTool: (source) => { this.#owners.release(source) }
    })
    for (const name of this.options.roles) this.roles.add(name)
    this.metrics = this.options.metrics
      ? new Metrics({
        events: this,
        pendingCalls: () => this.#dispatcher.pending,
        queuedCalls: () => this.#dispatcher.queued,
        poolUtilization: () => this.#dispatcher.utilization('metrics'),
        poolThreads: () => this.#dispatcher.threads.length,
        bufferedReplyBytes: () => this.#dispatcher.bufferedReplyBytes,
        replyBudgetBytes: () => this.options.dispatch.maxBufferedReplyBytes,
        registrySizes: () => this.roles.list().map((r): [string, number] => [r.name, r.registry.size]),
        maxToolLabels: () => this.options.limits.maxToolsPerRole * Math.max(1, this.roles.size),
        hasTool: (role, name) => this.roles.find(role)?.registry.get(name) !== undefined,
        isRegistered: (name) => this.roles.list().some((role) => role.registry.get(name) !== undefined)
      })
      : null
    this.#dispatcher = new Dispatcher(this.options.dispatch, this.metrics?.observeDispatch ?? null)
    this.#health = new OriginHealth(this.options.evictionThreshold)
    this.#owners = new SourceOwners((source) =>
      this.roles.list().some((role) => role.registry.countBySource(source) > 0))
    // One unref'd sweep (no timer per call) forgets the health of origins no tool uses any more.
    this.#sweeper = setInterval(() => {
      this.#health.forget((origin) => this.roles.list().some((role) => role.registry.hasOrigin(origin)))
      this.#owners.sweep()
    }, HEALTH_SWEEP_MS)
    this.#sweeper.unref()
    warmUpSchemaCompiler()
  }

  /**
   * Emits to host listeners; a listener that throws (or an async one that rejects) is logged and
   * otherwise ignored, and the listeners after it still run, so host code can never break a sync,
   * a registration or a tool call (which must never throw).
   */
  override emit<K extends keyof ToolportEvents> (eventName: K, ...args: ToolportEvents[K]): boolean {
    // Each listener on its own: one that throws must not keep the later ones (the event stream's,
    // the MCP endpoint's, another host listener) from running; an async one's rejection left
    // alone would end the host's process.
    return callListeners(this, this.rawListeners(eventName), args, eventName, this.#listenerFailed)
  }

  readonly #listenerFailed = (eventName: string | symbol, err: unknown): void => {
    this.log.error({ event: String(eventName), error: errorText(err) }, 'an event listener threw; ignored')
  }

  /** The dispatch mode in use (the CLI prints it; `health()` reports it to users). */
  get [kDispatchMode] (): 'pool' | 'inline' { return this.#dispatcher.mode }

  get [kDispatchReady] (): Promise<void> { return this.#dispatcher.ready }

  /** The dispatch pool's worker threads (empty in inline mode). */
  get [kWorkerThreads] (): readonly Worker[] { return this.#dispatcher.threads }

  /** Calls admitted and not yet answered by a callback. */
  get [kPendingCalls] (): number { return this.#dispatcher.pending }

  /** Liveness and readiness: ready while open and (pool mode) with a worker thread. */
  health (): HealthReport {
    const threads = this.#dispatcher.threads.length
    const ready = !this.#closed && (this.#dispatcher.mode === 'inline' || threads > 0)
    let tools = 0
    for (const role of this.roles.list()) tools += role.registry.size
    return {
      ok: ready,
      status: this.#closed ? 'closed' : ready ? 'ready' : 'starting',
      version: VERSION,
      instance_id: this.instanceId,
      uptime_seconds: Math.round((Date.now() - this.#startedAt) / 1000),
      roles: this.roles.size,
      tools,
      dispatch: {
        mode: this.#dispatcher.mode,
        threads,
        in_flight: this.#dispatcher.pending,
        queued: this.#dispatcher.queued,
        utilization: this.#dispatcher.utilization('health')
      }
    }
  }

  /** Consecutive connection failures currently counted at an origin (the console's origins view). */
  [kOriginFailures] (origin: string): number {
    return this.#health.failures(origin)
  }

  /**
   * Registers or replaces (docs/protocol.md R5) one remote tool in the target roles, then waits for each
   * role's sync. `body` has the wire shape of `POST /api/tools/register`.
   * Throws TP_ERR_VALIDATION (422) or TP_ERR_ROLE_NOT_FOUND (404); in ownership mode also
   * TP_ERR_NOT_OWNER (403) when the source belongs to another plugin key.
   */
  async register (body: unknown, options: MutationOptions = {}): Promise<RegisterResult> {
    this.#assertOpen()
    const parsed = parseOrThrow(registerSchema, body)
    const request = { ...parsed, parameters: checkedParameters(parsed, this.options.limits) }
    // R4: the roles that exist now; one added while the schema compiles does not get the tool.
    const current = this.#targets(request.role)
    this.#checkCaps(current, request.name, request.source)
    // In ownership mode, only the source's owner waits in its queue of compiles (compiles take
    // turns by source: another key must not hold up the owner's registrations behind its own).
    const owner = this.#ownerOf(options)
    if (owner !== null) this.#owners.assert(request.source, owner)
    // Compiled before anything changes, off the main thread: a schema Toolport cannot validate is
    // a 422 here, never a tool whose arguments go unchecked.
    const validator = await compileValidator(request.parameters, this.options.limits, request.source)
    // Roles and registries may have changed while the schema compiled: look and check again
    // (a role removed meanwhile is left out, and a role of the same name added again is new).
    this.#assertOpen()
    const targets = request.role === null ? stillThere(current, this.roles.list()) : this.#targets(request.role)
    if (owner !== null) this.#owners.assert(request.source, owner)
    this.#checkCaps(targets, request.name, request.source)
    const entry = new ToolEntry({
      name: request.name,
      description: request.description,
      parameters: request.parameters,
      source: request.source,
      // At least 1 ms: a timeout > 0 s never rounds to a deadline that has passed before the call is sent.
      timeoutMs: Math.max(1, Math.round(request.timeout_seconds * 1000)),
      callback: request.callback_url,
      validator
    })
    const accepted: Role[] = []
    const failed: FailedRole[] = []
    for (const role of targets) {
      const existing = role.registry.get(entry.name)
      if (existing !== undefined && !existing.isRemote) {
        failed.push({
          role: role.name,
          error: `'${entry.name}' is a local tool of this role and cannot be replaced over the API`,
          owned_by: existing.source
        })
        continue
      }
      if (existing !== undefined && this.options.security.enforceOwnership && existing.source !== entry.source) {
        failed.push({
          role: role.name,
          error: `'${entry.name}' belongs to source '${existing.source}'`,
          owned_by: existing.source
        })
        continue
      }
      // A registration a role takes means the plugin is back: count its failures afresh, before
      // the tool is there to be called. One that every role refused changes nothing, this neither.
      if (accepted.length === 0) this.#health.reset(entry.origin)
      role.registry.set(entry)
      if (existing !== undefined) role.emitRemoved(existing, 'replaced')
      if (this.listenerCount('tool-registered') > 0) {
        this.emit('tool-registered', {
          role: role.name,
          name: entry.name,
          source: entry.source,
          isRemote: true,
          origin: entry.origin
        })
      }
      accepted.push(role)
    }
    emitChangeEnd(this)
    // Bound in the same turn as the check above, so two registrations of one source cannot both
    // find it free.
    if (owner !== null && accepted.length > 0) this.#owners.claim(request.source, owner)
    const affected = await syncAll(accepted, failed)
    // close() ended the syncs it waited on: Toolport is going away, not refusing the tool. The
    // answer a request to a closed runtime gets (503), so that a plugin registers again with the
    // next Toolport instead of taking this for a refusal.
    if (affected.length === 0 && accepted.length > 0 && this.#closed) throw new ClosedError()
    const result: RegisterResult = {
      ok: affected.length > 0,
      registered: entry.name,
      affected_roles: affected,
      failed_roles: failed
    }
    if (!result.ok) result.error = targets.length === 0 ? 'no roles exist' : 'no role accepted the registration'
    this.log.info({
      tool: entry.name,
      source: entry.source,
      origin: entry.origin,
      roles: affected,
      failed: failed.length
    }, 'tool registered')
    return result
  }

  /**
   * Removes one tool by name from every role, or from the one role given (docs/protocol.md R15). With
   * `expected_source`, a role whose tool belongs to another source is skipped and listed in
   * `refused_roles`; local tools are always refused, and so, in ownership mode, are tools whose
   * source belongs to another plugin key.
   */
  async unregister (body: unknown, options: MutationOptions = {}): Promise<UnregisterResult> {
    this.#assertOpen()
    const request = parseOrThrow(unregisterSchema, body)
    const targets = this.#targets(request.role)
    const owner = this.#ownerOf(options)
    const changed: Role[] = []
    const refused: RefusedRole[] = []
    for (const role of targets) {
      const existing = role.registry.get(request.name)
      if (existing === undefined) continue
      if (!existing.isRemote || (request.expected_source !== undefined &&
        existing.source !== request.expected_source) ||
        (owner !== null && !this.#owners.allows(existing.source, owner))) {
        refused.push({ role: role.name, owned_by: existing.source })
        continue
      }
      role.registry.delete(request.name)
      role.emitRemoved(existing, 'unregister')
      changed.push(role)
    }
    emitChangeEnd(this)
    const failed: FailedRole[] = []
    const affected = await syncAll(changed, failed)
    if (changed.length > 0) {
      this.log.info({ tool: request.name, roles: affected, failed: failed.length },
        'tool unregistered')
    }
    return {
      // docs/protocol.md R17: no failures, or something was removed (the registry is authoritative).
      ok: failed.length === 0 || changed.length > 0,
      removed: changed.length > 0,
      affected_roles: affected,
      failed_roles: failed,
      refused_roles: refused
    }
  }

  /**
   * Removes every remote tool of a source from every role, or from the one role given (docs/protocol.md R16).
   * In ownership mode, throws TP_ERR_NOT_OWNER (403) when the source belongs to another plugin key.
   */
  async clear (body: unknown, options: MutationOptions = {}): Promise<ClearResult> {
    this.#assertOpen()
    const request = parseOrThrow(clearSchema, body)
    const targets = this.#targets(request.role)
    const owner = this.#ownerOf(options)
    if (owner !== null) this.#owners.assert(request.source, owner)
    const changed: Role[] = []
    let removed = 0
    for (const role of targets) {
      const gone = role.registry.deleteBySource(request.source)
      if (gone.length === 0) continue
      removed += gone.length
      for (const entry of gone) role.emitRemoved(entry, 'clear')
      changed.push(role)
    }
    emitChangeEnd(this)
    const failed: FailedRole[] = []
    const affected = await syncAll(changed, failed)
    if (removed > 0) {
      this.log.info({ source: request.source, removed, roles: affected, failed: failed.length },
        'source cleared')
    }
    return { ok: failed.length === 0 || removed > 0, removed, affected_roles: affected, failed_roles: failed }
  }

  /**
   * Lists the tools of every current role, or of one (docs/protocol.md R18), in registration order;
   * with a `filter`, only the tools of its `source` and of its `names` (every role is still listed).
   */
  list (role?: string | null, filter?: ListFilter): ListResult {
    const roles = role !== undefined && role !== null ? [this.roles.get(role)] : this.roles.list()
    const source = filter?.source ?? undefined
    const given = filter?.names ?? undefined
    const names = given === undefined ? undefined : new Set(given)
    // A plain object, as the type says (hasOwnProperty, deepStrictEqual with a literal), whose
    // keys are own properties even for a role named `__proto__` (fromEntries defines, never sets).
    const toolsByRole: Record<string, readonly ToolListing[]> = Object.fromEntries(
      roles.map((r) => [r.name, r.registry.filteredListing(source, names)]))
    return { ok: true, tools_by_role: toolsByRole }
  }

  /**
   * Runs a model's tool call and returns what the model sees. Never throws for anything a plugin
   * or the model did (those are `is_error` results); throws TP_ERR_ROLE_NOT_FOUND for an unknown role.
   */
  async callTool (roleName: string, call: ToolCall, options?: CallToolOptions): Promise<ToolResult> {
    const role = this.roles.get(roleName)
    if (typeof call !== 'object' || call === null || typeof call.name !== 'string') {
      // The host's mistake, not the model's: a model's call always has a name (the call route
      // checks it with the same rule).
      throw validationError([{ path: 'call.name', code: 'invalid_type', message: 'a call is an object with a `name` string' }])
    }
    const started = performance.now()
    const callId = typeof call.call_id === 'string' && call.call_id !== '' ? call.call_id : `call_${randomUUID()}`
    const entry = role.registry.get(call.name)
    if (this.#closed) {
      return this.#finish(role, call.name, callId, started, 'busy',
        errorResult('Toolport is shutting down; the tool was not called'), entry?.source)
    }
    if (entry === undefined) {
      const available = describeAvailable(role.registry.names())
      return this.#finish(role, call.name, callId, started, 'unknown_tool',
        errorResult(`unknown tool '${call.name}'; ${available}`))
    }
    const args = readArguments(call.raw_arguments, call.arguments, options?.[kJsonArguments] === true)
    if (!args.ok) {
      return this.#finish(role, entry.name, callId, started, 'invalid_arguments', errorResult(args.error),
        entry.source)
    }
    const problem = checkArguments(entry, args.value)
    if (problem !== '') {
      // Cut short by the time checks took lately, or refused by its arguments (dispatch/check-time.ts).
      return this.#finish(role, entry.name, callId, started,
        entry.checkTime.refused ? 'check_budget' : 'invalid_arguments', errorResult(problem), entry.source)
    }
    if (entry.handler !== null) {
      const { outcome, result } = await runLocalTool(entry, args.value, role.name, callId, options?.signal,
        this.#localCalls)
      return this.#finish(role, entry.name, callId, started, outcome, result, entry.source)
    }
    // The callback body is built once, here, as a string (R9). `args.raw` is JSON text that was
    // just parsed, so it is spliced in as-is instead of being encoded a second time.
    const body = `${entry.bodyPrefix}${args.raw},"call_id":${JSON.stringify(callId)},"raw_arguments":${JSON.stringify(args.raw)}}`
    const epoch = this.#health.epoch(entry.origin)
    const outcome = await this.#dispatcher.dispatch({
      url: entry.callbackUrl as string,
      origin: entry.origin,
      path: entry.path,
      body,
      callId,
      deadline: Date.now() + entry.timeoutMs,
      timeoutMs: entry.timeoutMs,
      maxResponseBytes: this.options.dispatch.maxResponseBytes
    }, options?.signal)
    this.#recordHealth(entry, outcome, epoch)
    const result = outcomeToResult(outcome, entry, this.options.dispatch.maxResponseBytes)
    return this.#finish(role, entry.name, callId, started, outcome.kind, result, entry.source, outcome.bytes)
  }

  /**
   * Closes the runtime: stops accepting calls, gives in-flight calls `dispatch.closeGraceMs` to
   * finish and answers the rest as cancelled, ends the event streams, frees the pool. Every call of
   * close() returns the first one's promise: none resolves before the runtime is closed.
   */
  close (): Promise<void> {
    this.#closing ??= this.#close()
    return this.#closing
  }

  async #close (): Promise<void> {
    this.#closed = true
    clearInterval(this.#sweeper)
    // Local handlers run on this thread and cannot be waited for safely: answer them now.
    for (const cancel of [...this.#localCalls]) cancel()
    // A sync waiting on a session (a model that never acknowledges) would hold its timer, and the
    // mutation waiting on it, for up to syncTimeoutMs after close: end it now.
    this.roles[kCloseRoles]()
    await this.#dispatcher.close()
    await Promise.allSettled([...this.#background])
    // What routes hold (event streams, MCP sessions) ends with the runtime, also in a host's app
    // that stays up: after a turn in which the answers the close gave its calls are written.
    if (this.#closeHooks.size > 0) {
      await new Promise(setImmediate)
      await Promise.allSettled([...this.#closeHooks].map(async (hook) => { await hook() }))
    }
  }

  [kRefuseCall] (roleName: string, name: string, message: string): ToolResult {
    const role = this.roles.get(roleName)
    return this.#finish(role, name, `call_${randomUUID()}`, performance.now(), 'busy', errorResult(message),
      role.registry.get(name)?.source)
  }

  [kOnClose] (hook: () => Promise<void>): () => void {
    this.#closeHooks.add(hook)
    return () => { this.#closeHooks.delete(hook) }
  }

  get closed (): boolean { return this.#closed }

  #recordHealth (entry: ToolEntry, outcome: CallOutcome, epoch: number): void {
    if (!this.#health.record(entry.origin, originVerdict(outcome), entry.isPlugin, epoch)) return
    this.#evict(entry.origin)
  }

  /** Removes every `plugin:` tool at `origin` from every role (docs/protocol.md R13); each affected role syncs once. */
  #evict (origin: string): void {
    const roles: Role[] = []
    const tools = new Set<string>()
    for (const role of this.roles.list()) {
      const gone = role.registry.deletePluginToolsAtOrigin(origin)
      if (gone.length === 0) continue
      roles.push(role)
      for (const entry of gone) {
        tools.add(entry.name)
        role.emitRemoved(entry, 'evicted')
      }
    }
    // Concurrent failures can reach the threshold after the tools are already gone: say nothing.
    if (roles.length === 0) return
    const names = [...tools]
    const roleNames = roles.map((r) => r.name)
    const failures = this.#health.threshold
    this.log.warn({ origin, tools: names, roles: roleNames, failures },
      `evicted the plugin tools at ${origin} after ${failures} consecutive connection failures`)
    this.emit('origin-evicted', { origin, tools: names, roles: roleNames, failures })
    const syncing = Promise.allSettled(roles.map((r) => r.sync()))
    this.#background.add(syncing)
    syncing.finally(() => this.#background.delete(syncing)).catch(noop)
  }

  #finish (role: Role, name: string, callId: string, started: number,
    outcome: ToolportEvents['call-finished'][0]['outcome'],
    result: ToolResult, source = '', bytes = 0): ToolResult {
    if (this.listenerCount('call-finished') > 0 || this.log.isLevelEnabled('debug')) {
      const event = {
        role: role.name,
        name,
        callId,
        outcome,
        isError: result.is_error,
        durationMs: performance.now() - started,
        source,
        bytes
      }
      // Metadata only: never arguments, outputs or callback bodies (they carry private data). A
      // name that matches no tool (its source is '') is the model's free text, so it is not
      // logged either.
      this.log.debug(source === '' ? { ...event, name: undefined } : event, 'tool call finished')
      // Off the public type: only the metrics read it.
      if (this.roles.find(role.name) !== role) (event as Record<symbol, unknown>)[kFromRemovedRole] = true
      this.emit('call-finished', event)
    }
    return result
  }

  /** Refuses (422) a registration that would take any target role past a tool cap; mutates nothing. */
  #checkCaps (targets: Role[], name: string, source: string): void {
    const { maxToolsPerRole, maxToolsPerSource } = this.options.limits
    for (const role of targets) {
      const existing = role.registry.get(name)
      if (existing === undefined && role.registry.size >= maxToolsPerRole) {
        throw limitExceeded('limits.maxToolsPerRole', `role '${role.name}' already has ${maxToolsPerRole} tools`)
      }
      if (existing?.source !== source && role.registry.countBySource(source) >= maxToolsPerSource) {
        throw limitExceeded('limits.maxToolsPerSource', `source '${source}' already has ${maxToolsPerSource} tools in role '${role.name}'`)
      }
    }
  }

  /** The caller's owner identity in ownership mode, else null (nothing is checked). */
  #ownerOf (options: MutationOptions): Owner | null {
    return this.options.security.enforceOwnership ? ownerOf(options.pluginKey) : null
  }

  #targets (role: string | null): Role[] {
    return role === null ? this.roles.list() : [this.roles.get(role)]
  }

  #assertOpen (): void {
    if (this.#closed) throw new ClosedError()
  }
}

/**
 * Whether `value` is a Toolport runtime, as the options that take one (`toolportPlugin`'s
 * `runtime`, `createRealtimeSession`'s `toolport`) check it. By shape, not `instanceof`: a host
 * may load the runtime through another copy of the package.
 */
export function isRuntime (value: unknown): value is Runtime {
  if (typeof value !== 'object' || value === null || !('options' in value)) return false
  return typeof (value as { roles?: { get?: unknown } }).roles?.get === 'function'
}

/** The names a model may call instead, at most UNKNOWN_TOOL_NAMES of them. */
function describeAvailable (names: string[]): string {
  if (names.length === 0) return 'this role has no tools'
  if (names.length <= UNKNOWN_TOOL_NAMES) return `available tools: ${names.join(', ')}`
  return `available tools: ${names.slice(0, UNKNOWN_TOOL_NAMES).join(', ')} and ${names.length - UNKNOWN_TOOL_NAMES} more`
}

/** Awaits every role's sync in parallel; returns the roles that took it and adds the others to `failed`. */
async function syncAll (roles: Role[], failed: FailedRole[]): Promise<string[]> {
  if (roles.length === 0) return []
  const outcomes: SyncOutcome[] = await Promise.all(roles.map(syncRole))
  const affected: string[] = []
  for (let i = 0; i < roles.length; i++) {
    const outcome = outcomes[i] as SyncOutcome
    const name = (roles[i] as Role).name
    if (outcome.ok) affected.push(name)
    else failed.push({ role: name, error: outcome.error })
  }
  return affected
}

/** The roles of `before` that are in `now` still, in `now`'s order. */
function stillThere (before: Role[], now: Role[]): Role[] {
  const kept = new Set(before)
  return now.filter((role) => kept.has(role))
}

function syncRole (role: Role): Promise<SyncOutcome> {
  return role.sync()
}
