// Consecutive connection-level failures per callback origin (SPEC R13, DESIGN "Eviction").
//
// Only calls to `plugin:` tools count. A connection-level failure (the connection could not be
// established) increments; any HTTP response from the origin and any new registration there
// reset. Read timeouts, broken replies and tool-level errors neither count nor reset. Reaching the
// threshold returns true once and resets the counter, so the caller evicts exactly once.
import type { OutcomeKind } from '../../workers/protocol.js'

export class OriginHealth {
  readonly #failures = new Map<string, number>()
  readonly #threshold: number

  constructor (threshold: number) {
    this.#threshold = threshold
  }

  /** Records a call's outcome; true when the origin has just reached the eviction threshold. */
  record (origin: string, kind: OutcomeKind, countsForEviction: boolean): boolean {
    if (kind === 'connect') {
      if (!countsForEviction) return false
      const failures = (this.#failures.get(origin) ?? 0) + 1
      if (failures >= this.#threshold) {
        this.#failures.delete(origin)
        return true
      }
      this.#failures.set(origin, failures)
      return false
    }
    if (kind === 'ok' || kind === 'http') this.#failures.delete(origin)
    return false
  }

  /** A new registration at the origin: start counting afresh. */
  reset (origin: string): void {
    this.#failures.delete(origin)
  }

  /** Current consecutive failures at an origin (0 when healthy). */
  failures (origin: string): number {
    return this.#failures.get(origin) ?? 0
  }

  get threshold (): number { return this.#threshold }
}
