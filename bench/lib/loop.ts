// Closed-loop load: `concurrency` callers, each issuing its next call as soon as its previous one
// answered. Bounded twice: a measuring window in ms AND a maximum number of calls, whichever ends
// first; a warm-up (time and count bounded too) opens connections and warms the JIT first.
//
// Latency is recorded per call in µs into an HDR histogram (3 significant digits). Throughput is
// the calls completed inside the window divided by the window, so the ramp-up and the drain at the
// end (in-flight calls finishing after the window) do not count.
import { build } from 'hdr-histogram-js'
import type { Histogram } from 'hdr-histogram-js'
import { processCpuUs } from './cpu.js'
import type { CpuMeter, CpuPerCall } from './cpu.js'

/**
 * Warm up until CPU per call is steady: the warm-up is cut into chunks, and the window opens once
 * two consecutive chunks' process CPU per call agree within `tolerance` and `minMs` have passed
 * (at most `maxMs`). Short fixed warm-ups left TurboFan compiling inside the measured window.
 */
export interface SteadyWarmup {
  minMs: number
  maxMs: number
  chunkMs: number
  /** Relative difference between consecutive chunks' CPU per call, e.g. 0.1. */
  tolerance: number
}

/**
 * The bench's warm-up policy for a path measured over repetitions: its first loop warms up until
 * CPU per call is steady; its later loops, already compiled, for `laterMs` only (for sockets that
 * idled in between). A steady warm-up before every window would add ~10 min to a full run.
 */
export interface Warmups {
  steady: SteadyWarmup
  laterMs: number
}

/** The warm-ups of a full run, or of a quick one (`npm run bench -- --quick`). */
export function benchWarmups (isQuick: boolean): Warmups {
  return isQuick
    ? { steady: { minMs: 100, maxMs: 400, chunkMs: 100, tolerance: 0.2 }, laterMs: 50 }
    : { steady: { minMs: 1_000, maxMs: 3_000, chunkMs: 250, tolerance: 0.08 }, laterMs: 200 }
}

/** The warm-up options of repetition `rep` (0-based) under `warmups`. */
export function warmupFor (warmups: Warmups, rep: number): Pick<LoopOptions, 'warmupMs' | 'steady'> {
  return rep === 0 ? { warmupMs: 0, steady: warmups.steady } : { warmupMs: warmups.laterMs }
}

/** How loops warm up under `w`, as a clause for a scenario's notes (no capital, no full stop). */
export function describeWarmups (w: Warmups): string {
  const { steady } = w
  return `a path's first loop warms up until two consecutive ${steady.chunkMs} ms chunks agree on CPU per call ` +
    `within ${(steady.tolerance * 100).toFixed(0)} % (at least ${steady.minMs} ms, at most ${steady.maxMs} ms), ` +
    `its later repetitions, already compiled, for ${w.laterMs} ms`
}

export interface LoopOptions {
  concurrency: number
  /** Warm-up time before the window; also ends after `warmupMaxCalls`. */
  warmupMs: number
  warmupMaxCalls?: number
  /** Length of the measuring window. */
  durationMs: number
  /** The window also ends after this many completed calls. */
  maxCalls: number
  /** Measures CPU per call over the window (process, main thread, callback server). */
  cpu?: CpuMeter
  /** Replaces `warmupMs`/`warmupMaxCalls` (even 0) with a warm-up that ends when CPU per call is steady. */
  steady?: SteadyWarmup
}

export interface LoopResult {
  /** Calls completed in the window. */
  calls: number
  /** Calls in the window that failed (the call function returned false or threw). */
  errors: number
  /** The window's real length in ms. */
  windowMs: number
  /** Completed calls per second in the window. */
  rps: number
  p50Us: number
  p90Us: number
  p99Us: number
  maxUs: number
  meanUs: number
  /** CPU per call over the window, when a meter was given. */
  cpu: CpuPerCall | null
  /** The warm-up's real length in ms. */
  warmupMs: number
}

/** A histogram of µs values, 1 µs to 10 min, 3 significant digits. */
export function createHistogram (): Histogram {
  return build({ lowestDiscernibleValue: 1, highestTrackableValue: 600_000_000, numberOfSignificantValueDigits: 3 })
}

/**
 * Runs a closed loop of `call` and measures it. `call` resolves true for a successful call; a
 * rejection counts as a failure (it never escapes).
 */
export async function closedLoop (call: () => Promise<boolean>, options: LoopOptions): Promise<LoopResult> {
  const histogram = createHistogram()
  // 0 warm-up, 1 measuring, 2 stopping
  let phase = 0
  let warmupCalls = 0
  const steady = options.steady
  const warmupMax = steady !== undefined
    ? Number.POSITIVE_INFINITY
    : (options.warmupMaxCalls ??
    Number.POSITIVE_INFINITY)
  const warmupStart = performance.now()
  const warmupEnd = warmupStart + (steady !== undefined ? steady.maxMs : options.warmupMs)
  const steadyMinEnd = warmupStart + (steady?.minMs ?? 0)
  let chunkEnd = warmupStart + (steady?.chunkMs ?? 0)
  let chunkCpu = processCpuUs()
  let chunkCalls = 0
  let lastPerCall = Number.NaN
  let windowStart = 0
  let windowEnd = 0
  let lastCompletion = 0
  let calls = 0
  let errors = 0
  let cpu: CpuPerCall | null = null
  const meter = options.cpu
  if (steady === undefined && options.warmupMs <= 0) {
    phase = 1
    meter?.begin()
    windowStart = performance.now()
    windowEnd = windowStart + options.durationMs
  }

  async function caller (): Promise<void> {
    while (phase !== 2) {
      const t0 = performance.now()
      let ok: boolean
      try {
        ok = await call()
      } catch {
        ok = false
      }
      const t1 = performance.now()
      if (phase === 0) {
        warmupCalls++
        let isSteady = false
        if (steady !== undefined && t1 >= chunkEnd) {
          const cpuNow = processCpuUs()
          const perCall = (cpuNow - chunkCpu) / Math.max(1, warmupCalls - chunkCalls)
          isSteady = t1 >= steadyMinEnd && Math.abs(perCall - lastPerCall) <= steady.tolerance * lastPerCall
          lastPerCall = perCall
          chunkCpu = cpuNow
          chunkCalls = warmupCalls
          chunkEnd = t1 + steady.chunkMs
        }
        if (isSteady || t1 >= warmupEnd || warmupCalls >= warmupMax) {
          phase = 1
          meter?.begin()
          windowStart = t1
          windowEnd = t1 + options.durationMs
        }
        continue
      }
      if (phase !== 1) continue
      if (t1 > windowEnd) {
        phase = 2
        lastCompletion = windowEnd
        if (meter !== undefined) cpu = meter.end(calls)
        continue
      }
      calls++
      if (!ok) errors++
      histogram.recordValue(Math.max(1, Math.round((t1 - t0) * 1000)))
      if (calls >= options.maxCalls) {
        phase = 2
        lastCompletion = t1
        if (meter !== undefined) cpu = meter.end(calls)
      }
    }
  }

  const callers: Promise<void>[] = []
  for (let i = 0; i < options.concurrency; i++) callers.push(caller())
  await Promise.all(callers)
  const windowMs = Math.max(1e-3, lastCompletion - windowStart)
  const result: LoopResult = {
    calls,
    errors,
    windowMs,
    rps: calls / (windowMs / 1000),
    p50Us: histogram.getValueAtPercentile(50),
    p90Us: histogram.getValueAtPercentile(90),
    p99Us: histogram.getValueAtPercentile(99),
    maxUs: histogram.maxValue,
    meanUs: histogram.mean,
    cpu,
    warmupMs: Math.max(0, windowStart - warmupStart)
  }
  histogram.destroy()
  return result
}

/** Records the latency of `run` (µs) into `histogram` and returns it. */
export async function timeOne (histogram: Histogram, run: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now()
  await run()
  const us = (performance.now() - t0) * 1000
  histogram.recordValue(Math.max(1, Math.round(us)))
  return us
}

export function sleep (ms: number): Promise<void> {
  return new Promise((resolve) => { setTimeout(resolve, ms) })
}
