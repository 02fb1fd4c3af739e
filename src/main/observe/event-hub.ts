// The live event stream behind `GET /api/events`: the runtime's typed events, turned into wire
// events, numbered, kept in a bounded ring for `Last-Event-ID` replay, and fanned out to the
// subscribers (the console, plugins, hosts).
//
// Costs on the dispatch path: one small object per call and a ring slot, nothing more. Frames are
// serialised once per event (not per subscriber) and written in batches from a timer, so a burst
// of calls costs one `write` per subscriber per batch. A subscriber that does not read is never
// waited for: once its unread bytes pass `maxSubscriberBufferBytes` its connection is destroyed,
// and it may reconnect with `Last-Event-ID` to replay what the ring still holds.
//
// Privacy (docs/protocol.md R14): a `call` event carries metadata only (role, tool, source,
// outcome kind, duration, bytes): never arguments, outputs, callback bodies or error text. A tool
// name that matched no tool is the model's free text, so it is sent as null.
import type { EventEmitter } from 'node:events'
import { kChangeEnd, type CallFinishedEvent, type ToolportEvents } from '../events.js'
import { VERSION } from '../version.js'

/** Every event type of the stream, in the order the README documents them. */
export const STREAM_EVENT_TYPES = [
  'hello', 'registered', 'unregistered', 'cleared', 'evicted', 'sync', 'call', 'role-added', 'role-removed'
] as const
export type StreamEventType = typeof STREAM_EVENT_TYPES[number]

export interface EventHubOptions {
  replaySize: number
  /** The ring's bytes at most (its frames and role lists); the oldest events go first past it. */
  replayMaxBytes: number
  heartbeatMs: number
  maxSubscriberBufferBytes: number
  maxSubscribers: number
  /** `call` events streamed per second at most (beyond it they are not streamed that second). */
  maxCallEventsPerSecond: number
}

/** Where a subscriber's frames go: a `ServerResponse` fits. */
export interface EventSink {
  write: (chunk: string) => boolean
  readonly writableLength: number
  end: () => void
  destroy: () => void
}

/** Which events a subscriber wants: null means all. */
export interface EventFilter {
  types: ReadonlySet<string> | null
  role: string | null
}

/** One event as it sits in the ring. */
interface StreamRecord {
  /** The event id's number; 0 for a `call` event, which has no id and is never replayed. */
  readonly seq: number
  /** Publication order of every record, `call` events included. */
  readonly order: number
  readonly type: StreamEventType
  /** Roles the event concerns, for the `?role=` filter. */
  readonly roles: readonly string[]
  /**
   * The wire data; for `call`, the runtime's own event object, encoded only when sent. A ring
   * record is encoded when published and keeps its frame only (null).
   */
  data: object | null
  /** The serialised frame, shared by every subscriber. */
  frame: string | null
}

/** Bytes a ring record holds besides its frame's characters: the record and its role list's slots. */
const RECORD_OVERHEAD_BYTES = 96
const ROLE_SLOT_BYTES = 8

/** What a ring record (encoded when published, unchanged after) counts against `replayMaxBytes`. */
function ringBytes (record: StreamRecord): number {
  return RECORD_OVERHEAD_BYTES + (record.frame?.length ?? 0) + ROLE_SLOT_BYTES * record.roles.length
}

/** `call` events are the hot ones: their JSON starts with a per-tool prefix encoded once. */
interface CallPrefix { source: string, outcome: string, json: string }

interface Subscriber {
  readonly sink: EventSink
  readonly filter: EventFilter
  /** The newest record when it subscribed: older ones reach it only through the replay. */
  readonly afterOrder: number
}

/** A tool change of one origin and source, collected over one synchronous run of the runtime. */
interface ChangeBatch {
  type: 'registered' | 'unregistered' | 'cleared' | 'evicted'
  origin: string
  source: string
  tools: Array<{ role: string, name: string }>
  roles: string[]
  failures: number
}

/** How far back a `Last-Event-ID` could be honoured. */
export type ReplayKind = 'none' | 'complete' | 'partial'

/** Flushes of pending frames are batched over this long: one write per subscriber per batch. */
const FLUSH_MS = 10

const REMOVAL_TYPES = {
  unregister: 'unregistered',
  local: 'unregistered',
  clear: 'cleared',
  evicted: 'evicted'
} as const

/**
 * The stream of one runtime. Subscribes to the runtime's events at construction; `close()`
 * ends every subscriber and stops the heartbeat.
 *
 * @example
 * const hub = new EventHub(runtime, runtime.instanceId, options.events, (role) => runtime.roles.has(role))
 * hub.subscribe(reply.raw, { types: null, role: null }, request.headers['last-event-id'])
 */
export class EventHub {
  readonly instanceId: string
  readonly #tag: string
  readonly #options: EventHubOptions
  readonly #ring: Array<StreamRecord | undefined>
  /** The ring's bytes now, and the seq of its oldest record still held. */
  #ringBytes = 0
  #oldestKept = 1
  #seq = 0
  #order = 0
  /** `call` events streamed in the current second, and the second it is. */
  #callsThisSecond = 0
  #callSecond = 0
  readonly #subscribers = new Set<Subscriber>()
  /** Records published since the last flush (only while someone subscribes). */
  #pending: StreamRecord[] = []
  #flushTimer: NodeJS.Timeout | null = null
  #heartbeat: NodeJS.Timeout | null = null
  readonly #batches = new Map<string, ChangeBatch>()
  #batchScheduled = false
  #dropped = 0
  #closed = false
  /** role → tool → the encoded start of its `call` events (bounded like the registry). */
  readonly #callPrefixes = new Map<string, Map<string, CallPrefix>>()

  readonly #hasRole: (role: string) => boolean

  /** `hasRole`: whether a role exists now (a call encoded after its role went is not cached). */
  constructor (events: EventEmitter<ToolportEvents>, instanceId: string, options: EventHubOptions,
    hasRole: (role: string) => boolean) {
    this.instanceId = instanceId
    this.#hasRole = hasRole
    // Event ids are `<tag>-<seq>`: an id from before a restart never matches (and never replays
    // the wrong events) on the new instance.
    this.#tag = instanceId.replaceAll('-', '').slice(0, 8)
    this.#options = options
    this.#ring = new Array<StreamRecord | undefined>(options.replaySize)
    events.on('tool-registered', (e) => {
      this.#collect('registered', e.origin ?? '', e.source, e.role, e.name)
    })
    events.on('tool-removed', (e) => {
      // A replacement is announced by its `registered` event.
      if (e.reason === 'replaced') return
      this.#collect(REMOVAL_TYPES[e.reason], e.origin ?? '', e.source, e.role, e.name)
    })
    events.on('origin-evicted', (e) => {
      for (const batch of this.#batches.values()) {
        if (batch.type === 'evicted' && batch.origin === e.origin) batch.failures = e.failures
      }
      // An eviction's removals are all in: its event goes now, before any later change's.
      this.#publishBatches()
    })
    // The end of one registry change: its events go out as events of their own, in order.
    ;(events as unknown as EventEmitter).on(kChangeEnd, this.#publishBatches)
    events.on('sync-finished', (e) => {
      this.publish('sync', [e.role], {
        role: e.role,
        sessions: e.sessions,
        duration_ms: round(e.durationMs),
        ok: e.ok,
        failures: e.failures ?? (e.ok ? 0 : e.sessions),
        error: e.ok ? null : e.error
      })
    })
    // The hot path: no copy of the event, no encoding until a subscriber needs the frame.
    events.on('call-finished', (e) => { this.#publishCall(e) })
    events.on('role-added', (e) => { this.publish('role-added', [e.role], { role: e.role }) })
    events.on('role-removed', (e) => {
      this.#callPrefixes.delete(e.role) // roles made per conversation must not pile up here
      this.publish('role-removed', [e.role], { role: e.role })
    })
  }

  /** Subscribers now. */
  get subscribers (): number { return this.#subscribers.size }

  /** Subscribers dropped so far because they did not keep up. */
  get dropped (): number { return this.#dropped }

  /** The id of the newest event (`<tag>-<seq>`). */
  get lastEventId (): string { return `${this.#tag}-${this.#seq}` }

  /** True when one more subscriber fits. */
  get hasRoom (): boolean { return this.#subscribers.size < this.#options.maxSubscribers }

  /**
   * Adds a subscriber: sends `hello`, then replays what it missed after `lastEventId` (when the
   * ring still has it), then live events. Returns the function that removes it.
   */
  subscribe (sink: EventSink, filter: EventFilter, lastEventId?: string): () => void {
    const subscriber: Subscriber = { sink, filter, afterOrder: this.#order }
    const after = this.#parseId(lastEventId)
    const replay: StreamRecord[] = []
    let kind: ReplayKind = 'none'
    if (after !== null) {
      // The ring's count bound moves #oldestKept too (see #keep).
      const oldest = this.#oldestKept
      kind = after + 1 >= oldest ? 'complete' : 'partial'
      for (let seq = Math.max(after + 1, oldest); seq <= this.#seq; seq++) {
        const record = this.#ring[seq % this.#options.replaySize]
        if (record !== undefined && record.seq === seq && passes(record, filter)) replay.push(record)
      }
    }
    const hello = {
      instance_id: this.instanceId,
      version: VERSION,
      last_event_id: this.lastEventId,
      replay: kind,
      replayed: replay.length
    }
    // Without a replay, hello carries the newest id, so a reconnect resumes from here; with one,
    // the replayed events carry theirs.
    let text = `retry: 1000\n${after === null ? `id: ${this.lastEventId}\n` : ''}event: hello\ndata: ${JSON.stringify(hello)}\n\n`
    for (const record of replay) text += this.#frame(record)
    sink.write(text)
    this.#subscribers.add(subscriber)
    this.#startHeartbeat()
    return () => { this.#remove(subscriber) }
  }

  /** Numbers an event, keeps it in the ring and queues it for the subscribers. */
  publish (type: StreamEventType, roles: readonly string[], data: object): void {
    this.#publishRecord(type, roles, data)
  }

  #publishRecord (type: StreamEventType, roles: readonly string[] | string, data: object): void {
    if (this.#closed) return
    const seq = ++this.#seq
    const record: StreamRecord = {
      seq, order: ++this.#order, type, roles: typeof roles === 'string' ? [roles] : roles, data, frame: null
    }
    // Encoded now, once, and kept in that form only: a ring of `replaySize` events each naming
    // every role (a global registration with many roles) would otherwise hold both forms.
    this.#frame(record)
    record.data = null
    this.#keep(record)
    if (this.#subscribers.size === 0) return
    this.#queue(record)
  }

  /**
   * Puts a record in the ring, in place of the one `replaySize` events older, then lets the
   * oldest go while the ring holds more than `replayMaxBytes` (the newest always stays). A replay
   * that asks for events let go says `partial`.
   */
  #keep (record: StreamRecord): void {
    const size = this.#options.replaySize
    const slot = record.seq % size
    const previous = this.#ring[slot]
    if (previous !== undefined) this.#ringBytes -= ringBytes(previous)
    this.#ring[slot] = record
    this.#ringBytes += ringBytes(record)
    this.#oldestKept = Math.max(this.#oldestKept, record.seq - size + 1)
    while (this.#ringBytes > this.#options.replayMaxBytes && this.#oldestKept < record.seq) {
      const oldest = this.#oldestKept % size
      const dropped = this.#ring[oldest]
      if (dropped !== undefined) {
        this.#ringBytes -= ringBytes(dropped)
        this.#ring[oldest] = undefined
      }
      this.#oldestKept++
    }
  }

  /**
   * `call` events are live telemetry: no id, not kept in the replay ring (a burst of calls must
   * never push out the registry changes a reconnecting plugin needs), and at most
   * `maxCallEventsPerSecond` of them streamed per second. The console's per-second stats
   * (`/api/console/stats`) count every call either way.
   */
  #publishCall (e: CallFinishedEvent): void {
    if (this.#closed || this.#subscribers.size === 0) return
    const second = Math.floor(performance.now() / 1000)
    if (second !== this.#callSecond) {
      this.#callSecond = second
      this.#callsThisSecond = 0
    }
    if (this.#callsThisSecond >= this.#options.maxCallEventsPerSecond) return
    this.#callsThisSecond++
    this.#queue({ seq: 0, order: ++this.#order, type: 'call', roles: [e.role], data: e, frame: null })
  }

  #queue (record: StreamRecord): void {
    this.#pending.push(record)
    if (this.#flushTimer === null) this.#flushTimer = setTimeout(this.#flush, FLUSH_MS)
  }

  /**
   * Ends every subscriber's stream (as a stream ends: a reader sees its end, not a network error)
   * and stops publishing.
   */
  close (): void {
    if (this.#closed) return
    this.#closed = true
    if (this.#flushTimer !== null) clearTimeout(this.#flushTimer)
    this.#flush()
    for (const subscriber of [...this.#subscribers]) {
      this.#subscribers.delete(subscriber)
      subscriber.sink.end()
    }
    this.#stopHeartbeat()
  }

  readonly #flush = (): void => {
    this.#flushTimer = null
    const records = this.#pending
    if (records.length === 0) return
    this.#pending = []
    for (const subscriber of this.#subscribers) {
      let text = ''
      for (const record of records) {
        // A record queued before this subscriber came was in its hello/replay already (or not wanted).
        if (record.order > subscriber.afterOrder && passes(record, subscriber.filter)) text += this.#frame(record)
      }
      if (text !== '') this.#send(subscriber, text)
    }
  }

  #send (subscriber: Subscriber, text: string): void {
    // A subscriber that leaves this much unread is gone or too slow: drop it rather than buffer
    // without bound (it may reconnect and replay from the ring).
    if (subscriber.sink.writableLength > this.#options.maxSubscriberBufferBytes) {
      this.#dropped++
      this.#remove(subscriber)
      subscriber.sink.destroy()
      return
    }
    subscriber.sink.write(text)
  }

  #frame (record: StreamRecord): string {
    if (record.frame === null) {
      const json = record.type === 'call'
        ? this.#callJson(record.data as CallFinishedEvent)
        : JSON.stringify(record.data)
      const id = record.seq === 0 ? '' : `id: ${this.#tag}-${record.seq}\n`
      record.frame = `${id}event: ${record.type}\ndata: ${json}\n\n`
    }
    return record.frame
  }

  /**
   * `{"role","tool","source","outcome","is_error","duration_ms","bytes"}`: metadata only. A name
   * that matched no tool is the model's free text, so `tool` is null then (and it is not cached).
   */
  #callJson (e: CallFinishedEvent): string {
    const tail = `,"is_error":${e.isError ? 'true' : 'false'},"duration_ms":${round(e.durationMs)},"bytes":${e.bytes ?? 0}}`
    const source = e.source ?? ''
    // No source: the name matched no tool (unknown, or called after close()).
    if (source === '') {
      return `{"role":${JSON.stringify(e.role)},"tool":null,"source":null,"outcome":${JSON.stringify(e.outcome)}${tail}`
    }
    let byTool = this.#callPrefixes.get(e.role)
    if (byTool === undefined) {
      // Calls are encoded when flushed, possibly after their role was removed (and its prefixes
      // with it): such a role is not cached again.
      if (!this.#hasRole(e.role)) return callPrefixJson(e.role, e.name, source, e.outcome) + tail
      // Bounded: roles and tool names come from the registry (capped), never from the model.
      if (this.#callPrefixes.size > 10_000) this.#callPrefixes.clear()
      byTool = new Map()
      this.#callPrefixes.set(e.role, byTool)
    }
    let prefix = byTool.get(e.name)
    if (prefix === undefined || prefix.source !== source || prefix.outcome !== e.outcome) {
      if (byTool.size > 10_000) byTool.clear()
      prefix = {
        source,
        outcome: e.outcome,
        json: callPrefixJson(e.role, e.name, source, e.outcome)
      }
      byTool.set(e.name, prefix)
    }
    return prefix.json + tail
  }

  /** The seq of an id of this instance, or null (absent, malformed, or another instance's). */
  #parseId (id: string | undefined): number | null {
    if (id === undefined) return null
    const dash = id.lastIndexOf('-')
    if (dash === -1 || id.slice(0, dash) !== this.#tag) return null
    const seq = Number(id.slice(dash + 1))
    if (!Number.isSafeInteger(seq) || seq < 0 || seq > this.#seq) return null
    return seq
  }

  /**
   * Tool changes arrive one role and one tool at a time, synchronously, within one register,
   * unregister, clear or eviction; they are published as one event per kind, origin and source
   * once that synchronous run ends (a microtask later).
   */
  #collect (type: ChangeBatch['type'], origin: string, source: string, role: string, name: string): void {
    const key = `${type}\0${origin}\0${source}`
    let batch = this.#batches.get(key)
    if (batch === undefined) {
      batch = { type, origin, source, tools: [], roles: [], failures: 0 }
      this.#batches.set(key, batch)
    }
    batch.tools.push({ role, name })
    if (!batch.roles.includes(role)) batch.roles.push(role)
    // Normally published at the change's end (kChangeEnd, origin-evicted); this is the net for a
    // change that signals none, so that its events still go out.
    if (!this.#batchScheduled) {
      this.#batchScheduled = true
      queueMicrotask(this.#publishBatches)
    }
  }

  readonly #publishBatches = (): void => {
    this.#batchScheduled = false
    for (const batch of this.#batches.values()) {
      const data: Record<string, unknown> = {
        origin: batch.origin === '' ? null : batch.origin,
        source: batch.source,
        tools: batch.tools,
        roles: batch.roles
      }
      if (batch.type === 'evicted') data.failures = batch.failures
      this.publish(batch.type, batch.roles, data)
    }
    this.#batches.clear()
  }

  #remove (subscriber: Subscriber): void {
    this.#subscribers.delete(subscriber)
    if (this.#subscribers.size === 0) this.#stopHeartbeat()
  }

  #startHeartbeat (): void {
    if (this.#heartbeat !== null) return
    this.#heartbeat = setInterval(this.#beat, this.#options.heartbeatMs)
    this.#heartbeat.unref()
  }

  #stopHeartbeat (): void {
    if (this.#heartbeat === null) return
    clearInterval(this.#heartbeat)
    this.#heartbeat = null
  }

  readonly #beat = (): void => {
    // A comment line: EventSource ignores it, and a dead connection shows up as a write error.
    for (const subscriber of this.#subscribers) this.#send(subscriber, ': heartbeat\n\n')
  }
}

function passes (record: StreamRecord, filter: EventFilter): boolean {
  if (filter.types !== null && !filter.types.has(record.type)) return false
  if (filter.role !== null && !record.roles.includes(filter.role)) return false
  return true
}

function round (ms: number): number {
  return Math.round(ms * 1000) / 1000
}

/** The start of a `call` event's JSON for a tool that has a source, up to its outcome. */
function callPrefixJson (role: string, name: string, source: string, outcome: string): string {
  return `{"role":${JSON.stringify(role)},"tool":${JSON.stringify(name)},"source":${JSON.stringify(source)},"outcome":${JSON.stringify(outcome)}`
}
