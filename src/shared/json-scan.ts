// A strict JSON validity check (RFC 8259 §2–§7) over UTF-8 bytes that builds nothing.
//
// A reply is read on the thread that received it, and most replies are only passed on: the model
// reads the output's JSON text, so building the value (JSON.parse: ~250 µs and a heap of garbage
// for 64 KiB) only to learn "this is JSON" is waste. This scanner walks the bytes once, keeps a
// per-thread byte stack for the nesting (grown on demand, never shrunk, so a steady state
// allocates nothing), and notes where the root object's interesting members (`output`,
// `is_error`, `error`, `images`) begin and end, so that the reply can forward the output slice
// as text without parsing it.
//
// Which bytes count as JSON: exactly those whose WHATWG UTF-8 decoding (one leading BOM dropped,
// invalid sequences turned into U+FFFD, as the reply reader decodes) `JSON.parse` accepts. Bytes
// of 0x80 and above can only be legal inside strings, where any decoded character >= U+0020 is
// allowed, and the decoder never swallows an ASCII byte into a replacement, so both readings agree
// byte for byte (test/unit/json-scan.test.ts checks this against JSON.parse on random bytes).

/** The root-object members the reply reader needs, as indexes into `JsonScanner`'s arrays. */
export const RootMember = { output: 0, isError: 1, error: 2, images: 3 } as const
export type RootMember = typeof RootMember[keyof typeof RootMember]
const MEMBER_COUNT = 4
const MEMBER_NAMES: readonly string[] = ['output', 'is_error', 'error', 'images']

const OBJECT = 1
const ARRAY = 2

const STATE_VALUE = 0
const STATE_KEY = 1
const STATE_AFTER = 2

// 1 for the bytes that may follow a backslash as a one-character escape: " \ / b f n r t.
const SIMPLE_ESCAPE = new Uint8Array(256)
for (const c of '"\\/bfnrt') SIMPLE_ESCAPE[c.charCodeAt(0)] = 1
const HEX = new Uint8Array(256)
for (const c of '0123456789abcdefABCDEF') HEX[c.charCodeAt(0)] = 1

// The nesting stack, shared by every scanner of this thread (scans never interleave: scan() is
// synchronous). Starts small; a deeper document doubles it once, and it stays that size.
let stack = new Uint8Array(256)

function push (depth: number, kind: number): void {
  if (depth === stack.length) {
    const grown = new Uint8Array(stack.length * 2)
    grown.set(stack)
    stack = grown
  }
  stack[depth] = kind
}

function isWhitespace (c: number): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09
}

function skipWhitespace (b: Uint8Array, i: number, end: number): number {
  while (i < end && isWhitespace(b[i] as number)) i++
  return i
}

function isDigit (c: number | undefined): boolean {
  return c !== undefined && c >= 0x30 && c <= 0x39
}

/** The index just past the number at `i`, or -1 (RFC 8259 §6: no leading zeros, no bare dot). */
function scanNumber (b: Uint8Array, i: number, end: number): number {
  if (b[i] === 0x2d) i++ // -
  if (i >= end) return -1
  const first = b[i] as number
  if (first === 0x30) {
    i++
  } else if (first >= 0x31 && first <= 0x39) {
    i++
    while (i < end && isDigit(b[i])) i++
  } else {
    return -1
  }
  if (i < end && b[i] === 0x2e) { // .
    i++
    if (i >= end || !isDigit(b[i])) return -1
    while (i < end && isDigit(b[i])) i++
  }
  if (i < end && (b[i] === 0x65 || b[i] === 0x45)) { // e E
    i++
    if (i < end && (b[i] === 0x2b || b[i] === 0x2d)) i++
    if (i >= end || !isDigit(b[i])) return -1
    while (i < end && isDigit(b[i])) i++
  }
  return i
}

function matchLiteral (b: Uint8Array, i: number, end: number, literal: string): number {
  if (end - i < literal.length) return -1
  for (let k = 0; k < literal.length; k++) {
    if (b[i + k] !== literal.charCodeAt(k)) return -1
  }
  return i + literal.length
}

/**
 * Validates JSON over bytes and records the root object's members. One instance per thread is
 * enough (`scan` is synchronous); its fields describe the last scan.
 *
 * @example
 * const scanner = new JsonScanner()
 * if (scanner.scan(bytes) && scanner.memberStart[RootMember.output] !== -1) { ... }
 */
export class JsonScanner {
  /** Index of the root value's first byte (after a BOM and whitespace). */
  rootStart = 0
  /** Index just past the root value (before trailing whitespace). */
  rootEnd = 0
  /** Whether the last string scanned (the root, when it is a string) had a backslash escape. */
  lastStringEscaped = false
  /**
   * Per `RootMember`: where the member's value starts, or -1 when absent (the last duplicate
   * wins, as in JSON.parse).
   */
  readonly memberStart = new Int32Array(MEMBER_COUNT)
  /** Per `RootMember`: index just past the member's value. */
  readonly memberEnd = new Int32Array(MEMBER_COUNT)
  /** Per `RootMember`: 1 when the value is a string containing an escape. */
  readonly memberEscaped = new Uint8Array(MEMBER_COUNT)

  /** True when `b` is one JSON text (optionally after a UTF-8 BOM, with whitespace around it). */
  scan (b: Uint8Array): boolean {
    const memberStart = this.memberStart
    const memberEnd = this.memberEnd
    const memberEscaped = this.memberEscaped
    memberStart.fill(-1)
    memberEnd.fill(-1)
    memberEscaped.fill(0)
    const end = b.length
    let i = 0
    if (end >= 3 && b[0] === 0xef && b[1] === 0xbb && b[2] === 0xbf) i = 3
    i = skipWhitespace(b, i, end)
    this.rootStart = i
    let depth = 0
    // The root member being read (a RootMember index), or -1; only set at depth 1 of a root object.
    let member = -1
    let valueStart = 0
    let state = STATE_VALUE
    for (;;) {
      if (state === STATE_VALUE) {
        if (i >= end) return false
        // Each arm leaves `i` just past the value, or -1 when it is not valid JSON.
        switch (b[i]) {
          case 0x22: // "
            i = this.#scanString(b, i, end)
            break
          case 0x7b: // {
            i = skipWhitespace(b, i + 1, end)
            if (b[i] === 0x7d) {
              i++
              break
            }
            push(depth++, OBJECT)
            state = STATE_KEY
            continue
          case 0x5b: // [
            i = skipWhitespace(b, i + 1, end)
            if (b[i] === 0x5d) {
              i++
              break
            }
            push(depth++, ARRAY)
            continue
          case 0x2d: case 0x30: case 0x31: case 0x32: case 0x33: case 0x34: // - 0-4
          case 0x35: case 0x36: case 0x37: case 0x38: case 0x39: // 5-9
            i = scanNumber(b, i, end)
            break
          case 0x74: // t
            i = matchLiteral(b, i, end, 'true')
            break
          case 0x66: // f
            i = matchLiteral(b, i, end, 'false')
            break
          case 0x6e: // n
            i = matchLiteral(b, i, end, 'null')
            break
          default:
            return false
        }
        if (i < 0) return false
        state = STATE_AFTER
      } else if (state === STATE_KEY) {
        if (b[i] !== 0x22) return false
        const keyStart = i
        i = this.#scanString(b, i, end)
        if (i < 0) return false
        // depth 1 inside an object: the root is that object (an array root would be ARRAY here).
        if (depth === 1) member = rootMember(b, keyStart, i, this.lastStringEscaped)
        if (b[i] !== 0x3a) { // : (usually right after the key)
          i = skipWhitespace(b, i, end)
          if (b[i] !== 0x3a) return false
        }
        i = skipWhitespace(b, i + 1, end)
        if (depth === 1) valueStart = i
        state = STATE_VALUE
      } else {
        if (member !== -1 && depth === 1) {
          memberStart[member] = valueStart
          memberEnd[member] = i
          memberEscaped[member] = this.lastStringEscaped && b[valueStart] === 0x22 ? 1 : 0
          member = -1
        }
        if (depth === 0) {
          this.rootEnd = i
          return skipWhitespace(b, i, end) === end
        }
        let c = b[i]
        if (c !== 0x2c && c !== 0x7d && c !== 0x5d) { // , } ] (usually right after the value)
          i = skipWhitespace(b, i, end)
          if (i >= end) return false
          c = b[i]
        }
        const top = stack[depth - 1]
        if (c === 0x2c) { // ,
          i = skipWhitespace(b, i + 1, end)
          state = top === OBJECT ? STATE_KEY : STATE_VALUE
        } else if ((top === OBJECT && c === 0x7d) || (top === ARRAY && c === 0x5d)) {
          i++
          depth--
        } else {
          return false
        }
      }
    }
  }

  /** The index just past the string starting at `i` (a quote), or -1 (RFC 8259 §7). */
  #scanString (b: Uint8Array, i: number, end: number): number {
    let isEscaped = false
    i++
    while (i < end) {
      const c = b[i] as number
      if (c === 0x22) {
        this.lastStringEscaped = isEscaped
        return i + 1
      }
      if (c === 0x5c) {
        isEscaped = true
        const e = b[i + 1]
        if (e === undefined || i + 1 >= end) return -1
        if (SIMPLE_ESCAPE[e] === 1) {
          i += 2
        } else if (e === 0x75 && i + 5 < end && HEX[b[i + 2] as number] === 1 && HEX[b[i + 3] as number] === 1 &&
          HEX[b[i + 4] as number] === 1 && HEX[b[i + 5] as number] === 1) {
          i += 6
        } else {
          return -1
        }
        continue
      }
      if (c < 0x20) return -1
      i++
    }
    return -1
  }
}

const utf8 = new TextDecoder('utf-8', { ignoreBOM: true })

/** Which RootMember the key `b[start, end)` (quotes included) names, or -1. */
function rootMember (b: Uint8Array, start: number, end: number, isEscaped: boolean): number {
  if (isEscaped) {
    // Rare: a key spelled with escapes ("\u006futput"). Decode it to compare.
    const key = JSON.parse(utf8.decode(b.subarray(start, end))) as string
    return MEMBER_NAMES.indexOf(key)
  }
  const length = end - start - 2
  for (let m = 0; m < MEMBER_COUNT; m++) {
    const name = MEMBER_NAMES[m] as string
    if (name.length !== length) continue
    let k = 0
    while (k < length && b[start + 1 + k] === name.charCodeAt(k)) k++
    if (k === length) return m
  }
  return -1
}

const shared = new JsonScanner()

/**
 * True when `bytes` is one JSON text: exactly when `JSON.parse` accepts its UTF-8 decoding (a
 * leading BOM ignored, RFC 8259 §8.1). Allocates nothing.
 *
 * @example
 * isValidJson(Buffer.from('{"a":[1,2]}')) // true
 */
export function isValidJson (bytes: Uint8Array): boolean {
  return shared.scan(bytes)
}
