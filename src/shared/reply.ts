// A callback's 2xx reply body → what the model reads (docs/protocol.md R10–R12 and
// "Model-visible result"). Pure and shared by both threads: in pool mode it runs in the worker, so the main
// thread receives finished strings and never parses a reply it only passes on.

/** The model-visible reading of a 2xx reply. */
export interface MappedReply {
  /** What a text-only model reads: the output (a string as-is, else its JSON) or `{"error": …}`. */
  text: string
  /** True when `text` is the output's JSON (a non-string output); false when it is the string output. */
  textIsJson: boolean
  /** The tool-level error message (R11), or '' on success. */
  toolError: string
}

const EMPTY: MappedReply = Object.freeze({ text: '', textIsJson: false, toolError: '' })

// The envelope as JSON.stringify (no spaces) and Python's json.dumps (", " and ": ") write it.
const ENVELOPE_HEADS = ['{"output":', '{"output": ']
const ENVELOPE_TAILS = [',"is_error":false}', ', "is_error": false}']

/**
 * Reads a 2xx reply body. A JSON object with `output` or `is_error` is the envelope (R10, R11),
 * and `is_error` counts only when it is the JSON value `true`; any other JSON value is the output
 * itself; a non-JSON body is text output (R12); an empty body is "".
 */
export function mapReply (body: string, contentType: string): MappedReply {
  if (body === '') return EMPTY
  if (!looksLikeJson(body, contentType)) return { text: body, textIsJson: false, toolError: '' }
  const fast = canonicalEnvelope(body)
  if (fast !== null) return fast
  let parsed: unknown
  try {
    parsed = JSON.parse(body)
  } catch {
    return { text: body, textIsJson: false, toolError: '' }
  }
  if (typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed) &&
      (Object.hasOwn(parsed, 'output') || Object.hasOwn(parsed, 'is_error'))) {
    const envelope = parsed as { output?: unknown, is_error?: unknown, error?: unknown }
    if (envelope.is_error === true) {
      const error = envelopeError(envelope)
      return { text: JSON.stringify({ error }), textIsJson: false, toolError: error }
    }
    const output = envelope.output === undefined ? null : envelope.output
    if (typeof output === 'string') return { text: output, textIsJson: false, toolError: '' }
    return { text: safeStringify(output), textIsJson: true, toolError: '' }
  }
  // The body already is the output's JSON: reuse it as the model's text instead of re-encoding
  // (and a 100 000-deep reply that JSON.stringify could not encode still reads fine).
  if (typeof parsed === 'string') return { text: parsed, textIsJson: false, toolError: '' }
  return { text: body, textIsJson: true, toolError: '' }
}

/**
 * The common success envelope `{"output": V, "is_error": false}` without building V twice: if
 * the text between the fixed head and tail parses as one JSON value, the body is exactly that
 * two-key object, and the slice is the output's JSON (measured: parse + re-encode of a 64 KiB
 * envelope costs about twice a parse). Anything else (other keys, other order) returns null.
 */
function canonicalEnvelope (body: string): MappedReply | null {
  for (const head of ENVELOPE_HEADS) {
    if (!body.startsWith(head)) continue
    for (const tail of ENVELOPE_TAILS) {
      if (!body.endsWith(tail) || body.length < head.length + tail.length + 1) continue
      const slice = body.slice(head.length, body.length - tail.length)
      let output: unknown
      try {
        output = JSON.parse(slice)
      } catch {
        return null
      }
      if (typeof output === 'string') return { text: output, textIsJson: false, toolError: '' }
      return { text: output === null ? 'null' : slice.trim(), textIsJson: true, toolError: '' }
    }
  }
  return null
}

function envelopeError (envelope: { output?: unknown, error?: unknown }): string {
  if (typeof envelope.error === 'string' && envelope.error !== '') return envelope.error
  if (envelope.error !== undefined && envelope.error !== null && envelope.error !== '') return safeStringify(envelope.error)
  if (typeof envelope.output === 'string' && envelope.output !== '') return envelope.output
  if (envelope.output !== undefined && envelope.output !== null && envelope.output !== '') return safeStringify(envelope.output)
  return 'tool reported an error'
}

/** JSON text of a value, or a JSON string saying it could not be encoded (too deep, BigInt). */
export function safeStringify (value: unknown): string {
  try {
    return JSON.stringify(value) ?? 'null'
  } catch {
    return '"[output could not be encoded as JSON]"'
  }
}

function looksLikeJson (body: string, contentType: string): boolean {
  if (contentType.includes('json')) return true
  // Some plugins reply JSON as text/plain or with no type; sniff the first significant character.
  const first = body.trimStart().charCodeAt(0)
  // { [ " - 0-9 t f n
  return first === 123 || first === 91 || first === 34 || first === 45 || (first >= 48 && first <= 57) ||
    first === 116 || first === 102 || first === 110
}
