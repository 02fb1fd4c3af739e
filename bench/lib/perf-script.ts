// Reads `perf script -F tid,ip,sym` output (after `perf inject --jit`, so JavaScript frames carry
// their function names) and sums the samples per thread group and per function.
//
// A sample is a header line with the thread id (right-aligned: it may start with spaces),
// followed by one tab-indented line per stack frame (leaf first): `<hex ip> <symbol>` (the symbol
// may be missing: `[unknown]` or nothing).

export interface PerfSample {
  tid: number
  /** Frame symbols, leaf first; '[unknown]' where perf had none. */
  frames: string[]
}

export function parsePerfScript (text: string): PerfSample[] {
  const samples: PerfSample[] = []
  let current: PerfSample | null = null
  for (const line of text.split('\n')) {
    if (line.trim() === '') {
      current = null
      continue
    }
    if (line[0] !== '\t') {
      const tid = Number.parseInt(line.trim().split(/\s+/)[0] ?? '', 10)
      current = Number.isInteger(tid) ? { tid, frames: [] } : null
      if (current !== null) samples.push(current)
      continue
    }
    if (current === null) continue
    const frame = line.trim()
    const space = frame.indexOf(' ')
    current.frames.push(space === -1 ? '[unknown]' : cleanSymbol(frame.slice(space + 1)))
  }
  return samples
}

/** Drops perf's `+0x1f` offsets and the DSO in parentheses; keeps JIT names as V8 wrote them. */
function cleanSymbol (symbol: string): string {
  return symbol.replace(/\+0x[0-9a-f]+/, '').replace(/\s+\([^)]*\)$/, '').trim() || '[unknown]'
}

export interface GroupProfile {
  name: string
  samples: number
  /** Share of all samples of the process. */
  share: number
  /** Functions by samples where they were the leaf (self time), most first. */
  self: { symbol: string, samples: number }[]
  /**
   * JavaScript functions (`JS:` frames) by samples where they were anywhere on the stack
   * (inclusive), most first: the native frames every sample shares (thread start, the event loop)
   * would fill the top of this list and say nothing.
   */
  inclusive: { symbol: string, samples: number }[]
}

/**
 * Groups samples by thread (`groupOf(tid)`, e.g. main / pool worker / other) and ranks each
 * group's functions by self and inclusive samples.
 */
export function profileByGroup (samples: readonly PerfSample[], groupOf: (tid: number) => string,
  top: number): GroupProfile[] {
  const groups = new Map<string, { samples: number, self: Map<string, number>, inclusive: Map<string, number> }>()
  for (const sample of samples) {
    const name = groupOf(sample.tid)
    let group = groups.get(name)
    if (group === undefined) {
      group = { samples: 0, self: new Map(), inclusive: new Map() }
      groups.set(name, group)
    }
    group.samples++
    const leaf = sample.frames[0] ?? '[unknown]'
    group.self.set(leaf, (group.self.get(leaf) ?? 0) + 1)
    for (const symbol of new Set(sample.frames)) {
      if (symbol.startsWith('JS:')) group.inclusive.set(symbol, (group.inclusive.get(symbol) ?? 0) + 1)
    }
  }
  const total = Math.max(1, samples.length)
  const rank = (counts: Map<string, number>): { symbol: string, samples: number }[] =>
    [...counts].sort((a, b) => b[1] - a[1]).slice(0, top).map(([symbol, n]) => ({ symbol, samples: n }))
  return [...groups].sort((a, b) => b[1].samples - a[1].samples).map(([name, group]) => ({
    name,
    samples: group.samples,
    share: group.samples / total,
    self: rank(group.self),
    inclusive: rank(group.inclusive)
  }))
}
