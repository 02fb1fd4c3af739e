// Callback reply → ToolResult → the text a model reads (SPEC R10–R12, DESIGN "Model-visible result").
import type { CallOutcome } from '../../workers/protocol.js'

/** What a tool call returns to the model session (DESIGN "Core contracts"). */
export interface ToolResult {
  is_error: boolean
  /** The JSON value the callback returned (or its text); null for errors. */
  output: unknown
  /** Set when `is_error`. */
  error?: string
  /** What a text-only model session reads: the output (a string as-is, else JSON), or `{"error": …}`. */
  text: string
}

/** Builds an error result; `text` is `{"error":"…"}` so the model sees a uniform shape. */
export function errorResult (error: string): ToolResult {
  return { is_error: true, output: null, error, text: JSON.stringify({ error }) }
}

/** Builds a success result from an output value. */
export function outputResult (output: unknown): ToolResult {
  return { is_error: false, output, text: outputText(output) }
}

/** The facts about the tool that error messages mention. */
export interface ResultContext {
  name: string
  timeoutMs: number
  maxResponseBytes: number
}

/** Maps a worker's flat outcome to the ToolResult the model sees. */
export function outcomeToResult (outcome: CallOutcome, tool: ResultContext): ToolResult {
  switch (outcome.kind) {
    case 'ok':
      return replyToResult(outcome.text, outcome.contentType)
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
      return errorResult(`tool '${tool.name}' replied with more than ${tool.maxResponseBytes} bytes`)
    case 'cancelled':
      return errorResult(`tool '${tool.name}' call was cancelled`)
    case 'busy':
      return errorResult(`tool '${tool.name}' was not called: Toolport is busy, try again shortly`)
    case 'refused':
      return errorResult(`tool '${tool.name}' was not called: its callback URL is not a loopback address`)
    case 'internal':
      return errorResult(`tool '${tool.name}' failed: internal error in Toolport (${outcome.message})`)
  }
}

/**
 * Reads a 2xx reply body. A JSON object with `output` or `is_error` is the envelope (R10, R11);
 * any other JSON value is the output itself; a non-JSON body is text output (R12); empty is "".
 */
export function replyToResult (body: string, contentType: string): ToolResult {
  if (body === '') return { is_error: false, output: '', text: '' }
  let parsed: unknown
  if (looksLikeJson(body, contentType)) {
    try {
      parsed = JSON.parse(body)
    } catch {
      return { is_error: false, output: body, text: body }
    }
  } else {
    return { is_error: false, output: body, text: body }
  }
  if (typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed) &&
      (Object.hasOwn(parsed, 'output') || Object.hasOwn(parsed, 'is_error'))) {
    const envelope = parsed as { output?: unknown, is_error?: unknown, error?: unknown }
    if (envelope.is_error === true) return errorResult(envelopeError(envelope))
    return outputResult(envelope.output === undefined ? null : envelope.output)
  }
  // The body already is the output's JSON: reuse it as the model's text instead of re-encoding
  // (and a 100 000-deep reply that JSON.stringify could not encode still reads fine).
  return { is_error: false, output: parsed, text: typeof parsed === 'string' ? parsed : body }
}

function envelopeError (envelope: { output?: unknown, error?: unknown }): string {
  if (typeof envelope.error === 'string') return envelope.error
  if (envelope.error !== undefined && envelope.error !== null) return safeStringify(envelope.error)
  if (typeof envelope.output === 'string') return envelope.output
  if (envelope.output !== undefined && envelope.output !== null) return safeStringify(envelope.output)
  return 'tool reported an error'
}

/** `output` as the model reads it: a string as-is, anything else as JSON. */
export function outputText (output: unknown): string {
  if (typeof output === 'string') return output
  if (output === undefined) return ''
  return safeStringify(output)
}

function safeStringify (value: unknown): string {
  try {
    return JSON.stringify(value) ?? ''
  } catch {
    // Too deep to encode (RangeError) or not encodable (BigInt): say so instead of crashing.
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

function formatSeconds (ms: number): string {
  const s = ms / 1000
  return Number.isInteger(s) ? String(s) : s.toFixed(3).replace(/0+$/, '')
}
