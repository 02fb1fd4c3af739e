// The strict JSON validity scan over UTF-8 bytes (src/shared/json-scan.ts): it must accept exactly
// what JSON.parse accepts of the same bytes decoded (WHATWG UTF-8, a leading BOM dropped), and it
// must find the root object's members where JSON.parse would (the last duplicate wins).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import fc from 'fast-check'
import { isValidJson, JsonScanner, keptScanMemoryBytes, RootMember } from '../../src/shared/json-scan.js'

const utf8 = new TextDecoder('utf-8')

function parses (bytes: Uint8Array): boolean {
  try {
    JSON.parse(utf8.decode(bytes))
    return true
  } catch {
    return false
  }
}

function agree (bytes: Uint8Array): void {
  assert.equal(isValidJson(bytes), parses(bytes),
    `bytes: ${Buffer.from(bytes).toString('hex')} (${JSON.stringify(utf8.decode(bytes))})`)
}

test('RFC 8259: the grammar\'s edges are judged as JSON.parse judges them', () => {
  const cases = [
    '{}', '[]', '""', '0', '-0', '-0.0e+5', '1E-2', 'true', 'false', 'null', ' \t\r\n{"a" : [ 1 , 2 ] }\n',
    '01', '-', '+1', '1.', '.5', '1e', '1e+', '0x10', 'NaN', 'Infinity', 'tru', 'nulls', '{"a":1,}', '[1,]', '[,1]',
    '{"a" 1}', '{a:1}', "{'a':1}", '"\\x41"', '"\\u12G4"', '"\\u00e9"', '"tab\there"', '"line\nbreak"', '"\\/"',
    '[1] [2]', '', ' ', '\u00a0{}', '{"a":1}\u00a0', '"\u2028"', '[[[[[]]]]]', '[[[[[]]]]', '{"a":{"b":{}}}}',
    '\ufeff{}', '\ufeff\ufeff{}', '{}\ufeff', '"\ufeff"'
  ]
  for (const text of cases) agree(Buffer.from(text, 'utf8'))
})

test('invalid UTF-8 is only legal inside strings, where it decodes to U+FFFD as JSON.parse then sees it', () => {
  const bytes = [
    [0x22, 0xff, 0x22], [0x22, 0xe2, 0x22], [0x22, 0xe2, 0x82, 0x22], [0x5b, 0xff, 0x5d], [0xc3, 0xa9],
    [0x22, 0xed, 0xa0, 0x80, 0x22], [0x22, 0xf4, 0x90, 0x80, 0x80, 0x22], [0xef, 0xbb, 0x22, 0x22]
  ]
  for (const b of bytes) agree(Uint8Array.from(b))
})

test('a 100 000-deep document is scanned without recursion', () => {
  const depth = 100_000
  agree(Buffer.from('['.repeat(depth) + ']'.repeat(depth)))
  agree(Buffer.from('['.repeat(depth) + ']'.repeat(depth - 1)))
  agree(Buffer.from('{"a":'.repeat(depth) + '1' + '}'.repeat(depth)))
})

test('property: random bytes are JSON exactly when JSON.parse accepts their decoding', () => {
  fc.assert(fc.property(fc.uint8Array({ maxLength: 24 }), (bytes) => agree(bytes)), { numRuns: 5000 })
  // Bytes drawn from JSON's own alphabet reach far deeper into the grammar than uniform bytes.
  const alphabet = fc.constantFrom(...Buffer.from('{}[]":,-+.0123456789eEtrufalsn \\u/bfA\t\n\r'), 0x1f, 0xc3, 0xa9,
    0xff)
  fc.assert(fc.property(fc.array(alphabet, { maxLength: 32 }), (bytes) => agree(Uint8Array.from(bytes))),
    { numRuns: 20_000 })
})

test('property: every JSON text, and every one-byte edit of it, is judged as JSON.parse judges it', () => {
  const text = fc.oneof(fc.json(), fc.jsonValue().map((v) => JSON.stringify(v, null, 1)),
    fc.string({ unit: 'binary' }).map((s) => JSON.stringify(s)))
  fc.assert(fc.property(text, (json) => {
    const bytes = Buffer.from(json, 'utf8')
    assert.equal(isValidJson(bytes), true, json)
    agree(bytes)
  }), { numRuns: 3000 })
  fc.assert(fc.property(text, fc.nat(), fc.integer({ min: 0, max: 255 }), fc.constantFrom('replace', 'insert',
    'delete'),
  (json, at, byte, edit) => {
    const bytes = Buffer.from(json, 'utf8')
    const i = bytes.length === 0 ? 0 : at % bytes.length
    const edited = edit === 'replace'
      ? Buffer.concat([bytes.subarray(0, i), Buffer.from([byte]), bytes.subarray(i + 1)])
      : edit === 'insert'
        ? Buffer.concat([bytes.subarray(0, i), Buffer.from([byte]), bytes.subarray(i)])
        : Buffer.concat([bytes.subarray(0, i), bytes.subarray(i + 1)])
    agree(edited)
  }), { numRuns: 10_000 })
})

test('the root object\'s members are located where JSON.parse reads them, the last duplicate winning', () => {
  const scanner = new JsonScanner()
  const body = Buffer.from(' { "output" : {"output":1,"is_error":true} , "x":[{"is_error":true}], "is_error":false, "\\u0065rror":"e\\n", "output":[1, 2] } ')
  assert.equal(scanner.scan(body), true)
  const text = (m: RootMember): string => body.subarray(scanner.memberStart[m], scanner.memberEnd[m]).toString()
  assert.equal(text(RootMember.output), '[1, 2]')
  assert.equal(text(RootMember.isError), 'false')
  assert.equal(text(RootMember.error), '"e\\n"')
  assert.equal(scanner.memberEscaped[RootMember.error], 1)
  assert.equal(scanner.memberStart[RootMember.images], -1)
  // An array root has no members.
  assert.equal(scanner.scan(Buffer.from('[{"output":1}]')), true)
  assert.equal(scanner.memberStart[RootMember.output], -1)
})

test('property: the output member\'s slice is the output JSON.parse reads', () => {
  const scanner = new JsonScanner()
  fc.assert(fc.property(fc.dictionary(fc.string(), fc.jsonValue()), fc.jsonValue(), fc.boolean(), (extra, output,
    spaced) => {
    const members = { ...extra, output }
    const body = Buffer.from(spaced ? JSON.stringify(members, null, 2) : JSON.stringify(members))
    assert.equal(scanner.scan(body), true)
    const slice = body.subarray(scanner.memberStart[RootMember.output], scanner.memberEnd[RootMember.output]).toString()
    assert.deepEqual(JSON.parse(slice), JSON.parse(body.toString()).output)
  }), { numRuns: 1000 })
})

test('property: strings of any length, with a special byte anywhere in a 16-byte step, are judged as JSON.parse judges them', () => {
  // Plain bytes, the three a string stops at (quote, backslash, control), escapes and UTF-8.
  const piece = fc.constantFrom('a', 'Z', ' ', '~', '\u007f', 'é', '€', '"', '\\', '\\"', '\\\\', '\\u00e9', '\\x', '\n',
    '\u0001', '\u001f', '\\u12')
  fc.assert(fc.property(fc.array(piece, { maxLength: 80 }), fc.nat(3), (pieces, lead) => {
    const content = pieces.join('')
    agree(Buffer.from(`${' '.repeat(lead)}"${content}"`, 'utf8'))
    agree(Buffer.from(`{"k${content}":["${content}"]}`, 'utf8'))
  }), { numRuns: 5000 })
})

test('property: a root key spelled with escapes names the member JSON.parse reads', () => {
  const scanner = new JsonScanner()
  const spell = (name: string, escapes: boolean[]): string => [...name].map((c, k) =>
    escapes[k % escapes.length] === true ? `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}` : c).join('')
  const names = ['output', 'is_error', 'error', 'images', 'outpu', 'outputs', 'errors', 'image', 'érror', 'is_error ',
    'outpüt']
  const members = ['output', 'is_error', 'error', 'images']
  const whichEscaped = fc.array(fc.boolean(), { minLength: 1, maxLength: 9 })
  fc.assert(fc.property(fc.constantFrom(...names), whichEscaped, (name, escapes) => {
    const body = Buffer.from(`{"${spell(name, escapes)}":[1],"z":2}`, 'utf8')
    assert.equal(scanner.scan(body), true)
    const found = [0, 1, 2, 3].filter((m) => scanner.memberStart[m] !== -1).map((m) => members[m])
    assert.deepEqual(found, members.includes(name) ? [name] : [], body.toString())
  }), { numRuns: 2000 })
})

test('the scan\'s memory grows for a larger body and is kept; a huge body gets an instance of its own; a failed scan has no root end', () => {
  const scanner = new JsonScanner()
  const large = Buffer.from(JSON.stringify({ output: 'x'.repeat(300_000), is_error: false }))
  assert.equal(scanner.scan(large), true)
  assert.equal(scanner.memberEnd[RootMember.output], 10 + 300_002)
  // The body and its nesting stack, after the first 64 KiB page.
  const kept = keptScanMemoryBytes()
  assert.ok(kept >= 65_536 + 2 * large.length, `kept ${kept}`)
  // The smaller body is invalid exactly where the larger one's bytes would have continued it.
  assert.equal(scanner.scan(Buffer.from('{"output":"xx')), false)
  assert.equal(scanner.rootEnd, -1)
  assert.equal(scanner.scan(Buffer.from('{"is_error":true}')), true)
  assert.equal(scanner.memberStart[RootMember.output], -1)
  assert.equal(scanner.memberStart[RootMember.isError], 12)
  // Past 4 MiB the scan runs in an instance of its own: the kept memory does not grow for it.
  const huge = Buffer.from(`[${'"x",'.repeat(1_100_000)}{"output":1}]`)
  assert.equal(scanner.scan(huge), true)
  assert.equal(scanner.rootEnd, huge.length)
  assert.equal(scanner.scan(huge.subarray(0, huge.length - 1)), false)
  assert.equal(keptScanMemoryBytes(), kept)
  assert.equal(scanner.scan(Buffer.from(' {"output":[1]} ')), true)
  assert.deepEqual([scanner.memberStart[RootMember.output], scanner.memberEnd[RootMember.output]], [11, 14])
  assert.equal(scanner.rootEnd, 15)
})
