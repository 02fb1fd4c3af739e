// The V8 setting `toolport serve` applies to itself (src/main/v8-flags.ts): set unless the node
// command line already chose, in either sense.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { applyServerV8Flags, SERVER_V8_FLAGS } from '../../src/main/v8-flags.js'

test('serve sets its two flags, each unless the node command line names that flag either way', () => {
  const both = ['--no-allocation-site-pretenuring', '--heap-growing-percent=300']
  assert.deepEqual(SERVER_V8_FLAGS, both)
  assert.deepEqual(applyServerV8Flags([]), both)
  assert.deepEqual(applyServerV8Flags(['--max-old-space-size=512', '--import', 'tsx']), both)
  for (const own of ['--allocation-site-pretenuring', '--no-allocation-site-pretenuring', '--allocation_site_pretenuring',
    '--no_allocation_site_pretenuring', '--noallocation-site-pretenuring']) {
    assert.deepEqual(applyServerV8Flags(['--enable-source-maps', own]), ['--heap-growing-percent=300'], own)
  }
  for (const own of ['--heap-growing-percent=0', '--heap_growing_percent=50']) {
    assert.deepEqual(applyServerV8Flags([own]), ['--no-allocation-site-pretenuring'], own)
  }
  assert.deepEqual(applyServerV8Flags(['--allocation-site-pretenuring', '--heap-growing-percent=100']), [])
  // A longer flag that merely starts with the same words is another flag.
  assert.deepEqual(applyServerV8Flags(['--allocation-site-pretenuring-statistics']), both)
})
