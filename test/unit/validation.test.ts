// Argument validation: JSON Schema dialects chosen by `$schema`, `$ref`/`$defs`, formats on RE2,
// and the refusals at registration (docs/protocol.md R7: a field that fails validation is a 422).
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { z } from 'zod'
import { compileCount, compileValidator, DEFAULT_SCHEMA_BUDGETS } from '../../src/main/dispatch/validators.js'
import { CheckTime } from '../../src/main/dispatch/check-time.js'
import { validationBudget } from '../../src/shared/validation-cost.js'
import { fullFormats } from 'ajv-formats/dist/formats.js'
import {
  asciiCaseless, MAX_BACKTRACKING_FORMAT_CHARS, SCHEMA_FORMATS, schemaDialect, validationJson
} from '../../src/shared/json-schema.js'
import { resolvePluginOptions } from '../../src/plugin/options.js'
import { createTestToolport, inject, tool } from '../helpers.js'

const compile = (schema: Record<string, unknown>): ReturnType<typeof compileValidator> => compileValidator(schema,
  DEFAULT_SCHEMA_BUDGETS)

test('$schema picks the dialect: 2020-12 (also when absent), 2019-09, draft-07; others are refused', () => {
  assert.deepEqual(schemaDialect({}), { ok: true, dialect: '2020-12' })
  assert.deepEqual(schemaDialect({ $schema: 'https://json-schema.org/draft/2020-12/schema' }), {
    ok: true,
    dialect: '2020-12'
  })
  assert.deepEqual(schemaDialect({ $schema: 'https://json-schema.org/draft/2020-12/schema#' }), {
    ok: true,
    dialect: '2020-12'
  })
  assert.deepEqual(schemaDialect({ $schema: 'https://json-schema.org/draft/2019-09/schema' }), {
    ok: true,
    dialect: '2019-09'
  })
  assert.deepEqual(schemaDialect({ $schema: 'http://json-schema.org/draft-07/schema#' }), {
    ok: true,
    dialect: 'draft-07'
  })
  assert.deepEqual(schemaDialect({ $schema: 'https://json-schema.org/draft-07/schema' }), {
    ok: true,
    dialect: 'draft-07'
  })
  for (const $schema of ['http://json-schema.org/draft-04/schema#', 'https://example.com/schema', 7, '']) {
    assert.equal(schemaDialect({ $schema }).ok, false, String($schema))
  }
})

test('the validator cache key leaves out text annotations of subschemas, and nothing else', () => {
  const described = {
    title: 'Weather',
    description: 'Arguments',
    $comment: 'v2',
    type: 'object',
    properties: {
      // A property may be named like an annotation: its name and schema stay.
      description: { type: 'string', description: 'the text', maxLength: 10 },
      title: { type: 'string', title: 'A title' },
      when: { anyOf: [{ type: 'string', description: 'ISO date' }, { type: 'null', title: 'none' }] },
      tags: { type: 'array', items: { type: 'string', description: 'a tag' } },
      mode: { const: { description: 'kept: a value, not a schema' }, default: { title: 'kept too' } },
      kind: { enum: [{ description: 'kept' }], examples: [{ description: 'kept' }] },
      count: { type: 'integer', description: 7 }
    },
    $defs: { point: { type: 'number', description: 'a point' } },
    required: ['description', 'title']
  }
  assert.deepEqual(JSON.parse(validationJson(described)), {
    type: 'object',
    properties: {
      description: { type: 'string', maxLength: 10 },
      title: { type: 'string' },
      when: { anyOf: [{ type: 'string' }, { type: 'null' }] },
      tags: { type: 'array', items: { type: 'string' } },
      mode: { const: { description: 'kept: a value, not a schema' }, default: { title: 'kept too' } },
      kind: { enum: [{ description: 'kept' }], examples: [{ description: 'kept' }] },
      // Not a string: not an annotation Toolport leaves out (the meta-schema refuses it).
      count: { type: 'integer', description: 7 }
    },
    $defs: { point: { type: 'number' } },
    required: ['description', 'title']
  })
  // Nothing to leave out: the text JSON.stringify writes.
  const bare = { type: 'object', properties: { q: { type: 'string' } } }
  assert.equal(validationJson(bare), JSON.stringify(bare))
  // An unknown keyword's value is not a subschema, even under a name json-schema-traverse's
  // tables would match through the prototype chain.
  const unknown = { $ref: '#/constructor', constructor: { const: { description: 'd' } } }
  assert.equal(validationJson(unknown), JSON.stringify(unknown))
  // A reference into an annotation keeps the schema whole (it resolves to the annotation).
  const intoAnnotation = { properties: { a: { type: 'string', description: 'x' } }, $ref: '#/properties/a/description' }
  assert.equal(validationJson(intoAnnotation), JSON.stringify(intoAnnotation))
  // One object used as a subschema and inside a value (an in-process tool's schema): the value keeps it.
  const shared = { type: 'string', description: 'x' }
  assert.deepEqual(JSON.parse(validationJson({ properties: { a: shared }, default: { a: shared } })),
    { properties: { a: { type: 'string' } }, default: { a: { type: 'string', description: 'x' } } })
})

test('schemas that differ only in their descriptions share one compiled validator', async () => {
  const shape = (description: string): Record<string, unknown> => ({
    type: 'object',
    description,
    properties: { city: { type: 'string', minLength: 2, description: `${description}: the city` } },
    required: ['city']
  })
  const first = await compile(shape('Weather now'))
  const before = compileCount()
  const second = await compile(shape('Weather tomorrow'))
  assert.equal(compileCount(), before, 'no second compile')
  assert.equal(second, first)
  assert.equal(second({ city: 'Oslo' }), '')
  assert.match(second({ city: 'O' }), /must NOT have fewer than 2 characters/)
  // A different constraint is a different validator.
  const other = await compile({ ...shape('Weather now'), required: [] })
  assert.equal(compileCount(), before + 1)
  assert.equal(other({}), '')
  assert.notEqual(second({}), '')
})

test('2020-12 with $defs and $ref validates', async () => {
  const validate = await compile({
    $schema: 'https://json-schema.org/draft/2020-12/schema',
    $defs: { city: { type: 'string', minLength: 2 } },
    type: 'object',
    properties: {
      from: { $ref: '#/$defs/city' },
      to: { $ref: '#/$defs/city' },
      stops: {
        type: 'array',
        prefixItems: [{ type: 'integer' }]
      }
    },
    required: ['from']
  })
  assert.equal(validate({ from: 'Paris', to: 'Oslo', stops: [1, 'x'] }), '')
  assert.match(validate({ from: 'P' }), /\/from must NOT have fewer than 2 characters/)
  assert.match(validate({ to: 'Oslo' }), /required property 'from'/)
  // prefixItems is a 2020-12 keyword: it is enforced.
  assert.match(validate({ from: 'Paris', stops: ['x'] }), /\/stops\/0 must be integer/)
})

test('no $schema is 2020-12: prefixItems and $defs apply', async () => {
  const validate = await compile({
    $defs: { n: { type: 'integer' } },
    type: 'object',
    properties: { p: { prefixItems: [{ $ref: '#/$defs/n' }] } }
  })
  assert.match(validate({ p: ['x'] }), /\/p\/0 must be integer/)
  assert.equal(validate({ p: [1] }), '')
})

test('2019-09 with $defs, $ref and unevaluatedProperties validates', async () => {
  const validate = await compile({
    $schema: 'https://json-schema.org/draft/2019-09/schema',
    $defs: { id: { type: 'integer', minimum: 1 } },
    type: 'object',
    properties: { id: { $ref: '#/$defs/id' } },
    unevaluatedProperties: false
  })
  assert.equal(validate({ id: 3 }), '')
  assert.match(validate({ id: 0 }), /\/id must be >= 1/)
  assert.match(validate({ id: 3, extra: true }), /must NOT have unevaluated properties/)
})

test('draft-07 with definitions, $ref and array items validates', async () => {
  const validate = await compile({
    $schema: 'http://json-schema.org/draft-07/schema#',
    definitions: { tag: { type: 'string', enum: ['a', 'b'] } },
    type: 'object',
    properties: {
      tags: { type: 'array', items: { $ref: '#/definitions/tag' } },
      pair: {
        type: 'array',
        items: [{ type: 'string' }, { type: 'number' }]
      }
    }
  })
  assert.equal(validate({ tags: ['a', 'b'], pair: ['x', 1] }), '')
  assert.match(validate({ tags: ['c'] }), /\/tags\/0 must be equal to one of the allowed values/)
  assert.match(validate({ pair: [1, 1] }), /\/pair\/0 must be string/)
})

test('formats are checked (ajv-formats): date-time, email, uuid, ipv4, uri', async () => {
  const validate = await compile({
    type: 'object',
    properties: {
      when: { type: 'string', format: 'date-time' },
      mail: { type: 'string', format: 'email' },
      id: { type: 'string', format: 'uuid' },
      ip: { type: 'string', format: 'ipv4' },
      link: { type: 'string', format: 'uri' }
    }
  })
  assert.equal(validate({
    when: '2026-12-01T05:00:00Z',
    mail: 'a@b.example',
    id: '123e4567-e89b-12d3-a456-426614174000',
    ip: '127.0.0.1',
    link: 'https://x.example/a'
  }), '')
  assert.match(validate({ when: '2026-02-30T05:00:00Z' }), /\/when must match format "date-time"/)
  assert.match(validate({ mail: 'not an email' }), /\/mail must match format "email"/)
  assert.match(validate({ ip: '300.1.1.1' }), /\/ip must match format "ipv4"/)
  assert.match(validate({ link: 'no scheme' }), /\/link must match format "uri"/)
})

test('format regexes run on RE2, or on bounded input when RE2 cannot run them', () => {
  const test = (name: string, input: string): boolean => (SCHEMA_FORMATS[name] as (s: string) => boolean)(input)
  // RE2-backed formats take input of any length.
  assert.equal(test('byte', 'QUJD'.repeat(100_000)), true)
  assert.equal(test('email', `${'a'.repeat(100_000)}@`), false)
  // url (lookaheads) and uri: longer than the bound is invalid, so their backtracking regex never sees it.
  assert.equal(test('url', 'http://example.com/a'), true)
  assert.equal(test('url', `http://example.com/${'a'.repeat(MAX_BACKTRACKING_FORMAT_CHARS)}`), false)
  assert.equal(test('uri', `https://example.com/${'a'.repeat(MAX_BACKTRACKING_FORMAT_CHARS)}`), false)
  assert.equal(test('hostname', 'example.com'), true)
  assert.equal(test('duration', 'P1DT2H'), true)
  assert.equal(test('duration', 'P'), false)
})

test('case-insensitive format regexes match ASCII letters only, as ajv-formats\' JavaScript regexes do', () => {
  assert.equal(asciiCaseless('^[a-z0-9-]+@x\\.co$'), '^[a-z0-9\\-A-Z]+@[xX]\\.[cC][oO]$')
  assert.equal(asciiCaseless('^\\x41[\\x00-\\x20b-d]$'), '^[aA][\\x00-\\x20b-dB-D]$')
  // Not rewritten (the format then runs as JavaScript on bounded input): non-ASCII, \p, backreferences.
  for (const source of ['\u00e9', '\\p{L}', '(a)\\1', '[]']) assert.equal(asciiCaseless(source), null, source)
  const inputs = ['a@example.com', 'A@EXAMPLE.COM', '\u212a@example.com', '\u017f@example.com', 'x@\u212a.example',
    '123E4567-E89B-12D3-A456-426614174000', 'urn:uuid:123e4567-e89b-12d3-a456-42661417400\u212a', 'FE80::1', '#/A/b~0',
    'HTTP://a.example/x', '{+Var}', 'ſ']
  for (const [name, format] of Object.entries(fullFormats)) {
    if (!(format instanceof RegExp) || !format.flags.includes('i') || format.flags.includes('u')) continue
    assert.notEqual(asciiCaseless(format.source), null, name)
    for (const input of inputs) {
      assert.equal((SCHEMA_FORMATS[name] as (s: string) => boolean)(input), format.test(input), `${name} ${JSON.stringify(input)}`)
    }
  }
})

test('a $schema URI of a dialect in the other scheme (http for 2020-12 and 2019-09, https for draft-07) is that dialect', async () => {
  for (const $schema of ['http://json-schema.org/draft/2020-12/schema', 'http://json-schema.org/draft/2019-09/schema#',
    'https://json-schema.org/draft-07/schema#']) {
    const validate = await compile({ $schema, type: 'object', required: ['a'] })
    assert.equal(validate({ a: 1 }), '', $schema)
    assert.match(validate({}), /required property 'a'/, $schema)
    await assert.rejects(compile({ $schema, type: 'strnig' }), (err: { details: Array<{ code: string }> }) =>
      err.details[0]?.code === 'invalid_schema')
  }
})

test('a `__proto__` key in a schema value is a key: const, enum, and the properties an additionalProperties check reads', async () => {
  // Parsed from JSON, as a registration body is: `__proto__` is an own key.
  const constant = await compile(JSON.parse('{"const":{"__proto__":{"x":1}}}'))
  assert.equal(constant(JSON.parse('{"__proto__":{"x":1}}')), '')
  assert.match(constant({}), /must be equal to constant/)
  const listed = await compile(JSON.parse('{"enum":[{"__proto__":1},2]}'))
  assert.equal(listed(JSON.parse('{"__proto__":1}')), '')
  assert.match(listed({}), /allowed values/)
  // Past eight properties Ajv looks keys up in the schema's `properties` object at run time (and,
  // as Ajv does, applies no subschema to a property named `__proto__`, but does not call it additional).
  const closed = await compile(JSON.parse('{"type":"object","additionalProperties":false,"properties":{' +
    '"a":{},"b":{},"c":{},"d":{},"e":{},"f":{},"g":{},"h":{},"i":{},"__proto__":{"type":"string"}}}'))
  assert.equal(closed(JSON.parse('{"__proto__":1,"a":1}')), '')
  assert.match(closed({ z: 1 }), /additional properties/)
})

test('uniqueItems over objects is linear and keeps Ajv\'s answer: the same pair in the error, key order ignored', async () => {
  // (A budget for slow machines: the check's deadline is tested in validation-hostile.test.ts.)
  const unique = await compileValidator({ type: 'array', uniqueItems: true }, { ...DEFAULT_SCHEMA_BUDGETS, maxValidationMs: 60_000 })
  const items = Array.from({ length: 20_000 }, (_, i) => ({ a: i, b: [i, 'x'] }))
  assert.equal(unique(items), '')
  assert.match(unique([...items, { b: [7, 'x'], a: 7 }, 1, '1']), /items ## 7 and 20000 are identical/)
  assert.match(unique([1, 2, 1, 2]), /items ## 1 and 3 are identical/)
  assert.equal(unique([1, '1', [1], { 1: 1 }, null, 0]), '')
  // An object whose own toString is not a function: Ajv's equality throws, so the call cannot be checked.
  assert.match(unique(JSON.parse('[{"toString":1},{"toString":1}]')), /could not be checked/)
})

test('a schema holding a number outside the range of a double (1e400) is refused, not read as null', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const parameters of ['{"enum":[1e400]}', '{"type":"number","maximum":-1e400}', '{"const":{"a":[1e999]}}']) {
    const res = await tp.app.inject({
      method: 'POST',
      url: '/api/tools/register',
      headers: { 'content-type': 'application/json' },
      payload: `{"name":"t","callback_url":"http://127.0.0.1:9/cb","parameters":${parameters}}`
    })
    const body = JSON.parse(res.body) as { details: Array<{ path: string, code: string, message: string }> }
    assert.equal(res.statusCode, 422, parameters)
    assert.deepEqual([body.details[0]?.path, body.details[0]?.code], ['parameters', 'invalid_schema'])
    assert.match(body.details[0]?.message ?? '', /outside the range of a double/)
  }
  assert.deepEqual(tp.list().tools_by_role.A, [])
})

test('a zod 4 z.toJSONSchema output (2020-12, $schema included) validates', async () => {
  const Trip = z.object({
    city: z.string().min(2),
    days: z.number().int().positive(),
    when: z.iso.datetime().optional(),
    travellers: z.array(z.object({ name: z.string() })).max(3)
  })
  const schema = z.toJSONSchema(Trip) as Record<string, unknown>
  assert.equal(schema.$schema, 'https://json-schema.org/draft/2020-12/schema')
  const validate = await compile(schema)
  assert.equal(validate({ city: 'Rome', days: 2, travellers: [{ name: 'Ann' }] }), '')
  assert.match(validate({ city: 'R', days: 2, travellers: [] }), /\/city/)
  assert.match(validate({ city: 'Rome', days: 0, travellers: [] }), /\/days/)
  assert.match(validate({ city: 'Rome', days: 1, travellers: [], when: 'yesterday' }), /\/when/)
})

test('R7: an unknown $schema is a 422 TP_ERR_VALIDATION naming parameters', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const res = await inject(tp, 'POST', '/api/tools/register', tool('t', {
    parameters: { $schema: 'http://json-schema.org/draft-04/schema#', type: 'object' }
  }))
  assert.equal(res.statusCode, 422)
  assert.equal(res.body.code, 'TP_ERR_VALIDATION')
  assert.deepEqual(res.body.details.map((d: { path: string, code: string }) => [d.path, d.code]), [['parameters',
    'unsupported_dialect']])
  assert.deepEqual(tp.list().tools_by_role.A, [])
})

test('R7: a schema that is not valid in its dialect, or does not compile, is a 422 and nothing is registered', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const parameters of [
    { type: 'object', properties: { a: { type: 'strnig' } } },
    { type: 'object', properties: { a: { $ref: '#/$defs/missing' } } },
    { type: 'object', properties: { a: { $ref: 'https://example.com/remote.json' } } },
    { type: 'object', properties: { a: { type: 'string', pattern: '(' } } }
  ]) {
    const res = await inject(tp, 'POST', '/api/tools/register', tool('t', { parameters }))
    assert.equal(res.statusCode, 422, JSON.stringify(parameters))
    assert.equal(res.body.details[0].code, 'invalid_schema')
  }
  // Local tools follow the same rules.
  await assert.rejects(tp.roles.get('A').registerLocalTool({
    name: 'local', parameters: { $schema: 'https://example.com/x' }, handler: () => null
  }), { statusCode: 422, code: 'TP_ERR_VALIDATION' })
  assert.deepEqual(tp.list().tools_by_role.A, [])
})

test('plugin SDK: JSON Schema parameters follow the same dialect rules at construction', () => {
  const base = { toolportUrl: 'http://127.0.0.1:3917', source: 'plugin:t', logger: false as const }
  assert.throws(() => resolvePluginOptions({
    ...base,
    tools: {
      t: {
        parameters: { $schema: 'http://json-schema.org/draft-04/schema#', type: 'object' },
        handler: () => null
      }
    }
  }), { code: 'TP_ERR_PLUGIN_OPTIONS' })
  assert.throws(() => resolvePluginOptions({
    ...base,
    tools: {
      t: {
        parameters: { type: 'object', properties: { q: { type: 'string', pattern: '(a)\\1' } } },
        handler: () => null
      }
    }
  }), { code: 'TP_ERR_PLUGIN_OPTIONS' })
  const resolved = resolvePluginOptions({
    ...base,
    tools: {
      t: {
        parameters: { $schema: 'https://json-schema.org/draft/2019-09/schema', type: 'object', required: ['q'] },
        handler: () => null
      },
      z: { parameters: z.object({ q: z.string() }), handler: () => null }
    }
  })
  const validate = resolved.tools.get('t')?.validate
  assert.ok(validate != null)
  assert.equal(validate({ q: 1 }), true)
  assert.equal(validate({}), false)
  // A zod tool is registered as 2020-12 without $schema: Toolport's default dialect.
  assert.equal(resolved.tools.get('z')?.parameters.$schema, undefined)
})

test('SECURITY.md "Argument validation": only a costly check is charged to its tool\'s account (a cheap one charges nothing); an overdrawn account cuts checks short, and a cheap one still passes', async () => {
  const validate = await compile({
    type: 'object',
    properties: { v: { $ref: '#/$defs/n' } },
    $defs: { n: { anyOf: [{ type: 'array', items: { $ref: '#/$defs/n' } }, { type: 'array', items: { $ref: '#/$defs/n' } }] } }
  })
  const deep = JSON.parse(`{"v":${'['.repeat(40)}1${']'.repeat(40)}}`)
  const account = new CheckTime()
  assert.equal(validate({ v: [[[]]] }, account), '')
  assert.equal(validationBudget.costlyMs, 0)
  assert.equal(account.debtMs, 0)
  // Run to its deadline (it stops only once the clock is past it): more than the tool's burst.
  assert.match(validate(deep, account), /checking them took longer than 50 ms/)
  assert.equal(account.refused, false)
  assert.ok(account.debtMs > 50, String(account.debtMs))
  assert.equal(account.isOverdrawn, true)
  // Overdrawn for a while (ten deadlines' worth of checks: ten seconds at 50 ms a second).
  account.debtMs = 500
  account.at = performance.now()
  assert.equal(validate({ v: [[[]]] }, account), '')
  assert.match(validate(deep, account), /checking this tool's arguments took more than its share of time lately/)
  assert.equal(account.refused, true)
  assert.ok(validationBudget.costlyMs > 0)
  assert.match(validate({ v: 'x' }, account), /must be array/)
  assert.equal(account.refused, false)
})
