// The schema compiler thread: turns a tool's `parameters` into standalone validator code.
//
// Compiling a plugin's schema is the expensive, attacker-shaped part of argument validation (a
// `$ref` bomb, a huge schema): it runs here, on its own thread with its own heap limit, so the
// main thread never stalls on it and a schema that exhausts memory kills only this thread. The
// main thread receives the generated code as text (`ajv/dist/standalone`), evaluates it once, and
// runs the validator on each call; see src/main/dispatch/validators.ts.
//
// One message in, one message out; the main thread sends one job at a time and terminates this
// thread when a job runs past its time budget.
import { parentPort } from 'node:worker_threads'
import type { Ajv } from 'ajv'
import { _Code, safeStringify } from 'ajv/dist/compile/codegen/code.js'
import type { ValueScopeName } from 'ajv/dist/compile/codegen/scope.js'
import standalone from 'ajv/dist/standalone/index.js'
import {
  createSchemaAjv, freeRegExp, isWasmAbort, metaSchemaProblems, SCHEMA_DIALECTS, STANDALONE_FORMATS_MODULE,
  STANDALONE_REGEXP_MODULE, type Re2Handle, type SchemaDialect
} from '../shared/json-schema.js'
import { CodeTooDeep, instrumentValidatorCode } from '../shared/validation-cost.js'
import { errorText } from '../shared/util.js'

/** A compile job: the schema as JSON text, its dialect, and the generated-code budget. */
export interface CompileJob {
  id: number
  schema: string
  dialect: SchemaDialect
  maxCodeBytes: number
}

/** The answer: the validator's standalone CommonJS module text, or why there is none. */
export type CompileReply =
  | { id: number, ok: true, code: string }
  | { id: number, ok: false, problem: string, overBudget?: boolean, broken?: true }

/**
 * What the thread says besides replies: it has loaded and warmed the default dialect (`ready`);
 * it starts compiling job `started`'s schema, after warming what the job needed first (`warmed`:
 * the job's dialect, `re2`). The main thread's time budget for a job runs from `started`, so it
 * is spent on the schema alone.
 */
export type CompilerNotice = { ready: true } | { started: number, warmed: string[] }

class BudgetError extends Error {}

export function compileSchema (job: CompileJob): CompileReply {
  let schema: unknown
  try {
    schema = JSON.parse(job.schema)
  } catch (err) {
    return { id: job.id, ok: false, problem: `the schema is not JSON: ${errorText(err)}` }
  }
  if (typeof schema !== 'object' || schema === null || Array.isArray(schema)) {
    return { id: job.id, ok: false, problem: 'the schema must be a JSON object' }
  }
  const meta = metaSchemaProblems(schema as Record<string, unknown>, job.dialect)
  if (meta !== '') return { id: job.id, ok: false, problem: `not a valid ${job.dialect} JSON Schema: ${meta}` }

  const regexps: Re2Handle[] = []
  let codeBytes = 0
  const ajv = createSchemaAjv(job.dialect, {
    source: true,
    regExpCode: `require(${JSON.stringify(STANDALONE_REGEXP_MODULE)})`,
    formatsCode: `require(${JSON.stringify(STANDALONE_FORMATS_MODULE)})`,
    trackRegExp: (re) => { regexps.push(re) },
    // Called after each generated function (with inlineRefs off, one per `$ref`'d definition):
    // a schema whose code passes the budget stops compiling at that function.
    process: (source) => {
      codeBytes += source.length
      if (codeBytes > job.maxCodeBytes) throw new BudgetError(`its validator code passes the budget of ${job.maxCodeBytes} bytes (limits.maxSchemaCodeBytes)`)
      return source
    }
  })
  try {
    const validate = ajv.compile(schema as Record<string, unknown>)
    schemaValuesAsJson(ajv)
    // The CommonJS module's `default` (a property of the function itself under Node's ESM interop too).
    const code = standalone.default(ajv, validate)
    if (code.length > job.maxCodeBytes) {
      return {
        id: job.id,
        ok: false,
        problem: `its validator code passes the budget of ${job.maxCodeBytes} bytes (limits.maxSchemaCodeBytes)`,
        overBudget: true
      }
    }
    // Each function and loop charges the check's time budget (src/shared/validation-cost.ts).
    return { id: job.id, ok: true, code: instrumentValidatorCode(code) }
  } catch (err) {
    if (err instanceof BudgetError || err instanceof CodeTooDeep) {
      return { id: job.id, ok: false, problem: err.message, overBudget: true }
    }
    // A WebAssembly abort (re2-wasm out of its fixed memory) leaves that module unusable for
    // every later schema with a pattern: this thread must be replaced (`broken`).
    if (isWasmAbort(err)) {
      const problem = /out of memory|OOM/i.test(err.message)
        ? 'its patterns need more memory than the regular-expression engine has (RE2, 16 MiB): use fewer or simpler patterns'
        : `the regular-expression engine failed on it: ${err.message.slice(0, 120)}`
      return { id: job.id, ok: false, problem, broken: true }
    }
    return { id: job.id, ok: false, problem: `it does not compile: ${errorText(err)}` }
  } finally {
    for (const re of regexps) freeRegExp(re)
  }
}

/**
 * Ajv's standalone code writes each schema object its validator reads at run time (a `const` or
 * `enum` value, the `properties` an `additionalProperties` check looks keys up in) as an object
 * literal, where a `"__proto__"` key sets the object's prototype instead of making a key: the
 * validator would then hold `{}` for `{"__proto__": {"x": 1}}`, and accept and refuse the
 * opposite of what the schema says. Each is written as `JSON.parse("…")` of its JSON instead,
 * which makes every key an own property: the values a direct `ajv.compile` of the same JSON holds.
 */
function schemaValuesAsJson (ajv: Ajv): void {
  const scope = ajv.scope as unknown as { _values: Record<string, Map<unknown, ValueScopeName> | undefined> }
  const values = scope._values.schema
  if (values === undefined) return
  for (const name of values.values()) {
    const value = name.value
    if (value === undefined || value.code === undefined) continue
    const json = JSON.stringify(value.ref)
    if (json === undefined) throw new Error(`the schema value ${name.str} is not JSON`)
    value.code = new _Code(`JSON.parse(${safeStringify(json)})`)
  }
}

/** What this thread has warmed: dialects (their meta-schema and Ajv's code generator) and `re2`. */
const warm = new Set<string>()

/**
 * Compiles `schema` in `dialect` unless this thread has warmed `what` already; says whether it
 * did. A dialect is warmed with one small schema (its meta-schema and Ajv's code generator run
 * once), RE2 with one pattern (the first RE2 object loads re2-wasm, ~50 ms of CPU).
 */
function warmOnce (what: string, dialect: SchemaDialect, schema: string): boolean {
  if (warm.has(what)) return false
  warm.add(what)
  compileSchema({ id: 0, dialect, maxCodeBytes: 1024 * 1024, schema })
  return true
}

const DIALECT_WARM_UP = '{"type":"object","properties":{"a":{"type":"string","format":"date"},"b":{"$ref":"#/properties/a"}}}'
const RE2_WARM_UP = '{"type":"string","pattern":"^a"}'

// The dialect of schemas without `$schema` (nearly all tools) is warmed before saying ready; each
// other dialect on its first job (~65 ms of CPU each, which a process that never sees one saves),
// and RE2 before the first job whose schema may have a `pattern` or `patternProperties` (which a
// Toolport whose tools have none never pays). Before the job starts: not spent from its budget.
warmOnce(SCHEMA_DIALECTS[0], SCHEMA_DIALECTS[0], DIALECT_WARM_UP)
parentPort?.postMessage({ ready: true })

parentPort?.on('message', (job: CompileJob) => {
  let reply: CompileReply
  try {
    const warmed: string[] = []
    if (warmOnce(job.dialect, job.dialect, DIALECT_WARM_UP)) warmed.push(job.dialect)
    if (job.schema.includes('"pattern') && warmOnce('re2', SCHEMA_DIALECTS[0], RE2_WARM_UP)) warmed.push('re2')
    parentPort?.postMessage({ started: job.id, warmed } satisfies CompilerNotice)
    reply = compileSchema(job)
  } catch (err) {
    // A bug (the compile itself is caught above); answer rather than leave the job hanging.
    reply = { id: job.id, ok: false, problem: `the schema compiler failed: ${errorText(err)}` }
  }
  parentPort?.postMessage(reply)
})
