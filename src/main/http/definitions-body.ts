// The body of `GET /api/tools/definitions`, streamed.
//
// One JSON string of every definition does not scale: 9000 tools with 60 KB schemas are 540 MB of
// JSON, past V8's longest string (about 512 MiB), and `JSON.stringify` throws a RangeError (it was
// a 500). The answer is therefore written one tool at a time, from the frozen registry snapshot
// of the request, with an exact Content-Length measured first. The measure pass yields to the event
// loop as it goes, stops as soon as `limits.maxDefinitionsBytes` is passed (a 422 naming the cap,
// before any byte is sent), and is remembered per snapshot, so asking again costs nothing.
import { Readable } from 'node:stream'
import { setImmediate as yieldToLoop } from 'node:timers/promises'
import { limitExceeded, type ToolportError } from '../errors.js'
import { toolDefinitions, type DefinitionFormat, type GeminiTool } from '../sessions/definitions.js'
import type { Role } from '../roles/role.js'

/** JSON text measured between two yields to the event loop. */
const YIELD_BYTES = 4 * 1024 * 1024
/** Pieces written to the socket are about this large (small definitions are batched). */
const PIECE_CHARS = 64 * 1024

/** The measured JSON size of each snapshot's items (commas included), per snapshot. */
const measured = new WeakMap<readonly unknown[], number>()

export interface DefinitionsBody {
  /** Exact length of the body in bytes. */
  bytes: number
  /** A new stream of the body. */
  stream: () => Readable
}

/**
 * `{ok: true, role, format, tools}` for the role and format, ready to stream. Throws 422
 * TP_ERR_LIMIT_EXCEEDED (details name `limits.maxDefinitionsBytes`) when it would be larger.
 */
export async function definitionsBody (role: Role, format: DefinitionFormat,
  maxBytes: number): Promise<DefinitionsBody> {
  const built = toolDefinitions(role, format)
  let items: readonly unknown[] = built
  let head = `{"ok":true,"role":${JSON.stringify(role.name)},"format":${JSON.stringify(format)},"tools":[`
  let tail = ']}'
  if (format === 'gemini' && built.length > 0) {
    // Gemini's one Tool holds every declaration: stream the declarations inside it.
    items = (built[0] as GeminiTool).functionDeclarations
    head += '{"functionDeclarations":['
    tail = ']}]}'
  }
  const frame = Buffer.byteLength(head) + Buffer.byteLength(tail)
  const inner = await itemsBytes(items, maxBytes - frame)
  if (inner < 0) throw tooLarge(maxBytes)
  return { bytes: frame + inner, stream: () => Readable.from(pieces(head, items, tail), { objectMode: false }) }
}

/** Bytes of `items` as the inside of a JSON array, or -1 as soon as that passes `maxBytes`. */
async function itemsBytes (items: readonly unknown[], maxBytes: number): Promise<number> {
  const known = measured.get(items)
  if (known !== undefined) return known <= maxBytes ? known : -1
  let bytes = Math.max(0, items.length - 1)
  let sinceYield = 0
  for (const item of items) {
    const size = Buffer.byteLength(JSON.stringify(item))
    bytes += size
    if (bytes > maxBytes) return -1
    sinceYield += size
    if (sinceYield >= YIELD_BYTES) {
      sinceYield = 0
      await yieldToLoop()
    }
  }
  // Only the registry's frozen snapshots are safe to remember.
  if (Object.isFrozen(items)) measured.set(items, bytes)
  return bytes
}

function * pieces (head: string, items: readonly unknown[], tail: string): Generator<string> {
  let piece = head
  for (let i = 0; i < items.length; i++) {
    piece += (i === 0 ? '' : ',') + JSON.stringify(items[i])
    if (piece.length >= PIECE_CHARS) {
      yield piece
      piece = ''
    }
  }
  yield piece + tail
}

function tooLarge (maxBytes: number): ToolportError {
  return limitExceeded('limits.maxDefinitionsBytes', `the definitions would be larger than ${maxBytes} bytes of JSON`,
    'ask for one role at a time or raise the limit')
}
