// The options of `createPlugin`, checked once, up front, into a fixed-shape `ResolvedPluginOptions`.
//
// Everything Toolport would refuse with a 422 (docs/protocol.md R7) is checked here first, so a plugin fails
// at construction with every problem named instead of at `start()` with the first one. Zod
// parameter schemas are converted to JSON Schema here, once per tool.
import { randomBytes } from 'node:crypto'
import type { ValidateFunction } from 'ajv'
import { z } from 'zod'
import {
  createSchemaAjv, metaSchemaProblems, nonFiniteNumberPath, removeNonRe2Patterns, schemaDialect, type SchemaDialect
} from '../shared/json-schema.js'
import { checkCallbackUrl, isLoopbackAddress } from '../shared/loopback.js'
import { PLUGIN_ERROR_CODES, PluginError, type PluginErrorDetail } from './errors.js'
import { codePointLength, errorText, isPlainObject, isWellFormedText, MAX_TIMER_MS } from '../shared/util.js'

/** A JSON Schema object, as Toolport shows it to the model. */
export type JsonSchemaObject = Record<string, unknown>

/**
 * A tool's parameters: a JSON Schema object, or a zod schema of an object (`z.object`, or a union of
 * them), converted to JSON Schema. A zod schema of anything else is a type error (tool arguments
 * are a JSON object).
 */
export type ToolParameters = JsonSchemaObject | z.core.$ZodType<Record<string, unknown>>

/**
 * The arguments a handler receives: the zod schema's output for a zod schema (validated before the
 * handler runs), else a JSON object (Toolport checked it against the JSON Schema, docs/protocol.md R9).
 */
export type ToolArguments<P> = P extends z.core.$ZodType ? z.core.output<P> : Record<string, unknown>

/** What a handler gets besides its arguments. */
export interface ToolCallContext {
  /** The tool's name. */
  name: string
  /** The model's call id (`call_id` of the callback body, docs/protocol.md R9). */
  callId: string
  /**
   * How long the handler has, in ms, counted from when the call arrived: Toolport's
   * `x-toolport-deadline-ms` header (or the tool's `timeoutSeconds` when the header is absent).
   * Past it Toolport has already answered the model with a timeout.
   */
  deadlineMs: number
  /**
   * Aborted at the deadline (reason: a `TimeoutError` DOMException) or when Toolport closes the
   * connection, e.g. because the model's call was cancelled (reason: an `AbortError`). Pass it on to
   * `fetch`, child processes, timers… so abandoned work stops.
   */
  signal: AbortSignal
}

/**
 * One tool of a plugin. `P` is the type of its `parameters`, inferred from them; it is left
 * unconstrained (the `& ToolParameters` below does the checking) because a tool without
 * `parameters` infers `unknown`, and a constraint would make that one tool spoil the inference
 * of every other tool of the same `createPlugin` call.
 */
export interface PluginTool<P = ToolParameters | undefined> {
  /** Shown to the model (default `''`). */
  description?: string | undefined
  /**
   * A JSON Schema object, or a zod object schema. A zod schema is converted to JSON Schema for the
   * model, and the SDK validates every call's arguments with it before the handler runs (refinements
   * and transforms included, which JSON Schema cannot express). Default: no arguments.
   */
  parameters?: P & ToolParameters
  /**
   * Runs the call. Its return value (any JSON value) is the tool's output (docs/protocol.md R10); a throw
   * becomes a tool error the model reads (docs/protocol.md R11), with the error's message.
   */
  handler: (args: ToolArguments<P>, ctx: ToolCallContext) => unknown
  /** Toolport's deadline for one call, > 0 and ≤ 300 (default 30). */
  timeoutSeconds?: number | undefined
}

/** Where the SDK writes what it does; `console` and pino loggers both fit. */
export interface PluginLogger {
  debug?: ((message: string) => void) | undefined
  info?: ((message: string) => void) | undefined
  warn?: ((message: string) => void) | undefined
  error?: ((message: string) => void) | undefined
}

/** Options of `createPlugin`; `T` maps each tool name to its parameters' type (inferred). */
export interface PluginOptions<T extends Record<string, unknown> = Record<string, ToolParameters | undefined>> {
  /** Base URL of Toolport's HTTP API, on a loopback address, e.g. `http://127.0.0.1:3917`. */
  toolportUrl: string
  /**
   * The plugin's lifecycle tag, `plugin:<id>`: `stop()` clears it, and eviction applies to it
   * (docs/protocol.md R13).
   */
  source: string
  /** The tools, by name (1–64 characters each). */
  tools: { [K in keyof T]: PluginTool<T[K]> }
  /** One role to register with; `null` (default) means every role Toolport has, see the README. */
  role?: string | null | undefined
  /**
   * Token mode of Toolport: sent as `Authorization: Bearer <token>`. Visible ASCII only
   * (0x21–0x7E), as Toolport's `security.token` is.
   */
  token?: string | undefined
  /**
   * Toolport's ownership mode binds the source to this key (sent as `X-Toolport-Plugin-Key`).
   * Default: a random key per plugin object. Pass a stable secret (e.g. read from a 0600 file) to
   * take the source back after a restart while the old tools are still registered.
   */
  pluginKey?: string | undefined
  /** Address of the plugin's callback server: a loopback address (default `127.0.0.1`). */
  host?: string | undefined
  /** Port of the plugin's callback server (default 0: any free port). */
  port?: number | undefined
  /** How often the SDK checks that its tools are still registered, in ms (default 2000). */
  pollIntervalMs?: number | undefined
  /**
   * Longest wait between checks while Toolport is down, between `start()`'s retries and between
   * the event stream's reconnections, in ms (default 30000); it may be below `pollIntervalMs`.
   */
  maxBackoffMs?: number | undefined
  /**
   * Watch Toolport's live event stream (`GET /api/events`) and check at once when Toolport
   * restarted or removed any of the plugin's tools, instead of waiting for the next poll
   * (default true). Polling goes on as the fallback either way.
   */
  watchEvents?: boolean | undefined
  /** Budget of one request to Toolport's API, in ms (default 10000). */
  requestTimeoutMs?: number | undefined
  /**
   * How long `start()` keeps retrying while Toolport is unreachable or busy, in ms (default 30000;
   * 0 = fail on the first such failure). An answer that says the request is wrong fails at once.
   */
  startTimeoutMs?: number | undefined
  /** Largest callback body the server reads, in bytes (default 8 MiB). */
  maxBodyBytes?: number | undefined
  /** Where to log (default: warnings and errors to the console); `false` for silence. */
  logger?: PluginLogger | false | undefined
}

/** A tool with everything worked out at construction, as the callback server and the poll use it. */
export interface ResolvedTool {
  name: string
  description: string
  /** The JSON Schema registered with Toolport. */
  parameters: JsonSchemaObject
  /** The zod schema the arguments are validated with, or null for a JSON Schema tool. */
  schema: z.core.$ZodType | null
  /**
   * A JSON Schema tool's compiled `parameters` (Toolport's dialects and rules, src/shared), or
   * null for a zod tool: the arguments are checked again before the handler runs.
   */
  validate: ValidateFunction | null
  handler: (args: any, ctx: ToolCallContext) => unknown
  timeoutSeconds: number
}

export interface ResolvedPluginOptions {
  /** The API base, ending in `/` so `api/tools/...` resolves under a host's prefix, if any. */
  toolportUrl: URL
  source: string
  role: string | null
  token: string | null
  pluginKey: string
  host: string
  port: number
  pollIntervalMs: number
  maxBackoffMs: number
  watchEvents: boolean
  requestTimeoutMs: number
  startTimeoutMs: number
  maxBodyBytes: number
  logger: PluginLogger
  tools: Map<string, ResolvedTool>
}

// Mirrors of Toolport's limits (docs/protocol.md R7 and src/main/schemas.ts), checked early for clear errors.
const MAX_TIMEOUT_SECONDS = 300
const MAX_SOURCE_CHARS = 256
/**
 * A token, as Toolport's `security.token` must be (README "Configuration"): visible ASCII only.
 * undici refuses a header value with a line break or a character beyond Latin-1, Toolport reads
 * header bytes as Latin-1 (a client's UTF-8 never matches) and trims the value's ends: visible
 * ASCII is what every client sends, and Toolport reads, unchanged.
 */
const VISIBLE_ASCII = /^[\x21-\x7e]+$/
/** Toolport's shortest `security.token` (32 bytes; visible ASCII is one byte a character). */
const MIN_TOKEN_CHARS = 32

const EMPTY_PARAMETERS: JsonSchemaObject = Object.freeze({ type: 'object', properties: {} })

const CONSOLE_LOGGER: PluginLogger = {
  warn: (message) => { console.warn(`toolport/plugin: ${message}`) },
  error: (message) => { console.error(`toolport/plugin: ${message}`) }
}
const SILENT_LOGGER: PluginLogger = {}

/** Checks `options`; throws one TP_ERR_PLUGIN_OPTIONS naming every problem. */
export function resolvePluginOptions (options: PluginOptions): ResolvedPluginOptions {
  if (!isPlainObject(options)) {
    throw new PluginError(PLUGIN_ERROR_CODES.options, 'createPlugin needs an options object')
  }
  const problems: PluginErrorDetail[] = []
  const problem = (path: string, message: string): void => { problems.push({ path, message }) }

  let toolportUrl: URL | null = null
  if (typeof options.toolportUrl !== 'string') {
    problem('toolportUrl', 'must be a URL string, e.g. http://127.0.0.1:3917')
  } else {
    // The API accepts loopback clients only (docs/protocol.md R1) and a token must never leave the machine,
    // so the SDK insists on the same loopback rule callback URLs follow (docs/protocol.md R2).
    const verdict = checkCallbackUrl(options.toolportUrl)
    if (!verdict.ok) {
      problem('toolportUrl', `${verdict.problem} (got ${JSON.stringify(options.toolportUrl)})`)
    } else {
      toolportUrl = new URL(verdict.parts.href)
      toolportUrl.search = ''
      toolportUrl.hash = ''
      if (!toolportUrl.pathname.endsWith('/')) toolportUrl.pathname += '/'
    }
  }

  const source = options.source
  if (typeof source !== 'string' || !source.startsWith('plugin:') || source.length === 'plugin:'.length) {
    problem('source', `must be 'plugin:<id>' (got ${JSON.stringify(source)})`)
  } else if (source.length > MAX_SOURCE_CHARS) {
    problem('source', `must be at most ${MAX_SOURCE_CHARS} characters`)
  }

  const role = options.role ?? null
  if (role !== null && (typeof role !== 'string' || role === '')) problem('role', 'must be a non-empty string or null')

  const token = options.token ?? null
  if (token !== null && (typeof token !== 'string' || !VISIBLE_ASCII.test(token))) {
    problem('token', 'must be visible ASCII characters only (0x21–0x7E), as Toolport\'s security.token is: ' +
      'no space, line break or other character')
  } else if (token !== null && token.length < MIN_TOKEN_CHARS) {
    // Toolport refuses a shorter security.token: this one could never be accepted.
    problem('token', `must be at least ${MIN_TOKEN_CHARS} characters, as Toolport's security.token is`)
  }

  const pluginKey = options.pluginKey ?? randomBytes(32).toString('base64url')
  if (typeof pluginKey !== 'string' || !/^[\x21-\x7e]{32,512}$/.test(pluginKey)) {
    problem('pluginKey', 'must be 32 to 512 visible ASCII characters')
  }

  const host = options.host ?? '127.0.0.1'
  // An address literal, not a name: the server binds it and the callback URL carries it.
  if (typeof host !== 'string' || !isLoopbackAddress(host)) {
    problem('host', `must be a loopback address such as 127.0.0.1 or ::1 (got ${JSON.stringify(host)})`)
  }
  const port = options.port ?? 0
  if (!Number.isInteger(port) || port < 0 || port > 65535) problem('port', 'must be an integer from 0 to 65535')

  const pollIntervalMs = milliseconds(options.pollIntervalMs, 2000, 10, 'pollIntervalMs', problem)
  const maxBackoffMs = milliseconds(options.maxBackoffMs, 30_000, 10, 'maxBackoffMs', problem)
  const requestTimeoutMs = milliseconds(options.requestTimeoutMs, 10_000, 1, 'requestTimeoutMs', problem)
  const watchEvents = options.watchEvents ?? true
  if (typeof watchEvents !== 'boolean') problem('watchEvents', 'must be a boolean')
  const startTimeoutMs = milliseconds(options.startTimeoutMs, 30_000, 0, 'startTimeoutMs', problem)
  const maxBodyBytes = options.maxBodyBytes ?? 8 * 1024 * 1024
  if (!Number.isInteger(maxBodyBytes) || maxBodyBytes < 1) problem('maxBodyBytes', 'must be a positive integer')

  const logger = resolveLogger(options.logger, problem)

  const tools = new Map<string, ResolvedTool>()
  if (!isPlainObject(options.tools)) {
    problem('tools', 'must be an object of tools by name')
  } else {
    for (const [name, tool] of Object.entries(options.tools)) {
      const resolved = resolveTool(name, tool, problem)
      if (resolved !== null) tools.set(name, resolved)
    }
    if (Object.keys(options.tools).length === 0) problem('tools', 'must name at least one tool')
  }

  if (problems.length > 0) {
    const list = problems.map((p) => `${p.path}: ${p.message}`).join('; ')
    throw new PluginError(PLUGIN_ERROR_CODES.options, `invalid plugin options: ${list}`, { details: problems })
  }
  return {
    toolportUrl: toolportUrl as URL,
    source,
    role,
    token,
    pluginKey,
    host,
    port,
    pollIntervalMs,
    maxBackoffMs,
    watchEvents,
    requestTimeoutMs,
    startTimeoutMs,
    maxBodyBytes,
    logger,
    tools
  }
}

function resolveTool (name: string, tool: unknown, problem: (path: string,
  message: string) => void): ResolvedTool | null {
  const at = `tools.${name}`
  const length = codePointLength(name)
  if (length < 1 || length > 64) problem(at, 'a tool name must be 1 to 64 characters')
  // Its callback URL's path is its UTF-8, percent-encoded: a lone surrogate has none.
  if (!isWellFormedText(name)) problem(at, 'a tool name must be Unicode text, without lone surrogates')
  if (!isPlainObject(tool)) {
    problem(at, 'must be an object with a handler')
    return null
  }
  const { description = '', parameters, handler, timeoutSeconds = 30 } = tool as Partial<PluginTool>
  if (typeof handler !== 'function') problem(`${at}.handler`, 'must be a function')
  if (typeof description !== 'string') problem(`${at}.description`, 'must be a string')
  if (typeof timeoutSeconds !== 'number' || !(timeoutSeconds > 0) || timeoutSeconds > MAX_TIMEOUT_SECONDS) {
    problem(`${at}.timeoutSeconds`, `must be a number greater than 0 and at most ${MAX_TIMEOUT_SECONDS}`)
  }
  let jsonSchema: JsonSchemaObject = EMPTY_PARAMETERS
  let schema: z.core.$ZodType | null = null
  let validate: ValidateFunction | null = null
  if (parameters === undefined) {
    // no arguments
  } else if (isZodSchema(parameters)) {
    schema = parameters
    const converted = toJsonSchema(parameters)
    if (typeof converted === 'string') problem(`${at}.parameters`, converted)
    else jsonSchema = converted
  } else if (isPlainObject(parameters)) {
    if (parameters.type !== undefined && parameters.type !== 'object') {
      problem(`${at}.parameters`, 'must describe an object (type: "object"): tool arguments are a JSON object')
    }
    jsonSchema = parameters
    // What Toolport would refuse with a 422 at registration, refused here first, in Toolport's
    // order (src/main/dispatch/validators.ts, then its schema compiler thread).
    const dialect = schemaDialect(parameters)
    if (!dialect.ok) {
      problem(`${at}.parameters`, dialect.problem)
    } else {
      validate = checkedSchema(parameters, dialect.dialect, `${at}.parameters`, problem)
    }
  } else {
    problem(`${at}.parameters`, 'must be a JSON Schema object or a zod schema')
  }
  return {
    name,
    description: typeof description === 'string' ? description : '',
    parameters: jsonSchema,
    schema,
    validate,
    handler: handler as ResolvedTool['handler'],
    timeoutSeconds: typeof timeoutSeconds === 'number' ? timeoutSeconds : 30
  }
}

/**
 * The validator of a plain JSON Schema that Toolport would take, or null after naming why it
 * would not: a number JSON cannot carry, a schema that is not JSON (a cycle, a BigInt), one that
 * breaks its dialect's meta-schema (`required: ["a", "a"]`, `minProperties: 1.5`), one that does
 * not compile (an RE2-incompatible pattern, a `$ref` that does not resolve). The meta-schema and
 * the compile see the schema's JSON, the very schema the registration sends.
 */
function checkedSchema (parameters: JsonSchemaObject, dialect: SchemaDialect, at: string,
  problem: (path: string, message: string) => void): ValidateFunction | null {
  let text: string
  try {
    text = JSON.stringify(parameters)
  } catch (err) {
    problem(at, `the schema is not JSON: ${errorText(err)}`)
    return null
  }
  // JSON.stringify succeeded: no cycle, so the walk ends.
  const unrepresentable = nonFiniteNumberPath(parameters, at)
  if (unrepresentable !== null) {
    // JSON has no Infinity or NaN: sent, it would be null, and not the schema the plugin wrote.
    problem(unrepresentable, 'is not a finite number (JSON has no Infinity or NaN)')
    return null
  }
  const schema = JSON.parse(text) as JsonSchemaObject
  const meta = metaSchemaProblems(schema, dialect)
  if (meta !== '') {
    problem(at, `not a valid ${dialect} JSON Schema: ${meta}`)
    return null
  }
  try {
    return createSchemaAjv(dialect).compile(schema)
  } catch (err) {
    problem(at, `the schema does not compile: ${errorText(err)}`)
    return null
  }
}

/**
 * A zod schema as the JSON Schema the model sees, or a message saying why it cannot be one.
 * `io: 'input'` describes what the model must send (before transforms and defaults). The target
 * is 2020-12, the dialect Toolport (and MCP) assume for a schema without `$schema`; `$schema` is
 * dropped because several model APIs refuse unknown keywords at the top level.
 */
function toJsonSchema (schema: z.core.$ZodType): JsonSchemaObject | string {
  let converted: Record<string, unknown>
  try {
    converted = z.toJSONSchema(schema, { target: 'draft-2020-12', io: 'input' }) as Record<string, unknown>
  } catch (err) {
    return `the zod schema has no JSON Schema form: ${errorText(err)}`
  }
  delete converted.$schema
  if (!describesObjects(converted)) {
    return 'must be a zod schema of an object (z.object({...}), or a union of them): tool arguments are a JSON object'
  }
  // zod checks every argument itself; a pattern Toolport cannot run would only make it refuse the tool.
  removeNonRe2Patterns(converted)
  return converted
}

/** An object schema, or an `anyOf`/`oneOf` (zod's unions) whose every branch is one. */
function describesObjects (schema: unknown): boolean {
  if (!isPlainObject(schema)) return false
  if (schema.type === 'object') return true
  const branches = schema.anyOf ?? schema.oneOf
  return schema.type === undefined && Array.isArray(branches) && branches.length > 0 && branches.every(describesObjects)
}

function resolveLogger (logger: PluginLogger | false | undefined, problem: (path: string,
  message: string) => void): PluginLogger {
  if (logger === undefined) return CONSOLE_LOGGER
  if (logger === false) return SILENT_LOGGER
  if (typeof logger !== 'object' || logger === null) {
    problem('logger', 'must be a logger object (console, pino) or false')
    return SILENT_LOGGER
  }
  return logger
}

function milliseconds (value: number | undefined, fallback: number, min: number, path: string,
  problem: (path: string, message: string) => void): number {
  if (value === undefined) return fallback
  if (typeof value !== 'number' || !Number.isFinite(value) || value < min || value > MAX_TIMER_MS) {
    problem(path, `must be a number of milliseconds from ${min} to ${MAX_TIMER_MS}`)
    return fallback
  }
  return value
}

/** A zod 4 schema (classic or mini): every one carries its internals under `_zod`. */
function isZodSchema (value: unknown): value is z.core.$ZodType {
  return typeof value === 'object' && value !== null && '_zod' in value
}
