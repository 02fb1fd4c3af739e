// Tool arguments: parse the model's text once, then check it against the tool's `parameters`.
//
// The validator was compiled when the tool was registered (dispatch/validators.ts): a schema
// Toolport cannot validate is refused then, so every registered tool validates its arguments.
import type { ToolEntry } from '../roles/tool-registry.js'
import { errorText } from '../../shared/util.js'

/** Either the parsed arguments and their JSON text, or a message the model can act on. */
export type ParsedArguments =
  | { ok: true, value: unknown, raw: string }
  | { ok: false, error: string }

/**
 * Reads a call's arguments: `raw_arguments` (the model's text) wins when present; otherwise
 * `arguments` (already parsed; an absent value means `{}`). The JSON text is produced once here
 * and reused as-is in the callback body.
 *
 * `arguments` is checked (and handed to a local handler) in its JSON form, read back from that
 * text: what the callback receives is what was checked. A caller's value may not survive JSON
 * (`NaN` becomes `null`, a `Map` becomes `{}`, a `toJSON()` replaces its object), and a check of
 * the value itself would pass arguments the callback then receives in another shape.
 */
export function readArguments (rawArguments: string | undefined, args: unknown, isFromJson = false): ParsedArguments {
  if (typeof rawArguments === 'string') {
    const text = rawArguments.trim() === '' ? '{}' : rawArguments
    try {
      return { ok: true, value: JSON.parse(text), raw: text }
    } catch (err) {
      return { ok: false, error: `arguments are not valid JSON: ${errorText(err)}` }
    }
  }
  const value = args === undefined ? {} : args
  try {
    const raw = JSON.stringify(value)
    if (raw === undefined) return { ok: false, error: 'arguments must be a JSON value' }
    // Read back, unless `args` was itself just parsed from JSON (the HTTP route, MCP): the same value.
    return { ok: true, value: isFromJson ? value : JSON.parse(raw), raw }
  } catch (err) {
    return { ok: false, error: `arguments cannot be encoded as JSON: ${errorText(err)}` }
  }
}

/**
 * Checks `value` against the tool's `parameters`; returns '' when valid, else a message naming the
 * problem. A check that takes long is charged to the tool's account; while that (or the thread's)
 * is overdrawn, checks are cut short, and a call so refused sets `entry.checkTime.refused`
 * (check-time.ts).
 */
export function checkArguments (entry: ToolEntry, value: unknown): string {
  return entry.validator(value, entry.checkTime)
}
