// The plugin's watch on Toolport's live event stream (`GET /api/events`, Server-Sent Events).
//
// Polling finds a missing registration within one poll interval; the stream says so at once: a
// `hello` with a new `instance_id` means Toolport restarted (registrations are runtime-only), and
// an `unregistered`, `cleared` or `evicted` event naming the plugin's callback origin or source
// means some of its tools are gone. Either way the plugin runs its usual check right away; it
// also checks on the first `hello`, for what happened before the watch connected. The stream is
// only a hint: polling goes on as the fallback, and a Toolport without the stream (404) is
// simply polled.
//
// One dedicated undici `Client` (one long-lived connection), apart from the API pool, so a
// stream never takes a connection a registration or a clear needs.
import { setTimeout as sleep } from 'node:timers/promises'
import { Client } from 'undici'
import { createParser, type EventSourceMessage } from 'eventsource-parser'
import type { PluginLogger } from './options.js'
import { errorText } from '../shared/util.js'

export interface EventWatchOptions {
  /** The API base, ending in `/`. */
  baseUrl: URL
  token: string | null
  /** The plugin's role, or null for every role. */
  role: string | null
  source: string
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
      try {
        const outcome = await this.#streamOnce(signal)
        // A stream that ended by itself (Toolport closed it): come back soon, replaying.
        if (outcome === 'ended') failures = 0
        waitMs = outcome === 'unsupported' ? UNSUPPORTED_RETRY_MS : RECONNECT_MS
      } catch (err) {
        if (signal.aborted) break
        if (this.#connected) {
          // The stream was up (its `hello` came) and broke, as it does when Toolport closes: come
          // back soon, as after a clean end, with the backoff started over. Only attempts that
          // never got a stream make it grow, so it does not grow with every Toolport restart.
          failures = 0
          waitMs = RECONNECT_MS
          this.#options.logger.debug?.(`event stream lost, reconnecting: ${errorText(err)}`)
        } else {
          failures++
          if (failures === 1) this.#options.logger.debug?.(`event stream lost, polling meanwhile: ${errorText(err)}`)
          const ceiling = Math.min(this.#options.maxBackoffMs, 500 * 2 ** Math.min(failures, 20))
          waitMs = ceiling / 2 + Math.random() * ceiling / 2
        }
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
    const parser = createParser({ onEvent: (message) => { this.#onEvent(message) } })
    // A UTF-8 character may straddle two chunks: decode as a stream.
    const decoder = new TextDecoder()
    for await (const chunk of res.body) parser.feed(decoder.decode(chunk as Buffer, { stream: true }))
    return 'ended'
  }

  #onEvent (message: EventSourceMessage): void {
    if (message.id !== undefined && message.id !== '') this.#lastEventId = message.id
    let data: Record<string, unknown>
    try {
      data = JSON.parse(message.data) as Record<string, unknown>
    } catch {
      return
    }
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
        if (data.origin === this.#options.origin || data.source === this.#options.source) {
          this.#options.onStale(`tools ${message.event}`)
        }
        return
      case 'role-added':
        // A plugin for every role reaches roles created after it started.
        if (this.#options.role === null) this.#options.onStale('a role was added')
    }
  }
}
