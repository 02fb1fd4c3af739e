// The reader of `perf script -F tid,ip,sym` output behind `npm run profile` (bench/lib/perf-script.ts),
// on an excerpt in perf's exact layout (tids right-aligned, frames tab-indented, leaf first).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { parsePerfScript, profileByGroup } from '../../bench/lib/perf-script.js'

const EXCERPT = [
  '   5204 ',
  '\t          9d740d node::StreamBase::Writev',
  '\t             d3b JS:*clearBuffer node:internal/streams/writable:744:21',
  '\t    7feba42f8e7b [unknown]',
  '',
  '   5204 ',
  '\t             5bb JS:*onHeadersComplete /work/undici/lib/dispatcher/client-h1.js:581:21',
  '\t             489 JS:*execute /work/undici/lib/dispatcher/client-h1.js:320:11',
  '\t             d3b JS:*clearBuffer node:internal/streams/writable:744:21',
  '',
  '  51650 ',
  '\t          14d1546 Builtins_CallApiCallback+0x46 (/usr/bin/node)',
  '\t             3e1',
  '',
  ' 5165 ',
  '\t   ffffffff8136963d pvm_irq_enable',
  ''
].join('\n')

test('perf script output: one sample per header, frames leaf first, offsets and DSOs dropped, bare addresses unknown', () => {
  const samples = parsePerfScript(EXCERPT)
  assert.deepEqual(samples.map((s) => s.tid), [5204, 5204, 51650, 5165])
  assert.deepEqual(samples[0]?.frames, ['node::StreamBase::Writev', 'JS:*clearBuffer node:internal/streams/writable:744:21',
    '[unknown]'])
  assert.deepEqual(samples[2]?.frames, ['Builtins_CallApiCallback', '[unknown]'])
})

test('profileByGroup: shares per thread group, self by leaf, inclusive counts each JavaScript function once per sample', () => {
  const samples = parsePerfScript(EXCERPT)
  const groups = profileByGroup(samples, (tid) => tid === 5165 ? 'main' : tid === 5204 ? 'worker' : 'other', 10)
  assert.deepEqual(groups.map((g) => [g.name, g.samples, g.share]), [['worker', 2, 0.5], ['other', 1, 0.25],
    ['main', 1, 0.25]])
  const worker = groups[0]
  assert.ok(worker !== undefined)
  assert.deepEqual(worker.self, [
    { symbol: 'node::StreamBase::Writev', samples: 1 },
    { symbol: 'JS:*onHeadersComplete /work/undici/lib/dispatcher/client-h1.js:581:21', samples: 1 }
  ])
  assert.deepEqual(worker.inclusive[0], { symbol: 'JS:*clearBuffer node:internal/streams/writable:744:21', samples: 2 })
  assert.equal(worker.inclusive.length, 3)
  assert.ok(worker.inclusive.every((entry) => entry.symbol.startsWith('JS:')))
})
