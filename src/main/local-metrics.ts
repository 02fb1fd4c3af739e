// Per-call metrics counted locally and handed to prom-client only when /metrics is scraped.
//
// prom-client's Counter.inc and Histogram.observe hash a label object on every call (sorted keys,
// a string built per call), which the dispatch profile measured at ~2 µs per call on the main
// thread. These classes keep plain number arrays per label set (found through a Map keyed by the
// label values, created once per label set) and implement the metric interface a
// prom-client Registry reads (`name`, `get()`), so the exposition is the same text as before.
import type { Registry } from 'prom-client'

interface MetricValue {
  value: number
  labels: Record<string, string | number>
  metricName?: string
}

interface MetricSnapshot {
  name: string
  help: string
  type: 'counter' | 'histogram'
  values: MetricValue[]
  aggregator: 'sum'
}

/** A counter with labels, counted in a Map of plain numbers. */
export class LocalCounter<L extends string> {
  readonly name: string
  readonly help: string
  readonly #labelNames: readonly L[]
  readonly #counts = new Map<string, { labels: Record<L, string>, value: number }>()

  constructor (registry: Registry, name: string, help: string, labelNames: readonly L[]) {
    this.name = name
    this.help = help
    this.#labelNames = labelNames
    registry.registerMetric(this as never)
  }

  /** Adds 1 for these label values, given in the order of `labelNames`. */
  inc (...values: string[]): void {
    // Each value with its length first: label values may hold any character, so no separator
    // alone could keep two label sets apart.
    let key = ''
    for (const value of values) key += `${value.length}:${value}`
    const entry = this.#counts.get(key)
    if (entry !== undefined) {
      entry.value++
      return
    }
    const labels = Object.create(null) as Record<L, string>
    this.#labelNames.forEach((label, i) => { labels[label] = values[i] ?? '' })
    this.#counts.set(key, { labels, value: 1 })
  }

  /**
   * Drops every series whose labels hold all of `match` (a removed role's, a removed tool's in its
   * role), so that what no longer exists does not pile up.
   */
  remove (match: Partial<Record<L, string>>): void {
    const pairs = Object.entries(match) as Array<[L, string]>
    for (const [key, entry] of this.#counts) {
      if (pairs.every(([label, value]) => entry.labels[label] === value)) this.#counts.delete(key)
    }
  }

  /** Registry.resetMetrics() calls this. */
  reset (): void {
    this.#counts.clear()
  }

  get (): MetricSnapshot {
    const values: MetricValue[] = []
    for (const entry of this.#counts.values()) values.push({ value: entry.value, labels: { ...entry.labels } })
    return { name: this.name, help: this.help, type: 'counter', values, aggregator: 'sum' }
  }
}

/** A histogram with one label, counted in plain arrays (non-cumulative; summed when scraped). */
export class LocalHistogram {
  readonly name: string
  readonly help: string
  readonly #label: string
  readonly #buckets: readonly number[]
  readonly #series = new Map<string, { counts: number[], sum: number, count: number }>()

  constructor (registry: Registry, name: string, help: string, label: string, buckets: readonly number[]) {
    this.name = name
    this.help = help
    this.#label = label
    this.#buckets = buckets
    registry.registerMetric(this as never)
  }

  observe (labelValue: string, value: number): void {
    let series = this.#series.get(labelValue)
    if (series === undefined) {
      series = { counts: new Array<number>(this.#buckets.length + 1).fill(0), sum: 0, count: 0 }
      this.#series.set(labelValue, series)
    }
    const buckets = this.#buckets
    let i = 0
    while (i < buckets.length && value > (buckets[i] as number)) i++
    series.counts[i] = (series.counts[i] as number) + 1
    series.sum += value
    series.count++
  }

  /** Registry.resetMetrics() calls this. */
  reset (): void {
    this.#series.clear()
  }

  get (): MetricSnapshot {
    const values: MetricValue[] = []
    for (const [labelValue, series] of this.#series) {
      let cumulative = 0
      for (let i = 0; i <= this.#buckets.length; i++) {
        cumulative += series.counts[i] as number
        const le = i < this.#buckets.length ? this.#buckets[i] as number : '+Inf'
        values.push({ value: cumulative, labels: { le, [this.#label]: labelValue }, metricName: `${this.name}_bucket` })
      }
      values.push({ value: series.sum, labels: { [this.#label]: labelValue }, metricName: `${this.name}_sum` })
      values.push({ value: series.count, labels: { [this.#label]: labelValue }, metricName: `${this.name}_count` })
    }
    return { name: this.name, help: this.help, type: 'histogram', values, aggregator: 'sum' }
  }
}
