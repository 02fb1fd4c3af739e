// Toolport console: reads GET /api/console/state (the registry), GET /api/console/stats (every
// 2 s) and the live GET /api/events stream. Everything shown is built with DOM nodes and
// textContent (tool names and descriptions come from plugins: never HTML). The stream is read with
// fetch, not EventSource, so that the bearer token of token mode can be sent as a header.
import { createParser } from '/ui/vendor/eventsource-parser.js'
import UPlot from '/ui/vendor/uplot/uPlot.esm.js'
import { setupPlayground } from '/ui/playground.js'

const TOKEN_KEY = 'toolport.token'
const THEME_KEY = 'toolport.theme'
const MAX_CALL_ROWS = 60
const STATS_EVERY_MS = 2000
/** A registry event's read of the state waits this long (a burst of events makes one read). */
const REFRESH_MS = 120
/** A `call` event's read (the plugins' health, and calls not streamed) waits this long: one a second at most. */
const CALL_REFRESH_MS = 1000
/** A failed read of the state is tried again after 250 ms, then twice as long each time, up to 5 s. */
const RETRY_FIRST_MS = 250
const RETRY_MAX_MS = 5000
/** Events after which the registry view is fetched again. */
const REGISTRY_EVENTS = new Set(['registered', 'unregistered', 'cleared', 'evicted', 'sync', 'role-added',
  'role-removed'])

const $ = (id) => document.getElementById(id)

/** A DOM element: h('td', { className: 'num' }, 'text', child). Strings become text nodes. */
export function h (tag, props = {}, ...children) {
  const el = document.createElement(tag)
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null) continue
    if (key === 'dataset') Object.assign(el.dataset, value)
    else if (key in el) el[key] = value
    else el.setAttribute(key, value)
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue
    el.append(child instanceof Node ? child : document.createTextNode(visible(String(child))))
  }
  return el
}

/** Bidirectional-text controls: in a name, they make it display as another (`a\u202etxt.exe` as `aexe.txt`). */
const BIDI_CONTROLS = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/gu

/** `text` with each bidi control shown as its code point (`⟨U+202E⟩`), so names read as they are. */
function visible (text) {
  return text.replace(BIDI_CONTROLS, (c) => `⟨U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, '0')}⟩`)
}

// ---------------------------------------------------------------------------------------------
// API access (token mode: the token lives in sessionStorage, for this tab only)

/** Toolport's tokens are visible ASCII (0x21–0x7E): the only text a header carries unchanged. */
const TOKEN_TEXT = /^[\x21-\x7e]+$/

let token = sessionStorage.getItem(TOKEN_KEY)
// A stored token no header can carry (pasted with a typographic quote…) would fail every request.
if (token !== null && !TOKEN_TEXT.test(token)) {
  sessionStorage.removeItem(TOKEN_KEY)
  token = null
}
let tokenPrompt = null

function authHeaders (extra = {}) {
  return token === null ? { ...extra } : { ...extra, authorization: `Bearer ${token}` }
}

/**
 * Asks for the token once (a second caller waits for the same dialog). The page can do nothing
 * without it: the dialog opens again when dismissed (Escape), and keeps asking while the text is
 * not a token (a header cannot carry it).
 */
function askToken (message = '') {
  tokenPrompt ??= new Promise((resolve) => {
    const dialog = $('token-dialog')
    const form = $('token-form')
    let answered = false
    $('token-error').textContent = message
    $('token-input').value = ''
    const onSubmit = (event) => {
      const value = $('token-input').value.trim()
      if (!TOKEN_TEXT.test(value)) {
        event.preventDefault()
        $('token-error').textContent = 'A token is visible ASCII only (no spaces, no typographic quotes).'
        return
      }
      answered = true
      token = value
      sessionStorage.setItem(TOKEN_KEY, token)
      form.removeEventListener('submit', onSubmit)
      dialog.removeEventListener('close', onClose)
      tokenPrompt = null
      resolve()
    }
    const onClose = () => { if (!answered) dialog.showModal() }
    form.addEventListener('submit', onSubmit)
    dialog.addEventListener('close', onClose)
    dialog.showModal()
  })
  return tokenPrompt
}

/** fetch + JSON; a 401 asks for the token and tries again. */
export async function api (path, init = {}) {
  for (;;) {
    const res = await fetch(path, { ...init, headers: authHeaders(init.headers) })
    if (res.status === 401) {
      await askToken(token === null ? '' : 'That token was refused; try again.')
      continue
    }
    const body = await res.json().catch(() => null)
    return { status: res.status, body }
  }
}

// ---------------------------------------------------------------------------------------------
// Formatting

function ago (iso) {
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000))
  if (s < 60) return `${s} s ago`
  if (s < 3600) return `${Math.floor(s / 60)} min ago`
  return `${Math.floor(s / 3600)} h ago`
}

function clock (iso) {
  return new Date(iso).toLocaleTimeString([], { hour12: false })
}

function ms (value) {
  if (value === null || value === undefined) return '–'
  return value < 10 ? value.toFixed(2) : value < 100 ? value.toFixed(1) : Math.round(value).toString()
}

function outcomeBadge (outcome, isError) {
  const kind = outcome === 'ok' ? (isError ? 'warn' : 'ok') : outcome === 'local_error' ? 'warn' : 'bad'
  const label = outcome === 'ok' && isError ? 'tool error' : outcome.replaceAll('_', ' ')
  return h('span', { className: `badge ${kind}` }, label)
}

// ---------------------------------------------------------------------------------------------
// Registry view: roles, plugins, evictions

let state = null
/**
 * Whether the registry may have changed since the last state read (a registry event, a new
 * stream): only then does the playground read the shown tool's definition again. Calls ask for
 * state reads too, once a second, and must not make it fetch the role's definitions each time.
 */
let registryChanged = true

/** Reads the state and shows it; throws when the read fails (the caller tries again). */
async function loadState () {
  // `call` events after this one may come before or after the server wrote the state.
  const eventsBefore = callEvents
  const changed = registryChanged
  registryChanged = false
  let answer
  try {
    answer = await api('/api/console/state')
    if (answer.status !== 200 || answer.body === null) throw new Error(`GET /api/console/state: HTTP ${answer.status}`)
  } catch (err) {
    registryChanged ||= changed
    throw err
  }
  state = answer.body
  renderState()
  mergeCalls(state.calls, eventsBefore)
  playground.update(state.roles, changed)
}

function renderState () {
  $('version').textContent = `v${state.version}`
  $('instance').textContent = `instance ${state.instance_id.slice(0, 8)}`
  const toolCount = state.roles.reduce((n, r) => n + r.tools.length, 0)
  $('stat-roles').textContent = String(state.roles.length)
  $('stat-tools').textContent = String(toolCount)
  const sessions = state.roles.reduce((n, r) => n + r.sessions, 0)
  const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`
  $('roles-summary').textContent = `${plural(state.roles.length, 'role')} · ${plural(toolCount, 'tool')} · ${plural(sessions, 'live session')}`
  renderRoles()
  renderOrigins()
  renderEvictions()
}

function renderRoles () {
  const roles = state.roles.map((role) => {
    const sync = role.last_sync
    const syncText = sync === null
      ? h('span', {}, 'no sync yet')
      : h('span', { title: sync.error ?? '' },
        sync.ok
          ? h('span', { className: 'badge ok' }, 'synced')
          : h('span', { className: 'badge bad' },
          `${sync.failures} failed`),
        ` ${ms(sync.duration_ms)} ms · ${ago(sync.at)}`)
    const head = h('div', { className: 'role-head' },
      h('span', { className: 'role-name' }, role.name),
      h('span', { className: 'role-meta' },
        h('span', { className: 'badge info' }, `${role.tools.length} ${role.tools.length === 1 ? 'tool' : 'tools'}`),
        h('span', { className: 'badge' }, `${role.sessions} session${role.sessions === 1 ? '' : 's'}`),
        syncText))
    const body = role.tools.length === 0
      ? h('div', { className: 'empty' }, 'no tools')
      : h('div', { className: 'table-wrap' }, h('table', { className: 'table' },
        h('thead', {}, h('tr', {}, h('th', {}, 'tool'), h('th', {}, 'source'), h('th', {}, 'callback'), h('th',
          { className: 'num' }, 'timeout'))),
        h('tbody', {}, role.tools.map((tool) => h('tr', { dataset: { tool: tool.name } },
          h('td', {}, h('div', { className: 'mono' }, tool.name), h('div', {
            className: 'desc',
            title: tool.description
          }, tool.description)),
          h('td', {}, h('span', { className: `badge ${tool.is_remote ? '' : 'info'}` }, tool.source)),
          h('td', { className: 'mono small', title: tool.callback_url ?? '' }, tool.origin === null ? 'in-process' : tool.origin.replace(/^https?:\/\//, '')),
          h('td', { className: 'num' }, `${tool.timeout_seconds} s`))))))
    return h('div', { className: 'role', dataset: { role: role.name } }, head, body)
  })
  $('roles').replaceChildren(roles.length === 0
    ? h('div', { className: 'empty' }, 'no roles')
    : h('div',
      { className: 'roles' }, roles))
}

function renderOrigins () {
  const rows = state.origins.map((o) => h('tr', { dataset: { origin: o.origin } },
    h('td', { className: 'mono' }, o.origin),
    h('td', {}, o.sources.join(', ')),
    h('td', { className: 'num' }, String(o.tools)),
    h('td', {}, o.roles.join(', ')),
    h('td', {}, o.failures === 0
      ? h('span', { className: 'badge ok' }, 'healthy')
      : h('span', { className: 'badge warn' }, `${o.failures} consecutive failure${o.failures === 1 ? '' : 's'}`))))
  $('origins').replaceChildren(...(rows.length === 0
    ? [h('tr', {}, h('td', { className: 'empty', colSpan: 5 },
        'no plugin callbacks registered'))]
    : rows))
}

function renderEvictions () {
  const items = state.evictions.map((e) => h('div', { className: 'eviction', dataset: { origin: e.origin } },
    h('div', { className: 'row between' },
      h('span', {}, h('span', { className: 'badge bad' }, 'evicted'), ' ', h('span', { className: 'mono' }, e.origin)),
      h('span', { className: 'when', title: e.at }, `${clock(e.at)} · ${ago(e.at)}`)),
    h('div', { className: 'small' },
      `${e.tools.join(', ')} from ${e.roles.join(', ')} after ${e.failures} connection failures`)))
  $('evictions').replaceChildren(...(items.length === 0 ? [h('div', { className: 'empty' }, 'no evictions')] : items))
}

// Reads of the state: at most one in flight and one waiting (however many events ask), and a
// failed one is tried again with a growing delay, the view marked stale meanwhile.
let refreshTimer = null
let refreshAt = 0
let reading = false
/** The delay of the read asked for while one was in flight (null: none was). */
let readAgain = null
let retryMs = 0

function scheduleStateRefresh (delay = REFRESH_MS) {
  if (reading) {
    readAgain = Math.min(readAgain ?? delay, delay)
    return
  }
  // A read already waiting stays, unless this one is wanted sooner (never sooner than a retry's delay).
  if (refreshTimer !== null && (retryMs > 0 || refreshAt <= Date.now() + delay)) return
  clearTimeout(refreshTimer)
  refreshAt = Date.now() + delay
  refreshTimer = setTimeout(refreshState, delay)
}

async function refreshState () {
  refreshTimer = null
  reading = true
  readAgain = null
  try {
    await loadState()
    retryMs = 0
  } catch {
    retryMs = retryMs === 0 ? RETRY_FIRST_MS : Math.min(RETRY_MAX_MS, retryMs * 2)
  } finally {
    reading = false
  }
  setStale(retryMs > 0)
  if (retryMs > 0) {
    refreshAt = Date.now() + retryMs
    refreshTimer = setTimeout(refreshState, retryMs)
  } else if (readAgain !== null) {
    scheduleStateRefresh(readAgain)
  }
}

// ---------------------------------------------------------------------------------------------
// Recent calls (metadata only): the state's `calls`, then the `call` events that came after it.
// Events are never replayed, and not all are streamed (a call storm), so each read of the state
// (after a reconnect too) sets the table again.

/** The calls shown, oldest first; each row is `rows.get(call)`. */
let calls = []
const rows = new WeakMap()
/** `call` events received so far: the `seq` of each. */
let callEvents = 0

function callRow (call, flash) {
  return h('tr', { className: flash ? 'flash' : '' },
    h('td', { className: 'muted' }, clock(call.at)),
    h('td', {}, call.role),
    h('td', { className: 'mono' }, call.tool ?? '(unknown tool)'),
    h('td', {}, outcomeBadge(call.outcome, call.is_error)),
    h('td', { className: 'num' }, ms(call.duration_ms)),
    h('td', { className: 'num' }, String(call.bytes)))
}

function addCallEvent (data) {
  const call = { ...data, at: new Date().toISOString(), seq: ++callEvents }
  calls.push(call)
  const row = callRow(call, true)
  rows.set(call, row)
  const tbody = $('calls')
  tbody.prepend(row)
  if (calls.length > MAX_CALL_ROWS) calls = calls.slice(-MAX_CALL_ROWS)
  while (tbody.children.length > MAX_CALL_ROWS) tbody.lastElementChild.remove()
}

const callKey = (c) => JSON.stringify([c.role, c.tool, c.source ?? null, c.outcome, c.is_error, c.duration_ms, c.bytes])

/**
 * Sets the table to the state's calls (oldest first), then the events received since the read was
 * sent (`seq` > `eventsBefore`) that the state does not hold yet. Those the state holds are the
 * first of them (calls finish in one order), matched from its end; they keep their rows.
 */
function mergeCalls (stateCalls, eventsBefore) {
  const late = calls.filter((c) => c.seq !== undefined && c.seq > eventsBefore)
  const merged = stateCalls.map((c) => ({ ...c }))
  let held = late.length
  for (; held > 0; held--) {
    let i = merged.length - 1
    let k = held - 1
    for (; k >= 0 && i >= 0; i--) if (callKey(merged[i]) === callKey(late[k])) k--
    if (k < 0) break
  }
  // The events the state holds give their rows (and their place) to its entries.
  for (let i = merged.length - 1, k = held - 1; k >= 0 && i >= 0; i--) {
    if (callKey(merged[i]) === callKey(late[k])) merged[i] = late[k--]
  }
  calls = [...merged, ...late.slice(held)].slice(-MAX_CALL_ROWS)
  $('calls').replaceChildren(...calls.map((call) => {
    let row = rows.get(call)
    if (row === undefined) {
      row = callRow(call, false)
      rows.set(call, row)
    }
    return row
  }).reverse())
}

// ---------------------------------------------------------------------------------------------
// Live numbers and charts (GET /api/console/stats every 2 s)

const charts = { rate: null, latency: null }
let selectedSeries = 'all'
let lastStats = null

function cssVar (name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim()
}

function chartOptions (kind, width) {
  const axis = {
    stroke: cssVar('--muted'),
    grid: { stroke: cssVar('--grid'), width: 1 },
    ticks: { stroke: cssVar('--grid') }
  }
  const series = kind === 'rate'
    ? [{}, { label: 'calls/s', stroke: cssVar('--accent'), fill: cssVar('--accent-soft'), width: 1.5 },
        { label: 'errors/s', stroke: cssVar('--bad'), width: 1.2 }]
    : [{}, { label: 'p50', stroke: cssVar('--ok'), width: 1.5, spanGaps: false },
        { label: 'p99', stroke: cssVar('--warn'), width: 1.5, spanGaps: false }]
  return {
    width,
    height: 150,
    cursor: { drag: { x: false, y: false } },
    legend: { show: true },
    scales: { x: { time: true }, y: { range: (_u, _min, max) => [0, max > 0 ? max * 1.1 : 1] } },
    axes: [{ ...axis, space: 70, values: (_u, splits) => splits.map(timeLabel) }, { ...axis, size: 48 }],
    series
  }
}

function timeLabel (second) {
  return new Date(second * 1000).toLocaleTimeString([], { hour12: false })
}

/** Charts start at the first second with calls (at least the last minute shows), up to the window. */
function firstShown (all, windowSeconds) {
  const first = all.calls.findIndex((n) => n > 0)
  return first === -1 ? windowSeconds - 60 : Math.min(first, windowSeconds - 60)
}

function chartData (kind, series, endSecond, windowSeconds, start) {
  const xs = []
  for (let i = start; i < windowSeconds; i++) xs.push(endSecond - windowSeconds + 1 + i)
  return kind === 'rate'
    ? [xs, series.calls.slice(start), series.errors.slice(start)]
    : [xs, series.p50.slice(start), series.p99.slice(start)]
}

function drawCharts () {
  if (lastStats === null) return
  const { stats } = lastStats
  const series = selectedSeries === 'all'
    ? stats.all
    : stats.tools.find((s) => seriesKey(s) === selectedSeries) ?? stats.all
  const start = firstShown(stats.all, stats.window_seconds)
  for (const kind of ['rate', 'latency']) {
    const target = $(kind === 'rate' ? 'chart-rate' : 'chart-latency')
    const data = chartData(kind, series, stats.end_second, stats.window_seconds, start)
    const width = Math.max(240, target.clientWidth)
    if (charts[kind] === null) {
      charts[kind] = new UPlot(chartOptions(kind, width), data, target)
    } else {
      charts[kind].setData(data)
      if (Math.abs(charts[kind].width - width) > 2) charts[kind].setSize({ width, height: 150 })
    }
  }
}

function resetCharts () {
  for (const kind of ['rate', 'latency']) {
    charts[kind]?.destroy()
    charts[kind] = null
  }
  drawCharts()
}

/**
 * A role/tool series' option value: both names may hold a `/` (role `a` with tool `b/c`, role `a/b`
 * with tool `c`), so the value is their JSON pair; the option shows `role/tool`.
 */
function seriesKey (series) {
  return JSON.stringify([series.role, series.tool])
}

function renderSeriesSelect (stats) {
  const select = $('series-select')
  const keys = ['all', ...stats.tools.map(seriesKey)]
  const labels = ['all calls', ...stats.tools.map((s) => `${s.role}/${s.tool}`)]
  const current = [...select.options].map((o) => o.value)
  if (current.join('\n') === keys.join('\n')) return
  select.replaceChildren(...keys.map((key, i) => h('option', { value: key, selected: key === selectedSeries }, labels[i])))
  if (!keys.includes(selectedSeries)) selectedSeries = 'all'
}

async function loadStats () {
  const { status, body } = await api('/api/console/stats')
  if (status !== 200 || body === null) return
  lastStats = body
  const pool = body.pool
  $('stat-pool').textContent = pool.mode === 'pool' ? `${pool.threads} thread${pool.threads === 1 ? '' : 's'}` : 'inline'
  $('stat-inflight').textContent = `${pool.in_flight} · ${pool.queued}`
  const util = Math.round(pool.utilization * 100)
  $('stat-util').textContent = `${util} %`
  $('stat-util-bar').style.width = `${Math.min(100, util)}%`
  const recent = body.stats.all.calls.slice(-10)
  $('stat-rate').textContent = (recent.reduce((a, b) => a + b, 0) / 10).toFixed(1)
  renderSeriesSelect(body.stats)
  drawCharts()
}

// ---------------------------------------------------------------------------------------------
// The live stream (fetch + eventsource-parser, with Last-Event-ID on reconnect)

let lastEventId = null

let live = { kind: 'connecting', text: 'connecting' }
let stale = false

/** The stream's state, shown unless it is live and the last read of the state failed. */
function setLive (kind, text) {
  live = { kind, text }
  showLive()
}

function setStale (value) {
  stale = value
  showLive()
}

function showLive () {
  const [kind, text] = live.kind === 'live' && stale ? ['stale', 'live · view stale, retrying'] : [live.kind, live.text]
  $('live').dataset.state = kind
  $('live-text').textContent = text
}

function onEvent (message) {
  if (message.id !== undefined) lastEventId = message.id
  const data = JSON.parse(message.data)
  if (message.event === 'hello') {
    registryChanged = true
    setLive('live', 'live')
    // Fetch the whole view again, even when the replay is complete: `call` events are never
    // replayed, and the calls made while the stream was down show only in the state.
    scheduleStateRefresh()
    return
  }
  if (message.event === 'call') {
    addCallEvent(data)
    // The plugins' health (consecutive connection failures) changes with calls, and only the
    // state says it; so does a call whose event was not streamed. One read a second at most.
    scheduleStateRefresh(CALL_REFRESH_MS)
    return
  }
  if (REGISTRY_EVENTS.has(message.event)) {
    registryChanged = true
    scheduleStateRefresh()
  }
}

/** Reads the stream until it ends; `onOpen` once it is open. */
async function streamOnce (onOpen) {
  const headers = authHeaders({ accept: 'text/event-stream' })
  if (lastEventId !== null) headers['last-event-id'] = lastEventId
  const res = await fetch('/api/events', { headers, cache: 'no-store' })
  if (res.status === 401) {
    await askToken(token === null ? '' : 'That token was refused; try again.')
    return
  }
  if (!res.ok || res.body === null) throw new Error(`HTTP ${res.status}`)
  onOpen()
  const parser = createParser({ onEvent })
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader()
  for (;;) {
    const { value, done } = await reader.read()
    if (done) break
    parser.feed(value)
  }
}

async function stream () {
  let failures = 0
  for (;;) {
    // A stream that was open counts no failure when it breaks (a dropped connection ends it with
    // an error): only attempts that never opened make the wait grow.
    let opened = false
    try {
      await streamOnce(() => { opened = true })
      failures = 0
    } catch {
      failures = opened ? 0 : failures + 1
    }
    setLive(failures === 0 ? 'connecting' : 'down', failures === 0 ? 'reconnecting' : 'disconnected')
    await new Promise((resolve) => setTimeout(resolve, Math.min(10_000, 500 * 2 ** Math.min(failures, 5))))
  }
}

// ---------------------------------------------------------------------------------------------
// Theme

function applyTheme (theme) {
  if (theme === null) delete document.documentElement.dataset.theme
  else document.documentElement.dataset.theme = theme
}

function toggleTheme () {
  const dark = cssVar('color-scheme') === 'dark'
  const next = dark ? 'light' : 'dark'
  localStorage.setItem(THEME_KEY, next)
  applyTheme(next)
  resetCharts()
}

// ---------------------------------------------------------------------------------------------

const playground = setupPlayground({ api, h })

async function main () {
  applyTheme(localStorage.getItem(THEME_KEY))
  $('theme-toggle').addEventListener('click', toggleTheme)
  $('series-select').addEventListener('change', (e) => {
    selectedSeries = e.target.value
    drawCharts()
  })
  window.addEventListener('resize', () => drawCharts())
  await refreshState()
  // A first read that fails (Toolport restarting) must not keep the event stream from opening:
  // the stream's reconnects and the next interval read again.
  await loadStats().catch(() => {})
  setInterval(() => { loadStats().catch(() => {}) }, STATS_EVERY_MS)
  // Relative times ("12 s ago") age even without events.
  setInterval(() => { if (state !== null) { renderRoles(); renderEvictions() } }, 15_000)
  stream()
}

main().catch((err) => {
  setLive('down', 'error')
  console.error('console failed to start', err)
})
