// Reading a callback's 2xx reply (docs/protocol.md R10–R12, "Model-visible result"), including the
// fast path for the canonical envelope, which must agree with the general reading.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import fc from 'fast-check'
import { decodeReplyText, mapReply, readReply, type MappedReply } from '../../src/shared/reply.js'

const J = 'application/json'

test('R10: a success envelope gives the output\'s JSON as text; a string output is the text itself', () => {
  assert.deepEqual(mapReply('{"output":{"t":28},"is_error":false}', J), {
    text: '{"t":28}',
    textIsJson: true,
    toolError: ''
  })
  assert.deepEqual(mapReply('{"output": {"t": 28}, "is_error": false}', J), {
    text: '{"t": 28}',
    textIsJson: true,
    toolError: ''
  })
  assert.deepEqual(mapReply('{"output":"sunny","is_error":false}', J), {
    text: 'sunny',
    textIsJson: false,
    toolError: ''
  })
  assert.deepEqual(mapReply('{"is_error":false,"output":[1,2]}', J), { text: '[1,2]', textIsJson: true, toolError: '' })
  assert.deepEqual(mapReply('{"output":null,"is_error":false}', J), { text: 'null', textIsJson: true, toolError: '' })
  assert.deepEqual(mapReply('{"is_error":false}', J), { text: 'null', textIsJson: true, toolError: '' })
})

test('R11: is_error counts only when it is the JSON value true', () => {
  assert.deepEqual(mapReply('{"error":"location not found","is_error":true}', J),
    { text: '{"error":"location not found"}', textIsJson: false, toolError: 'location not found' })
  assert.equal(mapReply('{"output":1,"is_error":"true"}', J).toolError, '')
  assert.equal(mapReply('{"is_error":true}', J).toolError, 'tool reported an error')
  assert.equal(mapReply('{"is_error":true,"error":""}', J).toolError, 'tool reported an error')
})

test('R11: a non-string error or output is its message as the reply\'s JSON without whitespace, strings untouched, at any depth', () => {
  assert.equal(mapReply('{"is_error":true,"output":{ "a" : [1, 2],\n "b": "x \\" y\\\\" }}', J).toolError, '{"a":[1,2],"b":"x \\" y\\\\"}')
  assert.equal(mapReply('{"is_error":true,"error":{ "code" : 7 }}', J).toolError, '{"code":7}')
  assert.equal(mapReply('{"is_error":true,"error":5}', J).toolError, '5')
  // Deeper than JSON.stringify manages on a main thread's stack: the message is still the output.
  const deep = '{"a":'.repeat(20_000) + '1' + '}'.repeat(20_000)
  assert.equal(mapReply(`{"is_error":true,"output":${deep}}`, J).toolError, deep)
})

test('R12: non-JSON is text, an empty body is "", other JSON values are the output itself', () => {
  assert.deepEqual(mapReply('hello', 'text/plain'), { text: 'hello', textIsJson: false, toolError: '' })
  assert.deepEqual(mapReply('{broken', J), { text: '{broken', textIsJson: false, toolError: '' })
  assert.deepEqual(mapReply('', J), { text: '', textIsJson: false, toolError: '' })
  assert.deepEqual(mapReply('[1, 2]', J), { text: '[1, 2]', textIsJson: true, toolError: '' })
  assert.deepEqual(mapReply('"quoted"', J), { text: 'quoted', textIsJson: false, toolError: '' })
})

test('the envelope fast path never misreads a body with more keys or duplicate keys', () => {
  const tricky = '{"output":1,"is_error":false,"output":2,"is_error":false}'
  assert.deepEqual(mapReply(tricky, J), { text: '2', textIsJson: true, toolError: '' })
  assert.deepEqual(mapReply('{"output":1,"x":{"a":1},"is_error":false}', J), {
    text: '1',
    textIsJson: true,
    toolError: ''
  })
  assert.equal(mapReply('{"output":1,"is_error":true,"is_error":false}', J).toolError, '')
})

test('property: the fast path and the general reading agree on the output for every envelope', () => {
  fc.assert(fc.property(fc.jsonValue(), fc.boolean(), (output, spaced) => {
    const body = spaced
      ? `{"output": ${JSON.stringify(output)}, "is_error": false}`
      : JSON.stringify({ output, is_error: false })
    const mapped = mapReply(body, J)
    const expected = JSON.parse(body).output
    if (typeof expected === 'string') assert.deepEqual(mapped, { text: expected, textIsJson: false, toolError: '' })
    else {
      assert.equal(mapped.textIsJson, true)
      assert.deepEqual(JSON.parse(mapped.text), expected)
    }
  }), { numRuns: 500 })
})

test('property: a reply read with its text left as bytes decodes to the same text, for every body', () => {
  const bom = Buffer.from([0xef, 0xbb, 0xbf])
  const body = fc.oneof(
    fc.jsonValue().map((output) => JSON.stringify({ output, is_error: false })),
    fc.jsonValue().map((value) => JSON.stringify(value)),
    fc.string({ unit: 'binary' }).map((text) => JSON.stringify({ output: text })),
    fc.string({ unit: 'binary' })
  )
  // What the main thread reads as the result's text (src/main/dispatch/result.ts).
  const replyText = (mapped: MappedReply): string =>
    mapped.bytes === undefined ? mapped.text : decodeReplyText(mapped.bytes)
  fc.assert(fc.property(body, fc.boolean(), fc.constantFrom('application/json', 'text/plain', ''),
    (text, withBom, type) => {
      const bytes = withBom ? Buffer.concat([bom, Buffer.from(text)]) : Buffer.from(text)
      const plain = readReply(bytes, type)
      const asBytes = readReply(bytes, type, undefined, 0)
      assert.equal(plain.bytes, undefined)
      assert.equal(replyText(asBytes), plain.text)
      assert.equal(asBytes.textIsJson, plain.textIsJson)
      assert.equal(asBytes.toolError, plain.toolError)
      if (asBytes.bytes !== undefined) assert.equal(asBytes.text, '')
    }), { numRuns: 1000 })
})
