// JSON answers written in pieces instead of as one string: `GET /api/tools/definitions`,
// `GET /api/tools` and `GET /api/console/state`.
//
// One JSON string of a whole answer does not scale: 9000 tools with 60 KB schemas are 540 MB of
// JSON, 6000 descriptions of 16 384 control characters (six characters each once escaped, `\u0001`)
// are 590 MB, both past V8's longest string (about 512 MiB), where `JSON.stringify` throws a
// RangeError (it was a 500, after blocking the main thread for seconds). An answer is therefore
// given as parts, JSON text and arrays whose items are written one at a time, and sent in pieces
// of about 64 KiB with an exact Content-Length measured first. The measure pass stops as soon as
// a cap is passed (before any byte is sent), and is remembered per frozen array (the registry's
// snapshots), so asking again costs one pass, not two.
//
// Both passes yield to the event loop every MiB. The writing pass must too: a socket whose reader
// keeps up (loopback) takes every piece at once, so the stream was pulled to its end in one turn
// of the loop (590 MB of JSON held every other request ~1.4 s; ~10–20 ms at most with the yields).
//
// A client that stops reading pauses the stream, which then holds the registry snapshot it was
// made from (tens of MB for a large registry) for as long as the client keeps the connection: a
// stream whose next piece is not taken within `limits.answerStallTimeoutMs` is destroyed, and its
// connection with it (SECURITY.md, answers a client does not take).
import { Readable } from 'node:stream'
import type { FastifyReply } from 'fastify'
import { setImmediate as yieldToLoop } from 'node:timers/promises'

/** JSON text measured, or written, between two yields to the event loop (a few ms of work). */
const YIELD_BYTES = 1024 * 1024
/** Pieces written to the socket are about this large (small items are batched). */
const PIECE_CHARS = 64 * 1024

/** JSON text as it is, or items written as the inside of a JSON array (commas between them). */
export type JsonPart = string | readonly unknown[]

export interface StreamedJson {
  /** Exact length of the body in bytes. */
  readonly bytes: number
  /**
   * A new stream of the body, in pieces of about 64 KiB (plus one item); destroyed when its reader
   * takes no piece for `stallMs` (0: never).
   */
  stream: (stallMs?: number) => Readable
  /** The body as one Buffer: for bodies small enough to write at once (or to keep). */
  toBuffer: () => Buffer
}

/**
 * Answers `reply` with `body`, streamed, as JSON with its exact length; a reader that takes no
 * piece for `stallMs` (`limits.answerStallTimeoutMs`) is cut.
 */
export async function sendStreamed (reply: FastifyReply, body: StreamedJson, stallMs: number): Promise<FastifyReply> {
  return await reply.type('application/json; charset=utf-8').header('content-length', body.bytes)
    .send(body.stream(stallMs))
}

/** The measured JSON size of each frozen array's items (commas included). */
const measured = new WeakMap<readonly unknown[], number>()

/**
 * `parts` as one JSON body, measured and ready to stream; null when it would be larger than
 * `maxBytes` (found out before the rest is measured).
 */
export async function streamedJson (parts: readonly JsonPart[]): Promise<StreamedJson>
export async function streamedJson (parts: readonly JsonPart[], maxBytes: number): Promise<StreamedJson | null>
export async function streamedJson (parts: readonly JsonPart[],
  maxBytes = Number.POSITIVE_INFINITY): Promise<StreamedJson | null> {
  const pace = { sinceYield: 0 }
  let bytes = 0
  for (const part of parts) {
    const size = typeof part === 'string' ? Buffer.byteLength(part) : await itemsBytes(part, maxBytes - bytes, pace)
    if (size < 0) return null
    bytes += size
    if (bytes > maxBytes) return null
  }
  return {
    bytes,
    stream: (stallMs = 0) => {
      let readable: Readable | null = null
      const stalled = (): void => {
        readable?.destroy(new Error(`the client took no part of the answer for ${stallMs} ms`))
      }
      readable = Readable.from(pieces(parts, stallMs, stalled), { objectMode: false })
      return readable
    },
    toBuffer: () => {
      // One native JSON.stringify per array, not one per item: a third of the time for 10 000
      // small rows. Only for bodies small enough to be one string.
      let text = ''
      for (const part of parts) text += typeof part === 'string' ? part : JSON.stringify(part).slice(1, -1)
      return Buffer.from(text)
    }
  }
}

/** Bytes of `items` as the inside of a JSON array, or -1 as soon as that passes `maxBytes`. */
async function itemsBytes (items: readonly unknown[], maxBytes: number,
  pace: { sinceYield: number }): Promise<number> {
  const known = measured.get(items)
  if (known !== undefined) return known <= maxBytes ? known : -1
  let bytes = Math.max(0, items.length - 1)
  for (const item of items) {
    const size = Buffer.byteLength(JSON.stringify(item))
    bytes += size
    if (bytes > maxBytes) return -1
    pace.sinceYield += size
    if (pace.sinceYield >= YIELD_BYTES) {
      pace.sinceYield = 0
      await yieldToLoop()
    }
  }
  // Only frozen arrays (the registry's snapshots) are safe to remember.
  if (Object.isFrozen(items)) measured.set(items, bytes)
  return bytes
}

/**
 * The body in pieces. A reader that takes no piece for `stallMs` (0: never) has `stalled` called:
 * one timer for the stream, pushed back as each piece is handed over.
 */
async function * pieces (parts: readonly JsonPart[], stallMs: number, stalled: () => void): AsyncGenerator<string> {
  const timer = stallMs > 0 ? setTimeout(stalled, stallMs) : undefined
  timer?.unref()
  try {
    for await (const piece of piecesOf(parts)) {
      timer?.refresh()
      yield piece
    }
  } finally {
    clearTimeout(timer)
  }
}

async function * piecesOf (parts: readonly JsonPart[]): AsyncGenerator<string> {
  let piece = ''
  let sinceYield = 0
  for (const part of parts) {
    if (typeof part === 'string') {
      piece += part
    } else {
      for (let i = 0; i < part.length; i++) {
        piece += (i === 0 ? '' : ',') + JSON.stringify(part[i])
        if (piece.length >= PIECE_CHARS) {
          yield piece
          sinceYield += piece.length
          piece = ''
          if (sinceYield >= YIELD_BYTES) {
            sinceYield = 0
            await yieldToLoop()
          }
        }
      }
    }
    if (piece.length >= PIECE_CHARS) {
      yield piece
      piece = ''
    }
  }
  if (piece !== '') yield piece
}
