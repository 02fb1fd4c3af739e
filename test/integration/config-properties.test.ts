// A model test of configuration: the options of `createToolport()`, the `toolport serve` flags,
// environment variables and `--config` file, and the `toolport mcp` bridge's arguments.
//
// The MODEL is what the documents promise:
// - README "Configuration": the table of options and their defaults (the table, the zod schema and
//   the defaults `parseOptions({})` applies must agree); README "Errors": invalid options are
//   `TP_ERR_CONFIG` ("library: invalid options"), and `parseOptions` names every bad field by its
//   dotted path. A valid option object starts a Toolport whose `options` are exactly the
//   documented defaults overlaid with what was asked (nothing clamped, nothing dropped), and whose
//   observable behaviour follows them (roles, dispatch mode, `/metrics`, the console, token mode).
// - README "The command" and `toolport --help`: the flags and TOOLPORT_* variables; "flags win
//   over the environment, which wins over the config file"; a bad value makes the command exit
//   non-zero without serving, with a `toolport: …` message on stderr that names the setting.
// - README "MCP" (`toolport mcp --role NAME [--url …] [--token-file FILE]`): `--url` defaults to
//   TOOLPORT_URL, then http://127.0.0.1:3917; stdout carries the protocol only; an unknown role
//   exits 1 (TP_ERR_ROLE_NOT_FOUND); an unreachable Toolport is not an error.
// - SECURITY.md "Inbound": the server binds 127.0.0.1 by default; a non-loopback address needs
//   `security.allowNonLoopbackBind` (CLI `--allow-non-loopback-bind`) and still refuses every
//   non-loopback peer.
//
// The tests at the end are the bugs this file found, each shrunk to one case; they FAIL until the
// bug is fixed. The properties are not narrowed around them, so some properties fail with those
// bugs too (the token property on a whitespace-edged token, the mcp property on an unparsable
// TOOLPORT_URL, the listen property on ::ffff:127.0.0.1, the serve property, now and then, on a
// `--config` file's non-list `roles` or null `logger`).
// TP_PROPERTY_RUNS=N multiplies the runs of each property (the default fits ~15 s).
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { EventEmitter, once } from 'node:events'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { readFileSync } from 'node:fs'
import { createServer, type AddressInfo, type Server } from 'node:net'
import { networkInterfaces, tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { PassThrough } from 'node:stream'
import { fileURLToPath } from 'node:url'
import fc from 'fast-check'
import { z } from 'zod'
import { request as httpRequest } from 'undici'
import { main } from '../../src/main/cli.js'
import { optionsSchema, parseOptions } from '../../src/main/config.js'
import { ENVIRONMENT } from '../../src/main/environment.js'
import { createToolport, type Toolport } from '../../src/main/index.js'
import { checkProperty as check, startToolport, toolportCliArgs, within } from '../helpers.js'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const README = readFileSync(join(ROOT, 'README.md'), 'utf8')
const FAILING_TIMEOUT_MS = 600_000
const GUARD_MS = 20_000

type Json = any

/** Runs per property: TP_PROPERTY_RUNS=N hunts N times longer. */
function runs (n: number): number {
  return Math.max(1, Math.round(n * Number(process.env.TP_PROPERTY_RUNS ?? 1)))
}

// ---- The documented option table and the schema -----------------------------------------------

/** README "Configuration": option path → documented default (undefined for "unset"). */
function readmeOptionTable (): Map<string, unknown> {
  const section = README.slice(README.indexOf('\n## Configuration'), README.indexOf('\n## Errors'))
  const table = new Map<string, unknown>()
  for (const line of section.split('\n')) {
    const row = /^\| `([A-Za-z.]+)` \| ([^|]*) \|/.exec(line)
    if (row === null) continue
    const cell = (row[2] as string).trim()
    let value: unknown
    if (cell.startsWith('unset')) value = undefined
    else {
      const literal = /^`([^`]*)`/.exec(cell)?.[1] ?? cell
      try { value = JSON.parse(literal) } catch { value = literal }
    }
    table.set(row[1] as string, value)
  }
  return table
}

const JSON_SCHEMA: Json = z.toJSONSchema(optionsSchema, { io: 'input', unrepresentable: 'any' })
const GROUPS = Object.keys(JSON_SCHEMA.properties).filter((k) => JSON_SCHEMA.properties[k].type === 'object')

/** Every leaf option of the schema: dotted path → its JSON schema. */
function schemaLeaves (): Map<string, Json> {
  const leaves = new Map<string, Json>()
  for (const [key, schema] of Object.entries<Json>(JSON_SCHEMA.properties)) {
    if (GROUPS.includes(key)) {
      for (const [inner, leaf] of Object.entries<Json>(schema.properties)) leaves.set(`${key}.${inner}`, leaf)
    } else leaves.set(key, schema)
  }
  return leaves
}

const LEAVES = schemaLeaves()
const DOC_DEFAULTS = readmeOptionTable()

function getPath (object: Json, path: string): unknown {
  return path.split('.').reduce<Json>((o, k) => (o === undefined || o === null ? undefined : o[k]), object)
}

function setPath (object: Json, path: string, value: unknown): void {
  const keys = path.split('.')
  let o = object
  for (const key of keys.slice(0, -1)) {
    if (typeof o[key] !== 'object' || o[key] === null || Array.isArray(o[key])) o[key] = {}
    o = o[key]
  }
  // defineProperty: an own key even for `__proto__`.
  Object.defineProperty(o, keys.at(-1) as string, { value, enumerable: true, writable: true, configurable: true })
}

/** The documented defaults overlaid with `given` (the effective options the model expects). */
function expectedOptions (given: Json): Json {
  const out: Json = {}
  for (const group of GROUPS) out[group] = {}
  for (const [path, value] of DOC_DEFAULTS) if (value !== undefined) setPath(out, path, value)
  for (const path of LEAVES.keys()) {
    const value = getPath(given, path)
    if (value !== undefined) setPath(out, path, value)
  }
  // README: the default reserve is 64, at most `maxConnections - 1`.
  if (getPath(given, 'limits.reservedConnections') === undefined) {
    out.limits.reservedConnections = Math.min(out.limits.reservedConnections, out.limits.maxConnections - 1)
  }
  return out
}

test('config: the README table, the zod schema and the defaults parseOptions applies agree', () => {
  const documented = [...DOC_DEFAULTS.keys()].sort()
  const schema = [...LEAVES.keys()].sort()
  assert.deepEqual(documented.filter((k) => !LEAVES.has(k)), [], 'options documented but not in the schema')
  assert.deepEqual(schema.filter((k) => !DOC_DEFAULTS.has(k)), [], 'options in the schema but not documented')
  const defaults = parseOptions({})
  for (const path of schema) {
    assert.deepEqual(getPath(defaults, path), DOC_DEFAULTS.get(path), `the default of ${path}`)
  }
})

// ---- The CLI in-process (main), as cli.test.ts drives it ----------------------------------------

interface Run {
  exited: Promise<number>
  stdout: string[]
  lines: EventEmitter
  stderr: () => string
  stop: () => void
  stdin: PassThrough
}

/** Runs `main(args, io)` with its own streams and only `env`; stopped in t.after. */
function runMain (t: TestContext, args: string[], env: Record<string, string> = {}): Run {
  const out = new PassThrough()
  const err = new PassThrough()
  const stdin = new PassThrough()
  const controller = new AbortController()
  const code = main(args, { stdin, stdout: out, stderr: err, env: { ...env }, stop: controller.signal })
  const stdout: string[] = []
  const lines = new EventEmitter()
  createInterface({ input: out }).on('line', (line) => { stdout.push(line); lines.emit('line', line) })
  let stderr = ''
  err.setEncoding('utf8')
  err.on('data', (chunk: string) => { stderr += chunk })
  const exited = code.then(async (c) => {
    out.end(); err.end()
    await Promise.all([once(out, 'end'), once(err, 'end')])
    return c
  })
  t.after(async () => { controller.abort('SIGTERM'); stdin.end(); await exited })
  return { exited, stdout, lines, stderr: () => stderr, stop: () => controller.abort('SIGTERM'), stdin }
}

const LISTENING = /^Toolport listening on http:\/\/(.+):(\d+) \(roles: (.*); dispatch: (pool|inline)/

/** The listening line, or null once the command exited without one. */
async function listeningOrExit (run: Run): Promise<RegExpExecArray | null> {
  let onLine: (line: string) => void = () => {}
  const found = new Promise<RegExpExecArray>((resolve) => {
    onLine = (line) => { const m = LISTENING.exec(line); if (m !== null) resolve(m) }
    for (const line of run.stdout) onLine(line)
    run.lines.on('line', onLine)
  })
  try {
    return await within(Promise.race([found, run.exited.then(() => null)]), 'the command to listen or exit', GUARD_MS)
  } finally {
    run.lines.off('line', onLine)
  }
}

async function tempDir (t: TestContext): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'toolport-config-props-'))
  t.after(() => rm(dir, { recursive: true, force: true }))
  return dir
}

test('config: --help, the README synopsis and the flags serve and mcp accept agree; so do the TOOLPORT_* variables', async (t) => {
  const help = runMain(t, ['--help'])
  assert.equal(await help.exited, 0)
  const usage = help.stdout.join('\n')
  const serveSection = usage.slice(usage.indexOf('Options for serve:'), usage.indexOf('Options for mcp:'))
  const mcpSection = usage.slice(usage.indexOf('Options for mcp:'), usage.indexOf('Environment:'))
  const flagsOf = (text: string): Map<string, boolean> => {
    const flags = new Map<string, boolean>()
    for (const m of text.matchAll(/^ {2}(?:-h, )?(--[a-z-]+)( [A-Z]+)?/gm)) flags.set(m[1] as string, m[2] !== undefined)
    flags.delete('--help')
    return flags
  }
  const serveFlags = flagsOf(serveSection)
  const mcpFlags = flagsOf(mcpSection)

  const command = README.slice(README.indexOf('\n## The command'), README.indexOf('\n## Configuration'))
  const synopsis = /```\n(toolport serve[\s\S]*?)```/.exec(command)?.[1] ?? ''
  assert.deepEqual([...new Set(synopsis.match(/--[a-z-]+/g))].sort(), [...serveFlags.keys()].sort(),
    'README "The command" synopsis vs --help (serve)')
  const mcpSynopsis = /^toolport mcp (.*)$/m.exec(README)?.[1] ?? ''
  assert.deepEqual([...new Set(mcpSynopsis.match(/--[a-z-]+/g))].sort(), [...mcpFlags.keys()].sort(),
    'README mcp synopsis vs --help (mcp)')

  // Every listed flag is one the command accepts (parsed strictly before --help is honoured).
  for (const [command, flags] of [['serve', serveFlags], ['mcp', mcpFlags]] as const) {
    for (const [flag, takesValue] of flags) {
      const run = runMain(t, [command, flag, ...(takesValue ? ['x'] : []), '--help'])
      assert.equal(await run.exited, 0, `${command} ${flag}: ${run.stderr()}`)
    }
  }

  // The environment: the usage line, the ENVIRONMENT table and the README name the same variables.
  const envLine = /^Environment: (.*)$/m.exec(usage)?.[1] ?? ''
  assert.deepEqual(envLine.split(', ').sort(), Object.keys(ENVIRONMENT).sort())
  // (the "Development" section's TOOLPORT_TEST_* knobs are the test runner's, not the command's)
  const userDocs = README.slice(0, README.indexOf('\n## Development'))
  assert.deepEqual([...new Set(userDocs.match(/TOOLPORT_[A-Z_]+/g))].sort(), Object.keys(ENVIRONMENT).sort())
})

// ---- Library options: valid objects ------------------------------------------------------------

/** A valid role name: `.` and `..` are none (README "Configuration": a URL cannot name them). */
const ROLE_NAME = fc.string({ minLength: 1, maxLength: 12 }).filter((name) => name !== '.' && name !== '..')
const TOKEN_CHARS = fc.constantFrom(...'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~+/')

/** A value the schema leaf accepts (integers over their whole range, edges included). */
function validValue (path: string, leaf: Json): fc.Arbitrary<unknown> {
  if (path === 'roles') return fc.uniqueArray(ROLE_NAME, { maxLength: 3 })
  if (path === 'host') return fc.constantFrom('127.0.0.1', 'localhost', '::1', '127.0.0.2')
  if (path === 'logger') return fc.constantFrom(false, 'silent', 'fatal')
  if (path === 'dispatch.mode') return fc.constantFrom('inline', 'inline', 'inline', 'pool')
  if (path === 'security.token') return fc.string({ unit: TOKEN_CHARS, minLength: 32, maxLength: 40 })
  // Allow-lists hold entries as a request carries them (README "Configuration").
  if (path === 'security.allowedOrigins') {
    return fc.array(fc.constantFrom('http://localhost:5173', 'https://app.example', 'chrome-extension://abcdef'), { maxLength: 2 })
  }
  if (path === 'security.allowedHosts') return fc.array(fc.constantFrom('dev.test', 'xn--bcher-kva.example', '[::2]', '10.0.0.2'), { maxLength: 2 })
  if (leaf.type === 'integer' || leaf.type === 'number') {
    const { minimum: min, maximum: max } = leaf as { minimum: number, maximum: number }
    return fc.oneof(fc.constantFrom(min, max), fc.integer({ min, max: Math.min(max, 2 ** 31 - 1) }))
  }
  if (leaf.type === 'boolean') return fc.boolean()
  if (leaf.type === 'array') return fc.array(fc.string({ minLength: 1, maxLength: 8 }), { maxLength: 2 })
  if (Array.isArray(leaf.enum)) return fc.constantFrom(...leaf.enum)
  throw new Error(`no generator for ${path}`)
}

/** A valid option object: a random subset of the leaves, each with a valid value. */
const validOptions: fc.Arbitrary<Json> = fc.array(fc.constantFrom(...LEAVES.keys()), { maxLength: 12 })
  .chain((paths) => {
    const unique = [...new Set(paths)]
    return fc.tuple(...unique.map((p) => validValue(p, LEAVES.get(p)))).map((values) => {
      const options: Json = {}
      unique.forEach((p, i) => { setPath(options, p, values[i]) })
      // Pool mode with many threads would start dozens of workers per run: bound it (a valid value).
      if (options.dispatch?.mode === 'pool' && (options.dispatch.threads ?? 1) > 2) options.dispatch.threads = 2
      if (options.dispatch?.mode === undefined) setPath(options, 'dispatch.mode', 'inline')
      if (options.logger === undefined) options.logger = false
      // A reserve the caller sets must stay under maxConnections (README "Configuration"): keep the pair valid.
      const limits = options.limits
      if (limits?.reservedConnections !== undefined && limits.reservedConnections >= (limits.maxConnections ?? 1024)) {
        limits.reservedConnections = (limits.maxConnections ?? 1024) - 1
      }
      return options
    })
  })

test('config: property: a valid option object starts a Toolport whose options are the documented defaults overlaid with it, and behave so', { timeout: FAILING_TIMEOUT_MS }, async () => {
  await check(fc.asyncProperty(validOptions, async (given) => {
    const snapshot = structuredClone(given)
    const tp = await within(createToolport(given), 'createToolport', GUARD_MS)
    try {
      assert.deepEqual(given, snapshot, 'createToolport must not change the caller\'s object')
      assert.deepEqual(JSON.parse(JSON.stringify(tp.options)), JSON.parse(JSON.stringify(expectedOptions(given))))
      assert.deepEqual(tp.roles.names(), given.roles ?? [])
      assert.equal(tp.health().dispatch.mode, given.dispatch.mode)
      const headers: Record<string, string> = {}
      if (given.security?.token !== undefined) headers.authorization = `Bearer ${given.security.token as string}`
      const metrics = await tp.app.inject({ method: 'GET', url: '/metrics', headers })
      assert.equal(metrics.statusCode, given.metrics === false ? 404 : 200, `/metrics ${metrics.body.slice(0, 200)}`)
      const page = await tp.app.inject({ method: 'GET', url: '/ui/', headers })
      assert.equal(page.statusCode === 404, given.console === false, `/ui/ answered ${page.statusCode}`)
      if (given.security?.token !== undefined) {
        const without = await tp.app.inject({ method: 'GET', url: '/api/tools' })
        assert.equal(without.statusCode, 401)
      }
    } finally {
      await tp.close()
    }
  }), { numRuns: runs(40) })
})

// ---- Library options: invalid objects ----------------------------------------------------------

interface Bad { path: string, value: unknown, names: string }

function show (value: unknown): string {
  if (typeof value === 'symbol' || typeof value === 'bigint') return `${String(value)} (${typeof value})`
  return JSON.stringify(value) ?? String(value)
}

/** Values the leaf refuses: wrong types, out of range, NaN/Infinity, fractions, numeric strings. */
function invalidValue (path: string, leaf: Json): fc.Arbitrary<unknown> {
  const common = [null, [], {}, Symbol.for('x')]
  if (leaf.type === 'integer' || leaf.type === 'number') {
    const { minimum: min, maximum: max } = leaf as { minimum: number, maximum: number }
    return fc.constantFrom<unknown>(min - 1, max + 1, min + 0.5, NaN, Infinity, -Infinity, Number.MAX_VALUE, -1e21,
      String(min), `${max}`, true, 2n ** 70n, ...common)
  }
  if (leaf.type === 'boolean') return fc.constantFrom<unknown>('true', 'false', 1, 0, 'yes', ...common)
  if (path === 'roles') {
    return fc.constantFrom<unknown>('default', [''], ['x'.repeat(129)], [1], [null], 'a,b', null, {}, Symbol.for('x'))
  }
  if (path === 'security.token') {
    // Too short; or long enough but not visible ASCII (README "Configuration": 0x21–0x7E only).
    return fc.constantFrom<unknown>('x'.repeat(31), 'é'.repeat(15), '', 32, 'é'.repeat(32), `${'k'.repeat(32)}\n`,
      `${'k'.repeat(16)} ${'k'.repeat(16)}`, `${'k'.repeat(32)}😀`, `${'k'.repeat(32)}\u007f`, ...common)
  }
  if (path === 'logger') return fc.constantFrom<unknown>('verbose', 'INFO', '', 1, 30, ...common)
  if (path === 'host') return fc.constantFrom<unknown>('', 1, ['127.0.0.1'], ...common)
  if (leaf.type === 'array') return fc.constantFrom<unknown>('a', [''], [1], [null], null, {}, Symbol.for('x'))
  if (Array.isArray(leaf.enum)) return fc.constantFrom<unknown>('bogus', '', String(leaf.enum[0]).toUpperCase(), 1, ...common)
  throw new Error(`no invalid generator for ${path}`)
}

const badLeaf: fc.Arbitrary<Bad> = fc.constantFrom(...LEAVES.keys()).chain((path) =>
  invalidValue(path, LEAVES.get(path)).map((value) => ({ path, value, names: path })))

const UNKNOWN_KEY = fc.oneof(fc.string({ minLength: 1, maxLength: 10 }).filter((k) => !k.includes('.')), fc.constantFrom('__proto__', 'constructor', 'toString', 'Port', 'dispatch_mode'))

/** An unknown key at the root or inside a group (the message must name it). */
const badKey: fc.Arbitrary<Bad> = fc.tuple(fc.constantFrom('', ...GROUPS), UNKNOWN_KEY)
  .filter(([group, key]) => !(group === '' ? key in JSON_SCHEMA.properties : key in JSON_SCHEMA.properties[group].properties))
  .map(([group, key]) => ({ path: group === '' ? key : `${group}.${key}`, value: 1, names: key }))

/** A whole group that is not an object. */
const badGroup: fc.Arbitrary<Bad> = fc.tuple(fc.constantFrom(...GROUPS), fc.constantFrom<unknown>('x', 1, true, null, [], [{}]))
  .map(([group, value]) => ({ path: group, value, names: group }))

test('config: property: an invalid option object is refused with TP_ERR_CONFIG naming the offending path, and no Toolport is left', { timeout: FAILING_TIMEOUT_MS }, async () => {
  await check(fc.asyncProperty(validOptions, fc.oneof(badLeaf, badLeaf, badKey, badGroup), async (base, bad) => {
    const options = structuredClone(base)
    setPath(options, bad.path, bad.value)
    let tp: Toolport | undefined
    let error: any
    try {
      tp = await within(createToolport(options), 'createToolport', GUARD_MS)
    } catch (err) {
      error = err
    } finally {
      await tp?.close()
    }
    assert.ok(tp === undefined, `accepted ${bad.path} = ${show(bad.value)}: options ${JSON.stringify(tp?.options)}`)
    assert.equal(error?.code, 'TP_ERR_CONFIG', `${bad.path}: ${String(error?.message)}`)
    assert.equal(error.statusCode, 500)
    assert.ok(String(error.message).includes(bad.names), `the message names ${bad.names}: ${String(error.message)}`)
    assert.ok(!String(error.message).includes('\n'), 'one line')
  }), { numRuns: runs(150) })
})

test('config: every option refuses every invalid value of its kind (the sweep behind the property: each leaf, each bad value, out-of-range edges included)', async () => {
  const options = { numRuns: 1 }
  for (const [path, leaf] of LEAVES) {
    // Every value the generator can draw for this leaf (constantFrom: sample until all are seen).
    const values = new Set<unknown>()
    for (const v of fc.sample(invalidValue(path, leaf), { ...options, numRuns: 400, seed: 1 })) values.add(v)
    for (const value of values) {
      const given: Json = { logger: false, dispatch: { mode: 'inline' } }
      setPath(given, path, value)
      let tp: Toolport | undefined
      let error: any
      try { tp = await createToolport(given) } catch (err) { error = err } finally { await tp?.close() }
      assert.ok(tp === undefined, `${path} = ${show(value)} accepted`)
      assert.equal(error.code, 'TP_ERR_CONFIG', `${path}: ${String(error.message)}`)
      assert.ok(String(error.message).includes(path), `${path}: ${String(error.message)}`)
    }
  }
})

// ---- Token mode: the configured token is the one that opens the API --------------------------

test('config: property: security.token is accepted exactly when it is visible ASCII (0x21–0x7E), and every accepted one is the one a client can present (Authorization: Bearer <token>)', { timeout: FAILING_TIMEOUT_MS }, async () => {
  // Mostly visible ASCII; now and then a space, a control, Latin-1 or beyond (README "Configuration").
  const unit = fc.oneof(
    { weight: 30, arbitrary: fc.integer({ min: 0x21, max: 0x7e }).map((c) => String.fromCharCode(c)) },
    { weight: 1, arbitrary: fc.constantFrom(' ', '\t', '\n', '\u007f', '\u0000', 'é', '\u00a0', '€', '😀') })
  const token = fc.string({ unit, minLength: 32, maxLength: 40 })
  const tp = await createToolport({ logger: false, dispatch: { mode: 'inline' } })
  await tp.close()
  await check(fc.asyncProperty(token, async (secret) => {
    const isVisibleAscii = /^[\x21-\x7e]+$/.test(secret)
    let tp: Toolport
    try {
      tp = await createToolport({ logger: false, dispatch: { mode: 'inline' }, security: { token: secret } })
    } catch (err: any) {
      assert.equal(err.code, 'TP_ERR_CONFIG')
      assert.match(err.message, /security\.token/)
      assert.equal(isVisibleAscii, false, `the visible ASCII token ${JSON.stringify(secret)} was refused: ${String(err.message)}`)
      return
    }
    assert.equal(isVisibleAscii, true, `the token ${JSON.stringify(secret)} was accepted, though not visible ASCII`)
    try {
      const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
      const res = await httpRequest(`${url}/api/tools`, { headers: { authorization: `Bearer ${secret}` } })
      const body = await res.body.text()
      assert.equal(res.statusCode, 200, `token ${JSON.stringify(secret)} accepted by the options, refused by the API: ${body}`)
    } finally {
      await tp.close()
    }
  }), { numRuns: runs(40) })
})

// ---- The CLI: flags vs environment vs config file ----------------------------------------------

/** A free port on 127.0.0.1 (bound and released; the runs are sequential). */
async function freePort (): Promise<number> {
  const server = createServer()
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const { port } = server.address() as AddressInfo
  server.close()
  await once(server, 'close')
  return port
}

type Setting = 'host' | 'port' | 'roles' | 'logger' | 'mode'
/** How each setting may be named in a message: its option, flag or variable. */
const NAMES: Record<Setting, RegExp> = {
  host: /host|bind/i, port: /port/i, roles: /role/i, logger: /log/i, mode: /dispatch|mode|inline/i
}
interface Source<V> { value: V, valid: boolean }
type Sources = Record<Setting, { config?: Source<unknown>, env?: Source<string>, flag?: Source<unknown> }>

function src<V> (value: V, valid = true): Source<V> { return { value, valid } }

const ROLE = fc.constantFrom('A', 'B', 'Nova', 'Mo chi', 'Ünï')

function cliSources (ports: [number, number]): fc.Arbitrary<Sources> {
  const opt = <T>(arb: fc.Arbitrary<T>): fc.Arbitrary<T | undefined> => fc.option(arb, { nil: undefined, freq: 2 })
  const host = {
    config: opt(fc.oneof(fc.constantFrom('127.0.0.1', '127.0.0.2', 'localhost').map((v) => src<unknown>(v)),
      fc.constantFrom<unknown>('', 5, '0.0.0.0').map((v) => src(v, false)))),
    env: opt(fc.oneof(fc.constantFrom('127.0.0.1', '127.0.0.2', 'localhost').map((v) => src(v)),
      fc.constantFrom('0.0.0.0', '10.255.255.1').map((v) => src(v, false)))),
    flag: opt(fc.oneof(fc.constantFrom('127.0.0.1', '127.0.0.2', 'localhost').map((v) => src<unknown>(v)),
      fc.constantFrom<unknown>('', '0.0.0.0').map((v) => src(v, false))))
  }
  const portValue = fc.constantFrom(0, ...ports)
  const port = {
    config: opt(fc.oneof(portValue.map((v) => src<unknown>(v)), fc.constantFrom<unknown>('80', 70_000, 1.5, -1).map((v) => src(v, false)))),
    env: opt(fc.oneof(portValue.map((v) => src(String(v))), fc.constantFrom('abc', '70000', '-1', '1e3').map((v) => src(v, false)))),
    flag: opt(fc.oneof(portValue.map((v) => src<unknown>(String(v))), fc.constantFrom<unknown>('abc', '70000', '-1').map((v) => src(v, false))))
  }
  const roles = {
    config: opt(fc.oneof(fc.uniqueArray(ROLE, { minLength: 1, maxLength: 3 }).map((v) => src<unknown>(v)),
      fc.constantFrom<unknown>('A', [''], ['x'.repeat(129)], null, 7).map((v) => src(v, false)))),
    env: opt(fc.oneof(fc.uniqueArray(ROLE, { minLength: 2, maxLength: 3 }).map((v) => src(v.join(', '))),
      fc.constant(src('x'.repeat(129), false)))),
    flag: opt(fc.oneof(fc.uniqueArray(ROLE, { minLength: 1, maxLength: 3 }).map((v) => src<unknown>(v)),
      fc.constant(src<unknown>([''], false))))
  }
  const logger = {
    config: opt(fc.oneof(fc.constantFrom<unknown>('silent', 'info', false).map((v) => src(v)),
      fc.constantFrom<unknown>('bogus', 5, null).map((v) => src(v, false)))),
    env: opt(fc.oneof(fc.constantFrom('silent', 'info').map((v) => src(v)), fc.constant(src('loud', false)))),
    flag: opt(fc.oneof(fc.constantFrom<unknown>('silent', 'info').map((v) => src(v)), fc.constant(src<unknown>('INFO', false))))
  }
  const mode = {
    config: opt(fc.oneof(fc.constantFrom<unknown>('pool', 'inline').map((v) => src(v)),
      fc.constantFrom<unknown>('bogus', 'garbage-group').map((v) => src(v, false)))),
    env: opt(fc.oneof(fc.constantFrom('pool', 'inline').map((v) => src(v)), fc.constant(src('threads', false)))),
    // --inline is the only flag; it cannot carry a bad value.
    flag: opt(fc.constant(src<unknown>('inline')))
  }
  return fc.record({
    host: fc.record(host, { requiredKeys: [] }),
    port: fc.record(port, { requiredKeys: [] }),
    roles: fc.record(roles, { requiredKeys: [] }),
    logger: fc.record(logger, { requiredKeys: [] }),
    mode: fc.record(mode, { requiredKeys: [] })
  }) as fc.Arbitrary<Sources>
}

/** The documented winner: the flag, else the variable, else the config file. */
function winner (s: Sources[Setting]): { source: 'flag' | 'env' | 'config', value: unknown, valid: boolean } | undefined {
  if (s.flag !== undefined) return { source: 'flag', ...s.flag }
  if (s.env !== undefined) return { source: 'env', ...s.env }
  if (s.config !== undefined) return { source: 'config', ...s.config }
  return undefined
}

test('config: property: serve settings from flags, TOOLPORT_* variables and --config resolve as documented (flag > env > file > default); a bad winning value exits non-zero naming the setting', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const dir = await tempDir(t)
  const ports: [number, number] = [await freePort(), await freePort()]
  let n = 0
  await check(fc.asyncProperty(cliSources(ports), async (s) => {
    const config: Json = {}
    const env: Record<string, string> = {}
    const args = ['serve']
    if (s.host.config !== undefined) config.host = s.host.config.value
    if (s.host.env !== undefined) env.TOOLPORT_HOST = s.host.env.value
    if (s.host.flag !== undefined) args.push('--host', s.host.flag.value as string)
    if (s.port.config !== undefined) config.port = s.port.config.value
    if (s.port.env !== undefined) env.TOOLPORT_PORT = s.port.env.value
    if (s.port.flag !== undefined) args.push('--port', s.port.flag.value as string)
    if (s.roles.config !== undefined) config.roles = s.roles.config.value
    if (s.roles.env !== undefined) env.TOOLPORT_ROLES = s.roles.env.value
    if (s.roles.flag !== undefined) for (const r of s.roles.flag.value as string[]) args.push('--role', r)
    if (s.logger.config !== undefined) config.logger = s.logger.config.value
    if (s.logger.env !== undefined) env.TOOLPORT_LOG_LEVEL = s.logger.env.value
    if (s.logger.flag !== undefined) args.push('--log-level', s.logger.flag.value as string)
    if (s.mode.config !== undefined) config.dispatch = s.mode.config.value === 'garbage-group' ? 'inline' : { mode: s.mode.config.value }
    if (s.mode.env !== undefined) env.TOOLPORT_DISPATCH_MODE = s.mode.env.value
    if (s.mode.flag !== undefined) args.push('--inline')
    // Without any port setting the default 3917 would be bound: pin it to 0 in the file then.
    if (winner(s.port) === undefined) config.port = 0
    const file = join(dir, `options-${n++}.json`)
    await writeFile(file, JSON.stringify(config))
    if (n % 2 === 0) args.push('--config', file)
    else env.TOOLPORT_CONFIG = file

    const settings: Setting[] = ['host', 'port', 'roles', 'logger', 'mode']
    const wins = Object.fromEntries(settings.map((k) => [k, winner(s[k])])) as
      Record<Setting, ReturnType<typeof winner>>
    // A config group that is not an object is a bad file whatever overrides one of its fields.
    const bad = settings.filter((k) => wins[k]?.valid === false ||
      (k === 'mode' && s.mode.config?.value === 'garbage-group'))

    const run = runMain(t, args, env)
    const listening = await listeningOrExit(run)
    const described = `argv ${JSON.stringify(args)} env ${JSON.stringify(env)} file ${JSON.stringify(config)}`
    if (bad.length > 0) {
      if (listening !== null) run.stop()
      const code = await run.exited
      assert.equal(listening, null, `served despite bad ${bad.join(', ')}: ${described}`)
      assert.notEqual(code, 0, described)
      const first = run.stderr().split('\n')[0] ?? ''
      assert.match(first, /^toolport: /, described)
      assert.ok(bad.some((k) => NAMES[k].test(first)), `stderr names none of ${bad.join(', ')}: ${first} (${described})`)
      return
    }
    assert.notEqual(listening, null, `did not serve: ${run.stderr()} (${described})`)
    const [, host, port, roles, mode] = listening as RegExpExecArray
    assert.equal(host, wins.host?.value ?? '127.0.0.1', described)
    const wantPort = Number(wins.port?.value ?? 0)
    if (wantPort === 0) assert.notEqual(Number(port), 0)
    else assert.equal(Number(port), wantPort, described)
    const wantRoles = wins.roles === undefined
      ? ['default']
      : wins.roles.source === 'env' ? String(wins.roles.value).split(',').map((r) => r.trim()) : wins.roles.value
    assert.deepEqual(roles?.split(', '), wantRoles, described)
    assert.equal(mode, wins.mode?.value ?? 'pool', described)
    // The logger: `info` (the CLI's default) logs fastify's JSON lines to stdout; silent logs nothing.
    const level = wins.logger?.value ?? 'info'
    const logged = run.stdout.some((line) => line.startsWith('{'))
    assert.equal(logged, level === 'info', `logger ${String(level)}: ${run.stdout.join('\n')} (${described})`)
    run.stop()
    assert.equal(await run.exited, 0)
  }), { numRuns: runs(18) })
})

// ---- The real program: exit codes and stderr --------------------------------------------------

/** Environment without the machine's TOOLPORT_* variables. */
function cleanEnv (extra: Record<string, string>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {}
  for (const [key, value] of Object.entries(process.env)) if (!key.startsWith('TOOLPORT_')) env[key] = value
  return { ...env, ...extra }
}

test('config: property: the real `toolport serve` with one bad setting (flag or variable) exits non-zero at once, prints nothing on stdout and names the setting on stderr', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const cases = fc.constantFrom<{ args: string[], env: Record<string, string>, name: RegExp }>(
    { args: ['--port', '65536'], env: {}, name: /port/ },
    { args: [], env: { TOOLPORT_PORT: '65536' }, name: /TOOLPORT_PORT/ },
    { args: ['--log-level', 'chatty'], env: {}, name: /log/ },
    { args: [], env: { TOOLPORT_LOG_LEVEL: 'chatty' }, name: /TOOLPORT_LOG_LEVEL/ },
    { args: [], env: { TOOLPORT_DISPATCH_MODE: 'turbo' }, name: /TOOLPORT_DISPATCH_MODE/ },
    { args: [], env: { TOOLPORT_ROLES: 'A,..' }, name: /TOOLPORT_ROLES/ },
    { args: ['--host', '0.0.0.0'], env: {}, name: /0\.0\.0\.0|host/ },
    { args: [], env: { TOOLPORT_HOST: '0.0.0.0' }, name: /0\.0\.0\.0|host/ },
    { args: ['--role', ''], env: {}, name: /role/ }
  )
  await check(fc.asyncProperty(cases, async ({ args, env, name }) => {
    const child = spawn(process.execPath, [...toolportCliArgs(), 'serve', ...args], {
      cwd: ROOT, env: cleanEnv({ TOOLPORT_PORT: '0', ...env }), stdio: ['ignore', 'pipe', 'pipe']
    })
    const exited = once(child, 'exit')
    t.after(async () => { if (child.exitCode === null && child.signalCode === null) { child.kill('SIGKILL'); await exited } })
    let stdout = ''
    let stderr = ''
    child.stdout.setEncoding('utf8').on('data', (c: string) => { stdout += c })
    child.stderr.setEncoding('utf8').on('data', (c: string) => { stderr += c })
    const [code, signal] = await within(exited, `toolport serve ${args.join(' ')}`, GUARD_MS)
    assert.equal(signal, null)
    assert.notEqual(code, 0)
    assert.equal(stdout, '')
    const lines = stderr.trimEnd().split('\n')
    assert.match(lines[0] ?? '', /^toolport: /)
    assert.match(lines[0] ?? '', name)
  }), { numRuns: runs(4) })
})

// ---- toolport mcp: its arguments ----------------------------------------------------------------

test('config: property: `toolport mcp` resolves --role, --url and TOOLPORT_URL as documented, refuses bad ones naming them, and never writes to stdout', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const { url: live } = await startToolport(t, { roles: ['A'] })
  const dead = `http://127.0.0.1:${await freePort()}`
  type UrlChoice = 'live' | 'dead' | 'ftp' | 'garbage' | 'empty'
  const URLS: Record<UrlChoice, string> = { live, dead, ftp: 'ftp://127.0.0.1:1/', garbage: 'not a url', empty: '' }
  const gen = fc.record({
    role: fc.constantFrom<string | undefined>(undefined, '', 'A', 'Nobody'),
    flag: fc.constantFrom<UrlChoice | undefined>(undefined, 'live', 'dead', 'ftp', 'garbage', 'empty'),
    env: fc.constantFrom<UrlChoice | undefined>('live', 'dead', 'garbage', 'ftp'),
    help: fc.boolean()
  }).filter((c) => !c.help || c.role === undefined)
  await check(fc.asyncProperty(gen, async (c) => {
    const args = ['mcp']
    if (c.role !== undefined) args.push('--role', c.role)
    if (c.flag !== undefined) args.push('--url', URLS[c.flag])
    if (c.help) args.push('--help')
    const env: Record<string, string> = c.env === undefined ? {} : { TOOLPORT_URL: URLS[c.env] }
    const run = runMain(t, args, env)
    const described = `${JSON.stringify(args)} ${JSON.stringify(env)}`
    const urlSource = c.flag ?? c.env
    const urlName = c.flag !== undefined ? /--url/ : /TOOLPORT_URL|--url/
    if (c.help) {
      assert.equal(await run.exited, 0, described)
      assert.match(run.stderr(), /toolport mcp|Options for mcp/, 'the usage goes to stderr')
    } else if (c.role === undefined || c.role === '') {
      assert.equal(await run.exited, 2, described)
      assert.match(run.stderr().split('\n')[0] ?? '', /--role/, described)
    } else if (urlSource === 'ftp' || urlSource === 'garbage' || urlSource === 'empty') {
      assert.equal(await within(run.exited, described, GUARD_MS), 2, described)
      assert.match(run.stderr().split('\n')[0] ?? '', urlName, `the message names the URL setting: ${described}`)
    } else if (urlSource === 'live' && c.role === 'Nobody') {
      assert.equal(await within(run.exited, described, GUARD_MS), 1, described)
      assert.match(run.stderr(), /TP_ERR_ROLE_NOT_FOUND/)
    } else {
      // A running bridge: connected (live) or waiting for Toolport (dead); stopping it exits 0.
      const target = `${URLS[urlSource as UrlChoice]}/mcp/${encodeURIComponent(c.role)}`
      await within((async () => {
        while (!run.stderr().includes(target)) await new Promise((resolve) => setTimeout(resolve, 10))
      })(), `the bridge to name ${target}: ${run.stderr()}`, GUARD_MS)
      assert.match(run.stderr(), urlSource === 'live' ? /connected to/ : /cannot reach/, described)
      run.stop()
      assert.equal(await within(run.exited, described, GUARD_MS), 0, described)
    }
    await run.exited
    assert.deepEqual(run.stdout, [], `stdout carries the protocol only: ${described}`)
  }), { numRuns: runs(25) })
})

// ---- Hosts and ports: the loopback rule for bind addresses -------------------------------------

const LOOPBACK_BIND = ['127.0.0.1', '127.0.0.2', '127.255.255.254', '::1', '0:0:0:0:0:0:0:1', 'localhost']
/** IPv4-mapped IPv6: refused whatever allowNonLoopbackBind says (the guard refuses its Host `[::ffff:…]`). */
const MAPPED_BIND = ['::ffff:127.0.0.1']
const OTHER_IP = Object.values(networkInterfaces()).flat()
  .find((i) => i !== undefined && i.family === 'IPv4' && !i.internal)?.address
const NON_LOOPBACK_BIND = ['0.0.0.0', '::', ...(OTHER_IP === undefined ? [] : [OTHER_IP])]

test('config: property: listen() binds exactly the loopback hosts, a non-loopback one only with allowNonLoopbackBind (which still refuses non-loopback peers); ports 0, in use and privileged behave', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const holder: Server = createServer()
  holder.listen(0, '127.0.0.1')
  await once(holder, 'listening')
  t.after(() => new Promise<void>((resolve) => { holder.close(() => { resolve() }) }))
  const busy = (holder.address() as AddressInfo).port
  const isRoot = process.getuid?.() === 0
  const gen = fc.record({
    host: fc.constantFrom(...LOOPBACK_BIND, ...NON_LOOPBACK_BIND, ...MAPPED_BIND),
    port: fc.constantFrom<'zero' | 'busy' | 'free' | 'privileged'>('zero', 'zero', 'busy', 'free', 'privileged'),
    allow: fc.boolean(),
    viaOptions: fc.boolean()
  })
  await check(fc.asyncProperty(gen, async (c) => {
    const port = c.port === 'zero' ? 0 : c.port === 'busy' ? busy : c.port === 'free' ? await freePort() : 1000 + (await freePort()) % 23
    const base = { logger: false as const, dispatch: { mode: 'inline' as const }, security: { allowNonLoopbackBind: c.allow } }
    const tp = await createToolport(c.viaOptions ? { ...base, host: c.host, port } : base)
    try {
      const listening = c.viaOptions ? tp.listen() : tp.listen({ host: c.host, port })
      const isLoopback = LOOPBACK_BIND.includes(c.host)
      if (MAPPED_BIND.includes(c.host) || (!isLoopback && !c.allow)) {
        await assert.rejects(listening, (err: any) => {
          assert.equal(err.code, 'TP_ERR_CONFIG')
          assert.ok(err.message.includes(c.host))
          return true
        })
        assert.equal(tp.app.server.listening, false)
        return
      }
      // In use: an error from the OS, on either loopback host (127.0.0.1 is held; `localhost`,
      // 0.0.0.0 and `::` overlap it); anywhere else the port is free.
      const overlaps = c.host === '127.0.0.1' || c.host === 'localhost' || c.host === '0.0.0.0' || c.host === '::'
      if (c.port === 'busy' && overlaps) {
        await assert.rejects(listening, /EADDRINUSE/)
        return
      }
      if (c.port === 'privileged' && !isRoot) {
        await assert.rejects(listening, /EACCES/)
        return
      }
      const result = await within(listening, 'listen', GUARD_MS)
      if (port === 0) assert.ok(result.port > 0)
      else assert.equal(result.port, port)
      assert.equal(result.host, c.host)
      // Loopback clients are served at the URL listen() answered (README "Embedding": `{ url }`);
      // over a wildcard bind, at 127.0.0.1; over a non-loopback bind a non-loopback peer is refused (R1).
      const served = isLoopback ? result.url : c.host === OTHER_IP ? undefined : `http://127.0.0.1:${result.port}`
      if (served !== undefined) {
        const res = await httpRequest(`${served}/api/health`)
        assert.equal(res.statusCode, 200, `${served}: ${await res.body.text()}`)
      }
      if (!isLoopback && OTHER_IP !== undefined && c.host !== '::') {
        const res = await httpRequest(`http://${OTHER_IP}:${result.port}/api/health`, { headers: { host: `127.0.0.1:${result.port}` } })
        const body = await res.body.json() as Json
        assert.equal(res.statusCode, 403)
        assert.equal(body.code, 'TP_ERR_NOT_LOOPBACK')
      }
    } finally {
      await tp.close()
    }
  }), { numRuns: runs(30) })
})

// ---- Regressions: the bugs this file found (they FAIL until fixed) -----------------------------

test('regression: duplicate names in `roles` are invalid options (TP_ERR_CONFIG naming roles), not TP_ERR_ROLE_EXISTS (README "Configuration", "Errors")', async () => {
  await assert.rejects(createToolport({ logger: false, dispatch: { mode: 'inline' }, roles: ['a', 'a'] }), (err: any) => {
    assert.equal(err.code, 'TP_ERR_CONFIG', `got ${String(err.code)}: ${String(err.message)}`)
    assert.match(err.message, /roles/)
    return true
  })
})

test('regression: a --config file whose `roles` is not a list is refused, not silently replaced by the default role (README "Configuration")', async (t) => {
  const dir = await tempDir(t)
  const file = join(dir, 'roles.json')
  await writeFile(file, JSON.stringify({ port: 0, logger: 'silent', roles: 'Lanlan' }))
  const run = runMain(t, ['serve', '--config', file])
  const listening = await listeningOrExit(run)
  if (listening !== null) run.stop()
  assert.equal(listening, null, `served with roles: ${listening?.[3] ?? ''}`)
  assert.notEqual(await run.exited, 0)
  assert.match(run.stderr(), /roles/)
})

test('regression: a --config file whose `dispatch` is not an object is refused even when TOOLPORT_DISPATCH_MODE is set (README "The command", "Configuration")', async (t) => {
  const dir = await tempDir(t)
  const file = join(dir, 'dispatch.json')
  await writeFile(file, JSON.stringify({ port: 0, logger: 'silent', dispatch: 'inline' }))
  const run = runMain(t, ['serve', '--config', file], { TOOLPORT_DISPATCH_MODE: 'pool' })
  const listening = await listeningOrExit(run)
  if (listening !== null) run.stop()
  assert.equal(listening, null, 'served, the bad `dispatch` of the file silently dropped')
  assert.notEqual(await run.exited, 0)
  assert.match(run.stderr(), /dispatch/)
})

test('regression: a bad port exits with the same code whether it came from --port or TOOLPORT_PORT (README "The command": the same setting)', async (t) => {
  const codes: Record<string, number> = {}
  for (const [label, args, env] of [
    ['--port abc', ['serve', '--port', 'abc'], {}],
    ['--port 70000', ['serve', '--port', '70000'], {}],
    ['TOOLPORT_PORT=abc', ['serve'], { TOOLPORT_PORT: 'abc' }],
    ['TOOLPORT_PORT=70000', ['serve'], { TOOLPORT_PORT: '70000' }]
  ] as const) {
    const run = runMain(t, [...args], { ...env })
    codes[label] = await within(run.exited, label, GUARD_MS)
  }
  assert.equal(new Set(Object.values(codes)).size, 1, `exit codes differ: ${JSON.stringify(codes)}`)
})

test('regression: `toolport mcp` with an unparsable --url or TOOLPORT_URL names the setting on stderr (README "MCP: one endpoint per role")', async (t) => {
  const fromFlag = runMain(t, ['mcp', '--role', 'A', '--url', 'not a url'])
  assert.equal(await fromFlag.exited, 2)
  assert.match(fromFlag.stderr().split('\n')[0] ?? '', /--url/)
  const fromEnv = runMain(t, ['mcp', '--role', 'A'], { TOOLPORT_URL: 'not a url' })
  assert.equal(await fromEnv.exited, 2)
  assert.match(fromEnv.stderr().split('\n')[0] ?? '', /TOOLPORT_URL/)
})

test('regression: a security.token with leading whitespace is refused, or accepted as the client sends it (README "Configuration": token mode)', async () => {
  const secret = ` ${'k'.repeat(32)}`
  let tp: Toolport
  try {
    tp = await createToolport({ logger: false, dispatch: { mode: 'inline' }, security: { token: secret } })
  } catch (err: any) {
    assert.equal(err.code, 'TP_ERR_CONFIG')
    return
  }
  try {
    const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
    const res = await httpRequest(`${url}/api/tools`, { headers: { authorization: `Bearer ${secret}` } })
    await res.body.text()
    assert.equal(res.statusCode, 200, 'the configured token never opens the API')
  } finally {
    await tp.close()
  }
})

test('regression: a security.token that is not visible ASCII (a Latin-1 or astral character, a space inside, a control) is refused as TP_ERR_CONFIG naming security.token, also from `toolport serve --token-file` (README "Configuration": security.token)', async (t) => {
  for (const secret of ['ö'.padEnd(40, 'x'), 'tok😀'.padEnd(40, 'x'), `${'k'.repeat(16)} ${'k'.repeat(16)}`, `${'k'.repeat(32)}\u0001`]) {
    await assert.rejects(createToolport({ logger: false, dispatch: { mode: 'inline' }, security: { token: secret } }),
      (err: any) => err.code === 'TP_ERR_CONFIG' && /security\.token/.test(err.message) && /visible ASCII/.test(err.message),
      JSON.stringify(secret))
  }
  const dir = await tempDir(t)
  const refused = join(dir, 'refused.token')
  await writeFile(refused, `${'ö'.padEnd(40, 'x')}\n`, { mode: 0o600 })
  const run = runMain(t, ['serve', '--port', '0', '--token-file', refused])
  const listening = await listeningOrExit(run)
  if (listening !== null) run.stop()
  assert.equal(listening, null, 'served with a token no client could present')
  assert.notEqual(await run.exited, 0)
  assert.match(run.stderr().split('\n')[0] ?? '', /^toolport: .*security\.token/)
  // A visible ASCII token in a file (its line break trimmed away) serves.
  const accepted = join(dir, 'accepted.token')
  await writeFile(accepted, `${'k'.repeat(40)}\n`, { mode: 0o600 })
  const serving = runMain(t, ['serve', '--port', '0', '--log-level', 'silent', '--token-file', accepted])
  assert.notEqual(await listeningOrExit(serving), null, serving.stderr())
  serving.stop()
  assert.equal(await serving.exited, 0)
})

test('regression: listen() on an IPv4-mapped address (::ffff:127.0.0.1), whose URL its own Host check would refuse, is refused with TP_ERR_CONFIG pointing to the IPv4 address (README "Embedding: the library", SECURITY.md "Inbound")', async (t) => {
  // It used to bind and answer http://[::ffff:127.0.0.1]:port, which the Host check answers 403.
  const tp = await createToolport({ logger: false, dispatch: { mode: 'inline' } })
  t.after(() => tp.close())
  await assert.rejects(tp.listen({ host: '::ffff:127.0.0.1', port: 0 }), (err: any) => {
    assert.equal(err.code, 'TP_ERR_CONFIG', `got ${String(err.code)}: ${String(err.message)}`)
    assert.match(err.message, /IPv4/)
    return true
  })
  assert.equal(tp.app.server.listening, false)
})

test('regression: listen() with a port out of range fails with TP_ERR_CONFIG like the `port` option does (README "Errors": library, invalid options)', async (t) => {
  const tp = await createToolport({ logger: false, dispatch: { mode: 'inline' } })
  t.after(() => tp.close())
  for (const port of [-1, 65_536, 1.5]) {
    await assert.rejects(tp.listen({ host: '127.0.0.1', port }), (err: any) => {
      assert.equal(err.code, 'TP_ERR_CONFIG', `port ${port}: ${String(err.code)} ${String(err.message)}`)
      assert.match(err.message, /port/)
      return true
    })
  }
})

test('regression: `toolport mcp --role ..` reaches the role\'s own endpoint or is refused at once, never the server root (README "MCP: one endpoint per role")', async (t) => {
  // `.` and `..` are no role names (a URL path cannot name them): the options and roles.add refuse them.
  for (const name of ['.', '..']) {
    await assert.rejects(createToolport({ logger: false, dispatch: { mode: 'inline' }, roles: [name] }), (err: any) => {
      assert.equal(err.code, 'TP_ERR_CONFIG', `got ${String(err.code)}: ${String(err.message)}`)
      assert.match(err.message, /roles/)
      return true
    })
  }
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  assert.throws(() => tp.roles.add('..'), { code: 'TP_ERR_CONFIG' })
  const run = runMain(t, ['mcp', '--role', '..', '--url', url])
  await within((async () => {
    while (!/toolport mcp: /.test(run.stderr()) && !run.stderr().startsWith('toolport: ')) {
      const tick = new Promise((resolve) => setTimeout(() => { resolve(false) }, 20))
      if (await Promise.race([run.exited.then(() => true), tick])) break
    }
  })(), 'the bridge to connect or give up', GUARD_MS)
  const first = run.stderr().split('\n')[0] ?? ''
  const refused = first.startsWith('toolport: ') && /role/.test(first)
  const connected = first.includes(`connected to ${url}/mcp/`)
  assert.ok(refused || connected, `neither connected to the role's endpoint nor refused: ${first}`)
  if (refused) assert.equal(await run.exited, 2)
})

test('regression: a --config file is read as the same options createToolport takes: a `__proto__` key is refused, never applied as options (README "Configuration")', async (t) => {
  // The library refuses it (strict options: an unknown key); the CLI's Object.assign turned it
  // into the options object's prototype, whose `roles` then became the server's roles.
  await assert.rejects(createToolport(JSON.parse('{"__proto__": {"roles": ["Proto"]}}')), { code: 'TP_ERR_CONFIG' })
  const dir = await tempDir(t)
  const file = join(dir, 'proto.json')
  await writeFile(file, '{"__proto__": {"roles": ["Proto"]}, "port": 0, "logger": "silent"}')
  const run = runMain(t, ['serve', '--config', file])
  const listening = await listeningOrExit(run)
  if (listening !== null) run.stop()
  assert.equal(listening, null, `served with roles: ${listening?.[3] ?? ''}`)
  assert.notEqual(await run.exited, 0)
  assert.match(run.stderr(), /__proto__/)
})
