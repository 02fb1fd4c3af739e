// The OpenAI-Realtime session adapter: a ModelSession for a host that owns a
// realtime WebSocket (OpenAI, Azure, GLM: the flat tool dialect; Qwen-Omni, StepFun: nested).
//
// The host hands every server event to `handleServerEvent` and gives the adapter a `send`; the
// adapter keeps the model's tool list in step with the role (session.update → session.updated)
// and answers the model's function calls with Toolport's dispatch.
//
// Invariants:
// - Each call_id runs at most once, whichever events announce it and however often
//   (`response.function_call_arguments.done`, `response.output_item.done`, `response.done`).
// - Outputs of a response are sent once that response is known to have completed; then exactly
//   one `response.create` follows, after its last output (when `autoRespond`). A response that
//   ends cancelled or failed (`response.done` status, `response.cancelled`, barge-in) aborts its
//   running calls and drops every result not sent yet; it gets no `response.create`.
// - At most `rateLimit.maxCalls` calls run per `rateLimit.windowMs`; a call beyond it is not run
//   and the model reads why. After such a refusal the adapter asks once for a spoken answer
//   without tools, and after a second refused round in a row it stops answering calls itself.
import { randomUUID } from 'node:crypto'
import { isDeepStrictEqual } from 'node:util'
import { isRuntime, type Runtime } from '../runtime.js'
import type { ModelSession } from '../roles/sync.js'
import type { Role } from '../roles/role.js'
import { describeValue, errorText, isPlainObject, MAX_TIMER_MS, noop } from '../../shared/util.js'
import { ConfigError } from '../errors.js'
import type { ToolDefinition } from '../roles/tool-registry.js'
import { errorResult, type ToolResult } from '../dispatch/result.js'
import { toolDefinitions } from './definitions.js'
import { textOnlyOutput } from './result-blocks.js'

/** A client event the adapter sends (`session.update`, `conversation.item.create`, `response.create`). */
export interface RealtimeClientEvent {
  type: string
  event_id?: string
  [field: string]: unknown
}

/** `flat`: `{type:'function', name, description, parameters}`; `nested`: `{type:'function', function:{…}}`. */
export type RealtimeDialect = 'flat' | 'nested'

export interface RealtimeRateLimit {
  /** Calls allowed per window (default 30). */
  maxCalls: number
  /** The sliding window (default 60 000 ms). */
  windowMs: number
}

export interface RealtimeSessionOptions {
  /** The Toolport runtime (`createToolport()`'s result). */
  toolport: Runtime
  /** The role whose tools the model gets; must exist (TP_ERR_ROLE_NOT_FOUND otherwise). */
  role: string
  /** Sends one client event on the host's socket, e.g. `(e) => ws.send(JSON.stringify(e))`. */
  send: (event: RealtimeClientEvent) => void | Promise<void>
  /** The tool shape the provider expects (default `flat`). */
  dialect?: RealtimeDialect | undefined
  /** A `session.update` not acknowledged within this long fails the sync (default 5000 ms). */
  ackTimeoutMs?: number | undefined
  /** Send `response.create` once a response's function outputs are all sent (default true). */
  autoRespond?: boolean | undefined
  /** Per-session tool-call limit (default 30 calls per 60 s); `false` turns it off. */
  rateLimit?: RealtimeRateLimit | false | undefined
  /**
   * Fields merged into every `session.update`'s `session`, e.g. `{ type: 'realtime' }`, which
   * the OpenAI GA API requires (the beta API, Azure preview and GLM refuse it).
   */
  sessionFields?: Record<string, unknown> | undefined
  /** The ModelSession id (default `realtime-<uuid>`). */
  id?: string | undefined
  /** Attach to the role at once, which sends the first `session.update` (default true). */
  attach?: boolean | undefined
}

/** A ModelSession for one realtime connection, plus the entry point for its server events. */
export interface RealtimeSession extends ModelSession {
  readonly role: string
  /** Calls running now. */
  readonly runningCalls: number
  /** Feed every server event here (an object, or the JSON text of one). Never throws. */
  handleServerEvent (event: unknown): void
  /** Attaches to the role (only needed with `attach: false`); returns the detach function. */
  attach (): () => void
  /** Detaches from the role, aborts running calls, fails a pending update; later events are ignored. */
  close (): void
}

const DEFAULT_RATE_LIMIT: RealtimeRateLimit = Object.freeze({ maxCalls: 30, windowMs: 60_000 })
/** The most calls a rate-limit window may allow: the window keeps one start time per call. */
const MAX_RATE_LIMIT_CALLS = 1_000_000

/**
 * The adapter's options with their defaults, or a `TP_ERR_CONFIG` naming the first bad one: a
 * typo in `dialect` would send every tool in the wrong shape, and a timer past setTimeout's
 * largest delay (`Infinity`, 2^31) fires at once, failing every sync.
 */
function checkRealtimeOptions (options: RealtimeSessionOptions): {
  dialect: RealtimeDialect, ackTimeoutMs: number, autoRespond: boolean, rateLimit: RealtimeRateLimit | null
} {
  const bad = (what: string, value: unknown): never => {
    throw new ConfigError(`createRealtimeSession(): ${what} (got ${describeValue(value)})`)
  }
  if (typeof options !== 'object' || options === null) bad('the argument must be an object of options', options)
  if (!isRuntime(options.toolport)) bad('toolport must be a Toolport runtime (createToolport()\'s result)', options.toolport)
  if (typeof options.role !== 'string') bad('role must be a role name', options.role)
  if (options.attach !== undefined && typeof options.attach !== 'boolean') bad('attach must be a boolean', options.attach)
  if (typeof options.send !== 'function') bad('send must be a function', options.send)
  if (options.id !== undefined && (typeof options.id !== 'string' || options.id === '')) bad('id must be a non-empty string', options.id)
  // A missing key takes its default; null is a value, refused like any other wrong one.
  const dialect = options.dialect === undefined ? 'flat' : options.dialect
  if (dialect !== 'flat' && dialect !== 'nested') bad("dialect must be 'flat' or 'nested'", dialect)
  const ack = options.ackTimeoutMs === undefined ? 5_000 : options.ackTimeoutMs
  // Infinity reads as "wait as long as a timer can".
  if (typeof ack !== 'number' || Number.isNaN(ack) || ack < 1) bad('ackTimeoutMs must be a number of milliseconds ≥ 1', ack)
  const autoRespond = options.autoRespond === undefined ? true : options.autoRespond
  if (typeof autoRespond !== 'boolean') bad('autoRespond must be a boolean', autoRespond)
  if (options.sessionFields !== undefined && !isPlainObject(options.sessionFields)) {
    bad('sessionFields must be an object', options.sessionFields)
  }
  let rateLimit: RealtimeRateLimit | null = null
  if (options.rateLimit !== false) {
    const given: unknown = options.rateLimit === undefined ? DEFAULT_RATE_LIMIT : options.rateLimit
    if (!isPlainObject(given)) bad('rateLimit must be false or { maxCalls, windowMs }', given)
    const { maxCalls = DEFAULT_RATE_LIMIT.maxCalls, windowMs = DEFAULT_RATE_LIMIT.windowMs } =
      given as Partial<RealtimeRateLimit>
    if (!Number.isInteger(maxCalls) || maxCalls < 1 || maxCalls > MAX_RATE_LIMIT_CALLS) {
      bad(`rateLimit.maxCalls must be an integer from 1 to ${MAX_RATE_LIMIT_CALLS}`, maxCalls)
    }
    if (typeof windowMs !== 'number' || !(windowMs >= 1 && windowMs <= MAX_TIMER_MS)) {
      bad(`rateLimit.windowMs must be a number of milliseconds from 1 to ${MAX_TIMER_MS}`, windowMs)
    }
    rateLimit = Object.freeze({ maxCalls, windowMs })
  }
  return { dialect, ackTimeoutMs: Math.min(ack, MAX_TIMER_MS), autoRespond, rateLimit }
}

/** How many call ids and finished responses are remembered for deduplication. */
const MEMORY = 1024

/**
 * Creates the adapter for one realtime session of `role` and (unless `attach: false`) attaches it.
 * Create it once the socket is open: attaching sends the role's tools at once.
 *
 * @example
 * const session = createRealtimeSession({ toolport: tp, role: 'Lanlan', send: (e) => ws.send(JSON.stringify(e)) })
 * ws.on('message', (data) => session.handleServerEvent(data.toString()))
 * ws.on('close', () => session.close())
 */
export function createRealtimeSession (options: RealtimeSessionOptions): RealtimeSession {
  const session = new RealtimeAdapter(options)
  if (options.attach !== false) session.attach()
  return session
}

interface PendingUpdate {
  eventId: string
  names: string[]
  /** The tools sent (frozen: the role's definitions in the session's dialect). */
  tools: readonly unknown[]
  resolve: () => void
  reject: (err: Error) => void
}

/** Updates given up on (timed out, aborted) whose late acknowledgement is still remembered. */
const ABANDONED_UPDATES = 8

interface ResponseState {
  id: string
  isDone: boolean
  isCancelled: boolean
  /** Calls started and not finished. */
  running: number
  /** Outputs sent for this response. */
  sent: number
  /** Calls refused by the rate limit. */
  refused: number
  /** Calls run (not refused). */
  ran: number
  /** Outputs ready before the response completed, sent when it does. */
  held: RealtimeClientEvent[]
  hasResponded: boolean
}

interface RunningCall {
  callId: string
  controller: AbortController
  response: ResponseState
}

class RealtimeAdapter implements RealtimeSession {
  readonly id: string
  readonly role: string
  /** The role as it was when the adapter was made: a role removed and added again is another. */
  readonly #role: Role
  readonly #runtime: Runtime
  readonly #send: (event: RealtimeClientEvent) => void | Promise<void>
  readonly #dialect: RealtimeDialect
  readonly #ackTimeoutMs: number
  readonly #autoRespond: boolean
  readonly #rateLimit: RealtimeRateLimit | null
  readonly #sessionFields: Record<string, unknown>
  readonly #updates: PendingUpdate[] = []
  /** The tools of the update acknowledged last: what the provider has in place. */
  #inPlace: readonly unknown[] | null = null
  /** The newest ABANDONED_UPDATES updates given up on without an answer, oldest first. */
  readonly #abandoned: Array<{ eventId: string, names: string[], tools: readonly unknown[] }> = []
  readonly #calls = new Map<string, RunningCall>()
  readonly #seenCalls = new Set<string>()
  readonly #responses = new Map<string, ResponseState>()
  /** Finished responses: id → whether it was cancelled (bounded). */
  readonly #finished = new Map<string, boolean>()
  /** item_id → function name, for providers whose `arguments.done` omits `name`. */
  readonly #itemNames = new Map<string, string>()
  /** Start times of recent calls (ms), oldest first, for the rate limit. */
  readonly #callTimes: number[] = []
  /** A limit notice was answered since the last call that ran. */
  #hasNoticedLimit = false
  #detach: (() => void) | null = null
  #isClosed = false

  constructor (options: RealtimeSessionOptions) {
    // Every option first: a bad one (an `attach: 'false'` from a config file) attaches nothing.
    const checked = checkRealtimeOptions(options)
    // Throws TP_ERR_ROLE_NOT_FOUND for an unknown role, before anything is sent.
    this.#role = options.toolport.roles.get(options.role)
    this.role = this.#role.name
    this.id = options.id ?? `realtime-${randomUUID()}`
    this.#runtime = options.toolport
    this.#send = options.send
    this.#dialect = checked.dialect
    this.#ackTimeoutMs = checked.ackTimeoutMs
    this.#autoRespond = checked.autoRespond
    this.#rateLimit = checked.rateLimit
    this.#sessionFields = options.sessionFields ?? {}
  }

  get runningCalls (): number { return this.#calls.size }

  attach (): () => void {
    // A closed adapter never joins its role again: every later sync of the role would fail.
    if (this.#isClosed) return noop
    // Its own role, not the current one of that name: once the role was removed this throws
    // TP_ERR_ROLE_NOT_FOUND rather than joining a role of the same name added again.
    if (this.#detach === null) this.#detach = this.#role.attachSession(this)
    return () => this.#detachNow()
  }

  /**
   * ModelSession: sends `session.update` with the role's tools; resolves on the matching
   * `session.updated`, rejects on an `error` for this update, on `signal`, or after ackTimeoutMs.
   */
  syncTools (tools: readonly ToolDefinition[], signal: AbortSignal): Promise<void> {
    if (this.#isClosed) return Promise.reject(new Error('the realtime session is closed'))
    const eventId = `tp_${randomUUID()}`
    const payload = this.#dialect === 'nested'
      ? toolDefinitions(tools, 'openai-chat')
      : toolDefinitions(tools,
        'openai-realtime')
    if (signal.aborted) return Promise.reject(abortError(signal))
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => settle(new Error(`no session.updated within ${this.#ackTimeoutMs} ms`)),
        this.#ackTimeoutMs)
      const onAbort = (): void => settle(abortError(signal))
      const update: PendingUpdate = {
        eventId,
        names: tools.map((t) => t.name),
        tools: payload,
        resolve: () => settle(null),
        reject: (err) => settle(err, true)
      }
      // `answered`: no late answer can come (the provider answered it with an `error`, it was
      // never sent, or the session closed).
      const settle = (err: Error | null, answered = false): void => {
        clearTimeout(timer)
        signal.removeEventListener('abort', onAbort)
        const at = this.#updates.indexOf(update)
        if (at !== -1) this.#updates.splice(at, 1)
        if (err !== null && !answered) {
          // Given up on, yet its session.updated may still come, late: it must not be taken for
          // the acknowledgement of a later update of the same tool names.
          this.#abandoned.push({ eventId, names: update.names, tools: payload })
          if (this.#abandoned.length > ABANDONED_UPDATES) this.#abandoned.shift()
        }
        if (err === null) {
          this.#inPlace = payload
          resolve()
        } else {
          reject(err)
        }
      }
      signal.addEventListener('abort', onAbort, { once: true })
      this.#updates.push(update)
      const event: RealtimeClientEvent = {
        type: 'session.update',
        event_id: eventId,
        session: { ...this.#sessionFields, tools: payload }
      }
      // Never sent: no answer will come for it, late or not.
      this.#sendEvent(event).catch((err: unknown) =>
        settle(new Error(`session.update could not be sent: ${errorText(err)}`), true))
    })
  }

  handleServerEvent (input: unknown): void {
    if (this.#isClosed) return
    // Its role was removed: the session is dropped, never run against a role added again since.
    if (this.#runtime.roles.find(this.role) !== this.#role) {
      this.close()
      return
    }
    const event = parseEvent(input)
    if (event === null) return
    switch (event.type) {
      case 'session.updated':
        this.#onSessionUpdated(event)
        break
      case 'error':
        this.#onError(event)
        break
      case 'response.output_item.added':
      case 'conversation.item.created':
      case 'conversation.item.added':
        this.#rememberItem(event.item)
        break
      case 'response.function_call_arguments.done': {
        const name = str(event.name) ?? this.#itemNames.get(str(event.item_id) ?? '')
        this.#onFunctionCall(str(event.call_id), name, str(event.arguments), str(event.response_id))
        break
      }
      case 'response.output_item.done':
        this.#onItem(event.item, str(event.response_id))
        break
      case 'response.done':
        this.#onResponseDone(event.response)
        break
      case 'response.cancelled': {
        // Providers that announce cancellation with their own event (not OpenAI's response.done).
        const id = str(event.response_id) ?? str(obj(event.response)?.id)
        if (id !== undefined) this.#endResponse(id, true)
        break
      }
    }
  }

  close (): void {
    if (this.#isClosed) return
    this.#isClosed = true
    this.#detachNow()
    // Also when another hand attached it (Role.replaceSessions, with attach: false): a closed
    // adapter left in its role would fail every later sync of the role.
    this.#runtime.roles.find(this.role)?.detachSession(this)
    for (const update of [...this.#updates]) update.reject(new Error('the realtime session is closed'))
    for (const call of this.#calls.values()) call.controller.abort()
    this.#calls.clear()
    this.#responses.clear()
  }

  #detachNow (): void {
    this.#detach?.()
    this.#detach = null
  }

  #onSessionUpdated (event: Record<string, unknown>): void {
    if (this.#updates.length === 0 && this.#abandoned.length === 0) return
    const tools = obj(event.session)?.tools
    if (!Array.isArray(tools)) {
      // No tool list to match on: updates are acknowledged in the order they were sent.
      this.#updates[0]?.resolve()
      return
    }
    // Only updates of the same tool names can be what it answers. The one whose very tools it
    // echoes decides; else (a provider that reshapes what it echoes, or an answer to someone
    // else's update) answers come in the order updates were sent: one given up on first (at most
    // one update of a session waits at a time, and those given up on were sent before it); else
    // the update waiting, unless what it echoes is the tools already in place while that update
    // changes them (a host's own session.update, acknowledged with the whole session).
    const names = tools.map(toolName).sort()
    const waiting = this.#updates.find((u) => sameNames(u.names, names))
    const late = this.#abandoned.filter((u) => sameNames(u.names, names))
    if (waiting !== undefined && sameTools(tools, waiting.tools)) {
      waiting.resolve()
      return
    }
    const answered = late.find((u) => sameTools(tools, u.tools)) ?? late[0]
    if (answered !== undefined) {
      this.#abandoned.splice(this.#abandoned.indexOf(answered), 1)
      return
    }
    if (waiting === undefined) return
    const inPlace = this.#inPlace
    if (inPlace !== null && sameTools(tools, inPlace) && !sameTools(waiting.tools, inPlace)) return
    waiting.resolve()
  }

  #onError (event: Record<string, unknown>): void {
    const error = obj(event.error)
    const eventId = str(error?.event_id)
    if (eventId === undefined) return
    const update = this.#updates.find((u) => u.eventId === eventId)
    if (update === undefined) {
      // The provider's answer to an update given up on: it will not acknowledge that one now.
      const late = this.#abandoned.findIndex((u) => u.eventId === eventId)
      if (late !== -1) this.#abandoned.splice(late, 1)
      return
    }
    const code = str(error?.code)
    const message = str(error?.message) ?? 'unknown error'
    update.reject(new Error(`session.update rejected${code === undefined ? '' : ` (${code})`}: ${message}`))
  }

  #rememberItem (value: unknown): void {
    const item = obj(value)
    if (item === undefined || item.type !== 'function_call') return
    const itemId = str(item.id)
    const name = str(item.name)
    if (itemId !== undefined && name !== undefined) {
      this.#itemNames.set(itemId, name)
      trim(this.#itemNames)
    }
  }

  #onItem (value: unknown, responseId: string | undefined): void {
    const item = obj(value)
    if (item === undefined || item.type !== 'function_call') return
    // An interrupted call's arguments may be cut short: never run an incomplete item.
    if (item.status === 'incomplete') return
    this.#onFunctionCall(str(item.call_id), str(item.name), str(item.arguments), responseId ?? str(item.response_id))
  }

  #onResponseDone (value: unknown): void {
    const response = obj(value)
    const id = str(response?.id)
    if (response === undefined || id === undefined) return
    const status = str(response.status)
    const isCancelled = status === 'cancelled' || status === 'failed'
    if (!isCancelled && Array.isArray(response.output)) {
      // A provider may announce calls only here; dedupe makes the earlier events' calls no-ops.
      for (const item of response.output) this.#onItem(item, id)
    }
    this.#endResponse(id, isCancelled)
  }

  #onFunctionCall (callId: string | undefined, name: string | undefined, args: string | undefined,
    responseId: string | undefined): void {
    if (callId === undefined || this.#seenCalls.has(callId)) return
    this.#seenCalls.add(callId)
    trim(this.#seenCalls)
    // A call outside any known response completes on its own.
    const response = responseId === undefined ? this.#looseResponse(callId) : this.#response(responseId)
    if (response.isCancelled) {
      // A late event of a response that ended cancelled: nothing to keep.
      this.#forget(response)
      return
    }
    if (!this.#admit()) {
      response.refused++
      const limit = this.#rateLimit as RealtimeRateLimit
      this.#deliver(response, callId,
        errorResult(`tool call limit reached: ${limit.maxCalls} calls in ${limit.windowMs / 1000} s. ` +
        'Do not call tools again now; answer the user without them.'))
      return
    }
    response.ran++
    this.#hasNoticedLimit = false
    const controller = new AbortController()
    const call: RunningCall = { callId, controller, response }
    this.#calls.set(callId, call)
    response.running++
    this.#runtime.callTool(this.role, { name: name ?? '', call_id: callId, raw_arguments: args ?? '{}' },
      { signal: controller.signal })
      .catch((err: unknown) => errorResult(errorText(err)))
      .then((result) => this.#onCallFinished(call, result), noop)
  }

  #onCallFinished (call: RunningCall, result: ToolResult): void {
    this.#calls.delete(call.callId)
    const response = call.response
    response.running--
    // A cancelled response's late result is dropped (and the response forgotten once its last
    // call is back), as is anything after close.
    if (this.#isClosed) return
    if (response.isCancelled) {
      this.#forget(response)
      return
    }
    this.#deliver(response, call.callId, result)
  }

  /** Sends (or, until the response completes, holds) one function_call_output. */
  #deliver (response: ResponseState, callId: string, result: ToolResult): void {
    const event: RealtimeClientEvent = {
      type: 'conversation.item.create',
      event_id: `tp_${randomUUID()}`,
      item: { type: 'function_call_output', call_id: callId, output: textOnlyOutput(result) }
    }
    if (!response.isDone) {
      response.held.push(event)
      return
    }
    this.#sendOutput(response, event)
    this.#maybeRespond(response)
  }

  #sendOutput (response: ResponseState, event: RealtimeClientEvent): void {
    // The host may close the adapter from inside its `send` (its socket found closed).
    if (this.#isClosed) return
    response.sent++
    this.#sendEvent(event).catch((err: unknown) => this.#logSendFailure(err))
  }

  /** One `response.create` per finished response, after its last output. */
  #maybeRespond (response: ResponseState): void {
    if (this.#isClosed || !response.isDone || response.running > 0) return
    this.#forget(response)
    if (!this.#autoRespond || response.isCancelled || response.hasResponded || response.sent === 0) return
    response.hasResponded = true
    const event: RealtimeClientEvent = { type: 'response.create', event_id: `tp_${randomUUID()}` }
    if (response.refused > 0 && response.ran === 0) {
      // Only refused calls: let the model explain once, without tools; then stop driving it.
      if (this.#hasNoticedLimit) return
      this.#hasNoticedLimit = true
      if (this.#dialect === 'flat') event.response = { tool_choice: 'none' }
    }
    this.#sendEvent(event).catch((err: unknown) => this.#logSendFailure(err))
  }

  #endResponse (id: string, isCancelled: boolean): void {
    const response = this.#responses.get(id)
    if (response === undefined) {
      this.#finished.set(id, isCancelled)
      trim(this.#finished)
      return
    }
    if (response.isDone) return
    response.isDone = true
    if (isCancelled) {
      response.isCancelled = true
      response.held.length = 0
      for (const call of this.#calls.values()) {
        if (call.response === response) call.controller.abort()
      }
    } else {
      for (const event of response.held.splice(0)) this.#sendOutput(response, event)
    }
    this.#maybeRespond(response)
  }

  #response (id: string): ResponseState {
    let response = this.#responses.get(id)
    if (response === undefined) {
      response = newResponse(id)
      const finished = this.#finished.get(id)
      if (finished !== undefined) {
        // An event about a response that already ended (a duplicate, or out of order).
        response.isDone = true
        response.isCancelled = finished
      }
      this.#responses.set(id, response)
    }
    return response
  }

  #looseResponse (callId: string): ResponseState {
    const response = newResponse(`call:${callId}`)
    response.isDone = true
    this.#responses.set(response.id, response)
    return response
  }

  #forget (response: ResponseState): void {
    if (response.running > 0) return
    this.#responses.delete(response.id)
    this.#finished.set(response.id, response.isCancelled)
    trim(this.#finished)
  }

  /** Counts a call against the sliding window; false when the window is full. */
  #admit (): boolean {
    const limit = this.#rateLimit
    if (limit === null) return true
    const now = Date.now()
    while (this.#callTimes.length > 0 && (this.#callTimes[0] as number) <= now - limit.windowMs) this.#callTimes.shift()
    if (this.#callTimes.length >= limit.maxCalls) return false
    this.#callTimes.push(now)
    return true
  }

  async #sendEvent (event: RealtimeClientEvent): Promise<void> {
    await this.#send(event)
  }

  #logSendFailure (err: unknown): void {
    this.#runtime.log.warn({ role: this.role, session: this.id, message: errorText(err) },
      'realtime event could not be sent')
  }
}

function abortError (signal: AbortSignal): Error {
  return signal.reason instanceof Error ? signal.reason : new Error('sync aborted')
}

function newResponse (id: string): ResponseState {
  return {
    id,
    isDone: false,
    isCancelled: false,
    running: 0,
    sent: 0,
    refused: 0,
    ran: 0,
    held: [],
    hasResponded: false
  }
}

function parseEvent (input: unknown): Record<string, unknown> | null {
  let value = input
  if (typeof input === 'string' || input instanceof Uint8Array) {
    try {
      value = JSON.parse(typeof input === 'string' ? input : Buffer.from(input).toString('utf8'))
    } catch {
      return null
    }
  }
  const event = obj(value)
  return event !== undefined && typeof event.type === 'string' ? event : null
}

function obj (value: unknown): Record<string, unknown> | undefined {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
    ? value as Record<string,
    unknown>
    : undefined
}

function str (value: unknown): string | undefined {
  return typeof value === 'string' && value !== '' ? value : undefined
}

/** A tool's name in either dialect. */
function toolName (tool: unknown): string {
  const t = obj(tool)
  return str(t?.name) ?? str(obj(t?.function)?.name) ?? ''
}

/**
 * Whether `echoed` (a provider's `session.updated` tools) are the tools `sent`, whatever the order
 * of the tools and of their keys: compared value by value, stopping at the first difference.
 */
function sameTools (echoed: readonly unknown[], sent: readonly unknown[]): boolean {
  if (echoed.length !== sent.length) return false
  const byName = sentByName(sent)
  return echoed.every((tool) => {
    const ours = byName.get(toolName(tool))
    // Node's structural equality: it descends only as deep as both go, and ours (a registered
    // schema) is bounded, however deep a provider's echo nests.
    return ours !== undefined && isDeepStrictEqual(tool, ours)
  })
}

/** Sent tools by name, once per list (every session of a role is sent the same frozen list). */
const sentNames = new WeakMap<readonly unknown[], Map<string, unknown>>()

function sentByName (sent: readonly unknown[]): Map<string, unknown> {
  let byName = sentNames.get(sent)
  if (byName === undefined) {
    byName = new Map(sent.map((tool) => [toolName(tool), tool]))
    sentNames.set(sent, byName)
  }
  return byName
}

function sameNames (ours: readonly string[], sortedTheirs: readonly string[]): boolean {
  if (ours.length !== sortedTheirs.length) return false
  const sorted = [...ours].sort()
  return sorted.every((name, i) => name === sortedTheirs[i])
}

/** Keeps a Set or Map to its newest MEMORY entries (both iterate in insertion order). */
function trim (collection: Set<string> | Map<string, unknown>): void {
  if (collection.size <= MEMORY) return
  const oldest = collection.keys().next().value
  if (oldest !== undefined) collection.delete(oldest)
}
