// JSON Schema dialects and the Ajv settings every argument validator is built with, shared by
// Toolport (src/main) and the plugin SDK (src/plugin) so both accept exactly the same schemas.
//
// - The dialect comes from `$schema`: 2020-12 (also when `$schema` is absent, as MCP says),
//   2019-09 or draft-07. Any other `$schema` is refused, never validated as something else.
// - Regular expressions (`pattern`, `patternProperties`, format regexes) run on RE2 (re2-wasm):
//   linear time in the input, so no argument can make a check backtrack for seconds. A pattern
//   RE2 cannot compile (backreferences, lookaround) makes the schema fail to compile.
// - `inlineRefs: false` compiles each `$ref`'d definition once, as a function, instead of copying
//   it into every place that refers to it; `code.optimize: false` skips Ajv's optimisation pass,
//   whose cost grows with the square of the generated code. Generated code stays linear in the
//   schema's size.
// - `ownProperties: true`: `required: ["toString"]` needs an own `toString`, and an optional
//   `constructor` property is checked only when the arguments have one.
import { Ajv, type Format, type Options } from 'ajv'
import { _Code } from 'ajv/dist/compile/codegen/code.js'
import { Ajv2019 } from 'ajv/dist/2019.js'
import { Ajv2020 } from 'ajv/dist/2020.js'
import { fullFormats } from 'ajv-formats/dist/formats.js'
import traverse from 'json-schema-traverse'
import { createRequire } from 'node:module'
import type { RE2 } from 're2-wasm'

/** The dialects Toolport validates. */
export const SCHEMA_DIALECTS = ['2020-12', '2019-09', 'draft-07'] as const
export type SchemaDialect = typeof SCHEMA_DIALECTS[number]

/** The `$schema` URIs of each dialect (http or https, with or without the empty fragment). */
const DIALECT_BY_URI: ReadonlyMap<string, SchemaDialect> = new Map([
  ['json-schema.org/draft/2020-12/schema', '2020-12'],
  ['json-schema.org/draft/2019-09/schema', '2019-09'],
  ['json-schema.org/draft-07/schema', 'draft-07']
])

/**
 * Strings longer than this fail the formats whose regex RE2 cannot run (`url`, `hostname`,
 * `duration` use lookaheads; `uri` is a function over a large regex): their backtracking regex
 * then only ever sees a bounded input. Real values of these formats are far shorter.
 */
export const MAX_BACKTRACKING_FORMAT_CHARS = 2048

/** The dialect a schema declares, or why Toolport cannot validate it. */
export type DialectVerdict = { ok: true, dialect: SchemaDialect } | { ok: false, problem: string }

/**
 * The dialect of a schema, from its `$schema`; no `$schema` means 2020-12.
 *
 * @example
 * schemaDialect({ $schema: 'http://json-schema.org/draft-07/schema#' }) // { ok: true, dialect: 'draft-07' }
 */
export function schemaDialect (schema: Record<string, unknown>): DialectVerdict {
  const uri = schema.$schema
  if (uri === undefined) return { ok: true, dialect: '2020-12' }
  if (typeof uri !== 'string') return { ok: false, problem: '$schema must be a string (a JSON Schema dialect URI)' }
  const match = /^https?:\/\/(.*?)#?$/.exec(uri)
  const dialect = match === null ? undefined : DIALECT_BY_URI.get(match[1] as string)
  if (dialect !== undefined) return { ok: true, dialect }
  return {
    ok: false,
    problem: `$schema ${JSON.stringify(uri.slice(0, 200))} is not a dialect Toolport validates; use ` +
      'https://json-schema.org/draft/2020-12/schema (or omit $schema), ' +
      'https://json-schema.org/draft/2019-09/schema or http://json-schema.org/draft-07/schema#'
  }
}

/** Annotations no validator reads, left out of the text that keys a compiled validator. */
const ANNOTATIONS: ReadonlySet<string> = new Set(['description', 'title', '$comment'])

/**
 * Keywords whose value, items or members' values are subschemas: json-schema-traverse's tables.
 * (It tests them with `in`, so it also walks an unknown keyword named `constructor`; a subschema
 * counts here only when reached through one of these.)
 */
const SUBSCHEMA_KEYWORDS: ReadonlySet<string> = new Set([
  'additionalItems', 'items', 'contains', 'additionalProperties', 'propertyNames', 'not', 'if', 'then', 'else',
  'allOf', 'anyOf', 'oneOf', '$defs', 'definitions', 'properties', 'patternProperties', 'dependencies'
])

/** Keywords whose value is a reference. */
const REF_KEYWORDS = ['$ref', '$dynamicRef', '$recursiveRef'] as const
/** A reference that points into an annotation (`#/properties/a/description`). */
const REF_INTO_ANNOTATION = /\/(description|title|\$comment|%24comment)(\/|$)/

/**
 * A schema's JSON without the text annotations of its subschemas (`description`, `title`,
 * `$comment` with a string value), which validation never reads: tools that share a shape but
 * describe it in their own words share one compiled validator.
 *
 * Subschemas are the ones json-schema-traverse walks (as Ajv does), reached through a keyword of
 * its own tables only: a property named `description`, a `const`, `enum`, `default` or `examples`
 * value, or an unknown keyword's value, is never touched, and a subschema in a place it does not
 * walk keeps its annotations (which costs only a compile of its own). A schema with a reference
 * into an annotation is left whole. The schema is read from its JSON text, so objects it shares
 * with other places (an in-process tool's schema) are never confused.
 *
 * @example
 * validationJson({ type: 'string', description: 'A city' }) // '{"type":"string"}'
 */
export function validationJson (schema: Record<string, unknown>): string {
  const text = JSON.stringify(schema)
  if (!text.includes('"description"') && !text.includes('"title"') && !text.includes('"$comment"')) return text
  const copy = JSON.parse(text) as traverse.SchemaObject
  const subschemas = new Set<object>([copy])
  let refIntoAnnotation = false
  traverse(copy, (subschema, _pointer, _root, _parentPointer, parentKeyword, parentSchema) => {
    if (parentSchema !== undefined && parentKeyword !== undefined && subschemas.has(parentSchema) &&
      SUBSCHEMA_KEYWORDS.has(parentKeyword)) subschemas.add(subschema)
    for (const key of REF_KEYWORDS) {
      const ref = subschema[key]
      if (typeof ref === 'string' && REF_INTO_ANNOTATION.test(ref)) refIntoAnnotation = true
    }
  })
  if (refIntoAnnotation) return text
  let stripped = false
  for (const subschema of subschemas as Set<Record<string, unknown>>) {
    for (const key of ANNOTATIONS) {
      if (typeof subschema[key] === 'string') {
        delete subschema[key]
        stripped = true
      }
    }
  }
  return stripped ? JSON.stringify(copy) : text
}

/**
 * re2-wasm, loaded with the first RE2 object a thread makes: loading it compiles its WebAssembly,
 * ~50 ms of CPU that a thread which never tests a pattern (the main thread of a start, until a
 * tool with one is called) need not pay.
 */
let RE2Class: typeof RE2 | null = null

function newRE2 (pattern: string, flags: string): RE2 {
  RE2Class ??= (createRequire(import.meta.url)('re2-wasm') as typeof import('re2-wasm')).RE2
  return new RE2Class(pattern, flags)
}

/** How standalone validator code (Toolport's compiler thread) names the RE2 engine and the formats. */
export const STANDALONE_REGEXP_MODULE = 'toolport:re2'
export const STANDALONE_FORMATS_MODULE = 'toolport:formats'

/** The subset of a RegExp that Ajv uses. */
interface LinearRegExp { test: (input: string) => boolean }

/** Called with every RE2 object a regExp engine creates, so its owner can free it (see below). */
export type RegExpTracker = (re: RE2) => void

/**
 * Ajv's `code.regExp` engine on RE2. Ajv calls it as `regExp(pattern, "u")`; RE2 refuses what it
 * cannot run in linear time, with an error naming the construct, which fails the compile.
 *
 * re2-wasm objects live in WebAssembly memory that the JS garbage collector does not see: each
 * must be freed with `free(re)` once nothing uses it. `track` receives each one for that.
 *
 * `lazy`: each pattern compiles on its first test instead. For code whose patterns already
 * compiled once (the compiler thread's validator code, loaded on the main thread): an RE2 compile
 * costs up to ~1 ms of WebAssembly per pattern (`[a-z]{1,40}` expands), so a schema of 40
 * patterns would stall the main thread ~40 ms at registration for patterns no argument may reach.
 */
export function re2Engine (track: RegExpTracker | null, code: string, lazy = false): Options['code'] extends infer C
  ? C extends { regExp?: infer R } ? NonNullable<R> : never : never {
  const compile = (pattern: string, flags: string): RE2 => {
    const re = newRE2(pattern, flags.includes('u') ? flags : `${flags}u`)
    if (track !== null) track(re)
    return re
  }
  const engine = lazy
    ? function lazyRe2RegExp (pattern: string, flags: string): LinearRegExp {
      let re: RE2 | null = null
      return { test: (input) => (re ??= compile(pattern, flags)).test(input) }
    }
    : function re2RegExp (pattern: string, flags: string): LinearRegExp {
      return compile(pattern, flags)
    }
  return Object.assign(engine, { code })
}

/** Frees an RE2 object's WebAssembly memory; it must not be used afterwards. */
export function freeRegExp (re: RE2): void {
  // re2-wasm wraps an Embind object and never deletes it (no finalizer): do it here.
  const wrapper = (re as unknown as { wrapper?: { delete?: () => void, isDeleted?: () => boolean } }).wrapper
  if (wrapper?.delete !== undefined && wrapper.isDeleted?.() !== true) wrapper.delete()
}

/**
 * One format regex as a test function: on RE2 when it can run it, else on bounded input only.
 * Compiled on the first test, not when the module loads: RE2 compiles in WebAssembly, and the
 * ~20 format regexes cost ~0.15 s of CPU per thread, paid at every start for formats few
 * schemas use.
 */
function linearFormat (rx: RegExp): (input: string) => boolean {
  let test: ((input: string) => boolean) | null = null
  return function linearFormatTest (input: string): boolean {
    test ??= compileFormat(rx)
    return test(input)
  }
}

function compileFormat (rx: RegExp): (input: string) => boolean {
  try {
    const re = newRE2(rx.source, `${rx.flags.replace(/[gy]/g, '')}u`)
    return function re2Format (input: string): boolean { return re.test(input) }
  } catch {
    const plain = new RegExp(rx.source, rx.flags.replace(/[gy]/g, ''))
    return function boundedFormat (input: string): boolean {
      return input.length <= MAX_BACKTRACKING_FORMAT_CHARS && plain.test(input)
    }
  }
}

/** ajv-formats' full formats with every regex moved onto RE2 or a bounded input (see above). */
function buildFormats (): Record<string, Format> {
  const out: Record<string, Format> = Object.create(null)
  for (const [name, format] of Object.entries(fullFormats)) {
    if (format instanceof RegExp) {
      out[name] = linearFormat(format)
    } else if (name === 'byte') {
      // Base64 may be long (images): its regex has no lookaround, so RE2 runs it (ajv-formats' own regex).
      out[name] = linearFormat(/^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/m)
    } else if (name === 'uri' && typeof format === 'function') {
      const uri = format as (input: string) => boolean
      out[name] = function boundedUri (input: string): boolean {
        return input.length <= MAX_BACKTRACKING_FORMAT_CHARS && uri(input)
      }
    } else {
      // date, time, date-time (fixed-width anchored regexes), numbers, `regex` (compiles only).
      out[name] = format as Format
    }
  }
  return out
}

/** The formats every validator uses; built once per thread (they hold RE2 objects). */
export const SCHEMA_FORMATS: Readonly<Record<string, Format>> = buildFormats()

/** What `createSchemaAjv` may add to the shared settings. */
export interface SchemaAjvOptions {
  /** RE2 objects of `pattern`s go here (see `re2Engine`). */
  trackRegExp?: RegExpTracker | null
  /** Sees each generated function's source as it is made (budgets); may throw to stop the compile. */
  process?: ((source: string) => string) | undefined
  /** Keep each function's source, for `ajv/dist/standalone` (Toolport's compiler thread). */
  source?: boolean
  /** How generated standalone code reaches the RE2 engine and the formats (with `source`). */
  regExpCode?: string
  formatsCode?: string
}

/**
 * A new Ajv for one schema of `dialect`. One instance per schema: Ajv never frees what it has
 * compiled (its scope only grows) and resolves `$id`s across everything it holds, so sharing an
 * instance would leak memory and let one schema's `$id` change what another means.
 *
 * The instance does not check schemas against the dialect's meta-schema (`validateSchema: false`,
 * `meta: false`): compiling the meta-schema for every instance would cost more than the schema.
 * Call `metaValidator(dialect)` for that.
 */
export function createSchemaAjv (dialect: SchemaDialect, options: SchemaAjvOptions = {}): Ajv {
  const settings: Options = {
    strict: false,
    allErrors: false,
    allowUnionTypes: true,
    inlineRefs: false,
    ownProperties: true,
    validateSchema: false,
    meta: false,
    addUsedSchema: false,
    logger: false,
    formats: SCHEMA_FORMATS as Options['formats'],
    code: {
      optimize: false,
      source: options.source === true,
      regExp: re2Engine(options.trackRegExp ?? null, options.regExpCode ?? `require(${JSON.stringify(STANDALONE_REGEXP_MODULE)})`),
      ...(options.formatsCode !== undefined ? { formats: new _Code(options.formatsCode) } : {}),
      ...(options.process !== undefined ? { process: options.process } : {})
    }
  }
  return newAjv(dialect, settings)
}

function newAjv (dialect: SchemaDialect, settings: Options): Ajv {
  switch (dialect) {
    case '2020-12': return new Ajv2020(settings)
    case '2019-09': return new Ajv2019(settings)
    case 'draft-07': return new Ajv(settings)
  }
}

const metaValidators = new Map<SchemaDialect, Ajv>()

/**
 * Checks a schema against its dialect's meta-schema; returns the problems ('' when none). One
 * Ajv per dialect and thread does this: `validateSchema` compiles only the (fixed) meta-schema
 * and keeps nothing of the schema it checks.
 */
export function metaSchemaProblems (schema: Record<string, unknown>, dialect: SchemaDialect): string {
  let ajv = metaValidators.get(dialect)
  if (ajv === undefined) {
    ajv = newAjv(dialect, { strict: false, allErrors: false, logger: false, validateFormats: false })
    metaValidators.set(dialect, ajv)
  }
  if (ajv.validateSchema(schema) === true) return ''
  return (ajv.errors ?? []).slice(0, 5)
    .map((e) => `${e.instancePath === '' ? '(root)' : e.instancePath} ${e.message ?? 'is invalid'}`).join('; ')
}
