// The body of POST /api/tools/call (src/main/http/tools.ts; docs/protocol.md "Model-visible
// result"): the ToolResult's JSON, built from the reply's own text where it can be, a string when
// short and one Buffer when long. Either way it must be exactly the result's JSON.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { toolResultBody } from '../../src/main/http/tools.js'
import { errorResult, mappedReplyResult, outputResult, type ToolResult } from '../../src/main/dispatch/result.js'

const records = (count: number): unknown => ({
  items: Array.from({ length: count }, (_, id) => ({ id, title: `"result" ${id}`, note: 'ünïcode 🦊 \\ \u0001' }))
})

/** What the body must parse to: the result's own enumerable members, read through its getters. */
function expected (result: ToolResult): unknown {
  return JSON.parse(JSON.stringify(result))
}

function bodyText (body: string | Buffer): string {
  return typeof body === 'string' ? body : body.toString('utf8')
}

test('call route: short bodies are strings, long ones Buffers, and both are the result\'s JSON', () => {
  const big = records(600)
  const bigJson = JSON.stringify(big)
  const bytes = new TextEncoder().encode(bigJson)
  const cases: Array<[string, ToolResult, 'string' | 'buffer']> = [
    ['small output', outputResult({ t: 28 }), 'string'],
    ['small error', errorResult('bad city'), 'string'],
    ['long output, parsed lazily', mappedReplyResult(bigJson, true, ''), 'buffer'],
    ['large text decoded on read', mappedReplyResult('', true, '', undefined, bytes), 'buffer'],
    ['large string output', mappedReplyResult('', false, '', undefined, new TextEncoder().encode('ä"'.repeat(20_000))), 'buffer'],
    ['large tool error with output', mappedReplyResult(`{"error":"bad \\"day\\"","output":${bigJson}}`, true, 'bad "day"'), 'buffer'],
    ['large output built in this process', outputResult(big), 'buffer']
  ]
  const withImages = outputResult(big)
  withImages.images = [{ mime_type: 'image/png', data_base64: 'iVBORw0KGgo=', prompt: 'a "fox"' }]
  cases.push(['large output with images', withImages, 'buffer'])
  for (const [what, result, kind] of cases) {
    const body = toolResultBody(result)
    assert.equal(typeof body === 'string' ? 'string' : 'buffer', kind, what)
    assert.deepEqual(JSON.parse(bodyText(body)), expected(result), what)
    if (typeof body !== 'string') assert.equal(body.length, Buffer.byteLength(bodyText(body)), `${what}: no slack bytes`)
  }
})
