// Argument validators: compiled when a tool is registered, shared by identical schemas, freed
// with the last tool that uses them.
//
// Where the compile runs. On a dedicated worker thread (src/workers/schema-compiler.ts), not on
// the main thread: Ajv's compile is synchronous and cannot be interrupted, and its cost is set
// by the plugin (a 60 KB schema takes ~0.5 s on a busy 2-core machine; a `$ref` bomb more). On
// the compiler thread a time budget is enforced by terminating the thread, a memory bound by its
// heap limit, and the main thread keeps answering every role meanwhile. The thread sends back
// the validator as standalone code (`ajv/dist/standalone`), which the main thread evaluates once
// (parsing: a few ms for the largest code the budget allows; V8 compiles each function on its
// first call, in time that grows with the code's size and nesting, which the compiler thread caps).
//
// Taking turns. The compiler thread is one, and a compile may take up to its budget: compiles
// wait in one queue per requester (the registration's `source`; the host's local tools are one
// more), and the requesters take turns, one job each, so a plugin that sends a hundred costly
// schemas at once delays another's registration by at most one compile, not by a hundred
// (src/main/dispatch/compiler-thread.ts; docs/architecture.md "Argument validation").
//
// Per call. Each check runs under a deadline, `limits.maxValidationMs` (src/shared/validation-cost.ts):
// the instrumented code charges its functions and loops, the helpers below charge their work.
//
// Lifetime. Each schema gets its own Ajv (on the compiler thread) and its own module here, so
// nothing one schema does (`$id`, refs, Ajv's ever-growing scope) reaches another tool. The
// cache maps a hash of the schema text (without the descriptions and titles no validator reads)
// to a WeakRef of its validator: schemas registered by 1000 tools that differ only in how they
// describe their fields compile once, and when the last ToolEntry holding a validator is
// gone (replaced, unregistered, cleared, evicted, its role removed) the garbage collector frees
// it; a FinalizationRegistry then drops the cache slot and frees its RE2 objects, whose
// WebAssembly memory the collector cannot see.
import { createHash } from 'node:crypto'
import { createRequire } from 'node:module'
import { compileFunction } from 'node:vm'
import type { ErrorObject } from 'ajv'
import {
  freeRegExp, re2Engine, SCHEMA_FORMATS, schemaDialect, STANDALONE_FORMATS_MODULE,
  STANDALONE_REGEXP_MODULE, validationJson, type Re2Handle
} from '../../shared/json-schema.js'
import {
  BUDGET_MODULE, chargeTest, CHEAP_UNITS, countingEqual, CUT_SHORT_UNITS, UNIQUE_ITEMS_MODULE, uniqueItemsPair,
  validationBudget, ValidationTooCostly
} from '../../shared/validation-cost.js'
import { chargeCheck, CheckTime, overdrawnForMs, THREAD_CUT_SHORT_AFTER_MS, threadOverdrawnForMs } from './check-time.js'
import { validationError, type ToolportError } from '../errors.js'
import type { ArgumentsValidator } from '../roles/tool-registry.js'
import { SchemaCompiler, type CompileOutcome, type QueuedJob } from './compiler-thread.js'
import { errorText } from '../../shared/util.js'

/** The compile and check budgets (the `limits` options of the same names). */
export interface SchemaBudgets {
  /** Longest a schema may take to compile, in ms, on the compiler thread. */
  maxSchemaCompileMs: number
  /** Largest generated validator code, in bytes. */
  maxSchemaCodeBytes: number
  /** Longest one call's arguments may take to check, in ms (on the main thread). */
  maxValidationMs: number
}

/** The `limits` defaults, for roles built outside a runtime. */
export const DEFAULT_SCHEMA_BUDGETS: Readonly<SchemaBudgets> = Object.freeze({
  maxSchemaCompileMs: 2000,
  maxSchemaCodeBytes: 4 * 1024 * 1024,
  maxValidationMs: 50
})

/** Refusals remembered (by schema hash), so a hostile schema sent again costs no compile. */
const MAX_REMEMBERED_REFUSALS = 256
/** The requester of the host's local tools; a plugin's is `s` + its source (never equal). */
const HOST_REQUESTER = 'h'
/** Schemas up to this many characters of JSON are cached under their own text. */
const SHORT_KEY_CHARS = 2048
/** Longest refusal reason passed on to the plugin. */
const MAX_PROBLEM_CHARS = 500

const AJV_RUNTIME = 'ajv/dist/runtime/'
const requireFromHere = createRequire(import.meta.url)

/** Per-thread state: the compiler thread and the caches are shared by every Toolport in the process. */
const validators = new Map<string, WeakRef<ArgumentsValidator>>()
const compiling = new Map<string, { validator: Promise<ArgumentsValidator>, queued: QueuedJob }>()
/** Refusals by cache key, least recently sent first; `until` is when one stops being remembered. */
const refusals = new Map<string, { code: string, problem: string, until: number }>()
/** RE2 objects the loaded validators have made on this thread (never decreases). */
let compiledRegExps = 0
const finalizer = new FinalizationRegistry<{ key: string, regexps: Re2Handle[] }>(({ key, regexps }) => {
  if (validators.get(key)?.deref() === undefined) validators.delete(key)
  for (const re of regexps) freeRegExp(re)
})

/** Validators alive in the cache now (for tests and metrics). */
export function cachedValidatorCount (): number {
  let n = 0
  for (const ref of validators.values()) if (ref.deref() !== undefined) n++
  return n
}

/**
 * RE2 objects the validators loaded on this thread have compiled since it started (for tests): a
 * pattern compiles here on its first test, not when its tool is registered.
 */
export function regExpCompileCount (): number {
  return compiledRegExps
}

/**
 * Starts the compiler thread now (it loads Ajv and warms the default dialect) so that the first
 * registration does not wait for that. The thread stays unref'd while idle.
 */
export function warmUpSchemaCompiler (): void {
  compiler.warmUp()
}

/** Compile jobs started on the compiler thread since the process started (for tests). */
export function compileCount (): number {
  return compiler.jobs
}

/**
 * The validator of a tool's `parameters`, compiled (or found in the cache) now. Throws a 422
 * TP_ERR_VALIDATION, with the reason in `details`, for a schema Toolport cannot validate: an
 * unknown `$schema`, a schema that is not valid in its dialect or does not compile (a pattern RE2
 * cannot run, a `$ref` that does not resolve), or one over a compile budget. `parameters` is the
 * registry's own copy (`checkedParameters` in src/main/schemas.ts), whose numbers were checked to
 * be finite before it was made. `source` is the registering plugin's: its compiles take turns
 * with other sources' (leave it out for the host's own tools).
 *
 * @example
 * const validate = await compileValidator({ type: 'object', required: ['q'] }, budgets, 'plugin:search')
 * validate({}) // "arguments do not match the tool's parameters: (root) must have required property 'q'"
 */
export async function compileValidator (parameters: Record<string, unknown>,
  budgets: SchemaBudgets, source?: string): Promise<ArgumentsValidator> {
  const dialect = schemaDialect(parameters)
  if (!dialect.ok) throw schemaError('unsupported_dialect', dialect.problem)
  // Annotations left out: schemas that differ only in their descriptions compile once.
  const text = validationJson(parameters)
  const key = cacheKey(text, budgets)
  const cached = validators.get(key)?.deref()
  if (cached !== undefined) return cached
  const refused = refusals.get(key)
  if (refused !== undefined) {
    refusals.delete(key)
    if (refused.until > performance.now()) {
      refusals.set(key, refused) // the most recently sent is the last forgotten
      throw schemaError(refused.code, refused.problem)
    }
  }
  const requester = source === undefined ? HOST_REQUESTER : `s${source}`
  let pending = compiling.get(key)
  if (pending === undefined) {
    const job = { id: 0, schema: text, dialect: dialect.dialect, maxCodeBytes: budgets.maxSchemaCodeBytes }
    const queued = compiler.compile(job, budgets.maxSchemaCompileMs, requester)
    const validator = build(key, queued.outcome, budgets.maxValidationMs)
    pending = { validator, queued }
    compiling.set(key, pending)
    validator.then(() => compiling.delete(key), () => compiling.delete(key))
  } else {
    // The same schema, waiting in another requester's queue: it runs at whichever turn comes first.
    compiler.join(pending.queued, requester)
  }
  return await pending.validator
}

async function build (key: string, outcome: Promise<CompileOutcome>,
  maxValidationMs: number): Promise<ArgumentsValidator> {
  const reply = await outcome
  if (!reply.ok) {
    const problem = reply.problem.length > MAX_PROBLEM_CHARS ? `${reply.problem.slice(0, MAX_PROBLEM_CHARS)}…` : reply.problem
    const code = reply.overBudget ? 'schema_too_costly' : 'invalid_schema'
    if (reply.rememberMs > 0) remember(key, code, problem, reply.rememberMs)
    throw schemaError(code, problem)
  }
  const regexps: Re2Handle[] = []
  let validate: StandaloneValidate
  try {
    validate = loadStandalone(reply.code, regexps)
  } catch (err) {
    for (const re of regexps) freeRegExp(re)
    const problem = `its validator could not be loaded: ${errorText(err)}`.slice(0, MAX_PROBLEM_CHARS)
    remember(key, 'invalid_schema', problem, Infinity)
    throw schemaError('invalid_schema', problem)
  }
  const validator: ArgumentsValidator = function validateArguments (value: unknown, account = UNACCOUNTED): string {
    // A tool whose checks took more than their share of the thread lately has its checks cut
    // short: stopped after tens of microseconds of work; while all checks together did, every
    // other tool's are stopped once they would be costly, so a cheap check still passes
    // (src/main/dispatch/check-time.ts). Otherwise this costs two boolean reads.
    const toolWaitMs = account.isOverdrawn ? overdrawnForMs(account, maxValidationMs) : 0
    const threadWaitMs = toolWaitMs > 0 ? 0 : threadOverdrawnForMs(maxValidationMs)
    const cutUnits = toolWaitMs > 0 || threadWaitMs > THREAD_CUT_SHORT_AFTER_MS
      ? CUT_SHORT_UNITS
      : threadWaitMs > 0 ? CHEAP_UNITS : 0
    const isCut = cutUnits > 0
    // The check has a deadline (src/shared/validation-cost.ts): no schema and no argument can
    // hold the main thread for longer.
    validationBudget.start(maxValidationMs, cutUnits)
    let isValid: boolean
    try {
      isValid = validate(value)
    } catch (err) {
      // Past the deadline; or Ajv's deep equality on an object whose own `toString` is not a
      // function; or a pattern that RE2 fails to compile on its first test (see loadStandalone;
      // it compiled the same pattern on the compiler thread): the call is refused, never thrown.
      account.refused = isCut && err instanceof ValidationTooCostly
      if (!account.refused) return `${UNCHECKED}${errorText(err)}`
      if (toolWaitMs === 0) return THREAD_CUT_SHORT
      return `${UNCHECKED}checking this tool's arguments took more than its share of time lately (${maxValidationMs} ms ` +
        'a second, limits.maxValidationMs): until that has passed, only arguments it can check at once are checked ' +
        `(for up to ${Math.ceil(toolWaitMs / 1000)} s more)`
    } finally {
      validationBudget.stop()
      // Costly checks only (cheap ones read the clock once, at their start, and charge nothing).
      if (validationBudget.costlyMs !== 0) chargeCheck(account, validationBudget.costlyMs, maxValidationMs)
    }
    if (isValid) return ''
    account.refused = false
    return `arguments do not match the tool's parameters: ${describeErrors(validate.errors)}`
  }
  validators.set(key, new WeakRef(validator))
  finalizer.register(validator, { key, regexps })
  return validator
}

const UNCHECKED = 'the arguments could not be checked against the tool\'s parameters: '
const THREAD_CUT_SHORT = `${UNCHECKED}argument checks took more than their share of time lately ` +
  '(limits.maxValidationMs): until that has passed, only arguments that can be checked at once are checked'
/** The account of checks called without a tool's (direct calls of a validator: tests, the bench). */
const UNACCOUNTED = new CheckTime()

/**
 * The cache key of a schema: its text with the budgets it was compiled under. A short text is its
 * own key (a Map hashes a string once; cheaper than a digest on the registration path); a long
 * one is keyed by its SHA-256, so the cache never holds 60 KB keys.
 */
function cacheKey (text: string, budgets: SchemaBudgets): string {
  const prefix = `${budgets.maxSchemaCodeBytes}:${budgets.maxSchemaCompileMs}:${budgets.maxValidationMs}:`
  if (text.length <= SHORT_KEY_CHARS) return `${prefix}${text}`
  return `${prefix}sha256:${createHash('sha256').update(text).digest('base64url')}`
}

function remember (key: string, code: string, problem: string, forMs: number): void {
  refusals.delete(key)
  refusals.set(key, { code, problem, until: performance.now() + forMs })
  if (refusals.size > MAX_REMEMBERED_REFUSALS) refusals.delete(refusals.keys().next().value as string)
}

function schemaError (code: string, message: string): ToolportError {
  return validationError([{
    path: 'parameters',
    code,
    message: `the schema cannot be used to validate arguments: ${message}`
  }])
}

interface StandaloneValidate {
  (value: unknown): boolean
  errors?: ErrorObject[] | null
}

/**
 * Evaluates the compiler thread's standalone CommonJS module. Its `require` knows only what the
 * code Ajv generates and the instrumentation need: the RE2 engine (each RE2 object it makes is
 * recorded in `regexps`; a pattern compiles on its first test, as the compiler thread has already
 * compiled it once; each test charges the budget), the shared formats, the check's budget,
 * `uniqueItemsPair`, and Ajv's runtime helpers, `equal` and `ucs2length` in their charging forms.
 */
function loadStandalone (code: string, regexps: Re2Handle[]): StandaloneValidate {
  const engine = re2Engine((re) => { regexps.push(re); compiledRegExps++ },
    `require(${JSON.stringify(STANDALONE_REGEXP_MODULE)})`, true)
  const load = (id: string): unknown => {
    if (id === STANDALONE_REGEXP_MODULE) return engine
    if (id === STANDALONE_FORMATS_MODULE) return CHARGING_FORMATS
    if (id === BUDGET_MODULE) return validationBudget
    if (id === UNIQUE_ITEMS_MODULE) return uniqueItemsPair
    if (id === `${AJV_RUNTIME}equal`) return CHARGING_EQUAL
    if (id === `${AJV_RUNTIME}ucs2length`) return CHARGING_UCS2LENGTH
    if (id.startsWith(AJV_RUNTIME) && /^[a-z0-9_]+$/.test(id.slice(AJV_RUNTIME.length))) return requireFromHere(id)
    throw new Error(`the validator code asks for an unknown module ${JSON.stringify(id)}`)
  }
  const module: { exports: unknown } = { exports: {} }
  // The text is what Ajv generated from the schema on the compiler thread; Ajv's code generator
  // quotes every schema value it embeds, exactly as when `ajv.compile` runs its `new Function`.
  // vm.compileFunction, not `new Function`: V8 keeps every `new Function` source in its eval
  // compilation cache (measured: ~0.2 MB kept per 200 KB validator after GC), a leak when tools
  // are replaced; compileFunction keeps nothing once the validator is gone.
  const factory = compileFunction(code, ['require', 'module', 'exports']) as (r: typeof load, m: typeof module,
    e: unknown) => void
  factory(load, module, module.exports)
  if (typeof module.exports !== 'function') throw new Error('the validator code exports no function')
  return module.exports as StandaloneValidate
}

/**
 * The helpers generated code calls, each charging the check's budget for the work it does (the
 * code's own functions and loops charge themselves; see src/shared/validation-cost.ts; the RE2
 * engine charges its tests itself, see re2Engine). SCHEMA_FORMATS holds no RegExp: buildFormats
 * makes each one a function.
 */
const CHARGING_FORMATS: Readonly<Record<string, unknown>> = (() => {
  const out: Record<string, unknown> = Object.create(null)
  for (const [name, format] of Object.entries(SCHEMA_FORMATS)) {
    if (typeof format === 'function') {
      out[name] = (input: unknown): unknown => { chargeTest(input); return (format as (i: unknown) => unknown)(input) }
    } else if (typeof format === 'object' && 'validate' in format && typeof format.validate === 'function') {
      const check = format.validate as (i: unknown) => unknown
      out[name] = { ...format, validate: (input: unknown): unknown => { chargeTest(input); return check(input) } }
    } else {
      out[name] = format
    }
  }
  return out
})()

const CHARGING_EQUAL = Object.freeze({ default: countingEqual })

const CHARGING_UCS2LENGTH = (() => {
  const ucs2length = (requireFromHere(`${AJV_RUNTIME}ucs2length`) as { default: (s: string) => number }).default
  return Object.freeze({
    default: (text: string): number => {
      validationBudget.charge(text.length)
      return ucs2length(text)
    }
  })
})()

function describeErrors (errors: ErrorObject[] | null | undefined): string {
  if (errors == null || errors.length === 0) return 'invalid'
  return errors.slice(0,
    5).map((e) => `${e.instancePath === '' ? '(root)' : e.instancePath} ${e.message ?? 'is invalid'}`).join('; ')
}

const compiler = new SchemaCompiler()
