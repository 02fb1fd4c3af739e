// Property tests of the web console in a real browser (README "The console", "Live events";
// SECURITY.md "The web console", "Inbound"), against real Toolport instances on 127.0.0.1 and
// Debian's chromium driven by puppeteer-core (which never downloads a browser). One browser for
// the file, a new page per run.
//
// - Convergence: random sequences of registry changes (register, replace, unregister, clear, for
//   one role or all; roles added and removed), calls (ok, tool errors, slow ones left in flight,
//   unknown tools, connection failures), evictions, event-stream drops (the server closes every
//   connection; the console reconnects with Last-Event-ID) and restarts (the Toolport is closed
//   and a new one listens on the same port). After each step, the console's DOM must come
//   to show exactly what the server documents: the registry (GET /api/tools, with the role order,
//   timeouts, origins and evictions of GET /api/console/state), the plugins' health (consecutive
//   connection failures) and the recent calls. The DOM is read with page.evaluate and waited for
//   with a bounded poll; no sleep decides anything. Also in token mode, and with reads of the
//   state that fail (request interception in the page).
// - The playground: a form built from any schema (property names such as `__proto__`) and the raw
//   JSON editor carry the typed arguments to the plugin.
// - Hostile text: tool names, descriptions, role names, plugin ids, error messages and results
//   holding markup, script ends, javascript: URLs, bidi controls and long strings are shown as
//   the exact text, never markup: a window.__pwned trap, CSP violation events, the page's element
//   census, and every request the page makes (all to the Toolport's own origin or data:).
// - The guard (SECURITY.md "Inbound" checks 2 and 3): a page of another loopback origin cannot
//   read the API, open the event stream or drive it (fetch, no-cors posts, form posts): every
//   request it makes that reaches Toolport is a 403, and nothing changes; a DNS-rebinding page is
//   refused by the Host check; the console works under every allowed name (IPv6 included). Its
//   files carry the documented CSP and headers, and its static routes serve nothing else.
//
// The tests at the end are cases the properties found, shrunk; they fail until the bug is fixed.
import assert from 'node:assert/strict'
import { existsSync } from 'node:fs'
import { createServer, get as httpGet, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { isDeepStrictEqual } from 'node:util'
import { after, before, describe, test, type TestContext } from 'node:test'
import fc from 'fast-check'
import puppeteer, { type Browser, type Page } from 'puppeteer-core'
import { createToolport, type Toolport, type ToolportOptions } from '../../src/main/index.js'
import { CONSOLE_CSP } from '../../src/main/http/console.js'
import { request as httpRequest } from 'undici'
import { waitFor, within, type JsonReply } from '../helpers.js'

type Json = Record<string, any>

const BROWSER = [
  { path: process.env.CHROMIUM_PATH, headless: true },
  { path: '/usr/lib/chromium/chromium-headless-shell', headless: 'shell' },
  { path: '/usr/bin/chromium-headless-shell', headless: 'shell' },
  { path: '/usr/bin/chromium', headless: true },
  { path: '/usr/bin/chromium-browser', headless: true }
].find(({ path }) => path !== undefined && path !== '' && existsSync(path))
const skip = BROWSER === undefined ? 'no chromium found (install it: apt-get install -y chromium, or set CHROMIUM_PATH)' : false

/** Longer hunts: TP_PROPERTY_RUNS=4 runs every property four times as often. */
const RUNS = Math.max(1, Number(process.env.TP_PROPERTY_RUNS ?? 1) || 1)
const runs = (n: number): number => n * RUNS
/**
 * How long the console may take to show a state: its stream reconnects after 0.5 s, 1 s, 2 s …
 * (console/console.js `stream()`), its state refresh is debounced 120 ms. A bound, not a timing
 * assertion: a console that never converges fails with the last difference.
 */
const CONVERGE_MS = 6000
/**
 * A failing run waits CONVERGE_MS, and every shrinking step waits it again: runs stop at the
 * first counterexample unless TP_PROPERTY_SHRINK=1 asks for a shrunk one.
 */
const PROPERTY_OPTIONS = { includeErrorInReport: true, endOnFailure: process.env.TP_PROPERTY_SHRINK !== '1' }
const GUARD_MS = 15_000

// ---------------------------------------------------------------------------------------------
// Plugins: one callback server whose path says how to answer; a dead origin (a closed port).

/** The reply `/hostile` gives (set per run by the hostile-text property). */
let hostileReply: Json = { output: 'ok', is_error: false }
/** Requests each callback path got, for the guard property ("the tool was never called"). */
const callbackHits = new Map<string, number>()

function callbackRoute (req: IncomingMessage, res: ServerResponse): void {
  const path = (req.url ?? '/').split('?')[0] as string
  callbackHits.set(path, (callbackHits.get(path) ?? 0) + 1)
  const chunks: Buffer[] = []
  req.on('data', (chunk: Buffer) => { chunks.push(chunk) })
  req.on('end', () => {
    const send = (body: unknown): void => {
      const text = JSON.stringify(body)
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) })
      res.end(text)
    }
    const [, kind = ''] = path.split('/')
    if (kind === 'ok') send({ output: { path }, is_error: false })
    else if (kind === 'fail') send({ error: `failed at ${path}`, is_error: true })
    else if (kind === 'slow') setTimeout(() => send({ output: 'slow', is_error: false }), 150)
    else if (kind === 'hostile') send(hostileReply)
    else if (kind === 'echo') send({ output: JSON.parse(Buffer.concat(chunks).toString('utf8')).arguments, is_error: false })
    else send({ output: null, is_error: false })
  })
}

async function listenOn (server: Server, port = 0, host = '127.0.0.1'): Promise<number> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, host, () => { server.off('error', reject); resolve() })
  })
  return (server.address() as AddressInfo).port
}

async function closeServer (server: Server): Promise<void> {
  server.closeAllConnections()
  await new Promise<void>((resolve) => server.close(() => resolve()))
}

/** The bearer token the test's own requests send (token-mode runs set it, and clear it after). */
let apiToken: string | undefined

/**
 * A real HTTP request on a connection of its own (`Connection: close`): the steps close every
 * connection of the server, and a pooled one could be cut under the next request.
 */
async function httpJson (url: string, method: 'GET' | 'POST', body?: unknown): Promise<JsonReply> {
  const headers: Record<string, string> = {}
  if (body !== undefined) headers['content-type'] = 'application/json'
  if (apiToken !== undefined) headers.authorization = `Bearer ${apiToken}`
  const res = await httpRequest(url, {
    method,
    reset: true,
    headers,
    ...(body === undefined ? {} : { body: JSON.stringify(body) })
  })
  const text = await res.body.text()
  return { statusCode: res.statusCode, headers: res.headers, body: text === '' ? undefined : JSON.parse(text) }
}

// ---------------------------------------------------------------------------------------------
// Toolport instances that can be restarted on the same port

interface Instance { tp: Toolport, url: string, port: number }

function tpOptions (extra: ToolportOptions = {}): ToolportOptions {
  return { logger: false, ...extra, dispatch: { mode: 'inline', ...extra.dispatch } }
}

async function startInstance (options: ToolportOptions, port = 0, host = '127.0.0.1'): Promise<Instance> {
  const tp = await createToolport(tpOptions(options))
  try {
    const { url, port: real } = await tp.listen({ host, port })
    return { tp, url, port: real }
  } catch (err) {
    await tp.close()
    throw err
  }
}

/** A Toolport that `restart()` replaces by a new one on the same port; closed in `t.after`. */
interface Restartable { current: () => Instance, restart: () => Promise<void> }

async function restartable (t: TestContext, options: ToolportOptions): Promise<Restartable> {
  let instance = await startInstance(options)
  t.after(() => instance.tp.close())
  return {
    current: () => instance,
    restart: async () => {
      const port = instance.port
      await instance.tp.close()
      // The port was just freed; another process taking it in between fails the run loudly.
      instance = await startInstance(options, port)
    }
  }
}

// ---------------------------------------------------------------------------------------------
// What the console should show, computed from the server's own documents

/** console/console.js `ms()`: the latency column's format. */
function msText (value: number | null | undefined): string {
  if (value === null || value === undefined) return '–'
  return value < 10 ? value.toFixed(2) : value < 100 ? value.toFixed(1) : Math.round(value).toString()
}

function outcomeLabel (outcome: string, isError: boolean): string {
  return outcome === 'ok' && isError ? 'tool error' : outcome.replaceAll('_', ' ')
}

type View = 'registry' | 'health' | 'calls'

/**
 * The console's view as the server documents it: the registry from GET /api/tools (contents) and
 * GET /api/console/state (role order, timeouts, origins, evictions, recent calls).
 */
async function expectedView (url: string, views: readonly View[]): Promise<Json> {
  const [state, listing] = await Promise.all([
    httpJson(`${url}/api/console/state`, 'GET'),
    httpJson(`${url}/api/tools`, 'GET')
  ])
  assert.equal(state.statusCode, 200)
  assert.equal(listing.statusCode, 200)
  const s = state.body as Json
  const byRole = listing.body.tools_by_role as Record<string, Json[]>
  // The two documents agree on the registry (README "API": GET /api/tools is the registry).
  assert.deepEqual(s.roles.map((r: Json) => r.name).sort(), Object.keys(byRole).sort(), 'roles of /api/console/state vs /api/tools')
  for (const role of s.roles as Json[]) {
    assert.deepEqual(role.tools.map((tool: Json) => [tool.name, tool.description, tool.source, tool.callback_url]),
      (byRole[role.name] ?? []).map((row) => [row.name, row.description, row.source, row.callback_url]),
      `tools of role ${String(role.name)}: /api/console/state vs /api/tools`)
  }
  const view: Json = {}
  if (views.includes('registry')) {
    const toolCount = s.roles.reduce((n: number, r: Json) => n + r.tools.length, 0)
    view.registry = {
      live: 'live',
      instance: `instance ${String(s.instance_id).slice(0, 8)}`,
      statRoles: String(s.roles.length),
      statTools: String(toolCount),
      roles: (s.roles as Json[]).map((role) => ({
        name: role.name,
        shown: role.name,
        count: `${role.tools.length} ${role.tools.length === 1 ? 'tool' : 'tools'}`,
        tools: (role.tools as Json[]).map((tool) => ({
          name: tool.name,
          shown: tool.name,
          description: tool.description,
          source: tool.source,
          origin: tool.origin === null ? 'in-process' : String(tool.origin).replace(/^https?:\/\//, ''),
          timeout: `${tool.timeout_seconds} s`
        }))
      })),
      origins: (s.origins as Json[]).map((o) => ({
        origin: o.origin, sources: o.sources.join(', '), tools: String(o.tools), roles: o.roles.join(', ')
      })),
      evictions: (s.evictions as Json[]).map((e) => ({
        origin: e.origin,
        detail: `${e.tools.join(', ')} from ${e.roles.join(', ')} after ${e.failures} connection failures`
      }))
    }
  }
  if (views.includes('health')) {
    view.health = (s.origins as Json[]).map((o) => ({
      origin: o.origin,
      health: o.failures === 0 ? 'healthy' : `${o.failures} consecutive failure${o.failures === 1 ? '' : 's'}`
    }))
  }
  if (views.includes('calls')) {
    // The table holds the newest 60 calls, newest first (console.js MAX_CALL_ROWS).
    view.calls = (s.calls as Json[]).slice(-60).reverse().map((c) => [
      c.role, c.tool ?? '(unknown tool)', outcomeLabel(c.outcome, c.is_error), msText(c.duration_ms), String(c.bytes)
    ])
  }
  return view
}

/**
 * Page-side: text as the console shows it, with each bidi control it shows as its code point
 * (\`⟨U+202E⟩\`: a name must not display as another) read back as the character, so that what is
 * compared is exactly what the server holds.
 */
const UNMARK = '(s) => s.replace(/⟨U\\+([0-9A-F]{4,6})⟩/g, (_, hex) => String.fromCodePoint(parseInt(hex, 16)))'

/** The console's DOM, read in the page (as text: this project's TypeScript has no DOM types). */
const READ_DOM = `(() => {
  const unmark = ${UNMARK}
  const text = (el) => el === null || el === undefined ? null : unmark(el.textContent)
  const $ = (id) => document.getElementById(id)
  return {
    registry: {
      live: $('live').dataset.state,
      instance: text($('instance')),
      statRoles: text($('stat-roles')),
      statTools: text($('stat-tools')),
      roles: [...document.querySelectorAll('#roles .role')].map((r) => ({
        name: r.dataset.role,
        shown: text(r.querySelector('.role-name')),
        count: text(r.querySelector('.role-meta .badge.info')),
        tools: [...r.querySelectorAll('tr[data-tool]')].map((tr) => ({
          name: tr.dataset.tool,
          shown: text(tr.cells[0].querySelector('.mono')),
          description: text(tr.cells[0].querySelector('.desc')),
          source: text(tr.cells[1]),
          origin: text(tr.cells[2]),
          timeout: text(tr.cells[3])
        }))
      })),
      origins: [...document.querySelectorAll('#origins tr[data-origin]')].map((tr) => ({
        origin: tr.dataset.origin, sources: text(tr.cells[1]), tools: text(tr.cells[2]), roles: text(tr.cells[3])
      })),
      evictions: [...document.querySelectorAll('#evictions .eviction')].map((e) => ({
        origin: e.dataset.origin, detail: text(e.querySelector('.small'))
      })),
      playground: {
        roles: [...$('pg-role').options].map((o) => o.value),
        role: $('pg-role').value,
        tools: [...$('pg-tool').options].map((o) => o.value),
        callDisabled: $('pg-call').disabled
      }
    },
    health: [...document.querySelectorAll('#origins tr[data-origin]')].map((tr) => ({
      origin: tr.dataset.origin, health: text(tr.cells[4])
    })),
    calls: [...document.querySelectorAll('#calls tr')].map((tr) => [...tr.cells].slice(1).map((td) => text(td)))
  }
})()`

/**
 * Polls until the page shows what the server documents (both read afresh each round), or fails
 * after CONVERGE_MS with the last difference. The bound is a hang guard: what is asserted is
 * that the DOM comes to equal the documents.
 */
async function converge (page: Page, url: () => string, views: readonly View[], what: string): Promise<void> {
  const until = Date.now() + CONVERGE_MS
  let last: { shown: Json, expected: Json } | null = null
  for (let round = 0; ; round++) {
    const expected = await expectedView(url(), views)
    const dom = await page.evaluate(READ_DOM) as Json
    if (expected.registry !== undefined) {
      // The playground offers every role, and the tools of the role it has selected (one of them).
      const roles = expected.registry.roles as Json[]
      const names = roles.map((r) => r.name as string)
      const role = names.includes(dom.registry.playground.role) ? dom.registry.playground.role as string : (names[0] ?? '')
      const tools = (roles.find((r) => r.name === role)?.tools ?? []).map((tool: Json) => tool.name as string)
      expected.registry.playground = { roles: names, role, tools, callDisabled: tools.length === 0 }
    }
    const shown: Json = {}
    for (const v of views) shown[v] = dom[v]
    if (isDeepStrictEqual(shown, expected)) return
    last = { shown, expected }
    if (Date.now() > until) break
    await new Promise((resolve) => setTimeout(resolve, 25))
  }
  assert.deepEqual(last?.shown, last?.expected, `${what}: the console never came to show the server's state within ${CONVERGE_MS} ms`)
}

// ---------------------------------------------------------------------------------------------
// Steps of the convergence property

const ROLE_POOL = ['Lanlan', 'Mochi', 'Nova'] as const
const INITIAL_ROLES = ['Lanlan', 'Mochi']
const NAMES = ['alpha', 'beta', 'gamma'] as const
const SOURCES = ['plugin:one', 'plugin:two', 'external'] as const
const ROUTES = ['ok', 'fail', 'slow'] as const
const DESCRIPTIONS = ['', 'Get the weather.', 'Über — 天気 🦊'] as const
const TIMEOUTS = [30, 5, 0.5] as const

type Step =
  | { kind: 'register', name: string, role: string | null, source: string, route: string, description: string, timeout: number }
  | { kind: 'unregister', name: string, role: string | null }
  | { kind: 'clear', source: string, role: string | null }
  | { kind: 'addRole', role: string }
  | { kind: 'removeRole', role: string }
  | { kind: 'call', role: string, name: string }
  | { kind: 'slowCall', role: string, name: string }
  | { kind: 'registerDead', role: string | null }
  | { kind: 'callDead', role: string, times: number }
  /** `during`: steps taken while the console is disconnected (they reach it by replay, or by a fresh read). */
  | { kind: 'drop', during: Step[] }
  | { kind: 'restart', during: Step[] }
  | { kind: 'check' }
  | { kind: 'failRead' }

const roleOrAll = fc.option(fc.constantFrom(...ROLE_POOL), { nil: null })
/** Registry changes and calls (no drops, restarts or checks). */
const changeArb: fc.Arbitrary<Step> = fc.oneof(
  { weight: 5, arbitrary: fc.record({ kind: fc.constant('register' as const), name: fc.constantFrom(...NAMES), role: roleOrAll, source: fc.constantFrom(...SOURCES), route: fc.constantFrom(...ROUTES), description: fc.constantFrom(...DESCRIPTIONS), timeout: fc.constantFrom(...TIMEOUTS) }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('unregister' as const), name: fc.constantFrom(...NAMES), role: roleOrAll }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('clear' as const), source: fc.constantFrom(...SOURCES), role: roleOrAll }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('addRole' as const), role: fc.constantFrom(...ROLE_POOL) }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('removeRole' as const), role: fc.constantFrom(...ROLE_POOL) }) },
  { weight: 4, arbitrary: fc.record({ kind: fc.constant('call' as const), role: fc.constantFrom(...ROLE_POOL), name: fc.constantFrom(...NAMES, 'nope') }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('slowCall' as const), role: fc.constantFrom(...ROLE_POOL), name: fc.constantFrom(...NAMES) }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('registerDead' as const), role: roleOrAll }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('callDead' as const), role: fc.constantFrom(...ROLE_POOL), times: fc.integer({ min: 1, max: 3 }) }) }
)
const stepArb: fc.Arbitrary<Step> = fc.oneof(
  { weight: 20, arbitrary: changeArb },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant('drop' as const), during: fc.array(changeArb, { maxLength: 2 }) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('restart' as const), during: fc.array(changeArb, { maxLength: 3 }) }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'check' as const }) }
)
/** The same steps, and reads of /api/console/state by the page that fail (a connection lost). */
const stepWithFaultsArb: fc.Arbitrary<Step> = fc.oneof(
  { weight: 8, arbitrary: stepArb },
  { weight: 1, arbitrary: fc.constant({ kind: 'failRead' as const }) }
)

// ---------------------------------------------------------------------------------------------

describe('the console in chromium: properties', { skip }, () => {
  let browser: Browser
  let callbacks: Server
  let callbackUrl: string
  let deadOrigin: string

  before(async () => {
    browser = await puppeteer.launch({
      executablePath: BROWSER?.path as string,
      headless: BROWSER?.headless as true | 'shell',
      // `attacker.example` and `rebind.example` resolve to loopback for the guard tests; nothing
      // else resolves at all (a request that left loopback would fail, and is recorded anyway).
      args: ['--no-sandbox', '--disable-gpu',
        '--host-resolver-rules=MAP attacker.example 127.0.0.1, MAP rebind.example 127.0.0.1, MAP allowed.example 127.0.0.1',
        '--no-zygote', '--renderer-process-limit=1', '--disable-extensions', '--disable-software-rasterizer',
        '--disable-site-isolation-trials',
        '--disable-features=Translate,OptimizationGuideModelDownloading,OptimizationHintsFetching,MediaRouter,site-per-process']
    })
    callbacks = createServer(callbackRoute)
    callbackUrl = `http://127.0.0.1:${await listenOn(callbacks)}`
    // Port 1 on loopback: nothing listens there (a freed port 0 pick could be handed to a later
    // server of this file, and the "dead" plugin would answer).
    deadOrigin = 'http://127.0.0.1:1'
  })
  after(async () => {
    await browser?.close()
    if (callbacks !== undefined) await closeServer(callbacks)
  })

  interface Watched {
    page: Page
    /** Console errors, page errors and CSP violations. */
    errors: string[]
    /** Every URL the page requested. */
    requests: string[]
  }

  /** A new page that records errors, CSP violations and requests, with a `window.__pwned` trap. */
  async function open (url: string | null, t: TestContext): Promise<Watched> {
    const page = await browser.newPage()
    t.after(async () => { if (!page.isClosed()) await page.close() })
    const errors: string[] = []
    const requests: string[] = []
    page.on('console', (message) => { if (message.type() === 'error') errors.push(message.text()) })
    page.on('pageerror', (err) => { errors.push(`pageerror: ${(err as Error).message}`) })
    page.on('request', (request) => { requests.push(request.url()) })
    await page.evaluateOnNewDocument(`window.__pwned = false
      document.addEventListener('securitypolicyviolation', (e) => {
        console.error('CSP violation: ' + e.violatedDirective + ' ' + e.blockedURI)
      })`)
    if (url !== null) await page.goto(url, { waitUntil: 'load' })
    return { page, errors, requests }
  }

  /**
   * A console page that has settled: live, and done with its first state read and the one its
   * stream's first `hello` (replay `none`) asks for, so that no read still in flight can pick up
   * a later change by chance and hide what the page does with events.
   */
  async function openSettled (url: string, t: TestContext, token?: string): Promise<Watched> {
    const watched = await open(null, t)
    // Token mode: a tab that was given the token already (README "The console": kept in sessionStorage).
    if (token !== undefined) await watched.page.evaluateOnNewDocument(`sessionStorage.setItem('toolport.token', ${JSON.stringify(token)})`)
    let stateReads = 0
    watched.page.on('requestfinished', (request) => { if (request.url().endsWith('/api/console/state')) stateReads++ })
    await watched.page.goto(url, { waitUntil: 'load' })
    await within(watched.page.waitForSelector('#live[data-state="live"]'), 'the console goes live', GUARD_MS)
    await waitFor('the console\'s first state reads', () => stateReads >= 2, GUARD_MS)
    return watched
  }

  // -------------------------------------------------------------------------------------------
  // Convergence

  /** Runs `steps` against a console page, then waits for the DOM to show `views`. */
  async function runSteps (t: TestContext, steps: Step[], views: readonly View[], token?: string): Promise<void> {
    apiToken = token
    t.after(() => { apiToken = undefined })
    const security = token === undefined ? {} : { security: { token } }
    const server = await restartable(t, { roles: INITIAL_ROLES, ...security })
    const url = (): string => server.current().url
    const { page, errors } = await openSettled(`${url()}/`, t, token)
    // `failRead` makes the page's next read of /api/console/state fail as a dropped connection
    // would (request interception: the only way to hit that read and nothing else).
    let failNextRead = false
    await page.setRequestInterception(true)
    page.on('request', (request) => {
      if (request.isInterceptResolutionHandled()) return
      if (failNextRead && request.url().endsWith('/api/console/state')) {
        failNextRead = false
        request.abort('connectionreset').catch(() => {})
      } else {
        request.continue().catch(() => {})
      }
    })
    const inFlight: Array<Promise<unknown>> = []
    const post = async (path: string, body: Json): Promise<Json> => {
      const reply = await within(httpJson(`${url()}${path}`, 'POST', body), `POST ${path}`, GUARD_MS)
      return reply
    }
    const apply = async (step: Step): Promise<void> => {
      const tp = server.current().tp
      switch (step.kind) {
        case 'register': {
          const reply = await post('/api/tools/register', {
            name: step.name,
            callback_url: `${callbackUrl}/${step.route}/${step.name}`,
            description: step.description,
            source: step.source,
            timeout_seconds: step.timeout,
            ...(step.role === null ? {} : { role: step.role })
          })
          assert.ok(reply.statusCode === 200 || reply.statusCode === 404, JSON.stringify(reply.body))
          break
        }
        case 'unregister':
          await post('/api/tools/unregister', { name: step.name, ...(step.role === null ? {} : { role: step.role }) })
          break
        case 'clear':
          await post('/api/tools/clear', { source: step.source, ...(step.role === null ? {} : { role: step.role }) })
          break
        case 'addRole':
          if (!tp.roles.has(step.role)) tp.roles.add(step.role)
          break
        case 'removeRole':
          tp.roles.remove(step.role)
          break
        case 'call':
          await post('/api/tools/call', { role: step.role, name: step.name, arguments: {} })
          break
        case 'slowCall':
          // Left in flight (a drop or restart may cut it): awaited, whatever its end, before the check.
          inFlight.push(httpJson(`${url()}/api/tools/call`, 'POST', { role: step.role, name: step.name, arguments: {} }).catch(() => {}))
          break
        case 'registerDead':
          await post('/api/tools/register', {
            name: 'dead',
            callback_url: `${deadOrigin}/dead`,
            source: 'plugin:dead',
            ...(step.role === null ? {} : { role: step.role })
          })
          break
        case 'callDead':
          for (let i = 0; i < step.times; i++) await post('/api/tools/call', { role: step.role, name: 'dead', arguments: {} })
          break
        case 'drop':
          // Every connection ends, the console's event stream with them; it reconnects with Last-Event-ID.
          await within(Promise.all(inFlight.splice(0)), 'calls in flight', GUARD_MS)
          server.current().tp.app.server.closeAllConnections()
          for (const change of step.during) await apply(change)
          break
        case 'restart':
          await within(Promise.all(inFlight.splice(0)), 'calls in flight', GUARD_MS)
          await within(server.restart(), 'a restart on the same port', GUARD_MS)
          for (const change of step.during) await apply(change)
          break
        case 'failRead':
          failNextRead = true
          break
        case 'check':
          await within(Promise.all(inFlight.splice(0)), 'calls in flight', GUARD_MS)
          break
      }
    }
    for (const [index, step] of steps.entries()) {
      await apply(step)
      // Between steps the page must come to show the state (a slow call still in flight is left
      // out: it settles at a `check`, a drop, a restart or the end).
      if (inFlight.length === 0) await converge(page, url, views, `after step ${index} (${step.kind})`)
    }
    await within(Promise.all(inFlight.splice(0)), 'calls in flight', GUARD_MS)
    await converge(page, url, views, 'after the steps')
    assert.deepEqual(errors.filter((e) => !e.includes('Failed to load resource') && !e.includes('net::ERR')), [],
      'no console errors, page errors or CSP violations')
  }

  const stepsArb = fc.array(stepArb, { minLength: 1, maxLength: 10 })

  test('property: the registry the console shows converges to GET /api/tools under changes, drops and restarts', async (t) => {
    await fc.assert(fc.asyncProperty(stepsArb, async (steps) => {
      await runInSubtest(t, (tt) => runSteps(tt, steps, ['registry']))
    }), {
      numRuns: runs(3),
      ...PROPERTY_OPTIONS,
      // Always tried: one change while the stream is down (it reaches the page only by replay),
      // and a role removed (the page learns it only from its event).
      examples: [[[
        { kind: 'drop', during: [{ kind: 'register', name: 'alpha', role: null, source: 'plugin:one', route: 'ok', description: 'Get the weather.', timeout: 5 }] },
        { kind: 'removeRole', role: 'Mochi' }
      ]]]
    })
  })

  test('property: in token mode the registry the console shows converges too (it keeps the tab\'s token across drops and restarts)', async (t) => {
    await fc.assert(fc.asyncProperty(stepsArb, async (steps) => {
      await runInSubtest(t, (tt) => runSteps(tt, steps, ['registry'], 'console-property-token-that-is-long-enough-0123456789'))
    }), {
      numRuns: runs(1),
      ...PROPERTY_OPTIONS,
      examples: [[[{ kind: 'restart', during: [{ kind: 'register', name: 'beta', role: 'Mochi', source: 'plugin:two', route: 'fail', description: '', timeout: 5 }] }]]]
    })
  })

  test('property: the plugins\' health the console shows converges to the consecutive failures the server counts', async (t) => {
    await fc.assert(fc.asyncProperty(stepsArb, async (steps) => {
      await runInSubtest(t, (tt) => runSteps(tt, steps, ['health']))
    }), {
      numRuns: runs(2),
      ...PROPERTY_OPTIONS,
      // Always tried: a dead plugin's first connection failure.
      examples: [[[{ kind: 'registerDead', role: null }, { kind: 'callDead', role: 'Lanlan', times: 1 }]]]
    })
  })

  test('property: the recent calls the console shows converge to the calls /api/console/state documents', async (t) => {
    await fc.assert(fc.asyncProperty(stepsArb, async (steps) => {
      await runInSubtest(t, (tt) => runSteps(tt, steps, ['calls']))
    }), {
      numRuns: runs(2),
      ...PROPERTY_OPTIONS,
      // Always tried: a call while the stream is down (after one the table shows already: an
      // empty table is refilled by any later read of the state).
      examples: [[[
        { kind: 'register', name: 'alpha', role: null, source: 'plugin:one', route: 'ok', description: '', timeout: 30 },
        { kind: 'call', role: 'Lanlan', name: 'alpha' },
        { kind: 'drop', during: [{ kind: 'call', role: 'Lanlan', name: 'alpha' }] }
      ]]]
    })
  })

  test('property: the registry the console shows converges even when one of its state reads fails', async (t) => {
    await fc.assert(fc.asyncProperty(fc.array(stepWithFaultsArb, { minLength: 1, maxLength: 10 }), async (steps) => {
      await runInSubtest(t, (tt) => runSteps(tt, steps, ['registry']))
    }), {
      numRuns: runs(2),
      ...PROPERTY_OPTIONS,
      // Always tried: the read a registration's event asks for fails.
      examples: [[[{ kind: 'failRead' }, { kind: 'register', name: 'alpha', role: null, source: 'plugin:one', route: 'ok', description: '', timeout: 30 }]]]
    })
  })

  // -------------------------------------------------------------------------------------------
  // Hostile text is shown as text

  /** The strings plugins may send, meant to become markup, script, requests or reordered text. */
  const HOSTILE = [
    '<img src=x onerror="window.__pwned=1">',
    '</script><script>window.__pwned=1</script>',
    'javascript:window.__pwned=1',
    '<svg/onload=window.__pwned=1>',
    '"><iframe srcdoc="<script>parent.__pwned=1</script>"></iframe>',
    '<a href="javascript:window.__pwned=1">click</a>',
    '\'; window.__pwned=1; \'',
    '\u202Egnp.exe\u202C evil',
    '\u2066\u2067bidi\u2069\u200F\u061C',
    '<img src="http://203.0.113.9/leak.png">',
    '<link rel=stylesheet href="http://203.0.113.9/x.css">',
    '<style>*{display:none}</style>',
    '&lt;b&gt;entity&lt;/b&gt; &amp; &#60;i&#62;',
    '<!-- comment --><b>bold</b>',
    '$' + '{window.__pwned=1}{{constructor.constructor("window.__pwned=1")()}}'
  ]
  /** Hostile text, maybe with random text around it, maybe repeated into a long string. */
  function hostileText (maxRepeat: number): fc.Arbitrary<string> {
    return fc.tuple(fc.constantFrom(...HOSTILE), fc.string({ unit: 'grapheme', maxLength: 6 }), fc.integer({ min: 1, max: maxRepeat }))
      .map(([h, extra, repeat]) => (extra + h).repeat(repeat))
  }
  /** A 1×1 transparent PNG. */
  const PNG_1X1 = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=='
  /** At most `n` code points, never empty. */
  const cut = (text: string, n: number): string => [...text].slice(0, n).join('') || 'x'

  /** Elements that only markup from a plugin could have made (the page's own: one logo svg, one script). */
  const CENSUS = `(() => ({
    pwned: window.__pwned,
    scripts: document.querySelectorAll('script').length,
    iframes: document.querySelectorAll('iframe, frame, object, embed').length,
    links: document.querySelectorAll('a, body link, body style, body script').length,
    imgs: [...document.querySelectorAll('img')].filter((img) => img.closest('#pg-images') === null).length,
    svgs: [...document.querySelectorAll('svg')].filter((svg) => !svg.classList.contains('logo')).length,
    bold: document.querySelectorAll('main b, main i').length
  }))()`
  const CLEAN_CENSUS = { pwned: false, scripts: 1, iframes: 0, links: 0, imgs: 0, svgs: 0, bold: 0 }

  interface HostileCase {
    role: string
    tools: [string, string]
    description: string
    plugin: string
    property: string
    propertyHelp: string
    reply: Json
  }

  const hostileCaseArb: fc.Arbitrary<HostileCase> = fc.record({
    // Cut by code points: a cut inside a surrogate pair makes a name no URL can carry.
    role: hostileText(3).map((s) => cut(s, 64)),
    tools: fc.tuple(hostileText(2).map((s) => cut(s, 64)), hostileText(1).map((s) => cut(s, 64))),
    description: hostileText(300).map((s) => cut(s, 8 * 1024)),
    plugin: hostileText(2).map((s) => `plugin:${cut(s, 120)}`),
    property: hostileText(1),
    propertyHelp: hostileText(3),
    reply: fc.oneof(
      fc.record({ output: hostileText(40), is_error: fc.constant(false) }),
      fc.record({
        output: fc.dictionary(hostileText(1), hostileText(2), { maxKeys: 2 }),
        is_error: fc.constant(false)
      }),
      fc.record({ error: hostileText(20), is_error: fc.constant(true) }),
      fc.record({ error: hostileText(2), output: hostileText(2), is_error: fc.constant(true) }),
      // An image whose vision prompt is hostile (README "Errors and images from a plugin").
      fc.record({
        output: hostileText(1),
        is_error: fc.constant(false),
        images: hostileText(8).map((prompt) => [{ data_b64: PNG_1X1, mime: 'image/png', vision_prompt: prompt }])
      })
    )
  }).filter((c) => c.tools[0] !== c.tools[1] && c.role.length > 0)

  async function hostileRun (t: TestContext, c: HostileCase): Promise<void> {
    hostileReply = c.reply
    const instance = await startInstance({ roles: [c.role] })
    t.after(() => instance.tp.close())
    const { url } = instance
    const register = async (body: Json): Promise<void> => {
      const reply = await httpJson(`${url}/api/tools/register`, 'POST', body)
      assert.equal(reply.statusCode, 200, JSON.stringify(reply.body).slice(0, 500))
      assert.equal(reply.body.ok, true)
    }
    await register({
      name: c.tools[0],
      description: c.description,
      callback_url: `${callbackUrl}/hostile/1`,
      source: c.plugin,
      parameters: { type: 'object', properties: { [c.property]: { type: 'string', description: c.propertyHelp } } }
    })
    await register({ name: c.tools[1], description: c.tools[0], callback_url: `${deadOrigin}/x`, source: c.plugin })
    // What the model reads for the call (README "Tool results"); the playground must show the same.
    const direct = await httpJson(`${url}/api/tools/call`, 'POST', { role: c.role, name: c.tools[0], arguments: {} })
    assert.equal(direct.statusCode, 200)
    const { page, errors, requests } = await open(`${url}/`, t)
    await converge(page, () => url, ['registry', 'calls'], 'hostile names')
    await page.select('#pg-role', c.role)
    await page.select('#pg-tool', c.tools[0])
    await within(page.waitForFunction(`(() => {
      const unmark = ${UNMARK}
      const help = document.querySelector('#pg-form .field-help')
      return unmark(document.getElementById('pg-description').textContent) === ${JSON.stringify(c.description)} &&
        help !== null && unmark(help.textContent) === ${JSON.stringify(c.propertyHelp)}
    })()`, { timeout: GUARD_MS }), 'the playground shows the tool', GUARD_MS)
    assert.equal(await page.evaluate(`(${UNMARK})(document.querySelector("#pg-form .field-name").textContent)`), c.property)
    await page.click('#pg-call')
    await within(page.waitForSelector('#pg-result:not([hidden])'), 'the playground result', GUARD_MS)
    const shown = await page.evaluate(`(() => {
      const unmark = ${UNMARK}
      const block = (id) => document.getElementById(id + '-block').hidden ? null : unmark(document.getElementById(id).textContent)
      return {
        status: document.getElementById('pg-status').textContent,
        text: block('pg-text'),
        output: block('pg-output'),
        error: block('pg-error'),
        images: document.getElementById('pg-images-block').hidden
          ? []
          : [...document.querySelectorAll('#pg-images figure')].map((f) => ({
              src: f.querySelector('img').getAttribute('src'),
              alt: f.querySelector('img').alt,
              caption: f.querySelector('figcaption') === null ? null : unmark(f.querySelector('figcaption').textContent)
            }))
      }
    })()`)
    const body = direct.body as Json
    assert.deepEqual(shown, {
      status: body.is_error === true ? 'tool error' : 'ok',
      text: body.text,
      output: body.output === null || body.output === undefined ? null : JSON.stringify(body.output, null, 2),
      error: typeof body.error === 'string' ? body.error : null,
      images: ((body.images ?? []) as Json[]).map((img) => ({
        src: `data:${String(img.mime_type)};base64,${String(img.data_base64)}`,
        alt: img.prompt ?? 'tool image',
        caption: img.prompt ?? null
      }))
    }, 'the playground shows the result as text')
    if (c.reply.images !== undefined) assert.equal(body.images?.length, 1, 'the image passed Toolport\'s checks')
    // One more call (metadata row) and a settle of the whole view after it.
    await converge(page, () => url, ['registry', 'calls'], 'after the playground call')
    assert.deepEqual(await page.evaluate(CENSUS), CLEAN_CENSUS, 'no markup from a plugin became elements, nothing ran')
    const foreign = requests.filter((r) => !r.startsWith(`${url}/`) && !r.startsWith('data:'))
    assert.deepEqual(foreign, [], 'every request of the page went to its own origin')
    assert.deepEqual(errors, [], 'no console errors, page errors or CSP violations')
  }

  test('property: names, descriptions, roles, plugin ids, errors and results holding markup are shown as text', async (t) => {
    await fc.assert(fc.asyncProperty(hostileCaseArb, async (c) => {
      await runInSubtest(t, (tt) => hostileRun(tt, c))
    }), { numRuns: runs(4), ...PROPERTY_OPTIONS })
  })

  test('the console\'s files carry the documented CSP and headers (SECURITY.md "The web console")', async (t) => {
    const instance = await startInstance({ roles: ['Lanlan'] })
    t.after(() => instance.tp.close())
    // The policy as SECURITY.md spells it (not the constant the code uses).
    const documented = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    assert.equal(CONSOLE_CSP, documented)
    const { page, requests, errors } = await open(`${instance.url}/`, t)
    await within(page.waitForSelector('#live[data-state="live"]'), 'live', GUARD_MS)
    await within(page.waitForSelector('#chart-rate .uplot'), 'the charts', GUARD_MS)
    const files = [...new Set(requests.map((r) => new URL(r).pathname).filter((p) => p === '/' || p.startsWith('/ui')))]
    assert.ok(files.includes('/ui/console.js') && files.includes('/ui/vendor/eventsource-parser.js'), files.join(' '))
    for (const path of ['/ui/', '/ui', ...files]) {
      const res = await httpRequest(`${instance.url}${path}`, { reset: true })
      await res.body.dump()
      assert.ok(res.statusCode === 200 || (path === '/ui' && res.statusCode === 301), `${path}: ${res.statusCode}`)
      assert.equal(res.headers['content-security-policy'], documented, `CSP of ${path}`)
      assert.equal(res.headers['x-frame-options'], 'DENY', `X-Frame-Options of ${path}`)
      assert.equal(res.headers['referrer-policy'], 'no-referrer', `Referrer-Policy of ${path}`)
      assert.equal(res.headers['x-content-type-options'], 'nosniff', `nosniff on ${path}`)
      assert.equal(res.headers['cache-control'], 'no-store', `no-store on ${path}`)
      assert.equal(res.headers['cross-origin-resource-policy'], 'same-origin', `CORP on ${path}`)
      assert.ok(!Object.keys(res.headers).some((h) => h.startsWith('access-control-')), `no CORS grant on ${path}`)
    }
    // uPlot sizes its elements through the CSSOM (allowed by the policy); markup has no inline style.
    const inline = await page.evaluate('[...document.scripts].filter((s) => s.src === "").length + document.querySelectorAll("style").length')
    assert.equal(inline, 0, 'no inline script or style element in the page')
    assert.deepEqual(errors, [], 'no CSP violation while the page runs')
  })

  // -------------------------------------------------------------------------------------------
  // The playground's form and raw JSON editor (README "The console": "fill the form built from
  // its JSON Schema (or the raw JSON editor beside it)")

  type FieldType = 'string' | 'integer' | 'number' | 'boolean'
  /** Property names: plain, JavaScript's own (`__proto__`, `constructor`, …), odd and hostile. */
  const propertyName = fc.oneof(
    fc.constantFrom('city', '__proto__', 'constructor', 'toString', 'hasOwnProperty', 'valueOf', 'a b', 'ü-名', '0', ''),
    fc.string({ unit: 'grapheme', minLength: 1, maxLength: 8 }),
    fc.constantFrom(...HOSTILE)
  )
  const formCaseArb = fc.uniqueArray(fc.tuple(propertyName, fc.constantFrom<FieldType>('string', 'integer', 'number', 'boolean')),
    { minLength: 1, maxLength: 4, selector: ([name]) => name }).chain((fields) => fc.record({
    fields: fc.constant(fields),
    values: fc.tuple(...fields.map(([, type]) => type === 'string'
      ? fc.string({ unit: 'grapheme', minLength: 1, maxLength: 12 })
      : type === 'integer'
        ? fc.integer({ min: -1000, max: 1000 }).map((n) => n || 0)
        : type === 'number' ? fc.double({ min: -1000, max: 1000, noNaN: true, noDefaultInfinity: true }).map((n) => Math.round(n * 100) / 100 || 0) : fc.boolean())),
    viaRaw: fc.boolean()
  }))

  test('property: the playground\'s form and raw JSON editor carry every argument to the call', async (t) => {
    const instance = await startInstance({ roles: ['Lanlan'] })
    t.after(() => instance.tp.close())
    let n = 0
    await fc.assert(fc.asyncProperty(formCaseArb, async ({ fields, values, viaRaw }) => {
      await runInSubtest(t, async (tt) => {
        const name = `form_${n++}`
        const properties = Object.fromEntries(fields.map(([field, type]) => [field, { type }]))
        await instance.tp.register({ name, callback_url: `${callbackUrl}/echo/${name}`, parameters: { type: 'object', properties } })
        // Own properties only (Object.fromEntries defines `__proto__` as a key like any other).
        const expected = Object.fromEntries(fields.map(([field], i) => [field, values[i]]))
        const { page, errors } = await openSettled(`${instance.url}/`, tt)
        await page.select('#pg-tool', name)
        await within(page.waitForFunction(`document.querySelectorAll('#pg-form [name]').length === ${fields.length}`, { timeout: GUARD_MS }), 'the form', GUARD_MS)
        const fill = JSON.stringify(fields.map(([field], i) => [field, values[i]]))
        if (viaRaw) {
          // The raw editor: typing JSON fills the form.
          await page.evaluate(`(() => {
            const raw = document.getElementById('pg-raw')
            raw.value = ${JSON.stringify(JSON.stringify(expected))}
            raw.dispatchEvent(new Event('input'))
          })()`)
          const shownInForm = await page.evaluate(`(() => {
            const inputs = [...document.querySelectorAll('#pg-form [name]')]
            return ${fill}.map(([field]) => {
              const input = inputs.find((el) => el.name === field)
              if (input === undefined) return 'missing'
              return input.type === 'checkbox' ? (input.indeterminate ? 'unset' : input.checked) : input.value
            })
          })()`)
          assert.deepEqual(shownInForm, fields.map(([, type], i) => type === 'boolean' ? values[i] : String(values[i])), 'the form shows the raw JSON')
        } else {
          // The form: each field set as a user would, and the raw editor follows.
          await page.evaluate(`(() => {
            const inputs = [...document.querySelectorAll('#pg-form [name]')]
            for (const [field, value] of ${fill}) {
              const input = inputs.find((el) => el.name === field)
              if (typeof value === 'boolean') {
                input.indeterminate = false
                input.checked = value
                input.dispatchEvent(new Event('change'))
              } else {
                input.value = String(value)
                input.dispatchEvent(new Event('input'))
              }
            }
          })()`)
        }
        const raw = JSON.parse(await page.evaluate('document.getElementById("pg-raw").value') as string)
        assert.deepEqual(raw, expected, 'the raw JSON editor holds every argument')
        await page.click('#pg-call')
        await within(page.waitForSelector('#pg-result:not([hidden])'), 'the playground result', GUARD_MS)
        const output = await page.evaluate('document.getElementById("pg-output").textContent') as string
        assert.deepEqual(JSON.parse(output), expected, 'the plugin received every argument')
        assert.deepEqual(errors, [])
      })
    }), {
      numRuns: runs(5),
      ...PROPERTY_OPTIONS,
      // Always tried: a property JavaScript objects treat specially, filled in the form.
      examples: [[{ fields: [['__proto__', 'string']], values: ['x'], viaRaw: false }]]
    })
  })

  test('the console\'s static routes serve its own files and the two vendor files, nothing beside them (README "The console")', async (t) => {
    const instance = await startInstance({ roles: ['Lanlan'] })
    t.after(() => instance.tp.close())
    /** Status and body of a GET sent as-is (no client-side normalisation of `..`). */
    type Raw = { status: number, body: string }
    const raw = async (path: string): Promise<Raw> => await new Promise((resolve, reject) => {
      const req = httpGet({ host: '127.0.0.1', port: instance.port, path, agent: false }, (res) => {
        let body = ''
        res.setEncoding('utf8')
        res.on('data', (chunk: string) => { body += chunk })
        res.on('end', () => { resolve({ status: res.statusCode ?? 0, body }) })
      })
      req.on('error', reject)
    })
    for (const path of ['/', '/ui/', '/ui/console.js', '/ui/playground.js', '/ui/console.css', '/ui/favicon.svg',
      '/ui/vendor/uplot/uPlot.esm.js', '/ui/vendor/uplot/uPlot.min.css', '/ui/vendor/eventsource-parser.js']) {
      assert.equal((await raw(path)).status, 200, path)
    }
    for (const path of ['/ui/../package.json', '/ui/..%2fpackage.json', '/ui/%2e%2e/package.json',
      '/ui/.%2e/src/main/index.ts',
      '/ui/vendor/uplot/../../../package.json', '/ui/vendor/uplot/..%2f..%2f..%2fpackage.json', '/ui/vendor/uplot/package.json',
      '/ui/vendor/uplot/uPlot.cjs.js', '/ui/vendor/uplot/%2e%2e/uplot/package.json', '/ui//etc/passwd', '/ui/%2fetc%2fpasswd',
      '/ui/vendor/eventsource-parser.js/../../package.json', '/ui/vendor/uplot//etc/passwd', '/ui/console.js%00']) {
      const { status, body } = await raw(path)
      assert.ok(status >= 400 && status < 500, `${path}: ${status}`)
      // 403 is the guard's (docs/protocol.md "Errors of the API itself"): a path to no file is none.
      assert.notEqual(status, 403, `${path}: ${body.slice(0, 200)}`)
      assert.ok(!body.includes('"dependencies"') && !body.includes('root:'), `${path} leaked a file: ${body.slice(0, 100)}`)
    }
  })

  // -------------------------------------------------------------------------------------------
  // The guard: another origin can neither read nor drive Toolport

  interface Seen { method: string, path: string, status: number, origin: string | undefined, site: string | undefined }

  /** Every request the Toolport's server answered, with its Origin and Sec-Fetch-Site. */
  function recordRequests (tp: Toolport): Seen[] {
    const seen: Seen[] = []
    tp.app.server.on('request', (req: IncomingMessage, res: ServerResponse) => {
      res.once('close', () => {
        seen.push({
          method: req.method ?? '',
          path: (req.url ?? '').split('?')[0] as string,
          status: res.statusCode,
          origin: req.headers.origin,
          site: req.headers['sec-fetch-site'] as string | undefined
        })
      })
    })
    return seen
  }

  const ATTACKS = ['read-tools', 'read-state', 'read-events', 'event-source', 'no-cors-register', 'no-cors-call',
    'json-call', 'form-call', 'form-register', 'no-cors-get', 'img-get'] as const
  type Attack = typeof ATTACKS[number]

  /** The hostile page's script: runs the attacks against `tp`, records what it could learn. */
  function hostilePage (tp: string, attacks: readonly Attack[]): string {
    const call = JSON.stringify({ role: 'Lanlan', name: 'target', arguments: {} })
    const reg = JSON.stringify({ name: 'planted', callback_url: 'http://127.0.0.1:9/x' })
    return `<!doctype html><html><body><script>
const TP = ${JSON.stringify(tp)}
const results = {}
async function attack (kind) {
  try {
    if (kind === 'read-tools') { const r = await fetch(TP + '/api/tools'); results[kind] = 'read ' + r.status + ' ' + (await r.text()).slice(0, 80) }
    else if (kind === 'read-state') { const r = await fetch(TP + '/api/console/state'); results[kind] = 'read ' + r.status + ' ' + (await r.text()).slice(0, 80) }
    else if (kind === 'read-events') { const r = await fetch(TP + '/api/events'); results[kind] = 'read ' + r.status }
    else if (kind === 'event-source') {
      results[kind] = await new Promise((resolve) => {
        const es = new EventSource(TP + '/api/events')
        es.onmessage = es.onopen = () => { es.close(); resolve('opened') }
        es.addEventListener('hello', () => { es.close(); resolve('hello') })
        es.onerror = () => { es.close(); resolve('refused') }
      })
    }
    else if (kind === 'no-cors-get') { await fetch(TP + '/api/tools', { mode: 'no-cors' }); results[kind] = 'opaque' }
    else if (kind === 'img-get') {
      results[kind] = await new Promise((resolve) => {
        const img = new Image()
        img.onload = img.onerror = () => resolve('loaded-or-not')
        img.src = TP + '/api/console/state'
      })
    }
    else if (kind === 'no-cors-register') { await fetch(TP + '/api/tools/register', { method: 'POST', mode: 'no-cors', headers: { 'content-type': 'text/plain' }, body: ${JSON.stringify(reg)} }); results[kind] = 'opaque' }
    else if (kind === 'no-cors-call') { await fetch(TP + '/api/tools/call', { method: 'POST', mode: 'no-cors', headers: { 'content-type': 'application/json' }, body: ${JSON.stringify(call)} }); results[kind] = 'opaque' }
    else if (kind === 'json-call') { const r = await fetch(TP + '/api/tools/call', { method: 'POST', headers: { 'content-type': 'application/json' }, body: ${JSON.stringify(call)} }); results[kind] = 'read ' + r.status }
    else if (kind === 'form-call' || kind === 'form-register') {
      results[kind] = await new Promise((resolve) => {
        const frame = document.createElement('iframe')
        frame.name = 'sink-' + kind
        document.body.append(frame)
        frame.onload = () => resolve('posted')
        const form = document.createElement('form')
        form.method = 'POST'
        form.enctype = 'text/plain'
        form.target = frame.name
        form.action = TP + (kind === 'form-call' ? '/api/tools/call' : '/api/tools/register')
        const body = kind === 'form-call' ? ${JSON.stringify(call)} : ${JSON.stringify(reg)}
        const input = document.createElement('input')
        input.name = body.slice(0, -1) + ',"pad":"'
        input.value = '"}'
        form.append(input)
        document.body.append(form)
        form.submit()
      })
    }
  } catch (err) { results[kind] = 'refused: ' + err.name }
}
window.attacksDone = (async () => { for (const kind of ${JSON.stringify(attacks)}) await attack(kind); return results })()
</script></body></html>`
  }

  /** Serves `html` at / on 127.0.0.1 (a page of another origin, no CSP); closed in `t.after`. */
  async function servePage (t: TestContext, html: () => string, port = 0): Promise<{ server: Server, port: number }> {
    const server = createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', connection: 'close' })
      res.end(html())
    })
    const real = await listenOn(server, port)
    t.after(() => closeServer(server).catch(() => {}))
    return { server, port: real }
  }

  const guardCaseArb = fc.record({
    pageHost: fc.constantFrom('127.0.0.1', 'localhost', 'attacker.example'),
    tpHost: fc.constantFrom('127.0.0.1', 'localhost'),
    token: fc.boolean(),
    attacks: fc.shuffledSubarray([...ATTACKS], { minLength: 1 })
  })

  test('property: a page of another origin can neither read the API and event stream nor drive Toolport', async (t) => {
    await fc.assert(fc.asyncProperty(guardCaseArb, async (c) => {
      await runInSubtest(t, async (tt) => {
        const token = c.token ? 'guard-property-token-that-is-long-enough-0123456789' : undefined
        const instance = await startInstance({ roles: ['Lanlan'], ...(token === undefined ? {} : { security: { token } }) })
        tt.after(() => instance.tp.close())
        await instance.tp.register({ name: 'target', callback_url: `${callbackUrl}/guard/target`, source: 'plugin:target' })
        const seen = recordRequests(instance.tp)
        const hitsBefore = callbackHits.get('/guard/target') ?? 0
        const tp = `http://${c.tpHost}:${instance.port}`
        const { port } = await servePage(tt, () => hostilePage(tp, c.attacks))
        const { page } = await open(`http://${c.pageHost}:${port}/`, tt)
        const results = await within(page.evaluate('window.attacksDone') as Promise<Json>, 'the hostile page\'s attempts', GUARD_MS)
        for (const [kind, result] of Object.entries(results)) {
          assert.ok(!String(result).startsWith('read') && result !== 'opened' && result !== 'hello',
            `${kind}: a page of another origin learned something: ${String(result)}`)
        }
        // What reached Toolport: each attempt's request, every one refused by the guard (SECURITY.md
        // "Inbound" check 3: a foreign Origin, or none with Sec-Fetch-Site same-site/cross-site).
        const fromPage = seen.filter((s) => !(s.method === 'GET' && s.path === '/api/tools' && s.origin === undefined && s.site === undefined))
        assert.ok(fromPage.length > 0, 'the attempts reached Toolport')
        for (const s of fromPage) {
          assert.equal(s.status, 403, `${s.method} ${s.path} (Origin ${String(s.origin)}, Sec-Fetch-Site ${String(s.site)}) answered ${s.status}`)
        }
        assert.equal(callbackHits.get('/guard/target') ?? 0, hitsBefore, 'the tool was never called')
        assert.deepEqual(instance.tp.list().tools_by_role.Lanlan?.map((r) => r.name), ['target'], 'nothing was registered')
        const stats = await instance.tp.app.inject({ method: 'GET', url: '/api/console/stats', headers: token === undefined ? {} : { authorization: `Bearer ${token}` } })
        assert.equal(JSON.parse(stats.body).events.subscribers, 0, 'no event stream is open')
      })
    }), { numRuns: runs(3), ...PROPERTY_OPTIONS })
  })

  test('a DNS-rebinding page (its own name, now on Toolport\'s port) is refused by the Host check (SECURITY.md check 2)', async (t) => {
    // The attacker's page loads from rebind.example:P; then the name's address "changes" to
    // Toolport's: here the page's server goes away and Toolport takes its port.
    const page0 = await servePage(t, () => `<!doctype html><html><body><script>
window.rebind = async () => {
  const out = {}
  for (const path of ['/api/tools', '/api/console/state', '/', '/ui/console.js']) {
    try { const r = await fetch(path, { cache: 'no-store' }); out[path] = r.status + ' ' + (await r.text()).slice(0, 200) } catch (e) { out[path] = 'error ' + e.name }
  }
  try { const r = await fetch('/api/tools/register', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ name: 'planted', callback_url: 'http://127.0.0.1:9/x' }) }); out.register = r.status + ' ' + (await r.text()).slice(0, 200) } catch (e) { out.register = 'error ' + e.name }
  return out
}
</script></body></html>`)
    const { page } = await open(`http://rebind.example:${page0.port}/`, t)
    await closeServer(page0.server)
    const instance = await startInstance({ roles: ['Lanlan'] }, page0.port)
    t.after(() => instance.tp.close())
    const out = await within(page.evaluate('window.rebind()') as Promise<Record<string, string>>, 'the rebinding page', GUARD_MS)
    for (const [path, result] of Object.entries(out)) {
      assert.match(result, /^403 .*TP_ERR_HOST_FORBIDDEN/, `${path}: ${result}`)
    }
    assert.deepEqual(instance.tp.list().tools_by_role.Lanlan, [], 'nothing was registered')
  })

  test('the console works under every name the Host check allows, and its playground posts pass the Origin check', async (t) => {
    const v4 = await startInstance({ roles: ['Lanlan'], security: { allowedHosts: ['allowed.example'] } })
    t.after(() => v4.tp.close())
    const v6 = await startInstance({ roles: ['Lanlan'] }, 0, '::1')
    t.after(() => v6.tp.close())
    for (const tp of [v4.tp, v6.tp]) await tp.register({ name: 'echo', callback_url: `${callbackUrl}/ok/echo`, source: 'plugin:echo' })
    for (const [instance, host] of [[v4, '127.0.0.1'], [v4, 'localhost'], [v4, 'allowed.example'], [v6, '[::1]']] as const) {
      const base = `http://${host}:${instance.port}`
      const { page, errors, requests } = await open(`${base}/`, t)
      await converge(page, () => instance.url, ['registry'], `the console at ${base}`)
      await within(page.waitForSelector('#pg-call:not([disabled])'), 'the playground', GUARD_MS)
      await page.click('#pg-call')
      await within(page.waitForSelector('#pg-result:not([hidden])'), 'the playground result', GUARD_MS)
      assert.equal(await page.evaluate('document.getElementById("pg-status").textContent'), 'ok', `the playground call at ${base}`)
      assert.deepEqual(errors, [], `no errors at ${base}`)
      assert.deepEqual(requests.filter((r) => !r.startsWith(`${base}/`) && !r.startsWith('data:')), [], `only own-origin requests at ${base}`)
      await page.close()
    }
  })

  // -------------------------------------------------------------------------------------------
  // Found by the properties (they fail until fixed)

  test('the plugins table shows an origin\'s consecutive connection failures once they happen (README "The console": health)', async (t) => {
    const instance = await startInstance({ roles: ['Lanlan'] })
    t.after(() => instance.tp.close())
    await instance.tp.register({ name: 'dead', callback_url: `${deadOrigin}/dead`, source: 'plugin:dead' })
    const { page } = await openSettled(`${instance.url}/`, t)
    await converge(page, () => instance.url, ['registry', 'health'], 'before the call')
    const reply = await httpJson(`${instance.url}/api/tools/call`, 'POST', { role: 'Lanlan', name: 'dead', arguments: {} })
    assert.equal(reply.body.is_error, true)
    // /api/console/state now says `failures: 1` for the origin; the page keeps saying "healthy".
    await converge(page, () => instance.url, ['health'], 'after one connection failure')
  })

  test('a registration still appears when the console\'s read of the state after its event fails once (README "The console": live)', async (t) => {
    const instance = await startInstance({ roles: ['Lanlan'] })
    t.after(() => instance.tp.close())
    const { page, errors } = await openSettled(`${instance.url}/`, t)
    // The page's next read of /api/console/state meets a dropped connection (as a read in flight
    // when the server closes its connections, or over its connection limit, would).
    let failed = 0
    await page.setRequestInterception(true)
    page.on('request', (request) => {
      if (request.isInterceptResolutionHandled()) return
      if (failed === 0 && request.url().endsWith('/api/console/state')) {
        failed++
        request.abort('connectionreset').catch(() => {})
      } else {
        request.continue().catch(() => {})
      }
    })
    await instance.tp.register({ name: 'fresh', callback_url: `${callbackUrl}/ok/fresh`, source: 'plugin:fresh' })
    await waitFor('the read after the event', () => failed > 0, GUARD_MS)
    // The stream stays up and says "live"; the registered tool never shows.
    await converge(page, () => instance.url, ['registry'], 'after the failed read')
    assert.deepEqual(errors.filter((e) => !e.includes('net::ERR')), [])
  })

  test('a playground form field named __proto__ reaches the raw JSON editor and the call (README "The console": playground)', async (t) => {
    const instance = await startInstance({ roles: ['Lanlan'] })
    t.after(() => instance.tp.close())
    // A JSON Schema may name a property `__proto__` (it is accepted at registration and listed).
    const properties = JSON.parse('{"__proto__": {"type": "string"}}')
    await instance.tp.register({ name: 'proto', callback_url: `${callbackUrl}/echo/proto`, parameters: { type: 'object', properties } })
    const { page } = await openSettled(`${instance.url}/`, t)
    await within(page.waitForFunction('document.querySelectorAll("#pg-form [name]").length === 1', { timeout: GUARD_MS }), 'the form', GUARD_MS)
    await page.evaluate(`(() => {
      const input = document.querySelector('#pg-form [name]')
      input.value = 'x'
      input.dispatchEvent(new Event('input'))
    })()`)
    // playground.js syncRawFromForm: `args[name] = value` on a plain object sets no key for `__proto__`.
    const raw = JSON.parse(await page.evaluate('document.getElementById("pg-raw").value') as string)
    assert.deepEqual(raw, JSON.parse('{"__proto__": "x"}'))
  })

  test('a call made while the console\'s event stream reconnects still appears in its recent calls (README "The console": calls)', async (t) => {
    const instance = await startInstance({ roles: ['Lanlan'] })
    t.after(() => instance.tp.close())
    await instance.tp.register({ name: 'echo', callback_url: `${callbackUrl}/ok/echo`, source: 'plugin:echo' })
    const { page } = await openSettled(`${instance.url}/`, t)
    await converge(page, () => instance.url, ['registry', 'calls'], 'before the drop')
    const subscribers = async (): Promise<number> => (await httpJson(`${instance.url}/api/console/stats`, 'GET')).body.events.subscribers
    // The stream drops (the server closes every connection); the call comes before the page is back.
    instance.tp.app.server.closeAllConnections()
    for (let i = 0; i < 200 && await subscribers() !== 0; i++) await new Promise((resolve) => setTimeout(resolve, 10))
    assert.equal(await subscribers(), 0, 'the stream is down')
    await httpJson(`${instance.url}/api/tools/call`, 'POST', { role: 'Lanlan', name: 'echo', arguments: {} })
    await converge(page, () => instance.url, ['registry', 'calls'], 'after the reconnect')
  })
})

/** Runs `fn` with a context whose `after` hooks run when it ends (pass or fail). */
async function runInSubtest (_t: TestContext, fn: (t: TestContext) => Promise<void>): Promise<void> {
  const cleanups: Array<() => unknown> = []
  const ctx = { after: (f: () => unknown) => { cleanups.push(f) } } as unknown as TestContext
  try {
    await fn(ctx)
  } finally {
    for (const f of cleanups.reverse()) await f()
  }
}
