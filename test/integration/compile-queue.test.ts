// The schema compiler thread is shared: its compiles take turns by source (docs/architecture.md
// "Argument validation", SECURITY.md "Argument validation"). Real compiler thread; the order in
// which registrations are answered, and compile counts, decide, never durations.
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { test } from 'node:test'
import { compileCount } from '../../src/main/dispatch/validators.js'
import { createTestToolport, tool } from '../helpers.js'

/** A schema no other test (and no earlier run of this one in the process) compiled. */
function distinct (label: string): Record<string, unknown> {
  return { type: 'object', properties: { [`${label}_${randomUUID()}`]: { type: 'string', minLength: 1 } } }
}

/** Registers each body in order, without waiting, and records the order in which they are answered. */
function registerAll (register: (body: Record<string, unknown>) => Promise<unknown>,
  bodies: Array<Record<string, unknown>>): { answered: string[], all: Promise<unknown> } {
  const answered: string[] = []
  const all = Promise.all(bodies.map(async (body) => {
    await register(body)
    answered.push(body.name as string)
  }))
  return { answered, all }
}

test('docs/architecture.md "Argument validation": compiles take turns by source, so four schemas a plugin has waiting delay another source\'s registration by one compile, not four', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const hostile = [0, 1, 2, 3].map((i) => tool(`evil${i}`, { source: 'plugin:evil', parameters: distinct(`evil${i}`) }))
  const victim = tool('victim', { source: 'plugin:victim', parameters: distinct('victim') })
  // All five are queued in this turn: the compile running when the victim comes is evil0's.
  const { answered, all } = registerAll(async (body) => await tp.register(body), [...hostile, victim])
  await all
  assert.deepEqual(answered, ['evil0', 'victim', 'evil1', 'evil2', 'evil3'])
})

test('docs/architecture.md "Argument validation": a schema another source has waiting runs at the first of their turns, once', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const shared = distinct('shared')
  const hostile = [0, 1, 2].map((i) => tool(`evil${i}`, { source: 'plugin:evil', parameters: distinct(`evil${i}`) }))
  hostile.push(tool('evil3', { source: 'plugin:evil', parameters: shared }))
  const before = compileCount()
  const { answered, all } = registerAll(async (body) => await tp.register(body),
    [...hostile, tool('victim', { source: 'plugin:victim', parameters: shared })])
  await all
  // The victim's turn comes after evil0's compile; the schema it shares with evil3 compiles then.
  assert.deepEqual(answered.slice(0, 1), ['evil0'])
  assert.deepEqual(new Set(answered.slice(1, 3)), new Set(['evil3', 'victim']))
  assert.deepEqual(answered.slice(3), ['evil1', 'evil2'])
  assert.equal(compileCount() - before, 4, 'five registrations, four schemas')
})

test('SECURITY.md "Ownership mode": a registration under a source bound to another key is refused before its schema is compiled (it never waits in the owner\'s turn)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'], security: { enforceOwnership: true } })
  const owner = 'k'.repeat(32)
  await tp.register(tool('mine', { source: 'plugin:owned', parameters: distinct('mine') }), { pluginKey: owner })
  const before = compileCount()
  await assert.rejects(tp.register(tool('theirs', { source: 'plugin:owned', parameters: distinct('theirs') }),
    { pluginKey: 'x'.repeat(32) }), { statusCode: 403, code: 'TP_ERR_NOT_OWNER' })
  assert.equal(compileCount(), before)
})
