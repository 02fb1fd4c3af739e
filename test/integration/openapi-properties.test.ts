// The HTTP API as documented: the OpenAPI document at GET /openapi.json (README "The API":
// "generated from the same zod schemas the routes validate with"), the error catalogue (README
// "Errors", docs/protocol.md "Errors of the API itself") and the metrics (README "The API",
// `/metrics`) treated as the contract.
//
// - The document itself: OpenAPI 3.1 structure, every `$ref` resolves, every schema compiles,
//   examples validate.
// - The routes fastify serves against the documented operations (both directions).
// - One property per documented operation: requests generated from the document (valid bodies,
//   query and path parameters from its schemas, and mutated ones: wrong types, missing required
//   fields, extra fields, wrong content types, huge values, unicode, empty bodies, duplicate keys,
//   deep nesting, foreign Host/Origin) go over real HTTP to a real Toolport (pool mode, tools on a
//   real callback server); every answer must have a documented status, a documented content type,
//   a body that validates against the documented schema, a catalogued error code with the
//   catalogue's status, and the security headers every answer carries (SECURITY.md).
// - Metrics: after a random sequence of API operations the Prometheus text parses strictly and
//   `toolport_calls_total`, `toolport_call_duration_seconds_count` and `toolport_registry_tools`
//   equal what the sequence did.
// - GET /api/events: `hello` first, then the documented events of the sequence, filtered by `types`.
import assert from 'node:assert/strict'
import { STATUS_CODES } from 'node:http'
import { connect } from 'node:net'
import { test, type TestContext } from 'node:test'
import fc from 'fast-check'
import { Ajv2020 } from 'ajv/dist/2020.js'
import { fullFormats } from 'ajv-formats/dist/formats.js'
import { request as httpRequest } from 'undici'
import { ERROR_CODES } from '../../src/main/errors.js'
import type { Toolport, ToolportOptions } from '../../src/main/index.js'
import { callbackServer, within } from '../helpers.js'
import { closedPort, type CallbackServer } from '../fixtures/callback-server.js'

const RUNS = Math.max(1, Number(process.env.TP_PROPERTY_RUNS ?? '1'))
const FAILING_TIMEOUT_MS = 600_000
/** Sequence properties start a Toolport per run: a bounded number of shrinks keeps a failure's report quick. */
const MAX_SHRINKS = 25
const REQUEST_GUARD_MS = 10_000
/** A HEAD answer is headers only: far more than enough (a hang guard, not a timing check). */
const HEAD_GUARD_MS = 3_000
/** Small limits, so that "huge" and "deep" bodies stay cheap. */
const MAX_BODY_BYTES = 16 * 1024
const MAX_JSON_DEPTH = 12
const ROLES = ['default', 'extra'] as const

type Json = null | boolean | number | string | Json[] | { [key: string]: Json }
type Schema = Record<string, any>
type Ajv = InstanceType<typeof Ajv2020>
type Validator = ((data: unknown) => boolean) & { errors?: unknown }

interface Operation {
  method: string
  path: string
  op: Schema
}

interface Reply {
  status: number
  headers: Record<string, string | string[] | undefined>
  text: string
}

const BASE_OPTIONS: ToolportOptions = {
  roles: [...ROLES],
  dispatch: { mode: 'pool', threads: 1 },
  limits: { maxBodyBytes: MAX_BODY_BYTES, maxJsonDepth: MAX_JSON_DEPTH }
}

// ---------------------------------------------------------------------------------------------
// Fixture: one Toolport and one callback server per test, the document fetched over HTTP.

interface Fixture {
  tp: Toolport
  url: string
  port: number
  cb: CallbackServer
  doc: Schema
  /** Every route fastify registered (method, url, hidden?), collected with an onRoute hook. */
  routes: Array<{ method: string, url: string, hidden: boolean }>
}

/**
 * Runs `fn` with a context whose `after` callbacks run when `fn` ends (a fixture per property
 * run: node:test's subtests do not reject, so fast-check would not see their failures).
 */
async function scoped<T> (fn: (t: TestContext) => Promise<T>): Promise<T> {
  const cleanups: Array<() => unknown> = []
  const t = { after: (cleanup: () => unknown) => { cleanups.push(cleanup) } } as unknown as TestContext
  try {
    return await fn(t)
  } finally {
    for (const cleanup of cleanups.reverse()) await cleanup()
  }
}

async function fixture (t: TestContext, options: ToolportOptions = {}): Promise<Fixture> {
  const cb = await callbackServer(t)
  const routes: Fixture['routes'] = []
  const started = await startToolportWithHook(t, { ...BASE_OPTIONS, ...options }, routes)
  const token = options.security?.token
  const res = await send(started.url, {
    method: 'GET',
    path: '/openapi.json',
    headers: token === undefined ? {} : { authorization: `Bearer ${token}` }
  })
  assert.equal(res.status, 200)
  return { ...started, cb, doc: JSON.parse(res.text), routes }
}

/** startToolport, with an onRoute hook added before the app's plugins load. */
async function startToolportWithHook (t: TestContext, options: ToolportOptions,
  routes: Fixture['routes']): Promise<{ tp: Toolport, url: string, port: number }> {
  const { createToolport } = await import('../../src/main/index.js')
  const tp = await createToolport({ logger: false, ...options })
  t.after(() => tp.close())
  tp.app.addHook('onRoute', (route) => {
    const methods = Array.isArray(route.method) ? route.method : [route.method]
    for (const method of methods) {
      routes.push({ method, url: route.url ?? route.path, hidden: (route.schema as Schema | undefined)?.hide === true })
    }
  })
  const { url, port } = await tp.listen({ host: '127.0.0.1', port: 0 })
  return { tp, url, port }
}

interface RawRequest {
  method: string
  path: string
  headers?: Record<string, string>
  body?: string
}

/** One real HTTP request; the body of a 200 event stream is not read (it never ends). */
async function send (base: string, req: RawRequest, guardMs = REQUEST_GUARD_MS): Promise<Reply> {
  return await within((async () => {
    const res = await httpRequest(`${base}${req.path}`, {
      method: req.method as 'GET',
      headers: req.headers ?? {},
      ...(req.body === undefined ? {} : { body: req.body })
    })
    const type = String(res.headers['content-type'] ?? '')
    let text = ''
    if (res.statusCode === 200 && type.startsWith('text/event-stream')) {
      res.body.on('error', () => {})
      res.body.destroy()
    } else {
      text = await res.body.text()
    }
    return { status: res.statusCode, headers: res.headers as Reply['headers'], text }
  })(), `${req.method} ${req.path}`, guardMs)
}

// ---------------------------------------------------------------------------------------------
// The document: operations, $refs, schemas.

const METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace']

function operations (doc: Schema): Operation[] {
  const out: Operation[] = []
  for (const [path, item] of Object.entries(doc.paths as Record<string, Schema>)) {
    for (const method of METHODS) {
      if (item[method] !== undefined) out.push({ method: method.toUpperCase(), path, op: item[method] })
    }
  }
  return out
}

function resolvePointer (doc: Schema, ref: string): unknown {
  if (!ref.startsWith('#/')) return undefined
  let node: any = doc
  for (const raw of ref.slice(2).split('/')) {
    const key = decodeURIComponent(raw).replace(/~1/g, '/').replace(/~0/g, '~')
    if (node === null || typeof node !== 'object' || !Object.hasOwn(node, key)) return undefined
    node = node[key]
  }
  return node
}

function walk (node: unknown, visit: (value: Record<string, unknown>, path: string) => void, path = '#'): void {
  if (node === null || typeof node !== 'object') return
  if (!Array.isArray(node)) visit(node as Record<string, unknown>, path)
  for (const [key, value] of Object.entries(node)) walk(value, visit, `${path}/${key}`)
}

function newAjv (): Ajv {
  return new Ajv2020({ strict: false, allErrors: true, formats: fullFormats, validateFormats: true })
}

/** Replaces `$ref`s into the document by their targets (the document has no recursive refs). */
function deref (doc: Schema, node: unknown, depth = 0): any {
  if (depth > 50) throw new Error('recursive $ref')
  if (node === null || typeof node !== 'object') return node
  if (Array.isArray(node)) return node.map((v) => deref(doc, v, depth + 1))
  const obj = node as Record<string, unknown>
  if (typeof obj.$ref === 'string') return deref(doc, resolvePointer(doc, obj.$ref), depth + 1)
  const out: Record<string, unknown> = {}
  for (const [k, v] of Object.entries(obj)) out[k] = deref(doc, v, depth + 1)
  return out
}

/** The OpenAPI 3.1 rules this test checks structurally (a subset of the official schema). */
const OPENAPI_31_SUBSET = {
  type: 'object',
  required: ['openapi', 'info', 'paths'],
  properties: {
    openapi: { type: 'string', pattern: '^3\\.1\\.\\d+(-.+)?$' },
    info: {
      type: 'object',
      required: ['title', 'version'],
      properties: { title: { type: 'string' }, version: { type: 'string' }, description: { type: 'string' } }
    },
    tags: {
      type: 'array',
      items: { type: 'object', required: ['name'], properties: { name: { type: 'string' } } }
    },
    paths: {
      type: 'object',
      propertyNames: { pattern: '^/' },
      additionalProperties: {
        type: 'object',
        propertyNames: { enum: [...METHODS, 'summary', 'description', 'servers', 'parameters', '$ref'] },
        additionalProperties: { $ref: '#/$defs/operation' }
      }
    },
    components: { type: 'object' }
  },
  $defs: {
    operation: {
      type: 'object',
      required: ['responses'],
      properties: {
        tags: { type: 'array', items: { type: 'string' } },
        summary: { type: 'string' },
        operationId: { type: 'string' },
        parameters: {
          type: 'array',
          items: {
            type: 'object',
            required: ['name', 'in'],
            properties: {
              name: { type: 'string' },
              in: { enum: ['query', 'header', 'path', 'cookie'] },
              required: { type: 'boolean' }
            },
            if: { properties: { in: { const: 'path' } } },
            then: { required: ['required'], properties: { required: { const: true } } }
          }
        },
        requestBody: {
          type: 'object',
          required: ['content'],
          properties: { content: { type: 'object', additionalProperties: { type: 'object' } } }
        },
        responses: {
          type: 'object',
          minProperties: 1,
          propertyNames: { pattern: '^([1-5](\\d\\d|XX)|default)$' },
          additionalProperties: {
            type: 'object',
            required: ['description'],
            properties: {
              description: { type: 'string' },
              content: { type: 'object', additionalProperties: { type: 'object' } }
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Generating values from schemas.

/** Values a real client would send, by field name, mixed with the schema's own random ones. */
function hints (cb: CallbackServer): Record<string, fc.Arbitrary<unknown>> {
  return {
    name: fc.constantFrom('alpha', 'beta', 'gamma', 'ünï_☃', ''),
    role: fc.constantFrom('default', 'extra', 'nope', null),
    source: fc.constantFrom('plugin:a', 'plugin:b', 'external'),
    expected_source: fc.constantFrom('plugin:a', 'plugin:b', 'external'),
    callback_url: fc.constantFrom(`${cb.url}/echo`, `${cb.url}/tool-error`, `${cb.url}/status/500`, `${cb.url}/text`,
      'http://example.com/x', 'ftp://127.0.0.1/x', 'http://0.0.0.0:1/x'),
    parameters: fc.constantFrom<Json>({ type: 'object', properties: {} },
      { type: 'object', properties: { x: { type: 'string' } }, required: ['x'] },
      { type: 'object', properties: {}, additionalProperties: false }, { type: 'string' }, [], 'nope'),
    arguments: fc.oneof(fc.constantFrom<Json>({}, { x: 's' }, { x: 1 }), fc.jsonValue({ maxDepth: 2 })),
    raw_arguments: fc.constantFrom('{}', '{"x":"s"}', '{', '[]', ''),
    timeout_seconds: fc.constantFrom<Json>(5, '5', 0.001, 0, 300, 301, -1, '1e1', 'abc', 1e308),
    call_id: fc.constantFrom('c1', 'x'.repeat(300), ''),
    description: fc.string({ maxLength: 20 }),
    format: fc.constantFrom('openai-chat', 'anthropic', 'mcp', 'gemini', 'openai-realtime', 'bogus'),
    types: fc.constantFrom('registered', 'call,sync', 'bogus', '', 'hello')
  }
}

const unicodeString = fc.oneof(
  fc.string({ maxLength: 12, unit: 'grapheme' }),
  fc.string({ maxLength: 12, unit: 'binary' }),
  fc.constantFrom('\u0000', '\u202e', '😀', '\ud800', 'a\u0301', '\uFEFF', 'ｆｕｌｌ'))

function arbFromSchema (schema: Schema | undefined, key: string, hint: Record<string, fc.Arbitrary<unknown>>,
  depth = 0): fc.Arbitrary<unknown> {
  const base = baseArb(schema ?? {}, hint, depth)
  const h = hint[key]
  return h === undefined ? base : fc.oneof({ weight: 12, arbitrary: h }, { weight: 1, arbitrary: base })
}

function baseArb (s: Schema, hint: Record<string, fc.Arbitrary<unknown>>, depth: number): fc.Arbitrary<unknown> {
  if (Array.isArray(s.enum)) return fc.constantFrom(...s.enum)
  if ('const' in s) return fc.constant(s.const)
  const alts = (s.anyOf ?? s.oneOf) as Schema[] | undefined
  if (alts !== undefined) return fc.oneof(...alts.map((a) => baseArb(a, hint, depth + 1)))
  const type = Array.isArray(s.type) ? s.type[0] : s.type
  switch (type) {
    case 'string':
      return typeof s.pattern === 'string'
        ? fc.oneof(fc.stringMatching(new RegExp(s.pattern)), unicodeString)
        : fc.oneof(fc.string({
          minLength: s.minLength ?? 0,
          maxLength: Math.max(s.minLength ?? 0, Math.min(s.maxLength ?? 24, 24))
        }), unicodeString)
    case 'number':
      return fc.double({ noNaN: true, noDefaultInfinity: true })
    case 'integer':
      return fc.integer()
    case 'boolean':
      return fc.boolean()
    case 'null':
      return fc.constant(null)
    case 'array':
      return depth > 3 ? fc.constant([]) : fc.array(baseArb(s.items ?? {}, hint, depth + 1), { maxLength: 3 })
    case 'object': {
      if (depth > 3) return fc.constant({})
      const props = (s.properties ?? {}) as Record<string, Schema>
      const model: Record<string, fc.Arbitrary<unknown>> = {}
      for (const [k, v] of Object.entries(props)) model[k] = arbFromSchema(v, k, hint, depth + 1)
      const required = ((s.required ?? []) as string[]).filter((k) => Object.hasOwn(props, k))
      return fc.record(model, { requiredKeys: required })
    }
    default:
      return fc.jsonValue({ maxDepth: 2 })
  }
}

/** What is done to a request generated from the document. */
const MUTATIONS = [
  'none', 'none', 'none', 'wrong-type', 'missing-required', 'extra-field', 'content-type', 'huge', 'unicode',
  'empty-body', 'duplicate-keys', 'malformed-json', 'deep', 'non-object', 'foreign-host', 'foreign-origin',
  'short-plugin-key', 'query-array', 'query-huge'
] as const
type Mutation = typeof MUTATIONS[number]

const WRONG_TYPED = fc.constantFrom<Json>(1, -0.5, 'str', true, null, [], {}, [1, 'a'], { a: 1 })

interface Generated {
  mutation: Mutation
  request: RawRequest
}

function requestArb (oper: Operation, hint: Record<string, fc.Arbitrary<unknown>>): fc.Arbitrary<Generated> {
  const params = (oper.op.parameters ?? []) as Schema[]
  const bodySchema = oper.op.requestBody?.content?.['application/json']?.schema as Schema | undefined
  const paramArbs: Record<string, fc.Arbitrary<unknown>> = {}
  for (const p of params) {
    const a = arbFromSchema(p.schema, p.name, hint)
    paramArbs[`${p.in}:${p.name}`] = p.required === true ? a : fc.option(a, { nil: undefined })
  }
  return fc.record({
    mutation: fc.constantFrom(...MUTATIONS),
    params: fc.record(paramArbs),
    body: bodySchema === undefined ? fc.constant(undefined) : arbFromSchema(bodySchema, '', hint),
    wrong: WRONG_TYPED,
    pick: fc.nat(),
    text: unicodeString,
    contentType: fc.constantFrom('text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x',
      '', 'application/json; charset=utf-16', 'application/jsonx', 'text/json')
  }).map((g) => ({ mutation: g.mutation, request: build(oper, g, bodySchema) }))
}

function build (oper: Operation, g: {
  mutation: Mutation
  params: Record<string, unknown>
  body: unknown
  wrong: Json
  pick: number
  text: string
  contentType: string
}, bodySchema: Schema | undefined): RawRequest {
  let path = oper.path
  const query = new URLSearchParams()
  const headers: Record<string, string> = {}
  for (const [k, v] of Object.entries(g.params)) {
    if (v === undefined) continue
    const [where, name] = k.split(':') as [string, string]
    const value = v === null ? '' : typeof v === 'string' ? v : JSON.stringify(v)
    if (where === 'path') path = path.replace(`{${name}}`, encodeURIComponent(value === '' ? 'x' : value.replace(/\p{Cs}/gu, 'x')))
    else if (where === 'query') query.append(name, value)
    else if (where === 'header') headers[name] = value.replace(/[^\x21-\x7e]/g, 'x')
  }
  path = path.replace(/\{[^}]+\}/g, 'default')
  let body: unknown = g.body
  let text: string | undefined
  const obj = body !== null && typeof body === 'object' && !Array.isArray(body) ? { ...(body as object) } as Record<string, unknown> : null
  const keys = obj === null ? [] : Object.keys(obj)
  const picked = keys.length === 0 ? undefined : keys[g.pick % keys.length]
  switch (g.mutation) {
    case 'wrong-type':
      if (obj !== null && picked !== undefined) { obj[picked] = g.wrong; body = obj }
      break
    case 'missing-required': {
      const required = (bodySchema?.required ?? []) as string[]
      if (obj !== null && required.length > 0) { delete obj[required[g.pick % required.length]!]; body = obj }
      break
    }
    case 'extra-field':
      if (obj !== null) { obj[`extra_${g.pick % 3}`] = g.wrong; body = obj }
      break
    case 'unicode':
      if (obj !== null && picked !== undefined) { obj[picked] = g.text; body = obj }
      if (bodySchema === undefined) query.append([...query.keys()][0] ?? 'role', g.text)
      break
    case 'huge':
      if (bodySchema !== undefined) body = { ...(obj ?? {}), [picked ?? 'name']: 'h'.repeat(MAX_BODY_BYTES + 10) }
      break
    case 'empty-body':
      if (bodySchema !== undefined) text = ''
      break
    case 'duplicate-keys':
      if (bodySchema !== undefined) {
        const inner = JSON.stringify(obj ?? {}).slice(1, -1)
        text = `{"${picked ?? 'name'}":${JSON.stringify(g.wrong)}${inner === '' ? '' : ','}${inner}}`
      }
      break
    case 'malformed-json':
      if (bodySchema !== undefined) text = JSON.stringify(body ?? {}).slice(0, -1) + ',}'
      break
    case 'deep':
      if (bodySchema !== undefined) text = `{"name":${'['.repeat(MAX_JSON_DEPTH + 4)}${']'.repeat(MAX_JSON_DEPTH + 4)}}`
      break
    case 'non-object':
      if (bodySchema !== undefined) body = g.wrong
      break
    case 'foreign-host':
      headers.host = 'evil.example'
      break
    case 'foreign-origin':
      headers.origin = 'http://evil.example'
      break
    case 'short-plugin-key':
      headers['x-toolport-plugin-key'] = 'short'
      break
    case 'query-array': {
      const name = [...query.keys()][0]
      if (name !== undefined) query.append(name, 'second')
      break
    }
    case 'query-huge': {
      const name = [...query.keys()][0] ?? 'role'
      query.set(name, 'q'.repeat(4000))
      break
    }
    case 'none':
    case 'content-type':
      break
  }
  const qs = query.toString()
  const full = qs === '' ? path : `${path}?${qs}`
  if (bodySchema === undefined && oper.method !== 'POST') return { method: oper.method, path: full, headers }
  if (text === undefined) text = body === undefined ? '' : JSON.stringify(body)
  if (oper.path.startsWith('/mcp/')) {
    headers.accept = 'application/json, text/event-stream'
    if (oper.method === 'POST' && g.mutation === 'none') {
      text = JSON.stringify({
        jsonrpc: '2.0',
        id: 1,
        method: 'initialize',
        params: { protocolVersion: '2025-03-26', capabilities: {}, clientInfo: { name: 'prop', version: '1' } }
      })
    }
  }
  headers['content-type'] = g.mutation === 'content-type' ? g.contentType : 'application/json'
  if (headers['content-type'] === '') delete headers['content-type']
  return { method: oper.method, path: full, headers, body: text }
}

/** `application/json`, with no charset or charset utf-8 (SECURITY.md 5). */
function isJsonType (type: string | undefined): boolean {
  if (type === undefined) return false
  const [media, ...params] = type.split(';').map((x) => x.trim().toLowerCase())
  if (media !== 'application/json') return false
  return params.every((p) => !p.startsWith('charset=') || p === 'charset=utf-8')
}

// ---------------------------------------------------------------------------------------------
// Checking one answer against the document.

const validators = new WeakMap<object, (data: unknown) => boolean>()

function validatorOf (ajv: Ajv, schema: Schema): Validator {
  let v = validators.get(schema)
  if (v === undefined) {
    const { description: _d, ...rest } = schema
    v = ajv.compile(rest)
    validators.set(schema, v)
  }
  return v as Validator
}

/** Problems of one answer (empty: as documented). */
function checkReply (ajv: Ajv, oper: Operation, reply: Reply): string[] {
  const problems: string[] = []
  const status = String(reply.status)
  const documented = (oper.op.responses as Record<string, Schema>)[status] ??
    (oper.op.responses as Record<string, Schema>)[`${status[0]}XX`] ?? (oper.op.responses as Record<string, Schema>).default
  const type = String(reply.headers['content-type'] ?? '')
  const media = type.split(';')[0]!.trim().toLowerCase()
  for (const [name, value] of [['x-content-type-options', 'nosniff'], ['cache-control', 'no-store'],
    ['cross-origin-resource-policy', 'same-origin']]) {
    if (reply.headers[name!] !== value) problems.push(`header ${name} is ${String(reply.headers[name!])}, not ${value}`)
  }
  let body: unknown
  let isJson = false
  if (media === 'application/json') {
    try {
      body = JSON.parse(reply.text)
      isJson = true
    } catch {
      problems.push(`content-type application/json but the body is not JSON: ${reply.text.slice(0, 80)}`)
    }
  }
  // On /mcp/<role>, errors of the MCP protocol itself are JSON-RPC errors (docs/protocol.md
  // "Errors of the API itself"); every other error is the catalogue's shape.
  const isJsonRpcError = oper.path.startsWith('/mcp/') && isJson && (body as Schema)?.jsonrpc === '2.0' &&
    typeof (body as Schema)?.error?.code === 'number'
  if (isJson && reply.status >= 400 && !isJsonRpcError) {
    const e = body as Record<string, unknown>
    if (e === null || typeof e !== 'object' || e.ok !== false) problems.push('an error answer without ok: false')
    else {
      const code = String(e.code)
      if (!Object.hasOwn(ERROR_CODES, code)) problems.push(`error code ${code} is not in the catalogue`)
      else if (ERROR_CODES[code] !== reply.status && !(code === 'TP_ERR_BAD_REQUEST' && reply.status < 500)) {
        problems.push(`error code ${code} has status ${reply.status}, the catalogue says ${ERROR_CODES[code]}`)
      }
      if (e.statusCode !== reply.status) problems.push(`body statusCode ${String(e.statusCode)} != ${reply.status}`)
      if (e.error !== STATUS_CODES[reply.status]) problems.push(`body error ${String(e.error)}`)
      if (e.details !== undefined && reply.status !== 422) problems.push('details on a non-422 answer')
      // "`details` naming each field" (README "The API"): the fields are the documented ones.
      if (Array.isArray(e.details) && code === 'TP_ERR_VALIDATION') {
        const bodySchema = oper.op.requestBody?.content?.['application/json']?.schema as Schema | undefined
        const fields = new Set(['', ...Object.keys(bodySchema?.properties ?? {}),
          ...((oper.op.parameters ?? []) as Schema[]).filter((p) => p.in === 'query').map((p) => p.name)])
        for (const d of e.details as Array<{ path: unknown }>) {
          const first = String(d.path).split(/[.[]/)[0]!
          if (!fields.has(first)) problems.push(`details path ${String(d.path)} names no documented field`)
        }
      }
    }
  }
  if ((reply.status === 401 || reply.status === 403) && reply.headers.connection !== 'close') {
    problems.push(`a ${reply.status} without Connection: close`)
  }
  if (documented === undefined) {
    problems.push(`status ${status} is not documented (documented: ${Object.keys(oper.op.responses).join(', ')})` +
      (isJson ? ` body ${JSON.stringify(body).slice(0, 200)}` : ''))
    return problems
  }
  const content = documented.content as Record<string, Schema> | undefined
  if (content === undefined) {
    if (reply.text !== '' && reply.status !== 204) problems.push(`status ${status} documents no body, got ${type}`)
    return problems
  }
  const entry = content[media] ?? content['*/*']
  if (entry === undefined) {
    problems.push(`content-type ${type} of ${status} not documented (documented: ${Object.keys(content).join(', ')})`)
    return problems
  }
  if (isJson && entry.schema !== undefined) {
    const v = validatorOf(ajv, entry.schema)
    if (!v(body)) {
      problems.push(`body does not match the documented ${status} schema: ${JSON.stringify(v.errors).slice(0, 300)} ` +
        `body ${reply.text.slice(0, 200)}`)
    }
  }
  return problems
}

/**
 * A request the server accepted (200) must be one the document allows: the documented schemas
 * are "the same zod schemas the routes validate with" (README "The API"), so a body or query
 * the document refuses and the server takes is drift.
 */
function checkAccepted (ajv: Ajv, oper: Operation, request: RawRequest, reply: Reply): string[] {
  if (reply.status !== 200) return []
  const problems: string[] = []
  const bodySchema = oper.op.requestBody?.content?.['application/json']?.schema as Schema | undefined
  if (bodySchema !== undefined && request.body !== undefined) {
    let body: unknown
    try { body = JSON.parse(request.body) } catch { problems.push('accepted a body that is not JSON') }
    const v = validatorOf(ajv, bodySchema)
    if (body !== undefined && !v(body)) {
      problems.push(`accepted a body the documented schema refuses: ${JSON.stringify(v.errors).slice(0, 300)}`)
    }
  }
  const query = new URLSearchParams(request.path.split('?')[1] ?? '')
  for (const p of (oper.op.parameters ?? []) as Schema[]) {
    if (p.in !== 'query') continue
    const values = query.getAll(p.name)
    if (values.length === 0) {
      if (p.required === true) problems.push(`accepted without the required query parameter ${p.name}`)
      continue
    }
    const v = validatorOf(ajv, p.schema)
    const value = values.length === 1 ? values[0] : values
    if (!v(value)) problems.push(`accepted query ${p.name}=${JSON.stringify(value).slice(0, 80)} the document refuses`)
  }
  return problems
}

// ---------------------------------------------------------------------------------------------
// The document itself.

test('openapi document: OpenAPI 3.1 structure, $refs resolve, schemas compile, examples validate', async (t) => {
  const { doc } = await fixture(t)
  const ajv = newAjv()
  const structure = ajv.compile(OPENAPI_31_SUBSET)
  const schemaAjv = newAjv()
  assert.ok(structure(doc), JSON.stringify(structure.errors, null, 1))
  const problems: string[] = []
  walk(doc, (node, where) => {
    if (typeof node.$ref === 'string' && resolvePointer(doc, node.$ref) === undefined) {
      problems.push(`${where}: $ref ${node.$ref} does not resolve`)
    }
  })
  const declaredTags = new Set(((doc.tags ?? []) as Schema[]).map((tag) => tag.name))
  const ids = new Set<string>()
  for (const oper of operations(doc)) {
    const where = `${oper.method} ${oper.path}`
    for (const tag of (oper.op.tags ?? []) as string[]) {
      if (!declaredTags.has(tag)) problems.push(`${where}: tag ${tag} not declared`)
    }
    if (typeof oper.op.operationId === 'string') {
      if (ids.has(oper.op.operationId)) problems.push(`${where}: duplicate operationId`)
      ids.add(oper.op.operationId)
    }
    const templated = [...oper.path.matchAll(/\{([^}]+)\}/g)].map((m) => m[1])
    const pathParams = ((oper.op.parameters ?? []) as Schema[]).filter((p) => p.in === 'path').map((p) => p.name)
    assert.deepEqual([...pathParams].sort(), [...templated].sort(), `${where}: path parameters match the template`)
    const seen = new Set<string>()
    for (const p of (oper.op.parameters ?? []) as Schema[]) {
      if (seen.has(`${p.in}:${p.name}`)) problems.push(`${where}: duplicate parameter ${p.name}`)
      seen.add(`${p.in}:${p.name}`)
    }
    // Every schema compiles; every example validates against its schema.
    walk(deref(doc, oper.op), (node, at) => {
      for (const key of ['schema']) {
        const schema = node[key] as Schema | undefined
        if (schema === undefined || typeof schema !== 'object') continue
        let validate
        try {
          validate = schemaAjv.compile(schema)
        } catch (err) {
          problems.push(`${where} ${at}/${key}: schema does not compile: ${(err as Error).message}`)
          continue
        }
        const examples = [...(node.example === undefined ? [] : [node.example]),
          ...Object.values((node.examples ?? {}) as Record<string, Schema>).map((e) => e.value),
          ...(Array.isArray(schema.examples) ? schema.examples : []),
          ...(schema.example === undefined ? [] : [schema.example])]
        for (const example of examples) {
          if (!validate(example)) problems.push(`${where} ${at}: example ${JSON.stringify(example)} does not validate`)
        }
      }
      // Defaults of schema properties must validate against their own schema.
      if (node.default !== undefined && (typeof node.type === 'string' || Array.isArray(node.anyOf))) {
        const { default: value, description: _d, ...schema } = node
        if (!schemaAjv.validate(schema, value)) problems.push(`${where} ${at}: default ${JSON.stringify(value)} does not validate`)
      }
    })
  }
  assert.deepEqual(problems, [])
})

// ---------------------------------------------------------------------------------------------
// Documented operations against served routes.

/** The console's static files and the docs are README rows of their own, not API operations. */
function isConsoleOrDocs (url: string): boolean {
  return url === '/' || url === '/ui' || url.startsWith('/ui/') || url === '/docs' || url.startsWith('/docs/') ||
    url === '/openapi.json'
}

test('openapi document and served routes agree: every API route is documented, every documented operation is served',
  async (t) => {
    const { tp, doc, routes } = await fixture(t)
    assert.ok(routes.length > 10, 'the onRoute hook saw the routes')
    const documented = new Set(operations(doc).map((o) => `${o.method} ${o.path.replace(/\{([^}]+)\}/g, ':$1')}`))
    const undocumented = routes
      .filter((r) => r.method !== 'HEAD' && !r.hidden && !isConsoleOrDocs(r.url))
      .map((r) => `${r.method} ${r.url}`)
      .filter((key) => !documented.has(key))
    assert.deepEqual(undocumented, [], 'served API routes missing from /openapi.json')
    for (const oper of operations(doc)) {
      const url = oper.path.replace(/\{([^}]+)\}/g, ':$1')
      assert.ok(tp.app.hasRoute({ method: oper.method as 'GET', url }), `${oper.method} ${oper.path} is served`)
    }
  })

test('openapi document lists only API operations, not the console\'s static files (README "The API")', async (t) => {
  const { doc } = await fixture(t)
  const consolePaths = Object.keys(doc.paths).filter(isConsoleOrDocs)
  assert.deepEqual(consolePaths, [], 'console/docs files are not API operations')
})

// ---------------------------------------------------------------------------------------------
// The contract property, one test per documented operation.

async function seedRegistry (url: string, cb: CallbackServer): Promise<void> {
  for (const [name, role, route] of [['alpha', 'default', 'echo'], ['beta', null, 'tool-error'],
    ['gamma', 'extra', 'status/500']] as const) {
    const reply = await send(url, {
      method: 'POST',
      path: '/api/tools/register',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ name, role, source: 'plugin:a', callback_url: `${cb.url}/${route}` })
    })
    assert.equal(reply.status, 200, reply.text)
  }
}

/** The documented operations this file generates requests for (from a document fetched once). */
async function documentedOperations (): Promise<Operation[]> {
  const { createToolport } = await import('../../src/main/index.js')
  const tp = await createToolport({ logger: false, ...BASE_OPTIONS, dispatch: { mode: 'inline' } })
  try {
    const res = await tp.app.inject({ method: 'GET', url: '/openapi.json' })
    return operations(JSON.parse(res.body) as Schema)
  } finally {
    await tp.close()
  }
}

const OPERATIONS = await documentedOperations()

for (const oper of OPERATIONS) {
  test(`contract: ${oper.method} ${oper.path} answers only as documented (status, content type, schema, ` +
    'error catalogue, security headers)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
    const { url, cb, doc } = await fixture(t)
    await seedRegistry(url, cb)
    const live = operations(doc).find((o) => o.method === oper.method && o.path === oper.path)
    assert.ok(live !== undefined)
    const ajv = newAjv()
    const hint = hints(cb)
    const stats = process.env.TP_OPENAPI_STATS === '1' ? new Map<string, number>() : null
    t.after(() => { if (stats !== null) console.log(`${oper.method} ${oper.path}`, Object.fromEntries(stats)) })
    await fc.assert(fc.asyncProperty(requestArb(live, hint), async ({ mutation, request }) => {
      const reply = await send(url, request)
      const problems = [...checkReply(ajv, live, reply), ...checkAccepted(ajv, live, request, reply)]
      // SECURITY.md 5 "JSON only": POST must send application/json (charset utf-8 at most) → 415.
      if (mutation === 'content-type' && live.op.requestBody !== undefined && !isJsonType(request.headers?.['content-type']) &&
        reply.status !== 415) {
        problems.push(`content-type ${String(request.headers?.['content-type'])} answered ${reply.status}, not 415`)
      }
      if (stats !== null) stats.set(`${reply.status}`, (stats.get(`${reply.status}`) ?? 0) + 1)
      assert.deepEqual(problems, [], `${request.method} ${request.path} ${JSON.stringify(request.headers)} ` +
        `${(request.body ?? '').slice(0, 300)} → ${reply.status}`)
    }), { numRuns: 25 * RUNS, includeErrorInReport: true })
  })
}

const TOKEN = 't'.repeat(40)
const KEY_A = 'a'.repeat(32)
const KEY_B = 'b'.repeat(40)
/** The JSON operations of the tool API and operations routes. */
const JSON_PATHS = ['/api/tools/register', '/api/tools/unregister', '/api/tools/clear', '/api/tools', '/api/tools/call',
  '/api/health']

test('contract in token and ownership mode with small tool caps: every answer as documented (401, 403 ' +
  'TP_ERR_NOT_OWNER, 422 TP_ERR_LIMIT_EXCEEDED)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const { url, cb, doc } = await fixture(t, {
    security: { token: TOKEN, enforceOwnership: true },
    limits: { maxBodyBytes: MAX_BODY_BYTES, maxJsonDepth: MAX_JSON_DEPTH, maxToolsPerSource: 2, maxToolsPerRole: 3 }
  })
  const ajv = newAjv()
  const hint = hints(cb)
  const opers = operations(doc).filter((o) => JSON_PATHS.includes(o.path))
  assert.equal(opers.length, JSON_PATHS.length)
  const seen = new Set<string>()
  await fc.assert(fc.asyncProperty(
    fc.constantFrom(...opers.map((o) => o.path)).chain((path) =>
      requestArb(opers.find((o) => o.path === path)!, hint).map((g) => [path, g] as const)),
    fc.constantFrom<string | undefined>(`Bearer ${TOKEN}`, `Bearer ${TOKEN}`, `Bearer ${TOKEN}`, undefined, 'Bearer wrong', `bearer ${TOKEN}`, TOKEN),
    fc.constantFrom<string | undefined>(KEY_A, KEY_A, KEY_B, undefined, 'short', `${KEY_A}\u00e9`),
    async ([path, { request }], auth, key) => {
      const oper = opers.find((o) => o.path === path)!
      const headers = { ...request.headers }
      if (auth !== undefined) headers.authorization = auth
      if (key !== undefined && oper.op.parameters?.some((p: Schema) => p.name === 'x-toolport-plugin-key')) {
        headers['x-toolport-plugin-key'] = [...key].map((c) => c.charCodeAt(0) > 0xff ? 'x' : c).join('')
      }
      const sent = { ...request, headers }
      const reply = await send(url, sent)
      seen.add(`${reply.status}`)
      const problems = [...checkReply(ajv, oper, reply), ...checkAccepted(ajv, oper, sent, reply)]
      assert.deepEqual(problems, [], `${sent.method} ${sent.path} ${JSON.stringify(headers)} ${(sent.body ?? '').slice(0, 300)} → ${reply.status}`)
    }), { numRuns: 60 * RUNS, includeErrorInReport: true })
  assert.ok(seen.has('401') && seen.has('200'), `statuses seen: ${[...seen].join(', ')}`)
})

/** Paths near the documented ones: trailing slash, case, double slash, encodings, unknown. */
const PATH_VARIANTS = (path: string): string[] => [path, `${path}/`, path.toUpperCase(), `/${path}`, `${path}%2F`,
  path.replace('/api/', '/api//'), `${path}/extra`, path.replace(/s$/, ''), `${path};x`, `${path}%00`, `${path}%20`, `${path}%`, `${path}%zz`,
  `${path}?%zz=1`, `${path}/${'x'.repeat(300)}`]

test('every method on paths near the documented ones: a documented answer of the operation served, or 404 ' +
  'TP_ERR_ROUTE_NOT_FOUND (README "Errors")', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const { url, doc } = await fixture(t)
  const ajv = newAjv()
  const opers = operations(doc)
  // /mcp/<role>, /api/tools/definitions and the console file have contract tests of their own
  // (above), which fail on their undocumented answers; here the other paths.
  const paths = [...new Set(opers.map((o) => o.path))].filter((p) => !p.startsWith('/ui/') && !p.startsWith('/mcp/') &&
    p !== '/api/tools/definitions')
  const notFound: Operation = {
    method: 'ANY',
    path: '(no route)',
    op: {
      responses: {
        404: { description: 'no route', content: { 'application/json': { schema: doc.paths['/api/tools'].get.responses['404'].content['application/json'].schema } } },
        // README "Errors": TP_ERR_BAD_REQUEST, a URL that could not be read.
        400: { description: 'bad URL', content: { 'application/json': { schema: doc.paths['/api/tools'].get.responses['404'].content['application/json'].schema } } },
        401: doc.paths['/api/tools'].get.responses['401'],
        403: doc.paths['/api/tools'].get.responses['403']
      }
    }
  }
  await fc.assert(fc.asyncProperty(
    fc.constantFrom(...paths).chain((p) => fc.constantFrom(...PATH_VARIANTS(p))),
    fc.constantFrom('GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'),
    async (path, method) => {
      const request: RawRequest = method === 'GET' || method === 'OPTIONS'
        ? { method, path }
        : { method, path, headers: { 'content-type': 'application/json' }, body: '{}' }
      const reply = await send(url, request)
      const served = opers.find((o) => o.method === method && o.path === path.split('?')[0])
      const problems = checkReply(ajv, served ?? notFound, reply)
      if (served === undefined && reply.status === 404) {
        const body = JSON.parse(reply.text)
        if (body.code !== 'TP_ERR_ROUTE_NOT_FOUND') problems.push(`404 with ${String(body.code)}`)
      }
      assert.deepEqual(problems, [], `${method} ${path} → ${reply.status} ${reply.text.slice(0, 200)}`)
    }), { numRuns: 80 * RUNS, includeErrorInReport: true })
})

test('HEAD of every documented GET operation answers like its GET, without a body', { timeout: FAILING_TIMEOUT_MS },
  async (t) => {
    const { url, cb, doc } = await fixture(t)
    await seedRegistry(url, cb)
    // GET /api/events: its HEAD never answers (the regression test below); here every other GET.
    const gets = operations(doc).filter((o) => o.method === 'GET' && o.path !== '/api/events')
    const hint = hints(cb)
    await fc.assert(fc.asyncProperty(
      fc.constantFrom(...gets.map((o) => o.path)).chain((path) =>
        requestArb(gets.find((o) => o.path === path)!, hint).map((g) => [path, g.request] as const)),
      async ([path, request]) => {
        const get = await send(url, request)
        const head = await send(url, { ...request, method: 'HEAD' }, HEAD_GUARD_MS)
        assert.equal(head.status, get.status, `${path}: HEAD ${request.path} status`)
        assert.equal(head.text, '', 'HEAD has no body')
        assert.equal(String(head.headers['content-type']).split(';')[0], String(get.headers['content-type']).split(';')[0])
      }), { numRuns: 40 * RUNS, includeErrorInReport: true, endOnFailure: true })
  })

test('HEAD /api/events answers at once and holds no subscriber slot (README "Live events")',
  { timeout: FAILING_TIMEOUT_MS }, async (t) => {
    const { url } = await fixture(t, { events: { maxSubscribers: 1 } })
    const head = await send(url, { method: 'HEAD', path: '/api/events' }, HEAD_GUARD_MS)
    assert.equal(head.status, 200)
    const get = await send(url, { method: 'GET', path: '/api/events' })
    assert.equal(get.status, 200, get.text)
  })

// ---------------------------------------------------------------------------------------------
// Regression tests for what the contract property found.

test('GET /api/tools/definitions documents its role/format query and its 404 and 422 answers (README "The API")',
  async (t) => {
    const { url, doc } = await fixture(t)
    const op = doc.paths['/api/tools/definitions'].get as Schema
    const names = ((op.parameters ?? []) as Schema[]).filter((p) => p.in === 'query').map((p) => p.name).sort()
    assert.deepEqual(names, ['format', 'role'])
    const unknown = await send(url, { method: 'GET', path: '/api/tools/definitions?role=nope' })
    assert.equal(unknown.status, 404)
    assert.ok(op.responses['404'] !== undefined, 'the 404 TP_ERR_ROLE_NOT_FOUND answer is documented')
    assert.ok(op.responses['200'].content?.['application/json']?.schema !== undefined, 'the 200 body is documented')
  })

test('/mcp/{role} documents the 404 TP_ERR_ROLE_NOT_FOUND of an unknown role (docs/protocol.md "MCP endpoint")',
  async (t) => {
    const { url, doc } = await fixture(t)
    const reply = await send(url, {
      method: 'POST',
      path: '/mcp/nope',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
    })
    assert.equal(reply.status, 404)
    assert.equal(JSON.parse(reply.text).code, 'TP_ERR_ROLE_NOT_FOUND')
    assert.ok(doc.paths['/mcp/{role}'].post.responses['404'] !== undefined, '404 documented for POST /mcp/{role}')
  })

test('the register body schema of the document accepts what the route accepts and refuses what it refuses: a ' +
  'timeout with blanks around it, the 0–300 bounds, names of 1–64 characters, the default of 30', async (t) => {
  const { url, cb, doc } = await fixture(t)
  const oper = operations(doc).find((o) => o.method === 'POST' && o.path === '/api/tools/register')!
  const schema = oper.op.requestBody.content['application/json'].schema as Schema
  assert.equal(schema.properties.timeout_seconds.default, 30)
  const documented = validatorOf(newAjv(), schema)
  const base = { name: 'weather', callback_url: `${cb.url}/x` }
  const cases: Array<Record<string, unknown>> = [
    { ...base, timeout_seconds: ' 5' }, { ...base, timeout_seconds: '5\n' }, { ...base, timeout_seconds: '\t+.5 ' },
    { ...base, timeout_seconds: 300 }, { ...base, timeout_seconds: 0 }, { ...base, timeout_seconds: 300.5 },
    { ...base, timeout_seconds: -1 }, { ...base, name: 'n'.repeat(64) }, { ...base, name: 'n'.repeat(65) },
    { ...base, name: '\u{1F600}'.repeat(64) }, { ...base, name: '\u{1F600}'.repeat(65) }, { ...base, name: '' }
  ]
  const disagreements: string[] = []
  for (const body of cases) {
    const reply = await send(url, { method: 'POST', path: '/api/tools/register', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
    if ((reply.status === 200) !== documented(body)) {
      disagreements.push(`${JSON.stringify(body).slice(0, 120)}: the route answers ${reply.status}, the document ${documented(body) ? 'accepts' : 'refuses'}`)
    }
  }
  assert.deepEqual(disagreements, [])
})

/** One request written byte for byte on a new socket; its answer read to the socket's end. */
async function sendRaw (port: number, head: string): Promise<Reply> {
  return await within(new Promise<Reply>((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => socket.end(head))
    const chunks: Buffer[] = []
    socket.on('data', (chunk) => chunks.push(chunk))
    socket.on('error', reject)
    socket.on('close', () => {
      const text = Buffer.concat(chunks).toString('utf8')
      const [headLines = '', ...rest] = text.split('\r\n\r\n')
      const [statusLine = '', ...lines] = headLines.split('\r\n')
      const headers: Reply['headers'] = {}
      for (const line of lines) {
        const colon = line.indexOf(':')
        headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim()
      }
      resolve({ status: Number(statusLine.split(' ')[1]), headers, text: rest.join('\r\n\r\n') })
    })
  }), `raw ${head.split('\r\n')[0]}`, REQUEST_GUARD_MS)
}

test('answers given before any route runs are documented on every operation: 400 for a request Node cannot read, ' +
  '431 for headers too large, 414 for an over-long role of /mcp/{role} (README "Errors")', async (t) => {
  const { url, port, doc } = await fixture(t)
  const ajv = newAjv()
  const problems: string[] = []
  for (const oper of operations(doc)) {
    const path = oper.path.replace('{role}', 'default')
    const tooLarge = await send(url, { method: oper.method, path, headers: { 'x-filler': 'f'.repeat(20_000) } })
    const unreadable = await sendRaw(port, `${oper.method} ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: x\r\n\r\n`)
    for (const [what, reply, status] of [['headers too large', tooLarge, 431], ['bad Content-Length', unreadable, 400]] as const) {
      if (reply.status !== status) problems.push(`${oper.method} ${path} ${what}: ${reply.status}, not ${status}`)
      for (const p of checkReply(ajv, oper, reply)) problems.push(`${oper.method} ${path} ${what}: ${p}`)
    }
    // 408 cannot be provoked quickly (requests have 30 s); it is documented beside them.
    if (oper.op.responses['408'] === undefined) problems.push(`${oper.method} ${oper.path}: 408 is not documented`)
  }
  for (const oper of operations(doc).filter((o) => o.path === '/mcp/{role}')) {
    const reply = await send(url, {
      method: oper.method,
      path: `/mcp/${'r'.repeat(300)}`,
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      ...(oper.method === 'POST' ? { body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }) } : {})
    })
    if (reply.status !== 414) problems.push(`${oper.method} /mcp/<300 characters>: ${reply.status}, not 414`)
    for (const p of checkReply(ajv, oper, reply)) problems.push(`${oper.method} /mcp/<300 characters>: ${p}`)
  }
  assert.deepEqual(problems, [])
})

test('errors of GET /metrics and GET /api/events are documented as the JSON they are (README "Errors")',
  async (t) => {
    const { url, doc } = await fixture(t)
    for (const path of ['/metrics', '/api/events']) {
      const reply = await send(url, { method: 'GET', path, headers: { host: 'evil.example' } })
      assert.equal(reply.status, 403)
      assert.match(String(reply.headers['content-type']), /^application\/json/)
      const documented = Object.keys(doc.paths[path].get.responses['403'].content ?? {})
      assert.deepEqual(documented, ['application/json'], `${path} 403 content types`)
    }
  })

test('an MCP answer carries Cache-Control: no-store like every answer (SECURITY.md "Every answer carries")',
  async (t) => {
    const { url } = await fixture(t)
    const reply = await send(url, {
      method: 'POST',
      path: '/mcp/default',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 1,
        method: 'initialize',
        params: { protocolVersion: '2025-03-26', capabilities: {}, clientInfo: { name: 'prop', version: '1' } }
      })
    })
    assert.equal(reply.status, 200)
    assert.equal(reply.headers['x-content-type-options'], 'nosniff')
    assert.equal(reply.headers['cache-control'], 'no-store')
  })

// ---------------------------------------------------------------------------------------------
// Metrics after a random sequence of operations.

interface Sample {
  name: string
  labels: Record<string, string>
  value: number
}

/** A strict parser of the Prometheus text exposition format 0.0.4. */
function parseProm (text: string): { samples: Sample[], types: Map<string, string> } {
  assert.ok(text.endsWith('\n'), 'the exposition ends with a newline')
  const types = new Map<string, string>()
  const helps = new Set<string>()
  const samples: Sample[] = []
  const seen = new Set<string>()
  const NAME = '[a-zA-Z_:][a-zA-Z0-9_:]*'
  const sampleRe = new RegExp(`^(${NAME})(\\{(.*)\\})? (\\S+)( -?\\d+)?$`)
  for (const line of text.split('\n')) {
    if (line === '') continue
    if (line.startsWith('# HELP ')) {
      const m = new RegExp(`^# HELP (${NAME}) (.*)$`).exec(line)
      assert.ok(m !== null, `HELP line: ${line}`)
      assert.ok(!helps.has(m[1]!), `one HELP for ${m[1]}`)
      helps.add(m[1]!)
      continue
    }
    if (line.startsWith('# TYPE ')) {
      const m = new RegExp(`^# TYPE (${NAME}) (counter|gauge|histogram|summary|untyped)$`).exec(line)
      assert.ok(m !== null, `TYPE line: ${line}`)
      assert.ok(!types.has(m[1]!), `one TYPE for ${m[1]}`)
      types.set(m[1]!, m[2]!)
      continue
    }
    if (line.startsWith('#')) continue
    const m = sampleRe.exec(line)
    assert.ok(m !== null, `sample line: ${line}`)
    const labels: Record<string, string> = {}
    if (m[3] !== undefined && m[3] !== '') {
      const labelRe = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\\\|\\"|\\n)*)"(,|$)/y
      let at = 0
      while (at < m[3].length) {
        labelRe.lastIndex = at
        const lm = labelRe.exec(m[3])
        assert.ok(lm !== null, `labels of: ${line}`)
        assert.ok(!Object.hasOwn(labels, lm[1]!), `duplicate label in: ${line}`)
        labels[lm[1]!] = lm[2]!.replace(/\\(n|"|\\)/g, (_a, c: string) => c === 'n' ? '\n' : c)
        at = labelRe.lastIndex
      }
    }
    const raw = m[4]!
    // Prometheus parses values with Go's ParseFloat (NaN and Inf in any case; prom-client writes `Nan`).
    const isNaNText = raw.toLowerCase() === 'nan'
    const value = /^[+]?inf$/i.test(raw) ? Infinity : /^-inf$/i.test(raw) ? -Infinity : isNaNText ? NaN : Number(raw)
    assert.ok(isNaNText || !Number.isNaN(value), `value of: ${line}`)
    const family = familyOf(m[1]!, types)
    assert.ok(family !== undefined, `sample ${m[1]} has a TYPE`)
    const key = `${m[1]}${JSON.stringify(Object.entries(labels).sort())}`
    assert.ok(!seen.has(key), `duplicate sample ${line}`)
    seen.add(key)
    samples.push({ name: m[1]!, labels, value })
  }
  return { samples, types }
}

function familyOf (name: string, types: Map<string, string>): string | undefined {
  if (types.has(name)) return name
  for (const suffix of ['_bucket', '_sum', '_count', '_total', '_created']) {
    if (name.endsWith(suffix)) {
      const base = name.slice(0, -suffix.length)
      const type = types.get(base)
      if (type === 'histogram' || type === 'summary') return base
    }
  }
  return undefined
}

type ApiOp =
  | { kind: 'register', name: string, role: string | null, route: Route, source: string }
  | { kind: 'unregister', name: string, role: string | null }
  | { kind: 'clear', source: string, role: string | null }
  | { kind: 'call', name: string, role: string, args: 'good' | 'bad' | 'raw-bad' }
  | { kind: 'bad-request', body: string }

/** Where a tool's callback is: routes of the callback server, or `dead`: a closed port (refused). */
type Route = 'echo' | 'tool-error' | 'status/500' | 'text' | 'dead'
const ROUTES: Route[] = ['echo', 'tool-error', 'status/500', 'text', 'dead']

/**
 * A loopback port nothing listens on: connections to it are refused (R13's connection failure).
 * Below the range the kernel hands out for port 0 (closedPort), so no other test's server gets it.
 */
const DEAD_ORIGIN = `http://127.0.0.1:${await closedPort()}`
const EVICTION_THRESHOLD = 3

function callbackUrl (route: Route, cb: CallbackServer): string {
  return route === 'dead' ? `${DEAD_ORIGIN}/dead` : `${cb.url}/${route}`
}

const TOOL_NAMES = ['t1', 't2', 't3']
const SOURCES = ['plugin:a', 'plugin:b']
const roleArb = fc.constantFrom<string | null>('default', 'extra', null)

const apiOpArb: fc.Arbitrary<ApiOp> = fc.oneof(
  { weight: 5, arbitrary: fc.record({ kind: fc.constant('register' as const), name: fc.constantFrom(...TOOL_NAMES), role: roleArb, route: fc.constantFrom(...ROUTES, 'dead', 'dead'), source: fc.constantFrom(...SOURCES) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('unregister' as const), name: fc.constantFrom(...TOOL_NAMES), role: roleArb }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('clear' as const), source: fc.constantFrom(...SOURCES), role: roleArb }) },
  { weight: 6, arbitrary: fc.record({ kind: fc.constant('call' as const), name: fc.constantFrom(...TOOL_NAMES, 'ghost'), role: fc.constantFrom('default', 'extra'), args: fc.constantFrom('good' as const, 'good' as const, 'good' as const, 'bad' as const, 'raw-bad' as const) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('bad-request' as const), body: fc.constantFrom('{', '[]', '{"name":1}') }) }
)

interface ModelTool { source: string, route: Route, origin: string }

/** One streamed event as the model predicts it (README "Live events"). */
type ModelEvent =
  | { type: 'registered' | 'unregistered' | 'cleared' | 'evicted', origin: string, source: string, tools: Array<{ role: string, name: string }>, roles: string[] }
  | { type: 'call', role: string, tool: string | null, outcome: string }

/** The documented effect of each operation on the registry, the call counters and the stream. */
class ApiModel {
  readonly roles = new Map<string, Map<string, ModelTool>>(ROLES.map((r) => [r, new Map()]))
  readonly calls = new Map<string, number>()
  readonly byOutcome = new Map<string, number>()
  readonly events: ModelEvent[] = []
  /** R13: consecutive connection failures at the dead origin; evictions and registrations they removed. */
  deadFailures = 0
  evictions = 0
  evictedRegistrations = 0

  constructor (readonly cb: CallbackServer) {}

  originOf (route: Route): string { return route === 'dead' ? DEAD_ORIGIN : this.cb.origin }

  targets (role: string | null): string[] { return role === null ? [...ROLES] : [role] }

  apply (op: ApiOp): void {
    switch (op.kind) {
      case 'register': {
        const roles = this.targets(op.role)
        const origin = this.originOf(op.route)
        for (const r of roles) this.roles.get(r)!.set(op.name, { source: op.source, route: op.route, origin })
        // docs/protocol.md "Eviction": any new registration at that origin resets its count.
        if (op.route === 'dead') this.deadFailures = 0
        this.events.push({ type: 'registered', origin, source: op.source, tools: roles.map((role) => ({ role, name: op.name })), roles })
        break
      }
      case 'unregister':
      case 'clear': {
        const removed: Array<{ role: string, name: string, source: string, origin: string }> = []
        for (const r of this.targets(op.role)) {
          for (const [name, tool] of this.roles.get(r)!) {
            if (op.kind === 'unregister' ? name === op.name : tool.source === op.source) {
              removed.push({ role: r, name, source: tool.source, origin: tool.origin })
              this.roles.get(r)!.delete(name)
            }
          }
        }
        this.events.push(...removalEventsOf(op.kind === 'clear' ? 'cleared' : 'unregistered', removed))
        break
      }
      case 'call': {
        const tool = this.roles.get(op.role)!.get(op.name)
        let outcome: string
        if (tool === undefined) outcome = 'unknown_tool'
        else if (op.args !== 'good') outcome = 'invalid_arguments'
        else if (tool.route === 'dead') outcome = 'connect'
        else outcome = tool.route === 'status/500' ? 'http' : 'ok'
        const label = `${op.role}|${outcome === 'unknown_tool' ? '(unknown)' : op.name}|${outcome}`
        this.calls.set(label, (this.calls.get(label) ?? 0) + 1)
        this.byOutcome.set(outcome, (this.byOutcome.get(outcome) ?? 0) + 1)
        this.events.push({ type: 'call', role: op.role, tool: tool === undefined ? null : op.name, outcome })
        if (outcome === 'connect' && tool!.source.startsWith('plugin:') && ++this.deadFailures >= EVICTION_THRESHOLD) {
          // R13: every plugin: tool at that origin leaves every role.
          this.deadFailures = 0
          const removed: Array<{ role: string, name: string, source: string, origin: string }> = []
          for (const [r, tools] of this.roles) {
            for (const [name, t] of tools) {
              if (t.origin === DEAD_ORIGIN && t.source.startsWith('plugin:')) {
                removed.push({ role: r, name, source: t.source, origin: t.origin })
                tools.delete(name)
              }
            }
          }
          if (removed.length > 0) {
            this.evictions++
            this.evictedRegistrations += removed.length
            this.events.push(...removalEventsOf('evicted', removed))
          }
        }
        break
      }
      case 'bad-request':
        break
    }
  }
}

/** One event per origin and source ("per origin and source", README "Live events"). */
function removalEventsOf (type: 'unregistered' | 'cleared' | 'evicted',
  removed: Array<{ role: string, name: string, source: string, origin: string }>): ModelEvent[] {
  const out: ModelEvent[] = []
  for (const key of [...new Set(removed.map((x) => `${x.origin} ${x.source}`))].sort()) {
    const [origin, source] = key.split(' ') as [string, string]
    const tools = removed.filter((x) => x.origin === origin && x.source === source)
      .map(({ role, name }) => ({ role, name }))
    out.push({ type, origin, source, tools, roles: [...new Set(tools.map((x) => x.role))] })
  }
  return out
}

/** An event as a comparable string (tools sorted; within one operation events may come in any order). */
function eventKey (e: ModelEvent): string {
  if (e.type === 'call') return `call ${e.role} ${String(e.tool)} ${e.outcome}`
  return `${e.type} ${e.origin} ${e.source} [${e.tools.map((x) => `${x.role}/${x.name}`).sort().join(',')}] [${[...e.roles].sort().join(',')}]`
}

function requestOf (op: ApiOp, cb: CallbackServer): RawRequest {
  const json = { 'content-type': 'application/json' }
  switch (op.kind) {
    case 'register':
      return { method: 'POST', path: '/api/tools/register', headers: json, body: JSON.stringify({ name: op.name, role: op.role, source: op.source, callback_url: callbackUrl(op.route, cb), parameters: { type: 'object', properties: { x: { type: 'string' } }, required: ['x'] } }) }
    case 'unregister':
      return { method: 'POST', path: '/api/tools/unregister', headers: json, body: JSON.stringify({ name: op.name, role: op.role }) }
    case 'clear':
      return { method: 'POST', path: '/api/tools/clear', headers: json, body: JSON.stringify({ source: op.source, role: op.role }) }
    case 'call':
      return { method: 'POST', path: '/api/tools/call', headers: json, body: JSON.stringify({ role: op.role, name: op.name, ...(op.args === 'raw-bad' ? { raw_arguments: '{' } : { arguments: op.args === 'good' ? { x: 's' } : { x: 1 } }) }) }
    case 'bad-request':
      return { method: 'POST', path: '/api/tools/register', headers: json, body: op.body }
  }
}

test('metrics: after a random sequence of API operations /metrics parses and counts exactly what the sequence did',
  { timeout: FAILING_TIMEOUT_MS }, async (t) => {
    const opsArb = fc.limitShrink(fc.array(apiOpArb, { minLength: 6, maxLength: 24 }), MAX_SHRINKS)
    await fc.assert(fc.asyncProperty(opsArb, async (ops) => {
      await scoped(async (tt) => {
        const { url, cb, doc } = await fixture(tt, { console: false })
        const metricsOp = operations(doc).find((o) => o.path === '/metrics')!
        const ajv = newAjv()
        const model = new ApiModel(cb)
        for (const op of ops) {
          const reply = await send(url, requestOf(op, cb))
          if (op.kind === 'bad-request') assert.ok(reply.status === 400 || reply.status === 422, reply.text)
          else assert.equal(reply.status, 200, reply.text)
          model.apply(op)
        }
        const reply = await send(url, { method: 'GET', path: '/metrics' })
        assert.deepEqual(checkReply(ajv, metricsOp, reply), [])
        assert.match(String(reply.headers['content-type']), /^text\/plain; version=0\.0\.4/)
        const { samples, types } = parseProm(reply.text)
        assert.equal(types.get('toolport_calls_total'), 'counter')
        assert.equal(types.get('toolport_registry_tools'), 'gauge')
        assert.equal(types.get('toolport_call_duration_seconds'), 'histogram')
        const calls = new Map<string, number>()
        for (const s of samples.filter((x) => x.name === 'toolport_calls_total' && x.value !== 0)) {
          calls.set(`${s.labels.role}|${s.labels.tool}|${s.labels.outcome}`, s.value)
        }
        assert.deepEqual(Object.fromEntries([...calls].sort()), Object.fromEntries([...model.calls].sort()), 'toolport_calls_total')
        const counts = new Map<string, number>()
        for (const s of samples.filter((x) => x.name === 'toolport_call_duration_seconds_count' && x.value !== 0)) {
          counts.set(s.labels.outcome!, s.value)
        }
        assert.deepEqual(Object.fromEntries([...counts].sort()), Object.fromEntries([...model.byOutcome].sort()),
          'toolport_call_duration_seconds_count by outcome')
        for (const s of samples.filter((x) => x.name === 'toolport_call_duration_seconds_bucket' && x.labels.le === '+Inf')) {
          assert.equal(s.value, model.byOutcome.get(s.labels.outcome!) ?? 0, '+Inf bucket = count')
        }
        const sizes: Record<string, number> = {}
        for (const s of samples.filter((x) => x.name === 'toolport_registry_tools')) sizes[s.labels.role!] = s.value
        const expected: Record<string, number> = {}
        for (const [role, tools] of model.roles) expected[role] = tools.size
        assert.deepEqual(sizes, expected, 'toolport_registry_tools')
        assert.equal(samples.find((s) => s.name === 'toolport_evictions_total')?.value, model.evictions, 'toolport_evictions_total')
        assert.equal(samples.find((s) => s.name === 'toolport_evicted_tools_total')?.value, model.evictedRegistrations,
          'toolport_evicted_tools_total: "Tool registrations removed by evictions (summed over roles)"')
        assert.equal(samples.find((s) => s.name === 'toolport_calls_in_flight')?.value, 0)
        assert.equal(samples.find((s) => s.name === 'toolport_pool_threads')?.value, 1)
      })
    }), { numRuns: 4 * RUNS, includeErrorInReport: true })
  })

test('metrics: evictions (R13) after random registrations at a refusing origin and calls to them are counted as ' +
  'the model removes them', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  // Registrations first (at the refusing origin mostly), then calls: consecutive failures reach the threshold.
  const registerOp: fc.Arbitrary<ApiOp> = fc.record({ kind: fc.constant('register' as const), name: fc.constantFrom(...TOOL_NAMES), role: roleArb, route: fc.constantFrom<Route>('dead', 'dead', 'dead', 'echo'), source: fc.constantFrom('plugin:a', 'plugin:a', 'external') })
  const callOp: fc.Arbitrary<ApiOp> = fc.record({ kind: fc.constant('call' as const), name: fc.constantFrom(...TOOL_NAMES), role: fc.constantFrom('default', 'extra'), args: fc.constant('good' as const) })
  const opsArb = fc.tuple(fc.array(registerOp, { minLength: 1, maxLength: 5 }),
    fc.array(callOp, { minLength: 3, maxLength: 10 }))
    .map(([regs, calls]) => [...regs, ...calls])
  await fc.assert(fc.asyncProperty(fc.limitShrink(opsArb, MAX_SHRINKS), async (ops) => {
    await scoped(async (tt) => {
      const { url, cb } = await fixture(tt, { console: false, dispatch: { mode: 'inline' } })
      const model = new ApiModel(cb)
      for (const op of ops) {
        const reply = await send(url, requestOf(op, cb))
        assert.equal(reply.status, 200, reply.text)
        model.apply(op)
      }
      const { samples } = parseProm((await send(url, { method: 'GET', path: '/metrics' })).text)
      const value = (name: string, role?: string): number | undefined =>
        samples.find((s) => s.name === name && (role === undefined || s.labels.role === role))?.value
      for (const role of ROLES) assert.equal(value('toolport_registry_tools', role), model.roles.get(role)!.size, `tools of ${role}`)
      assert.equal(value('toolport_evictions_total'), model.evictions, 'toolport_evictions_total')
      assert.equal(value('toolport_evicted_tools_total'), model.evictedRegistrations,
        'toolport_evicted_tools_total: "Tool registrations removed by evictions (summed over roles)"')
    })
  }), { numRuns: 15 * RUNS, includeErrorInReport: true })
})

test('toolport_evicted_tools_total counts the registrations an eviction removed (its help: "summed over roles")',
  async (t) => {
    const { url, cb } = await fixture(t, { console: false })
    const model = new ApiModel(cb)
    const ops: ApiOp[] = [
      { kind: 'register', name: 't1', role: 'default', route: 'dead', source: 'plugin:a' },
      { kind: 'register', name: 't2', role: 'extra', route: 'dead', source: 'plugin:a' },
      ...Array.from({ length: EVICTION_THRESHOLD }, () => ({ kind: 'call', name: 't1', role: 'default', args: 'good' }) as ApiOp)
    ]
    for (const op of ops) {
      assert.equal((await send(url, requestOf(op, cb))).status, 200)
      model.apply(op)
    }
    assert.equal(model.evictedRegistrations, 2)
    const { samples } = parseProm((await send(url, { method: 'GET', path: '/metrics' })).text)
    assert.equal(samples.find((s) => s.name === 'toolport_evictions_total')?.value, 1)
    assert.equal(samples.find((s) => s.name === 'toolport_registry_tools' && s.labels.role === 'extra')?.value, 0,
      'both registrations are gone')
    assert.equal(samples.find((s) => s.name === 'toolport_evicted_tools_total')?.value, 2,
      'one registration in default + one in extra')
  })

// ---------------------------------------------------------------------------------------------
// The event stream.

interface SseEvent { id: string, type: string, data: any }

/** Opens GET /api/events and collects parsed events until `until` holds (bounded). */
async function openEvents (url: string, query: string, lastEventId?: string): Promise<{
  status: number
  headers: Reply['headers']
  events: SseEvent[]
  waitFor: (n: number) => Promise<void>
  close: () => void
}> {
  const res = await httpRequest(`${url}/api/events${query}`, {
    method: 'GET',
    headers: { accept: 'text/event-stream', ...(lastEventId === undefined ? {} : { 'last-event-id': lastEventId }) }
  })
  const events: SseEvent[] = []
  let buffer = ''
  let wake: (() => void) | null = null
  if (res.statusCode === 200) {
    res.body.setEncoding('utf8')
    res.body.on('data', (chunk: string) => {
      buffer += chunk
      let end
      while ((end = buffer.indexOf('\n\n')) !== -1) {
        const block = buffer.slice(0, end)
        buffer = buffer.slice(end + 2)
        const event: Partial<SseEvent> = {}
        let data = ''
        for (const line of block.split('\n')) {
          if (line.startsWith(':')) continue
          const colon = line.indexOf(':')
          const field = colon === -1 ? line : line.slice(0, colon)
          const value = colon === -1 ? '' : line.slice(colon + 1).replace(/^ /, '')
          if (field === 'id') event.id = value
          else if (field === 'event') event.type = value
          else if (field === 'data') data += (data === '' ? '' : '\n') + value
        }
        if (event.type === undefined && data === '') continue
        events.push({ id: event.id ?? '', type: event.type ?? 'message', data: JSON.parse(data) })
        wake?.()
      }
    })
    res.body.on('error', () => {})
  }
  const headers = res.headers as Reply['headers']
  return {
    status: res.statusCode,
    headers,
    events,
    waitFor: async (n) => {
      await within((async () => {
        while (events.length < n) await new Promise<void>((resolve) => { wake = resolve })
      })(), () => `${n} events (have ${JSON.stringify(events.map((e) => e.type))})`, REQUEST_GUARD_MS)
    },
    close: () => { res.body.destroy() }
  }
}

const STREAM_TYPES = ['registered', 'unregistered', 'cleared', 'call'] as const

test('GET /api/events: hello first, then the documented events of a random sequence, filtered by types and role',
  { timeout: FAILING_TIMEOUT_MS }, async (t) => {
    await fc.assert(fc.asyncProperty(
      fc.limitShrink(fc.array(apiOpArb, { minLength: 1, maxLength: 10 }), MAX_SHRINKS),
      fc.subarray([...STREAM_TYPES], { minLength: 1 }),
      fc.constantFrom<string | null>(null, 'default', 'extra'),
      async (ops, types, roleFilter) => {
        await scoped(async (tt) => {
          const { url, cb } = await fixture(tt, { console: false })
          const query = `?types=${types.join(',')}${roleFilter === null ? '' : `&role=${roleFilter}`}`
          const stream = await openEvents(url, query)
          tt.after(() => stream.close())
          assert.equal(stream.status, 200)
          assert.match(String(stream.headers['content-type']), /^text\/event-stream/)
          assert.equal(stream.headers['x-content-type-options'], 'nosniff')
          assert.equal(stream.headers['cache-control'], 'no-store')
          assert.equal(stream.headers['cross-origin-resource-policy'], 'same-origin')
          await stream.waitFor(1)
          const model = new ApiModel(cb)
          for (const op of ops) {
            await send(url, requestOf(op, cb))
            model.apply(op)
          }
          // A marker registration every filter sees last (it goes to every role).
          await send(url, requestOf({ kind: 'register', name: 'zz_marker', role: null, route: 'echo', source: 'plugin:z' }, cb))
          model.apply({ kind: 'register', name: 'zz_marker', role: null, route: 'echo', source: 'plugin:z' })
          const concerns = (e: ModelEvent): boolean => roleFilter === null ||
            (e.type === 'call' ? e.role === roleFilter : e.roles.includes(roleFilter))
          const expected = model.events.filter((e) => (types as string[]).includes(e.type) && concerns(e))
          await stream.waitFor(1 + expected.length)
          assert.equal(stream.events[0]!.type, 'hello')
          assert.equal(typeof stream.events[0]!.data.instance_id, 'string')
          const got = stream.events.slice(1)
          for (const e of got) {
            if (e.type === 'call') {
              assert.deepEqual(Object.keys(e.data).sort(), ['bytes', 'duration_ms', 'is_error', 'outcome', 'role', 'source', 'tool'])
            } else {
              assert.deepEqual(Object.keys(e.data).sort(), ['origin', 'roles', 'source', 'tools'], `${e.type} shape`)
              assert.ok(e.data.origin === cb.origin || e.data.origin === DEAD_ORIGIN, e.data.origin)
            }
          }
          const gotKeys = got.map((e) => eventKey(e.type === 'call'
            ? { type: 'call', role: e.data.role, tool: e.data.tool, outcome: e.data.outcome }
            : { type: e.type as 'registered', origin: e.data.origin, source: e.data.source, tools: e.data.tools, roles: e.data.roles }))
          assert.deepEqual([...gotKeys].sort(), expected.map(eventKey).sort(), 'the streamed events are the sequence\'s')
          if (types.includes('registered')) assert.equal(gotKeys.at(-1), eventKey(expected.at(-1)!), 'the marker comes last')
          // "Ids and replay": every event but `call` has an id `<instance>-<n>`, increasing; `call` has none.
          const hello = stream.events[0]!
          assert.equal(hello.id, hello.data.last_event_id)
          const prefix = hello.id.slice(0, hello.id.lastIndexOf('-'))
          assert.ok(String(hello.data.instance_id).startsWith(prefix), 'the id names the instance')
          let last = Number(hello.id.slice(prefix.length + 1))
          for (const e of got) {
            if (e.type === 'call') {
              assert.equal(e.id, '', 'a call event has no id')
              continue
            }
            assert.ok(e.id.startsWith(`${prefix}-`), `id ${e.id}`)
            const n = Number(e.id.slice(prefix.length + 1))
            assert.ok(Number.isInteger(n) && n > last, `ids increase: ${e.id} after ${last}`)
            last = n
          }
          // "Ids and replay": reconnecting with Last-Event-ID = the first hello's id replays every
          // event since (calls excepted: never replayed), after a hello saying `complete`.
          const missed = got.filter((e) => e.type !== 'call')
          const again = await openEvents(url, query, hello.id)
          tt.after(() => again.close())
          assert.equal(again.status, 200)
          await again.waitFor(1 + missed.length)
          const hello2 = again.events[0]!
          assert.equal(hello2.type, 'hello')
          assert.equal(hello2.data.replay, 'complete')
          assert.equal(hello2.data.replayed, missed.length)
          assert.deepEqual(again.events.slice(1, 1 + missed.length).map((e) => [e.id, e.type, e.data]),
            missed.map((e) => [e.id, e.type, e.data]), 'the replay is the missed events')
        })
      }), { numRuns: 10 * RUNS, includeErrorInReport: true })
  })

test('GET /api/events refuses an unknown type with 422 TP_ERR_VALIDATION naming it (README "Live events")', async (t) => {
  const { url, doc } = await fixture(t)
  const reply = await send(url, { method: 'GET', path: '/api/events?types=registered,bogus' })
  assert.equal(reply.status, 422)
  const body = JSON.parse(reply.text)
  assert.equal(body.code, 'TP_ERR_VALIDATION')
  assert.match(body.details[0].message, /bogus/)
  assert.ok(doc.paths['/api/events'].get.responses['422'] !== undefined)
})

test('GET /api/health answers the documented schema (README "The API")', async (t) => {
  const { url, doc } = await fixture(t)
  const oper = operations(doc).find((o) => o.path === '/api/health')!
  const reply = await send(url, { method: 'GET', path: '/api/health' })
  assert.equal(reply.status, 200)
  assert.deepEqual(checkReply(newAjv(), oper, reply), [])
  const body = JSON.parse(reply.text)
  assert.equal(body.ok, true)
  assert.equal(body.status, 'ready')
  assert.equal(body.roles, ROLES.length)
  assert.equal(body.dispatch.mode, 'pool')
})
