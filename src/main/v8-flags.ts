// The V8 setting `toolport serve` applies to its own process (docs/architecture.md, "The
// server's V8 setting"). A library never changes its host's V8 flags; the README tells embedders
// how to apply the same setting.
//
// Why `--no-allocation-site-pretenuring`: V8 pretenures an allocation site (allocates its objects
// straight into the old generation) when nearly all of them survived a scavenge, and keeps that
// decision. Under a burst of calls while connections open, sites that allocate per-call objects
// see exactly that, and from then on each call's objects are born old: dead ones still hold the
// young objects they point at through every scavenge until a full GC, so each scavenge promotes
// ~1.4–2.7 MB instead of ~0.03–0.1 MB, at ~10 µs more main-thread and ~15 µs more GC-thread CPU
// per call. A process lands in that state or not during its first seconds and keeps it: 4 of 10
// call-route runs and 11 of 21 inline runs did; without pretenuring, 0 of 10 and 0 of 14.
//
// Why `--heap-growing-percent=300`: after a full GC, V8 sets the next one's trigger at the live
// heap times a growing factor it picks between 1.1 and 4 from its GC speed, and starts marking
// early when less than about a young generation's room is left below that trigger. A pool worker
// keeps ~12 MB live and, with 64 KiB replies, turns over socket buffers that V8 counts as external
// memory: each external-memory scavenge then found the trigger too close and started a full GC,
// one every ~100 ms (40–50 in a 4 s run, ~30 µs of GC-thread CPU per call). The fixed factor 4
// (V8's own largest for a heap whose maximum is ≥ 2 GB, as Node's default is here) leaves 3–5,
// and 1.08–1.25× the throughput at 0.80–0.89× the CPU per call
// (bench/results/heap-growing-ab-*.md); the main thread's full GCs thin out the same way (the call
// route 1.13×). Cost: peak RSS under load ~19–27 MB higher; 100 B replies unchanged.
import { setFlagsFromString } from 'node:v8'

/** The flags `toolport serve` sets, each unless the process was started with its own setting of it. */
export const SERVER_V8_FLAGS: readonly string[] = ['--no-allocation-site-pretenuring', '--heap-growing-percent=300']

/** `--no_foo_bar` / `--foo-bar=x` → `foo-bar` (V8 accepts `_` and `-` alike). */
function flagName (arg: string): string {
  return arg.replaceAll('_', '-').replace(/^--?(no-?)?/, '').replace(/=.*$/, '')
}

/**
 * Sets each of `SERVER_V8_FLAGS` that the node command line (`execArgv`) does not name, in either
 * sense: an operator's `node --allocation-site-pretenuring …/toolport.js serve` (or
 * `--heap-growing-percent=0`, V8's dynamic factor) wins. (NODE_OPTIONS cannot carry these V8
 * flags.) Returns the flags it set.
 *
 * @example
 * applyServerV8Flags(process.execArgv) // ['--no-allocation-site-pretenuring', '--heap-growing-percent=300']
 */
export function applyServerV8Flags (execArgv: readonly string[]): string[] {
  const named = new Set(execArgv.filter((arg) => arg.startsWith('-')).map(flagName))
  const applied: string[] = []
  for (const flag of SERVER_V8_FLAGS) {
    if (named.has(flagName(flag))) continue
    setFlagsFromString(flag)
    applied.push(flag)
  }
  return applied
}
