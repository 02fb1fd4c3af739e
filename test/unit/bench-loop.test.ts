// The bench's closed loop (bench/lib/loop.ts): which warm-up runs before the measured window.
// Asserted on the loop's own record of its warm-up (`warmupMs`, the time from its start to the
// window's), with a call that only yields a turn, so the figures do not depend on the machine.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { closedLoop } from '../../bench/lib/loop.js'

async function yieldingCall (): Promise<boolean> {
  await new Promise((resolve) => setImmediate(resolve))
  return true
}

test('bench loop: a steady warm-up runs even when the fixed warm-up is 0 ms', async () => {
  const result = await closedLoop(yieldingCall, {
    concurrency: 2,
    warmupMs: 0,
    steady: { minMs: 150, maxMs: 400, chunkMs: 50, tolerance: 0.5 },
    durationMs: 20,
    maxCalls: 1_000_000
  })
  // It ends no earlier than minMs (how much later depends on the machine: not asserted).
  assert.ok(result.warmupMs >= 150, `warm-up ${result.warmupMs} ms`)
  assert.ok(result.calls > 0)
})

test('bench loop: without a steady warm-up, 0 ms measures at once and a fixed one is kept', async () => {
  const none = await closedLoop(yieldingCall, { concurrency: 2, warmupMs: 0, durationMs: 20, maxCalls: 1_000_000 })
  // The window opens before the first call is made (the record is the few µs in between).
  assert.ok(none.warmupMs < 5, `warm-up ${none.warmupMs} ms`)
  const fixed = await closedLoop(yieldingCall, { concurrency: 2, warmupMs: 100, durationMs: 20, maxCalls: 1_000_000 })
  assert.ok(fixed.warmupMs >= 100, `warm-up ${fixed.warmupMs} ms`)
})
