// A bounded in-memory event store for one MCP session: the SDK's `EventStore`, which makes the
// session's SSE streams resumable. Every message the transport sends on a stream is stored with
// an event id; a client whose stream dropped reconnects with `Last-Event-ID` and is sent what it
// missed on that stream.
//
// Bounds: at most `maxEvents` events and `maxBytes` of message JSON per session. Past them the
// oldest events go first: a message evicted (or too large to keep) leaves a small marker, so a
// replay never silently skips it:
// - a missed response is replayed as a JSON-RPC error for its request id ("call again");
// - a missed notification on the standalone (GET) stream is replayed as one
//   `notifications/tools/list_changed`, the only notification Toolport sends there and one that
//   is safe to repeat (the client lists again).
import type { EventStore, EventId, StreamId } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import type { JSONRPCMessage, RequestId } from '@modelcontextprotocol/sdk/types.js'

/** The stream id the SDK gives the standalone GET stream. */
const STANDALONE_STREAM = '_GET_stream'
const LIST_CHANGED: JSONRPCMessage = Object.freeze({
  jsonrpc: '2.0',
  method: 'notifications/tools/list_changed'
}) as JSONRPCMessage

export interface EventStoreLimits {
  /** Most events kept (default 512). */
  maxEvents?: number
  /** Most bytes of message JSON kept (default 256 KiB). A larger single message keeps only its marker. */
  maxBytes?: number
}

interface StoredEvent {
  readonly seq: number
  readonly streamId: StreamId
  /** The message; null once evicted or when it was too large to keep. */
  message: JSONRPCMessage | null
  bytes: number
  /** Set for a response: the id of the request it answers. */
  readonly responseTo: RequestId | undefined
  /** The SDK's priming event (empty data): nothing to replay. */
  readonly isPriming: boolean
}

/**
 * Event ids are `<seq>_<streamId>`: the stream stays known from the id alone, even after its
 * events were evicted.
 */
export class BoundedEventStore implements EventStore {
  readonly #maxEvents: number
  readonly #maxBytes: number
  readonly #events: StoredEvent[] = []
  /** Index of the oldest live entry in #events (a queue without shifting on every eviction). */
  #head = 0
  #bytes = 0
  #seq = 0
  /** The oldest seq ever dropped entirely (count bound); events at or below it are gone. */
  #droppedUpTo = 0

  constructor (limits: EventStoreLimits = {}) {
    this.#maxEvents = limits.maxEvents ?? 512
    this.#maxBytes = limits.maxBytes ?? 256 * 1024
  }

  /** Events kept now (markers included). */
  get size (): number { return this.#events.length - this.#head }
  /** Bytes of message JSON kept now. */
  get bytes (): number { return this.#bytes }

  async storeEvent (streamId: StreamId, message: JSONRPCMessage): Promise<EventId> {
    const seq = ++this.#seq
    const isPriming = !('jsonrpc' in message)
    const responseTo = 'id' in message && !('method' in message) ? message.id : undefined
    // An approximate size: the JSON the transport writes for it. A message too deep or too large
    // to encode cannot be replayed either; it keeps its marker.
    let bytes = 0
    try {
      bytes = isPriming ? 0 : JSON.stringify(message).length
    } catch {
      bytes = Infinity
    }
    const keep = bytes <= this.#maxBytes
    this.#events.push({ seq, streamId, message: keep ? message : null, bytes: keep ? bytes : 0, responseTo, isPriming })
    if (keep) this.#bytes += bytes
    this.#trim()
    return `${seq}_${streamId}`
  }

  /**
   * Whether the stream of `eventId` has an event after it that a replay would send (a message or
   * the marker of one). False for an id this store did not issue.
   */
  hasEventsAfter (eventId: EventId): boolean {
    const parsed = parseEventId(eventId)
    if (parsed === undefined) return false
    if (isStandaloneStream(parsed.streamId) && parsed.seq < this.#droppedUpTo) return true
    return this.#replayable(parsed.seq, parsed.streamId).next().done !== true
  }

  /** The stream of an event id this store issued; undefined for an id it cannot resume. */
  async getStreamIdForEventId (eventId: EventId): Promise<StreamId | undefined> {
    const parsed = parseEventId(eventId)
    if (parsed === undefined || parsed.seq > this.#seq) return undefined
    if (isStandaloneStream(parsed.streamId)) return parsed.streamId
    // A request stream is resumable while any of its events is kept.
    for (let i = this.#head; i < this.#events.length; i++) {
      if ((this.#events[i] as StoredEvent).streamId === parsed.streamId) return parsed.streamId
    }
    return undefined
  }

  async replayEventsAfter (lastEventId: EventId, { send }: {
    send: (eventId: EventId, message: JSONRPCMessage) => Promise<void>
  }): Promise<StreamId> {
    const parsed = parseEventId(lastEventId)
    if (parsed === undefined) throw new Error(`unknown event id ${JSON.stringify(lastEventId)}`)
    const { seq: after, streamId } = parsed
    // Events of this stream may have been dropped entirely since: for the standalone stream
    // that can only have been a list change.
    let owesListChanged = isStandaloneStream(streamId) && after < this.#droppedUpTo
    const replay: Array<[EventId, JSONRPCMessage]> = []
    for (const event of this.#replayable(after, streamId)) {
      if (event === null) owesListChanged = true
      else replay.push(event)
    }
    if (owesListChanged) await send(lastEventId, LIST_CHANGED)
    for (const [id, message] of replay) await send(id, message)
    return streamId
  }

  /**
   * What a replay of `streamId` after `after` sends, in order: each kept message with its event id,
   * a response's marker as the error for its request, and null for a list change's marker on the
   * event stream (the replay sends one list change for those).
   */
  * #replayable (after: number, streamId: StreamId): Generator<[EventId, JSONRPCMessage] | null> {
    const isStandalone = isStandaloneStream(streamId)
    for (let i = this.#head; i < this.#events.length; i++) {
      const event = this.#events[i] as StoredEvent
      if (event.seq <= after || event.streamId !== streamId || event.isPriming) continue
      const id = `${event.seq}_${streamId}`
      if (event.message !== null) {
        yield [id, event.message]
      } else if (event.responseTo !== undefined) {
        yield [id, lostResponse(event.responseTo)]
      } else if (isStandalone) {
        yield null
      }
    }
  }

  #trim (): void {
    // Bytes first: turn the oldest kept messages into markers.
    for (let i = this.#head; this.#bytes > this.#maxBytes && i < this.#events.length; i++) {
      const event = this.#events[i] as StoredEvent
      if (event.message === null) continue
      this.#bytes -= event.bytes
      event.message = null
      event.bytes = 0
    }
    // Then the count: drop the oldest entries.
    while (this.size > this.#maxEvents) {
      const event = this.#events[this.#head] as StoredEvent
      this.#bytes -= event.bytes
      this.#droppedUpTo = event.seq
      // The entry stays in the array until the next splice: it must not keep its message (up
      // to a thousand dropped messages beyond the byte bound).
      event.message = null
      event.bytes = 0
      this.#head++
    }
    if (this.#head > 1024 && this.#head * 2 > this.#events.length) {
      this.#events.splice(0, this.#head)
      this.#head = 0
    }
  }
}

/** The stream an event id names (`<seq>_<streamId>`); undefined when it is not such an id. */
export function streamOfEventId (eventId: string): StreamId | undefined {
  return parseEventId(eventId)?.streamId
}

/** Whether an event id is one of the standalone (GET) stream's: the session's event stream. */
export function isStandaloneEventId (eventId: string): boolean {
  return isStandaloneStream(streamOfEventId(eventId))
}

/** Whether a stream id is the standalone (GET) stream's: the session's event stream. */
export function isStandaloneStream (streamId: StreamId | undefined): boolean {
  return streamId === STANDALONE_STREAM
}

function parseEventId (eventId: string): { seq: number, streamId: string } | undefined {
  const underscore = eventId.indexOf('_')
  if (underscore <= 0) return undefined
  const seqText = eventId.slice(0, underscore)
  if (!/^\d{1,15}$/.test(seqText)) return undefined
  const streamId = eventId.slice(underscore + 1)
  if (streamId === '') return undefined
  return { seq: Number(seqText), streamId }
}

function lostResponse (id: RequestId): JSONRPCMessage {
  return {
    jsonrpc: '2.0',
    id,
    error: {
      code: -32603,
      message: 'the response was too large to keep for a resumed stream; send the request again'
    }
  }
}
