// A callback's 2xx reply body → what the model reads (SPEC R10–R12, DESIGN "Model-visible
// result"). Pure and shared by both threads: in pool mode it runs in the worker, so the main
// thread receives finished strings and never parses a reply it only passes on.

/** The model-visible reading of a 2xx reply. */
export interface MappedReply {
  /** What a text-only model reads: the output (a string as-is, else its JSON) or `{"error": …}`. */
  text: string
  /**
   * The output's JSON text, or '' when the output is the string `text` itself. For a tool-level
   * error it is 'null'.
   */
  outputJson: string
  /** The tool-level error message (R11), or '' on success. */
  toolError: string
}

const EMPTY: MappedReply = Object.freeze({ text: '', outputJson: '', toolError: '' })

/**
 * Reads a 2xx reply body. A JSON object with `output` or `is_error` is the envelope (R10, R11),
 * and `is_error` counts only when it is the JSON value `true`; any other JSON value is the output
 * itself; a non-JSON body is text output (R12); an empty body is "".
 */
export function mapReply (body: string, contentType: string): MappedReply {
  if (body === '') return EMPTY
  if (!looksLikeJson(body, contentType)) return { text: body, outputJson: '', toolError: '' }
  let parsed: unknown
  try {
    parsed = JSON.parse(body)
  } catch {
    return { text: body, outputJson: '', toolError: '' }
  }
  if (typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed) &&
      (Object.hasOwn(parsed, 'output') || Object.hasOwn(parsed, 'is_error'))) {
    const envelope = parsed as { output?: unknown, is_error?: unknown, error?: unknown }
    if (envelope.is_error === true) {
      const error = envelopeError(envelope)
      return { text: JSON.stringify({ error }), outputJson: 'null', toolError: error }
    }
    const output = envelope.output === undefined ? null : envelope.output
    if (typeof output === 'string') return { text: output, outputJson: '', toolError: '' }
    const json = safeStringify(output)
    return { text: json, outputJson: json, toolError: '' }
  }
  // The body already is the output's JSON: reuse it as the model's text instead of re-encoding
  // (and a 100 000-deep reply that JSON.stringify could not encode still reads fine).
  if (typeof parsed === 'string') return { text: parsed, outputJson: '', toolError: '' }
  return { text: body, outputJson: body, toolError: '' }
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
