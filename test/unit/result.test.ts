// The ToolResults built from callback replies (src/main/dispatch/result.ts; docs/protocol.md
// "Model-visible result"): a long output is parsed on first read and a large text is decoded on
// each read, yet such a result looks and copies like a plain one.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mappedReplyResult, outputJsonOf, type ToolResult } from '../../src/main/dispatch/result.js'

const OUTPUT = { items: Array.from({ length: 40 }, (_, id) => ({ id, title: `result number ${id}` })) }
const OUTPUT_JSON = JSON.stringify(OUTPUT)

/** The results of the three lazy kinds, two of each (built from different replies). */
function lazyResults (): Array<{ kind: string, results: [ToolResult, ToolResult], plain: ToolResult }> {
  const bytes = (text: string): Uint8Array => new TextEncoder().encode(text)
  const other = JSON.stringify({ ...OUTPUT, more: true })
  return [
    {
      kind: 'long output',
      results: [mappedReplyResult(OUTPUT_JSON, true, ''), mappedReplyResult(other, true, '')],
      plain: { is_error: false, output: OUTPUT, text: OUTPUT_JSON }
    },
    {
      kind: 'large text (JSON)',
      results: [mappedReplyResult('', true, '', undefined, bytes(OUTPUT_JSON)),
        mappedReplyResult('', true, '', undefined, bytes(other))],
      plain: { is_error: false, output: OUTPUT, text: OUTPUT_JSON }
    },
    {
      kind: 'tool error with output',
      results: [
        mappedReplyResult(`{"error":"bad city","output":${OUTPUT_JSON}}`, true, 'bad city'),
        mappedReplyResult(`{"error":"bad day","output":${other}}`, true, 'bad day')
      ],
      plain: { is_error: true, output: OUTPUT, text: `{"error":"bad city","output":${OUTPUT_JSON}}`, error: 'bad city' }
    }
  ]
}

test('model-visible result: a lazy result has the plain result\'s properties, values and order', () => {
  for (const { kind, results: [result], plain } of lazyResults()) {
    assert.deepEqual(Object.keys(result), Object.keys(plain), kind)
    assert.equal(JSON.stringify(result), JSON.stringify(plain), kind)
    assert.deepEqual({ ...result }, plain, kind)
    assert.equal(result.output, result.output, `${kind}: parsed once, the same value on each read`)
    assert.equal(result.text, plain.text, kind)
  }
})

test('model-visible result: a lazy result\'s output and text can be assigned, as a plain result\'s (the ToolResult type says they are writable)', () => {
  for (const { kind, results: [result], plain } of lazyResults()) {
    result.output = { redacted: true }
    result.text = '[redacted]'
    assert.deepEqual(result.output, { redacted: true }, kind)
    assert.equal(result.text, '[redacted]', kind)
    assert.deepEqual(Object.keys(result), Object.keys(plain), `${kind}: the same properties in the same order`)
    assert.equal(JSON.stringify(result), JSON.stringify({ ...plain, output: { redacted: true }, text: '[redacted]' }), kind)
  }
})

test('model-visible result: a lazy result\'s getters are shared, not closures made per result', () => {
  // A getter made per result would be kept in an accessor pair V8 allocates in the old generation,
  // holding the reply's bytes or JSON alive until a full collection (see result.ts).
  for (const { kind, results: [a, b] } of lazyResults()) {
    for (const name of ['output', 'text']) {
      const getterA = Object.getOwnPropertyDescriptor(a, name)?.get
      const getterB = Object.getOwnPropertyDescriptor(b, name)?.get
      if (getterA === undefined) {
        assert.equal(getterB, undefined, `${kind}.${name}`)
        continue
      }
      assert.equal(getterA, getterB, `${kind}.${name}`)
    }
    assert.notDeepEqual(a, b, `${kind}: each result reads its own reply`)
  }
})

test('model-visible result: the output\'s JSON of a reply result is known without parsing; a copy\'s is not', () => {
  for (const { kind, results: [result], plain } of lazyResults()) {
    const text = result.text
    const expected = kind === 'tool error with output' ? OUTPUT_JSON : plain.text
    assert.equal(outputJsonOf(result, text, JSON.stringify(text)), expected, kind)
    assert.equal(outputJsonOf({ ...result }, text, JSON.stringify(text)), undefined, kind)
  }
  const textOutput = mappedReplyResult('', false, '', undefined, new TextEncoder().encode('x'.repeat(20_000)))
  assert.equal(outputJsonOf(textOutput, textOutput.text, 'TEXT_JSON'), 'TEXT_JSON')
  assert.equal(outputJsonOf(mappedReplyResult('{"t":1}', true, ''), '{"t":1}', '"{\\"t\\":1}"'), undefined)
})
