// GET /api/tools/definitions with many large tools: the answer is streamed with an exact
// Content-Length, and past limits.maxDefinitionsBytes it is a clear 422 naming the cap — never a
// 500 (one JSON string of 9000 tools × 60 KB schemas is longer than V8 allows).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { request } from 'undici'
import { toolDefinitions, type Toolport } from '../../src/main/index.js'
import { DEFINITION_FORMATS } from '../../src/main/sessions/definitions.js'
import { definitionsBody } from '../../src/main/http/definitions-body.js'
import { assertError, createTestToolport, inject, startToolport } from '../helpers.js'

/** A `parameters` schema of about `bytes` bytes of JSON. */
function bigSchema (bytes: number, seed: number): Record<string, unknown> {
  const properties: Record<string, unknown> = {}
  for (let i = 0; i * 1000 < bytes; i++) {
    properties[`p${i}`] = {
      type: 'string',
      description: `${seed}:`.padEnd(950,
        'x')
    }
  }
  return { type: 'object', properties }
}

async function registerMany (tp: Toolport, count: number, schemaBytes: number): Promise<void> {
  for (let i = 0; i < count; i++) {
    const result = await tp.register({
      name: `tool_${i}`,
      callback_url: 'http://127.0.0.1:9/t',
      parameters: bigSchema(schemaBytes, i),
      source: 'plugin:big'
    })
    assert.equal(result.ok, true)
  }
}

test('definitions past limits.maxDefinitionsBytes answer 422 TP_ERR_LIMIT_EXCEEDED naming the cap, in every format', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'], limits: { maxDefinitionsBytes: 64 * 1024 } })
  await registerMany(tp, 20, 8000)
  for (const format of DEFINITION_FORMATS) {
    const reply = await inject(tp, 'GET', `/api/tools/definitions?role=A&format=${format}`)
    assertError(reply, 422, 'TP_ERR_LIMIT_EXCEEDED')
    assert.deepEqual(reply.body.details.map((d: { path: string }) => d.path), ['limits.maxDefinitionsBytes'])
  }
  // Asking again (the size is remembered per registry snapshot) answers the same.
  assertError(await inject(tp, 'GET', '/api/tools/definitions?role=A'), 422, 'TP_ERR_LIMIT_EXCEEDED')
  // Below the cap, the same route answers: 5 tools fit.
  await tp.clear({ source: 'plugin:big' })
  await registerMany(tp, 5, 8000)
  assert.equal((await inject(tp, 'GET', '/api/tools/definitions?role=A')).statusCode, 200)
})

test('many large definitions are streamed over a real socket with an exact Content-Length, equal to toolDefinitions', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  // 200 tools × ~60 KB schemas: 12 MB of JSON (bounded; the streaming path is the same at 540 MB).
  await registerMany(tp, 200, 60_000)
  for (const format of ['openai-chat', 'gemini'] as const) {
    const res = await request(`${url}/api/tools/definitions?role=A&format=${format}`)
    const text = await res.body.text()
    assert.equal(res.statusCode, 200)
    assert.match(String(res.headers['content-type']), /^application\/json/)
    assert.equal(Number(res.headers['content-length']), Buffer.byteLength(text))
    assert.ok(Buffer.byteLength(text) > 10_000_000)
    assert.deepEqual(JSON.parse(text), {
      ok: true,
      role: 'A',
      format,
      tools: toolDefinitions(tp.roles.get('A'),
        format)
    })
  }
  // A role with no tools streams an empty list (Gemini's too).
  tp.roles.add('B')
  for (const format of DEFINITION_FORMATS) {
    const res = await request(`${url}/api/tools/definitions?role=B&format=${format}`)
    assert.deepEqual(await res.body.json(), { ok: true, role: 'B', format, tools: [] })
  }
})

test('the definitions body is never one string: it is written in pieces of about 64 KiB plus one tool', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await registerMany(tp, 40, 60_000)
  const body = await definitionsBody(tp.roles.get('A'), 'mcp', 1024 ** 3)
  let total = 0
  let largest = 0
  let pieces = 0
  for await (const chunk of body.stream()) {
    pieces++
    total += (chunk as Buffer).length
    largest = Math.max(largest, (chunk as Buffer).length)
  }
  assert.equal(total, body.bytes)
  assert.ok(pieces >= 20, `${pieces} pieces`)
  assert.ok(largest < 64 * 1024 + 70_000, `largest piece ${largest} bytes`)
})
