// A hand-written SVG chart (no dependency): for each panel (reply size), throughput against
// concurrency on the left and p50 (solid) / p99 (dashed) latency against concurrency on the right,
// one colour per dispatch path. Both x axes and the latency axis are logarithmic.
import type { ChartSeries } from './report.js'

const COLORS: Record<string, string> = {
  'raw undici': '#222222',
  'toolport pool': '#d62728',
  'toolport inline': '#1f77b4',
  fetch: '#2ca02c',
  'node:http': '#9467bd'
}
const FALLBACK = ['#8c564b', '#e377c2', '#17becf', '#bcbd22']

const PANEL_W = 420
const PANEL_H = 260
const MARGIN = { left: 64, right: 16, top: 34, bottom: 42 }

export function renderChart (series: readonly ChartSeries[], title: string): string {
  const panels = [...new Set(series.map((s) => s.panel))]
  const paths = [...new Set(series.map((s) => s.path))]
  const width = 2 * (PANEL_W + MARGIN.left + MARGIN.right)
  const legendH = 28
  const height = 40 + legendH + panels.length * (PANEL_H + MARGIN.top + MARGIN.bottom)
  const out: string[] = []
  out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="system-ui, sans-serif" font-size="12">`)
  out.push(`<rect width="${width}" height="${height}" fill="#ffffff"/>`)
  out.push(`<text x="${width / 2}" y="22" text-anchor="middle" font-size="15" font-weight="600">${esc(title)}</text>`)
  // Legend
  let lx = MARGIN.left
  for (const [i, path] of paths.entries()) {
    const color = colorOf(path, i)
    out.push(`<line x1="${lx}" y1="48" x2="${lx + 22}" y2="48" stroke="${color}" stroke-width="2.5"/>`)
    out.push(`<text x="${lx + 27}" y="52">${esc(path)}</text>`)
    lx += 40 + path.length * 7
  }
  out.push(`<line x1="${lx + 10}" y1="48" x2="${lx + 32}" y2="48" stroke="#555" stroke-width="1.5"/><text x="${lx + 37}" y="52">p50</text>`)
  out.push(`<line x1="${lx + 70}" y1="48" x2="${lx + 92}" y2="48" stroke="#555" stroke-width="1.5" stroke-dasharray="5 3"/><text x="${lx + 97}" y="52">p99</text>`)
  for (const [p, panel] of panels.entries()) {
    const top = 40 + legendH + p * (PANEL_H + MARGIN.top + MARGIN.bottom)
    const inPanel = series.filter((s) => s.panel === panel)
    out.push(...throughputPanel(inPanel, paths, MARGIN.left, top + MARGIN.top, `${panel}: throughput (req/s)`))
    out.push(...latencyPanel(inPanel, paths, PANEL_W + MARGIN.left * 2 + MARGIN.right, top + MARGIN.top,
      `${panel}: latency p50 / p99`))
  }
  out.push('</svg>')
  return out.join('\n') + '\n'
}

function throughputPanel (series: readonly ChartSeries[], paths: readonly string[], x0: number, y0: number,
  title: string): string[] {
  const cs = concurrencies(series)
  const maxRps = niceCeil(Math.max(1, ...series.flatMap((s) => s.points.map((p) => p.rps))))
  const xOf = logScale(cs[0] ?? 1, cs[cs.length - 1] ?? 2, x0, x0 + PANEL_W)
  const yOf = (v: number): number => y0 + PANEL_H - (v / maxRps) * PANEL_H
  const out = frame(x0, y0, title, cs, xOf)
  for (let i = 0; i <= 4; i++) {
    const v = (maxRps * i) / 4
    const y = yOf(v)
    out.push(`<line x1="${x0}" y1="${y}" x2="${x0 + PANEL_W}" y2="${y}" stroke="#eee"/>`)
    out.push(`<text x="${x0 - 6}" y="${y + 4}" text-anchor="end">${shortNumber(v)}</text>`)
  }
  for (const s of series) {
    const color = colorOf(s.path, paths.indexOf(s.path))
    out.push(polyline(s.points.map((p) => [xOf(p.concurrency), yOf(p.rps)]), color, false))
  }
  return out
}

function latencyPanel (series: readonly ChartSeries[], paths: readonly string[], x0: number, y0: number,
  title: string): string[] {
  const cs = concurrencies(series)
  const values = series.flatMap((s) => s.points.flatMap((p) => [p.p50Us, p.p99Us])).filter((v) => v > 0)
  const lo = Math.pow(10, Math.floor(Math.log10(Math.max(1, Math.min(...values)))))
  const hi = Math.pow(10, Math.ceil(Math.log10(Math.max(lo * 10, ...values))))
  const xOf = logScale(cs[0] ?? 1, cs[cs.length - 1] ?? 2, x0, x0 + PANEL_W)
  const yScale = logScale(lo, hi, y0 + PANEL_H, y0)
  const out = frame(x0, y0, title, cs, xOf)
  for (let v = lo; v <= hi; v *= 10) {
    const y = yScale(v)
    out.push(`<line x1="${x0}" y1="${y}" x2="${x0 + PANEL_W}" y2="${y}" stroke="#eee"/>`)
    out.push(`<text x="${x0 - 6}" y="${y + 4}" text-anchor="end">${usLabel(v)}</text>`)
  }
  for (const s of series) {
    const color = colorOf(s.path, paths.indexOf(s.path))
    out.push(polyline(s.points.map((p) => [xOf(p.concurrency), yScale(Math.max(lo, p.p50Us))]), color, false))
    out.push(polyline(s.points.map((p) => [xOf(p.concurrency), yScale(Math.max(lo, p.p99Us))]), color, true))
  }
  return out
}

function frame (x0: number, y0: number, title: string, cs: readonly number[], xOf: (v: number) => number): string[] {
  const out = [
    `<text x="${x0}" y="${y0 - 10}" font-weight="600">${esc(title)}</text>`,
    `<rect x="${x0}" y="${y0}" width="${PANEL_W}" height="${PANEL_H}" fill="none" stroke="#999"/>`
  ]
  for (const c of cs) {
    const x = xOf(c)
    out.push(`<line x1="${x}" y1="${y0}" x2="${x}" y2="${y0 + PANEL_H}" stroke="#f2f2f2"/>`)
    out.push(`<text x="${x}" y="${y0 + PANEL_H + 16}" text-anchor="middle">${c}</text>`)
  }
  out.push(`<text x="${x0 + PANEL_W / 2}" y="${y0 + PANEL_H + 34}" text-anchor="middle" fill="#555">concurrency (closed loop)</text>`)
  return out
}

function polyline (points: readonly (readonly [number, number])[], color: string, dashed: boolean): string {
  const d = points.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(' ')
  const dash = dashed ? ' stroke-dasharray="5 3"' : ''
  const dots = points.map(([x,
    y]) => `<circle cx="${x.toFixed(1)}" cy="${y.toFixed(1)}" r="2.5" fill="${color}"/>`).join('')
  return `<polyline points="${d}" fill="none" stroke="${color}" stroke-width="${dashed ? 1.5 : 2.2}"${dash}/>${dots}`
}

function concurrencies (series: readonly ChartSeries[]): number[] {
  return [...new Set(series.flatMap((s) => s.points.map((p) => p.concurrency)))].sort((a, b) => a - b)
}

function logScale (lo: number, hi: number, a: number, b: number): (v: number) => number {
  const l0 = Math.log(lo)
  const span = Math.log(hi) - l0 || 1
  return (v) => a + ((Math.log(v) - l0) / span) * (b - a)
}

function niceCeil (v: number): number {
  const p = Math.pow(10, Math.floor(Math.log10(v)))
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p
  return 10 * p
}

function shortNumber (v: number): string {
  return v >= 1000 ? `${(v / 1000).toFixed(v % 1000 === 0 ? 0 : 1)}k` : v.toFixed(0)
}

function usLabel (us: number): string {
  if (us >= 1_000_000) return `${us / 1_000_000} s`
  if (us >= 1000) return `${us / 1000} ms`
  return `${us} µs`
}

function colorOf (path: string, index: number): string {
  return COLORS[path] ?? FALLBACK[index % FALLBACK.length] ?? '#000'
}

function esc (s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
}
