// A differential security property of the two plugin SDKs' callback servers (README "Plugin SDK"
// → Privacy, README "Python plugin SDK"; docs/protocol.md R14) under hostile local callers, over
// raw sockets (net.connect) so every byte is chosen.
//
// One TypeScript plugin (src/plugin, in this process) and one Python plugin (python/, a real
// process: test/fixtures/pluginsec_plugin.py) register a tool `probe` with a real Toolport. Each
// handler records the argument `x` it ran with; every generated request carries its own marker
// in `x`, so which requests reached a handler is known exactly, also when a request hides inside
// another one's bytes.
//
// The documented rule (README "Privacy"): the server answers only `POST` with `Content-Type:
// application/json`, a loopback `Host` header and no `Origin` header, on paths that carry the
// 128-bit random segment. The model classifies each generated request as `ok` (must reach the
// handler: a Toolport call), `bad` (must never reach it) or `either` (the docs do not decide, e.g.
// a Host header in a spelling no browser sends) — and for every class both SDKs must agree: a
// difference in whether a hostile request reaches a handler is a bug. Refusals are 4xx answers
// that leak nothing (no secret segment, no tool list, no argument echo, no stack trace); after
// every request both servers still answer Toolport's own calls.
//
// The smuggling property sends a legitimate call followed (pipelined, or hidden in its body by
// Content-Length/Transfer-Encoding disagreements, two Content-Lengths, chunk extensions, obs-fold,
// bare LF, HTTP/1.0, Expect: 100-continue) by a hostile one: the hostile marker must never run.
// The same shapes go to Toolport's own API port: a hostile registration hidden behind a harmless
// request must never change the registry.
//
// The regression tests at the end pin what the properties found: one strict Host rule in both
// SDKs (`localhost`, dotted-decimal 127/8, a bracketed IPv6 loopback; an optional port 1-65535),
// duplicate Host and Content-Type headers refused (400), aiohttp's error pages and logs free of the
// request's bytes, and a call pipelined before a malformed request still answered.
//
// TP_PROPERTY_RUNS multiplies the runs.
import assert from 'node:assert/strict'
import { spawn, type ChildProcess } from 'node:child_process'
import { connect } from 'node:net'
import { test, type TestContext } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import fc from 'fast-check'
import { z } from 'zod'
import { createPlugin, type Plugin } from '../../src/plugin/index.js'
import { checkProperty as check, VENV_PYTHON as PY, pythonMissing, startToolport, waitFor, within, type StartedToolport } from '../helpers.js'

const FAILING_TIMEOUT_MS = 600_000
const RUNS = Math.max(1, Number(process.env.TP_PROPERTY_RUNS ?? 1))
const MAX_BODY = 4096
const PY_FIXTURE = fileURLToPath(new URL('../fixtures/pluginsec_plugin.py', import.meta.url))

// ---- The two plugins ---------------------------------------------------------------------------

interface Target {
  sdk: 'ts' | 'py'
  port: number
  /** `/<secret>/tools/` */
  prefix: string
  /** markers the handler ran with, in order */
  ran: string[]
}

interface World {
  /** the Python plugin's stderr so far */
  pyStderr: () => string
  toolport: StartedToolport
  ts: Target
  py: Target
}

async function startWorld (t: TestContext): Promise<World> {
  const toolport = await startToolport(t, { roles: ['A', 'B'] })
  const tsRan: string[] = []
  const plugin: Plugin = createPlugin({
    toolportUrl: toolport.url,
    source: 'plugin:pluginsec-ts',
    role: 'A',
    logger: false,
    maxBodyBytes: MAX_BODY,
    pollIntervalMs: 600_000,
    tools: {
      probe: {
        description: 'Records that it ran.',
        parameters: z.object({ x: z.string().default('') }),
        handler: ({ x }) => { tsRan.push(x); return { ok: true } }
      }
    }
  })
  plugin.on('error', () => {})
  t.after(() => plugin.stop({ graceMs: 0 }))
  await within(plugin.start(), 'the TS plugin starts', 15_000)

  const child: ChildProcess = spawn(PY, [PY_FIXTURE, toolport.url, String(MAX_BODY)], {
    stdio: ['pipe', 'pipe', 'pipe'],
    env: { ...process.env, PYTHONPATH: fileURLToPath(new URL('../../python/src', import.meta.url)) }
  })
  let stderr = ''
  child.stderr?.on('data', (d: Buffer) => { stderr += d.toString() })
  t.after(async () => {
    child.stdin?.end()
    const exited = new Promise((resolve) => child.once('exit', resolve))
    await Promise.race([exited, sleep(5000)])
    if (child.exitCode === null) child.kill('SIGKILL')
  })
  const pyRan: string[] = []
  let pyUrl = ''
  let buffered = ''
  child.stdout?.on('data', (d: Buffer) => {
    buffered += d.toString()
    let nl: number
    while ((nl = buffered.indexOf('\n')) >= 0) {
      const line = buffered.slice(0, nl)
      buffered = buffered.slice(nl + 1)
      const message = JSON.parse(line) as { url?: string, ran?: string }
      if (message.url !== undefined) pyUrl = message.url
      if (message.ran !== undefined) pyRan.push(message.ran)
    }
  })
  // A hang guard, generous for a loaded CI machine (Python starts, imports aiohttp, registers).
  await waitFor(`the Python plugin starts (stderr: ${stderr})`, () => pyUrl !== '', 120_000)
  const tsUrl = new URL(plugin.callbackUrl('probe'))
  const py = new URL(pyUrl)
  const world: World = {
    pyStderr: () => stderr,
    toolport,
    ts: { sdk: 'ts', port: Number(tsUrl.port), prefix: tsUrl.pathname.slice(0, -'probe'.length), ran: tsRan },
    py: { sdk: 'py', port: Number(py.port), prefix: py.pathname.slice(0, -'probe'.length), ran: pyRan }
  }
  // The baseline: a request shaped exactly as Toolport sends it reaches each handler over a raw
  // socket (so a refusal below is the rule's, not the test's framing).
  for (const target of [world.ts, world.py]) {
    const m = `baseline-${target.sdk}`
    const reply = await exchange(target.port, wellFormed(target, { marker: m }), 3000)
    assert.deepEqual(reply.statuses, [200], `${target.sdk}: the baseline call: ${reply.raw.slice(0, 300)}`)
    await waitFor(`${target.sdk}: the baseline call's handler run`, () => target.ran.includes(m), 30_000)
  }
  return world
}

/** Toolport's own call of `probe` (role A: the TS plugin, role B: the Python one) still works. */
async function assertToolportCallWorks (w: World, target: Target, m: string): Promise<void> {
  const result = await within(w.toolport.tp.callTool(target.sdk === 'ts' ? 'A' : 'B',
    { name: 'probe', call_id: `c-${m}`, arguments: { x: m } }), `${target.sdk}: Toolport's call`, 10_000)
  assert.equal(result.is_error, false, `${target.sdk}: Toolport's own call after the hostile requests: ${JSON.stringify(result)}`)
  await waitFor(`${target.sdk} records ${m}`, () => target.ran.includes(m), 30_000)
}

// ---- Raw HTTP ----------------------------------------------------------------------------------

interface Exchange { raw: string, statuses: number[], closed: boolean }

/**
 * Writes `chunks` (with `gapMs` between them: a slow sender) and reads until the server closes
 * the connection or nothing arrives for `idleMs` (a bound, not a verdict).
 */
async function exchange (port: number, data: Buffer | Buffer[], idleMs = 700, gapMs = 0): Promise<Exchange> {
  const chunks = Array.isArray(data) ? data : [data]
  const socket = connect({ host: '127.0.0.1', port })
  socket.on('error', () => {})
  const received: Buffer[] = []
  const state = { closed: false, last: Date.now() }
  socket.on('data', (d: Buffer) => { received.push(d); state.last = Date.now() })
  const ended = new Promise<void>((resolve) => socket.once('close', () => { state.closed = true; resolve() }))
  await new Promise<void>((resolve, reject) => { socket.once('connect', resolve); socket.once('error', reject) })
  for (const [i, chunk] of chunks.entries()) {
    if (socket.destroyed) break
    socket.write(chunk)
    if (gapMs > 0 && i < chunks.length - 1) await sleep(gapMs)
  }
  state.last = Date.now()
  // Quiet for idleMs after the answer began (or 3 × idleMs before any byte, for a loaded machine
  // that is slow to answer at all): the answer is complete, or the server waits for more.
  const quiet = (): number => received.length === 0 ? 3 * idleMs : idleMs
  while (!state.closed && Date.now() - state.last < quiet()) await Promise.race([ended, sleep(25)])
  socket.destroy()
  const raw = Buffer.concat(received).toString('latin1')
  const statuses = [...raw.matchAll(/HTTP\/1\.[01] (\d{3}) [A-Za-z]/g)].map((m) => Number(m[1])).filter((s) => s !== 100)
  return { raw, statuses, closed: state.closed }
}

function callBody (marker: string): string {
  return JSON.stringify({ call_id: `c-${marker}`, arguments: { x: marker } })
}

/** A request exactly as Toolport sends it (the model's `ok` baseline). */
function wellFormed (target: Target, opts: { marker: string, close?: boolean }): Buffer {
  const body = callBody(opts.marker)
  return Buffer.from(`POST ${target.prefix}probe HTTP/1.1\r\nHost: 127.0.0.1:${target.port}\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
    `${opts.close === false ? '' : 'Connection: close\r\n'}\r\n${body}`)
}

/**
 * A refusal leaks nothing: not the secret path segment (unless the request itself sent it: aiohttp's
 * parse-error pages quote the request line back to its sender), not the tool's name (a tool list),
 * not the argument (it is only in the body), and no stack trace.
 */
function assertNoLeak (reply: Exchange, sent: Buffer[], target: Target, marker: string, what: string): void {
  const secret = target.prefix.split('/')[1] as string
  const request = Buffer.concat(sent).toString('latin1')
  if (!request.includes(secret)) assert.ok(!reply.raw.includes(secret), `${what}: the answer holds the secret path segment`)
  if (!request.split('\r\n\r\n')[0]?.includes('probe')) assert.ok(!reply.raw.includes('probe'), `${what}: the answer names a tool`)
  assert.ok(!reply.raw.includes(marker), `${what}: the answer echoes the argument`)
  assert.ok(!/\n\s+at |Traceback|File "/.test(reply.raw), `${what}: the answer holds a stack trace`)
}

// ---- The request model -------------------------------------------------------------------------

type Verdict = 'ok' | 'bad' | 'either'

/** Host header values: what the docs say of each (README Privacy: "a loopback Host header"). */
const HOSTS: Array<[string, (port: number) => string[], Verdict]> = [
  ['ip:port', (p) => [`127.0.0.1:${p}`], 'ok'],
  ['ip', () => ['127.0.0.1'], 'ok'],
  ['localhost:port', (p) => [`localhost:${p}`], 'ok'],
  ['[::1]:port', (p) => [`[::1]:${p}`], 'ok'],
  ['127.0.0.2', () => ['127.0.0.2'], 'ok'],
  ['missing', () => [], 'bad'],
  ['empty', () => [''], 'bad'],
  ['evil.com', () => ['evil.com'], 'bad'],
  ['evil.com:port', (p) => [`evil.com:${p}`], 'bad'],
  ['127.0.0.1.evil.com', (p) => [`127.0.0.1.evil.com:${p}`], 'bad'],
  ['localhost.evil.com', () => ['localhost.evil.com'], 'bad'],
  ['127.0.0.1@evil.com', () => ['127.0.0.1@evil.com'], 'bad'],
  ['[::1].evil.com', () => ['[::1].evil.com'], 'bad'],
  ['0.0.0.0', () => ['0.0.0.0'], 'bad'],
  ['10.0.0.1', () => ['10.0.0.1'], 'bad'],
  ['[::]', () => ['[::]'], 'bad'],
  ['[fe80::1]', () => ['[fe80::1]'], 'bad'],
  ['foreign then loopback', (p) => ['evil.com', `127.0.0.1:${p}`], 'bad'],
  ['loopback then foreign', (p) => [`127.0.0.1:${p}`, 'evil.com'], 'bad'],
  // No browser sends these; the docs do not decide, but both SDKs must agree.
  ['localhost.', () => ['localhost.'], 'either'],
  ['LOCALHOST', (p) => [`LOCALHOST:${p}`], 'either'],
  ['userinfo@ip', (p) => [`evil.com@127.0.0.1:${p}`], 'either'],
  ['[::ffff:127.0.0.1]', () => ['[::ffff:127.0.0.1]'], 'either'],
  ['::1 unbracketed', () => ['::1'], 'either'],
  ['127.1', () => ['127.1'], 'either'],
  ['0x7f.0.0.1', () => ['0x7f.0.0.1'], 'either'],
  ['2130706433', () => ['2130706433'], 'either'],
  ['ip:bad-port', () => ['127.0.0.1:abc'], 'either'],
  ['ip:99999', () => ['127.0.0.1:99999'], 'either'],
  ['ip/path', () => ['127.0.0.1/evil'], 'either'],
  ['two loopbacks', (p) => [`127.0.0.1:${p}`, `localhost:${p}`], 'either']
]

const CONTENT_TYPES: Array<[string, string[], Verdict]> = [
  ['json', ['application/json'], 'ok'],
  ['json; charset=utf-8', ['application/json; charset=utf-8'], 'ok'],
  ['json;charset=utf-7', ['application/json;charset=utf-7'], 'ok'],
  ['APPLICATION/JSON', ['APPLICATION/JSON'], 'ok'],
  ['missing', [], 'bad'],
  ['text/plain', ['text/plain'], 'bad'],
  ['multipart', ['multipart/form-data; boundary=xyz'], 'bad'],
  ['urlencoded', ['application/x-www-form-urlencoded'], 'bad'],
  ['application/jsonx', ['application/jsonx'], 'bad'],
  ['text/plain; application/json', ['text/plain; application/json'], 'bad'],
  ['json-patch', ['application/json-patch+json'], 'bad'],
  ['json, text/plain', ['application/json, text/plain'], 'either'],
  ['text/plain, json', ['text/plain, application/json'], 'either'],
  ['two: text then json', ['text/plain', 'application/json'], 'either'],
  ['two: json then text', ['application/json', 'text/plain'], 'either']
]

const ORIGINS: Array<[string, string[], Verdict]> = [
  ['none', [], 'ok'],
  ['foreign', ['http://evil.com'], 'bad'],
  ['loopback', ['http://127.0.0.1:1234'], 'bad'],
  ['null', ['null'], 'bad'],
  ['empty', [''], 'bad'],
  ['two', ['http://evil.com', 'http://evil.com'], 'bad']
]

const METHODS: Array<[string, Verdict]> = [
  ['POST', 'ok'], ['GET', 'bad'], ['HEAD', 'bad'], ['PUT', 'bad'], ['DELETE', 'bad'], ['PATCH', 'bad'],
  ['OPTIONS', 'bad'], ['TRACE', 'bad'], ['CONNECT', 'bad'], ['post', 'bad'], ['PROPFIND', 'bad']
]

type PathKind = 'exact' | 'query' | 'encoded-name' | 'no-secret' | 'guessed' | 'truncated' | 'case' |
'encoded-secret' | 'double-slash' | 'dot-segment' | 'trailing-slash' | 'absolute-foreign' | 'absolute-loopback'

const PATHS: Array<[PathKind, Verdict]> = [
  ['exact', 'ok'], ['query', 'ok'], ['encoded-name', 'ok'],
  ['no-secret', 'bad'], ['guessed', 'bad'], ['truncated', 'bad'], ['case', 'bad'],
  ['encoded-secret', 'either'], ['double-slash', 'either'], ['dot-segment', 'either'], ['trailing-slash', 'either'],
  ['absolute-foreign', 'either'], ['absolute-loopback', 'either']
]

function pathOf (kind: PathKind, target: Target): string {
  const secret = target.prefix.split('/')[1] as string
  switch (kind) {
    case 'exact': return `${target.prefix}probe`
    case 'query': return `${target.prefix}probe?x=1`
    case 'encoded-name': return `${target.prefix}%70robe`
    case 'no-secret': return '/tools/probe'
    case 'guessed': return '/AAAAAAAAAAAAAAAAAAAAAA/tools/probe'
    case 'truncated': return `/${secret.slice(0, -1)}/tools/probe`
    case 'case': {
      const i = [...secret].findIndex((c) => c.toLowerCase() !== c.toUpperCase())
      const c = secret[i] as string
      const flipped = c === c.toLowerCase() ? c.toUpperCase() : c.toLowerCase()
      return `/${secret.slice(0, i)}${flipped}${secret.slice(i + 1)}/tools/probe`
    }
    case 'encoded-secret': return `/%${(secret.charCodeAt(0)).toString(16).toUpperCase()}${secret.slice(1)}/tools/probe`
    case 'double-slash': return `/${target.prefix}probe`
    case 'dot-segment': return `/x/..${target.prefix}probe`
    case 'trailing-slash': return `${target.prefix}probe/`
    case 'absolute-foreign': return `http://evil.com${target.prefix}probe`
    case 'absolute-loopback': return `http://127.0.0.1:${target.port}${target.prefix}probe`
  }
}

interface Hostile {
  method: number
  host: number
  contentType: number
  origin: number
  path: number
  secFetch: 'none' | 'cross-site' | 'same-origin'
  version: '1.1' | '1.0'
  expect: boolean
  bodyKind: 'json' | 'chunked' | 'oversized-declared' | 'oversized-chunked'
  slow: boolean
}

const hostileArb: fc.Arbitrary<Hostile> = fc.record({
  method: fc.oneof({ weight: 5, arbitrary: fc.constant(0) }, { weight: 1, arbitrary: fc.nat(METHODS.length - 1) }),
  host: fc.oneof({ weight: 2, arbitrary: fc.constant(0) }, { weight: 3, arbitrary: fc.nat(HOSTS.length - 1) }),
  contentType: fc.oneof({ weight: 3, arbitrary: fc.constant(0) },
    { weight: 2, arbitrary: fc.nat(CONTENT_TYPES.length - 1) }),
  origin: fc.oneof({ weight: 5, arbitrary: fc.constant(0) }, { weight: 1, arbitrary: fc.nat(ORIGINS.length - 1) }),
  path: fc.oneof({ weight: 4, arbitrary: fc.constant(0) }, { weight: 1, arbitrary: fc.nat(PATHS.length - 1) }),
  secFetch: fc.constantFrom('none' as const, 'cross-site' as const, 'same-origin' as const),
  version: fc.constantFrom('1.1' as const, '1.1' as const, '1.0' as const),
  expect: fc.boolean(),
  bodyKind: fc.constantFrom('json' as const, 'json' as const, 'json' as const, 'chunked' as const, 'oversized-declared' as const, 'oversized-chunked' as const),
  slow: fc.boolean()
})

/** The model: does the documented rule let this request reach the handler? */
function verdictOf (h: Hostile): Verdict {
  const verdicts: Verdict[] = [
    (METHODS[h.method] as [string, Verdict])[1],
    (HOSTS[h.host] as [string, unknown, Verdict])[2],
    (CONTENT_TYPES[h.contentType] as [string, string[], Verdict])[2],
    (ORIGINS[h.origin] as [string, string[], Verdict])[2],
    (PATHS[h.path] as [PathKind, Verdict])[1],
    // a body larger than maxBodyBytes is refused (413), never handed to the handler
    h.bodyKind.startsWith('oversized') ? 'bad' : 'ok'
  ]
  if (verdicts.includes('bad')) return 'bad'
  if (verdicts.includes('either')) return 'either'
  return 'ok'
}

function describe (h: Hostile): string {
  return JSON.stringify({
    method: (METHODS[h.method] as [string, Verdict])[0],
    host: (HOSTS[h.host] as [string, unknown, Verdict])[0],
    contentType: (CONTENT_TYPES[h.contentType] as [string, string[], Verdict])[0],
    origin: (ORIGINS[h.origin] as [string, string[], Verdict])[0],
    path: (PATHS[h.path] as [PathKind, Verdict])[0],
    secFetch: h.secFetch,
    version: h.version,
    expect: h.expect,
    bodyKind: h.bodyKind,
    slow: h.slow
  })
}

function render (h: Hostile, target: Target, marker: string): Buffer[] {
  const lines = [`${(METHODS[h.method] as [string, Verdict])[0]} ${pathOf((PATHS[h.path] as [PathKind, Verdict])[0], target)} HTTP/${h.version}`]
  for (const v of (HOSTS[h.host] as [string, (p: number) => string[], Verdict])[1](target.port)) lines.push(`Host: ${v}`)
  for (const v of (CONTENT_TYPES[h.contentType] as [string, string[], Verdict])[1]) lines.push(`Content-Type: ${v}`)
  for (const v of (ORIGINS[h.origin] as [string, string[], Verdict])[1]) lines.push(`Origin: ${v}`)
  if (h.secFetch !== 'none') lines.push(`Sec-Fetch-Site: ${h.secFetch}`, 'Sec-Fetch-Mode: cors')
  if (h.expect) lines.push('Expect: 100-continue')
  let body = Buffer.from(callBody(marker))
  if (h.bodyKind.startsWith('oversized')) {
    body = Buffer.from(JSON.stringify({ arguments: { x: marker }, pad: 'p'.repeat(MAX_BODY + 10) }))
  }
  if (h.bodyKind === 'chunked' || h.bodyKind === 'oversized-chunked') {
    lines.push('Transfer-Encoding: chunked')
    const half = Math.floor(body.length / 2)
    const chunked = Buffer.concat([
      Buffer.from(`${half.toString(16)}\r\n`), body.subarray(0, half), Buffer.from('\r\n'),
      Buffer.from(`${(body.length - half).toString(16)}\r\n`), body.subarray(half), Buffer.from('\r\n0\r\n\r\n')
    ])
    body = chunked
  } else {
    lines.push(`Content-Length: ${body.length}`)
  }
  lines.push('Connection: close')
  const head = Buffer.from(lines.join('\r\n') + '\r\n\r\n')
  if (!h.slow) return [Buffer.concat([head, body])]
  // A slow sender: the head in three pieces, then the body in two (bounded: 5 writes).
  const third = Math.ceil(head.length / 3)
  return [head.subarray(0, third), head.subarray(third, 2 * third), head.subarray(2 * third),
    body.subarray(0, 7), body.subarray(7)]
}

let markerCount = 0
function marker (prefix: string): string {
  return `${prefix}${process.pid.toString(36)}z${(markerCount++).toString(36)}q`
}

/** One request to one SDK: whether its marker reached the handler, and the answer. */
async function probe (target: Target, data: Buffer[], m: string, slow: boolean):
Promise<{ ran: boolean, reply: Exchange }> {
  const reply = await exchange(target.port, data, 700, slow ? 20 : 0)
  // The handler prints before the answer is written; for Python the line crosses a pipe.
  if (reply.statuses.includes(200)) {
    // A 200 means the handler ran; its line may be slow to cross the pipe on a loaded machine.
    await waitFor(`${target.sdk}: the handler's run for ${m}`, () => target.ran.includes(m), 20_000).catch(() => {})
  } else if (target.sdk === 'py') {
    await sleep(30)
  }
  return { ran: target.ran.includes(m), reply }
}

test('callback servers (property): a request reaches a tool handler only when the documented rule allows it, the same in both SDKs, and refusals leak nothing', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const w = await startWorld(t)
  await check(fc.asyncProperty(hostileArb, async (h) => {
    const verdict = verdictOf(h)
    const what = describe(h)
    const outcomes: Record<string, { ran: boolean, reply: Exchange }> = {}
    for (const target of [w.ts, w.py]) {
      const m = marker(target.sdk)
      const sent = render(h, target, m)
      const o = await within(probe(target, sent, m, h.slow), `${target.sdk} ${what}`, 15_000)
      outcomes[target.sdk] = o
      if (verdict === 'ok') {
        assert.ok(o.ran, `${target.sdk}: ${what}: a Toolport call did not reach the handler: ${o.reply.raw.slice(0, 300)}`)
        assert.deepEqual(o.reply.statuses, [200], `${target.sdk}: ${what}: ${o.reply.raw.slice(0, 300)}`)
      }
      if (verdict === 'bad') {
        assert.ok(!o.ran, `${target.sdk}: ${what}: a request the documented rule refuses reached the handler`)
        assert.ok(o.reply.statuses.every((s) => s >= 400 && s < 500), `${target.sdk}: ${what}: refused with ${JSON.stringify(o.reply.statuses)}: ${o.reply.raw.slice(0, 300)}`)
      }
      if (!o.ran) assertNoLeak(o.reply, sent, target, m, `${target.sdk}: ${what}`)
      assert.equal(target.ran.filter((r) => r === m).length, o.ran ? 1 : 0, `${target.sdk}: ${what}: the handler ran more than once`)
    }
    const ts = outcomes.ts as { ran: boolean, reply: Exchange }
    const py = outcomes.py as { ran: boolean, reply: Exchange }
    assert.equal(ts.ran, py.ran, `${what}: the TS handler ${ts.ran ? 'ran' : 'did not run'}, the Python one ${py.ran ? 'ran' : 'did not run'} ` +
      `(TS ${JSON.stringify(ts.reply.statuses)}, Python ${JSON.stringify(py.reply.statuses)})`)
  }), { numRuns: 35 * RUNS, endOnFailure: false, interruptAfterTimeLimit: 60_000 * RUNS })
  for (const target of [w.ts, w.py]) await assertToolportCallWorks(w, target, marker('after'))
})

/** Every value of every dimension, the others at Toolport's own call: all violations at once. */
function oneFactorSweep (): Hostile[] {
  const base: Hostile = { method: 0, host: 0, contentType: 0, origin: 0, path: 0, secFetch: 'none', version: '1.1', expect: false, bodyKind: 'json', slow: false }
  const all: Hostile[] = []
  for (let i = 0; i < METHODS.length; i++) all.push({ ...base, method: i })
  for (let i = 1; i < HOSTS.length; i++) all.push({ ...base, host: i })
  for (let i = 1; i < CONTENT_TYPES.length; i++) all.push({ ...base, contentType: i })
  for (let i = 1; i < ORIGINS.length; i++) all.push({ ...base, origin: i })
  for (let i = 1; i < PATHS.length; i++) all.push({ ...base, path: i })
  for (const secFetch of ['cross-site', 'same-origin'] as const) all.push({ ...base, secFetch })
  all.push({ ...base, version: '1.0' }, { ...base, expect: true }, { ...base, slow: true })
  for (const bodyKind of ['chunked', 'oversized-declared', 'oversized-chunked'] as const) all.push({ ...base, bodyKind })
  return all
}

test('callback servers (sweep): each hostile header, method, path and body shape alone gets the documented answer in both SDKs', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const w = await startWorld(t)
  const problems: string[] = []
  for (const h of oneFactorSweep()) {
    const verdict = verdictOf(h)
    const what = describe(h)
    const ran: Record<string, boolean> = {}
    const statuses: Record<string, number[]> = {}
    for (const target of [w.ts, w.py]) {
      const m = marker(target.sdk)
      const sent = render(h, target, m)
      const o = await within(probe(target, sent, m, h.slow), `${target.sdk} ${what}`, 15_000)
      ran[target.sdk] = o.ran
      statuses[target.sdk] = o.reply.statuses
      if (verdict === 'ok' && !o.ran) problems.push(`${target.sdk}: ${what}: a Toolport call did not reach the handler`)
      if (verdict === 'bad' && o.ran) problems.push(`${target.sdk}: ${what}: a refused request reached the handler`)
      if (!o.ran) {
        try { assertNoLeak(o.reply, sent, target, m, `${target.sdk}: ${what}`) } catch (err) { problems.push((err as Error).message) }
      }
    }
    if (ran.ts !== ran.py) {
      problems.push(`${what}: TS ${ran.ts === true ? 'ran' : 'refused'} ${JSON.stringify(statuses.ts)}, Python ${ran.py === true ? 'ran' : 'refused'} ${JSON.stringify(statuses.py)}`)
    }
  }
  for (const target of [w.ts, w.py]) await assertToolportCallWorks(w, target, marker('after'))
  assert.deepEqual(problems, [])
})

// ---- Smuggling shapes --------------------------------------------------------------------------

type Shape = 'pipelined' | 'hostile-first' | 'cl-te' | 'te-cl' | 'two-cl' | 'chunk-ext' | 'te-obfuscated' |
'http10-keepalive' | 'expect-continue' | 'fold-origin' | 'bare-lf-origin' | 'bare-lf-request' | 'oversized-header' | 'fold-host'

const SHAPES: Shape[] = ['pipelined', 'hostile-first', 'cl-te', 'te-cl', 'two-cl', 'chunk-ext', 'te-obfuscated',
  'http10-keepalive', 'expect-continue', 'fold-origin', 'bare-lf-origin', 'bare-lf-request', 'oversized-header', 'fold-host']

interface Smuggle {
  /** the bytes, one write */
  data: Buffer
  /** markers that must never reach a handler (a hidden hostile request) */
  never: string[]
  /** markers the docs do not decide on (the two SDKs must agree) */
  either: string[]
}

/**
 * A legitimate first request `head`+`body` (minus its final CRLFs and body) and a hostile second
 * one `hostile`, combined as `shape` says. `legit(extraHeaders, body, close)` renders the first.
 */
function smuggle (shape: Shape, legit: (extra: string[], body: string, close: boolean, eol?: string) => Buffer,
  legitBody: string, hostile: Buffer, l: string, h: string): Smuggle {
  const chunked = (body: string, ext = ''): string => `${Buffer.byteLength(body).toString(16)}${ext}\r\n${body}\r\n0${ext}\r\n\r\n`
  switch (shape) {
    case 'pipelined':
      return { data: Buffer.concat([legit([], legitBody, false), hostile]), never: [h], either: [l] }
    case 'hostile-first':
      return { data: Buffer.concat([hostile, legit([], legitBody, true)]), never: [h], either: [l] }
    case 'cl-te': {
      const inner = chunked(legitBody)
      const body = Buffer.concat([Buffer.from(inner), hostile])
      return { data: Buffer.concat([legit([`Content-Length: ${body.length}`, 'Transfer-Encoding: chunked'], '', false), body]), never: [h], either: [l] }
    }
    case 'te-cl': {
      const inner = chunked(legitBody)
      return { data: Buffer.concat([legit(['Transfer-Encoding: chunked', `Content-Length: ${Buffer.byteLength(legitBody)}`], '', false), Buffer.from(inner), hostile]), never: [h], either: [l] }
    }
    case 'two-cl': {
      const body = Buffer.concat([Buffer.from(legitBody), hostile])
      return { data: Buffer.concat([legit([`Content-Length: ${Buffer.byteLength(legitBody)}`, `Content-Length: ${body.length}`], '', false), body]), never: [h], either: [l] }
    }
    case 'chunk-ext':
      return { data: Buffer.concat([legit(['Transfer-Encoding: chunked'], '', false), Buffer.from(chunked(legitBody, ';ext="a\\"b";x=1')), hostile]), never: [h], either: [l] }
    case 'te-obfuscated': {
      const inner = chunked(legitBody)
      const body = Buffer.concat([Buffer.from(inner), hostile])
      return { data: Buffer.concat([legit(['Transfer-Encoding: chunked, identity', `Content-Length: ${body.length}`], '', false), body]), never: [h], either: [l] }
    }
    case 'http10-keepalive': {
      const first = legit(['Connection: keep-alive', `Content-Length: ${Buffer.byteLength(legitBody)}`], legitBody, false).toString('latin1').replace(' HTTP/1.1\r\n', ' HTTP/1.0\r\n')
      return { data: Buffer.concat([Buffer.from(first, 'latin1'), hostile]), never: [h], either: [l] }
    }
    case 'expect-continue':
      return { data: Buffer.concat([legit(['Expect: 100-continue', `Content-Length: ${Buffer.byteLength(legitBody)}`], legitBody, false), hostile]), never: [h], either: [l] }
    case 'fold-origin':
      return { data: Buffer.concat([legit(['X-Pad: 1', ' Origin: http://evil.com', `Content-Length: ${Buffer.byteLength(legitBody)}`], legitBody, true)]), never: [], either: [l] }
    case 'fold-host':
      return { data: Buffer.concat([legit(['X-Pad: 1', ' Host: evil.com', `Content-Length: ${Buffer.byteLength(legitBody)}`], legitBody, true)]), never: [], either: [l] }
    case 'bare-lf-origin':
      return { data: Buffer.concat([legit(['X-Pad: 1\nOrigin: http://evil.com', `Content-Length: ${Buffer.byteLength(legitBody)}`], legitBody, true)]), never: [], either: [l] }
    case 'bare-lf-request':
      return { data: Buffer.concat([legit([`Content-Length: ${Buffer.byteLength(legitBody)}`], legitBody, false, '\n'), hostile]), never: [h], either: [l] }
    case 'oversized-header':
      return { data: Buffer.concat([legit([`X-Big: ${'b'.repeat(70_000)}`, `Content-Length: ${Buffer.byteLength(legitBody)}`], legitBody, false), hostile]), never: [h], either: [l] }
  }
}

/** Toolport's call to the plugin `target` (Host, Content-Type as Toolport sends them), minus the body framing. */
function pluginLegit (target: Target) {
  return (extra: string[], body: string, close: boolean, eol = '\r\n'): Buffer => {
    const framing = extra.some((e) => /^(content-length|transfer-encoding):/i.test(e)) ? [] : [`Content-Length: ${Buffer.byteLength(body)}`]
    const lines = [`POST ${target.prefix}probe HTTP/1.1`, `Host: 127.0.0.1:${target.port}`, 'Content-Type: application/json',
      ...extra, ...framing, ...(close ? ['Connection: close'] : [])]
    return Buffer.from(lines.join(eol) + eol + eol + body)
  }
}

const badHostileArb = hostileArb.filter((h) => verdictOf(h) === 'bad').map((h) => ({ ...h, slow: false }))

test('callback servers (smuggling property): a hostile request hidden behind or inside a Toolport call never reaches a handler, the same in both SDKs', {
  skip: pythonMissing, timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const w = await startWorld(t)
  await check(fc.asyncProperty(fc.constantFrom(...SHAPES), badHostileArb, async (shape, hostile) => {
    const what = `${shape} + ${describe(hostile)}`
    const ran: Record<string, boolean[]> = {}
    for (const target of [w.ts, w.py]) {
      const l = marker(`${target.sdk}l`)
      const h = marker(`${target.sdk}h`)
      const s = smuggle(shape, pluginLegit(target), callBody(l), Buffer.concat(render(hostile, target, h)), l, h)
      const reply = await within(exchange(target.port, s.data, 700), `${target.sdk} ${what}`, 15_000)
      if (reply.statuses.includes(200)) await waitFor(`${target.sdk}: a handler run`, () => target.ran.includes(l) || target.ran.includes(h), 20_000).catch(() => {})
      if (target.sdk === 'py') await sleep(30)
      for (const m of s.never) assert.ok(!target.ran.includes(m), `${target.sdk}: ${what}: the hidden hostile request reached the handler`)
      ran[target.sdk] = s.either.map((m) => target.ran.includes(m))
      assert.ok(!/\n\s+at |Traceback|File "/.test(reply.raw), `${target.sdk}: ${what}: a stack trace`)
      assert.ok(!reply.raw.includes(l) && !reply.raw.includes(h), `${target.sdk}: ${what}: the answer echoes an argument`)
    }
    assert.deepEqual(ran.ts, ran.py, `${what}: the legitimate part reached the TS handler: ${JSON.stringify(ran.ts)}, the Python one: ${JSON.stringify(ran.py)}`)
  }), { numRuns: 30 * RUNS, endOnFailure: false, interruptAfterTimeLimit: 60_000 * RUNS })
  for (const target of [w.ts, w.py]) await assertToolportCallWorks(w, target, marker('after'))
})

test('Toolport API (smuggling property): a hostile registration pipelined or hidden behind a harmless request never changes the registry', {
  timeout: FAILING_TIMEOUT_MS
}, async (t) => {
  const toolport = await startToolport(t, { roles: ['A'] })
  let n = 0
  const HOSTILE_API: Array<[string, string[]]> = [
    ['foreign Host', ['Host: evil.com']],
    ['rebinding Host', ['Host: 127.0.0.1.evil.com']],
    ['foreign Origin', [`Host: 127.0.0.1:${toolport.port}`, 'Origin: http://evil.com']],
    ['null Origin', [`Host: 127.0.0.1:${toolport.port}`, 'Origin: null']],
    ['cross-site fetch', [`Host: 127.0.0.1:${toolport.port}`, 'Sec-Fetch-Site: cross-site']],
    ['text/plain', [`Host: 127.0.0.1:${toolport.port}`, 'X-Type: text']],
    ['no Host', []]
  ]
  const apiHostile = (kind: number, name: string): Buffer => {
    const [label, headers] = HOSTILE_API[kind] as [string, string[]]
    const body = JSON.stringify({ name, source: 'plugin:smuggler', callback_url: 'http://127.0.0.1:9/tools/x' })
    const type = label === 'text/plain' ? 'text/plain' : 'application/json'
    return Buffer.from(['POST /api/tools/register HTTP/1.1', ...headers, `Content-Type: ${type}`,
      `Content-Length: ${Buffer.byteLength(body)}`, 'Connection: close'].join('\r\n') + '\r\n\r\n' + body)
  }
  const apiLegit = (extra: string[], body: string, close: boolean, eol = '\r\n'): Buffer => {
    const framing = extra.some((e) => /^(content-length|transfer-encoding):/i.test(e)) ? [] : [`Content-Length: ${Buffer.byteLength(body)}`]
    // A harmless POST (an unregister of a name nobody has) so that every body shape applies.
    const lines = ['POST /api/tools/unregister HTTP/1.1', `Host: 127.0.0.1:${toolport.port}`, 'Content-Type: application/json',
      ...extra, ...framing, ...(close ? ['Connection: close'] : [])]
    return Buffer.from(lines.join(eol) + eol + eol + body)
  }
  // The check can fail: a legitimate registration pipelined the same way does register.
  {
    const name = `control${n++}`
    const body = JSON.stringify({ name, source: 'plugin:smuggler', callback_url: 'http://127.0.0.1:9/tools/x' })
    const second = Buffer.from(['POST /api/tools/register HTTP/1.1', `Host: 127.0.0.1:${toolport.port}`, 'Content-Type: application/json',
      `Content-Length: ${Buffer.byteLength(body)}`, 'Connection: close'].join('\r\n') + '\r\n\r\n' + body)
    const s = smuggle('pipelined', apiLegit, JSON.stringify({ name: 'nobody' }), second, '', '')
    const reply = await exchange(toolport.port, s.data, 700)
    assert.ok(JSON.stringify(toolport.tp.list()).includes(`"${name}"`), `the control registration: ${reply.raw.slice(0, 500)}`)
  }
  await check(fc.asyncProperty(fc.constantFrom(...SHAPES), fc.nat(HOSTILE_API.length - 1), async (shape, kind) => {
    const name = `smug${n++}`
    const what = `${shape} + ${(HOSTILE_API[kind] as [string, string[]])[0]}`
    const s = smuggle(shape, apiLegit, JSON.stringify({ name: 'nobody' }), apiHostile(kind, name), '', '')
    const reply = await within(exchange(toolport.port, s.data, 700), what, 15_000)
    assert.ok(!JSON.stringify(toolport.tp.list()).includes(`"${name}"`), `${what}: the hidden hostile registration changed the registry: ${reply.raw.slice(0, 500)}`)
    assert.ok(!/\n\s+at /.test(reply.raw), `${what}: a stack trace`)
  }), { numRuns: 40 * RUNS, endOnFailure: false, interruptAfterTimeLimit: 60_000 * RUNS })
  // Toolport still answers
  const after = await exchange(toolport.port, Buffer.from(`GET /api/tools HTTP/1.1\r\nHost: 127.0.0.1:${toolport.port}\r\nConnection: close\r\n\r\n`), 2000)
  assert.deepEqual(after.statuses, [200])
})

// ---- Regressions: bugs the properties found (each failed before its fix) ----------------------------

/** Toolport's call to `target`, with `hosts` as its Host header lines and `types` as its Content-Type lines. */
function callWith (target: Target, m: string, hosts: string[], types = ['application/json']): Buffer {
  const body = callBody(m)
  return Buffer.from([`POST ${target.prefix}probe HTTP/1.1`, ...hosts.map((h) => `Host: ${h}`), ...types.map((c) => `Content-Type: ${c}`),
    `Content-Length: ${Buffer.byteLength(body)}`, 'Connection: close'].join('\r\n') + '\r\n\r\n' + body)
}

async function ranFor (target: Target, data: Buffer, m: string): Promise<{ ran: boolean, statuses: number[] }> {
  const o = await probe(target, [data], m, false)
  return { ran: o.ran, statuses: o.reply.statuses }
}

test('callback servers (regressions)', { skip: pythonMissing, timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const w = await startWorld(t)

  await t.test('Python SDK: a Host header that is not a loopback name but holds a bracketed ::1 ("[::1].evil.com", "evil.com[::1]") is refused, as in the TS SDK (README "Python plugin SDK", Privacy: the same defences as the TypeScript SDK, a loopback Host header)', async () => {
    for (const host of ['[::1].evil.com', 'evil.com[::1]', '[::1]evil.com:80']) {
      for (const target of [w.ts, w.py]) {
        const m = marker(target.sdk)
        const o = await ranFor(target, callWith(target, m, [host]), m)
        assert.equal(o.ran, false, `${target.sdk}: Host ${host} reached the handler (${JSON.stringify(o.statuses)})`)
      }
    }
  })

  await t.test('TS SDK: a request with two Host headers (loopback, then foreign) is refused, as in the Python SDK (README "Privacy"; RFC 9112 §3.2: 400 for more than one Host)', async () => {
    for (const target of [w.ts, w.py]) {
      const m = marker(target.sdk)
      const o = await ranFor(target, callWith(target, m, [`127.0.0.1:${target.port}`, 'evil.com']), m)
      assert.equal(o.ran, false, `${target.sdk}: two Host headers reached the handler (${JSON.stringify(o.statuses)})`)
    }
  })

  await t.test('TS SDK: a request with two Content-Type headers (application/json, then text/plain) is refused, as in the Python SDK (README "Privacy": only Content-Type: application/json)', async () => {
    for (const target of [w.ts, w.py]) {
      const m = marker(target.sdk)
      const o = await ranFor(target, callWith(target, m, [`127.0.0.1:${target.port}`], ['application/json', 'text/plain']), m)
      assert.equal(o.ran, false, `${target.sdk}: two Content-Types reached the handler (${JSON.stringify(o.statuses)})`)
    }
  })

  await t.test('both SDKs read the same Host spellings the same way (README "Python plugin SDK": does the same as the TS SDK): an invalid port or a legacy IPv4 form is accepted by one and refused by the other', async () => {
    const differ: string[] = []
    for (const host of ['127.0.0.1:abc', '127.0.0.1:99999', '127.1', '0x7f.0.0.1', '2130706433']) {
      const ran: boolean[] = []
      for (const target of [w.ts, w.py]) {
        const m = marker(target.sdk)
        ran.push((await ranFor(target, callWith(target, m, [host]), m)).ran)
      }
      if (ran[0] !== ran[1]) differ.push(`${host}: TS ${ran[0] === true ? 'ran' : 'refused'}, Python ${ran[1] === true ? 'ran' : 'refused'}`)
    }
    assert.deepEqual(differ, [])
  })

  await t.test('Python SDK: the 400 for a malformed request pipelined after a call does not quote the call\'s arguments (as in the TS SDK; README "Privacy")', async () => {
    for (const target of [w.ts, w.py]) {
      const m = marker(`${target.sdk}kept`)
      const body = callBody(m)
      const call = Buffer.from([`POST ${target.prefix}probe HTTP/1.1`, `Host: 127.0.0.1:${target.port}`, 'Content-Type: application/json',
        `Content-Length: ${Buffer.byteLength(body)}`].join('\r\n') + '\r\n\r\n' + body)
      const malformed = Buffer.from(`post /x HTTP/1.1\r\nHost: 127.0.0.1:${target.port}\r\nConnection: close\r\n\r\n`)
      const reply = await exchange(target.port, Buffer.concat([call, malformed]), 700)
      // (Both SDKs then answer only the 400 and close: Node after running the handler, aiohttp
      // without running it. Toolport never pipelines, so that is not asserted here.)
      assert.ok(!reply.raw.includes(m), `${target.sdk}: the answer quotes the call's arguments: ${reply.raw.slice(0, 400)}`)
      assert.ok(reply.statuses.includes(400), `${target.sdk}: ${reply.raw.slice(0, 400)}`)
    }
  })

  await t.test('Python SDK: a call pipelined before a request without a Host header reaches its handler and is answered 200 before that request\'s 400, as in the TS SDK (RFC 9112 §9.3.2: responses in request order; README "Python plugin SDK": does the same as the TS SDK)', async () => {
    const problems: string[] = []
    for (const target of [w.ts, w.py]) {
      const m = marker(`${target.sdk}first`)
      const body = callBody(m)
      const call = Buffer.from([`POST ${target.prefix}probe HTTP/1.1`, `Host: 127.0.0.1:${target.port}`, 'Content-Type: application/json',
        `Content-Length: ${Buffer.byteLength(body)}`].join('\r\n') + '\r\n\r\n' + body)
      const hostless = Buffer.from(`POST ${target.prefix}probe HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`)
      const reply = await exchange(target.port, Buffer.concat([call, hostless]), 700)
      await waitFor(`${target.sdk}: the call's handler run`, () => target.ran.includes(m), 20_000).catch(() => {})
      if (!target.ran.includes(m)) problems.push(`${target.sdk}: the first call never reached its handler`)
      if (reply.statuses[0] !== 200) problems.push(`${target.sdk}: answered ${JSON.stringify(reply.statuses)}`)
    }
    assert.deepEqual(problems, [])
  })

  await t.test('Python SDK: an oversized call followed by more bytes on its connection gets its 413, and its arguments are neither echoed in the answer nor logged (README "Python plugin SDK", Privacy: arguments and outputs are never logged)', async () => {
    const m = marker('pysecret')
    const body = JSON.stringify({ arguments: { x: m }, pad: 'p'.repeat(MAX_BODY + 10) })
    const oversized = Buffer.from([`POST ${w.py.prefix}probe HTTP/1.1`, `Host: 127.0.0.1:${w.py.port}`, 'Content-Type: application/json',
      `Content-Length: ${Buffer.byteLength(body)}`, 'Connection: close'].join('\r\n') + '\r\n\r\n' + body)
    const next = callWith(w.py, marker('pynext'), [`127.0.0.1:${w.py.port}`])
    const before = w.pyStderr().length
    const reply = await exchange(w.py.port, Buffer.concat([oversized, next]), 700)
    await sleep(200)
    assert.ok(!w.pyStderr().slice(before).includes(m), `the plugin logged the call's arguments: ${w.pyStderr().slice(before, before + 300)}`)
    assert.ok(!reply.raw.includes(m), `the answer echoes the call's arguments: ${reply.raw.slice(0, 200)}`)
    assert.deepEqual(reply.statuses, [413], reply.raw.slice(0, 200))
  })
})
