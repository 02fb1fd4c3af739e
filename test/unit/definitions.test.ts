// toolDefinitions: a role's tools in every provider's format, and the route that
// serves them, GET /api/tools/definitions?role=&format=.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { toolDefinitions, type DefinitionFormat } from '../../src/main/index.js'
import { objectSchema } from '../../src/main/sessions/definitions.js'
import type { ToolDefinition } from '../../src/main/roles/tool-registry.js'
import { assertError, createTestToolport, inject, isCode } from '../helpers.js'

const WEATHER: ToolDefinition = {
  name: 'get_weather',
  description: 'Get weather for a location.',
  parameters: { type: 'object', properties: { location: { type: 'string' } }, required: ['location'] }
}
const TIME: ToolDefinition = { name: 'get_time', description: '', parameters: { type: 'object', properties: {} } }
const TOOLS = Object.freeze([WEATHER, TIME])

test('definitions: openai-chat is [{type:"function", function:{name, description, parameters}}] in registration order', () => {
  assert.deepEqual(toolDefinitions(TOOLS, 'openai-chat'), [
    {
      type: 'function',
      function: {
        name: 'get_weather',
        description: 'Get weather for a location.',
        parameters: WEATHER.parameters
      }
    },
    { type: 'function', function: { name: 'get_time', description: '', parameters: TIME.parameters } }
  ])
})

test('definitions: openai-realtime is the flat [{type:"function", name, description, parameters}]', () => {
  assert.deepEqual(toolDefinitions(TOOLS, 'openai-realtime'), [
    {
      type: 'function',
      name: 'get_weather',
      description: 'Get weather for a location.',
      parameters: WEATHER.parameters
    },
    { type: 'function', name: 'get_time', description: '', parameters: TIME.parameters }
  ])
})

test('definitions: anthropic is [{name, description, input_schema}]', () => {
  assert.deepEqual(toolDefinitions(TOOLS, 'anthropic'), [
    { name: 'get_weather', description: 'Get weather for a location.', input_schema: WEATHER.parameters },
    { name: 'get_time', description: '', input_schema: TIME.parameters }
  ])
})

test('definitions: gemini is one Tool of functionDeclarations with parametersJsonSchema, or no Tool for no tools', () => {
  assert.deepEqual(toolDefinitions(TOOLS, 'gemini'), [{
    functionDeclarations: [
      { name: 'get_weather', description: 'Get weather for a location.', parametersJsonSchema: WEATHER.parameters },
      { name: 'get_time', description: '', parametersJsonSchema: TIME.parameters }
    ]
  }])
  assert.deepEqual(toolDefinitions([], 'gemini'), [])
})

test('definitions: mcp is [{name, description, inputSchema}] as tools/list returns it', () => {
  assert.deepEqual(toolDefinitions(TOOLS, 'mcp'), [
    { name: 'get_weather', description: 'Get weather for a location.', inputSchema: WEATHER.parameters },
    { name: 'get_time', description: '', inputSchema: TIME.parameters }
  ])
})

test('definitions: a schema with an object root is passed as it is; any other gets type "object" on a copy, dropping malformed parts', () => {
  assert.equal(objectSchema(WEATHER.parameters), WEATHER.parameters)
  const loose = { properties: { q: { type: 'string' } }, description: 'search' }
  assert.deepEqual(objectSchema(loose), {
    type: 'object',
    properties: { q: { type: 'string' } },
    description: 'search'
  })
  assert.deepEqual(loose, { properties: { q: { type: 'string' } }, description: 'search' },
    'the plugin schema is not mutated')
  assert.deepEqual(objectSchema({ type: 'string' }), { type: 'object' })
  assert.deepEqual(objectSchema({ type: 'object', properties: { a: 'not a schema' }, required: [1] }),
    { type: 'object' })
  assert.equal(objectSchema(loose), objectSchema(loose), 'the copy is memoised per schema')
})

test('definitions: a root anyOf/oneOf/allOf (zod\'s unions), which OpenAI and Anthropic refuse, is merged into the root\'s properties; an array without items gets items {}', () => {
  // z.discriminatedUnion's JSON Schema: a root oneOf of closed object branches.
  const union = {
    $schema: 'https://json-schema.org/draft/2020-12/schema',
    oneOf: [
      { type: 'object', properties: { kind: { const: 'a' }, x: { type: 'string' } }, required: ['kind', 'x'], additionalProperties: false },
      { type: 'object', properties: { kind: { const: 'b' }, y: { type: 'array' } }, required: ['kind', 'y'], additionalProperties: false }
    ]
  }
  assert.deepEqual(objectSchema(union), {
    $schema: 'https://json-schema.org/draft/2020-12/schema',
    type: 'object',
    // The discriminator keeps both values: the model may pick either branch.
    properties: { kind: { anyOf: [{ const: 'a' }, { const: 'b' }] }, x: { type: 'string' }, y: { type: 'array', items: {} } },
    required: ['kind']
  })
  // allOf requires what each branch requires; a local $ref branch is followed; root not/enum go.
  assert.deepEqual(objectSchema({
    $defs: { A: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] } },
    type: 'object',
    properties: { z: { type: ['array', 'null'] } },
    allOf: [{ $ref: '#/$defs/A' }, { required: ['z'] }],
    not: { required: ['q'] }
  }), {
    $defs: { A: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] } },
    type: 'object',
    properties: { z: { type: ['array', 'null'], items: {} }, a: { type: 'integer' } },
    required: ['a', 'z']
  })
  const plain = { type: 'object', properties: { tags: { type: 'array', items: { type: 'string' } }, pair: { type: 'array', prefixItems: [{}, {}], items: false } } }
  assert.equal(objectSchema(plain), plain, 'a schema that needs nothing is passed as it is')
  // A tuple without items (the Python SDK's tuple[float, float]: OpenAI refuses it), and inside a
  // tuple too; never in data (`default`, `examples`, an extension keyword).
  assert.deepEqual(objectSchema({
    type: 'object',
    properties: { pair: { type: 'array', prefixItems: [{ type: 'array' }], default: { type: 'array' } } },
    'x-example': { type: 'array' }
  }), {
    type: 'object',
    properties: { pair: { type: 'array', prefixItems: [{ type: 'array', items: {} }], default: { type: 'array' }, items: {} } },
    'x-example': { type: 'array' }
  })
  // A root not, enum or const is left out without a root combinator too.
  assert.deepEqual(objectSchema({ type: 'object', properties: { a: { type: 'string' } }, not: { required: ['a'] }, enum: [{}], const: {} }),
    { type: 'object', properties: { a: { type: 'string' } } })
  // A closed root refuses what its branches add: nothing is added. A malformed %-escape in a $ref names nothing.
  assert.deepEqual(objectSchema({
    type: 'object',
    properties: { a: { type: 'string' } },
    additionalProperties: false,
    anyOf: [{ properties: { b: { type: 'string' } } }, { $ref: '#/$defs/%zz' }]
  }), { type: 'object', properties: { a: { type: 'string' } }, additionalProperties: false })
})

test('definitions: results are frozen and memoised per registry snapshot; a registry change gives new ones', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const role = tp.roles.get('Lanlan')
  await tp.register({ name: 'a', callback_url: 'http://127.0.0.1:9333/a' })
  const first = toolDefinitions(role, 'openai-chat')
  assert.equal(toolDefinitions(role, 'openai-chat'), first)
  assert.ok(Object.isFrozen(first) && Object.isFrozen(first[0]))
  await tp.register({ name: 'b', callback_url: 'http://127.0.0.1:9333/b' })
  const second = toolDefinitions(role, 'openai-chat')
  assert.notEqual(second, first)
  assert.deepEqual(second.map((tool) => tool.function.name), ['a', 'b'])
})

test('definitions: an unknown format is TP_ERR_VALIDATION (422), including names of Object.prototype', () => {
  for (const format of ['openai', 'toString', '__proto__', '']) {
    assert.throws(() => toolDefinitions(TOOLS, format as DefinitionFormat), isCode('TP_ERR_VALIDATION', 422))
  }
})

test('definitions: GET /api/tools/definitions answers {ok, role, format, tools} for the role and format asked', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan', 'Mochi'] })
  await tp.register({ ...WEATHER, callback_url: 'http://127.0.0.1:9333/w', role: 'Lanlan' })
  for (const format of ['openai-chat', 'openai-realtime', 'anthropic', 'gemini', 'mcp'] as const) {
    const reply = await inject(tp, 'GET', `/api/tools/definitions?role=Lanlan&format=${format}`)
    assert.equal(reply.statusCode, 200)
    assert.deepEqual(reply.body, {
      ok: true,
      role: 'Lanlan',
      format,
      tools: toolDefinitions(tp.roles.get('Lanlan'),
        format)
    })
  }
  const mochi = await inject(tp, 'GET', '/api/tools/definitions?role=Mochi&format=mcp')
  assert.deepEqual(mochi.body.tools, [])
})

test('definitions: GET /api/tools/definitions defaults to openai-chat', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  await tp.register({ ...WEATHER, callback_url: 'http://127.0.0.1:9333/w' })
  const reply = await inject(tp, 'GET', '/api/tools/definitions?role=Lanlan')
  assert.equal(reply.body.format, 'openai-chat')
  assert.equal(reply.body.tools[0].function.name, 'get_weather')
})

test('definitions, R6, R7: GET /api/tools/definitions: unknown role 404, missing role or bad format 422', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  assertError(await inject(tp, 'GET', '/api/tools/definitions?role=Nobody&format=mcp'), 404, 'TP_ERR_ROLE_NOT_FOUND')
  assertError(await inject(tp, 'GET', '/api/tools/definitions?format=mcp'), 422, 'TP_ERR_VALIDATION')
  assertError(await inject(tp, 'GET', '/api/tools/definitions?role=Lanlan&format=cohere'), 422, 'TP_ERR_VALIDATION')
})

test('definitions, R1: GET /api/tools/definitions is behind the loopback guard', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  assertError(await inject(tp, 'GET', '/api/tools/definitions?role=Lanlan', undefined, { remoteAddress: '10.1.2.3' }),
    403, 'TP_ERR_NOT_LOOPBACK')
})
