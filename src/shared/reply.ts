// A callback's 2xx reply body → what the model reads (docs/protocol.md R10–R12, "Model-visible
// result"). Pure and shared by both threads: in pool mode it runs in the worker, so the main
// thread receives finished strings and never parses a reply it only passes on.
//
// The body arrives as bytes and is decoded once, and only the part the model reads: a strict
// validity scan over the bytes (src/shared/json-scan.ts) decides "is this JSON?" and where the
// envelope's `output` lies, and that slice is forwarded as text without building the value.
import { JsonScanner, RootMember } from './json-scan.js'
import { checkImages, DEFAULT_IMAGE_LIMITS, type ImageLimits } from './images.js'

/** The model-visible reading of a 2xx reply. */
export interface MappedReply {
  /**
   * What a text-only model reads: the output (a string as-is, else its JSON), or for a tool error
   * `{"error": …, "output": …}` (`output` only when the reply had a non-null one).
   */
  text: string
  /** True when `text` is the output's JSON (a non-string output); false when it is the string output or an error. */
  textIsJson: boolean
  /** The tool-level error message (R11), or '' on success. */
  toolError: string
  /**
   * The images passed on, flat: mime type, base64 data, prompt ('' when none), for each image.
   * Present only when the reply carried at least one good image, so that every other reply keeps
   * the three-field shape.
   */
  images?: string[]
  /**
   * Set only when the caller asked for it (`largeText`) and the text is at least that many bytes:
   * the text as UTF-8 bytes (a view into the body, to be decoded without BOM stripping), and
   * `text` is ''. The worker thread hands such texts to the main thread as bytes, so a large reply
   * is never built as a string on the thread that only passes it on.
   */
  bytes?: Uint8Array
}

const EMPTY: MappedReply = Object.freeze({ text: '', textIsJson: false, toolError: '' })

// BOM-stripping, non-fatal UTF-8 decoding, as the WHATWG `decode` does; invalid bytes become
// U+FFFD. Stateless between calls because each decode() is given a whole body or slice.
const utf8 = new TextDecoder('utf-8')
// For slices inside a body: a U+FEFF that starts a string value is content, not a BOM.
const utf8Slice = new TextDecoder('utf-8', { ignoreBOM: true })
// One scanner per thread: scan() is synchronous, and the spans are read right after it.
const scanner = new JsonScanner()

const WARNINGS_KEY = '"_image_warnings":'

/**
 * Reads a 2xx reply body. A JSON object with `output` or `is_error` is the envelope (R10, R11),
 * and `is_error` counts only when it is the JSON value `true`; any other JSON value is the output
 * itself; a non-JSON body is text output (R12); an empty body is "". The envelope's `images` are
 * checked against `limits` (src/shared/images.ts); problems go to the model as `_image_warnings`
 * in the output.
 *
 * @example
 * readReply(Buffer.from('{"output":{"t":28},"is_error":false}'), 'application/json') // { text: '{"t":28}', textIsJson:
 * true, toolError: '' }
 */
export function readReply (body: Uint8Array, contentType: string,
  limits: ImageLimits = DEFAULT_IMAGE_LIMITS, largeText = Number.POSITIVE_INFINITY): MappedReply {
  if (body.length === 0) return EMPTY
  if (!looksLikeJson(body, contentType) || !scanner.scan(body)) return wholeBody(body, false, largeText)
  const root = body[scanner.rootStart]
  if (root === 0x7b && (has(RootMember.output) || has(RootMember.isError))) {
    return readEnvelope(body, limits, largeText)
  }
  if (root === 0x22) return stringReply(body, scanner.rootStart, scanner.rootEnd, scanner.lastStringEscaped, largeText)
  // The body already is the output's JSON: reuse it as the model's text instead of re-encoding
  // (and a 100 000-deep reply that JSON.stringify could not encode still reads fine).
  return wholeBody(body, true, largeText)
}

/** The whole body as the text, decoded as `utf8` does (one leading BOM dropped). */
function wholeBody (body: Uint8Array, textIsJson: boolean, largeText: number): MappedReply {
  if (body.length < largeText) return { text: utf8.decode(body), textIsJson, toolError: '' }
  const hasBom = body.length >= 3 && body[0] === 0xef && body[1] === 0xbb && body[2] === 0xbf
  return { text: '', textIsJson, toolError: '', bytes: hasBom ? body.subarray(3) : body }
}

/** A validated JSON string value as the text (a string output). */
function stringReply (body: Uint8Array, start: number, end: number, isEscaped: boolean,
  largeText: number): MappedReply {
  if (!isEscaped && end - start - 2 >= largeText) {
    return { text: '', textIsJson: false, toolError: '', bytes: body.subarray(start + 1, end - 1) }
  }
  return { text: stringValue(body, start, end, isEscaped), textIsJson: false, toolError: '' }
}

/**
 * `readReply` for a body at hand as a string (tests, the micro bench, embedders that fetched a
 * reply themselves); encodes it as UTF-8 first.
 */
export function mapReply (body: string | Uint8Array, contentType: string,
  limits: ImageLimits = DEFAULT_IMAGE_LIMITS): MappedReply {
  return readReply(typeof body === 'string' ? Buffer.from(body, 'utf8') : body, contentType, limits)
}

function has (member: RootMember): boolean {
  return scanner.memberStart[member] !== -1
}

function readEnvelope (body: Uint8Array, limits: ImageLimits, largeText: number): MappedReply {
  const isError = isTrue(body, RootMember.isError)
  let images: string[] | undefined
  let warnings = ''
  if (has(RootMember.images) && !isNull(body, RootMember.images)) {
    // Rare and small next to the output: built as a value to be checked.
    const checked = checkImages(JSON.parse(slice(body, RootMember.images)), limits)
    if (checked.parts.length > 0) images = checked.parts
    if (checked.warnings.length > 0) warnings = JSON.stringify(checked.warnings)
  }
  const outputKind = has(RootMember.output) ? body[scanner.memberStart[RootMember.output] as number] : undefined
  const outputIsNull = outputKind === undefined || isNull(body, RootMember.output)
  if (!isError && warnings === '' && !outputIsNull) {
    // The common success: the output's own bytes are the text (or, for a string, its content).
    const start = scanner.memberStart[RootMember.output] as number
    const end = scanner.memberEnd[RootMember.output] as number
    const mapped = outputKind === 0x22
      ? stringReply(body, start, end, scanner.memberEscaped[RootMember.output] === 1, largeText)
      : end - start >= largeText
        ? { text: '', textIsJson: true, toolError: '', bytes: body.subarray(start, end) }
        : { text: utf8Slice.decode(body.subarray(start, end)), textIsJson: true, toolError: '' }
    if (images !== undefined) mapped.images = images
    return mapped
  }
  const outputJson = outputIsNull ? '' : slice(body, RootMember.output)
  let mapped: MappedReply
  if (isError) {
    const error = envelopeError(body, outputJson, outputKind)
    const output = warnings === '' ? outputJson : withWarnings(outputJson, outputKind, warnings)
    mapped = {
      text: output === '' ? `{"error":${JSON.stringify(error)}}` : `{"error":${JSON.stringify(error)},"output":${output}}`,
      textIsJson: false,
      toolError: error
    }
  } else if (warnings !== '') {
    mapped = { text: withWarnings(outputJson, outputKind, warnings), textIsJson: true, toolError: '' }
  } else {
    mapped = { text: 'null', textIsJson: true, toolError: '' }
  }
  if (images !== undefined) mapped.images = images
  return mapped
}

/**
 * R11's message: `error` (a string as-is, else its JSON), else the output (a string as-is, else its
 * JSON), else a fixed text. JSON is the reply's own text without whitespace: no parse and
 * re-encode, whose recursion would depend on the thread's stack (a 5 000-level output encoded in
 * a worker but not on the main thread).
 */
function envelopeError (body: Uint8Array, outputJson: string, outputKind: number | undefined): string {
  if (has(RootMember.error) && !isNull(body, RootMember.error)) {
    const start = scanner.memberStart[RootMember.error] as number
    const end = scanner.memberEnd[RootMember.error] as number
    if (body[start] === 0x22) {
      const error = stringValue(body, start, end, scanner.memberEscaped[RootMember.error] === 1)
      if (error !== '') return error
    } else {
      return compactJson(utf8Slice.decode(body.subarray(start, end)))
    }
  }
  if (outputJson !== '') {
    if (outputKind === 0x22) {
      const output = JSON.parse(outputJson) as string
      if (output !== '') return output
    } else {
      return compactJson(outputJson)
    }
  }
  return 'tool reported an error'
}

/**
 * The output with the image warnings beside it, as JSON: an object gains `_image_warnings`; no
 * output becomes `{"_image_warnings": […]}`; any other value is wrapped as `{"output": …}`.
 */
function withWarnings (outputJson: string, outputKind: number | undefined, warnings: string): string {
  if (outputJson === '') return `{${WARNINGS_KEY}${warnings}}`
  if (outputKind === 0x7b) {
    const inner = outputJson.slice(1, -1)
    return inner.trim() === '' ? `{${WARNINGS_KEY}${warnings}}` : `{${inner},${WARNINGS_KEY}${warnings}}`
  }
  return `{"output":${outputJson},${WARNINGS_KEY}${warnings}}`
}

function slice (body: Uint8Array, member: RootMember): string {
  return utf8Slice.decode(body.subarray(scanner.memberStart[member] as number, scanner.memberEnd[member] as number))
}

function isTrue (body: Uint8Array, member: RootMember): boolean {
  const start = scanner.memberStart[member] as number
  return start !== -1 && scanner.memberEnd[member] === start + 4 &&
    body[start] === 0x74 // t(rue): the scan validated the rest
}

function isNull (body: Uint8Array, member: RootMember): boolean {
  const start = scanner.memberStart[member] as number
  return start !== -1 && body[start] === 0x6e // n(ull)
}

/**
 * The text held as bytes by a reply read with `largeText` (`MappedReply.bytes`, which becomes
 * `CallOutcome.textBytes`): a slice of the body, so a leading U+FEFF is content, not a BOM.
 */
export function decodeReplyText (bytes: Uint8Array): string {
  return utf8Slice.decode(bytes)
}

/** The value of the validated JSON string at `body[start, end)`; decoded directly when it has no escapes. */
function stringValue (body: Uint8Array, start: number, end: number, isEscaped: boolean): string {
  if (!isEscaped) return utf8Slice.decode(body.subarray(start + 1, end - 1))
  return JSON.parse(utf8Slice.decode(body.subarray(start, end))) as string
}

/**
 * Validated JSON text without the whitespace between its tokens (strings kept as written), in one
 * pass that needs no stack however deep the value.
 */
export function compactJson (json: string): string {
  let out = ''
  let from = 0
  let inString = false
  for (let i = 0; i < json.length; i++) {
    const c = json.charCodeAt(i)
    if (inString) {
      if (c === 0x5c) i++ // \ escapes the next character
      else if (c === 0x22) inString = false
    } else if (c === 0x22) {
      inString = true
    } else if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) {
      if (i > from) out += json.slice(from, i)
      from = i + 1
    }
  }
  return from === 0 ? json : out + json.slice(from)
}

/** JSON text of a value, or a JSON string saying it could not be encoded (too deep, BigInt). */
export function safeStringify (value: unknown): string {
  try {
    return JSON.stringify(value) ?? 'null'
  } catch {
    return '"[output could not be encoded as JSON]"'
  }
}

function looksLikeJson (body: Uint8Array, contentType: string): boolean {
  if (contentType.includes('json')) return true
  // Some plugins reply JSON as text/plain or with no type; sniff the first significant byte
  // (after a UTF-8 BOM and JSON whitespace).
  let i = body.length >= 3 && body[0] === 0xef && body[1] === 0xbb && body[2] === 0xbf ? 3 : 0
  while (i < body.length && (body[i] === 0x20 || body[i] === 0x0a || body[i] === 0x0d || body[i] === 0x09)) i++
  const first = body[i]
  // { [ " - 0-9 t f n
  return first === 123 || first === 91 || first === 34 || first === 45 || (first !== undefined && first >= 48 &&
    first <= 57) ||
    first === 116 || first === 102 || first === 110
}
