// The public entry: every value exported from src/main/index.ts is public API. A new or
// removed export must change this list, the README and the CHANGELOG together.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import * as entry from '../../src/main/index.js'

const PUBLIC_VALUES = [
  'ERROR_CODES',
  'Runtime',
  'Toolport',
  'checkCallbackUrl',
  'createRealtimeSession',
  'createToolport',
  'isLoopbackAddress',
  'toolDefinitions',
  'toolResultBlock',
  'isToolportError',
  'toolportPlugin'
]

test('library: the entry exports exactly the documented values', () => {
  assert.deepEqual(Object.keys(entry).sort(), [...PUBLIC_VALUES].sort())
})

test('library: the entry has no default export', () => {
  assert.equal('default' in entry, false)
})

test('library: the exported values have the documented kinds', () => {
  assert.equal(typeof entry.createToolport, 'function')
  assert.equal(typeof entry.Toolport, 'function')
  assert.equal(typeof entry.Runtime, 'function')
  assert.equal(typeof entry.toolportPlugin, 'function')
  assert.equal(typeof entry.isToolportError, 'function')
  assert.equal(typeof entry.checkCallbackUrl, 'function')
  assert.equal(typeof entry.isLoopbackAddress, 'function')
  assert.equal(typeof entry.ERROR_CODES, 'object')
  assert.ok(Object.isFrozen(entry.ERROR_CODES))
})
