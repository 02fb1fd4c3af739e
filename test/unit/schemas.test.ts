// The request schemas (docs/protocol.md R2, R7, R15–R18): field rules, defaults, and 422 with details.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import fc from 'fast-check'
import {
  clearSchema, parseOrThrow, registerSchema, unregisterSchema, type RegisterRequest
} from '../../src/main/schemas.js'
import { CALLBACK, isCode } from '../helpers.js'

function register (fields: Record<string, unknown>): RegisterRequest {
  return parseOrThrow(registerSchema, { name: 'get_weather', callback_url: CALLBACK, ...fields })
}

/** The dotted paths of the `details` of a 422 for `fields`. */
function problemPaths (fields: Record<string, unknown>): string[] {
  try {
    register(fields)
  } catch (err) {
    isCode('TP_ERR_VALIDATION', 422)(err)
    return ((err as { details: Array<{ path: string }> }).details).map((d) => d.path)
  }
  assert.fail(`expected ${JSON.stringify(fields)} to fail validation`)
}

test('R7: a registration with only name and callback_url gets every protocol default', () => {
  const parsed = register({})
  assert.equal(parsed.name, 'get_weather')
  assert.equal(parsed.description, '')
  assert.deepEqual(parsed.parameters, { type: 'object', properties: {} })
  assert.equal(parsed.role, null)
  assert.equal(parsed.source, 'external')
  assert.equal(parsed.timeout_seconds, 30)
  assert.equal(parsed.callback_url.href, CALLBACK)
})

test('R7: each default is a fresh object, never shared between registrations', () => {
  const a = register({})
  const b = register({})
  assert.notEqual(a.parameters, b.parameters)
})

test('R7: a given description, parameters, role, source and timeout are kept', () => {
  const parameters = { type: 'object', properties: { location: { type: 'string' } }, required: ['location'] }
  const parsed = register({
    description: 'Get weather.',
    parameters,
    role: 'Lanlan',
    source: 'plugin:weather',
    timeout_seconds: 12.5
  })
  assert.equal(parsed.description, 'Get weather.')
  assert.deepEqual(parsed.parameters, parameters)
  assert.equal(parsed.role, 'Lanlan')
  assert.equal(parsed.source, 'plugin:weather')
  assert.equal(parsed.timeout_seconds, 12.5)
})

test('R7: name is required and must be a string', () => {
  assert.deepEqual(problemPaths({ name: undefined }), ['name'])
  assert.deepEqual(problemPaths({ name: 42 }), ['name'])
  assert.deepEqual(problemPaths({ name: null }), ['name'])
})

test('R7: name is 1 to 64 characters: an empty name and a 65-character name are 422', () => {
  assert.deepEqual(problemPaths({ name: '' }), ['name'])
  assert.deepEqual(problemPaths({ name: 'a'.repeat(65) }), ['name'])
  assert.equal(register({ name: 'a' }).name, 'a')
  assert.equal(register({ name: 'a'.repeat(64) }).name, 'a'.repeat(64))
})

test('R7: name length counts Unicode code points, so 64 astral characters (128 UTF-16 units) are accepted', () => {
  const name = '😀'.repeat(64)
  assert.equal(name.length, 128)
  assert.equal(register({ name }).name, name)
  assert.deepEqual(problemPaths({ name: '😀'.repeat(65) }), ['name'])
  assert.equal(register({ name: '天气'.repeat(32) }).name, '天气'.repeat(32))
})

test('R7 (property): a name is accepted exactly when it has 1 to 64 code points', () => {
  fc.assert(fc.property(fc.string({ unit: 'binary', maxLength: 80 }), (name) => {
    const length = [...name].length
    const ok = length >= 1 && length <= 64
    assert.equal(registerSchema.safeParse({ name, callback_url: CALLBACK }).success, ok, `${length} code points`)
  }), { numRuns: 1000 })
})

test('R7: timeout_seconds accepts a number greater than 0 and at most 300', () => {
  for (const value of [0.001, 1, 30, 299.9, 300]) {
    assert.equal(register({ timeout_seconds: value }).timeout_seconds,
      value)
  }
})

test('R7: timeout_seconds accepts numeric strings and converts them', () => {
  assert.equal(register({ timeout_seconds: '30' }).timeout_seconds, 30)
  assert.equal(register({ timeout_seconds: '2.5' }).timeout_seconds, 2.5)
  assert.equal(register({ timeout_seconds: ' 7 ' }).timeout_seconds, 7)
  assert.equal(register({ timeout_seconds: '1e2' }).timeout_seconds, 100)
  assert.equal(register({ timeout_seconds: '300' }).timeout_seconds, 300)
})

test('R7: timeout_seconds of 0, below 0, above 300, NaN, Infinity, a boolean, null or non-numeric text is 422', () => {
  const bad: unknown[] = [0, -1, 300.0001, 301, Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY,
    true, false, null, '', 'abc', 'NaN', 'Infinity', '0', '301', '-5', '0x10', '1_0', '30s', [30], { s: 30 }]
  for (const value of bad) {
    assert.deepEqual(problemPaths({ timeout_seconds: value }), ['timeout_seconds'], `timeout_seconds ${String(value)}`)
  }
})

test('R7: parameters must be a JSON object: an array, null, a string or a number is 422', () => {
  for (const value of [[], null, 'schema', 3, true]) {
    assert.deepEqual(problemPaths({ parameters: value }), ['parameters'], JSON.stringify(value))
  }
  assert.deepEqual(register({ parameters: {} }).parameters, {})
})

test('R7: description must be a string', () => {
  assert.deepEqual(problemPaths({ description: 3 }), ['description'])
  assert.deepEqual(problemPaths({ description: null }), ['description'])
})

test('R7: role must be a non-empty string or null; null means every current role', () => {
  assert.equal(register({ role: null }).role, null)
  assert.deepEqual(problemPaths({ role: '' }), ['role'])
  assert.deepEqual(problemPaths({ role: 7 }), ['role'])
})

test('R7: source must be a non-empty string', () => {
  assert.deepEqual(problemPaths({ source: '' }), ['source'])
  assert.deepEqual(problemPaths({ source: 1 }), ['source'])
})

test('R2: a non-loopback callback_url is 422 naming callback_url', () => {
  assert.deepEqual(problemPaths({ callback_url: 'http://192.168.1.10:9333/x' }), ['callback_url'])
  assert.deepEqual(problemPaths({ callback_url: 'ftp://127.0.0.1/x' }), ['callback_url'])
  assert.deepEqual(problemPaths({ callback_url: 'http://user:pw@127.0.0.1/x' }), ['callback_url'])
  assert.deepEqual(problemPaths({ callback_url: undefined }), ['callback_url'])
  assert.deepEqual(problemPaths({ callback_url: 42 }), ['callback_url'])
})

test('R2: the accepted callback_url is stored in its canonical WHATWG form', () => {
  assert.equal(register({ callback_url: 'HTTP://LocalHost:80/Tools/x?q=1' }).callback_url.href,
    'http://localhost/Tools/x?q=1')
  assert.equal(register({ callback_url: 'http://[::ffff:127.0.0.1]:9/' }).callback_url.href,
    'http://[::ffff:7f00:1]:9/')
})

test('R7: every failing field is reported, each with its path, a code and a message', () => {
  try {
    register({ name: '', callback_url: 'http://8.8.8.8/', timeout_seconds: 0, parameters: [] })
    assert.fail('expected a validation error')
  } catch (err) {
    isCode('TP_ERR_VALIDATION', 422)(err)
    const details = (err as { details: Array<Record<string, unknown>> }).details
    assert.deepEqual(details.map((d) => d.path).sort(), ['callback_url', 'name', 'parameters', 'timeout_seconds'])
    for (const detail of details) {
      assert.deepEqual(Object.keys(detail).sort(), ['code', 'message', 'path'])
      assert.equal(typeof detail.code, 'string')
      assert.equal(typeof detail.message, 'string')
    }
  }
})

test('R7: a body that is not a JSON object (array, null, string) is 422', () => {
  for (const body of [[], null, 'name', 3]) {
    assert.throws(() => parseOrThrow(registerSchema, body), isCode('TP_ERR_VALIDATION', 422))
  }
})

test('R15: unregister needs a valid name; role defaults to null; expected_source is optional', () => {
  assert.deepEqual(parseOrThrow(unregisterSchema, { name: 'x' }), { name: 'x', role: null })
  assert.deepEqual(parseOrThrow(unregisterSchema, { name: 'x', role: 'A', expected_source: 'plugin:a' }),
    { name: 'x', role: 'A', expected_source: 'plugin:a' })
  assert.throws(() => parseOrThrow(unregisterSchema, {}), isCode('TP_ERR_VALIDATION', 422))
  assert.throws(() => parseOrThrow(unregisterSchema, { name: '' }), isCode('TP_ERR_VALIDATION', 422))
  assert.throws(() => parseOrThrow(unregisterSchema, { name: 'x', expected_source: '' }), isCode('TP_ERR_VALIDATION',
    422))
})

test('R16: clear needs a non-empty source; role defaults to null', () => {
  assert.deepEqual(parseOrThrow(clearSchema, { source: 'plugin:weather' }), { source: 'plugin:weather', role: null })
  assert.throws(() => parseOrThrow(clearSchema, {}), isCode('TP_ERR_VALIDATION', 422))
  assert.throws(() => parseOrThrow(clearSchema, { source: '' }), isCode('TP_ERR_VALIDATION', 422))
  assert.throws(() => parseOrThrow(clearSchema, { source: 'x', role: '' }), isCode('TP_ERR_VALIDATION', 422))
})
