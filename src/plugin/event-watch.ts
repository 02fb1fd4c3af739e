// The plugin's watch on Toolport's live event stream (`GET /api/events`, Server-Sent Events).
//
// Polling finds a missing registration within one poll interval; the stream says so at once: a
// `hello` with a new `instance_id` means Toolport restarted (registrations are runtime-only), and
// an `unregistered`, `cleared` or `evicted` event naming the plugin's callback origin, source or
// one of its tool names, or a `role-added` of a role it registers in, means some of its tools may
// be missing. Either way the plugin runs its usual check right away; it
// also checks on the first `hello`, for what happened before the watch connected. The stream is
// only a hint: polling goes on as the fallback, and a Toolport without the stream (404) is
// simply polled.
//
// One dedicated undici `Client` (one long-lived connection), apart from the API pool, so a
// stream never takes a connection a registration or a clear needs.
import { setTimeout as sleep } from 'node:timers/promises'
import { Client } from 'undici'
import { createParser, type EventSourceMessage, type ParseError } from 'eventsource-parser'
import type { PluginLogger } from './options.js'
import { errorText, isPlainObject } from '../shared/util.js'

export interface EventWatchOptions {
  /** The API base, ending in `/`. */
  baseUrl: URL
  token: string | null
  /** The plugin's role, or null for every role. */
  role: string | null
  source: string
  /** The names of the plugin's tools. */
  names: ReadonlySet<string>
  /** The plugin's callback origin (`http://127.0.0.1:port`). */
  origin: string
  /** Called when some of the plugin's registrations may be missing. */
  onStale: (reason: string) => void
  logger: PluginLogger
  maxBackoffMs: number
  requestTimeoutMs: number
}

/** Events that can mean a registration of ours is gone. */
const TYPES = 'hello,unregistered,cleared,evicted,role-added'
/**
 * No byte for this long (Toolport sends a heartbeat every 15 s by default) means the connection is
 * dead without having said so: reconnect, replaying what was missed.
 */
const SILENCE_MS = 45_000
/** A Toolport that answers 404 has no event stream: poll only, and ask again this much later. */
const UNSUPPORTED_RETRY_MS = 5 * 60_000
/** After a stream that was up ends or breaks: come back this soon, replaying what was missed. */
const RECONNECT_MS = 250
/**
 * The most one event (its unfinished line plus its data lines so far) may buffer, in characters.
 * Toolport's events are small; a stream past this is torn down and reconnected with backoff.
 */
const MAX_EVENT_CHARS = 1024 * 1024

/** One event went past MAX_EVENT_CHARS: the stream is torn down and reconnected with backoff. */
class EventTooLarge extends Error {
  constructor (cause: ParseError) {
    super(`one event is larger than ${MAX_EVENT_CHARS} characters`, { cause })
    this.name = 'EventTooLarge'
  }
}

export class EventWatch {
  readonly #options: EventWatchOptions
  readonly #client: Client
  readonly #controller = new AbortController()
  readonly #path: string
  readonly #headers: Record<string, string>
  #loop: Promise<void> | null = null
  #instanceId: string | null = null
  #lastEventId: string | null = null
  #connected = false

  constructor (options: EventWatchOptions) {
    this.#options = options
    this.#client = new Client(options.baseUrl.origin, {
      connectTimeout: Math.min(options.requestTimeoutMs, 10_000),
      bodyTimeout: SILENCE_MS,
      headersTimeout: options.requestTimeoutMs
    })
    const url = new URL('api/events', options.baseUrl)
    url.searchParams.set('types', TYPES)
    if (options.role !== null) url.searchParams.set('role', options.role)
    this.#path = url.pathname + url.search
    this.#headers = { accept: 'text/event-stream', 'user-agent': 'toolport-plugin' }
    if (options.token !== null) this.#headers.authorization = `Bearer ${options.token}`
  }

  /** True while a stream is open and its `hello` has arrived. */
  get isConnected (): boolean { return this.#connected }

  /** The `instance_id` of the Toolport last seen on the stream, or null. */
  get instanceId (): string | null { return this.#instanceId }

  start (): void {
    this.#loop ??= this.#run()
  }

  /** Ends the stream; resolves once nothing of it runs any more. */
  async close (): Promise<void> {
    this.#controller.abort()
    await this.#loop
    await this.#client.destroy()
  }

  async #run (): Promise<void> {
    const signal = this.#controller.signal
    let failures = 0
    while (!signal.aborted) {
      let waitMs: number
      let outcome: 'ended' | 'unsupported' | Error
      try {
        outcome = await this.#streamOnce(signal)
      } catch (err) {
        if (signal.aborted) break
        outcome = err instanceof Error ? err : new Error(errorText(err))
      }
      if (outcome === 'unsupported') {
        // No event stream here: poll only, and ask again much later.
        failures = 0
        waitMs = UNSUPPORTED_RETRY_MS
      } else if (this.#connected && !(outcome instanceof EventTooLarge)) {
        // README "Plugin SDK" → Keeping registrations alive: a stream that was up (its `hello`
        // came) and ended or broke, as it does when Toolport closes, is retried after 250 ms with
        // the backoff started over, so the backoff does not grow with every Toolport restart.
        failures = 0
        waitMs = RECONNECT_MS
        if (outcome !== 'ended') this.#options.logger.debug?.(`event stream lost, reconnecting: ${errorText(outcome)}`)
      } else {
        // A stream that never came up (a failure, or an end before any `hello`), or one that sent
        // an event past the cap: reconnections back off exponentially with jitter, up to
        // maxBackoffMs.
        failures++
        const why = outcome === 'ended' ? 'the stream ended before its hello' : errorText(outcome)
        if (failures === 1) this.#options.logger.debug?.(`event stream lost, polling meanwhile: ${why}`)
        const ceiling = Math.min(this.#options.maxBackoffMs, 500 * 2 ** Math.min(failures, 20))
        waitMs = ceiling / 2 + Math.random() * ceiling / 2
      }
      this.#connected = false
      try {
        await sleep(waitMs, undefined, { signal })
      } catch {
        break
      }
    }
    this.#connected = false
  }

  async #streamOnce (signal: AbortSignal): Promise<'ended' | 'unsupported'> {
    const headers = this.#lastEventId === null
      ? this.#headers
      : {
          ...this.#headers,
          'last-event-id': this.#lastEventId
        }
    const res = await this.#client.request({ method: 'GET', path: this.#path, headers, signal })
    if (res.statusCode === 404) {
      await res.body.dump()
      this.#options.logger.debug?.('Toolport has no event stream (GET /api/events is 404); polling only')
      return 'unsupported'
    }
    if (res.statusCode !== 200) {
      await res.body.dump()
      throw new Error(`GET /api/events answered HTTP ${res.statusCode}`)
    }
    const contentType = res.headers['content-type']
    const type = (Array.isArray(contentType) ? contentType[0] : contentType) ?? ''
    if (!/^text\/event-stream\s*(;|$)/i.test(type)) {
      // A 200 that is not an event stream (an HTML page, a proxy) is no stream either.
      await res.body.dump()
      this.#options.logger.debug?.(`GET /api/events is not an event stream (${type === '' ? 'no content type' : type}); polling only`)
      return 'unsupported'
    }
    const parse = { overflow: null as ParseError | null }
    const parser = createParser({
      onEvent: (message) => { this.#onEvent(message) },
      onError: (err) => { if (err.type === 'max-buffer-size-exceeded') parse.overflow = err },
      // One event is never buffered without bound (README "Plugin SDK" → Keeping registrations alive).
      maxBufferSize: MAX_EVENT_CHARS
    })
    // A UTF-8 character may straddle two chunks: decode as a stream.
    const decoder = new TextDecoder()
    for await (const chunk of res.body) {
      parser.feed(decoder.decode(chunk as Buffer, { stream: true }))
      // Leaving the loop destroys the body: the stream is torn down and reconnected with backoff.
      if (parse.overflow !== null) throw new EventTooLarge(parse.overflow)
    }
    return 'ended'
  }

  #onEvent (message: EventSourceMessage): void {
    if (message.id !== undefined && message.id !== '') this.#lastEventId = message.id
    let parsed: unknown
    try {
      parsed = JSON.parse(message.data)
    } catch {
      return
    }
    // Toolport's events carry a JSON object; anything else (null, a number, a list) is ignored.
    if (!isPlainObject(parsed)) return
    const data = parsed
    switch (message.event) {
      case 'hello': {
        const previous = this.#instanceId
        this.#instanceId = typeof data.instance_id === 'string' ? data.instance_id : null
        this.#connected = true
        // The first `hello` checks too: the watch starts after start()'s registrations, and
        // whatever removed them before it connected (an unregister, an eviction, a restart) was
        // published to no one. After that, a reconnection checks only when it missed something.
        if (previous === null) this.#options.onStale('the event stream connected')
        else if (previous !== this.#instanceId) this.#options.onStale('Toolport restarted')
        else if (data.replay !== 'complete') this.#options.onStale('events were missed while disconnected')
        return
      }
      case 'unregistered':
      case 'cleared':
      case 'evicted':
        // Its origin's or source's tools, or a name it declares (another source that held it
        // went: the name is free for this plugin again).
        if (data.origin === this.#options.origin || data.source === this.#options.source ||
          this.#namesOurs(data.tools)) {
          this.#options.onStale(`tools ${message.event}`)
        }
        return
      case 'role-added':
        // A role that lacks its tools: a new one (for a plugin of every role), or its own role
        // added back. Other roles are none of a one-role plugin's business.
        if (this.#options.role === null || data.role === this.#options.role) {
          this.#options.onStale('a role was added')
        }
    }
  }

  #namesOurs (tools: unknown): boolean {
    if (!Array.isArray(tools)) return false
    return tools.some((tool: unknown) => isPlainObject(tool) && typeof tool.name === 'string' &&
      this.#options.names.has(tool.name))
  }
}
