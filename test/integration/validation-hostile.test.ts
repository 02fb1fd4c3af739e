// Hostile `parameters` schemas: each attack on argument validation, reproduced with bounded
// input against a real Toolport on 127.0.0.1, and shown to hold (docs/architecture.md, SECURITY.md).
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import { Worker } from 'node:worker_threads'
import { setImmediate as tick } from 'node:timers/promises'
import { cachedValidatorCount, compileCount, regExpCompileCount } from '../../src/main/dispatch/validators.js'
import { compilerBootstrap } from '../../src/main/dispatch/compiler-thread.js'
import { workerModule } from '../../src/main/dispatch/worker-module.js'
import type { Toolport } from '../../src/main/index.js'
import { createTestToolport, httpJson, startToolport, tool } from '../helpers.js'

/** A hang here is the attack succeeding: fail the test instead of waiting for it. */
const ATTACK = { timeout: 120_000 }

/** Two roles: the attacker's tool goes to 'A', a bystander's local tool lives in 'B'. */
async function withBystander (tp: Toolport): Promise<() => Promise<unknown>> {
  await tp.roles.get('B').registerLocalTool({
    name: 'ping',
    parameters: { type: 'object', properties: { n: { type: 'integer' } }, required: ['n'] },
    handler: (args) => ({ pong: (args as { n: number }).n })
  })
  return async () => {
    const result = await tp.callTool('B', { name: 'ping', arguments: { n: 7 } })
    assert.equal(result.is_error, false, result.text)
    assert.deepEqual(result.output, { pong: 7 })
    return result
  }
}

/** The compile bomb: one 150-property definition referenced 200 times through `$ref` (~11 KB). */
function refBomb (properties = 150, refs = 200): Record<string, unknown> {
  const big: Record<string, unknown> = {}
  for (let i = 0; i < properties; i++) big[`p${i}`] = { type: 'string', minLength: 1 }
  const outer: Record<string, unknown> = {}
  for (let i = 0; i < refs; i++) outer[`r${i}`] = { $ref: '#/$defs/big' }
  return { type: 'object', $defs: { big: { type: 'object', properties: big } }, properties: outer }
}

test('ReDoS: a backtracking pattern answers at once over HTTP, and another role answers meanwhile', ATTACK, async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A', 'B'] })
  const ping = await withBystander(tp)
  const registered = await httpJson(`${url}/api/tools/register`, 'POST', tool('search', {
    role: 'A',
    parameters: { type: 'object', properties: { q: { type: 'string', pattern: '^(a+)+$' } } }
  }))
  assert.equal(registered.statusCode, 200)
  // 29 × "a" + "!" took ~22 s with a backtracking engine and doubles with each "a": 50 000 would never end.
  const [call] = await Promise.all([
    httpJson(`${url}/api/tools/call`, 'POST', {
      role: 'A',
      name: 'search',
      arguments: { q: `${'a'.repeat(50_000)}!` }
    }),
    ping()
  ])
  assert.equal(call.statusCode, 200)
  assert.equal(call.body.is_error, true)
  assert.match(call.body.error, /must match pattern/)
  // patternProperties run on the same engine.
  await tp.roles.get('A').registerLocalTool({
    name: 'keys',
    parameters: { type: 'object', patternProperties: { '^(x+)+$': { type: 'integer' } } },
    handler: () => 'ran'
  })
  const keyed = await tp.callTool('A', {
    name: 'keys',
    arguments: {
      [`${'x'.repeat(50_000)}!`]: 'not checked',
      xxx: 'bad'
    }
  })
  assert.equal(keyed.is_error, true)
  assert.match(keyed.error ?? '', /must be integer/)
  // A format whose regex RE2 cannot run sees bounded input only.
  await tp.roles.get('A').registerLocalTool({
    name: 'link',
    parameters: { type: 'object', properties: { u: { type: 'string', format: 'url' } } },
    handler: () => 'ran'
  })
  const link = await tp.callTool('A', { name: 'link', arguments: { u: `http://${':'.repeat(200_000)}` } })
  assert.equal(link.is_error, true)
  await ping()
})

test('ReDoS: a pattern RE2 cannot run (backreference, lookaround) is a 422 at registration', async (t) => {
  const { url } = await startToolport(t, { roles: ['A'] })
  for (const pattern of ['^(a+)\\1$', '^(?=a)a+$', '(?<!x)y']) {
    const res = await httpJson(`${url}/api/tools/register`, 'POST', tool('search', {
      parameters: { type: 'object', properties: { q: { type: 'string', pattern } } }
    }))
    assert.equal(res.statusCode, 422, pattern)
    assert.equal(res.body.code, 'TP_ERR_VALIDATION')
    assert.equal(res.body.details[0].path, 'parameters')
    assert.equal(res.body.details[0].code, 'invalid_schema')
  }
})

test('compile bomb: a $ref to a 150-property definition used 200 times compiles off the main thread', ATTACK, async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A', 'B'] })
  const ping = await withBystander(tp)
  const heapBefore = process.memoryUsage().heapUsed
  const registering = httpJson(`${url}/api/tools/register`, 'POST', tool('bomb', { role: 'A', parameters: refBomb() }))
  // The main thread is free while the compiler thread works: the other role answers.
  await ping()
  const res = await registering
  assert.ok(res.statusCode === 200 || res.statusCode === 422, `status ${res.statusCode}`)
  if (res.statusCode === 200) {
    const call = await tp.callTool('A', { name: 'bomb', arguments: { r0: { p0: '' } } })
    assert.equal(call.is_error, true)
    assert.match(call.error ?? '', /must NOT have fewer than 1 characters/)
  }
  // inlineRefs off: the definition is compiled once, not 200 times (which peaked at 1.2 GB).
  assert.ok(process.memoryUsage().heapUsed - heapBefore < 200 * 1024 * 1024, 'main-thread heap stayed bounded')
  await ping()
})

test('compile bomb: a schema over the code budget is a 422 and the server keeps registering', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'], limits: { maxSchemaCodeBytes: 64 * 1024 } })
  // ~56 KB: five 150-property definitions referenced 1000 times.
  const big: Record<string, unknown> = {}
  for (let i = 0; i < 150; i++) big[`p${i}`] = { type: 'string', minLength: 1 }
  const defs: Record<string, unknown> = {}
  for (let d = 0; d < 5; d++) defs[`big${d}`] = { type: 'object', properties: big }
  const outer: Record<string, unknown> = {}
  for (let i = 0; i < 1000; i++) outer[`r${i}`] = { $ref: `#/$defs/big${i % 5}` }
  await assert.rejects(tp.register(tool('bomb', { parameters: { type: 'object', $defs: defs, properties: outer } })),
    (err: { code: string, statusCode: number, details: Array<{ code: string }> }) =>
      err.code === 'TP_ERR_VALIDATION' && err.statusCode === 422 && err.details[0]?.code === 'schema_too_costly')
  const ok = await tp.register(tool('fine', { parameters: { type: 'object', properties: { a: { type: 'string' } } } }))
  assert.equal(ok.ok, true)
})

test('compile bomb: a compile over the time budget is a 422, and the compiler thread is replaced', ATTACK, async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'], limits: { maxSchemaCompileMs: 50 } })
  // ~40 KB of properties: far more than 50 ms of code generation on any machine.
  const big: Record<string, unknown> = {}
  for (let i = 0; i < 600; i++) big[`p${i}`] = { type: 'string', minLength: 1, maxLength: 9 }
  await assert.rejects(tp.register(tool('slow', {
    parameters: {
      type: 'object',
      properties: big,
      description: 'slow'
    }
  })),
  (err: { statusCode: number, details: Array<{ code: string }> }) => err.statusCode === 422 &&
      err.details[0]?.code === 'schema_too_costly')
  // The thread that ran past the budget was terminated; a new one compiles the next schema (with
  // the default budget: a cold thread on a busy machine may need more than 50 ms even for this).
  const other = await createTestToolport(t, { roles: ['A'] })
  const ok = await other.register(tool('fine', {
    parameters: {
      type: 'object',
      properties: { a: { type: 'string' } }
    }
  }))
  assert.equal(ok.ok, true)
  const call = await other.callTool('A', { name: 'fine', arguments: { a: 1 } })
  assert.equal(call.is_error, true)
})

test('compile budget: a schema that ran past limits.maxSchemaCompileMs is refused at once when it is sent again, with no compile (SECURITY.md "Argument validation")', ATTACK, async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'], limits: { maxSchemaCompileMs: 50 } })
  // ~40 KB of properties: far more than 50 ms of code generation on any machine. Named for this
  // test: the refusals are remembered per process.
  const properties: Record<string, unknown> = {}
  for (let i = 0; i < 600; i++) properties[`again_${i}`] = { type: 'string', minLength: 1, maxLength: 9 }
  const slow = tool('slow', { parameters: { type: 'object', properties } })
  const overTime = (err: { statusCode: number, details: Array<{ code: string, message: string }> }): boolean =>
    err.statusCode === 422 && err.details[0]?.code === 'schema_too_costly' &&
    /took longer than the budget of 50 ms/.test(err.details[0].message)
  await assert.rejects(tp.register(slow), overTime)
  const before = compileCount()
  for (let i = 0; i < 3; i++) await assert.rejects(tp.register({ ...slow, name: `slow${i}` }), overTime)
  assert.equal(compileCount(), before, 'the schema sent again was not compiled again')
})

test('compile budget: the thread says when it starts each job, after warming a cold dialect, and the budget runs from there', async (t) => {
  // The compiler thread's own contract, on the module Toolport loads (the built one when it is
  // fresh, else the source through tsx): the main thread runs a job's budget from `started`, so
  // warming a dialect (draft-07 and 2019-09 here), or RE2 for the first schema with a pattern
  // (job 5), is never charged to it.
  const module = workerModule('schema-compiler')
  const worker = new Worker(compilerBootstrap(module), { eval: true, execArgv: module.execArgv })
  t.after(() => worker.terminate())
  const messages: Array<Record<string, unknown>> = []
  let waiting: (() => void) | null = null
  worker.on('message', (message: Record<string, unknown>) => { messages.push(message); waiting?.() })
  const next = async (): Promise<Record<string, unknown>> => {
    while (messages.length === 0) await new Promise<void>((resolve) => { waiting = resolve })
    return messages.shift() as Record<string, unknown>
  }
  assert.deepEqual(await next(), { ready: true })
  const plain = '{"type":"object","required":["a"]}'
  const patterned = '{"type":"object","properties":{"a":{"type":"string","pattern":"^[a-z]+$"}}}'
  // [id, dialect, schema, what the thread warms before it starts the job]
  const jobs = [[1, 'draft-07', plain, ['draft-07']], [2, 'draft-07', plain, []], [3, '2020-12', plain, []],
    [4, '2019-09', plain, ['2019-09']], [5, '2020-12', patterned, ['re2']], [6, '2020-12', patterned, []]] as const
  for (const [id, dialect, schema, warmed] of jobs) {
    worker.postMessage({ id, dialect, maxCodeBytes: 1024 * 1024, schema })
    assert.deepEqual(await next(), { started: id, warmed }, `job ${id} (${dialect}) says it started before its reply`)
    assert.deepEqual({ ...await next(), code: '…' }, { id, ok: true, code: '…' })
  }
})

test('pattern bomb: a schema of 40 costly patterns compiles them on the main thread only as arguments reach them', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const properties: Record<string, unknown> = {}
  // Counted repetitions: RE2 expands each into a program of ~40 states, up to ~1 ms to compile.
  for (let i = 0; i < 40; i++) properties[`f${i}`] = { type: 'string', pattern: `^x${i}_[a-z]{1,${i + 2}}$` }
  const before = regExpCompileCount()
  await tp.register(tool('patterns', { parameters: { type: 'object', properties, required: ['f0'] } }))
  assert.equal(regExpCompileCount(), before, 'registering compiled no pattern on the main thread')
  const wrong = await tp.callTool('A', { name: 'patterns', arguments: { f0: 'x0_abc' } })
  assert.equal(wrong.is_error, true)
  assert.match(wrong.error ?? '', /f0 must match pattern/)
  assert.equal(regExpCompileCount(), before + 1, 'the one pattern an argument reached compiled')
  const right = await tp.callTool('A', { name: 'patterns', arguments: { f0: 'x0_ab', f39: 'x39_' + 'z'.repeat(42) } })
  assert.equal(right.is_error, true, 'f39 allows at most 41 letters after its prefix')
  assert.match(right.error ?? '', /f39 must match pattern/)
  assert.equal(regExpCompileCount(), before + 2, 'each pattern compiles once')
  // Valid arguments pass validation (the call then fails only at the test's closed callback port).
  const valid = await tp.callTool('A', { name: 'patterns', arguments: { f0: 'x0_a', f39: 'x39_' + 'z'.repeat(41) } })
  assert.doesNotMatch(valid.error ?? '', /must match pattern/)
  assert.equal(regExpCompileCount(), before + 2)
})

/**
 * Full collections with ticks between (FinalizationRegistry callbacks run after a collection), in
 * a process started without --expose-gc.
 */
async function collect (): Promise<void> {
  setFlagsFromString('--expose-gc')
  const gc = runInNewContext('gc') as () => void
  for (let i = 0; i < 3; i++) {
    gc()
    await tick()
  }
}

test('leak: replacing a tool with 60 KB schemas and calling it returns the heap to its baseline', ATTACK, async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'], limits: { maxParametersBytes: 128 * 1024 } })
  const schema = (version: number): Record<string, unknown> => {
    const properties: Record<string, unknown> = {}
    for (let i = 0; i < 40; i++) {
      properties[`field_${i}`] = {
        type: 'string',
        pattern: `^v${version}_[a-z]{1,${i + 2}}$`,
        description: `${'documentation '.repeat(110)}${version}`
      }
    }
    return { type: 'object', properties, required: ['field_0'] }
  }
  assert.ok(JSON.stringify(schema(0)).length > 60_000)
  const cycle = async (version: number): Promise<void> => {
    await tp.register(tool('big', { parameters: schema(version) }))
    for (let i = 0; i < 10; i++) {
      const ok = await tp.callTool('A', { name: 'big', arguments: { field_0: 'nope' } })
      assert.equal(ok.is_error, true)
    }
  }
  await cycle(0)
  await cycle(1)
  await collect()
  const baseline = process.memoryUsage().heapUsed
  // Validators of other tests' Toolports in this process may still be alive: count from here.
  const aliveAtBaseline = cachedValidatorCount()
  for (let version = 2; version < 32; version++) await cycle(version)
  await collect()
  const grown = process.memoryUsage().heapUsed - baseline
  // The shared Ajv kept ~0.8 MB per replaced 60 KB schema: 30 cycles would be ~24 MB.
  assert.ok(grown < 4 * 1024 * 1024, `heap grew ${(grown / 1024 / 1024).toFixed(1)} MB over 30 replacements`)
  assert.ok(cachedValidatorCount() <= aliveAtBaseline,
    `${cachedValidatorCount() - aliveAtBaseline} more validators alive`)
  // Unregistering frees the last one.
  await tp.unregister({ name: 'big' })
  await collect()
  assert.ok(cachedValidatorCount() < aliveAtBaseline)
})

test('one compile for identical schemas: 1000 tools registered with the same schema compile it once', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  const parameters = {
    type: 'object',
    properties: { city: { type: 'string', pattern: '^[A-Z][a-z]+$' } },
    required: ['city']
  }
  await tp.register(tool('warm', { parameters }))
  const before = compileCount()
  for (let i = 0; i < 1000; i++) await tp.register(tool(`t${i}`, { parameters, source: `s${i % 3}` }))
  assert.equal(compileCount(), before)
  const call = await tp.callTool('B', { name: 't999', arguments: { city: 'paris' } })
  assert.equal(call.is_error, true)
  assert.match(call.error ?? '', /must match pattern/)
})

test('$id poisoning: a schema that failed to compile, or another tool\'s $id, changes no other tool', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const id = 'https://example.test/schemas/args.json'
  await assert.rejects(tp.register(tool('broken', {
    source: 'plugin:evil',
    parameters: { $id: id, type: 'object', properties: { x: { $ref: '#/$defs/missing' } } }
  })), { statusCode: 422 })
  await tp.register(tool('victim', {
    source: 'plugin:victim',
    parameters: { $id: id, type: 'object', properties: { n: { type: 'integer' } }, required: ['n'] }
  }))
  await tp.register(tool('other', {
    source: 'plugin:evil',
    parameters: { $id: id, type: 'object', properties: { n: { type: 'string' } }, required: ['n'] }
  }))
  const victim = await tp.callTool('A', { name: 'victim', arguments: {} })
  assert.equal(victim.is_error, true)
  assert.match(victim.error ?? '', /required property 'n'/)
  assert.match((await tp.callTool('A', { name: 'victim', arguments: { n: 'x' } })).error ?? '', /must be integer/)
  assert.match((await tp.callTool('A', { name: 'other', arguments: { n: 1 } })).error ?? '', /must be string/)
})

test('cost bomb: anyOf branches that both $ref their definition (2^depth) are cut at limits.maxValidationMs, and another role answers meanwhile', ATTACK, async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A', 'B'] })
  const ping = await withBystander(tp)
  const registered = await httpJson(`${url}/api/tools/register`, 'POST', tool('nest', {
    role: 'A',
    parameters: {
      $ref: '#/$defs/d',
      $defs: { d: { anyOf: [{ type: 'array', items: { $ref: '#/$defs/d' } }, { type: 'array', items: { $ref: '#/$defs/d' } }] } }
    }
  }))
  assert.equal(registered.statusCode, 200)
  // 24 levels held the thread ~70 s and then exhausted the heap; 60 would never end.
  let nested: unknown = 1
  for (let i = 0; i < 60; i++) nested = [nested]
  const started = performance.now()
  const [call] = await Promise.all([
    httpJson(`${url}/api/tools/call`, 'POST', { role: 'A', name: 'nest', arguments: nested }),
    ping()
  ])
  assert.equal(call.statusCode, 200)
  assert.equal(call.body.is_error, true)
  assert.match(call.body.error, /^the arguments could not be checked against the tool's parameters: checking them took longer than 50 ms \(limits\.maxValidationMs\)/)
  assert.ok(performance.now() - started < 10_000)
  // Arguments the same schema checks quickly still pass (and reach the callback, which is not there).
  const shallow = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'A', name: 'nest', arguments: [[[]]] })
  assert.match(shallow.body.error, /unreachable/)
})

test('compile bomb: validator code nested deeper than V8 compiles reliably is a 422 schema_too_costly; a thousand properties are fine', async (t) => {
  // (A compile budget no busy machine reaches: the refusal tested is the nesting's, not the time's.)
  const tp = await createTestToolport(t, { roles: ['A'], limits: { maxSchemaCompileMs: 60_000 } })
  // 1 800 `not`s in an `allOf` (40 KB): V8's compile of the validator overflowed the main thread's
  // stack after ~1.7 s, on every call.
  const deep = await tp.register(tool('deep', {
    parameters: { allOf: Array.from({ length: 1800 }, (_, i) => ({ not: { const: i + 0.5 } })) }
  })).catch((err: unknown) => err as { statusCode: number, details: Array<{ code: string, message: string }> })
  assert.equal((deep as { statusCode: number }).statusCode, 422)
  const detail = (deep as { details: Array<{ code: string, message: string }> }).details[0]
  assert.equal(detail?.code, 'schema_too_costly')
  assert.match(detail?.message ?? '', /nests blocks more than 1024 deep/)
  const wide = await tp.register(tool('wide', {
    parameters: { type: 'object', properties: Object.fromEntries(Array.from({ length: 1000 }, (_, i) => [`p${i}`, { type: 'string' }])) }
  }))
  assert.equal(wide.ok, true)
})

test('inherited names: required "toString" is enforced and an optional "constructor" does not fail calls', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await tp.roles.get('A').registerLocalTool({
    name: 'own',
    // Parsed from JSON so that "__proto__" is an own key, as it is in a registration body.
    parameters: JSON.parse('{"type":"object","required":["toString"],' +
      '"properties":{"constructor":{"type":"string"},"toString":{"type":"string"},"__proto__":{"type":"string"}}}'),
    handler: () => 'ran'
  })
  const missing = await tp.callTool('A', { name: 'own', arguments: {} })
  assert.equal(missing.is_error, true)
  assert.match(missing.error ?? '', /required property 'toString'/)
  const ok = await tp.callTool('A', { name: 'own', raw_arguments: '{"toString":"yes"}' })
  assert.equal(ok.is_error, false, ok.text)
  assert.equal(ok.output, 'ran')
  const badConstructor = await tp.callTool('A', { name: 'own', raw_arguments: '{"toString":"yes","constructor":1}' })
  assert.equal(badConstructor.is_error, true)
})

test('a schema whose patterns exhaust RE2\'s WebAssembly memory is refused, and the compiler thread is replaced: the next schema with a pattern compiles', { timeout: 120_000 }, async (t) => {
  const tp = await createTestToolport(t, {
    roles: ['A'],
    limits: {
      maxBodyBytes: 8 * 1024 * 1024,
      maxParametersBytes: 4 * 1024 * 1024,
      maxSchemaCompileMs: 60_000,
      maxSchemaCodeBytes: 256 * 1024 * 1024
    }
  })
  const properties: Record<string, unknown> = {}
  for (let i = 0; i < 12_000; i++) properties[`p${i}`] = { type: 'string', pattern: `^x${i}y+$` }
  await assert.rejects(tp.register(tool('huge', { parameters: { type: 'object', properties } })), (err: Error & { code?: string }) => {
    assert.equal(err.code, 'TP_ERR_VALIDATION')
    assert.match(err.message, /its patterns need more memory than the regular-expression engine has/)
    return true
  })
  const small = await tp.register(tool('small', { parameters: { type: 'object', properties: { a: { type: 'string', pattern: '^y+$' } } } }))
  assert.equal(small.ok, true, JSON.stringify(small))
})

test('patterns kept on the main thread past RE2\'s WebAssembly memory do not break validation for good: the engine is loaded afresh (the old one freed), and every tool\'s patterns still judge their arguments', { timeout: 180_000 }, async (t) => {
  const external = async (): Promise<number> => {
    await collect()
    return process.memoryUsage().external
  }
  const tp = await createTestToolport(t, {
    roles: ['A'],
    dispatch: { mode: 'inline' },
    limits: { maxValidationMs: 30_000, maxParametersBytes: 256 * 1024, maxSchemaCompileMs: 60_000 }
  })
  const callback = 'http://127.0.0.1:9/x'
  // 8 tools of 1 000 distinct patterns each; one call each compiles all of its patterns (a few KB
  // of the engine's 16 MiB apiece), so the engine runs out of memory on the way, in every round.
  const calls: Array<Record<string, string>> = []
  for (let k = 0; k < 8; k++) {
    const properties: Record<string, unknown> = {}
    const args: Record<string, string> = {}
    for (let i = 0; i < 1000; i++) {
      properties[`p${i}`] = { type: 'string', pattern: `^${k}x${i}(ab|cd|ef)+[a-z]{0,8}$` }
      args[`p${i}`] = `${k}x${i}abq`
    }
    await tp.register({ name: `many_${k}`, callback_url: callback, parameters: { type: 'object', properties } })
    calls.push(args)
  }
  let afterFirst = 0
  for (let round = 0; round < 4; round++) {
    for (const [k, args] of calls.entries()) {
      const result = await tp.callTool('A', { name: `many_${k}`, arguments: args })
      // Checked and valid: the call went on to the (closed) callback.
      assert.match(result.error ?? '', /is unreachable/, `round ${round}, tool ${k}`)
    }
    if (round === 0) afterFirst = await external()
  }
  // Each round loads re2-wasm afresh at least once; a dropped instance (16 MiB) is freed, not kept.
  // Kept, three rounds would add 48 MiB or more; one instance may still be held at a reading.
  const growth = await external() - afterFirst
  assert.ok(growth < 32 * 1024 * 1024, `external memory grew by ${(growth / 2 ** 20).toFixed(0)} MiB over three rounds`)
  await tp.register({ name: 'probe', callback_url: callback, parameters: { type: 'object', properties: { a: { type: 'string', pattern: '^q+$', format: 'email' } } } })
  const refused = await tp.callTool('A', { name: 'probe', arguments: { a: 'zz' } })
  assert.match(refused.error ?? '', /^arguments do not match the tool's parameters/)
  const first = await tp.callTool('A', { name: 'many_0', arguments: { p0: 'nope' } })
  assert.match(first.error ?? '', /^arguments do not match the tool's parameters: \/p0 must match pattern/)
})
