// Per-tool call rates and latency percentiles over the last minutes, for the console's charts.
//
// Fixed size, whatever the call rate: each tracked tool has one ring of per-second slots (calls,
// errors, p50, p99) and one latency histogram for the second in progress; when a second ends its
// histogram is reduced to p50/p99 and cleared. At most MAX_SERIES tools are tracked (the least
// recently called one makes room), so memory is bounded by WINDOW_SECONDS × MAX_SERIES slots.

/** Seconds of history kept (and charted). */
export const WINDOW_SECONDS = 300
/** Tools tracked at once; the least recently called one is forgotten for a new one. */
export const MAX_SERIES = 256
/** Upper bounds of the latency buckets in ms: 0.05 ms × 2^k, up to ~7 minutes, then overflow. */
const BOUNDS_MS = Array.from({ length: 24 }, (_, k) => 0.05 * 2 ** k)

/** One tool's numbers over the window, oldest second first. */
export interface SeriesSnapshot {
  role: string | null
  tool: string | null
  calls: number[]
  errors: number[]
  /** Per-second p50 and p99 in ms; null for a second without calls. */
  p50: Array<number | null>
  p99: Array<number | null>
  /** Calls in the whole window. */
  total: number
}

export interface StatsSnapshot {
  window_seconds: number
  /** The newest second of every series, in seconds since the epoch. */
  end_second: number
  all: SeriesSnapshot
  /** The busiest tools of the window, most calls first. */
  tools: SeriesSnapshot[]
}

class Series {
  readonly role: string | null
  readonly tool: string | null
  readonly #stamp = new Float64Array(WINDOW_SECONDS).fill(-1)
  readonly #calls = new Uint32Array(WINDOW_SECONDS)
  readonly #errors = new Uint32Array(WINDOW_SECONDS)
  readonly #p50 = new Float32Array(WINDOW_SECONDS)
  readonly #p99 = new Float32Array(WINDOW_SECONDS)
  readonly #histogram = new Uint32Array(BOUNDS_MS.length + 1)
  /** The shortest and longest call of the open second: percentiles never leave their range. */
  #min = Infinity
  #max = -Infinity
  /** The second the histogram belongs to, or -1. */
  #open = -1
  lastSecond = -1

  constructor (role: string | null, tool: string | null) {
    this.role = role
    this.tool = tool
  }

  record (second: number, durationMs: number, isError: boolean): void {
    if (second !== this.#open) this.#roll(second)
    const slot = second % WINDOW_SECONDS
    this.#calls[slot] = (this.#calls[slot] as number) + 1
    if (isError) this.#errors[slot] = (this.#errors[slot] as number) + 1
    const bucket = bucketOf(durationMs)
    this.#histogram[bucket] = (this.#histogram[bucket] as number) + 1
    if (durationMs < this.#min) this.#min = durationMs
    if (durationMs > this.#max) this.#max = durationMs
    this.lastSecond = second
  }

  snapshot (endSecond: number): SeriesSnapshot {
    const out: SeriesSnapshot = { role: this.role, tool: this.tool, calls: [], errors: [], p50: [], p99: [], total: 0 }
    for (let second = endSecond - WINDOW_SECONDS + 1; second <= endSecond; second++) {
      const slot = second % WINDOW_SECONDS
      if (this.#stamp[slot] !== second) {
        out.calls.push(0)
        out.errors.push(0)
        out.p50.push(null)
        out.p99.push(null)
        continue
      }
      const calls = this.#calls[slot] as number
      out.calls.push(calls)
      out.errors.push(this.#errors[slot] as number)
      out.total += calls
      if (second === this.#open) {
        out.p50.push(round(quantile(this.#histogram, 0.5, this.#min, this.#max)))
        out.p99.push(round(quantile(this.#histogram, 0.99, this.#min, this.#max)))
      } else {
        out.p50.push(round(this.#p50[slot] as number))
        out.p99.push(round(this.#p99[slot] as number))
      }
    }
    return out
  }

  /** Closes the open second (reducing its histogram to p50/p99) and opens `second`. */
  #roll (second: number): void {
    if (this.#open !== -1) {
      const slot = this.#open % WINDOW_SECONDS
      this.#p50[slot] = quantile(this.#histogram, 0.5, this.#min, this.#max)
      this.#p99[slot] = quantile(this.#histogram, 0.99, this.#min, this.#max)
      this.#histogram.fill(0)
      this.#min = Infinity
      this.#max = -Infinity
    }
    const slot = second % WINDOW_SECONDS
    this.#stamp[slot] = second
    this.#calls[slot] = 0
    this.#errors[slot] = 0
    this.#open = second
  }
}

/**
 * Call statistics of one runtime, fed by its `call-finished` events.
 *
 * @example
 * stats.record('Lanlan', 'get_weather', 12.5, false); stats.snapshot(8)
 */
export class CallStats {
  readonly #all = new Series(null, null)
  readonly #byTool = new Map<string, Series>()

  /** Counts one call; `tool` null for a name that matched no tool (counted in the total only). */
  record (role: string, tool: string | null, durationMs: number, isError: boolean, nowMs = Date.now()): void {
    const second = Math.floor(nowMs / 1000)
    this.#all.record(second, durationMs, isError)
    if (tool === null) return
    const key = `${role}\0${tool}`
    let series = this.#byTool.get(key)
    if (series === undefined) {
      if (this.#byTool.size >= MAX_SERIES) this.#forgetOldest()
      series = new Series(role, tool)
      this.#byTool.set(key, series)
    }
    series.record(second, durationMs, isError)
  }

  /** The total and the `top` busiest tools over the window ending now. */
  snapshot (top: number, nowMs = Date.now()): StatsSnapshot {
    const end = Math.floor(nowMs / 1000)
    const tools: SeriesSnapshot[] = []
    for (const series of this.#byTool.values()) {
      if (series.lastSecond <= end - WINDOW_SECONDS) continue
      tools.push(series.snapshot(end))
    }
    tools.sort((a, b) => b.total - a.total)
    return { window_seconds: WINDOW_SECONDS, end_second: end, all: this.#all.snapshot(end), tools: tools.slice(0, top) }
  }

  #forgetOldest (): void {
    let oldestKey = ''
    let oldest = Infinity
    for (const [key, series] of this.#byTool) {
      if (series.lastSecond < oldest) {
        oldest = series.lastSecond
        oldestKey = key
      }
    }
    this.#byTool.delete(oldestKey)
  }
}

function bucketOf (ms: number): number {
  for (let i = 0; i < BOUNDS_MS.length; i++) {
    if (ms <= (BOUNDS_MS[i] as number)) return i
  }
  return BOUNDS_MS.length
}

/**
 * The q-quantile of a histogram, interpolated inside its bucket (geometrically: log buckets), the
 * bucket narrowed to the calls' own range [`min`, `max`]: buckets double in width, and without it
 * eight calls of 104–109 ms read as p50 145 ms and p99 203 ms.
 */
function quantile (histogram: Uint32Array, q: number, min: number, max: number): number {
  let total = 0
  for (const n of histogram) total += n
  if (total === 0) return 0
  const rank = q * total
  let seen = 0
  for (let i = 0; i < histogram.length; i++) {
    const n = histogram[i] as number
    if (n === 0) continue
    if (seen + n >= rank) {
      const upper = Math.min(max, BOUNDS_MS[i] ?? (BOUNDS_MS[BOUNDS_MS.length - 1] as number) * 2)
      const lower = Math.max(min, i === 0 ? upper / 2 : (BOUNDS_MS[i - 1] as number))
      // Every call of the bucket took the same time (or none took any).
      if (lower >= upper) return upper
      const within = Math.min(1, Math.max(0, (rank - seen) / n))
      return lower * (upper / lower) ** within
    }
    seen += n
  }
  return BOUNDS_MS[BOUNDS_MS.length - 1] as number
}

function round (ms: number): number {
  return Math.round(ms * 100) / 100
}
