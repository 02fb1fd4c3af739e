// The body of `GET /api/tools` (docs/protocol.md R18): bytes when small, cached per registry
// revision, streamed when large (streamed-json.ts: one JSON string of every role's tools can be
// longer than V8 allows, and writing one blocks the main thread for seconds).
import type { ListFilter, ListResult, Runtime } from '../runtime.js'
import { streamedJson, type JsonPart, type StreamedJson } from './streamed-json.js'

/**
 * The largest list answer written at once (blocking the main thread up to ~20 ms), and the
 * largest the cache keeps; past it the answer is streamed and not kept.
 */
const BUFFERED_LIST_BYTES = 8 * 1024 * 1024
/** The most the cache holds in all: the whole list and a few roles' at that size. */
const LIST_CACHE_BYTES = 4 * BUFFERED_LIST_BYTES

/** Each list answer, written once per registry revision while it is small. */
export class ListAnswers {
  readonly #runtime: Runtime
  // Cached as bytes: with 10 000 tools, encoding and converting a 1.4 MB string on every request
  // cost 22 ms p50 against 7 ms for a cached Buffer (bench, control plane).
  readonly #cache = new Map<string, { key: string, body: Buffer }>()
  #cacheBytes = 0

  constructor (runtime: Runtime) {
    this.#runtime = runtime
  }

  /**
   * The answer for `role` (every role when undefined) and `filter`: its bytes, or a body to
   * stream. Filtered answers (a plugin's own tools, each time other names) are not cached.
   */
  async answer (role: string | undefined, filter: ListFilter): Promise<Buffer | StreamedJson> {
    const runtime = this.#runtime
    if (filter.source !== undefined || filter.names !== undefined) {
      return await listBody(runtime.list(role, filter))
    }
    const roles = role === undefined ? runtime.roles.list() : [runtime.roles.get(role)]
    let key = ''
    for (const r of roles) key += `${r.serial}:${r.registry.revision},`
    const slot = role === undefined ? '' : `=${role}`
    const cached = this.#cache.get(slot)
    if (cached !== undefined && cached.key === key) return cached.body
    // Listed with the key, before any await: the body is the snapshot the key names.
    const body = await listBody(runtime.list(role))
    if (!Buffer.isBuffer(body)) return body
    // Bounded: one entry for the whole list and one per role asked for, LIST_CACHE_BYTES in all.
    if (this.#cache.size > runtime.roles.size + 1 || this.#cacheBytes + body.length > LIST_CACHE_BYTES) {
      this.#cache.clear()
      this.#cacheBytes = 0
    }
    this.#cacheBytes += body.length - (this.#cache.get(slot)?.body.length ?? 0)
    this.#cache.set(slot, { key, body })
    return body
  }
}

/** `result` as bytes when at most BUFFERED_LIST_BYTES, else as a body to stream. */
async function listBody (result: ListResult): Promise<Buffer | StreamedJson> {
  // Small for sure: one JSON.stringify, without measuring first.
  if (fitsAtMost(result, BUFFERED_LIST_BYTES)) return Buffer.from(JSON.stringify(result))
  const streamed = await streamedJson(listParts(result))
  return streamed.bytes > BUFFERED_LIST_BYTES ? streamed : streamed.toBuffer()
}

/** `{ok: true, tools_by_role: {…}}` as parts: each role's rows are items, written one at a time. */
function listParts (result: ListResult): JsonPart[] {
  const parts: JsonPart[] = ['{"ok":true,"tools_by_role":{']
  let comma = ''
  for (const [role, rows] of Object.entries(result.tools_by_role)) {
    parts.push(`${comma}${JSON.stringify(role)}:[`, rows, ']')
    comma = ','
  }
  parts.push('}}')
  return parts
}

/**
 * Whether `result` is at most `maxBytes` of JSON, by a bound that needs no encoding: JSON writes a
 * UTF-16 unit as at most six bytes (`\u0001`), and a row's keys and punctuation take under 96.
 * Stops counting once past `maxBytes`.
 */
function fitsAtMost (result: ListResult, maxBytes: number): boolean {
  let bytes = 32
  for (const [role, rows] of Object.entries(result.tools_by_role)) {
    bytes += 6 * role.length + 8
    for (const row of rows) {
      bytes += 96 + 6 * (row.name.length + row.description.length + row.source.length + (row.callback_url?.length ?? 0))
      if (bytes > maxBytes) return false
    }
  }
  return bytes <= maxBytes
}
