// The error catalogue: every code has an HTTP status, every error class of
// src/main/errors.ts is in the catalogue with that status, and the protocol's statuses hold.
// (The README error table is checked elsewhere.)
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { STATUS_CODES } from 'node:http'
import * as errors from '../../src/main/errors.js'
import { ERROR_CODES, isToolportError } from '../../src/main/errors.js'

type ErrorClass = new (...args: string[]) => Error & { code: string, statusCode: number }

/** Every exported constructor of src/main/errors.ts that builds a catalogue error. */
function errorClasses (): Array<[string, ErrorClass]> {
  const out: Array<[string, ErrorClass]> = []
  for (const [name, value] of Object.entries(errors)) {
    if (typeof value !== 'function' || !/^[A-Z]/.test(name)) continue
    out.push([name, value as unknown as ErrorClass])
  }
  return out
}

test('errors: every code in ERROR_CODES is TP_ERR_<AREA>_<WHAT> with an HTTP error status', () => {
  assert.ok(Object.keys(ERROR_CODES).length > 0)
  for (const [code, status] of Object.entries(ERROR_CODES)) {
    assert.match(code, /^TP_ERR_[A-Z0-9]+(_[A-Z0-9]+)*$/)
    assert.ok(Number.isInteger(status) && status >= 400 && status <= 599, `${code}: ${status}`)
    assert.ok(STATUS_CODES[status] !== undefined, `${code}: ${status} is not a known HTTP status`)
  }
})

test('errors: every error class is in the catalogue with the same status, and every catalogue code has a class', () => {
  const seen = new Set<string>()
  for (const [name, ErrorClass] of errorClasses()) {
    const err = new ErrorClass('x')
    assert.ok(err instanceof Error, name)
    assert.equal(ERROR_CODES[err.code], err.statusCode, `${name} (${err.code})`)
    assert.equal(isToolportError(err), true, name)
    seen.add(err.code)
  }
  assert.deepEqual([...seen].sort(), Object.keys(ERROR_CODES).sort())
})

test('errors: the protocol statuses hold: 403 not loopback (R1), 404 unknown role (R6), 422 validation (R2, R7)', () => {
  assert.equal(ERROR_CODES.TP_ERR_NOT_LOOPBACK, 403)
  assert.equal(ERROR_CODES.TP_ERR_ROLE_NOT_FOUND, 404)
  assert.equal(ERROR_CODES.TP_ERR_VALIDATION, 422)
})

test('errors: the statuses beyond the protocol hold: 400 bad JSON, 413 too large or deep, 415 not JSON, 404 no route', () => {
  assert.equal(ERROR_CODES.TP_ERR_BAD_JSON, 400)
  assert.equal(ERROR_CODES.TP_ERR_BODY_TOO_LARGE, 413)
  assert.equal(ERROR_CODES.TP_ERR_JSON_TOO_DEEP, 413)
  assert.equal(ERROR_CODES.TP_ERR_UNSUPPORTED_MEDIA_TYPE, 415)
  assert.equal(ERROR_CODES.TP_ERR_ROUTE_NOT_FOUND, 404)
  assert.equal(ERROR_CODES.TP_ERR_HOST_FORBIDDEN, 403)
  assert.equal(ERROR_CODES.TP_ERR_ORIGIN_FORBIDDEN, 403)
})

test('errors: isToolportError is false for plain errors and for foreign codes', () => {
  assert.equal(isToolportError(new Error('x')), false)
  assert.equal(isToolportError(Object.assign(new Error('x'), { code: 'FST_ERR_CTP_BODY_TOO_LARGE' })), false)
  assert.equal(isToolportError(Object.assign(new Error('x'), { code: 'toString' })), false)
  assert.equal(isToolportError({ code: 'TP_ERR_VALIDATION', statusCode: 422 }), false)
  assert.equal(isToolportError(undefined), false)
})

test('errors: validationError builds a 422 TP_ERR_VALIDATION carrying its details', () => {
  const details = [{ path: 'name', code: 'custom', message: 'must be 1 to 64 characters' }]
  const err = errors.validationError(details)
  assert.equal(err.code, 'TP_ERR_VALIDATION')
  assert.equal(err.statusCode, 422)
  assert.deepEqual(err.details, details)
})
