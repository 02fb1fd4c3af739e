// The bench's closed loop (bench/lib/loop.ts): which warm-up runs before the measured window.
// One caller and a window that ends after WINDOW_CALLS calls: every call made beyond those was a
// warm-up call, so "was there a warm-up" is counted, not timed. The loop's own record of its
// warm-up (`warmupMs`) is only checked from below (it never ends before its minimum).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { closedLoop } from '../../bench/lib/loop.js'

const WINDOW_CALLS = 50

function countingCall (): { call: () => Promise<boolean>, made: () => number } {
  let made = 0
  return {
    async call (): Promise<boolean> {
      made++
      await new Promise((resolve) => setImmediate(resolve))
      return true
    },
    made: () => made
  }
}

const WINDOW = { concurrency: 1, durationMs: 600_000, maxCalls: WINDOW_CALLS }

test('bench loop: a steady warm-up runs even when the fixed warm-up is 0 ms', async () => {
  const { call, made } = countingCall()
  const result = await closedLoop(call, {
    ...WINDOW,
    warmupMs: 0,
    steady: { minMs: 150, maxMs: 400, chunkMs: 50, tolerance: 0.5 }
  })
  assert.equal(result.calls, WINDOW_CALLS)
  assert.ok(made() > WINDOW_CALLS, `${made()} calls made: none before the window`)
  assert.ok(result.warmupMs >= 150, `warm-up ${result.warmupMs} ms, under its minimum`)
})

test('bench loop: without a steady warm-up, 0 ms measures from the first call and a fixed one is kept', async () => {
  const none = countingCall()
  const atOnce = await closedLoop(none.call, { ...WINDOW, warmupMs: 0 })
  assert.equal(atOnce.calls, WINDOW_CALLS)
  assert.equal(none.made(), WINDOW_CALLS, 'every call made was measured')
  const fixed = countingCall()
  const warmed = await closedLoop(fixed.call, { ...WINDOW, warmupMs: 100 })
  assert.ok(fixed.made() > WINDOW_CALLS, `${fixed.made()} calls made: none before the window`)
  assert.ok(warmed.warmupMs >= 100, `warm-up ${warmed.warmupMs} ms, under its minimum`)
})
