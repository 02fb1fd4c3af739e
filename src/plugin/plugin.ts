// A plugin's life: serve callbacks, register, keep the registrations alive, clear them on stop.
//
// Registrations are runtime-only (docs/protocol.md R3) and a plugin's tools also vanish when Toolport evicts
// its origin (R13) or someone unregisters them (R15). Toolport's event stream (`GET /api/events`,
// see event-watch.ts) says so at once, and the plugin then checks right away. As the fallback it
// also polls: one check of `GET /api/tools?name=…` (our names only) at a time, every
// `pollIntervalMs` (jittered, so many plugins restarted together do not poll in step), backing off
// exponentially (with jitter) while Toolport is down. Whatever of ours is missing is registered
// again. The poll timer is unref'd: it never keeps a process alive on its own.
//
// State machine: idle → starting → running → stopping → stopped (start failure: starting →
// stopped). Only one check or start attempt talks to Toolport at a time, and `stop()` waits for it
// before clearing, so a registration can never land after the clear that should have removed it.
import { EventEmitter, errorMonitor } from 'node:events'
import { setTimeout as sleep } from 'node:timers/promises'
import { CallbackServer } from './callback-server.js'
import { PLUGIN_ERROR_CODES, PluginError, isTransient } from './errors.js'
import type { ResolvedPluginOptions, ResolvedTool } from './options.js'
import { problemsText, provesNotRegistered, ToolportClient, type RegisterAnswer, type RegisterBody } from './toolport-client.js'
import { callListeners, errorText, noop } from '../shared/util.js'
import { EventWatch } from './event-watch.js'

/** Why tools were registered: the first registration, or a check that found them missing. */
export type RegisteredReason = 'start' | 'restored'

/** Payload of the `registered` event. */
export interface RegisteredEvent {
  /** Names of the tools just registered. */
  names: string[]
  /** Roles that accepted them (`affected_roles`, docs/protocol.md R8). */
  roles: string[]
  reason: RegisteredReason
}

/** Event name → listener arguments, for `EventEmitter<PluginEvents>`. */
export interface PluginEvents {
  registered: [RegisteredEvent]
  /**
   * A background failure: a check or re-registration failed (it is retried with backoff), or
   * `stop()` could not clear. Emitted only while someone listens; otherwise it is logged.
   */
  error: [PluginError]
}

/** What `start()` resolves to. */
export interface StartResult {
  /** Base URL of the callback server, e.g. `http://127.0.0.1:41234`. */
  url: string
  names: string[]
  roles: string[]
}

/** What `stop()` resolves to; it never rejects. */
export interface StopResult {
  /**
   * True when Toolport confirmed the clear (docs/protocol.md R16), or answered that the plugin's
   * one role no longer exists (its tools went with it; `removed` is then 0).
   */
  isCleared: boolean
  /** How many registrations the clear removed. */
  removed: number
  /** Why the clear failed (Toolport down, …), or null. */
  error: PluginError | null
}

export interface StopOptions {
  /** How long calls in flight may finish before their connections are closed, in ms (default 5000). */
  graceMs?: number | undefined
}

type State = 'idle' | 'starting' | 'running' | 'stopping' | 'stopped'

/** A Toolport plugin, made by `createPlugin`. */
export class Plugin extends EventEmitter<PluginEvents> {
  /** The plugin's `source` tag (`plugin:<id>`). */
  readonly source: string
  /** The role it registers with; null for every role. */
  readonly role: string | null
  readonly #options: ResolvedPluginOptions
  readonly #client: ToolportClient
  readonly #server: CallbackServer
  // Aborted by stop(): ends start()'s retries, a check's pending GET and any backoff wait.
  readonly #stopController = new AbortController()
  #state: State = 'idle'
  #starting: Promise<StartResult> | null = null
  #stopping: Promise<StopResult> | null = null
  #timer: NodeJS.Timeout | null = null
  /** The check running now, if any; stop() waits for it. */
  #check: Promise<void> | null = null
  /** Consecutive failed checks: drives the backoff and the log level. */
  #failures = 0
  #hasRegistered = false
  /** The watch on Toolport's event stream while running (null when off or not started). */
  #watch: EventWatch | null = null
  /** A check was asked for while one was running: run another right after it. */
  #recheck = false
  /**
   * `role\0name\0source\0url` of tools held by someone else, warned about once each: those the
   * last check's listing showed (a takeover that ended is forgotten, and warned about again if it
   * comes back).
   */
  readonly #conflicts = new Set<string>()

  constructor (options: ResolvedPluginOptions) {
    super()
    this.#options = options
    this.source = options.source
    this.role = options.role
    this.#client = new ToolportClient({
      baseUrl: options.toolportUrl,
      token: options.token,
      pluginKey: options.pluginKey,
      requestTimeoutMs: options.requestTimeoutMs
    })
    this.#server = new CallbackServer({
      host: options.host,
      port: options.port,
      maxBodyBytes: options.maxBodyBytes,
      tools: options.tools,
      logger: options.logger
    })
  }

  /** Base URL of the callback server (`http://127.0.0.1:<port>`); `''` until `start()` listens. */
  get url (): string { return this.#server.url }

  /** The names of the plugin's tools. */
  get toolNames (): string[] { return [...this.#options.tools.keys()] }

  /** True between a successful `start()` and `stop()`. */
  get isRunning (): boolean { return this.#state === 'running' }

  /** The callback URL a tool is registered with (empty before `start()`). */
  callbackUrl (name: string): string {
    return this.#server.url === '' ? '' : this.#server.callbackUrl(name)
  }

  /**
   * Starts the callback server and registers every tool; resolves once all are registered.
   * While Toolport is unreachable or busy it retries (with backoff) for up to `startTimeoutMs`;
   * an answer that says the registration is wrong (4xx) rejects at once. On rejection the
   * plugin is stopped (anything it registered is cleared) and cannot be started again.
   */
  async start (): Promise<StartResult> {
    if (this.#state !== 'idle') {
      throw new PluginError(PLUGIN_ERROR_CODES.state, `start() needs a new plugin (this one is ${this.#state}); create another with createPlugin`)
    }
    this.#state = 'starting'
    this.#starting = this.#start()
    return await this.#starting
  }

  /**
   * Stops checking, clears the plugin's source from Toolport (docs/protocol.md R16) so no new call arrives,
   * then closes the callback server, letting calls in flight finish for `graceMs`. Never
   * rejects: a failed clear is reported in the result (and as an `error` event).
   */
  async stop (options: StopOptions = {}): Promise<StopResult> {
    this.#stopping ??= this.#stop(options.graceMs ?? 5000)
    return await this.#stopping
  }

  async #start (): Promise<StartResult> {
    let result: StartResult
    try {
      const url = await this.#server.listen()
      const { names, roles } = await this.#registerAtStart()
      // stop() may have come while the last registration was in flight; it clears after us.
      if (this.#state !== 'starting') throw stoppedDuringStart()
      result = { url, names, roles }
    } catch (err) {
      if (this.#state === 'starting') {
        // Not stop()'s doing: undo what was done, then report the failure. #stop must not wait
        // for this very promise, hence #starting is dropped first.
        this.#starting = null
        this.#stopping ??= this.#stop(0)
        await this.#stopping
      }
      throw err
    }
    this.#state = 'running'
    this.#schedule(this.#nextDelay())
    if (this.#options.watchEvents) {
      this.#watch = new EventWatch({
        baseUrl: this.#options.toolportUrl,
        token: this.#options.token,
        role: this.role,
        source: this.source,
        names: new Set(this.toolNames),
        origin: new URL(result.url).origin,
        onStale: (reason) => { this.#checkNow(reason) },
        logger: this.#options.logger,
        maxBackoffMs: this.#options.maxBackoffMs,
        requestTimeoutMs: this.#options.requestTimeoutMs
      })
      this.#watch.start()
    }
    this.#options.logger.info?.(`registered ${result.names.length} tool(s) of ${this.source} (roles: ${result.roles.join(', ') || 'none'}); callbacks at ${result.url}`)
    // Last, outside the try: a listener that throws is the listener's bug, not a failed start.
    this.emit('registered', { names: result.names, roles: result.roles, reason: 'start' })
    return result
  }

  async #registerAtStart (): Promise<{ names: string[], roles: string[] }> {
    const { startTimeoutMs } = this.#options
    const giveUpAt = Date.now() + startTimeoutMs
    const signal = this.#stopController.signal
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.#registerTools([...this.#options.tools.values()], this.role)
      } catch (err) {
        if (signal.aborted) throw stoppedDuringStart()
        if (!isTransient(err)) throw err
        const leftMs = giveUpAt - Date.now()
        if (startTimeoutMs === 0) throw err
        if (leftMs <= 0) {
          throw new PluginError(PLUGIN_ERROR_CODES.startTimeout,
            `could not register with Toolport within ${startTimeoutMs} ms: ${errorText(err)}`, { cause: err })
        }
        this.#options.logger.debug?.(`start: attempt ${attempt} failed, retrying: ${errorText(err)}`)
        try {
          await sleep(Math.min(leftMs, this.#backoffMs(attempt)), undefined, { signal })
        } catch {
          throw stoppedDuringStart()
        }
      }
    }
  }

  /**
   * Registers `tools` with `role`, one request each (Toolport syncs every role's sessions before
   * it answers, so there is nothing to gain from a burst). Stops early once stop() has begun.
   */
  async #registerTools (tools: ResolvedTool[], role: string | null): Promise<{ names: string[], roles: string[] }> {
    const names: string[] = []
    const roles = new Set<string>()
    for (const tool of tools) {
      if (this.#stopController.signal.aborted) break
      // Set before the request: Toolport may take the registration and its answer never arrive
      // (start() timed out, stop() began), and the clear that follows must not be skipped then.
      // Only a refusal, or a connection that could not be made, proves nothing was registered
      // (provesNotRegistered): an `ok: false` answer may come with the registry holding it, when
      // roles took it and their syncs failed (R8).
      const hadRegistered = this.#hasRegistered
      this.#hasRegistered = true
      let answer: RegisterAnswer
      try {
        answer = await this.#client.register(this.#registration(tool, role))
      } catch (err) {
        if (provesNotRegistered(err)) this.#hasRegistered = hadRegistered
        throw err
      }
      names.push(tool.name)
      for (const r of answer.affected_roles) roles.add(r)
      if (answer.refused.length > 0) {
        // docs/protocol.md R5/R8: those roles keep the local tool or the other source's tool.
        this.#options.logger.warn?.(`'${tool.name}' registered, but ${answer.refused.length} role(s) refused it: the name is taken${problemsText(answer.refused)}`)
      }
      if (answer.unsynced.length > 0) {
        // docs/protocol.md R8: the registry has it; the role's next successful sync carries it to the model.
        this.#options.logger.warn?.(`'${tool.name}' registered, but ${answer.unsynced.length} role(s) failed to sync it to their sessions${problemsText(answer.unsynced)}`)
      }
    }
    return { names, roles: [...roles] }
  }

  #registration (tool: ResolvedTool, role: string | null): RegisterBody {
    return {
      name: tool.name,
      description: tool.description,
      parameters: tool.parameters,
      callback_url: this.#server.callbackUrl(tool.name),
      role,
      source: this.source,
      timeout_seconds: tool.timeoutSeconds
    }
  }

  /** True while the event stream is connected (it makes re-registration immediate). */
  get isWatchingEvents (): boolean { return this.#watch?.isConnected === true }

  /** Runs a check now (the event stream said something of ours may be gone), or right after the running one. */
  #checkNow (reason: string): void {
    if (this.#state !== 'running') return
    this.#options.logger.debug?.(`checking the registrations now: ${reason}`)
    if (this.#check !== null) {
      this.#recheck = true
      return
    }
    if (this.#timer !== null) clearTimeout(this.#timer)
    this.#timer = null
    this.#check = this.#runCheck()
  }

  #schedule (delayMs: number): void {
    this.#timer = setTimeout(() => {
      this.#timer = null
      this.#check = this.#runCheck()
    }, delayMs)
    this.#timer.unref()
  }

  async #runCheck (): Promise<void> {
    try {
      await this.#checkRegistrations()
      if (this.#failures > 0) this.#options.logger.info?.(`Toolport answers again after ${this.#failures} failed check(s)`)
      this.#failures = 0
    } catch (err) {
      if (this.#state !== 'running') return
      this.#failures++
      this.#report(asPluginError(err), this.#failures === 1 ? 'warn' : 'debug')
    } finally {
      this.#check = null
      if (this.#state === 'running') {
        // A check asked for meanwhile runs now even when this one failed: the event that asked
        // came after this check began, so this one's failure need not be its answer.
        const again = this.#recheck
        this.#recheck = false
        this.#schedule(again ? 0 : this.#nextDelay())
      }
    }
  }

  /**
   * One check: list the tools, find ours that a role lacks, register them again. A name held by
   * another source or at another URL is left alone (and warned about once): re-registering would
   * start a tug of war with whoever replaced it (docs/protocol.md R5 lets anyone replace a name).
   */
  async #checkRegistrations (): Promise<void> {
    // Only our names: the answer holds our rows (or whoever took a name over), never other plugins'.
    const listed = await this.#client.list(this.role, this.toolNames, this.#stopController.signal)
    if (this.#state !== 'running') return
    const missing = new Map<ResolvedTool, string[]>()
    const conflicts = new Set<string>()
    for (const [roleName, rows] of listed) {
      const byName = new Map(rows.map((row) => [row.name, row]))
      for (const tool of this.#options.tools.values()) {
        const row = byName.get(tool.name)
        if (row === undefined) {
          const roles = missing.get(tool)
          if (roles === undefined) missing.set(tool, [roleName])
          else roles.push(roleName)
        } else {
          this.#noteConflict(roleName, tool, row.source, row.callback_url, conflicts)
        }
      }
    }
    // Only the takeovers this listing still shows are remembered: with roles made and removed per
    // conversation, one kept for every role that ever had one would grow without bound.
    for (const key of this.#conflicts) if (!conflicts.has(key)) this.#conflicts.delete(key)
    if (missing.size === 0) return

    const names: string[] = []
    const roles = new Set<string>()
    try {
      for (const [tool, missingRoles] of missing) {
        // With a fixed role, or missing everywhere (a restart): one registration as at start.
        // Otherwise only the roles that lack it, so a role where another source holds the name
        // keeps it; with `role: null` this also reaches roles created after start (beyond R4).
        const targets = this.role !== null || missingRoles.length === listed.size ? [this.role] : missingRoles
        for (const target of targets) {
          let done: { names: string[], roles: string[] }
          try {
            done = await this.#registerTools([tool], target)
          } catch (err) {
            // A role removed since the list took its tools with it: nothing to restore there, and
            // the other roles still need theirs.
            if (this.role === null && target !== null && isRoleNotFound(err)) continue
            throw err
          }
          for (const r of done.roles) roles.add(r)
          if (done.names.length > 0 && !names.includes(tool.name)) names.push(tool.name)
        }
      }
    } finally {
      if (names.length > 0) {
        this.#options.logger.info?.(`registered again (they were missing): ${names.join(', ')}`)
        this.emit('registered', { names, roles: [...roles], reason: 'restored' })
      }
    }
  }

  #noteConflict (role: string, tool: ResolvedTool, source: string | undefined, url: string | undefined,
    seen: Set<string>): void {
    if (source === this.source && url === this.#server.callbackUrl(tool.name)) return
    const key = `${role}\0${tool.name}\0${source ?? ''}\0${url ?? ''}`
    seen.add(key)
    if (this.#conflicts.has(key)) return
    this.#conflicts.add(key)
    // Another instance's callback is named by its origin: its path holds that instance's secret segment.
    const owner = source === this.source ? `another callback (${url === undefined ? 'a local tool' : originOf(url)})` : `source ${JSON.stringify(source ?? 'local')}`
    this.#options.logger.warn?.(`'${tool.name}' in role ${JSON.stringify(role)} now belongs to ${owner}; leaving it alone`)
  }

  /** The next check's delay: the interval ±20 %, or exponential backoff with equal jitter. */
  #nextDelay (): number {
    if (this.#failures === 0) return this.#options.pollIntervalMs * (0.8 + 0.4 * Math.random())
    return this.#backoffMs(this.#failures)
  }

  #backoffMs (failures: number): number {
    const { pollIntervalMs, maxBackoffMs } = this.#options
    const ceiling = Math.min(maxBackoffMs, pollIntervalMs * 2 ** Math.min(failures, 30))
    return ceiling / 2 + Math.random() * ceiling / 2
  }

  async #stop (graceMs: number): Promise<StopResult> {
    this.#state = 'stopping'
    this.#stopController.abort()
    if (this.#timer !== null) clearTimeout(this.#timer)
    this.#timer = null
    // First: our own clear must not look like a loss to re-register.
    await this.#watch?.close()
    this.#watch = null
    // Let the one exchange in flight finish, so no registration can land after the clear.
    await this.#check
    if (this.#starting !== null) await this.#starting.catch(noop)

    let result: StopResult = { isCleared: false, removed: 0, error: null }
    // Nothing of ours can be registered if no registration was ever sent (or each was refused);
    // another instance's tools under the same source are then none of our business.
    if (this.#hasRegistered) {
      try {
        const removed = await this.#client.clear(this.source, this.role)
        result = { isCleared: true, removed, error: null }
      } catch (err) {
        if (this.role !== null && isRoleNotFound(err)) {
          // The plugin's one role is gone, and every tool of ours went with it: nothing to clear.
          result = { isCleared: true, removed: 0, error: null }
        } else {
          const error = asPluginError(err)
          result = { isCleared: false, removed: 0, error }
          this.#report(error, 'warn')
        }
      }
    }
    await this.#server.close(graceMs)
    await this.#client.close()
    this.#state = 'stopped'
    return result
  }

  /** Emits `error` when someone listens (an unheard 'error' would crash the process), else logs. */
  #report (err: PluginError, level: 'warn' | 'debug'): void {
    if (this.listenerCount('error') > 0) this.emit('error', err)
    else this.#options.logger[level]?.(err.message)
  }

  /**
   * Calls the event's listeners, each guarded: a listener that throws, or returns a promise that
   * rejects, is the listener's bug. It is logged, the listeners after it still run, and it never
   * fails `start()` or `stop()`, turns a re-registration into a failure, or ends the process from
   * a background check (README "Plugin SDK"; the Python SDK does the same).
   */
  override emit<K extends keyof PluginEvents> (event: K, ...args: PluginEvents[K]): boolean {
    // `events.errorMonitor` listeners see an error before its listeners, as EventEmitter's emit has them.
    const listeners = event === 'error'
      ? [...this.rawListeners(errorMonitor as never), ...this.rawListeners(event)]
      : this.rawListeners(event)
    return callListeners(this, listeners, args, event, this.#listenerFailed)
  }

  readonly #listenerFailed = (event: string | symbol, err: unknown): void => {
    this.#options.logger.error?.(`a '${String(event)}' listener threw: ${errorText(err)}`)
  }
}

function stoppedDuringStart (): PluginError {
  return new PluginError(PLUGIN_ERROR_CODES.state, 'stop() was called before start() finished')
}

/** Toolport's 404 for a role that does not exist (any more). */
function isRoleNotFound (err: unknown): boolean {
  return err instanceof PluginError && err.toolportCode === 'TP_ERR_ROLE_NOT_FOUND'
}

function asPluginError (err: unknown): PluginError {
  if (err instanceof PluginError) return err
  return new PluginError(PLUGIN_ERROR_CODES.unreachable, `unexpected failure: ${errorText(err)}`, { cause: err })
}

/** `scheme://host:port` of a callback URL, never its path (which carries a plugin's secret segment). */
function originOf (url: string): string {
  try {
    return new URL(url).origin
  } catch {
    return 'an unreadable URL'
  }
}
