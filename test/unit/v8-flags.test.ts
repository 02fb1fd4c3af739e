// The V8 setting `toolport serve` applies to itself (src/main/v8-flags.ts): set unless the node
// command line already chose, in either sense.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { applyServerV8Flags, SERVER_V8_FLAGS } from '../../src/main/v8-flags.js'

test('serve sets --no-allocation-site-pretenuring unless the node command line names the flag either way', () => {
  assert.deepEqual(SERVER_V8_FLAGS, ['--no-allocation-site-pretenuring'])
  assert.deepEqual(applyServerV8Flags([]), ['--no-allocation-site-pretenuring'])
  assert.deepEqual(applyServerV8Flags(['--max-old-space-size=512', '--import', 'tsx']), ['--no-allocation-site-pretenuring'])
  for (const own of ['--allocation-site-pretenuring', '--no-allocation-site-pretenuring', '--allocation_site_pretenuring',
    '--no_allocation_site_pretenuring', '--noallocation-site-pretenuring']) {
    assert.deepEqual(applyServerV8Flags(['--enable-source-maps', own]), [], own)
  }
  // A longer flag that merely starts with the same words is another flag.
  assert.deepEqual(applyServerV8Flags(['--allocation-site-pretenuring-statistics']), ['--no-allocation-site-pretenuring'])
})
