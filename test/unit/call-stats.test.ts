// The console's per-second call statistics: fixed size whatever the call count.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { CallStats, MAX_SERIES, WINDOW_SECONDS } from '../../src/main/observe/call-stats.js'

const T0 = 1_800_000_000_000

test('calls are counted per second and per tool, with p50 and p99 of their latency', () => {
  const stats = new CallStats()
  for (let i = 0; i < 100; i++) stats.record('Lanlan', 'get_weather', i < 98 ? 10 : 1000, i === 0, T0 + 10)
  stats.record('Lanlan', 'get_weather', 5, false, T0 + 1000)
  stats.record('Lanlan', null, 1, true, T0 + 1000)
  const snap = stats.snapshot(5, T0 + 1500)
  assert.equal(snap.all.calls.length, WINDOW_SECONDS)
  assert.deepEqual(snap.all.calls.slice(-2), [100, 2])
  assert.deepEqual(snap.all.errors.slice(-2), [1, 1])
  assert.equal(snap.all.total, 102)
  const tool = snap.tools[0]
  assert.ok(tool !== undefined)
  assert.equal(tool.tool, 'get_weather')
  assert.equal(tool.total, 101, 'a call to no tool counts in the total only')
  const p50 = tool.p50.at(-2) as number
  const p99 = tool.p99.at(-2) as number
  // Log buckets: within a factor of two of the true values (10 ms and 1000 ms).
  assert.ok(p50 >= 5 && p50 <= 20, `p50 ${p50}`)
  assert.ok(p99 >= 500 && p99 <= 2000, `p99 ${p99}`)
  assert.equal(tool.p50[0], null, 'a second without calls has no percentile')
})

test('percentiles stay within the range of the second\'s calls: eight calls of 103.8–109.4 ms (one doubling bucket) read inside it, not as p50 145 / p99 203 ms', () => {
  const stats = new CallStats()
  for (const ms of [103.8, 104.5, 105.2, 106, 106.9, 107.7, 108.6, 109.4]) stats.record('r', 't', ms, false, T0)
  for (const ms of [5, 5, 5]) stats.record('r', 'same', ms, false, T0)
  const check = (snap: ReturnType<CallStats['snapshot']>, at: number, what: string): void => {
    const series = snap.tools.find((s) => s.tool === 't')
    const p50 = series?.p50.at(at) as number
    const p99 = series?.p99.at(at) as number
    assert.ok(p50 >= 103.8 && p50 <= 109.4, `${what}: p50 ${p50}`)
    assert.ok(p99 >= p50 && p99 <= 109.4, `${what}: p99 ${p99}`)
    const same = snap.tools.find((s) => s.tool === 'same')
    assert.deepEqual([same?.p50.at(at), same?.p99.at(at)], [5, 5], what)
  }
  check(stats.snapshot(2, T0 + 500), -1, 'the second in progress')
  stats.record('r', 't', 1, false, T0 + 1000)
  stats.record('r', 'same', 1, false, T0 + 1000)
  check(stats.snapshot(2, T0 + 1500), -2, 'the second once closed')
})

test('seconds older than the window are forgotten, and a slot is reused for a new second', () => {
  const stats = new CallStats()
  stats.record('r', 't', 1, false, T0)
  stats.record('r', 't', 1, false, T0 + WINDOW_SECONDS * 1000)
  const snap = stats.snapshot(1, T0 + WINDOW_SECONDS * 1000)
  assert.equal(snap.all.total, 1)
  assert.equal(snap.tools[0]?.total, 1)
  assert.equal(stats.snapshot(1, T0 + 2 * WINDOW_SECONDS * 1000 + 1000).tools.length, 0)
})

test('at most MAX_SERIES tools are tracked: the least recently called one makes room', () => {
  const stats = new CallStats()
  for (let i = 0; i <= MAX_SERIES; i++) stats.record('r', `tool_${i}`, 1, false, T0 + i * 10)
  const tools = stats.snapshot(MAX_SERIES + 10, T0 + MAX_SERIES * 10).tools.map((s) => s.tool)
  assert.equal(tools.length, MAX_SERIES)
  assert.ok(!tools.includes('tool_0'))
  assert.ok(tools.includes(`tool_${MAX_SERIES}`))
})
