// The response serializers that fastify builds from the routes' response schemas: Toolport's app
// builds each on first use (src/main/http/serializers.ts), so these tests build all of them up
// front (a schema fast-json-stringify refuses must fail here, not on a first request) and check
// that a serializer built late writes what one built at start-up writes.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import fastify, { type RouteOptions } from 'fastify'
import SerializerSelector from '@fastify/fast-json-stringify-compiler'
import { toolportPlugin } from '../../src/main/index.js'
import { buildLazySerializer } from '../../src/main/http/serializers.js'
import { createTestToolport } from '../helpers.js'

/** Every route the plugin mounts, with its options, as fastify's onRoute hook sees them. */
async function mountedRoutes (t: import('node:test').TestContext): Promise<RouteOptions[]> {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const host = fastify()
  t.after(() => host.close())
  const routes: RouteOptions[] = []
  host.addHook('onRoute', (route) => { routes.push(route) })
  await host.register(toolportPlugin, { runtime: tp })
  await host.ready()
  return routes
}

test('every response schema of every route compiles to a fast-json-stringify serializer', async (t) => {
  const routes = await mountedRoutes(t)
  const compile = SerializerSelector()({}, {})
  let built = 0
  const withSchemas = new Set<string>()
  for (const route of routes) {
    const responses = (route.schema?.response ?? {}) as Record<string, unknown>
    for (const [httpStatus, schema] of Object.entries(responses)) {
      const method = String(route.method)
      const serialize = compile({ schema, method, url: route.url, httpStatus })
      assert.equal(typeof serialize, 'function', `${method} ${route.url} ${httpStatus}`)
      withSchemas.add(`${method} ${route.url}`)
      built++
    }
  }
  // Not vacuous: the tool routes carry a success and several error schemas each.
  assert.ok(withSchemas.has('POST /api/tools/register') && withSchemas.has('POST /api/tools/call'),
    [...withSchemas].join(', '))
  assert.ok(built >= 20, `only ${built} response schemas`)
})

test('a serializer built on first use writes what the one built at start-up writes, and is built once', async (t) => {
  const routes = await mountedRoutes(t)
  const register = routes.find((r) => r.url === '/api/tools/register' && r.method === 'POST')
  assert.ok(register !== undefined)
  const schema = (register.schema?.response as Record<string, unknown>)['200']
  const definition = { schema, method: 'POST', url: '/api/tools/register', httpStatus: '200' }
  const eager = SerializerSelector()({}, {})(definition)
  let builds = 0
  const counting: typeof buildLazySerializer = (external, options) => {
    const inner = buildLazySerializer(external, options)
    return (route) => inner(new Proxy(route, {
      get (target, key, receiver) {
        if (key === 'schema') builds++
        return Reflect.get(target, key, receiver) as unknown
      }
    }))
  }
  const lazy = counting({}, {})(definition)
  assert.equal(builds, 0, 'nothing is built before the first answer')
  // An extra property the schema does not list is dropped by both, as fastify's own serializer does.
  const result = { ok: true, registered: 'x', affected_roles: ['A'], failed_roles: [], extra: 'dropped' }
  assert.equal(lazy(result), eager(result))
  assert.equal(lazy({ ...result, registered: 'y' }), eager({ ...result, registered: 'y' }))
  assert.equal(builds, 1)
  assert.doesNotMatch(lazy(result), /dropped/)
})
