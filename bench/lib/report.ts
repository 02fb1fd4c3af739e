// The result model every scenario returns, and its renderings: a plain-text table for stdout and
// Markdown for bench/results/latest.md.
import type { Progress } from './progress.js'
import type { CallbackServerHandle } from './processes.js'

/** A table of already formatted cells. */
export interface Table {
  title: string
  head: string[]
  rows: string[][]
  /** A line printed under the table. */
  note?: string
}

/** One target from the issue, with the figure measured for it. `met` is null when not measured. */
export interface Check {
  scenario: string
  what: string
  measured: string
  ratio: string
  target: string
  met: boolean | null
}

/** One point of the chart: a path at one concurrency. */
export interface ChartPoint {
  concurrency: number
  rps: number
  p50Us: number
  p99Us: number
}

export interface ChartSeries {
  path: string
  /** Panel the series belongs to, e.g. '100 B replies'. */
  panel: string
  points: ChartPoint[]
}

export interface ScenarioReport {
  name: string
  title: string
  /** Set when the scenario did not run (e.g. python3 httpx not installed). */
  skipped?: string
  tables: Table[]
  checks: Check[]
  notes: string[]
  chart?: ChartSeries[]
  /** Raw figures for machine consumers (--json, latest.json). */
  data: unknown
  durationMs: number
}

export interface BenchContext {
  isQuick: boolean
  /** Repetitions of each interleaved comparison. */
  reps: number
  progress: Progress
  /** The shared callback server (its own process). */
  server: CallbackServerHandle
  /** Another Toolport checkout whose pool and inline paths run beside this tree's (A/B), or null. */
  baseline?: string | null
  /** Dispatch paths to run (raw undici always runs), or null for all. */
  paths?: string[] | null
}

export interface Scenario {
  name: string
  title: string
  /** How many progress steps `run` will announce. */
  steps: (ctx: BenchContext) => number
  run: (ctx: BenchContext) => Promise<Omit<ScenarioReport, 'durationMs' | 'name' | 'title'>>
}

export interface MachineInfo {
  cpu: string
  cores: number
  memoryGB: number
  os: string
  node: string
  versions: Record<string, string>
  loadAverageBefore: number[]
  loadAverageAfter: number[]
  /** Estimated share of the cores other processes took during the run (Linux schedstat), or null. */
  foreignCpuShare: number | null
  /** Measuring windows, and those flagged because other processes took the cores. */
  contendedWindows?: { measured: number, contended: number }
}

export interface RunReport {
  suite: 'toolport-bench'
  date: string
  mode: 'full' | 'quick'
  scopes: string[]
  machine: MachineInfo
  durationS: number
  /** Run-level warnings, e.g. a machine busy with other work while the bench ran. */
  warnings: string[]
  scenarios: ScenarioReport[]
  checks: Check[]
}

/** A met/not met label. */
export function verdict (met: boolean | null): string {
  if (met === null) return 'n/a'
  return met ? 'met' : 'NOT met'
}

/** Plain-text rendering of a table with padded columns. */
export function textTable (table: Table): string {
  const widths = table.head.map((h, i) => Math.max(width(h), ...table.rows.map((r) => width(r[i] ?? ''))))
  const line = (cells: readonly string[]): string => cells.map((c, i) => pad(c, widths[i] ?? 0, i)).join('  ').trimEnd()
  const out = [table.title, line(table.head), widths.map((w) => '-'.repeat(w)).join('  ')]
  for (const row of table.rows) out.push(line(row))
  if (table.note !== undefined) out.push(table.note)
  return out.join('\n')
}

/** Markdown rendering of a table (first column left-aligned, the others right-aligned). */
export function markdownTable (table: Table): string {
  const esc = (s: string): string => s.replace(/\|/g, '\\|')
  const out = [
    `| ${table.head.map(esc).join(' | ')} |`,
    `|${table.head.map((_, i) => (i === 0 ? ' :-- ' : ' --: ')).join('|')}|`
  ]
  for (const row of table.rows) out.push(`| ${row.map(esc).join(' | ')} |`)
  if (table.note !== undefined) out.push('', table.note)
  return out.join('\n')
}

/** The table of every target. */
export function checksTable (checks: readonly Check[]): Table {
  return {
    title: 'Targets — reported, never enforced',
    head: ['scenario', 'figure', 'measured', 'ratio', 'target', 'status'],
    rows: checks.map((c) => [c.scenario, c.what, c.measured, c.ratio, c.target, verdict(c.met)])
  }
}

export function renderText (report: RunReport): string {
  const out: string[] = []
  out.push(`Toolport bench — ${report.mode} run, ${report.date}`)
  out.push(machineLine(report.machine))
  for (const warning of report.warnings) out.push(`WARNING: ${warning}`)
  for (const scenario of report.scenarios) {
    out.push('', `== ${scenario.title} (${(scenario.durationMs / 1000).toFixed(1)} s) ==`)
    if (scenario.skipped !== undefined) out.push(`skipped: ${scenario.skipped}`)
    for (const table of scenario.tables) out.push('', textTable(table))
    for (const note of scenario.notes) out.push(`note: ${note}`)
  }
  if (report.checks.length > 0) out.push('', textTable(checksTable(report.checks)))
  out.push('', `total ${report.durationS.toFixed(0)} s`)
  return out.join('\n') + '\n'
}

export function renderMarkdown (report: RunReport, chartFile: string | null): string {
  const out: string[] = []
  out.push(`# Toolport bench results (${report.mode} run)`, '')
  out.push(`${report.date} · ${machineLine(report.machine)} · ${report.durationS.toFixed(0)} s`, '')
  out.push('Generated by `npm run bench` (see [bench/README.md](../README.md) for the method). ' +
    'Figures are medians of interleaved repetitions with their min–max; ratios are medians of per-repetition ratios. ' +
    'Targets are reported, never enforced.', '')
  for (const warning of report.warnings) out.push(`> **Warning:** ${warning}`, '')
  if (chartFile !== null) out.push(`![p50/p99 latency and throughput vs concurrency](${chartFile})`, '')
  if (report.checks.length > 0) {
    out.push('## Targets', '', markdownTable(checksTable(report.checks)), '')
  }
  for (const scenario of report.scenarios) {
    out.push(`## ${scenario.title}`, '')
    if (scenario.skipped !== undefined) out.push(`skipped: ${scenario.skipped}`, '')
    for (const table of scenario.tables) out.push(`**${table.title}**`, '', markdownTable(table), '')
    for (const note of scenario.notes) out.push(`- ${note}`)
    if (scenario.notes.length > 0) out.push('')
  }
  return out.join('\n')
}

export function machineLine (m: MachineInfo): string {
  const load = m.loadAverageBefore.map((l) => l.toFixed(2)).join(' ')
  return `${m.cpu}, ${m.cores} cores, ${m.memoryGB} GB, ${m.os}, Node ${m.node}, ` +
    Object.entries(m.versions).map(([k, v]) => `${k} ${v}`).join(', ') + `, load average at start ${load}` +
    (m.foreignCpuShare === null ? '' : `, cores taken by other processes during the run ≈ ${(m.foreignCpuShare * 100).toFixed(0)} %`) +
    (m.contendedWindows === undefined ? '' : `, ${m.contendedWindows.contended} of ${m.contendedWindows.measured} windows flagged as contended`)
}

function width (s: string): number {
  return [...s].length
}

function pad (s: string, w: number, column: number): string {
  const fill = ' '.repeat(Math.max(0, w - width(s)))
  return column === 0 ? s + fill : fill + s
}
