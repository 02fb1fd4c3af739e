// CallCancel: the cheap cancel signal of the HTTP call route (src/shared/cancel.ts).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { CallCancel } from '../../src/shared/cancel.js'

test('CallCancel runs each listener once, in order, including handleEvent objects; abort() twice does nothing more', () => {
  const cancel = new CallCancel()
  const seen: string[] = []
  cancel.addEventListener('abort', () => seen.push('a'))
  cancel.addEventListener('abort', { handleEvent: () => seen.push('b') })
  assert.equal(cancel.aborted, false)
  cancel.abort()
  cancel.abort()
  assert.equal(cancel.aborted, true)
  assert.deepEqual(seen, ['a', 'b'])
})

test('CallCancel: a removed listener never runs, and one added after the abort never runs (as with AbortSignal)', () => {
  const cancel = new CallCancel()
  const seen: string[] = []
  const removed = (): void => { seen.push('removed') }
  cancel.addEventListener('abort', removed)
  cancel.addEventListener('abort', () => seen.push('kept'))
  cancel.removeEventListener('abort', removed)
  cancel.removeEventListener('abort', () => {}) // unknown: ignored
  cancel.abort()
  cancel.addEventListener('abort', () => seen.push('late'))
  assert.deepEqual(seen, ['kept'])
})
