// Errors of the API itself (docs/protocol.md "Errors of the API itself"): 400 malformed JSON, 413 too large or too
// deep, 415 not JSON, 404 unknown route; every error body is
// `{ ok: false, statusCode, code, error, message, details? }` with a stable TP_ERR_* code.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { request as httpRequest } from 'node:http'
import { PassThrough } from 'node:stream'
import { assertError, createTestToolport, inject, names, startToolport, tool, type JsonReply } from '../helpers.js'
import { Toolport } from '../../src/main/toolport.js'
import { createLogger } from '../../src/main/logger.js'

async function raw (tp: Toolport, payload: string, contentType: string | undefined,
  url = '/api/tools/register'): Promise<JsonReply> {
  const res = await tp.app.inject({
    method: 'POST',
    url,
    payload,
    headers: contentType === undefined ? {} : { 'content-type': contentType }
  })
  return { statusCode: res.statusCode, headers: res.headers, body: JSON.parse(res.body) }
}

const VALID = JSON.stringify(tool('x'))

test('API errors: malformed JSON is 400 TP_ERR_BAD_JSON', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const payload of ['{bad', '{"name": }', '{"name":"x"} trailing', "{'name':'x'}", '{"a":1,}', '[1,2',
    '"unterminated']) {
    assertError(await raw(tp, payload, 'application/json'), 400, 'TP_ERR_BAD_JSON')
  }
  assert.deepEqual(names(tp, 'A'), [])
})

test('API errors: an empty application/json body is 400 TP_ERR_BAD_JSON', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  assertError(await raw(tp, '', 'application/json'), 400, 'TP_ERR_BAD_JSON')
  assertError(await raw(tp, '', 'application/json', '/api/tools/clear'), 400, 'TP_ERR_BAD_JSON')
})

test('R7: well-formed JSON that is not an object (array, null, number, string) is 422 TP_ERR_VALIDATION', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const payload of ['[]', 'null', '42', '"name"', 'true']) {
    assertError(await raw(tp, payload, 'application/json'), 422, 'TP_ERR_VALIDATION')
  }
})

test('API errors: a body over limits.maxBodyBytes is 413 TP_ERR_BODY_TOO_LARGE', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'], limits: { maxBodyBytes: 1024 } })
  const big = JSON.stringify(tool('x', { description: 'd'.repeat(2000) }))
  assertError(await raw(tp, big, 'application/json'), 413, 'TP_ERR_BODY_TOO_LARGE')
  const small = JSON.stringify(tool('x', { description: 'd'.repeat(500) }))
  assert.equal((await raw(tp, small, 'application/json')).statusCode, 200)
})

test('API errors: a chunked body over the limit on a real socket is 413 TP_ERR_BODY_TOO_LARGE', async (t) => {
  const { port, tp } = await startToolport(t, { roles: ['A'], limits: { maxBodyBytes: 1024 } })
  const reply = await new Promise<JsonReply>((resolve, reject) => {
    const req = httpRequest({
      host: '127.0.0.1',
      port,
      method: 'POST',
      path: '/api/tools/register',
      headers: { 'content-type': 'application/json', 'transfer-encoding': 'chunked' }
    }, (res) => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => { text += chunk })
      res.on('end', () => resolve({ statusCode: res.statusCode ?? 0, headers: res.headers, body: JSON.parse(text) }))
    })
    // The server may answer and close before the whole body is written.
    req.on('error', reject)
    req.write('{"name":"x","callback_url":"http://127.0.0.1:9/x","description":"')
    for (let i = 0; i < 4; i++) req.write('d'.repeat(512))
    req.end('"}')
  })
  assertError(reply, 413, 'TP_ERR_BODY_TOO_LARGE')
  assert.deepEqual(names(tp, 'A'), [])
})

test('API errors: JSON nested deeper than limits.maxJsonDepth is 413 TP_ERR_JSON_TOO_DEEP', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  assertError(await raw(tp, '['.repeat(65) + ']'.repeat(65), 'application/json'), 413, 'TP_ERR_JSON_TOO_DEEP')
  const deepParams = JSON.stringify(tool('x', { parameters: nest(70) }))
  assertError(await raw(tp, deepParams, 'application/json'), 413, 'TP_ERR_JSON_TOO_DEEP')
  // Unbalanced, hostile input is refused by depth before JSON.parse sees it.
  assertError(await raw(tp, '['.repeat(100_000), 'application/json'), 413, 'TP_ERR_JSON_TOO_DEEP')
})

test('API errors: JSON exactly at the depth limit is parsed (and then validated)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  assertError(await raw(tp, '['.repeat(64) + ']'.repeat(64), 'application/json'), 422, 'TP_ERR_VALIDATION')
})

test('API errors: the depth limit follows limits.maxJsonDepth', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'], limits: { maxJsonDepth: 4 } })
  // tool body (1) → parameters (2) → properties (3) → q (4): at the limit.
  const atLimit = JSON.stringify(tool('x', { parameters: { properties: { q: { type: 'string' } } } }))
  assert.equal((await raw(tp, atLimit, 'application/json')).statusCode, 200)
  const over = JSON.stringify(tool('y', { parameters: { properties: { q: { items: {} } } } }))
  assertError(await raw(tp, over, 'application/json'), 413, 'TP_ERR_JSON_TOO_DEEP')
})

test('API errors: brackets and escaped quotes inside JSON strings do not count as depth', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const description of ['['.repeat(500), '{'.repeat(500), 'x"' + '['.repeat(200), '\\' + '['.repeat(200),
    '\\"]]]' + '{'.repeat(200)]) {
    const res = await raw(tp, JSON.stringify(tool('x', { description })), 'application/json')
    assert.equal(res.statusCode, 200, JSON.stringify(res.body))
  }
})

test('API errors: a body that is not application/json is 415 TP_ERR_UNSUPPORTED_MEDIA_TYPE', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const type of ['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x',
    'application/json; charset=latin1', 'application/json-patch+json', 'application/jsonx', 'application/xml',
    'text/json', 'application/json; foo=bar']) {
    assertError(await raw(tp, VALID, type), 415, 'TP_ERR_UNSUPPORTED_MEDIA_TYPE')
  }
  assertError(await raw(tp, VALID, undefined), 415, 'TP_ERR_UNSUPPORTED_MEDIA_TYPE')
  assert.deepEqual(names(tp, 'A'), [])
})

test('API errors: every POST route refuses a non-JSON body with 415', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const url of ['/api/tools/register', '/api/tools/unregister', '/api/tools/clear']) {
    assertError(await raw(tp, 'source=plugin:x', 'application/x-www-form-urlencoded', url), 415,
      'TP_ERR_UNSUPPORTED_MEDIA_TYPE')
  }
})

test('API errors: application/json is accepted in any case and with a UTF-8 charset', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const type of ['application/json', 'Application/JSON', 'application/json; charset=utf-8',
    'application/json;charset=UTF-8']) {
    const res = await raw(tp, VALID, type)
    assert.equal(res.statusCode, 200, type)
    assert.equal(res.body.ok, true)
  }
})

test('API errors: an unknown route or method is 404 TP_ERR_ROUTE_NOT_FOUND', async (t) => {
  // `/` is the web console unless it is switched off (test/integration/console-routes.test.ts).
  const tp = await createTestToolport(t, { roles: ['A'], console: false })
  assertError(await inject(tp, 'GET', '/nope'), 404, 'TP_ERR_ROUTE_NOT_FOUND')
  assertError(await inject(tp, 'GET', '/'), 404, 'TP_ERR_ROUTE_NOT_FOUND')
  assertError(await inject(tp, 'GET', '/uix'), 404, 'TP_ERR_ROUTE_NOT_FOUND')
  assertError(await inject(tp, 'POST', '/api/tools/nope', {}), 404, 'TP_ERR_ROUTE_NOT_FOUND')
  assertError(await inject(tp, 'GET', '/api/tools/register'), 404, 'TP_ERR_ROUTE_NOT_FOUND')
  assertError(await inject(tp, 'POST', '/api/tools', {}), 404, 'TP_ERR_ROUTE_NOT_FOUND')
})

test('API errors: an unknown route is 404 TP_ERR_ROUTE_NOT_FOUND whatever its body: none, not JSON, bad JSON, too large or too deep', async (t) => {
  // fastify reads a body before its not-found handler runs; what it makes of the body must not
  // answer for the route (it answered 415, 400 or 413).
  const tp = await createTestToolport(t, { roles: ['A'], console: false, limits: { maxBodyBytes: 1024, maxJsonDepth: 8 } })
  const deep = '['.repeat(20) + ']'.repeat(20)
  for (const [payload, type] of [['', undefined], ['x', 'text/plain'], ['a=1', 'application/x-www-form-urlencoded'],
    ['{bad', 'application/json'], [JSON.stringify({ a: 'x'.repeat(4096) }), 'application/json'], [deep, 'application/json']] as const) {
    for (const url of ['/api/nothing', '/api/tools/nope']) {
      assertError(await raw(tp, payload, type, url), 404, 'TP_ERR_ROUTE_NOT_FOUND')
    }
  }
  const put = await tp.app.inject({ method: 'PUT', url: '/api/tools', payload: 'x', headers: { 'content-type': 'text/plain' } })
  assert.equal(put.statusCode, 404)
  assert.equal(JSON.parse(put.body).code, 'TP_ERR_ROUTE_NOT_FOUND')
  // A route that exists still judges its body.
  assertError(await raw(tp, 'x', 'text/plain'), 415, 'TP_ERR_UNSUPPORTED_MEDIA_TYPE')
  assertError(await raw(tp, '{bad', 'application/json'), 400, 'TP_ERR_BAD_JSON')
  assertError(await raw(tp, deep, 'application/json'), 413, 'TP_ERR_JSON_TOO_DEEP')
})

test('API errors: only 422 carries details, as a list of { path, code, message }', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const notFound = await inject(tp, 'GET', '/api/tools?role=Nobody')
  assertError(notFound, 404, 'TP_ERR_ROLE_NOT_FOUND')
  assert.equal('details' in notFound.body, false)
  const invalid = await inject(tp, 'POST', '/api/tools/register', { name: '' })
  assertError(invalid, 422, 'TP_ERR_VALIDATION')
  assert.ok(Array.isArray(invalid.body.details) && invalid.body.details.length > 0)
  for (const detail of invalid.body.details) {
    assert.deepEqual(Object.keys(detail).sort(), ['code', 'message', 'path'])
  }
})

function nest (depth: number): Record<string, unknown> {
  let value: Record<string, unknown> = { type: 'string' }
  for (let i = 0; i < depth; i++) value = { type: 'object', properties: { child: value } }
  return value
}

test('API errors: a refused request is logged at debug with its code, status, method and route, never its path or body', async (t) => {
  let text = ''
  const sink = new PassThrough().setEncoding('utf8')
  sink.on('data', (chunk: string) => { text += chunk })
  const tp = new Toolport({ roles: ['A'] }, createLogger('debug', { destination: sink }))
  t.after(() => tp.close())
  assertError(await raw(tp, 'not json private-text', 'text/plain'), 415, 'TP_ERR_UNSUPPORTED_MEDIA_TYPE')
  const foreign = await tp.app.inject({ method: 'GET', url: '/api/tools?private-query', headers: { host: 'evil.example' } })
  assert.equal(foreign.statusCode, 403)
  const unknown = await tp.app.inject({ method: 'GET', url: '/api/private-path' })
  assert.equal(unknown.statusCode, 404)
  await new Promise((resolve) => setImmediate(resolve))
  const refused = text.split('\n').filter((line) => line !== '').map((line) => JSON.parse(line) as Record<string, unknown>)
    .filter((line) => line.msg === 'request refused')
    .map(({ code, status, method, route }) => ({ code, status, method, route }))
  assert.deepEqual(refused, [
    { code: 'TP_ERR_UNSUPPORTED_MEDIA_TYPE', status: 415, method: 'POST', route: '/api/tools/register' },
    { code: foreign.json().code, status: 403, method: 'GET', route: '/api/tools' },
    { code: 'TP_ERR_ROUTE_NOT_FOUND', status: 404, method: 'GET', route: undefined }
  ])
  assert.equal(text.includes('private'), false, text)
})
