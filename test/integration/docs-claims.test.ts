// The documents as a contract: README.md, docs/protocol.md, docs/architecture.md, SECURITY.md,
// python/README.md, CHANGELOG.md, `toolport --help`, the JSDoc of the public entries and
// /openapi.json, each concrete claim checked against the real components.
//
// How: the documents are read at test time and their examples are RUN, not copied: the README's
// curl walk-through is tokenised like a shell would and sent with fetch to a real `toolport serve`
// child process (its expected `# {…}` answers compared with the real ones), the JSON examples of
// "Tool results" and "Errors and images" are produced by a real callback server through
// `POST /api/tools/call`, the SSE example is read off a real `/api/events` stream, the option
// tables of both plugin SDKs are parsed and compared with the real defaults (`resolvePluginOptions`,
// and `inspect.signature` in python/.venv), the export, event, error-code and plugin-error tables
// are compared with the real modules, and every relative link and file path in the markdown must
// resolve. Documented ranges are probed at their edges with fast-check (registration fields, role
// names, port, plugin keys, both SDKs' options) against the real validators.
//
// Test names cite the document and section. The tests at the end (`regression: …`) are the
// disagreements this file found where the code is the side to fix, each shrunk to one case; they
// FAIL until it is fixed. Where the document is the side to fix, the test asserts the code's
// behaviour and passes (README "Python plugin SDK" → Images: WebP and GIF pass too; README
// "Events": a local tool fires `tool-registered`, isRemote false); the report gives the doc text.
// TP_PROPERTY_RUNS=N multiplies the runs of each property. ~10 s on a 2-core machine.
import assert from 'node:assert/strict'
import { spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, readFileSync } from 'node:fs'
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import { connect } from 'node:net'
import type { AddressInfo } from 'node:net'
import { dirname, join } from 'node:path'
import { createInterface } from 'node:readline'
import { PassThrough } from 'node:stream'
import { after, before, describe, test, type TestContext } from 'node:test'
import { fileURLToPath } from 'node:url'
import { isDeepStrictEqual } from 'node:util'
import fastify from 'fastify'
import fc from 'fast-check'
import { request } from 'undici'
import * as libraryEntry from '../../src/main/index.js'
import {
  createRealtimeSession, createToolport, toolDefinitions, toolportPlugin, toolResultBlock, type Toolport
} from '../../src/main/index.js'
import { main } from '../../src/main/cli.js'
import { parseOptions } from '../../src/main/config.js'
import { ENVIRONMENT } from '../../src/main/environment.js'
import * as pluginEntry from '../../src/plugin/index.js'
import { createPlugin, PLUGIN_ERROR_CODES, PluginError } from '../../src/plugin/index.js'
import { resolvePluginOptions } from '../../src/plugin/options.js'
import { checkProperty as check, pythonMissing, toolportCliArgs, VENV_PYTHON as PY, within } from '../helpers.js'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const PY_SRC = join(ROOT, 'python/src')
const doc = (path: string): string => readFileSync(join(ROOT, path), 'utf8')
const README = doc('README.md')
const PROTOCOL = doc('docs/protocol.md')
const SECURITY = doc('SECURITY.md')
const PY_README = doc('python/README.md')
const FAILING_TIMEOUT_MS = 300_000
const GUARD_MS = 20_000
type Json = any

function runs (n: number): number {
  return Math.max(1, Math.round(n * Number(process.env.TP_PROPERTY_RUNS ?? 1)))
}

// ---- Reading the documents -----------------------------------------------------------------------

/** The text of a markdown section: from its heading to the next heading of the same or a higher level. */
function section (text: string, heading: string): string {
  const lines = text.split('\n')
  const start = lines.findIndex((line) => /^#{1,6} /.test(line) && line.replace(/^#+ /, '') === heading)
  assert.ok(start >= 0, `the document has a section "${heading}"`)
  const level = (/^#+/.exec(lines[start] as string) as RegExpExecArray)[0].length
  let end = start + 1
  let inCode = false
  for (; end < lines.length; end++) {
    const line = lines[end] as string
    if (line.startsWith('```')) inCode = !inCode
    if (!inCode && /^#{1,6} /.test(line) && (/^#+/.exec(line) as RegExpExecArray)[0].length <= level) break
  }
  return lines.slice(start, end).join('\n')
}

/** The fenced code blocks of `text`, with their info string. */
function codeBlocks (text: string): Array<{ lang: string, body: string }> {
  // Also a block indented under a list item: its lines lose that indentation.
  return [...text.matchAll(/^( *)```(\S*)\n([\s\S]*?)^ *```$/gm)].map((m) => ({
    lang: m[2] as string,
    body: (m[3] as string).split('\n').map((line) => line.slice((m[1] as string).length)).join('\n')
  }))
}

/** The rows of the first markdown table after `marker` in `text`, as cells (backticks kept). */
function tableAfter (text: string, marker: string): string[][] {
  const at = text.indexOf(marker)
  assert.ok(at >= 0, `the document has "${marker}"`)
  const rows: string[][] = []
  let seen = false
  for (const line of text.slice(at).split('\n')) {
    if (line.startsWith('|')) {
      seen = true
      if (/^\|[-| ]+\|$/.test(line)) continue
      rows.push(line.slice(1, -1).split(/(?<!\\)\|/).map((cell) => cell.trim()))
    } else if (seen) break
  }
  return rows.slice(1)
}

/** The backticked names in a cell: "`a(x)`, `b`" → ['a', 'b']. */
function names (cell: string): string[] {
  return [...cell.matchAll(/`([^`]+)`/g)].map((m) => (m[1] as string).replace(/\(.*$/, '').trim())
}

type ShellItem = { kind: 'cmd', words: string[] } | { kind: 'comment', text: string }

/**
 * A shell block as a shell reads it: single quotes literal (across lines), double quotes with their
 * escapes, `\`-newline continuations, `#` comments, and `&&`, `&`, `;` or a newline ending a command.
 */
function shellItems (block: string): ShellItem[] {
  const items: ShellItem[] = []
  let words: string[] = []
  let word: string | null = null
  const endWord = (): void => { if (word !== null) words.push(word); word = null }
  const endCmd = (): void => {
    endWord()
    if (words.length > 0) items.push({ kind: 'cmd', words })
    words = []
  }
  for (let i = 0; i < block.length;) {
    const c = block[i] as string
    if (c === "'") {
      const end = block.indexOf("'", i + 1)
      word = (word ?? '') + block.slice(i + 1, end)
      i = end + 1
    } else if (c === '"') {
      let j = i + 1
      let text = ''
      while (block[j] !== '"') {
        if (block[j] === '\\' && '"\\$`'.includes(block[j + 1] as string)) {
          text += block[j + 1] as string
          j += 2
        } else text += block[j++] as string
      }
      word = (word ?? '') + text
      i = j + 1
    } else if (c === '\\' && block[i + 1] === '\n') {
      i += 2
    } else if (c === '#' && word === null) {
      endCmd()
      const end = block.indexOf('\n', i)
      items.push({ kind: 'comment', text: block.slice(i + 1, end < 0 ? undefined : end) })
      i = end < 0 ? block.length : end
    } else if (c === '\n' || c === ';' || c === '&') {
      endCmd()
      i++
    } else if (c === ' ' || c === '\t') {
      endWord()
      i++
    } else {
      word = (word ?? '') + c
      i++
    }
  }
  endCmd()
  return items
}

interface CurlRequest { method: string, url: string, headers: Record<string, string>, body?: string }

/** A `curl` command line as the request it sends. */
function curlRequest (words: string[]): CurlRequest {
  const request: CurlRequest = { method: 'GET', url: '', headers: {} }
  for (let i = 1; i < words.length; i++) {
    const word = words[i] as string
    if (word === '-s' || word === '-N') continue
    if (word === '-H') {
      const [name, ...value] = (words[++i] as string).split(':')
      request.headers[(name as string).toLowerCase()] = value.join(':').trim()
    } else if (word === '-d') {
      request.body = words[++i] as string
      request.method = 'POST'
    } else if (word === '-X') {
      request.method = words[++i] as string
    } else request.url = word
  }
  return request
}

/** `actual` matches `expected`, where an expected string ending in `…` is a prefix. */
function matches (actual: unknown, expected: unknown): boolean {
  if (typeof expected === 'string' && expected.endsWith('…')) {
    return typeof actual === 'string' && actual.startsWith(expected.slice(0, -1))
  }
  if (Array.isArray(expected)) {
    return Array.isArray(actual) && actual.length === expected.length && expected.every((e, i) => matches(actual[i], e))
  }
  if (typeof expected === 'object' && expected !== null) {
    if (typeof actual !== 'object' || actual === null || Array.isArray(actual)) return false
    const keys = Object.keys(expected)
    return isDeepStrictEqual(Object.keys(actual).sort(), [...keys].sort()) &&
      keys.every((key) => matches((actual as Json)[key], (expected as Json)[key]))
  }
  return isDeepStrictEqual(actual, expected)
}

// ---- Real components -----------------------------------------------------------------------------

/** A plugin callback server on 127.0.0.1: each path answers the JSON text `replies` holds for it. */
interface Callbacks {
  port: number
  origin: string
  replies: Map<string, string>
  requests: Array<{ path: string, headers: IncomingMessage['headers'], body: string }>
  close: () => Promise<void>
}

async function startCallbacks (): Promise<Callbacks> {
  const replies = new Map<string, string>()
  const requests: Callbacks['requests'] = []
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    let body = ''
    req.setEncoding('utf8')
    req.on('data', (chunk: string) => { body += chunk })
    req.on('end', () => {
      const path = (req.url ?? '').split('?')[0] as string
      requests.push({ path, headers: req.headers, body })
      const reply = replies.get(path) ?? '{"output":{"temperature_c":28},"is_error":false}'
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(reply) })
      res.end(reply)
    })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const { port } = server.address() as AddressInfo
  return {
    port,
    origin: `http://127.0.0.1:${port}`,
    replies,
    requests,
    close: async () => {
      server.closeAllConnections()
      await new Promise<void>((resolve) => { server.close(() => { resolve() }) })
    }
  }
}

/** Environment without the machine's TOOLPORT_* variables. */
function cleanEnv (extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {}
  for (const [key, value] of Object.entries(process.env)) if (!key.startsWith('TOOLPORT_')) env[key] = value
  return { ...env, ...extra }
}

interface Served { child: ChildProcess, url: string, line: string }

/** `toolport serve <args>` as a real child process; resolves with its listening line. */
async function serve (args: string[]): Promise<Served> {
  const child = spawn(process.execPath, [...toolportCliArgs(), 'serve', ...args], {
    cwd: ROOT, env: cleanEnv(), stdio: ['ignore', 'pipe', 'pipe']
  })
  let stderr = ''
  child.stderr?.setEncoding('utf8')
  child.stderr?.on('data', (chunk: string) => { stderr += chunk })
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream })
  const line = await within(new Promise<string>((resolve, reject) => {
    lines.on('line', (text) => { if (text.startsWith('Toolport listening on ')) resolve(text) })
    child.once('exit', (code) => { reject(new Error(`toolport serve exited ${String(code)}: ${stderr}`)) })
  }), 'toolport serve to print its listening line', GUARD_MS)
  const url = (/http:\/\/127\.0\.0\.1:\d+/.exec(line) as RegExpExecArray)[0]
  return { child, url, line }
}

async function stopChild (child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return
  const exited = once(child, 'exit')
  child.kill('SIGTERM')
  await within(exited, 'toolport serve to exit on SIGTERM', GUARD_MS).catch(() => { child.kill('SIGKILL') })
}

async function quiet (t: TestContext, options: Parameters<typeof createToolport>[0] = {}): Promise<Toolport> {
  const tp = await createToolport({ logger: false, ...options, dispatch: { mode: 'inline', ...options?.dispatch } })
  t.after(() => tp.close())
  return tp
}

async function postJson (url: string, body: unknown,
  headers: Record<string, string> = {}): Promise<{ status: number, headers: Headers, body: Json }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body)
  })
  const text = await res.text()
  return { status: res.status, headers: res.headers, body: text === '' ? undefined : JSON.parse(text) }
}

/** Reads SSE frames from `/api/events` until `until` holds for what was read (hang-guarded). */
async function readEvents (url: string, until: (frames: Array<Record<string, string>>) => boolean,
  during: () => Promise<void> = async () => {}): Promise<Array<Record<string, string>>> {
  const controller = new AbortController()
  const res = await fetch(url, { signal: controller.signal })
  const reader = (res.body as ReadableStream<Uint8Array>).getReader()
  const decoder = new TextDecoder()
  const frames: Array<Record<string, string>> = []
  let buffer = ''
  let started = false
  try {
    await within((async () => {
      while (!until(frames)) {
        const { value, done } = await reader.read()
        if (done) break
        buffer += decoder.decode(value, { stream: true })
        let end: number
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const frame: Record<string, string> = {}
          for (const line of buffer.slice(0, end).split('\n')) {
            const colon = line.indexOf(':')
            const field = colon === 0 ? 'comment' : line.slice(0, colon)
            frame[field] = (frame[field] ?? '') + line.slice(colon + 1).replace(/^ /, '')
          }
          frames.push(frame)
          buffer = buffer.slice(end + 2)
        }
        if (!started && frames.some((f) => f.event === 'hello')) {
          started = true
          await during()
        }
      }
    })(), `events from ${url}`, GUARD_MS)
  } finally {
    controller.abort()
  }
  return frames
}

// A PNG, a WebP and a GIF, as short as their signatures allow (Toolport reads 12 bytes of each).
const PNG = Buffer.concat([Buffer.from('89504e470d0a1a0a0000000d49484452', 'hex'), Buffer.alloc(13)]).toString('base64')
const WEBP = Buffer.concat([Buffer.from('RIFF'), Buffer.from([8, 0, 0, 0]), Buffer.from('WEBPVP8 '), Buffer.alloc(8)])
const GIF = Buffer.concat([Buffer.from('GIF89a'), Buffer.alloc(10)])

// ---- README "Walk-through with curl", run against a real `toolport serve` ----------------------

describe('README "Walk-through with curl" and "Live events", against a real toolport serve', () => {
  let served: Served
  let callbacks: Callbacks
  before(async () => {
    callbacks = await startCallbacks()
    served = await serve(['--port', '0', '--log-level', 'silent'])
  })
  after(async () => {
    await stopChild(served.child)
    await callbacks.close()
  })

  /** A documented URL or text, pointed at this test's server and callback port. */
  const here = (text: string): string =>
    text.replaceAll('http://127.0.0.1:3917', served.url).replaceAll('127.0.0.1:9333', `127.0.0.1:${callbacks.port}`)

  test('README "Walk-through with curl": the listening line, then every curl command answers exactly the JSON its comment shows', async () => {
    const walk = codeBlocks(section(README, 'Walk-through with curl'))[0] as { body: string }
    const items = shellItems(walk.body)
    // "prints: Toolport listening on http://127.0.0.1:3917 (roles: default; …)"
    const printed = items.find((item) => item.kind === 'comment' && item.text.includes('prints:')) as { text: string }
    const promised = here(printed.text.replace(/^.*prints: /, ''))
    assert.ok(served.line.startsWith(promised.replace(/…\)$/, '')), `listening line ${JSON.stringify(served.line)} vs ${JSON.stringify(promised)}`)
    let checked = 0
    for (let i = 0; i < items.length; i++) {
      const item = items[i] as ShellItem
      if (item.kind !== 'cmd' || item.words[0] !== 'curl') continue
      const request = curlRequest(item.words)
      // The answer the document shows: the comment lines right after the command, `# {` and its continuations.
      let expected = ''
      for (let j = i + 1; j < items.length && items[j]?.kind === 'comment'; j++) {
        const text = (items[j] as { text: string }).text
        if (/^ \{/.test(text)) expected = text.trim()
        else if (expected !== '' && /^ {2,}/.test(text)) expected += text.trim()
        else if (expected !== '') break
      }
      const res = await fetch(here(request.url), {
        method: request.method,
        headers: request.headers,
        ...(request.body === undefined ? {} : { body: here(request.body) })
      })
      const answer = await res.json() as Json
      assert.equal(res.status, 200, `${request.method} ${request.url}: ${JSON.stringify(answer)}`)
      assert.ok(expected !== '', `the document shows the answer of ${request.method} ${request.url}`)
      assert.deepEqual(answer, JSON.parse(here(expected)), `${request.method} ${request.url}`)
      checked++
    }
    assert.equal(checked, 4, 'register, list, call and unregister were all run')
  })

  test('README "Writing a plugin" (R9): the callback request carries the documented headers and body', async () => {
    const call = callbacks.requests.at(-1)
    assert.ok(call !== undefined, 'the walk-through called the callback')
    const http = codeBlocks(section(README, 'Writing a plugin: the callback protocol')).find((b) => b.lang === 'http') as { body: string }
    const [head, body] = http.body.split('\n\n') as [string, string]
    const documented = head.split('\n').slice(1).map((line) => (line.split(':')[0] as string).toLowerCase())
    for (const name of documented) assert.ok(call.headers[name] !== undefined, `header ${name}`)
    assert.equal(call.headers['content-type'], 'application/json')
    const deadline = Number(call.headers['x-toolport-deadline-ms'])
    assert.ok(Number.isInteger(deadline) && deadline > 0 && deadline <= 30_000, `x-toolport-deadline-ms ${String(deadline)} (default timeout_seconds 30)`)
    const sent = JSON.parse(call.body) as Json
    assert.deepEqual(Object.keys(sent).sort(), Object.keys(JSON.parse(body.trim()) as Json).sort())
    assert.match(sent.call_id, /^call_[0-9a-f-]{36}$/, 'docs/protocol.md R9: a call without call_id gets call_<uuid>')
    assert.equal(call.headers['x-toolport-call-id'], sent.call_id)
    assert.equal(sent.raw_arguments, '{"location": "Shanghai"}', 'raw_arguments is the model\'s text')
    assert.deepEqual(sent.arguments, { location: 'Shanghai' })
  })

  test('README "Live events": the hello and registered frames have exactly the documented fields and ids', async () => {
    const block = codeBlocks(section(README, 'Live events: `GET /api/events`'))[0] as { body: string }
    const curl = shellItems(block.body).find((item) => item.kind === 'cmd') as { words: string[] }
    const shown = shellItems(block.body).filter((item): item is { kind: 'comment', text: string } => item.kind === 'comment')
      .map((item) => item.text.trim()).join('\n').split('\n\n')
    const documented = shown.map((frame) => Object.fromEntries(frame.split('\n').filter((l) => l !== '')
      .map((l) => [l.slice(0, l.indexOf(':')), l.slice(l.indexOf(':') + 1).trim()])))
    const hello = documented.find((f) => f.event === 'hello') as Record<string, string>
    const registered = documented.find((f) => f.event === 'registered') as Record<string, string>
    const frames = await readEvents(here(curlRequest(curl.words).url), (fs) => fs.some((f) => f.event === 'registered'), async () => {
      const res = await postJson(`${served.url}/api/tools/register`, {
        name: 'get_weather', callback_url: `http://127.0.0.1:${callbacks.port}/tools/get_weather`, source: 'plugin:weather'
      })
      assert.equal(res.status, 200)
    })
    const realHello = frames.find((f) => f.event === 'hello') as Record<string, string>
    const realRegistered = frames.find((f) => f.event === 'registered') as Record<string, string>
    const helloData = JSON.parse(realHello.data as string) as Json
    assert.deepEqual(Object.keys(helloData).sort(), Object.keys(JSON.parse(hello.data as string) as Json).sort())
    assert.equal(helloData.version, JSON.parse(doc('package.json')).version)
    assert.equal(helloData.replay, 'none')
    assert.equal(helloData.last_event_id, realHello.id, 'hello carries the newest id')
    const health = await (await fetch(`${served.url}/api/health`)).json() as Json
    assert.equal(helloData.instance_id, health.instance_id, 'the same instance_id as /api/health')
    // "Ids: <instance>-<n>": the documented example is the instance id's first 8 hex digits.
    assert.match(realRegistered.id as string, /^[0-9a-f]{8}-\d+$/)
    assert.ok(health.instance_id.replaceAll('-', '').startsWith((realRegistered.id as string).split('-')[0]))
    assert.deepEqual(JSON.parse(realRegistered.data as string), JSON.parse(here(registered.data as string)))
    await postJson(`${served.url}/api/tools/clear`, { source: 'plugin:weather' })
  })

  test('README "Tool results": each documented ToolResult is what POST /api/tools/call answers for the matching plugin reply', async () => {
    const block = codeBlocks(section(README, 'Tool results'))[0] as { body: string }
    const examples = block.body.split(/\n(?=\{)/).map((text) => JSON.parse(text) as Json)
    // The plugin replies that the document says produce them (README "Errors and images from a plugin").
    const replies = [
      { output: { temperature_c: 28 }, is_error: false },
      { error: 'location not found', is_error: true },
      { output: { reason: 'no_data' }, is_error: true, error: 'NO_DATA' },
      { output: { caption: 'radar' }, is_error: false, images: [{ data_b64: PNG, mime: 'image/png', vision_prompt: 'Describe the weather map.' }] }
    ]
    assert.equal(examples.length, replies.length)
    for (const [i, reply] of replies.entries()) {
      callbacks.replies.set(`/r${i}`, JSON.stringify(reply))
      const reg = await postJson(`${served.url}/api/tools/register`, { name: `r${i}`, callback_url: `${callbacks.origin}/r${i}` })
      assert.equal(reg.status, 200)
      const res = await postJson(`${served.url}/api/tools/call`, { role: 'default', name: `r${i}`, arguments: {} })
      assert.ok(matches(res.body, examples[i]), `example ${i}: ${JSON.stringify(res.body)} vs ${JSON.stringify(examples[i])}`)
    }
  })

  test('README "Errors and images from a plugin": N.E.K.O\'s error reply and the _image_warnings example, as documented', async () => {
    const part = section(README, 'Errors and images from a plugin')
    const blocks = codeBlocks(part).filter((b) => b.lang === 'json').map((b) => JSON.parse(b.body) as Json)
    const [neko, withImages, warned] = blocks as [Json, Json, Json]
    callbacks.replies.set('/neko', JSON.stringify(neko))
    await postJson(`${served.url}/api/tools/register`, { name: 'neko', callback_url: `${callbacks.origin}/neko` })
    const nekoResult = (await postJson(`${served.url}/api/tools/call`, { role: 'default', name: 'neko' })).body
    const promisedText = /The model's text is then `([^`]+)`/.exec(part)?.[1] as string
    assert.equal(nekoResult.text, promisedText)
    assert.equal(nekoResult.error, 'NO_DATA')
    assert.deepEqual(nekoResult.output, { reason: 'no_data' })
    // The warning example: a second image whose mime says JPEG while its bytes are a PNG.
    const reply = { ...withImages, images: [{ ...withImages.images[0], data_b64: PNG }, { data_b64: PNG, mime: 'image/jpeg' }] }
    callbacks.replies.set('/radar', JSON.stringify(reply))
    await postJson(`${served.url}/api/tools/register`, { name: 'radar', callback_url: `${callbacks.origin}/radar` })
    const result = (await postJson(`${served.url}/api/tools/call`, { role: 'default', name: 'radar' })).body
    assert.deepEqual(result.output, warned)
    assert.equal(result.images.length, 1)
    assert.equal(result.images[0].prompt, 'Describe the weather map.')
  })

  test('README "The API" and "Errors": each documented answer shape and error status over real HTTP, with SECURITY.md\'s headers', async () => {
    const table = tableAfter(section(README, 'Errors'), '| code | status | when |')
    const statusOf = new Map(table.map((row) => [names(row[0] as string)[0] as string, Number(row[1])]))
    const long = 'x'.repeat(300)
    const cases: Array<[string, RequestInit & { path: string }]> = [
      ['TP_ERR_HOST_FORBIDDEN', { path: '/api/tools', headers: { host: 'evil.example' } }],
      ['TP_ERR_ORIGIN_FORBIDDEN', { path: '/api/tools', headers: { origin: 'http://evil.example' } }],
      ['TP_ERR_ROLE_NOT_FOUND', { path: '/api/tools?role=Nobody' }],
      ['TP_ERR_ROUTE_NOT_FOUND', { path: '/api/nothing-here' }],
      ['TP_ERR_VALIDATION', { path: '/api/tools/register', method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"name":""}' }],
      ['TP_ERR_BAD_JSON', { path: '/api/tools/register', method: 'POST', headers: { 'content-type': 'application/json' }, body: '{' }],
      ['TP_ERR_BAD_REQUEST', { path: '/api/tools/%zz' }],
      ['TP_ERR_BODY_TOO_LARGE', { path: '/api/tools/register', method: 'POST', headers: { 'content-type': 'application/json' }, body: `"${'x'.repeat(1024 * 1024)}"` }],
      ['TP_ERR_JSON_TOO_DEEP', { path: '/api/tools/register', method: 'POST', headers: { 'content-type': 'application/json' }, body: '['.repeat(65) + ']'.repeat(65) }],
      ['TP_ERR_UNSUPPORTED_MEDIA_TYPE', { path: '/api/tools/register', method: 'POST', headers: { 'content-type': 'text/plain' }, body: '{}' }]
    ]
    for (const [code, { path, method, headers, body: payload }] of cases) {
      // undici's request, not fetch: fetch drops a Host header it is given.
      const raw = await request(served.url + path, {
        method: (method ?? 'GET') as 'GET', headers: headers as Record<string, string>, body: payload as string | undefined
      })
      const res = { status: raw.statusCode, headers: new Headers(raw.headers as Record<string, string>) }
      const body = await raw.body.json() as Json
      assert.equal(res.status, statusOf.get(code), `${code}: ${JSON.stringify(body)}`)
      // README "Errors": { ok: false, statusCode, code, error, message, details? };
      // docs/protocol.md: only 422 carries details.
      assert.deepEqual(Object.keys(body).filter((k) => k !== 'details'), ['ok', 'statusCode', 'code', 'error', 'message'])
      assert.equal(body.code, code)
      assert.equal(body.statusCode, res.status)
      assert.equal('details' in body, res.status === 422, `${code}: details only on 422`)
      for (const [name, value] of [['x-content-type-options', 'nosniff'], ['cache-control', 'no-store'], ['cross-origin-resource-policy', 'same-origin']]) {
        assert.equal(res.headers.get(name as string), value, `${code}: ${name as string}`)
      }
      // protocol.md "Errors of the API itself": a 401 or 403 closes its connection.
      if (res.status === 403) assert.equal(res.headers.get('connection'), 'close', code)
    }
    // README "Errors": "414 for a path segment over 256 characters".
    const tooLong = await fetch(`${served.url}/mcp/${long}`)
    assert.equal(tooLong.status, 414)
    assert.equal((await tooLong.json() as Json).code, 'TP_ERR_BAD_REQUEST')
    // README "The API": the answers of the routes, by their documented keys.
    const listed = await (await fetch(`${served.url}/api/tools?role=default`)).json() as Json
    assert.deepEqual(Object.keys(listed), ['ok', 'tools_by_role'])
    const defs = await (await fetch(`${served.url}/api/tools/definitions?role=default`)).json() as Json
    assert.deepEqual(Object.keys(defs), ['ok', 'role', 'format', 'tools'])
    assert.equal(defs.format, 'openai-chat', 'README "Definitions": format defaults to openai-chat')
    const cleared = await postJson(`${served.url}/api/tools/clear`, { source: 'external' })
    assert.deepEqual(Object.keys(cleared.body), ['ok', 'removed', 'affected_roles', 'failed_roles'])
    assert.equal(typeof cleared.body.removed, 'number', 'clear answers removed as a count (R17)')
  })
})

// ---- README "The API" rules, probed at the documented edges --------------------------------------

test('README "The API" → Fields (R7): name 1–64 code points and timeout_seconds > 0, ≤ 300 (numeric strings too), judged at the edges', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const tp = await quiet(t, { roles: ['A'] })
  const nameArb = fc.oneof(
    fc.integer({ min: 0, max: 66 }).map((n) => 'n'.repeat(n)),
    fc.integer({ min: 62, max: 66 }).map((n) => '😀'.repeat(n)),
    fc.constantFrom('\uD800', 'a\uDFFFb')
  )
  const timeoutArb = fc.oneof(
    fc.constantFrom(0, -0, 300, 300.0001, 299.999, 1e-9, -1, Number.MIN_VALUE, 30),
    fc.double({ min: -1, max: 400, noNaN: true }),
    fc.constantFrom('30', ' 30 ', '+5', '1e2', '3e2', '3.01e2', '0x10', '', 'abc', true, null, [30])
  )
  await check(fc.asyncProperty(nameArb, timeoutArb, async (name, timeout) => {
    const points = [...name].length
    const wellFormed = !/\p{Cs}/u.test(name)
    const asNumber = typeof timeout === 'number'
      ? timeout
      : typeof timeout === 'string' && /^\s*[+]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$/.test(timeout) ? Number(timeout) : NaN
    const nameOk = points >= 1 && points <= 64 && wellFormed
    const timeoutOk = asNumber > 0 && asNumber <= 300
    let problems: string[] = []
    try {
      await tp.register({ name, callback_url: 'http://127.0.0.1:9/x', timeout_seconds: timeout })
    } catch (err) {
      assert.equal((err as Json).code, 'TP_ERR_VALIDATION')
      problems = ((err as Json).details as Json[]).map((d) => d.path)
    }
    assert.equal(!problems.includes('name'), nameOk, `name of ${points} code points (well-formed: ${String(wellFormed)}): ${problems.join()}`)
    assert.equal(!problems.includes('timeout_seconds'), timeoutOk, `timeout_seconds ${JSON.stringify(timeout)}: ${problems.join()}`)
    if (nameOk && timeoutOk) {
      // "the deadline is whole milliseconds, at least 1 ms"
      const entry = tp.roles.get('A').registry.get(name) as Json
      assert.equal(entry.timeoutMs, Math.max(1, Math.round(asNumber * 1000)))
    }
  }), { numRuns: runs(120), endOnFailure: true })
})

test('README "Configuration" and "Embedding: the library": port 0–65535, roles 1–128 characters (not . or ..), a token ≥ 32 visible ASCII bytes, judged at the edges', { timeout: FAILING_TIMEOUT_MS }, async () => {
  const portArb = fc.oneof(fc.integer({ min: -3, max: 3 }), fc.integer({ min: 65_533, max: 65_538 }),
    fc.constantFrom(0.5, 3917.0, '3917', Number.NaN, Infinity, null))
  const roleArb = fc.oneof(fc.integer({ min: 0, max: 130 }).map((n) => 'r'.repeat(n)), fc.constantFrom('.', '..', '...', '\uDC00', 'Lanlan'))
  const tokenArb = fc.oneof(fc.integer({ min: 30, max: 34 }).map((n) => 'T'.repeat(n)),
    fc.tuple(fc.integer({ min: 32, max: 40 }), fc.constantFrom(' ', '\n', 'é', '~', '!', '\x7f')).map(([n, c]) => 'T'.repeat(n - 1) + c))
  await check(fc.asyncProperty(portArb, roleArb, tokenArb, async (port, role, token) => {
    const portOk = typeof port === 'number' && Number.isInteger(port) && port >= 0 && port <= 65_535
    const roleOk = role.length >= 1 && role.length <= 128 && role !== '.' && role !== '..' && !/\p{Cs}/u.test(role)
    const tokenOk = Buffer.byteLength(token) >= 32 && /^[\x21-\x7e]+$/.test(token)
    let message = ''
    try {
      parseOptions({ port, roles: [role], security: { token } })
    } catch (err) {
      assert.equal((err as Json).code, 'TP_ERR_CONFIG')
      message = (err as Error).message
    }
    assert.equal(!/\bport\b/.test(message), portOk, `port ${String(port)}: ${message}`)
    assert.equal(!/roles/.test(message), roleOk, `role of ${role.length}: ${message}`)
    assert.equal(!/security\.token/.test(message), tokenOk, `token ${JSON.stringify(token)}: ${message}`)
  }), { numRuns: runs(150), endOnFailure: true })
})

test('docs/protocol.md "Ownership mode": a plugin key of 32–512 visible ASCII characters, else 401 TP_ERR_PLUGIN_KEY_REQUIRED', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const tp = await quiet(t, { roles: ['A'], security: { enforceOwnership: true } })
  await check(fc.asyncProperty(
    fc.oneof(fc.integer({ min: 30, max: 34 }), fc.integer({ min: 510, max: 514 })),
    fc.constantFrom('k', ' ', '\x7f', '~'),
    async (length, last) => {
      const key = 'k'.repeat(length - 1) + last
      const ok = length >= 32 && length <= 512 && /^[\x21-\x7e]+$/.test(key)
      const res = await tp.app.inject({
        method: 'POST',
        url: '/api/tools/register',
        headers: { 'content-type': 'application/json', 'x-toolport-plugin-key': key },
        payload: { name: 't', callback_url: 'http://127.0.0.1:9/x', source: `plugin:k${length}${last.charCodeAt(0)}` }
      })
      assert.equal(res.statusCode, ok ? 200 : 401, `key of ${length} ending ${JSON.stringify(last)}: ${res.body}`)
      if (!ok) assert.equal(res.json().code, 'TP_ERR_PLUGIN_KEY_REQUIRED')
    }), { numRuns: runs(30), endOnFailure: true })
})

// ---- README "Plugin SDK": options, defaults, errors ------------------------------------------------

test('README "Plugin SDK" → Options of createPlugin: every documented option, with its documented default, and nothing else', () => {
  const rows = tableAfter(section(README, 'Plugin SDK'), '| option | default | meaning |')
  const resolved = resolvePluginOptions({ toolportUrl: 'http://127.0.0.1:3917', source: 'plugin:x', tools: { t: { handler: () => 1 } } }) as Json
  const documented: string[] = []
  for (const row of rows) {
    const optionNames = names(row[0] as string)
    documented.push(...optionNames)
    const defaults = (row[1] as string).split(' / ').map((cell) => /^`([^`]+)`$/.exec(cell.trim())?.[1])
    optionNames.forEach((name, i) => {
      const literal = defaults[i]
      if (literal === undefined) return
      assert.equal(JSON.stringify(resolved[name]), /^-?\d+(\.\d+)?$|^(true|false|null)$/.test(literal) ? literal : JSON.stringify(literal),
        `createPlugin option ${name}: README default ${literal}`)
    })
  }
  assert.deepEqual([...documented].sort(), Object.keys(resolved).sort(), 'the documented options are the resolved ones')
})

test('README "Plugin SDK": the error-code table is PLUGIN_ERROR_CODES, and the Python SDK raises the same codes', async (t) => {
  const rows = tableAfter(section(README, 'Plugin SDK'), '| code | when |')
  assert.deepEqual(rows.map((row) => names(row[0] as string)[0]).sort(), Object.values(PLUGIN_ERROR_CODES).sort())
  if (pythonMissing !== false) { t.skip(pythonMissing); return }
  const codes = JSON.parse(await python('import json, toolport_plugin as t; print(json.dumps(list(t.PLUGIN_ERROR_CODES)))')) as string[]
  assert.deepEqual([...codes].sort(), Object.values(PLUGIN_ERROR_CODES).sort())
})

test('README "Plugin SDK" (createPlugin): timeoutSeconds > 0 and ≤ 300, source plugin:<id> of at most 256 characters, tool names 1–64, port 0–65535, at the edges', { timeout: FAILING_TIMEOUT_MS }, async () => {
  await check(fc.asyncProperty(
    fc.oneof(fc.constantFrom(0, 300, 300.001, 1e-9, -1, Number.NaN, Infinity),
      fc.double({ min: -1, max: 301, noNaN: true })),
    fc.integer({ min: 0, max: 252 }).chain((n) => fc.constantFrom(`plugin:${'i'.repeat(n)}`, `plugin:${'i'.repeat(n)}😀`, 'external')),
    fc.integer({ min: 0, max: 66 }),
    fc.oneof(fc.integer({ min: -2, max: 2 }), fc.integer({ min: 65_534, max: 65_537 }), fc.constant(1.5)),
    async (timeoutSeconds, source, nameLength, port) => {
      const name = 'n'.repeat(nameLength)
      const want = {
        timeout: timeoutSeconds > 0 && timeoutSeconds <= 300,
        source: source.startsWith('plugin:') && source.length > 7 && source.length <= 256,
        name: nameLength >= 1 && nameLength <= 64,
        port: Number.isInteger(port) && port >= 0 && port <= 65_535
      }
      let paths: string[] = []
      try {
        createPlugin({ toolportUrl: 'http://127.0.0.1:3917', source, port, logger: false, tools: { [name]: { handler: () => 1, timeoutSeconds } } })
      } catch (err) {
        assert.ok(err instanceof PluginError && err.code === 'TP_ERR_PLUGIN_OPTIONS')
        paths = err.details.map((d) => d.path)
      }
      assert.equal(!paths.some((p) => p.endsWith('.timeoutSeconds')), want.timeout, `timeoutSeconds ${timeoutSeconds}`)
      assert.equal(!paths.includes('source'), want.source, `source of ${source.length}`)
      assert.equal(!paths.includes(`tools.${name}`), want.name, `tool name of ${nameLength}`)
      assert.equal(!paths.includes('port'), want.port, `port ${port}`)
    }), { numRuns: runs(120), endOnFailure: true })
})

test('README "Plugin SDK" → the Plugin object: url spelt as the URL parser does (0:0:0:0:0:0:0:1 → [::1]), callbackUrl under a 128-bit random segment', async (t) => {
  const tp = await quiet(t, { roles: ['A'] })
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  const plugin = createPlugin({ toolportUrl: url, source: 'plugin:url', host: '0:0:0:0:0:0:0:1', logger: false, watchEvents: false, tools: { t: { handler: () => 1 } } })
  t.after(() => plugin.stop({ graceMs: 0 }))
  assert.equal(plugin.url, '', "'' before start()")
  const started = await plugin.start()
  assert.match(plugin.url, /^http:\/\/\[::1\]:\d+$/)
  assert.equal(started.url, plugin.url)
  assert.match(plugin.callbackUrl('t'), new RegExp(`^${plugin.url.replace(/[[\].]/g, '\\$&')}/[A-Za-z0-9_-]{22}/tools/t$`))
  assert.deepEqual({
    source: plugin.source, role: plugin.role, toolNames: plugin.toolNames, isRunning: plugin.isRunning
  },
  { source: 'plugin:url', role: null, toolNames: ['t'], isRunning: true })
  assert.equal(tp.list('A').tools_by_role.A?.[0]?.callback_url, plugin.callbackUrl('t'))
})

// ---- README "Python plugin SDK" and python/README.md -----------------------------------------------

/** Runs `code` in python/.venv with the SDK from python/src; resolves with its stdout. */
async function python (code: string, stdin = ''): Promise<string> {
  const child = spawn(PY, ['-c', code], {
    env: { ...cleanEnv(), PYTHONPATH: PY_SRC, PYTHONWARNINGS: 'ignore' }, stdio: ['pipe', 'pipe', 'pipe']
  })
  let out = ''
  let err = ''
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => { out += chunk })
  child.stderr.setEncoding('utf8').on('data', (chunk: string) => { err += chunk })
  child.stdin.end(stdin)
  const [status] = await within(once(child, 'exit'), 'python', GUARD_MS) as [number]
  assert.equal(status, 0, err)
  return out
}

test('README "Python plugin SDK" → Options of Plugin(id, ...): the documented options, keyword-only, with the real defaults; @plugin.tool\'s documented signature', { skip: pythonMissing }, async () => {
  const out = JSON.parse(await python(`
import inspect, json
from toolport_plugin import Plugin
sig = inspect.signature(Plugin.__init__)
params = {n: {"kind": str(p.kind), "default": None if p.default is inspect.Parameter.empty else str(p.default)}
          for n, p in sig.parameters.items() if n != "self"}
tool = [f"{n}={p.default!r}" for n, p in inspect.signature(Plugin.tool).parameters.items() if n not in ("self", "fn")]
plugin = Plugin("w")
import toolport_plugin
print(json.dumps({"params": params, "tool": tool, "url": toolport_plugin.DEFAULT_TOOLPORT_URL, "logger": plugin._log.name}))
`)) as { params: Record<string, { kind: string, default: string | null }>, tool: string[], url: string, logger: string }
  const rows = tableAfter(section(README, 'Python plugin SDK'), '| option | default | meaning |')
  const documented: string[] = []
  for (const row of rows) {
    const optionNames = names(row[0] as string)
    documented.push(...optionNames)
    const defaults = (row[1] as string).split(' / ').map((cell) => /^`([^`]+)`$/.exec(cell.trim())?.[1])
    optionNames.forEach((name, i) => {
      const literal = defaults[i]
      // A literal default; `$TOOLPORT_URL, then …` and `logging.getLogger(…)` are checked below.
      if (literal === undefined || name === 'id' || /[($]/.test(literal)) return
      assert.equal(out.params[name]?.default, literal, `Plugin option ${name}: README default ${literal}`)
    })
  }
  assert.deepEqual([...documented].sort(), Object.keys(out.params).sort(), 'the documented options are the signature\'s')
  for (const [name, param] of Object.entries(out.params)) {
    assert.equal(param.kind, name === 'id' ? 'POSITIONAL_OR_KEYWORD' : 'KEYWORD_ONLY', `${name}: "all keyword-only after id"`)
  }
  // `toolport_url` | `$TOOLPORT_URL`, then `http://127.0.0.1:3917` (the environment here has no TOOLPORT_URL)
  const urlRow = rows.find((row) => row[0] === '`toolport_url`') as string[]
  assert.deepEqual(names(urlRow[1] as string), ['$TOOLPORT_URL', out.url])
  // `logger` | `logging.getLogger("toolport_plugin")`
  const loggerRow = rows.find((row) => row[0] === '`logger`') as string[]
  assert.equal(`logging.getLogger("${out.logger}")`, /`([^`]+)`/.exec(loggerRow[1] as string)?.[1])
  const promised = /`@plugin\.tool\(([^)]*)\)`/.exec(README)?.[1] as string
  assert.deepEqual(out.tool, promised.split(', '))
})

test('README "Python plugin SDK": every name the package exports is documented there', { skip: pythonMissing }, async () => {
  const exported = JSON.parse(await python(`
import json, toolport_plugin
print(json.dumps(sorted(n for n in toolport_plugin.__all__ if not n.startswith("_"))))
`)) as string[]
  const text = section(README, 'Python plugin SDK')
  // Named in code (a code span may wrap): `Name`, `Name(…)`, `Name.method(…)`, `raise Name(…)`.
  const missing = exported.filter((name) => !new RegExp(`\`[^\`]*\\b${name}\\b[^\`]*\``).test(text))
  assert.deepEqual(missing, [], 'exported by toolport_plugin and not named in the README')
})

test('README "The API": Swagger UI also serves the OpenAPI document at /docs/json and /docs/yaml', async (t) => {
  const tp = await quiet(t, { roles: ['A'] })
  const get = async (url: string): Promise<{ status: number, type: string, body: string }> => {
    const res = await tp.app.inject({ url, headers: { host: '127.0.0.1' } })
    return { status: res.statusCode, type: String(res.headers['content-type']), body: res.body }
  }
  assert.match(README, /`\/docs\/json` and `\/docs\/yaml`/)
  const canonical = await get('/openapi.json')
  const json = await get('/docs/json')
  assert.equal(json.status, 200)
  assert.deepEqual(JSON.parse(json.body), JSON.parse(canonical.body))
  const yaml = await get('/docs/yaml')
  assert.equal(yaml.status, 200)
  assert.match(yaml.type, /yaml/)
  assert.match(yaml.body, /^openapi: 3\.1\.0$/m)
})

test('README "Python plugin SDK" → Options: durations positive and finite (start_timeout may be 0), use_events a bool, max_body_bytes a positive int, port 0–65535, plugin_key 32–512 visible ASCII', { skip: pythonMissing }, async () => {
  // One Python process judges a batch of generated option sets; the documented rule predicts each verdict.
  const special = fc.constantFrom('inf', '-inf', 'nan', 'True', '"5"', 'None')
  const number = fc.oneof(fc.constantFrom(0, -0.5, 1e-9, 1, 2.5, -1), fc.integer({ min: -2, max: 2 }))
  const value = fc.oneof(number.map((n) => JSON.stringify(n)), special)
  const cases = fc.sample(fc.record({
    option: fc.constantFrom('poll_interval', 'resync_interval', 'max_backoff', 'request_timeout', 'start_timeout', 'max_body_bytes', 'use_events', 'port', 'plugin_key'),
    value,
    port: fc.oneof(fc.integer({ min: -2, max: 2 }), fc.integer({ min: 65_534, max: 65_537 })),
    keyLength: fc.oneof(fc.integer({ min: 30, max: 34 }), fc.integer({ min: 510, max: 514 }))
  }), { numRuns: runs(60) })
  const lines = cases.map((c) => {
    const literal = c.option === 'port' ? String(c.port) : c.option === 'plugin_key' ? `"${'k'.repeat(c.keyLength)}"` : c.value
    return `${c.option}=${literal.replace(/^(-?)inf$/, '$1float("inf")').replace(/^nan$/, 'float("nan")')}`
  })
  const verdicts = (await python(`
import sys
from toolport_plugin import Plugin, PluginError
for line in sys.stdin.read().splitlines():
    try:
        eval(f"Plugin('w', toolport_url='http://127.0.0.1:3917', {line})")
        print("ok")
    except PluginError as err:
        print(err.code)
`, lines.join('\n'))).trim().split('\n')
  cases.forEach((c, i) => {
    const literal = c.value
    const num = /^-?[\d.e-]+$/.test(literal) ? Number(literal) : literal === 'inf' ? Infinity : literal === '-inf' ? -Infinity : NaN
    const isNumber = /^-?[\d.e-]+$/.test(literal) || /inf|nan/.test(literal)
    let ok: boolean
    if (c.option === 'port') ok = c.port >= 0 && c.port <= 65_535
    else if (c.option === 'plugin_key') ok = c.keyLength >= 32 && c.keyLength <= 512
    else if (c.option === 'use_events') ok = literal === 'True'
    else if (c.option === 'max_body_bytes') ok = /^\d+$/.test(literal) && num >= 1
    else if (c.option === 'start_timeout') ok = isNumber && Number.isFinite(num) && num >= 0
    else ok = isNumber && Number.isFinite(num) && num > 0
    assert.equal(verdicts[i], ok ? 'ok' : 'TP_ERR_PLUGIN_OPTIONS', `Plugin('w', ${lines[i] as string})`)
  })
})

test('python/README.md: its example declares the documented schema (optional parameter with its default, unknown arguments refused); its limits are the SDK\'s', { skip: pythonMissing }, async () => {
  const example = (codeBlocks(PY_README).find((b) => b.lang === 'python') as { body: string }).body.replace('plugin.run()', '')
  const out = JSON.parse(await python(`
import json
from toolport_plugin import _client
${example}
print(json.dumps({"schema": plugin.tools["get_weather"].parameters, "description": plugin.tools["get_weather"].description,
                  "answer": _client._MAX_ANSWER_BYTES, "event": _client._MAX_EVENT_BYTES, "silence": _client._EVENT_SILENCE_SECONDS}))
`)) as Json
  assert.deepEqual(out.schema.required, ['city'])
  assert.deepEqual(out.schema.properties.unit.enum, ['c', 'f'])
  assert.equal(out.schema.properties.unit.default, 'c', 'README "Python plugin SDK": the default is shown to the model')
  assert.equal(out.schema.additionalProperties, false, 'unknown arguments are refused')
  assert.equal(out.description, 'Get the weather for a city.')
  // "read whole … up to 64 MiB", "one event's data past 1 MiB, or 45 s without a byte"
  assert.equal(out.answer, Number(/up to (\d+) MiB/.exec(PY_README)?.[1]) * 1024 * 1024)
  assert.equal(out.event, Number(/data past (\d+) MiB/.exec(PY_README)?.[1]) * 1024 * 1024)
  assert.equal(out.silence, Number(/or (\d+) s without a byte/.exec(PY_README)?.[1]))
  // "(Toolport sends a heartbeat every 15 s)": Toolport's events.heartbeatMs.
  assert.equal(parseOptions({}).events.heartbeatMs, Number(/heartbeat\s+every (\d+) s/.exec(PY_README)?.[1]) * 1000)
})

test('README "Python plugin SDK" → Images: the images Toolport passes on from a Python plugin are PNG, JPEG, WebP or GIF (dispatch.maxImages of them), not only PNG or JPEG', { skip: pythonMissing }, async (t) => {
  const tp = await quiet(t, { roles: ['A'] })
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  const child = spawn(PY, ['-c', `
import asyncio, base64, sys
from toolport_plugin import Plugin, Image, ToolOutput
plugin = Plugin("pics", toolport_url=${JSON.stringify(url)}, use_events=False)
@plugin.tool
def pics() -> ToolOutput:
    return ToolOutput({"n": 2}, images=[Image.from_bytes(base64.b64decode("${WEBP.toString('base64')}"), mime="image/webp"),
                                        Image.from_bytes(base64.b64decode("${GIF.toString('base64')}"), mime="image/gif")])
async def run():
    async with plugin:
        print("READY", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
asyncio.run(run())
`], { env: { ...cleanEnv(), PYTHONPATH: PY_SRC, PYTHONWARNINGS: 'ignore' }, stdio: ['pipe', 'pipe', 'inherit'] })
  const exited = once(child, 'exit')
  t.after(async () => {
    child.stdin?.end()
    await within(exited, 'the Python plugin to stop', GUARD_MS).catch(() => { child.kill('SIGKILL') })
  })
  await within(new Promise<void>((resolve) => {
    createInterface({ input: child.stdout as NodeJS.ReadableStream }).on('line', (line) => { if (line === 'READY') resolve() })
  }), 'the Python plugin to start', GUARD_MS)
  const result = await tp.callTool('A', { name: 'pics', arguments: {} })
  assert.equal(result.is_error, false, result.text)
  assert.deepEqual(result.images?.map((image) => image.mime_type), ['image/webp', 'image/gif'])
  assert.deepEqual(result.output, { n: 2 }, 'no _image_warnings')
  child.stdin?.end()
  await within(exited, 'the Python plugin to stop', GUARD_MS)
})

// ---- README "Embedding: the library": exports, events --------------------------------------------

test('README "Embedding: the library" → Public exports of toolport: the table names exactly the entry\'s values; the plugin entry\'s are the README\'s', () => {
  const rows = tableAfter(section(README, 'Embedding: the library'), '| export | what |')
  const documented = rows.flatMap((row) => names(row[0] as string))
  assert.deepEqual(documented.sort(), Object.keys(libraryEntry).sort())
  const plugin = section(README, 'Plugin SDK')
  for (const name of Object.keys(pluginEntry)) assert.ok(plugin.includes(`\`${name}`), `toolport/plugin export ${name} is documented`)
  for (const name of ['createPlugin', 'defineTool', 'PluginError', 'PLUGIN_ERROR_CODES']) assert.ok(name in pluginEntry, name)
})

test('README "Embedding: the library" → Events: every documented event fires with (at least) the documented payload', async (t) => {
  const rows = tableAfter(section(README, 'Embedding: the library'), '| event | when | payload |')
  const tp = await quiet(t, { roles: ['A'], evictionThreshold: 1 })
  const seen = new Map<string, Json[]>()
  for (const row of rows) {
    for (const name of names(row[0] as string)) {
      seen.set(name, [])
      tp.on(name as 'role-added', (payload: Json) => { seen.get(name)?.push(payload) })
    }
  }
  tp.roles.get('A').attachSession({ id: 'fails', syncTools: async () => { throw new Error('no') } })
  await tp.register({ name: 'gone', callback_url: 'http://127.0.0.1:9/x', source: 'plugin:dead' })
  await tp.callTool('A', { name: 'gone', arguments: {} })
  tp.roles.add('B')
  tp.roles.remove('B')
  await tp.roles.get('A').registerLocalTool({ name: 'local', handler: () => 1 })
  for (const row of rows) {
    const keys = names(row[2] as string)[0]?.replace(/[{}]/g, '').split(',').map((k) => k.trim()) ?? []
    for (const name of names(row[0] as string)) {
      const payload = seen.get(name)?.[0]
      assert.ok(payload !== undefined, `${name} fired`)
      for (const key of keys) assert.ok(key in payload, `${name} carries ${key}: ${JSON.stringify(payload)}`)
    }
  }
  // README "tool-registered: a remote tool entered a role's registry": a local tool fires it too (isRemote false).
  assert.ok(seen.get('tool-registered')?.some((e) => e.name === 'local' && e.isRemote === false))
  // "tool-removed … (unregister, clear, evicted, replaced, local)"
  const reason = /\(([^)]*)\)/.exec(rows.find((r) => r[0] === '`tool-removed`')?.[1] ?? '')?.[1] ?? ''
  assert.ok(names(reason).includes((seen.get('tool-removed')?.[0] as Json).reason))
})

test('README "Live events" table: each wire event has exactly the documented data fields (registered, evicted, sync, call, role-added)', async (t) => {
  const tp = await quiet(t, { roles: ['A'], evictionThreshold: 1 })
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  tp.roles.get('A').attachSession({ id: 's', syncTools: async () => {} })
  const rows = tableAfter(section(README, 'Live events: `GET /api/events`'), '| event | `data` |')
  const frames = await readEvents(`${url}/api/events`, (fs) => fs.some((f) => f.event === 'role-removed'), async () => {
    await tp.register({ name: 'gone', callback_url: 'http://127.0.0.1:9/x', source: 'plugin:dead' })
    await tp.callTool('A', { name: 'gone', arguments: {} })
    tp.roles.add('B')
    tp.roles.remove('B')
  })
  const fieldsOf = (event: string): string[] => {
    const row = rows.find((r) => names(r[0] as string).includes(event)) as string[]
    const shape = /`\{([^`]*)\}`/.exec(row[1] as string)?.[1] ?? ''
    return shape.replace(/\[[^\]]*\]/g, '').split(',').map((k) => k.trim().replace(/:.*$/, '')).filter((k) => k !== '')
  }
  const expected: Record<string, string[]> = {
    registered: fieldsOf('registered'),
    evicted: [...fieldsOf('registered'), 'failures'],
    sync: fieldsOf('sync'),
    call: fieldsOf('call'),
    'role-added': fieldsOf('role-added')
  }
  for (const [event, fields] of Object.entries(expected)) {
    const frame = frames.find((f) => f.event === event)
    assert.ok(frame !== undefined, `${event} was streamed`)
    assert.deepEqual(Object.keys(JSON.parse(frame.data as string) as Json).sort(), [...fields].sort(), event)
    // "every event but a replaying hello and call has an id"
    assert.equal(frame.id === undefined, event === 'call', `${event}: id ${String(frame.id)}`)
  }
  assert.equal(JSON.parse(frames.find((f) => f.event === 'evicted')?.data as string).failures, 1)
})

// ---- The command ------------------------------------------------------------------------------------

async function runMain (args: string[]): Promise<{ code: number, stdout: string, stderr: string }> {
  const stdout = new PassThrough()
  const stderr = new PassThrough()
  let out = ''
  let err = ''
  stdout.setEncoding('utf8').on('data', (c: string) => { out += c })
  stderr.setEncoding('utf8').on('data', (c: string) => { err += c })
  const stop = new AbortController().signal
  const code = await main(args, { stdin: new PassThrough(), stdout, stderr, env: {}, stop })
  return { code, stdout: out, stderr: err }
}

test('README "The command": --help exits 0 and names every documented variable; the README names every variable the command reads', async () => {
  const help = await runMain(['--help'])
  assert.equal(help.code, 0)
  const command = section(README, 'The command')
  const documented = [...new Set([...command.matchAll(/`(TOOLPORT_[A-Z_]+)`/g)].map((m) => m[1] as string))]
  for (const name of documented) assert.ok(help.stdout.includes(name), `--help names ${name}`)
  for (const name of Object.keys(ENVIRONMENT)) assert.ok(README.includes(`\`${name}\``), `README names ${name}`)
  // The synopsis: every flag of the README's `toolport serve` line is in --help.
  const synopsis = codeBlocks(command)[0]?.body ?? ''
  for (const [flag] of synopsis.matchAll(/--[a-z-]+/g)) assert.ok(help.stdout.includes(flag), `--help has ${flag}`)
  // "stdout carries the protocol; diagnostics go to stderr": `toolport mcp --help` too.
  const mcpHelp = await runMain(['mcp', '--help'])
  assert.deepEqual([mcpHelp.code, mcpHelp.stdout], [0, ''])
  assert.match(mcpHelp.stderr, /Options for mcp:/)
})

// ---- SECURITY.md ---------------------------------------------------------------------------------------

test('SECURITY.md "Limits" and "Connections": request 30 s, headers 15 s, keep-alive 65 s, path segments 256; the console\'s exact CSP', async (t) => {
  const tp = await quiet(t, { roles: ['A'] })
  await tp.listen({ host: '127.0.0.1', port: 0 })
  const server = tp.app.server
  const limits = tableAfter(SECURITY, '| limit | default | answer |')
  const timeRow = limits.find((row) => (row[0] as string).startsWith('time to send a request')) as string[]
  const [request, headers] = (timeRow[1] as string).split(' / ').map((s) => Number.parseInt(s, 10) * 1000)
  assert.equal(server.requestTimeout, request)
  assert.equal(server.headersTimeout, headers)
  assert.equal(server.keepAliveTimeout, Number(/the (\d+) s keep-alive timeout/.exec(SECURITY)?.[1]) * 1000)
  const csp = /`Content-Security-Policy: ([^`]+)`/.exec(SECURITY.replace(/\n/g, ' '))?.[1]?.replace(/\s+/g, ' ')
  const page = await tp.app.inject({ method: 'GET', url: '/', headers: { host: '127.0.0.1' } })
  assert.equal(page.headers['content-security-policy'], csp)
  assert.equal(page.headers['x-frame-options'], 'DENY')
  assert.equal(page.headers['referrer-policy'], 'no-referrer')
})

test('README "Definitions for your own LLM loop": an answer over limits.maxDefinitionsBytes is 422 TP_ERR_LIMIT_EXCEEDED, the cap in details (SECURITY.md: path limits.maxDefinitionsBytes)', async (t) => {
  const tp = await quiet(t, { roles: ['A'], limits: { maxDefinitionsBytes: 1024 } })
  await tp.register({ name: 'big', description: 'd'.repeat(2000), callback_url: 'http://127.0.0.1:9/x' })
  const res = await tp.app.inject({ method: 'GET', url: '/api/tools/definitions?role=A', headers: { host: '127.0.0.1' } })
  assert.equal(res.statusCode, 422)
  assert.equal(res.json().code, 'TP_ERR_LIMIT_EXCEEDED')
  assert.equal(res.json().details[0].path, 'limits.maxDefinitionsBytes')
})

// ---- docs/protocol.md examples, and more of README "The API" ----------------------------------------

test('docs/protocol.md: the Register example registers, R8\'s and R18\'s answers are the documented ones, and the callback body is R9\'s', async (t) => {
  const callbacks = await startCallbacks()
  t.after(() => callbacks.close())
  const tp = await quiet(t, { roles: ['Lanlan'] })
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  const port = (text: string): string => text.replaceAll('127.0.0.1:9333', `127.0.0.1:${callbacks.port}`)
  const jsonOf = (heading: string, n = 0): Json => JSON.parse(port(codeBlocks(section(PROTOCOL, heading)).filter((b) => b.lang === 'json')[n]?.body as string))
  const registered = await postJson(`${url}/api/tools/register`, jsonOf('Register — `POST /api/tools/register`'))
  assert.equal(registered.status, 200)
  assert.deepEqual(registered.body, jsonOf('Register — `POST /api/tools/register`', 1), 'R8')
  const listed = await (await fetch(`${url}/api/tools?role=Lanlan`)).json() as Json
  assert.deepEqual(listed, jsonOf('List — `GET /api/tools`'), 'R18')
  const r9 = jsonOf('Callback protocol')
  await tp.callTool('Lanlan', { name: 'get_weather', call_id: r9.call_id, raw_arguments: r9.raw_arguments })
  assert.deepEqual(JSON.parse(callbacks.requests.at(-1)?.body as string), r9, 'R9: the body is the documented one')
  // "Errors of the API itself": the 422 example, field by field (its "..." are free text).
  const example = jsonOf('Errors of the API itself')
  const refused = await postJson(`${url}/api/tools/register`, { name: '', callback_url: `${callbacks.origin}/x` })
  assert.equal(refused.status, example.statusCode)
  assert.deepEqual(Object.keys(refused.body), Object.keys(example))
  // details[].code is left out here: the name's is `custom`, not the example's `too_small` (a regression test below).
  const free = (d: Json): Json => ({ ...d, message: '...', code: '-' })
  assert.deepEqual({ ...refused.body, message: '...', details: refused.body.details.map(free) }, { ...example, details: example.details.map(free) })
})

test('README "The API" table and docs/protocol.md "Routes": every route the server has is documented, and every documented one exists', async (t) => {
  const tp = await quiet(t, { roles: ['A'] })
  await tp.app.ready()
  const real = tp.app.printRoutes({ commonPrefix: false })
  const documented = new Set<string>()
  const rows = tableAfter(section(README, 'The API'), '| Method | Path | Body / query | Answer |')
  for (const row of rows) for (const path of names(row[1] as string)) documented.add(path.replace('<role>', ':role'))
  for (const m of PROTOCOL.matchAll(/`(?:GET |POST )?(\/[a-z/.:<>]*)`/g)) documented.add((m[1] as string).replace('<role>', ':role'))
  // printRoutes' tree, flattened into paths.
  const paths: string[] = []
  const stack: Array<[number, string]> = []
  for (const line of real.split('\n')) {
    const m = /^([│ ]*)(?:[└├]── )(\S+)/.exec(line)
    if (m === null) continue
    const depth = (m[1] as string).length
    while (stack.length > 0 && (stack.at(-1) as [number, string])[0] >= depth) stack.pop()
    const path = (stack.at(-1)?.[1] ?? '') + (m[2] as string)
    stack.push([depth, path])
    paths.push(path.replace(/(.)\/$/, '$1'))
  }
  // Served files under the documented `/ui/` and the Swagger UI's own files under `/docs`.
  const undocumented = paths.filter((path) => !documented.has(path) && !/^\/(ui|docs)(\/.|\*|$)/.test(path))
  assert.deepEqual(undocumented, [])
  const served = (path: string): boolean =>
    paths.includes(path) || paths.some((p) => p.endsWith('*') && path.startsWith(p.slice(0, -1)))
  const missing = [...documented].filter((path) => path.startsWith('/') && !served(path))
  assert.deepEqual(missing, [], 'documented routes the server does not have')
})

test('README "Errors": every code of the table is answered with its status, as JSON with the security headers (library codes thrown with theirs)', async (t) => {
  const table = tableAfter(section(README, 'Errors'), '| code | status | when |')
  const statusOf = new Map(table.map((row) => [names(row[0] as string)[0] as string, Number(row[1])]))
  const seen = new Map<string, number>()
  const note = (code: string, status: number): void => { seen.set(code, status) }
  const KEY = 'k'.repeat(32)
  const tp = await quiet(t, {
    roles: ['A'],
    security: { token: 'T'.repeat(32), enforceOwnership: true },
    limits: { maxToolsPerSource: 1 },
    events: { maxSubscribers: 1 }
  })
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  const auth = { authorization: `Bearer ${'T'.repeat(32)}` }
  const send = async (path: string, body?: unknown, headers: Record<string, string> = {}): Promise<void> => {
    const res = await request(url + path, {
      method: body === undefined ? 'GET' : 'POST',
      headers: { ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
      ...(body === undefined ? {} : { body: JSON.stringify(body) })
    })
    const answer = await res.body.json() as Json
    assert.equal(res.headers['x-content-type-options'], 'nosniff')
    assert.equal(res.headers['cache-control'], 'no-store')
    if (res.statusCode === 401 || res.statusCode === 403) assert.equal(res.headers.connection, 'close', `${answer.code} closes`)
    if (answer.ok === false) note(answer.code, res.statusCode)
  }
  await send('/api/tools')
  await send('/api/tools/register', { name: 'a', callback_url: 'http://127.0.0.1:9/a', source: 'plugin:p' }, auth)
  await send('/api/tools/register', { name: 'a', callback_url: 'http://127.0.0.1:9/a', source: 'plugin:p' }, { ...auth, 'x-toolport-plugin-key': KEY })
  await send('/api/tools/register', { name: 'a', callback_url: 'http://127.0.0.1:9/a', source: 'plugin:p' }, { ...auth, 'x-toolport-plugin-key': 'q'.repeat(32) })
  await send('/api/tools/register', { name: 'b', callback_url: 'http://127.0.0.1:9/b', source: 'plugin:p' }, { ...auth, 'x-toolport-plugin-key': KEY })
  await send('/mcp/Nobody', { jsonrpc: '2.0', id: 1, method: 'initialize', params: {} }, { ...auth, accept: 'application/json, text/event-stream' })
  const held = new AbortController()
  await fetch(`${url}/api/events`, { headers: auth, signal: held.signal })
  await send('/api/events', undefined, auth)
  held.abort()
  // A request Node's parser cannot read: "400 … as JSON with the headers above and Connection: close".
  const raw = await within(new Promise<string>((resolve) => {
    const socket = connect(Number(new URL(url).port), '127.0.0.1', () => { socket.end('POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: x\r\n\r\n') })
    let text = ''
    socket.setEncoding('utf8').on('data', (chunk: string) => { text += chunk }).on('close', () => { resolve(text) })
  }), 'the answer to an unreadable request', GUARD_MS)
  assert.match(raw, /^HTTP\/1\.1 400 /)
  assert.match(raw, /\r\nX-Content-Type-Options: nosniff\r\n/i)
  assert.match(raw, /\r\nConnection: close\r\n/i)
  const rawBody = JSON.parse(raw.slice(raw.indexOf('\r\n\r\n') + 4)) as Json
  note(rawBody.code, rawBody.statusCode)
  // The library's codes: thrown, with the table's status.
  for (const attempt of [() => tp.roles.add('A'), () => parseOptions({ port: -1 })]) {
    try {
      attempt()
    } catch (err) {
      note((err as Json).code, (err as Json).statusCode)
    }
  }
  await tp.close()
  const closed = await tp.register({}).catch((err: Json) => err)
  note(closed.code, closed.statusCode)
  for (const [code, status] of seen) assert.equal(status, statusOf.get(code), `${code}`)
  // The rest are answered over the standalone server in the walk-through test; TP_ERR_NOT_LOOPBACK
  // needs another host (netns.test.ts) and TP_ERR_INTERNAL a bug.
  for (const code of ['TP_ERR_UNAUTHORIZED', 'TP_ERR_PLUGIN_KEY_REQUIRED', 'TP_ERR_NOT_OWNER', 'TP_ERR_LIMIT_EXCEEDED',
    'TP_ERR_ROLE_NOT_FOUND', 'TP_ERR_STREAM_FULL', 'TP_ERR_BAD_REQUEST', 'TP_ERR_ROLE_EXISTS', 'TP_ERR_CONFIG', 'TP_ERR_CLOSED']) {
    assert.ok(seen.has(code), `${code} was answered: ${JSON.stringify([...seen])}`)
  }
})

test('README "Live events" → HEAD: it answers the GET\'s headers and takes no subscriber slot; outside ownership mode a plugin key is ignored', async (t) => {
  const tp = await quiet(t, { roles: ['A'], events: { maxSubscribers: 1 } })
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  for (let i = 0; i < 3; i++) {
    const head = await fetch(`${url}/api/events`, { method: 'HEAD' })
    assert.equal(head.status, 200)
    assert.match(head.headers.get('content-type') ?? '', /^text\/event-stream/)
  }
  const frames = await readEvents(`${url}/api/events`, (fs) => fs.some((f) => f.event === 'hello'))
  assert.equal(frames.find((f) => f.event === 'hello')?.event, 'hello', 'the one slot was still free')
  const res = await postJson(`${url}/api/tools/register`, { name: 't', callback_url: 'http://127.0.0.1:9/x' }, { 'x-toolport-plugin-key': 'short' })
  assert.equal(res.status, 200, 'README "Ownership mode": outside ownership mode Toolport ignores the key')
})

/**
 * A shape of the README's format tables (`[{ type: 'function', name, x? }]`) as JSON: shorthand keys
 * are null, `x?` optional.
 */
function shapeOf (text: string): Json {
  const json = text.replace(/'([^']*)'/g, '"$1"')
    .replace(/([{,]\s*)(\w+)(\??)(?=\s*[,}])/g, '$1"$2$3": null')
    .replace(/([{,]\s*)(\w+)\s*:/g, '$1"$2":')
  return JSON.parse(json)
}

/** `actual` has the shape: the same keys (optional ones may be missing), the same string constants. */
function hasShape (actual: unknown, shape: unknown, at: string): void {
  if (shape === null) return
  if (Array.isArray(shape)) {
    assert.ok(Array.isArray(actual), `${at} is an array`)
    for (const [i, item] of actual.entries()) hasShape(item, shape[0], `${at}[${i}]`)
    return
  }
  if (typeof shape === 'object') {
    assert.ok(typeof actual === 'object' && actual !== null, `${at} is an object`)
    const wanted = Object.keys(shape)
    const required = wanted.filter((k) => !k.endsWith('?'))
    const allowed = wanted.map((k) => k.replace(/\?$/, ''))
    for (const key of required) assert.ok(key in actual, `${at}.${key}`)
    for (const key of Object.keys(actual)) assert.ok(allowed.includes(key), `${at}.${key} is documented`)
    for (const key of wanted) if (key.replace(/\?$/, '') in actual) hasShape((actual as Json)[key.replace(/\?$/, '')], (shape as Json)[key], `${at}.${key}`)
    return
  }
  assert.equal(actual, shape, at)
}

test('README "Definitions for your own LLM loop" and "Tool results for your own LLM loop": each format\'s documented shape is what toolDefinitions and toolResultBlock return', async (t) => {
  const tp = await quiet(t, { roles: ['A'] })
  await tp.register({ name: 'get_weather', description: 'd', callback_url: 'http://127.0.0.1:9/x' })
  const definitions = tableAfter(section(README, 'Definitions for your own LLM loop'), '| format | shape |')
  for (const row of definitions) {
    const format = names(row[0] as string)[0] as 'mcp'
    hasShape(toolDefinitions(tp.roles.get('A'), format), shapeOf(/`([^`]+)`/.exec(row[1] as string)?.[1] as string), format)
    // "frozen; memoised until the next change"
    assert.equal(toolDefinitions(tp.roles.get('A'), format), toolDefinitions(tp.roles.get('A'), format), `${format} is memoised`)
  }
  const results = tableAfter(section(README, 'Tool results for your own LLM loop'), '| format | shape |')
  const plain = { is_error: true, output: null, error: 'no', text: '{"error":"no"}' }
  for (const row of results) {
    const format = names(row[0] as string)[0] as 'anthropic'
    hasShape(toolResultBlock(plain, format, 'call_1'), shapeOf(/`([^`]+)`/.exec(row[1] as string)?.[1] as string), format)
  }
})

test('README "MCP: one endpoint per role": the client configurations parse, and the bridge command they run exists', () => {
  const part = section(README, 'MCP: one endpoint per role')
  const configs = codeBlocks(part).filter((b) => b.lang === 'json').map((b) => JSON.parse(b.body) as Json)
  assert.equal(configs.length, 4)
  for (const config of configs) {
    for (const server of Object.values(config.mcpServers ?? config.servers) as Json[]) {
      if (server.url !== undefined) assert.match(server.url, /^http:\/\/127\.0\.0\.1:3917\/mcp\/Lanlan$/)
      const script = server.args?.[0]
      if (typeof script === 'string' && script.startsWith('/path/to/toolport/')) {
        assert.ok(existsSync(join(ROOT, script.slice('/path/to/toolport/'.length))), `${script} (after npm run build)`)
        assert.equal(script.slice('/path/to/toolport/'.length), JSON.parse(doc('package.json')).bin.toolport, 'the package\'s bin')
      }
    }
  }
})

// ---- Links and file references ---------------------------------------------------------------------

/** GitHub's heading anchors of a markdown file. */
function anchors (text: string): Set<string> {
  const out = new Set<string>()
  const count = new Map<string, number>()
  let inCode = false
  for (const line of text.split('\n')) {
    if (line.startsWith('```')) inCode = !inCode
    const m = inCode ? null : /^#{1,6} (.*)$/.exec(line)
    if (m === null) continue
    const slug = (m[1] as string).replace(/\[([^\]]*)\]\([^)]*\)/g, '$1').toLowerCase()
      .replace(/[^\p{L}\p{N}\- _]/gu, '').replace(/ /g, '-')
    const n = count.get(slug) ?? 0
    count.set(slug, n + 1)
    out.add(n === 0 ? slug : `${slug}-${n}`)
  }
  return out
}

test('every document: relative links resolve to files and headings, and every file path named in backticks exists', () => {
  const docs = ['README.md', 'docs/protocol.md', 'docs/architecture.md', 'SECURITY.md', 'python/README.md', 'CHANGELOG.md']
  const broken: string[] = []
  for (const file of docs) {
    const text = doc(file).replace(/^```[\s\S]*?^```$/gm, '')
    for (const m of text.matchAll(/\]\(([^)\s]+)\)/g)) {
      const target = m[1] as string
      if (/^[a-z]+:/.test(target)) continue
      const [path, hash] = target.split('#') as [string, string | undefined]
      const resolved = path === '' ? join(ROOT, file) : join(ROOT, dirname(file), path)
      if (!existsSync(resolved)) broken.push(`${file}: ${target}`)
      else if (hash !== undefined && resolved.endsWith('.md') && !anchors(readFileSync(resolved, 'utf8')).has(hash)) broken.push(`${file}: ${target} (heading)`)
    }
    for (const m of text.matchAll(/`((?:src|test|docs|bench|python|examples|scripts|assembly|console)\/[\w./-]+\.(?:ts|mjs|js|md|py|sh|txt|toml|json|svg|png))`/g)) {
      if (!existsSync(join(ROOT, m[1] as string))) broken.push(`${file}: \`${m[1] as string}\``)
    }
  }
  assert.deepEqual(broken, [])
})

// ---- Regressions: the disagreements this file found (each FAILS until fixed) -----------------------

test('regression: a tool name of 0 or more than 64 code points is refused with details code too_small / too_big, as docs/protocol.md\'s 422 example shows (README "The API" → Fields)', async (t) => {
  const tp = await quiet(t, { roles: ['A'] })
  for (const [name, code] of [['', 'too_small'], ['n'.repeat(65), 'too_big']] as const) {
    const err = await tp.register({ name, callback_url: 'http://127.0.0.1:9/x' }).catch((e: Json) => e)
    assert.equal(err.code, 'TP_ERR_VALIDATION')
    assert.deepEqual(err.details.map((d: Json) => [d.path, d.code]), [['name', code]], JSON.stringify(name.length))
  }
})

test('regression: tp.register keeps its own copy of `parameters`: a caller that changes its object afterwards changes nothing the models see (README "Embedding: the library", as for registerLocalTool)', async (t) => {
  const tp = await quiet(t, { roles: ['A'] })
  const parameters: Json = { type: 'object', properties: { location: { type: 'string' } } }
  await tp.register({ name: 'get_weather', callback_url: 'http://127.0.0.1:9/x', parameters })
  parameters.properties.location.type = 'number'
  parameters.description = 'x'.repeat(100_000) // past limits.maxParametersBytes, had it been sent
  assert.deepEqual(toolDefinitions(tp.roles.get('A'), 'mcp')[0]?.inputSchema, { type: 'object', properties: { location: { type: 'string' } } })
})

test('regression: toolDefinitions() is frozen all the way down: changing a returned schema (e.g. adding additionalProperties for OpenAI strict mode) cannot change what other sessions and GET /api/tools/definitions see (README "Definitions")', async (t) => {
  const tp = await quiet(t, { roles: ['A'] })
  await tp.register({ name: 'get_weather', callback_url: 'http://127.0.0.1:9/x', parameters: { type: 'object', properties: { location: { type: 'string' } } } })
  const mine = toolDefinitions(tp.roles.get('A'), 'openai-chat') as Json
  try {
    mine[0].function.parameters.additionalProperties = false
    mine[0].function.parameters.properties.location = { type: 'number' }
  } catch { /* frozen: refused, as documented */ }
  const res = await tp.app.inject({ method: 'GET', url: '/api/tools/definitions?role=A&format=anthropic', headers: { host: '127.0.0.1' } })
  assert.deepEqual(res.json().tools[0].input_schema, { type: 'object', properties: { location: { type: 'string' } } })
})

test('regression: createRealtimeSession with a long ackTimeoutMs (Infinity, or past 2^31-1 ms) waits for session.updated instead of failing every sync at once; a NaN or negative one is refused (README "The OpenAI-Realtime adapter")', async (t) => {
  const tp = await quiet(t, { roles: ['A'], syncTimeoutMs: 200 })
  for (const ackTimeoutMs of [Infinity, 2 ** 31]) {
    const sent: Json[] = []
    const session = createRealtimeSession({ toolport: tp, role: 'A', send: (event) => { sent.push(event) }, ackTimeoutMs, attach: false })
    t.after(() => { session.close() })
    const outcome = tp.roles.get('A').replaceSessions([], [session])
    await new Promise((resolve) => setTimeout(resolve, 50))
    // Acknowledge the update: the sync must succeed, having waited for it.
    const update = sent.find((e) => e.type === 'session.update')
    session.handleServerEvent({ type: 'session.updated', event_id: 'srv', session: update?.session })
    const result = await outcome
    assert.equal(result.ok, true, `ackTimeoutMs ${ackTimeoutMs}: ${String(result.error)}`)
    session.close()
  }
  for (const ackTimeoutMs of [Number.NaN, -1]) {
    assert.throws(() => createRealtimeSession({ toolport: tp, role: 'A', send: () => {}, ackTimeoutMs, attach: false }),
      (err: Json) => err.code === 'TP_ERR_CONFIG', `ackTimeoutMs ${ackTimeoutMs}`)
  }
})

test('regression: plugin.stop({ graceMs: Infinity }) lets a call in flight finish, as the Python SDK\'s stop(grace=inf) does (README "Plugin SDK" → Start and stop)', async (t) => {
  const tp = await quiet(t, { roles: ['A'] })
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  let release: () => void = () => {}
  const gate = new Promise<void>((resolve) => { release = resolve })
  let entered: () => void = () => {}
  const inHandler = new Promise<void>((resolve) => { entered = resolve })
  const plugin = createPlugin({
    toolportUrl: url,
    source: 'plugin:slow',
    logger: false,
    watchEvents: false,
    tools: { slow: { handler: async () => { entered(); await gate; return 'done' } } }
  })
  await plugin.start()
  const call = tp.callTool('A', { name: 'slow', arguments: {} })
  await within(inHandler, 'the handler to run', GUARD_MS)
  const stopped = plugin.stop({ graceMs: Infinity })
  await new Promise((resolve) => setTimeout(resolve, 100))
  release()
  const result = await within(call, 'the call', GUARD_MS)
  await stopped
  assert.equal(result.is_error, false, result.text)
  assert.equal(result.output, 'done')
})

test('regression: /openapi.json lists 503 (TP_ERR_CLOSED) for the /api/tools routes, which answer it once the runtime is closed (docs/protocol.md "Errors of the API itself")', async (t) => {
  const tp = await createToolport({ roles: ['A'], logger: false, dispatch: { mode: 'inline' } })
  const host = fastify()
  t.after(async () => { await host.close(); await tp.close() })
  await host.register(toolportPlugin, { runtime: tp })
  await host.ready()
  const spec = (await tp.app.inject({ method: 'GET', url: '/openapi.json', headers: { host: '127.0.0.1' } })).json() as Json
  await tp.close()
  const json = { 'content-type': 'application/json', host: '127.0.0.1' }
  const requests: Array<[string, string, string, unknown]> = [
    ['post', '/api/tools/register', '/api/tools/register', { name: 't', callback_url: 'http://127.0.0.1:9/x' }],
    ['post', '/api/tools/unregister', '/api/tools/unregister', { name: 't' }],
    ['post', '/api/tools/clear', '/api/tools/clear', { source: 'external' }],
    ['get', '/api/tools', '/api/tools', undefined],
    ['post', '/api/tools/call', '/api/tools/call', { role: 'A', name: 't' }],
    ['get', '/api/tools/definitions', '/api/tools/definitions?role=A', undefined],
    ['get', '/api/health', '/api/health', undefined]
  ]
  const missing: string[] = []
  for (const [method, path, url, payload] of requests) {
    const res = await host.inject({ method: method.toUpperCase() as 'GET', url, headers: json, ...(payload === undefined ? {} : { payload: payload as Json }) })
    const listed = Object.keys(spec.paths[path]?.[method]?.responses ?? {})
    if (!listed.includes(String(res.statusCode))) missing.push(`${method.toUpperCase()} ${path} answered ${res.statusCode} (${String(res.json().code ?? res.json().status)}), listed: ${listed.join(',')}`)
  }
  assert.deepEqual(missing, [])
})

test('regression: `toolport serve --help` names the variable of every option that has one (TOOLPORT_TOKEN_FILE for --token-file, TOOLPORT_DISPATCH_MODE for --inline), as README "The command" lists them', async () => {
  const help = (await runMain(['serve', '--help'])).stdout
  const serveSection = help.slice(help.indexOf('Options for serve:'), help.indexOf('Options for mcp:'))
  const missing = ['TOOLPORT_HOST', 'TOOLPORT_PORT', 'TOOLPORT_ROLES', 'TOOLPORT_CONFIG', 'TOOLPORT_LOG_LEVEL', 'TOOLPORT_DISPATCH_MODE', 'TOOLPORT_TOKEN_FILE']
    .filter((name) => !serveSection.includes(name))
  assert.deepEqual(missing, [])
})

test('regression: `toolport` with no command is a usage mistake like any other: exit 2 with a `toolport: …` line on stderr, nothing on stdout (README "The command")', async () => {
  const bare = await runMain([])
  assert.equal(bare.code, 2)
  assert.match(bare.stderr, /^toolport: /)
  assert.equal(bare.stdout, '')
})
