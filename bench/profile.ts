// `npm run profile [-- flags]`: where one dispatch path spends its CPU, per thread, from Linux
// `perf` with V8's jitdump (JavaScript frames by name, in the main thread and in the workers).
//
//   --path pool|inline|raw|route|mcp   the dispatch path (default pool), or the call route: POST
//                            /api/tools/call on a listening pool-mode Toolport under autocannon,
//                            or mcp: the same call as MCP tools/call on one session (c ≤ 32)
//   --reply small|large      ~100 B or 64 KiB replies (default small)
//   -c N                     callers in the closed loop (default 128)
//   --seconds N              sampled window after a steady warm-up (default 5)
//   --top N                  functions listed per thread group (default 15)
//   --keep                   keep the perf data and jitdump files (their folder is printed)
//
// Why perf and not `--cpu-prof`: V8's profiler samples wall time, so a thread that is preempted
// keeps collecting samples (under load its "busy" time was twice the thread's CPU time); perf's
// cpu-clock samples only running threads, and its shares match the bench's schedstat CPU
// accounting, which this prints beside them. Needs `perf` (Debian: apt-get install linux-perf) and
// the right to profile a process of ours (root, or kernel.perf_event_paranoid ≤ 1).
import { spawn, spawnSync } from 'node:child_process'
import { once } from 'node:events'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { readTargetFlag, runProfileTarget, settleTargetFlags } from './lib/processes.js'
import { MCP_MAX_CONCURRENCY } from './lib/mcp-session.js'
import type { ProfileTargetReady, ProfileTargetResult, TargetFlags } from './lib/processes.js'
import { parsePerfScript, profileByGroup } from './lib/perf-script.js'

interface Flags extends TargetFlags {
  top: number
  keep: boolean
}

const USAGE = 'usage: npm run profile -- [--path pool|inline|raw|route|mcp] [--reply small|large] [-c N] [--seconds N] [--top N] [--keep]'

function parseFlags (argv: readonly string[]): Flags {
  const flags: Flags = { path: 'pool', reply: 'small', concurrency: 128, seconds: 5, top: 15, keep: false }
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i] as string
    const value = argv[i + 1]
    if (readTargetFlag(flag, value, flags, fail)) {
      i++
      continue
    }
    const number = (): number => {
      const n = Number(value)
      if (!Number.isInteger(n) || n < 1) fail(`${flag ?? ''} needs a positive integer`)
      i++
      return n
    }
    switch (flag) {
      case '--top': flags.top = number(); break
      case '--keep': flags.keep = true; break
      case '--help': case '-h':
        process.stdout.write(USAGE + '\n')
        process.exit(0)
        break
      default: fail(`unknown flag ${flag}`)
    }
  }
  settleTargetFlags(flags, MCP_MAX_CONCURRENCY, fail)
  return flags
}

function fail (message: string): never {
  process.stderr.write(`profile: ${message}\n${USAGE}\n`)
  process.exit(2)
}

function step (message: string): void {
  process.stderr.write(`profile: ${message}\n`)
}

async function main (): Promise<void> {
  const flags = parseFlags(process.argv.slice(2))
  const probe = spawnSync('perf', ['--version'], { encoding: 'utf8' })
  if (probe.status !== 0) fail('`perf` is not installed (Debian: apt-get install linux-perf)')
  const dir = await mkdtemp(join(tmpdir(), 'toolport-profile-'))
  try {
    step(`${flags.path}, ${flags.reply} replies, c=${flags.concurrency}: warming up`)
    let ready: ProfileTargetReady | null = null
    let record: Promise<number | null> | null = null
    let perfErr = ''
    const data = join(dir, 'perf.data')
    // The target runs in `dir`: --perf-prof writes its jit-<pid>.dump there.
    const result = await runProfileTarget(
      { path: flags.path, route: flags.reply, concurrency: flags.concurrency, seconds: flags.seconds },
      {
        nodeArgs: ['--perf-prof', '--interpreted-frames-native-stack'],
        cwd: dir,
        onReady: (target) => {
          ready = target
          step(`sampling ${flags.seconds} s of pid ${target.pid}`)
          // -k mono: the clock jitdump's records use, so that `perf inject --jit` can place them.
          const perf = spawn('perf', ['record', '-F', '999', '-e', 'cpu-clock', '-g', '-k', 'mono', '-p',
            String(target.pid), '-o', data, '--', 'sleep', String(Math.max(1, flags.seconds - 0.3))],
          { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] })
          perf.stderr.setEncoding('utf8').on('data', (chunk: string) => { perfErr += chunk })
          record = once(perf, 'exit').then(([code]) => code as number | null)
        }
      }).catch((err: unknown) => fail(`the profiled process failed: ${err instanceof Error ? err.message : String(err)}`))
    const recorded = record === null ? null : await record
    const readyInfo = ready as ProfileTargetReady | null
    const figures = result
    if (readyInfo === null) fail('the profiled process never reported its measured window')
    if (recorded !== 0) {
      fail(`perf record failed (exit ${String(recorded)}; is profiling allowed here?)${perfErr === '' ? '' : `:\n${perfErr.trimEnd()}`}`)
    }
    step('resolving JavaScript frames (perf inject --jit)')
    const injected = join(dir, 'perf.jit.data')
    const inject = spawnSync('perf', ['inject', '--jit', '-i', data, '-o', injected], { cwd: dir, encoding: 'utf8' })
    if (inject.status !== 0) fail(`perf inject failed: ${inject.stderr}`)
    const script = spawnSync('perf', ['script', '-F', 'tid,ip,sym', '-i', injected],
      { cwd: dir, encoding: 'utf8', maxBuffer: 1024 * 1024 * 1024 })
    if (script.status !== 0) fail(`perf script failed: ${script.stderr}`)
    report(flags, readyInfo, figures, script.stdout)
    if (flags.keep) step(`kept ${dir}`)
  } finally {
    if (!flags.keep) await rm(dir, { recursive: true, force: true })
  }
}

function report (flags: Flags, ready: ProfileTargetReady, result: ProfileTargetResult, script: string): void {
  const workers = new Set(ready.workers)
  const groupOf = (tid: number): string => tid === ready.pid ? 'main thread' : workers.has(tid) ? 'pool workers' : 'other threads (GC, JIT, libuv)'
  const samples = parsePerfScript(script)
  const groups = profileByGroup(samples, groupOf, flags.top)
  const cpu = result.cpu
  const out: string[] = []
  out.push(`# ${flags.path}, ${flags.reply} replies, c=${flags.concurrency}: ${Math.round(result.rps)} req/s, ` +
    `p50 ${result.p50Us} µs, ${result.errors} failed`)
  if (cpu !== null) {
    out.push(`schedstat CPU µs per call: process ${cpu.processUs.toFixed(1)} · main ${cpu.mainThreadUs.toFixed(1)} · ` +
      `workers ${cpu.workerUs.toFixed(1)} · other ${cpu.otherUs.toFixed(1)} · callback server ${cpu.peerUs.toFixed(1)}`)
  }
  out.push(`perf: ${samples.length} samples of cpu-clock at 999 Hz; JS:*name is optimized code (TurboFan), ` +
    'JS:^ baseline, JS:~ interpreted; µs/call = share of the samples × process CPU per call')
  for (const group of groups) {
    const perCall = cpu === null ? '' : ` ≈ ${(group.share * cpu.processUs).toFixed(1)} µs/call`
    out.push('', `## ${group.name}: ${(group.share * 100).toFixed(1)} % of the samples${perCall}`)
    out.push('', 'self (leaf frame)                                        | inclusive (JavaScript functions)')
    for (let i = 0; i < Math.max(group.self.length, group.inclusive.length); i++) {
      const self = group.self[i]
      const inclusive = group.inclusive[i]
      const left = self === undefined ? '' : `${pct(self.samples, group.samples)} ${self.symbol}`
      const right = inclusive === undefined ? '' : `${pct(inclusive.samples, group.samples)} ${inclusive.symbol}`
      out.push(`${left.slice(0, 56).padEnd(56)} | ${right.slice(0, 100)}`)
    }
  }
  process.stdout.write(out.join('\n') + '\n')
}

function pct (n: number, of: number): string {
  return `${(100 * n / Math.max(1, of)).toFixed(1).padStart(5)} %`
}

await main()
