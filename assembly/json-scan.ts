// AssemblyScript source of the strict JSON validity scan (src/shared/json-scan.ts is its only
// user; `npm run build:wasm` compiles it into src/shared/json-scan-wasm.ts, and `npm run lint`
// checks that the committed module is what this source compiles to). It is the scanner the reply
// reader runs on every JSON reply, in WebAssembly because that runs it 1.6–1.8× faster than the
// same loop in JavaScript (docs/architecture.md, "Reading a reply"), and runs of plain string
// bytes 16 at a time with SIMD.
//
// What it accepts: exactly the bytes whose WHATWG UTF-8 decoding (one leading BOM dropped)
// JSON.parse accepts (RFC 8259 §2–§7). Bytes of 0x80 and above are only legal inside strings,
// where every decoded character >= U+0020 is allowed, and the decoder never swallows an ASCII
// byte into a replacement character, so a byte-level check of the ASCII structure is exact.
//
// Memory layout, exported below so that json-scan.ts reads it from the module:
//   [0, 64)          results, 16 i32 (the indexes below)
//   [64, ...)        the module's static data (a few hundred bytes; --memoryBase 64)
//   [INPUT, +len)    the bytes to scan, copied in by the caller
//   [stack, +len)    the nesting stack, one byte per open container (depth <= len)

// Results, as i32 indexes (byte offset = index * 4).
export const MEMBER_START: i32 = 0 // 4 entries: where each root member's value starts, -1 when absent
export const MEMBER_END: i32 = 4 // 4 entries: index just past each root member's value
export const MEMBER_ESCAPED: i32 = 8 // 4 entries: 1 when the member's value is a string with an escape
export const ROOT_START: i32 = 12 // the root value's first byte (after a BOM and whitespace)
export const ROOT_END: i32 = 13 // index just past the root value; -1 until the root value is complete
export const ROOT_ESCAPED: i32 = 14 // 1 when the root value is a string with an escape
export const RESULTS: i32 = 16 // i32 slots reserved for results
// Where the caller puts the bytes: the second 64 KiB page, above the results and static data.
export const INPUT: i32 = 65536

// The root members the reply reader needs, by index (the order of json-scan.ts RootMember).
const OUTPUT = 0
const IS_ERROR = 1
const ERROR = 2
const IMAGES = 3

const OBJECT: u8 = 1
const ARRAY: u8 = 2

// Whether the last string scanned had a backslash escape; reset at each value.
let escaped: bool = false

@inline function result (index: i32, value: i32): void {
  store<i32>(<usize>index << 2, value)
}

@inline function at (p: usize, i: i32): u32 {
  return <u32>load<u8>(p + <usize>i)
}

@inline function isWhitespace (c: u32): bool {
  // Most bytes tested are structure or value bytes (> 0x20): one comparison rules them out.
  return c <= 0x20 && (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09)
}

@inline function isDigit (c: u32): bool {
  return c - 0x30 < 10
}

@inline function isHex (c: u32): bool {
  return c - 0x30 < 10 || (c | 0x20) - 0x61 < 6
}

@inline function skipWhitespace (p: usize, i: i32, end: i32): i32 {
  while (i < end && isWhitespace(at(p, i))) i++
  return i
}

// The string loop's byte patterns, 16 copies each, as static data: a v128 constant in the loop
// is rebuilt by V8 on every iteration (three instructions each), a load from memory is one.
const QUOTES = memory.data<u8>([0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22], 16)
const BACKSLASHES = memory.data<u8>([0x5c, 0x5c, 0x5c, 0x5c, 0x5c, 0x5c, 0x5c, 0x5c, 0x5c, 0x5c, 0x5c, 0x5c, 0x5c, 0x5c, 0x5c, 0x5c], 16)
const SPACES = memory.data<u8>([0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20], 16)

/** The index just past the string whose opening quote is at `i`, or -1 (RFC 8259 §7). */
@inline function scanString (p: usize, i: i32, end: i32): i32 {
  i++
  while (true) {
    if (i + 16 <= end) {
      // 16 bytes at a time while none is a quote, a backslash or a control character.
      const v = v128.load(p + <usize>i)
      const special = v128.or(v128.or(i8x16.eq(v, v128.load(QUOTES)), i8x16.eq(v, v128.load(BACKSLASHES))),
        i8x16.lt_u(v, v128.load(SPACES)))
      const mask = i8x16.bitmask(special)
      if (mask === 0) {
        i += 16
        continue
      }
      i += ctz(mask)
    }
    if (i >= end) return -1
    const c = at(p, i)
    if (c === 0x22) return i + 1
    if (c === 0x5c) {
      escaped = true
      if (i + 1 >= end) return -1
      const e = at(p, i + 1)
      if (e === 0x22 || e === 0x5c || e === 0x2f || e === 0x62 || e === 0x66 || e === 0x6e || e === 0x72 || e === 0x74) {
        i += 2
      } else if (e === 0x75 && i + 5 < end && isHex(at(p, i + 2)) && isHex(at(p, i + 3)) && isHex(at(p, i + 4)) &&
        isHex(at(p, i + 5))) {
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

/** The index just past the number at `i`, or -1 (RFC 8259 §6: no leading zeros, no bare dot). */
function scanNumber (p: usize, i: i32, end: i32): i32 {
  if (at(p, i) === 0x2d) { // -
    i++
    if (i >= end) return -1
  }
  const first = at(p, i)
  if (first === 0x30) {
    i++
  } else if (first - 0x31 < 9) {
    i++
    while (i < end && isDigit(at(p, i))) i++
  } else {
    return -1
  }
  if (i < end && at(p, i) === 0x2e) { // .
    i++
    if (i >= end || !isDigit(at(p, i))) return -1
    while (i < end && isDigit(at(p, i))) i++
  }
  if (i < end && (at(p, i) | 0x20) === 0x65) { // e E
    i++
    if (i < end && (at(p, i) === 0x2b || at(p, i) === 0x2d)) i++
    if (i >= end || !isDigit(at(p, i))) return -1
    while (i < end && isDigit(at(p, i))) i++
  }
  return i
}

/** Which root member the key at [start, end) (quotes included, no escapes) names, or -1. */
function rootMember (p: usize, start: i32, end: i32): i32 {
  const q = p + <usize>start + 1
  const length = end - start - 2
  if (length === 6) {
    const head = load<u32>(q)
    const tail = load<u16>(q, 4)
    if (head === 0x7074756f && tail === 0x7475) return OUTPUT // "outp" "ut"
    if (head === 0x67616d69 && tail === 0x7365) return IMAGES // "imag" "es"
  } else if (length === 8) {
    if (load<u64>(q) === 0x726f7272655f7369) return IS_ERROR // "is_error"
  } else if (length === 5) {
    if (load<u32>(q) === 0x6f727265 && load<u8>(q, 4) === 0x72) return ERROR // "erro" "r"
  }
  return -1
}

/** The name of root member `m`, character `k` (all four are ASCII), or -1 past its end. */
function memberChar (m: i32, k: i32): i32 {
  const name = m === OUTPUT ? 'output' : m === IS_ERROR ? 'is_error' : m === ERROR ? 'error' : 'images'
  return k < name.length ? name.charCodeAt(k) : -1
}

/**
 * `rootMember` for a key spelled with escapes ("\u006futput"): decodes it one UTF-16 unit at a
 * time (as JSON.parse would) and keeps the members it still matches. Rare; not on the hot path.
 */
function escapedRootMember (p: usize, start: i32, end: i32): i32 {
  let matching = 0b1111 // one bit per member still matching
  let k = 0 // decoded units so far
  let i = start + 1
  while (i < end - 1) {
    let unit: i32 = at(p, i)
    if (unit === 0x5c) {
      const e = at(p, i + 1)
      if (e === 0x75) {
        unit = 0
        for (let h = 2; h < 6; h++) {
          const c = at(p, i + h)
          unit = unit * 16 + (isDigit(c) ? c - 0x30 : (c | 0x20) - 0x61 + 10)
        }
        i += 6
      } else {
        unit = e === 0x62 ? 0x08 : e === 0x66 ? 0x0c : e === 0x6e ? 0x0a : e === 0x72 ? 0x0d : e === 0x74 ? 0x09 : e
        i += 2
      }
    } else {
      // A byte >= 0x80 starts a non-ASCII character, which no member name has.
      if (unit >= 0x80) return -1
      i++
    }
    for (let m = 0; m < 4; m++) {
      if ((matching & (1 << m)) !== 0 && memberChar(m, k) !== unit) matching &= ~(1 << m)
    }
    if (matching === 0) return -1
    k++
  }
  for (let m = 0; m < 4; m++) {
    if ((matching & (1 << m)) !== 0 && memberChar(m, k) === -1) return m
  }
  return -1
}

// The root member whose value is being read, or -1, and where that value starts: set by scanKey
// for each key of the root object, recorded and cleared once its value ends.
let member: i32 = -1
let valueStart: i32 = 0

/**
 * Reads an object key at `i` (just past `{` or `,` and whitespace), its colon and the whitespace
 * after it; returns the value's index or -1. At `depth` 1 (a key of the root object) sets
 * `member` and `valueStart`.
 */
@inline function scanKey (p: usize, i: i32, end: i32, depth: i32): i32 {
  if (i >= end || at(p, i) !== 0x22) return -1
  const keyStart = i
  escaped = false
  i = scanString(p, i, end)
  if (i < 0) return -1
  if (depth === 1) member = escaped ? escapedRootMember(p, keyStart, i) : rootMember(p, keyStart, i)
  if (i >= end || at(p, i) !== 0x3a) { // : (usually right after the key)
    i = skipWhitespace(p, i, end)
    if (i >= end || at(p, i) !== 0x3a) return -1
  }
  i = skipWhitespace(p, i + 1, end)
  if (depth === 1) valueStart = i
  return i
}

/**
 * Scans `[input, input + length)`; 1 when it is one JSON text (optionally after a UTF-8 BOM, with
 * whitespace around it), else 0. The nesting stack goes to `[stack, stack + length)`. Results
 * (the indexes above) are written at [0, 64).
 */
export function scan (input: usize, length: i32, stack: usize): i32 {
  const p = input
  const end = length
  for (let m = 0; m < 4; m++) {
    result(MEMBER_START + m, -1)
    result(MEMBER_END + m, -1)
    result(MEMBER_ESCAPED + m, 0)
  }
  result(ROOT_END, -1)
  result(ROOT_ESCAPED, 0)
  let i = 0
  if (end >= 3 && at(p, 0) === 0xef && at(p, 1) === 0xbb && at(p, 2) === 0xbf) i = 3
  i = skipWhitespace(p, i, end)
  result(ROOT_START, i)
  let depth = 0
  member = -1
  while (true) {
    // At a value, whitespace skipped.
    if (i >= end) return 0
    let c = at(p, i)
    escaped = false
    if (c === 0x22) { // "
      i = scanString(p, i, end)
    } else if (c === 0x7b || c === 0x5b) { // { [
      i = skipWhitespace(p, i + 1, end)
      if (i < end && at(p, i) === c + 2) { // the matching } ] right away: an empty container
        i++
      } else {
        store<u8>(stack + <usize>depth, c === 0x7b ? OBJECT : ARRAY)
        depth++
        if (c === 0x5b) continue
        i = scanKey(p, i, end, depth)
        if (i < 0) return 0
        continue
      }
    } else if (c === 0x2d || isDigit(c)) { // - 0-9
      i = scanNumber(p, i, end)
    } else if (c === 0x74) { // true
      i = i + 3 < end && load<u32>(p + <usize>i) === 0x65757274 ? i + 4 : -1
    } else if (c === 0x66) { // false
      i = i + 4 < end && load<u32>(p + <usize>i + 1) === 0x65736c61 ? i + 5 : -1
    } else if (c === 0x6e) { // null
      i = i + 3 < end && load<u32>(p + <usize>i) === 0x6c6c756e ? i + 4 : -1
    } else {
      return 0
    }
    if (i < 0) return 0
    // After a value: record a root member, then a comma (next value) or closing brackets.
    while (true) {
      if (depth === 1 && member !== -1) {
        result(MEMBER_START + member, valueStart)
        result(MEMBER_END + member, i)
        result(MEMBER_ESCAPED + member, escaped && at(p, valueStart) === 0x22 ? 1 : 0)
        member = -1
      }
      if (depth === 0) {
        result(ROOT_END, i)
        result(ROOT_ESCAPED, escaped ? 1 : 0)
        return skipWhitespace(p, i, end) === end ? 1 : 0
      }
      if (i >= end) return 0
      c = at(p, i)
      if (isWhitespace(c)) { // , } ] usually come right after the value
        i = skipWhitespace(p, i, end)
        if (i >= end) return 0
        c = at(p, i)
      }
      const top = load<u8>(stack + <usize>(depth - 1))
      if (c === 0x2c) { // ,
        i = skipWhitespace(p, i + 1, end)
        if (top === OBJECT) {
          i = scanKey(p, i, end, depth)
          if (i < 0) return 0
        }
        break
      }
      if ((c === 0x7d && top === OBJECT) || (c === 0x5d && top === ARRAY)) { // } ]
        i++
        depth--
        escaped = false
        continue
      }
      return 0
    }
  }
  return 0
}
