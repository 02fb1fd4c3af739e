// The progress display on stderr: which scenario and step is running, how far along the whole
// run is, the elapsed time and a rough estimate of what is left. On a TTY one line is redrawn in
// place; otherwise (CI, a pipe) a line is printed at each scenario start and at most every 5 s.
const isTty = process.stderr.isTTY === true

export class Progress {
  readonly #started = performance.now()
  readonly #enabled: boolean
  #total = 0
  #done = 0
  #scenario = ''
  #lastPrint = 0
  #lastLength = 0

  constructor (enabled: boolean) {
    this.#enabled = enabled
  }

  /** Adds planned steps (each scenario announces its own before it starts). */
  plan (steps: number): void {
    this.#total += steps
  }

  /** Starts a scenario: always printed. */
  scenario (name: string): void {
    this.#scenario = name
    this.#print(`${name}: starting`, true)
  }

  /** One step begins; `label` says what runs now. */
  step (label: string): void {
    this.#done++
    if (this.#done > this.#total) this.#total = this.#done
    this.#print(label, false)
  }

  /** A message outside the step count (skips, warnings). */
  note (text: string): void {
    this.#print(text, true)
  }

  /** Clears the TTY line. */
  finish (): void {
    if (!this.#enabled) return
    if (isTty && this.#lastLength > 0) process.stderr.write('\r\x1b[K')
    process.stderr.write(`bench: done in ${clock(this.elapsedMs)}\n`)
  }

  get elapsedMs (): number {
    return performance.now() - this.#started
  }

  #print (label: string, force: boolean): void {
    if (!this.#enabled) return
    const now = performance.now()
    if (!isTty && !force && now - this.#lastPrint < 5_000) return
    this.#lastPrint = now
    const elapsed = now - this.#started
    const share = this.#total === 0 ? 0 : this.#done / this.#total
    const eta = this.#done > 2 && share < 1 ? ` · ~${clock(elapsed / share - elapsed)} left` : ''
    const line = `[${String(this.#done).padStart(3)}/${this.#total} ${String(Math.round(share * 100)).padStart(3)}%] ` +
      `${this.#scenario} · ${label} · ${clock(elapsed)}${eta}`
    if (isTty) {
      const width = process.stderr.columns ?? 120
      const shown = line.length > width - 1 ? line.slice(0, width - 2) + '…' : line
      process.stderr.write(`\r\x1b[K${shown}`)
      this.#lastLength = shown.length
      if (force) {
        process.stderr.write('\n')
        this.#lastLength = 0
      }
    } else {
      process.stderr.write(line + '\n')
    }
  }
}

function clock (ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000))
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`
}
