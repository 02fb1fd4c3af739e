// Callback reply → ToolResult → the text a model reads (docs/protocol.md R10–R12, "Model-visible result").
import type { CallOutcome } from '../../workers/protocol.js'
import { decodeReplyText, mapReply, safeStringify } from '../../shared/reply.js'
import type { ImageMimeType } from '../../shared/images.js'

/** One image a tool returned (the reply's `images`, checked where it arrived). */
export interface ToolImage {
  /** `image/png`, `image/jpeg`, `image/webp` or `image/gif`: what the data's magic bytes say. */
  mime_type: ImageMimeType
  /** The image, standard padded base64. */
  data_base64: string
  /** The plugin's `vision_prompt` for this image, when it gave one. */
  prompt?: string
}

/** What a tool call returns to the model session (docs/protocol.md "Model-visible result"). */
export interface ToolResult {
  is_error: boolean
  /**
   * The JSON value the callback returned (or its text). For a tool error, the reply's `output`
   * (null when it had none); null for every other error.
   */
  output: unknown
  /** Set when `is_error`. */
  error?: string
  /**
   * What a text-only model session reads: the output (a string as-is, else JSON), or
   * `{"error": …, "output": …}` (`output` only when the error reply carried a non-null one).
   */
  text: string
  /** The images the tool returned that passed the checks; absent when there are none. */
  images?: ToolImage[]
}

/** Success outputs up to this long are parsed when the result is built, not when first read. */
const EAGER_OUTPUT_CHARS = 256

/** Builds an error result; `text` is `{"error":"…"}` so the model sees a uniform shape. */
export function errorResult (error: string): ToolResult {
  return { is_error: true, output: null, error, text: JSON.stringify({ error }) }
}

/** Builds a success result from an output value. */
export function outputResult (output: unknown): ToolResult {
  return { is_error: false, output, text: outputText(output) }
}

/** The facts about the tool that error messages mention (a ToolEntry has them). */
export interface ResultContext {
  readonly name: string
  readonly timeoutMs: number
}

/** Maps a worker's flat outcome to the ToolResult the model sees. */
export function outcomeToResult (outcome: CallOutcome, tool: ResultContext, maxResponseBytes: number): ToolResult {
  switch (outcome.kind) {
    case 'ok':
      // The reply was already read where it arrived (the worker, in pool mode).
      return mappedReplyResult(outcome.text, outcome.textIsJson, outcome.toolError, outcome.images,
        outcome.textBytes)
    case 'http':
      return errorResult(`tool callback returned HTTP ${outcome.status}` +
        (outcome.text === '' ? '' : `: ${outcome.text}`))
    case 'timeout':
      return errorResult(`tool '${tool.name}' timed out after ${formatSeconds(tool.timeoutMs)} s`)
    case 'connect':
      return errorResult(`tool '${tool.name}' is unreachable: the connection to its callback failed (${outcome.message})`)
    case 'protocol':
      return errorResult(`tool '${tool.name}' callback failed: ${outcome.message}`)
    case 'too_large':
      return errorResult(`tool '${tool.name}' replied with more than ${maxResponseBytes} bytes`)
    case 'cancelled':
      return errorResult(`tool '${tool.name}' call was cancelled`)
    case 'busy':
      return errorResult(`tool '${tool.name}' was not called: Toolport is busy` +
        (outcome.message === '' ? '' : ` (${outcome.message})`) + ', try again shortly')
    case 'memory':
      return errorResult(`tool '${tool.name}' failed: ${outcome.message}`)
    case 'refused':
      return errorResult(`tool '${tool.name}' was not called: its callback URL is not a loopback address`)
    case 'internal':
      return errorResult(`tool '${tool.name}' failed: internal error in Toolport (${outcome.message})`)
  }
}

/**
 * Where a lazy result (a long output parsed on first read, or a large text decoded on each read)
 * keeps what its getters read: under a symbol, not enumerable, so the result's own enumerable
 * properties stay `is_error`, `output`, `text` (and `error`).
 *
 * The getters are shared by every lazy result (`LAZY_TEXT`, `LAZY_OUTPUT`), never closures made
 * per result: V8 keeps an object literal's own getter in an accessor pair allocated in the old
 * generation, and a young-generation collection treats old objects as alive, so whatever a
 * per-result getter closed over (the reply's bytes or JSON) survived every scavenge until a full
 * collection. Measured with 64 KiB replies at c=16: a mark-compact every ~60 ms on the main
 * thread and ~200 µs of marking per call on the GC threads. Shared getters sit in the results'
 * common map instead (the objects stay in fast mode), and the state dies young with its result.
 */
const LAZY = Symbol('toolport.lazyResult')

/** What a lazy result's getters read: its output, parsed on the first read and kept. */
abstract class LazyState {
  #parsed: unknown = undefined
  #isParsed = false

  output (): unknown {
    if (!this.#isParsed) {
      this.#parsed = this.parse()
      this.#isParsed = true
    }
    return this.#parsed
  }

  protected abstract parse (): unknown
}

/** A success or tool-error result whose output is parsed from its JSON when first read. */
class LazyOutput extends LazyState {
  readonly outputJson: string
  constructor (outputJson: string) {
    super()
    this.outputJson = outputJson
  }

  protected parse (): unknown {
    return JSON.parse(this.outputJson)
  }
}

/** A large success whose text is decoded from the reply's bytes on each read. */
class LazyText extends LazyState {
  readonly bytes: Uint8Array
  /** Whether the text is the output's JSON (else it is the output string). */
  readonly textIsJson: boolean
  constructor (bytes: Uint8Array, textIsJson: boolean) {
    super()
    this.bytes = bytes
    this.textIsJson = textIsJson
  }

  text (): string {
    return decodeReplyText(this.bytes)
  }

  protected parse (): unknown {
    const text = this.text()
    return this.textIsJson ? JSON.parse(text) : text
  }
}

interface LazyResult<State> extends ToolResult {
  readonly [LAZY]: State
}

/**
 * `ToolResult`'s fields are writable (a host may redact or shorten a result): assigning to a lazy
 * one makes it a plain data property holding the value.
 */
function setter (key: 'output' | 'text'): (this: ToolResult, value: unknown) => void {
  return function set (value) {
    Object.defineProperty(this, key, { value, writable: true, enumerable: true, configurable: true })
  }
}

const OUTPUT_GETTER: PropertyDescriptor = {
  enumerable: true,
  configurable: true,
  get (this: LazyResult<LazyState>): unknown {
    return this[LAZY].output()
  },
  set: setter('output')
}

const LAZY_OUTPUT: PropertyDescriptorMap = { output: OUTPUT_GETTER }

const LAZY_TEXT: PropertyDescriptorMap = {
  output: OUTPUT_GETTER,
  text: {
    enumerable: true,
    configurable: true,
    get (this: LazyResult<LazyText>): string {
      return this[LAZY].text()
    },
    set: setter('text')
  }
}

/**
 * The JSON text of a result's output when it is already known (a callback reply's own text), so
 * that the HTTP route can send it without parsing or encoding the output again; undefined
 * otherwise. `text` is the result's text, read once by the caller (a large result decodes its
 * text on each read), and `textJson` its JSON encoding, which the caller needs as well.
 */
export function outputJsonOf (result: ToolResult, text: string, textJson: string): string | undefined {
  const lazy = (result as Partial<LazyResult<LazyOutput | LazyText>>)[LAZY]
  if (lazy === undefined) return undefined
  return lazy instanceof LazyText ? (lazy.textIsJson ? text : textJson) : lazy.outputJson
}

/**
 * Builds the ToolResult of a mapped 2xx reply. A non-string output longer than
 * EAGER_OUTPUT_CHARS is parsed from its JSON only when someone reads `output` (the HTTP route
 * never does), and at most once; a large text (`textBytes`) is decoded on each read of `text`. A
 * tool error's output is the `output` member of its text (`{"error":…,"output":…}`), read the
 * same lazy way.
 */
export function mappedReplyResult (text: string, textIsJson: boolean, toolError: string,
  images?: readonly string[], textBytes?: Uint8Array): ToolResult {
  let result: ToolResult
  if (textBytes !== undefined) {
    // A large success: its text is built from the bytes when first read, never before, so a
    // caller that only passes the result on never holds it as a string.
    result = lazyTextResult(textBytes, textIsJson)
  } else if (toolError !== '') {
    // The worker wrote the text as `{"error":<JSON string>,"output":<JSON>}` (src/shared/reply.ts).
    const head = `{"error":${JSON.stringify(toolError)},"output":`
    result = text.startsWith(head)
      ? lazyOutputResult(true, text.slice(head.length, -1), text, toolError)
      : { is_error: true, output: null, error: toolError, text }
  } else if (!textIsJson) {
    result = { is_error: false, output: text, text }
  } else {
    // A small output is parsed at once: for ~100 B a plain object costs about half of a lazy one
    // (0.35 µs measured against 0.6–0.9 µs).
    result = text.length <= EAGER_OUTPUT_CHARS
      ? { is_error: false, output: JSON.parse(text), text }
      : lazyOutputResult(false, text, text, undefined)
  }
  if (images !== undefined && images.length > 0) result.images = toolImages(images)
  return result
}

/** `{ is_error, output (parsed on first read), text, error? }`: the properties in that order. */
function lazyOutputResult (isError: boolean, outputJson: string, text: string, error: string | undefined): ToolResult {
  const result = { is_error: isError } as ToolResult
  Object.defineProperty(result, LAZY, { value: new LazyOutput(outputJson) })
  Object.defineProperties(result, LAZY_OUTPUT)
  result.text = text
  if (error !== undefined) result.error = error
  return result
}

/**
 * `{ is_error: false, output, text }` with the text decoded from `bytes` on each read, never kept:
 * a large string kept by the result would be one more object for each reader to hold. Readers
 * read it once or twice.
 */
function lazyTextResult (bytes: Uint8Array, textIsJson: boolean): ToolResult {
  const result = { is_error: false } as ToolResult
  Object.defineProperty(result, LAZY, { value: new LazyText(bytes, textIsJson) })
  Object.defineProperties(result, LAZY_TEXT)
  return result
}

/** The flat image parts of an outcome (mime, data, prompt per image) as ToolImages. */
function toolImages (parts: readonly string[]): ToolImage[] {
  const images: ToolImage[] = []
  for (let i = 0; i + 2 < parts.length; i += 3) {
    // checkImages wrote the type the data's bytes say: one of IMAGE_MIME_TYPES.
    const image: ToolImage = { mime_type: parts[i] as ImageMimeType, data_base64: parts[i + 1] as string }
    const prompt = parts[i + 2] as string
    if (prompt !== '') image.prompt = prompt
    images.push(image)
  }
  return images
}

/**
 * Reads a 2xx reply body (R10–R12; see src/shared/reply.ts for the rules). The pool maps replies
 * in the worker; this is the same reading for a body at hand.
 */
export function replyToResult (body: string | Uint8Array, contentType: string): ToolResult {
  const mapped = mapReply(body, contentType)
  return mappedReplyResult(mapped.text, mapped.textIsJson, mapped.toolError, mapped.images)
}

/** `output` as the model reads it: a string as-is, anything else as JSON. */
export function outputText (output: unknown): string {
  if (typeof output === 'string') return output
  if (output === undefined) return ''
  return safeStringify(output)
}

function formatSeconds (ms: number): string {
  const s = ms / 1000
  return Number.isInteger(s) ? String(s) : s.toFixed(3).replace(/0+$/, '')
}
