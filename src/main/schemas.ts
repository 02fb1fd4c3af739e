// zod schemas of every request body and query, and the one place where wire names
// (`callback_url`, `timeout_seconds`) map to code names (`callbackUrl`, `timeoutMs`).
import { z } from 'zod'
import { checkCallbackUrl, type CallbackUrlParts } from '../shared/loopback.js'
import { validationError, type ErrorDetail, type ToolportError } from './errors.js'
import { codePointLength, isPlainObject, isWellFormedText } from '../shared/util.js'
import { nonFiniteNumberPath } from '../shared/json-schema.js'

/** A JSON Schema object, as given by a plugin (kept as-is, shown to the model). */
export type JsonSchemaObject = Record<string, unknown>

/**
 * docs/protocol.md R7: `name` is 1–64 characters; counted in Unicode code points, not UTF-16 units.
 * Well-formed Unicode too, as role names: a lone surrogate has no UTF-8 form, so two such names
 * would be one and the same in every UTF-8 text Toolport writes (a metric label, a log line).
 */
const toolName = z.string().superRefine((s, ctx) => {
  // A length issue as zod's own min/max report one (`too_small`/`too_big`), counted in code points.
  const n = codePointLength(s)
  const message = 'must be 1 to 64 characters'
  if (n < 1) ctx.addIssue({ code: 'too_small', origin: 'string', minimum: 1, inclusive: true, input: s, message })
  else if (n > 64) ctx.addIssue({ code: 'too_big', origin: 'string', maximum: 64, inclusive: true, input: s, message })
})
  .refine(isWellFormedText, { message: 'must be well-formed Unicode (no lone surrogates)' })
  // For the document: JSON Schema counts a string's length in code points too.
  .meta({ minLength: 1, maxLength: 64 })

const roleField = z.string().min(1, { message: 'must be a non-empty string or null' }).nullable().default(null)

const sourceField = z.string()
  .min(1, { message: 'must be a non-empty string' })
  .max(256, { message: 'must be at most 256 characters' })

/** `timeout_seconds`: a number > 0 and ≤ 300; a numeric string is accepted, booleans are not. */
const timeoutSeconds = z.union([
  z.number(),
  // Blanks around the number are allowed in the pattern itself (Number() skips the same ones), so
  // that the OpenAPI document's pattern accepts what the route does.
  z.string().regex(/^\s*[+]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$/, { message: 'must be a number' }).transform(Number)
], { error: 'must be a number greater than 0 and at most 300' })
  .pipe(z.number().gt(0, { message: 'must be greater than 0' }).lte(300, { message: 'must be at most 300' }))
  // For the document: the bounds a number must keep (JSON Schema applies them to numbers only).
  .meta({ exclusiveMinimum: 0, maximum: 300 })

const parametersField = z.custom<JsonSchemaObject>(isPlainObject, { message: 'must be a JSON object (a JSON Schema)' })

const callbackUrl = z.string().transform((value, ctx): CallbackUrlParts => {
  const verdict = checkCallbackUrl(value)
  if (verdict.ok) return verdict.parts
  ctx.addIssue({ code: 'custom', message: verdict.problem, params: { reason: 'callback_url' } })
  return z.NEVER
})

/** POST /api/tools/register (docs/protocol.md "Register"). */
export const registerSchema = z.object({
  name: toolName.describe('the tool name the model calls, 1–64 characters'),
  // The configurable, tighter cap (limits.maxDescriptionChars) is checked in registrationProblems.
  description: z.string().max(1024 * 1024, { message: 'must be at most 1048576 characters' }).default('')
    .describe('shown to the model; at most limits.maxDescriptionChars characters (default 16384)'),
  parameters: parametersField.default(() => ({ type: 'object', properties: {} }))
    .describe('JSON Schema object of the arguments; at most limits.maxParametersBytes bytes of JSON (default 65536) and limits.maxParametersDepth levels (default 32)'),
  callback_url: callbackUrl.describe('http(s) URL on localhost, 127.0.0.0/8, [::1] or [::ffff:127.x.y.z]'),
  role: roleField.describe('an existing role, or null for every current role'),
  source: sourceField.default('external').describe('lifecycle tag for clear; plugins use plugin:<id>'),
  timeout_seconds: timeoutSeconds.default(30).describe('greater than 0 and at most 300')
})
export type RegisterInput = z.input<typeof registerSchema>
export type RegisterRequest = z.output<typeof registerSchema>

/**
 * `Role.registerLocalTool` options: the same field rules as a registration (name, parameters,
 * source, timeout), in the library's camelCase, with an in-process handler instead of a URL.
 */
export const localToolSchema = z.strictObject({
  name: toolName,
  description: z.string().max(1024 * 1024).default(''),
  parameters: parametersField.default(() => ({ type: 'object', properties: {} })),
  source: sourceField.default('local'),
  timeoutSeconds: z.number().gt(0, { message: 'must be greater than 0' }).lte(300,
    { message: 'must be at most 300' }).default(30),
  handler: z.custom<(...args: never[]) => unknown>((value) => typeof value === 'function',
    { message: 'must be a function' })
})

/** POST /api/tools/unregister (docs/protocol.md R15, R17). */
export const unregisterSchema = z.object({
  name: toolName,
  role: roleField,
  /** Beyond the contract: remove only where the tool still belongs to this source. */
  expected_source: sourceField.optional()
})
export type UnregisterInput = z.input<typeof unregisterSchema>
export type UnregisterRequest = z.output<typeof unregisterSchema>

/** POST /api/tools/clear (docs/protocol.md R16, R17). */
export const clearSchema = z.object({
  source: sourceField,
  role: roleField
})
export type ClearInput = z.input<typeof clearSchema>
export type ClearRequest = z.output<typeof clearSchema>

/**
 * GET /api/tools?role=&source=&name= (docs/protocol.md R18). `name` may be repeated; the query
 * parser gives one value as a string and several as an array, and `names` is always an array.
 */
export const listQuerySchema = z.object({
  role: z.string().min(1).optional().describe('one role; every current role when absent'),
  source: sourceField.optional().describe('only the tools of this source'),
  name: z.union([toolName, z.array(toolName)]).optional()
    .describe('only the tools of this name; repeat it for several (?name=a&name=b)')
}).transform(({ role, source, name }) => ({
  role,
  source,
  names: name === undefined ? undefined : typeof name === 'string' ? [name] : name
}))

/** POST /api/tools/call: a model's tool call, for hosts and tests that drive calls over HTTP. */
export const callSchema = z.object({
  role: z.string().min(1),
  name: z.string().min(1),
  call_id: z.string().min(1).max(256).optional(),
  arguments: z.unknown().optional(),
  raw_arguments: z.string().optional()
})
export type CallRequest = z.output<typeof callSchema>

/** The size limits a registration is held to (a subset of the `limits` options). */
export interface RegistrationLimits {
  maxParametersBytes: number
  maxParametersDepth: number
  maxDescriptionChars: number
}

/**
 * Checks a parsed registration (or local tool) against the configured size limits (none when
 * `limits` is undefined) and returns the registry's own copy of its `parameters`, parsed from the
 * very JSON text that was measured: the caller of the library may go on using (or changing) its
 * object, and what is listed and compiled stays what was checked. Throws a 422 `ToolportError`
 * naming every problem. The depth walk is iterative and runs before anything is encoded, so a
 * hostile schema cannot exhaust the stack.
 */
export function checkedParameters (request: Pick<RegisterRequest, 'description' | 'parameters'>,
  limits: RegistrationLimits | undefined): JsonSchemaObject {
  const problems: ErrorDetail[] = []
  if (limits !== undefined && request.description.length > limits.maxDescriptionChars) {
    problems.push({
      path: 'description',
      code: 'too_big',
      message: `must be at most ${limits.maxDescriptionChars} characters`
    })
  }
  let text = ''
  if (limits !== undefined && jsonDepth(request.parameters, limits.maxParametersDepth) > limits.maxParametersDepth) {
    problems.push({
      path: 'parameters',
      code: 'too_deep',
      message: `must nest at most ${limits.maxParametersDepth} levels`
    })
  } else {
    // JSON text such as 1e400 parses to Infinity, which the copy below would turn into null:
    // the schema kept would not be the schema sent (`{"enum": [1e400]}` would be `{"enum": [null]}`).
    const unrepresentable = nonFiniteNumberPath(request.parameters)
    if (unrepresentable !== null) {
      problems.push({
        path: 'parameters',
        code: 'invalid_schema',
        message: 'the schema cannot be used to validate arguments: ' +
          `${unrepresentable} is a number outside the range of a double (such as 1e400)`
      })
    }
    text = JSON.stringify(request.parameters)
    if (limits !== undefined && Buffer.byteLength(text) > limits.maxParametersBytes) {
      problems.push({
        path: 'parameters',
        code: 'too_big',
        message: `must be at most ${limits.maxParametersBytes} bytes of JSON`
      })
    }
  }
  if (problems.length > 0) throw validationError(problems)
  return JSON.parse(text) as JsonSchemaObject
}

/** Nesting depth of a JSON value (objects and arrays), counted iteratively; stops past `limit`. */
export function jsonDepth (value: unknown, limit: number): number {
  let max = 0
  const stack: Array<[unknown, number]> = [[value, 1]]
  while (stack.length > 0) {
    const [node, depth] = stack.pop() as [unknown, number]
    if (typeof node !== 'object' || node === null) continue
    if (depth > max) {
      max = depth
      if (max > limit) return max
    }
    for (const child of Object.values(node)) {
      if (typeof child === 'object' && child !== null) stack.push([child, depth + 1])
    }
  }
  return max
}

/** Parses `input` or throws a 422 TP_ERR_VALIDATION listing every problem with its field. */
export function parseOrThrow<T extends z.ZodType> (schema: T, input: unknown): z.output<T> {
  if (!isPlainObject(input)) {
    throw validationError([{ path: '', code: 'invalid_type', message: 'the body must be a JSON object' }])
  }
  const result = schema.safeParse(input)
  if (result.success) return result.data
  throw toValidationError(result.error)
}

/** Maps zod issues to `details` entries `{ path, code, message }`. */
export function toValidationError (error: z.ZodError): ToolportError {
  const details: ErrorDetail[] = error.issues.map((issue) => ({
    path: issue.path.map(String).join('.'),
    code: issue.code,
    message: issue.message
  }))
  return validationError(details)
}

// Response shapes. They document the API (OpenAPI at /openapi.json), give fastify the JSON
// Schemas it compiles into fast serializers, and are the Runtime's result types (inferred below,
// so each shape is written once); a test checks that real answers match these.
const failedRole = z.object({
  role: z.string(),
  error: z.string(),
  owned_by: z.string().optional().describe('the source that owns the tool, when the role refused the change')
})
const refusedRole = z.object({ role: z.string(), owned_by: z.string() })
const roleNames = z.array(z.string())

export const registerResultSchema = z.object({
  ok: z.boolean().describe('true when at least one role accepted the registration (docs/protocol.md R8)'),
  registered: z.string(),
  affected_roles: roleNames.describe('roles that took the change, sessions synced'),
  failed_roles: z.array(failedRole).describe('roles that did not take it, with the reason'),
  error: z.string().optional().describe('why nothing accepted it, when ok is false')
})

export const unregisterResultSchema = z.object({
  ok: z.boolean(),
  removed: z.boolean(),
  affected_roles: roleNames,
  failed_roles: z.array(failedRole),
  refused_roles: z.array(refusedRole)
    .describe('roles skipped because the tool belongs to another source (expected_source) or is local')
})

export const clearResultSchema = z.object({
  ok: z.boolean(),
  removed: z.number().int().describe('tools removed, summed over roles'),
  affected_roles: roleNames,
  failed_roles: z.array(failedRole)
})

const toolListing = z.object({
  name: z.string(),
  description: z.string(),
  source: z.string(),
  callback_url: z.string().nullable(),
  is_remote: z.boolean()
})

export const listResultSchema = z.object({
  ok: z.literal(true),
  tools_by_role: z.record(z.string(), z.array(toolListing)).describe('each role\'s tools in registration order')
})

export const toolResultSchema = z.object({
  is_error: z.boolean(),
  output: z.unknown().describe('the JSON value the callback returned (or its text); for a tool error the reply\'s ' +
    '`output` (null when it had none); null for every other error. Image problems appear in it as `_image_warnings`'),
  error: z.string().optional(),
  text: z.string().describe('what a text-only model reads: the output as text, or {"error": …, "output": …} ' +
    '(`output` only when the error reply had a non-null one)'),
  images: z.array(z.object({
    mime_type: z.enum(['image/png', 'image/jpeg', 'image/webp', 'image/gif']),
    data_base64: z.string().describe('standard padded base64'),
    prompt: z.string().optional().describe('the plugin\'s vision_prompt for this image')
  })).optional().describe('the images the tool returned that passed the checks; absent when none')
})

export const errorBodySchema = z.object({
  ok: z.literal(false),
  statusCode: z.number().int(),
  code: z.string().describe('a stable TP_ERR_* code'),
  error: z.string(),
  message: z.string(),
  details: z.array(z.object({ path: z.string(), code: z.string(), message: z.string() })).optional()
})

export const healthSchema = z.object({
  ok: z.boolean().describe('ready to serve (HTTP 200); false answers 503'),
  status: z.enum(['ready', 'starting', 'closed']),
  version: z.string(),
  instance_id: z.string().describe('random per process start: a change means Toolport restarted'),
  uptime_seconds: z.number().int(),
  roles: z.number().int(),
  tools: z.number().int().describe('registrations summed over roles'),
  dispatch: z.object({
    mode: z.enum(['pool', 'inline']),
    threads: z.number().int(),
    in_flight: z.number().int(),
    queued: z.number().int(),
    utilization: z.number()
  })
})

/**
 * A role that did not take a change (docs/protocol.md R8: objects): its sessions failed to sync, or
 * (ownership mode, local tools) it refused the registration; `owned_by` then names the tool's owner.
 */
export type FailedRole = z.output<typeof failedRole>
/** A role skipped because its tool belongs to another source (`expected_source`, local tools). */
export type RefusedRole = z.output<typeof refusedRole>
/** Result of `register` (docs/protocol.md R8); `error` is set when `ok` is false: why nothing accepted it. */
export type RegisterResult = z.output<typeof registerResultSchema>
/** Result of `unregister` (docs/protocol.md R15, R17). */
export type UnregisterResult = z.output<typeof unregisterResultSchema>
/** Result of `clear` (docs/protocol.md R16, R17). */
export type ClearResult = z.output<typeof clearResultSchema>
/**
 * GET /api/health: liveness and readiness. `instance_id` is random per process start: a client
 * that sees it change knows Toolport restarted.
 */
export type HealthReport = z.output<typeof healthSchema>
