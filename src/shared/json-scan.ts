// A strict JSON validity check (RFC 8259 §2–§7) over UTF-8 bytes that builds nothing.
//
// A reply is read on the thread that received it, and most replies are only passed on: the model
// reads the output's JSON text, so building the value (JSON.parse: ~200 µs and a heap of garbage
// for 64 KiB) only to learn "this is JSON" is waste. This scanner walks the bytes once and notes
// where the root object's interesting members (`output`, `is_error`, `error`, `images`) begin and
// end, so that the reply can forward the output slice as text without parsing it.
//
// The scan itself is WebAssembly, compiled from assembly/json-scan.ts (AssemblyScript) by
// `npm run build:wasm` into json-scan-wasm.ts: the same byte loop runs there 1.6–1.8× faster than
// in JavaScript, and plain string bytes go 16 at a time (docs/architecture.md, "Reading a reply").
// Each thread instantiates the module once; a body is copied into its memory, which grows to the
// largest body seen (twice its size: the bytes and the nesting stack) and is kept, up to bodies of
// 4 MiB (the default reply cap); a larger body gets an instance of its own, dropped after it.
// WebAssembly is required (it is off only under `node --jitless`).
//
// Which bytes count as JSON: exactly those whose WHATWG UTF-8 decoding (one leading BOM dropped,
// invalid sequences turned into U+FFFD, as the reply reader decodes) `JSON.parse` accepts. Bytes
// of 0x80 and above can only be legal inside strings, where any decoded character >= U+0020 is
// allowed, and the decoder never swallows an ASCII byte into a replacement, so both readings agree
// byte for byte (test/unit/json-scan.test.ts checks this against JSON.parse on random bytes).
import { JSON_SCAN_WASM } from './json-scan-wasm.js'
import { errorText } from './util.js'

/** The root-object members the reply reader needs, as indexes into `JsonScanner`'s arrays. */
export const RootMember = { output: 0, isError: 1, error: 2, images: 3 } as const
export type RootMember = typeof RootMember[keyof typeof RootMember]
const MEMBER_COUNT = 4

// WebAssembly memory grows in pages of 64 KiB.
const PAGE = 65_536

// The parts of the WebAssembly API used here (Node's types leave WebAssembly to the DOM library).
interface WasmMemory { readonly buffer: ArrayBuffer, grow: (pages: number) => number }
interface WasmGlobal { readonly value: number }
interface ScanExports {
  scan: (input: number, length: number, stack: number) => number
  memory: WasmMemory
  // The memory layout (assembly/json-scan.ts): i32 indexes of the results, and the input's offset.
  MEMBER_START: WasmGlobal
  MEMBER_END: WasmGlobal
  MEMBER_ESCAPED: WasmGlobal
  ROOT_START: WasmGlobal
  ROOT_END: WasmGlobal
  ROOT_ESCAPED: WasmGlobal
  RESULTS: WasmGlobal
  INPUT: WasmGlobal
}
interface WasmApi {
  Module: new (bytes: Uint8Array) => object
  Instance: new (module: object, imports: object) => { exports: unknown }
}
const api = webAssembly()

function webAssembly (): WasmApi {
  const found = (globalThis as unknown as { WebAssembly?: WasmApi }).WebAssembly
  if (found === undefined) {
    throw new Error('Toolport needs WebAssembly to read callback replies, and this process has none (node --jitless?)')
  }
  return found
}
// The module imports nothing: the scan allocates nothing and has no assertions (--noAssert).
const scanModule = new api.Module(Buffer.from(JSON_SCAN_WASM, 'base64'))

function instantiate (): ScanExports {
  return new api.Instance(scanModule, {}).exports as ScanExports
}

// The thread's kept instance, and the layout as the module declares it.
const first = instantiate()
const MEMBER_START = first.MEMBER_START.value
const MEMBER_END = first.MEMBER_END.value
const MEMBER_ESCAPED = first.MEMBER_ESCAPED.value
const ROOT_START = first.ROOT_START.value
const ROOT_END = first.ROOT_END.value
const ROOT_ESCAPED = first.ROOT_ESCAPED.value
const RESULTS = first.RESULTS.value
const INPUT = first.INPUT.value

// Bodies up to this size are scanned in the thread's kept instance, whose memory stays as large
// as the largest of them needed (twice this, at most); a larger body is scanned in an instance of
// its own, dropped after it, so one rare huge reply does not pin its memory.
const KEEP_BYTES = 4 * 1024 * 1024

/** One instance of the module, with views of its memory (renewed when the memory grows). */
class ScanInstance {
  readonly #exports: ScanExports
  memory: Uint8Array
  results: Int32Array

  constructor (exports = instantiate()) {
    this.#exports = exports
    this.memory = new Uint8Array(exports.memory.buffer)
    this.results = new Int32Array(exports.memory.buffer, 0, RESULTS)
  }

  /** Copies `b` in and scans it; the results are then in `results`. */
  scan (b: Uint8Array): boolean {
    const length = b.length
    const needed = INPUT + 2 * length // the body, then its nesting stack
    if (needed > this.memory.length) {
      try {
        this.#exports.memory.grow(Math.ceil((needed - this.memory.length) / PAGE))
      } catch (err) {
        throw new Error(`json-scan: no memory to scan a reply of ${length} bytes (${errorText(err)})`)
      }
      this.memory = new Uint8Array(this.#exports.memory.buffer)
      this.results = new Int32Array(this.#exports.memory.buffer, 0, RESULTS)
    }
    this.memory.set(b, INPUT)
    return this.#exports.scan(INPUT, length, INPUT + length) === 1
  }
}

const kept = new ScanInstance(first)

/** Bytes of memory the thread's kept scan instance holds (for tests and diagnostics). */
export function keptScanMemoryBytes (): number {
  return kept.memory.length
}

/**
 * Validates JSON over bytes and records the root object's members. One instance per thread is
 * enough (`scan` is synchronous); its fields describe the last scan that returned true (after a
 * false one, `rootEnd` is -1 and the members are whatever the scan had passed).
 *
 * @example
 * const scanner = new JsonScanner()
 * if (scanner.scan(bytes) && scanner.memberStart[RootMember.output] !== -1) { ... }
 */
export class JsonScanner {
  /** Index of the root value's first byte (after a BOM and whitespace). */
  rootStart = 0
  /** Index just past the root value (before trailing whitespace); -1 when the scan failed. */
  rootEnd = 0
  /** Whether the root value is a string with a backslash escape. */
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
    const instance = b.length > KEEP_BYTES ? new ScanInstance() : kept
    const isJson = instance.scan(b)
    const r = instance.results
    for (let m = 0; m < MEMBER_COUNT; m++) {
      this.memberStart[m] = r[MEMBER_START + m] as number
      this.memberEnd[m] = r[MEMBER_END + m] as number
      this.memberEscaped[m] = r[MEMBER_ESCAPED + m] as number
    }
    this.rootStart = r[ROOT_START] as number
    this.rootEnd = r[ROOT_END] as number
    this.lastStringEscaped = r[ROOT_ESCAPED] === 1
    return isJson
  }
}

const shared = new JsonScanner()

/**
 * True when `bytes` is one JSON text: exactly when `JSON.parse` accepts its UTF-8 decoding (a
 * leading BOM ignored, RFC 8259 §8.1). Allocates nothing per call (the thread's scan memory
 * grows once to fit the largest body up to 4 MiB).
 *
 * @example
 * isValidJson(Buffer.from('{"a":[1,2]}')) // true
 */
export function isValidJson (bytes: Uint8Array): boolean {
  return shared.scan(bytes)
}
