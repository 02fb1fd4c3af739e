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
import { _, Ajv, str, type CodeKeywordDefinition, type Format, type Name, type Options, type ValidateFunction } from 'ajv'
import { _Code } from 'ajv/dist/compile/codegen/code.js'
import { useFunc } from 'ajv/dist/compile/util.js'
import { checkDataTypes, DataType, getSchemaTypes } from 'ajv/dist/compile/validate/dataType.js'
import { Ajv2019 } from 'ajv/dist/2019.js'
import { Ajv2020 } from 'ajv/dist/2020.js'
import { fullFormats } from 'ajv-formats/dist/formats.js'
import traverse from 'json-schema-traverse'
import { createRequire } from 'node:module'
import { sep } from 'node:path'
import type { RE2 } from 're2-wasm'
import { chargeTest, uniqueItemsPair } from './validation-cost.js'

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

/**
 * The path of a number in a schema that is not finite (`parameters.enum[0]`), or null when none is.
 * JSON text such as `1e400` parses to Infinity, which JSON.stringify writes as `null`: a schema
 * holding one would be compiled (and sent on) as another schema than the one written, so Toolport
 * refuses it (`invalid_schema`).
 *
 * @example
 * nonFiniteNumberPath(JSON.parse('{"enum":[1e400]}')) // 'parameters.enum[0]'
 */
export function nonFiniteNumberPath (schema: Record<string, unknown>, root = 'parameters'): string | null {
  const stack: Array<[unknown, string]> = [[schema, root]]
  while (stack.length > 0) {
    const [value, path] = stack.pop() as [unknown, string]
    if (typeof value === 'number') {
      if (!Number.isFinite(value)) return path
    } else if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i++) stack.push([value[i], `${path}[${i}]`])
    } else if (typeof value === 'object' && value !== null) {
      for (const key of Object.keys(value)) stack.push([(value as Record<string, unknown>)[key], `${path}.${key}`])
    }
  }
  return null
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

/**
 * re2-wasm's WebAssembly memory is fixed (16 MiB): once patterns compiled and kept fill it, the
 * module aborts, and every later compile or test on it aborts too; a thread that went on with it
 * could check no pattern again (every tool's arguments "could not be checked"). So an abort drops
 * that instance and the next RE2 object loads a fresh one (`reloadRE2`); each `Re2Pattern` that
 * held an object of the old one compiles again when next used.
 *
 * The old instance must become unreachable, or each abort would keep its 16 MiB for good: it is
 * loaded through a `require` of its own (a module stays in its parent's `children`), and the
 * patterns holding its objects (`holders`) let go of them.
 */
let requireRe2 = createRequire(import.meta.url)
/** Patterns holding an object compiled on the current instance. */
let holders = new Set<Re2Pattern>()

function newRE2 (pattern: string, flags: string): RE2 {
  RE2Class ??= (requireRe2('re2-wasm') as typeof import('re2-wasm')).RE2
  return new RE2Class(pattern, flags)
}

/** True for the error of a WebAssembly abort (emscripten's `abort(…)`: out of memory, mostly). */
export function isWasmAbort (err: unknown): err is Error {
  return err instanceof Error && err.name === 'RuntimeError'
}

/**
 * Rethrows `err` unless it is a WebAssembly abort, which drops the instance (`reloadRE2`): the
 * caller then tries once more on a fresh one, and a second abort (a pattern larger than the whole
 * engine) is thrown.
 */
function reloadOnAbort (err: unknown): void {
  if (!isWasmAbort(err)) throw err
  reloadRE2()
}

/** Drops the aborted re2-wasm instance: the next RE2 object loads a fresh one. */
function reloadRE2 (): void {
  const root = `${sep}re2-wasm${sep}`
  for (const key of Object.keys(requireRe2.cache)) {
    if (key.includes(root)) Reflect.deleteProperty(requireRe2.cache, key)
  }
  requireRe2 = createRequire(import.meta.url)
  RE2Class = null
  const held = holders
  holders = new Set()
  for (const pattern of held) pattern.forget()
}

/**
 * One RE2 pattern compiled on first use, and again on a fresh re2-wasm after the one it was
 * compiled on aborted. `track` receives it when it first compiles (to be freed with its validator).
 */
class Re2Pattern implements LinearRegExp {
  readonly #source: string
  readonly #flags: string
  #track: RegExpTracker | null
  #re: RE2 | null = null

  constructor (source: string, flags: string, track: RegExpTracker | null) {
    this.#source = source
    this.#flags = flags
    this.#track = track
  }

  /** Compiles now (throws what RE2 throws for a pattern it cannot run). */
  compile (): void {
    try {
      this.#compiled()
    } catch (err) {
      reloadOnAbort(err)
      this.#compiled()
    }
  }

  test (input: string): boolean {
    // Written out rather than through a callback: no closure per test (a call's hot path).
    try {
      return this.#compiled().test(input)
    } catch (err) {
      reloadOnAbort(err)
      return this.#compiled().test(input)
    }
  }

  /** Frees its object (the pattern compiles again if tested later). */
  free (): void {
    if (this.#re !== null) freeRegExp(this.#re)
    this.#re = null
    holders.delete(this)
  }

  /** Lets go of an object of a dropped instance: its memory went with that instance. */
  forget (): void {
    this.#re = null
  }

  #compiled (): RE2 {
    if (this.#re === null) {
      this.#re = newRE2(this.#source, this.#flags)
      holders.add(this)
      if (this.#track !== null) {
        this.#track(this)
        this.#track = null
      }
    }
    return this.#re
  }
}

/** Whether RE2 (Toolport's engine for `pattern`) compiles `source` (no lookaround, no backreferences…). */
export function runsOnRe2 (source: string): boolean {
  const pattern = new Re2Pattern(source, 'u', null)
  try {
    pattern.compile()
    return true
  } catch {
    return false
  } finally {
    pattern.free()
  }
}

/**
 * Keywords whose value is one subschema, an array of them, or a map of names to them, for
 * `forEachSubschema`. Wider than SUBSCHEMA_KEYWORDS above (json-schema-traverse's tables, which
 * `validationJson` keeps to so that it strips what Ajv walks): `prefixItems`, `dependentSchemas`,
 * `unevaluated*` and `contentSchema` too, since what walks here edits a schema for its readers.
 */
const ONE_SCHEMA = ['items', 'additionalItems', 'contains', 'additionalProperties', 'propertyNames', 'not', 'if',
  'then', 'else', 'unevaluatedItems', 'unevaluatedProperties', 'contentSchema']
const SCHEMA_LIST = ['allOf', 'anyOf', 'oneOf', 'prefixItems', 'items']
const SCHEMA_MAP = ['properties', 'patternProperties', '$defs', 'definitions', 'dependentSchemas', 'dependencies']

/**
 * Calls `visit` with `root` and each of its subschemas, reached through the keywords above only
 * (never a `default`, `examples`, `const` or an unknown keyword's data), with a stack of its own.
 */
export function forEachSubschema (root: Record<string, unknown>,
  visit: (schema: Record<string, unknown>) => void): void {
  const stack: unknown[] = [root]
  const push = (value: unknown): void => {
    if (typeof value === 'object' && value !== null && !Array.isArray(value)) stack.push(value)
  }
  while (stack.length > 0) {
    const schema = stack.pop() as Record<string, unknown>
    visit(schema)
    for (const key of ONE_SCHEMA) push(schema[key])
    for (const key of SCHEMA_LIST) {
      const list = schema[key]
      if (Array.isArray(list)) for (const item of list) push(item)
    }
    for (const key of SCHEMA_MAP) {
      const map = schema[key]
      if (typeof map === 'object' && map !== null && !Array.isArray(map)) for (const item of Object.values(map)) push(item)
    }
  }
}

/**
 * Removes, in place, every `pattern` RE2 cannot run from a schema the plugin SDK generated from a
 * schema library that checks the arguments itself (zod): zod's own `hostname`, `emoji` and ISO
 * `duration` formats use lookaheads, and Toolport would refuse the whole tool over them. Returns
 * the patterns removed. Only subschemas are walked (`forEachSubschema`: tuples' `prefixItems`
 * too), never `default`, `examples` or `const` data.
 */
export function removeNonRe2Patterns (schema: Record<string, unknown>): string[] {
  const removed: string[] = []
  forEachSubschema(schema, (subschema) => {
    const pattern = subschema.pattern
    if (typeof pattern === 'string' && !runsOnRe2(pattern)) {
      delete subschema.pattern
      removed.push(pattern)
    }
  })
  return removed
}

/** How standalone validator code (Toolport's compiler thread) names the RE2 engine and the formats. */
export const STANDALONE_REGEXP_MODULE = 'toolport:re2'
export const STANDALONE_FORMATS_MODULE = 'toolport:formats'

/** The subset of a RegExp that Ajv uses. */
interface LinearRegExp { test: (input: string) => boolean }

/**
 * What a regExp engine hands its owner to free (see below): an RE2 object, or a pattern that
 * compiles lazily (once, when it first compiles).
 */
export type Re2Handle = RE2 | Re2Pattern

/** Called with every `Re2Handle` a regExp engine creates, so its owner can free it. */
export type RegExpTracker = (re: Re2Handle) => void

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
 * Each of its tests also charges the running check's budget (src/shared/validation-cost.ts).
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
      const re = new Re2Pattern(pattern, flags.includes('u') ? flags : `${flags}u`, track)
      return {
        test: (input) => {
          chargeTest(input)
          return re.test(input)
        }
      }
    }
    : function re2RegExp (pattern: string, flags: string): LinearRegExp {
      return compile(pattern, flags)
    }
  return Object.assign(engine, { code })
}

/** Frees an RE2 object's WebAssembly memory; it must not be used afterwards. */
export function freeRegExp (re: Re2Handle): void {
  if (re instanceof Re2Pattern) {
    re.free()
    return
  }
  // re2-wasm wraps an Embind object and never deletes it (no finalizer): do it here.
  const wrapper = (re as unknown as { wrapper?: { delete?: () => void, isDeleted?: () => boolean } }).wrapper
  try {
    if (wrapper?.delete !== undefined && wrapper.isDeleted?.() !== true) wrapper.delete()
  } catch (err) {
    // An instance that aborted frees nothing more; its memory goes with it.
    if (!isWasmAbort(err)) throw err
  }
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
  // RE2 runs in Unicode mode only, where `i` folds case as Unicode does: the Kelvin sign K
  // (U+212A) matches `k` and the long s ſ (U+017F) matches `s`. ajv-formats' regexes are
  // JavaScript regexes with `i` and without `u`, where only ASCII letters fold to ASCII letters;
  // so each is run as the case-sensitive regex that matches what it matches (`[a-z]` becomes
  // `[a-zA-Z]`), and one this cannot rewrite runs as JavaScript on bounded input.
  const caseless = rx.flags.includes('i') && !rx.flags.includes('u')
  const source = caseless ? asciiCaseless(rx.source) : rx.source
  try {
    if (source === null) throw new Error('not rewritten')
    const re = new Re2Pattern(source, `${rx.flags.replace(caseless ? /[gyi]/g : /[gy]/g, '')}u`, null)
    re.compile()
    return function re2Format (input: string): boolean { return re.test(input) }
  } catch {
    const plain = new RegExp(rx.source, rx.flags.replace(/[gy]/g, ''))
    return function boundedFormat (input: string): boolean {
      return input.length <= MAX_BACKTRACKING_FORMAT_CHARS && plain.test(input)
    }
  }
}

/**
 * A regex source that, without the `i` flag, matches what `source` matches with `i` and without
 * `u` (JavaScript's case folding then pairs ASCII letters only with ASCII letters): every ASCII
 * letter, in a character class or outside one, also stands for its other case; a range adds the
 * other case of the letters it spans. `null` for a source this does not read: a non-ASCII
 * character (which JavaScript folds by its own rules), `\c`, `\k`, `\p`, a backreference, an
 * empty class. Exported for its test.
 *
 * @example
 * asciiCaseless('^[a-z0-9]+@x$') // '^[a-z0-9A-Z]+@[xX]$'
 */
export function asciiCaseless (source: string): string | null {
  let out = ''
  let i = 0
  /** The code unit an escape at `i` (a backslash) stands for, its length, or null for a class escape (\d, \w, …). */
  const escape = (at: number): { code: number | null, length: number } | undefined => {
    const next = source[at + 1]
    if (next === undefined) return undefined
    if (next === 'x' && /^[0-9a-fA-F]{2}$/.test(source.slice(at + 2, at + 4))) {
      return { code: parseInt(source.slice(at + 2, at + 4), 16), length: 4 }
    }
    if (next === 'u' && /^[0-9a-fA-F]{4}$/.test(source.slice(at + 2, at + 6))) {
      return { code: parseInt(source.slice(at + 2, at + 6), 16), length: 6 }
    }
    if ('dDwWsSbB'.includes(next)) return { code: null, length: 2 }
    if (/[0-9cCkKpPuUx]/.test(next)) return undefined
    // An identity escape (\. \- \/ \\ …) or a control escape (\t \n \r \f \v), never a letter.
    if (/[a-zA-Z]/.test(next) && !'tnrfv'.includes(next)) return undefined
    return { code: null, length: 2 }
  }
  while (i < source.length) {
    const c = source.charCodeAt(i)
    if (c > 0x7f) return null
    if (source[i] === '\\') {
      const e = escape(i)
      if (e === undefined || (e.code !== null && e.code > 0x7f)) return null
      out += e.code !== null && isAsciiLetter(e.code) ? bothCases(e.code) : source.slice(i, i + e.length)
      i += e.length
    } else if (source[i] === '[') {
      let j = i + 1
      let body = '['
      if (source[j] === '^') { body += '^'; j++ }
      if (source[j] === ']') return null
      let extra = ''
      while (j < source.length && source[j] !== ']') {
        const start = j
        const lo = classAtom(j)
        if (lo === null) return null
        j += lo.length
        let hi = lo
        if (source[j] === '-' && j + 1 < source.length && source[j + 1] !== ']') {
          const atom = classAtom(j + 1)
          if (atom === null || lo.code === null || atom.code === null) return null
          hi = atom
          j += 1 + atom.length
        }
        // A lone `-` is escaped: the members added after it must not make it a range.
        body += hi === lo && source[start] === '-' ? '\\-' : source.slice(start, j)
        if (lo.code !== null && hi.code !== null) extra += otherCases(lo.code, hi.code)
      }
      if (j >= source.length) return null
      out += `${body}${extra}]`
      i = j + 1
    } else {
      out += isAsciiLetter(c) ? bothCases(c) : source[i]
      i++
    }
  }
  return out

  /** One member of a class at `at`: a character or an escape; null when not read. */
  function classAtom (at: number): { code: number | null, length: number } | null {
    const c = source.charCodeAt(at)
    if (Number.isNaN(c) || c > 0x7f) return null
    if (source[at] !== '\\') return { code: c, length: 1 }
    const e = escape(at)
    if (e === undefined || (e.code !== null && e.code > 0x7f)) return null
    // In a class, \b is a backspace; a control escape stands for its character.
    const control: Record<string, number> = { b: 8, t: 9, n: 10, v: 11, f: 12, r: 13 }
    const letter = source[at + 1] as string
    if (e.code === null && e.length === 2 && Object.hasOwn(control, letter)) {
      return { code: control[letter] as number, length: 2 }
    }
    if (e.code === null && e.length === 2 && !'dDwWsS'.includes(letter)) return { code: letter.charCodeAt(0), length: 2 }
    return e
  }
}

function isAsciiLetter (code: number): boolean {
  return (code >= 0x41 && code <= 0x5a) || (code >= 0x61 && code <= 0x7a)
}

/** `[xX]` for an ASCII letter. */
function bothCases (code: number): string {
  const c = String.fromCharCode(code)
  return `[${c.toLowerCase()}${c.toUpperCase()}]`
}

/** Class members for the other case of the ASCII letters in lo..hi ('' when it spans none). */
function otherCases (lo: number, hi: number): string {
  let out = ''
  for (const [from, to, shift] of [[0x61, 0x7a, -0x20], [0x41, 0x5a, 0x20]] as const) {
    const a = Math.max(lo, from)
    const b = Math.min(hi, to)
    if (a <= b) out += a === b ? String.fromCharCode(a + shift) : `${String.fromCharCode(a + shift)}-${String.fromCharCode(b + shift)}`
  }
  return out
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
    // The schema joins its own (one-schema) instance, so that a `$ref` to its root ("#", what
    // zod writes for a recursive object) resolves; nothing else is ever in that instance.
    addUsedSchema: true,
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
  return useLinearUniqueItems(newAjv(dialect, settings))
}

function newAjv (dialect: SchemaDialect, settings: Options): Ajv {
  switch (dialect) {
    case '2020-12': return new Ajv2020(settings)
    case '2019-09': return new Ajv2019(settings)
    case 'draft-07': return new Ajv(settings)
  }
}

/**
 * Ajv's `uniqueItems` (ajv/dist/vocabularies/validation/uniqueItems.js), the same code but for
 * items that may be objects or arrays: Ajv compares every pair of them (9 s for 100 000 numbers
 * under a bare `{"uniqueItems": true}`), this calls `uniqueItemsPair` (src/shared/validation-cost.ts),
 * linear, with the same answer, the same pair in the error and the same exceptions. Items of
 * scalar types only keep Ajv's own (linear) loop.
 */
const uniqueItemsKeyword: CodeKeywordDefinition = {
  keyword: 'uniqueItems',
  type: 'array',
  schemaType: 'boolean',
  error: {
    message: ({ params: { i, j } }) => str`must NOT have duplicate items (items ## ${j as Name} and ${i as Name} are identical)`,
    params: ({ params: { i, j } }) => _`{i: ${i as Name}, j: ${j as Name}}`
  },
  code (cxt) {
    const { gen, data, schema, parentSchema, it } = cxt
    if (schema !== true) return
    const valid = gen.let('valid')
    const items = parentSchema.items as Record<string, unknown> | boolean | undefined
    const itemTypes = items !== undefined ? getSchemaTypes(items as Record<string, unknown>) : []
    cxt.block$data(valid, () => {
      const i = gen.let('i', _`${data}.length`)
      const j = gen.let('j')
      cxt.setParams({ i, j })
      gen.assign(valid, true)
      gen.if(_`${i} > 1`, () => {
        if (itemTypes.length > 0 && !itemTypes.some((t) => t === 'object' || t === 'array')) {
          // Ajv's loopN, unchanged.
          const item = gen.name('item')
          const wrongType = checkDataTypes(itemTypes, item, it.opts.strictNumbers, DataType.Wrong)
          const indices = gen.const('indices', _`{}`)
          gen.for(_`;${i}--;`, () => {
            gen.let(item, _`${data}[${i}]`)
            gen.if(wrongType, _`continue`)
            if (itemTypes.length > 1) gen.if(_`typeof ${item} == "string"`, _`${item} += "_"`)
            gen.if(_`typeof ${indices}[${item}] == "number"`, () => {
              gen.assign(j, _`${indices}[${item}]`)
              cxt.error()
              gen.assign(valid, false).break()
            }).code(_`${indices}[${item}] = ${i}`)
          })
        } else {
          const pair = gen.const('pair', _`${useFunc(gen, uniqueItemsPair)}(${data})`)
          gen.if(_`${pair} !== null`, () => {
            gen.assign(i, _`${pair}[0]`)
            gen.assign(j, _`${pair}[1]`)
            cxt.error()
            gen.assign(valid, false)
          })
        }
      })
    })
    cxt.ok(valid)
  }
}

/** Replaces Ajv's `uniqueItems` with `uniqueItemsKeyword`, at the same place in its rules. */
function useLinearUniqueItems (ajv: Ajv): Ajv {
  const rules = (ajv as unknown as { RULES: { rules: Array<{ rules: Array<{ keyword: string }> }> } }).RULES.rules
  let before: string | undefined
  for (const group of rules) {
    const at = group.rules.findIndex((rule) => rule.keyword === 'uniqueItems')
    if (at !== -1) before = group.rules[at + 1]?.keyword
  }
  ajv.removeKeyword('uniqueItems')
  ajv.addKeyword(before === undefined ? uniqueItemsKeyword : { ...uniqueItemsKeyword, before })
  return ajv
}

const metaValidators = new Map<SchemaDialect, ValidateFunction>()

/**
 * Checks a schema against its dialect's meta-schema; returns the problems ('' when none). One
 * Ajv per dialect and thread does this: it compiles only the (fixed) meta-schema and keeps
 * nothing of the schema it checks.
 *
 * The meta-schema is the dialect's own (Ajv's default), not the one `$schema` names: every URI
 * `schemaDialect` maps to the dialect (http or https, with or without `#`) is checked the same
 * way, where Ajv's `validateSchema` would look `$schema` up and find no meta-schema under the
 * other spellings.
 */
export function metaSchemaProblems (schema: Record<string, unknown>, dialect: SchemaDialect): string {
  let validate = metaValidators.get(dialect)
  if (validate === undefined) {
    const ajv = newAjv(dialect, { strict: false, allErrors: false, logger: false, validateFormats: false })
    validate = ajv.getSchema(ajv.defaultMeta() as string)
    if (validate === undefined) throw new Error(`Ajv has no meta-schema for ${dialect}`)
    metaValidators.set(dialect, validate)
  }
  if (validate(schema) === true) return ''
  return (validate.errors ?? []).slice(0, 5)
    .map((e) => `${e.instancePath === '' ? '(root)' : e.instancePath} ${e.message ?? 'is invalid'}`).join('; ')
}
