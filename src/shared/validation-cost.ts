// What bounds the time one call's argument check can take (SECURITY.md "Argument validation").
//
// A validator is code generated from a plugin's schema and run on the main thread, synchronously,
// on arguments a model or any local client chooses. Its cost is not linear in anything the
// limits bound on their own: two `anyOf` branches that both `$ref` their definition cost 2^depth
// (a 120-byte schema and a 50-byte argument held the thread for seconds and then exhausted the
// heap); `patternProperties` costs patterns × keys RE2 tests (~2 µs each); Ajv's `uniqueItems`
// compares every pair of items. So:
//
// - Every check has a deadline (`limits.maxValidationMs`). The generated code is instrumented on
//   the compiler thread: each validator function and each loop body, when entered, charges its
//   own length in characters to a budget (straight-line code cannot run longer than it is), and
//   the helpers it calls charge the work they do (RE2 and format tests, deep equality, string
//   lengths). When the charges pass a quantum the clock is read, and past the deadline the check
//   stops with `ValidationTooCostly`: the call is refused as a tool error, never run unchecked.
// - `uniqueItems` runs in linear time (one canonical key per item) where Ajv's deep equality
//   cannot throw; elsewhere Ajv's own pairwise loop runs, charged per pair.
//
// Shared: the compiler thread instruments the code, the main thread runs it with this budget, and
// the plugin SDK's validators (compiled directly, never instrumented) use the same `uniqueItems`.

/** The module id by which instrumented code reaches the budget, and the name it binds it to. */
export const BUDGET_MODULE = 'toolport:budget'
const BUDGET_NAME = 'tp$budget'
/** The module id by which generated code reaches `uniqueItemsPair`. */
export const UNIQUE_ITEMS_MODULE = 'toolport:unique'

/**
 * Charges between two readings of the clock. A unit is about a character of generated code run
 * (~1 ns): the clock is read every millisecond or so of work, far too rarely to cost anything.
 */
const QUANTUM = 1 << 20
/**
 * The work a check cut short may do before it is stopped (`start(0, CUT_SHORT_UNITS)`): tens of
 * microseconds, far more than a check of ordinary arguments needs, far less than a costly one
 * takes.
 */
export const CUT_SHORT_UNITS = 1 << 16
/** A check stopped once it would be costly (`start(0, CHEAP_UNITS)`): any cheap check still passes. */
export const CHEAP_UNITS = QUANTUM
/** Charges of the helpers: an RE2 or format test (~2 µs plus the input), a deep-equality step. */
export const REGEXP_TEST_UNITS = 2048
const EQUAL_STEP_UNITS = 16

/** Thrown by a check that passed its deadline. */
export class ValidationTooCostly extends Error {}

/**
 * Deepest nesting of blocks and parentheses accepted in validator code. V8 compiles a function on
 * its first call, on the main thread, recursively: past ~1 800 levels (a 40 KB `allOf` of 1 800
 * `not`s) the compile overflows the stack, after ~1.7 s, on every call; and its time grows with
 * the nesting (~0.3 s at 1 000 levels). Ajv nests one level per `allOf`/`oneOf` member and per
 * property of an object (with `allErrors` off), so 1 024 admits a thousand properties.
 */
const MAX_CODE_NESTING = 1024

/** Thrown by `instrumentValidatorCode` for code nested deeper than MAX_CODE_NESTING. */
export class CodeTooDeep extends Error {}

/**
 * The budget of the check running on this thread (checks are synchronous, so one is enough).
 * Outside a check (`start` not called) it never throws.
 */
class ValidationBudget {
  /** Units left before the clock is read again. */
  left = QUANTUM
  /**
   * How long the last check took, in ms, when it was costly (its charges passed a quantum, so
   * the clock was read during it); 0 after a cheap one, which reads the clock only once, at its
   * start: measuring a cheap check would cost a clock reading per call.
   */
  costlyMs = 0
  #deadline = Infinity
  #limitMs = 0
  /** Units after which the running check is stopped whatever the clock says; 0: none. */
  #cutUnits = 0
  /** The deadline is set (or no check is running). */
  #started = true
  /** When the running check's time began (its first charge). */
  #startedAt = 0
  /** The running check has passed a quantum. */
  #costly = false

  /**
   * Arms the budget for a check of at most `limitMs` ms. The time runs from the first charge, at
   * the entry of the validator's top function: V8 compiles a function on its first call, and
   * that compile (bounded by `limits.maxSchemaCodeBytes` and MAX_CODE_NESTING) is not the check's.
   * `cutUnits` > 0 cuts the check short: it stops once its charges pass that many units, whatever
   * the clock says (CUT_SHORT_UNITS or CHEAP_UNITS; src/main/dispatch/check-time.ts).
   */
  start (limitMs: number, cutUnits = 0): void {
    this.#limitMs = limitMs
    this.#cutUnits = cutUnits
    this.#deadline = Infinity
    this.#started = false
    this.#costly = false
    this.left = 0
  }

  /** Disarms it (the check ended) and sets `costlyMs`. */
  stop (): void {
    this.costlyMs = this.#costly ? performance.now() - this.#startedAt : 0
    this.#deadline = Infinity
    this.#started = true
    this.left = QUANTUM
  }

  /** Charges `units` of work. */
  charge (units: number): void {
    if ((this.left -= units) < 0) this.spent()
  }

  /** The charges passed the quantum: reads the clock, and stops the check past its deadline. */
  spent (): void {
    this.left = QUANTUM
    if (!this.#started) {
      this.#started = true
      this.#startedAt = performance.now()
      this.#deadline = this.#startedAt + this.#limitMs
      if (this.#cutUnits > 0) this.left = this.#cutUnits
      return
    }
    this.#costly = true
    if (performance.now() > this.#deadline || this.#cutUnits > 0) {
      this.#deadline = Infinity
      throw new ValidationTooCostly(`checking them took longer than ${this.#limitMs} ms (limits.maxValidationMs)`)
    }
  }
}

export const validationBudget = new ValidationBudget()

/** Charges an RE2 or format test of `input` (a string's length on top of the test itself). */
export function chargeTest (input: unknown): void {
  validationBudget.charge(REGEXP_TEST_UNITS + (typeof input === 'string' ? input.length : 0))
}

const QUOTE = 0x22
const APOSTROPHE = 0x27
const BACKTICK = 0x60
const BACKSLASH = 0x5c

/**
 * Ajv's standalone validator code with a charge at the start of every function body and every
 * loop body: `if((tp$budget.left-=W)<0)tp$budget.spent();`, W the body's length. One pass over
 * the code, which is read as Ajv writes it: `function validateN(…){`, `for(…){`, strings in
 * double quotes (JSON.stringify). Anything else it cannot place throws: the schema is then
 * refused, never run unbounded; so does code nested deeper than MAX_CODE_NESTING (`CodeTooDeep`).
 */
export function instrumentValidatorCode (code: string): string {
  const strict = '"use strict";'
  if (!code.startsWith(strict)) throw new Error('the validator code does not start with "use strict"')
  /** Open `(` and `{`: for a body brace, its index in `bodies`. */
  const stack: Array<{ char: '(' | '{', body: number, header: boolean }> = []
  const bodies: Array<{ open: number, close: number }> = []
  let headerPending = false
  let expectBody = false
  const n = code.length
  for (let i = 0; i < n; i++) {
    const c = code.charCodeAt(i)
    if (c === QUOTE || c === APOSTROPHE || c === BACKTICK) {
      i = endOfString(code, i)
      continue
    }
    const char = code[i] as string
    if (expectBody) {
      if (char === ' ' || char === '\n') continue
      if (char !== '{') throw new Error(`the validator code has a loop or function without a block at ${i}`)
      expectBody = false
      bodies.push({ open: i, close: -1 })
      stack.push({ char: '{', body: bodies.length - 1, header: false })
      if (stack.length > MAX_CODE_NESTING) throw tooDeep()
      continue
    }
    switch (char) {
      case '(':
        stack.push({ char: '(', body: -1, header: headerPending })
        headerPending = false
        if (stack.length > MAX_CODE_NESTING) throw tooDeep()
        break
      case '{':
        stack.push({ char: '{', body: -1, header: false })
        if (stack.length > MAX_CODE_NESTING) throw tooDeep()
        break
      case ')': case '}': {
        const top = stack.pop()
        if (top === undefined || top.char !== (char === ')' ? '(' : '{')) throw new Error(`the validator code is unbalanced at ${i}`)
        if (top.header) expectBody = true
        if (top.body !== -1) (bodies[top.body] as { close: number }).close = i
        break
      }
      case 'f':
        if (i === 0 || !isIdentifierChar(code.charCodeAt(i - 1))) {
          if (code.startsWith('for(', i)) {
            headerPending = true
            i += 2
          } else if (code.startsWith('function ', i)) {
            headerPending = true
            i += 8
            while (i + 1 < n && code[i + 1] !== '(') {
              if (!isIdentifierChar(code.charCodeAt(i + 1)) && code[i + 1] !== ' ') throw new Error(`the validator code has an unexpected function at ${i}`)
              i++
            }
          }
        }
        break
    }
  }
  if (stack.length !== 0 || headerPending || expectBody) throw new Error('the validator code is unbalanced at its end')
  const parts: string[] = [strict, `const ${BUDGET_NAME} = require(${JSON.stringify(BUDGET_MODULE)});`]
  let from = strict.length
  for (const { open, close } of bodies) {
    parts.push(code.slice(from, open + 1), `if((${BUDGET_NAME}.left-=${close - open})<0)${BUDGET_NAME}.spent();`)
    from = open + 1
  }
  parts.push(code.slice(from))
  return parts.join('')
}

function tooDeep (): CodeTooDeep {
  return new CodeTooDeep(`its validator code nests blocks more than ${MAX_CODE_NESTING} deep, more than V8 can be ` +
    'relied on to compile (fewer `allOf`, `oneOf` members or properties in one object)')
}

/** The index of the closing quote of the string literal that opens at `start`. */
function endOfString (code: string, start: number): number {
  const quote = code.charCodeAt(start)
  for (let i = start + 1; i < code.length; i++) {
    const c = code.charCodeAt(i)
    if (c === BACKSLASH) i++
    else if (c === quote) return i
    else if (quote === BACKTICK && c === 0x24 && code[i + 1] === '{') throw new Error('the validator code has a template literal with a substitution')
  }
  throw new Error('the validator code has an unterminated string')
}

function isIdentifierChar (c: number): boolean {
  return (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a) || c === 0x5f || c === 0x24
}

/**
 * Ajv's deep equality (fast-deep-equal, `ajv/dist/runtime/equal`), step for step, with each step
 * charged to the budget: the same answers and the same exceptions (an object whose own `valueOf`
 * or `toString` is not a function throws, as in Ajv).
 */
export function countingEqual (a: unknown, b: unknown): boolean {
  if (a === b) return true
  validationBudget.charge(EQUAL_STEP_UNITS)
  if (a !== null && b !== null && typeof a === 'object' && typeof b === 'object') {
    const x = a as Record<string, unknown> & { constructor: unknown }
    const y = b as Record<string, unknown> & { constructor: unknown }
    if (x.constructor !== y.constructor) return false
    if (Array.isArray(x)) {
      const length = x.length
      if (length !== (y as unknown as unknown[]).length) return false
      for (let i = length; i-- !== 0;) if (!countingEqual(x[i], (y as unknown as unknown[])[i])) return false
      return true
    }
    if (x.constructor === RegExp) {
      return (a as RegExp).source === (b as RegExp).source && (a as RegExp).flags === (b as RegExp).flags
    }
    // Called as methods, as fast-deep-equal calls them (a value that is not a function throws).
    type Methods = { valueOf: () => unknown, toString: () => unknown }
    if (x.valueOf !== Object.prototype.valueOf) return (x as Methods).valueOf() === (y as Methods).valueOf()
    if (x.toString !== Object.prototype.toString) return (x as Methods).toString() === (y as Methods).toString()
    const keys = Object.keys(x)
    const length = keys.length
    if (length !== Object.keys(y).length) return false
    for (let i = length; i-- !== 0;) if (!Object.prototype.hasOwnProperty.call(y, keys[i] as string)) return false
    for (let i = length; i-- !== 0;) {
      const key = keys[i] as string
      if (!countingEqual(x[key], y[key])) return false
    }
    return true
  }
  // true if both NaN, false otherwise
  // eslint-disable-next-line no-self-compare
  return a !== a && b !== b
}

/**
 * `uniqueItems`: the pair `[i, j]` (j < i) of equal items Ajv's own loop reports first (the last
 * item that equals an earlier one, and the last earlier one it equals), or null when the items
 * are unique. Equality is Ajv's deep equality.
 *
 * Linear: each item gets a canonical key (objects with their keys sorted), and equal keys are
 * exactly the pairs Ajv's equality calls equal, as long as no item holds a value on which that
 * equality is not plain structural equality: an object whose own `valueOf` or `toString` it
 * would call, whose own `constructor` is an object (compared by identity), that is not a plain
 * object or array, or a function, symbol or bigint. Arrays with such an item (never built by
 * JSON.parse from ordinary data) run Ajv's quadratic loop, whose exceptions it keeps, charged per
 * pair to the budget.
 */
export function uniqueItemsPair (items: unknown[]): [number, number] | null {
  const n = items.length
  // Keys first, all of them: an item that needs Ajv's loop may come after a duplicate.
  const keys: unknown[] = new Array(n)
  for (let i = 0; i < n; i++) {
    const item = items[i]
    if (typeof item === 'object' && item !== null) {
      keyNodes = 0
      const key = canonicalKey(item, 0)
      validationBudget.charge(KEY_NODE_UNITS * keyNodes)
      if (key === null) return pairwise(items)
      keys[i] = key
    } else if (typeof item === 'function' || typeof item === 'symbol' || typeof item === 'bigint') {
      return pairwise(items)
    } else {
      validationBudget.charge(KEY_NODE_UNITS)
      keys[i] = item
    }
  }
  // Scalars are their own keys (a Map tells 1 from "1", and NaN equals NaN as in Ajv's
  // equality); objects and arrays are keyed by their canonical text, in a map of their own.
  const lastScalar = new Map<unknown, number>()
  const lastObject = new Map<string, number>()
  let found: [number, number] | null = null
  for (let i = 0; i < n; i++) {
    const item = items[i]
    const key = keys[i]
    const last = typeof item === 'object' && item !== null ? lastObject : lastScalar
    const j = last.get(key as string)
    if (j !== undefined) found = [i, j]
    last.set(key as string, i)
  }
  return found
}
uniqueItemsPair.code = `require(${JSON.stringify(UNIQUE_ITEMS_MODULE)})`

function pairwise (items: unknown[]): [number, number] | null {
  for (let i = items.length; i--;) {
    for (let j = i; j--;) {
      validationBudget.charge(EQUAL_STEP_UNITS)
      if (countingEqual(items[i], items[j])) return [i, j]
    }
  }
  return null
}

/** Nesting the canonical key follows; deeper items run Ajv's loop, which stops at their first difference. */
const MAX_KEY_DEPTH = 1000
/** The charge of one value a canonical key holds (~0.3 µs of work). */
const KEY_NODE_UNITS = 256
/** Values the key being built holds so far. */
let keyNodes = 0

/** The canonical key of a value (see uniqueItemsPair), or null when equality is not structural on it. */
function canonicalKey (value: unknown, depth: number): string | null {
  keyNodes++
  switch (typeof value) {
    case 'string': return JSON.stringify(value)
    case 'number': return Object.is(value, -0) ? '0' : String(value)
    case 'boolean': return value ? 'true' : 'false'
    case 'undefined': return 'undefined'
    case 'object': break
    default: return null
  }
  if (value === null) return 'null'
  if (depth > MAX_KEY_DEPTH) return null
  if (Array.isArray(value)) {
    if (Object.getPrototypeOf(value) !== Array.prototype) return null
    let out = '['
    for (let i = 0; i < value.length; i++) {
      const key = canonicalKey(value[i], depth + 1)
      if (key === null) return null
      out += i === 0 ? key : `,${key}`
    }
    return `${out}]`
  }
  if (Object.getPrototypeOf(value) !== Object.prototype) return null
  const object = value as Record<string, unknown>
  if (Object.hasOwn(object, 'valueOf') || Object.hasOwn(object, 'toString')) return null
  if (Object.hasOwn(object, 'constructor')) {
    const ctor = object.constructor
    if (ctor !== null && (typeof ctor === 'object' || typeof ctor === 'function')) return null
  }
  let out = '{'
  for (const name of Object.keys(object).sort()) {
    const key = canonicalKey(object[name], depth + 1)
    if (key === null) return null
    out += `${out === '{' ? '' : ','}${JSON.stringify(name)}:${key}`
  }
  return `${out}}`
}
