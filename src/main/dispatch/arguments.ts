// Tool arguments: parse the model's text once, then check it against the tool's `parameters`.
//
// Validators are compiled lazily, on a tool's first call, and cached on its (shared, immutable)
// ToolEntry, so a registration fanned out to many roles compiles once. A schema that does not
// compile disables validation for that tool, with one warning, rather than making it uncallable:
// the plugin's callback still sees and can reject the arguments.
import { Ajv, type ErrorObject } from 'ajv'
import type { ArgumentsValidator, ToolEntry } from '../roles/tool-registry.js'
import { errorText } from '../../shared/util.js'

const ajv = new Ajv({ allErrors: false, strict: false, validateFormats: false, allowUnionTypes: true })

/** Either the parsed arguments and their JSON text, or a message the model can act on. */
export type ParsedArguments =
  | { ok: true, value: unknown, raw: string }
  | { ok: false, error: string }

/**
 * Reads a call's arguments: `raw_arguments` (the model's text) wins when present; otherwise
 * `arguments` (already parsed; an absent value means `{}`). The JSON text is produced once here
 * and reused as-is in the callback body.
 */
export function readArguments (rawArguments: string | undefined, args: unknown): ParsedArguments {
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
    return { ok: true, value, raw }
  } catch (err) {
    return { ok: false, error: `arguments cannot be encoded as JSON: ${errorText(err)}` }
  }
}

/**
 * Checks `value` against the tool's `parameters`; returns '' when valid, else a message naming
 * the problem. `onBadSchema` is called once per tool whose schema does not compile.
 */
export function checkArguments (entry: ToolEntry, value: unknown, onBadSchema: (entry: ToolEntry, message: string) => void): string {
  let validator = entry.validator
  if (validator === undefined) {
    validator = compileValidator(entry, onBadSchema)
    entry.validator = validator
  }
  return validator === null ? '' : validator(value)
}

function compileValidator (entry: ToolEntry, onBadSchema: (entry: ToolEntry, message: string) => void): ArgumentsValidator | null {
  try {
    // Compile without caching the schema in ajv (a replaced tool must not keep its old schema alive).
    const validate = ajv.compile(entry.parameters)
    ajv.removeSchema(entry.parameters)
    return function validateArguments (value: unknown): string {
      if (validate(value)) return ''
      return `arguments do not match the tool's parameters: ${describeErrors(validate.errors)}`
    }
  } catch (err) {
    onBadSchema(entry, errorText(err))
    return null
  }
}

function describeErrors (errors: ErrorObject[] | null | undefined): string {
  if (errors == null || errors.length === 0) return 'invalid'
  return errors.slice(0, 5).map((e) => `${e.instancePath === '' ? '(root)' : e.instancePath} ${e.message ?? 'is invalid'}`).join('; ')
}
