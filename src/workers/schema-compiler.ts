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
import standalone from 'ajv/dist/standalone/index.js'
import type { RE2 } from 're2-wasm'
import {
  createSchemaAjv, freeRegExp, metaSchemaProblems, SCHEMA_DIALECTS, STANDALONE_FORMATS_MODULE, STANDALONE_REGEXP_MODULE,
  type SchemaDialect
} from '../shared/json-schema.js'

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
  | { id: number, ok: false, problem: string, overBudget?: boolean }

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
    return { id: job.id, ok: false, problem: `the schema is not JSON: ${(err as Error).message}` }
  }
  if (typeof schema !== 'object' || schema === null || Array.isArray(schema)) {
    return { id: job.id, ok: false, problem: 'the schema must be a JSON object' }
  }
  const meta = metaSchemaProblems(schema as Record<string, unknown>, job.dialect)
  if (meta !== '') return { id: job.id, ok: false, problem: `not a valid ${job.dialect} JSON Schema: ${meta}` }

  const regexps: RE2[] = []
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
    return { id: job.id, ok: true, code }
  } catch (err) {
    if (err instanceof BudgetError) return { id: job.id, ok: false, problem: err.message, overBudget: true }
    return { id: job.id, ok: false, problem: `it does not compile: ${(err as Error).message}` }
  } finally {
    for (const re of regexps) freeRegExp(re)
  }
}

/** Dialects whose meta-schema and code generator have run on this thread. */
const warm = new Set<SchemaDialect>()
/** Whether this thread has made an RE2 object (the first loads re2-wasm and compiles its WebAssembly). */
let re2Warm = false

/**
 * Compiles the dialect's meta-schema and one small schema (so Ajv's code generator has run once)
 * unless this thread has; says whether it did.
 */
function warmUp (dialect: SchemaDialect): boolean {
  if (warm.has(dialect)) return false
  warm.add(dialect)
  compile(dialect, '{"type":"object","properties":{"a":{"type":"string","format":"date"},"b":{"$ref":"#/properties/a"}}}')
  return true
}

/**
 * Makes the thread's first RE2 object when a job's schema may have a `pattern` or
 * `patternProperties` (~50 ms of CPU to load re2-wasm, which a Toolport whose tools have no
 * pattern never spends). Before the job starts, so it is not spent from the job's budget; says
 * whether it did.
 */
function warmRe2 (schema: string): boolean {
  if (re2Warm || !schema.includes('"pattern')) return false
  re2Warm = true
  compile(SCHEMA_DIALECTS[0], '{"type":"string","pattern":"^a"}')
  return true
}

function compile (dialect: SchemaDialect, schema: string): void {
  compileSchema({ id: 0, dialect, maxCodeBytes: 1024 * 1024, schema })
}

// The dialect of schemas without `$schema` (nearly all tools) is warmed before saying ready; each
// other dialect on its first job (~65 ms of CPU each, which a process that never sees one saves).
warmUp(SCHEMA_DIALECTS[0])
parentPort?.postMessage({ ready: true })

parentPort?.on('message', (job: CompileJob) => {
  let reply: CompileReply
  try {
    const warmed: string[] = []
    if (warmUp(job.dialect)) warmed.push(job.dialect)
    if (warmRe2(job.schema)) warmed.push('re2')
    parentPort?.postMessage({ started: job.id, warmed } satisfies CompilerNotice)
    reply = compileSchema(job)
  } catch (err) {
    // A bug (the compile itself is caught above); answer rather than leave the job hanging.
    reply = { id: job.id, ok: false, problem: `the schema compiler failed: ${(err as Error).message}` }
  }
  parentPort?.postMessage(reply)
})
