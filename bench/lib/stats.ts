// Repetition statistics and number formatting shared by every scenario.
//
// Every comparison is run several times, interleaved (A B A B …); a figure is reported as the
// median of its repetitions with their min–max, and a ratio to a baseline is the median of the
// per-repetition ratios (each A paired with the B that ran next to it), which cancels slow drift
// in the machine's load better than a ratio of two medians would.
import type { CpuPerCall } from './cpu.js'

/** The repetitions of one figure: median, min and max (`n` = repetitions). */
export interface Stat {
  median: number
  min: number
  max: number
  n: number
}

export function median (values: readonly number[]): number {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort(byNumber)
  const mid = sorted.length >> 1
  return sorted.length % 2 === 1 ? sorted[mid] as number : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2
}

export function stat (values: readonly number[]): Stat {
  const finite = values.filter(Number.isFinite)
  if (finite.length === 0) return { median: Number.NaN, min: Number.NaN, max: Number.NaN, n: 0 }
  return { median: median(finite), min: Math.min(...finite), max: Math.max(...finite), n: finite.length }
}

/** Per-repetition ratios a[i] / b[i] (paired by repetition). */
export function pairedRatio (a: readonly number[], b: readonly number[]): Stat {
  const out: number[] = []
  for (let i = 0; i < Math.min(a.length, b.length); i++) out.push((a[i] as number) / (b[i] as number))
  return stat(out)
}

/** Per-repetition differences a[i] - b[i]. */
export function pairedDiff (a: readonly number[], b: readonly number[]): Stat {
  const out: number[] = []
  for (let i = 0; i < Math.min(a.length, b.length); i++) out.push((a[i] as number) - (b[i] as number))
  return stat(out)
}

function byNumber (a: number, b: number): number {
  return a - b
}

/** 12345 → "12.3 k", 950 → "950". */
export function fmtRate (value: number): string {
  if (!Number.isFinite(value)) return '–'
  if (value >= 100_000) return `${(value / 1000).toFixed(0)} k`
  if (value >= 10_000) return `${(value / 1000).toFixed(1)} k`
  if (value >= 1000) return `${(value / 1000).toFixed(2)} k`
  if (value >= 100) return value.toFixed(0)
  return value.toFixed(1)
}

/** A duration given in µs: "183 µs", "1.24 ms", "2.10 s". */
export function fmtUs (us: number): string {
  if (!Number.isFinite(us)) return '–'
  if (us >= 1_000_000) return `${(us / 1_000_000).toFixed(2)} s`
  if (us >= 10_000) return `${(us / 1000).toFixed(1)} ms`
  if (us >= 1000) return `${(us / 1000).toFixed(2)} ms`
  if (us >= 10) return `${us.toFixed(0)} µs`
  return `${us.toFixed(1)} µs`
}

/** A duration in ns: "85 ns", "1.2 µs". */
export function fmtNs (ns: number): string {
  if (!Number.isFinite(ns)) return '–'
  if (ns >= 1000) return fmtUs(ns / 1000)
  if (ns >= 10) return `${ns.toFixed(0)} ns`
  return `${ns.toFixed(1)} ns`
}

export function fmtRatio (value: number): string {
  return Number.isFinite(value) ? `${value.toFixed(2)}×` : '–'
}

/** A ratio compared with a target: three decimals, so 0.647× is not shown as 0.65×. */
export function fmtRatio3 (value: number): string {
  return Number.isFinite(value) ? `${value.toFixed(3)}×` : '–'
}

export function fmtMB (bytes: number): string {
  return Number.isFinite(bytes) ? `${(bytes / (1024 * 1024)).toFixed(0)} MB` : '–'
}

/** "12.3 k (11.9 k–12.8 k)" — median with the range of the repetitions. */
export function fmtStat (s: Stat, fmt: (value: number) => string): string {
  if (s.n === 0) return '–'
  if (s.n === 1 || s.min === s.max) return fmt(s.median)
  return `${fmt(s.median)} (${fmt(s.min)}–${fmt(s.max)})`
}

/** One CPU figure of each repetition (NaN where a run has none), for `stat` and `pairedRatio`. */
export function cpuSeries (runs: readonly { cpu?: CpuPerCall | null }[],
  key: 'processUs' | 'mainThreadUs' | 'workerUs' | 'otherUs' | 'peerUs'): number[] {
  return runs.map((r) => (r.cpu === undefined || r.cpu === null ? Number.NaN : r.cpu[key]))
}

/**
 * Median CPU µs per call over repetitions: this process (all threads) · its main thread · its pool
 * workers · its other threads · the callback server; `*` when a repetition was flagged as contended.
 */
export function fmtCpuSplit (runs: readonly { cpu: CpuPerCall | null }[]): string {
  const pick = (f: (cpu: CpuPerCall) => number): string => {
    const m = stat(runs.map((r) => (r.cpu === null ? Number.NaN : f(r.cpu)))).median
    return Number.isFinite(m) ? m.toFixed(0) : '–'
  }
  const flagged = runs.some((r) => r.cpu?.contended === true) ? '*' : ''
  return `${pick((c) => c.processUs)} · ${pick((c) => c.mainThreadUs)} · ${pick((c) => c.workerUs)} · ` +
    `${pick((c) => c.otherUs)} · ${pick((c) => c.peerUs)}${flagged}`
}
