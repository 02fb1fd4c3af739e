// The main thread's time in argument checks is shared out (SECURITY.md "Argument validation",
// src/main/dispatch/check-time.ts): a tool whose checks keep running into limits.maxValidationMs
// has its checks cut short, and all tools together cannot take the thread either. Real HTTP, real
// checks on the main thread; the assertions count outcomes, never durations. The thread's account
// is per process: the test of it comes last, and no other file shares this process.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import type { CallFinishedEvent } from '../../src/main/events.js'
import { httpJson, startToolport, tool } from '../helpers.js'

/** Two `anyOf` branches that both `$ref` their definition: 2^depth work on nested arrays. */
const BOMB = {
  type: 'object',
  properties: { v: { $ref: '#/$defs/n' } },
  $defs: { n: { anyOf: [{ type: 'array', items: { $ref: '#/$defs/n' } }, { type: 'array', items: { $ref: '#/$defs/n' }, minItems: 0 }] } }
}
/** An argument nested 40 deep: its check runs into any deadline. */
const DEEP = `{"v":${'['.repeat(40)}1${']'.repeat(40)}}`

const CHECK_TOOK_TOO_LONG = /^the arguments could not be checked against the tool's parameters: checking them took longer than 50 ms/

test('docs/protocol.md R9: a tool whose argument checks keep running into limits.maxValidationMs has its checks cut short (outcome check_budget, in the events and the metrics); its quick checks and another tool\'s calls still pass', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  await tp.register(tool('bomb', { parameters: BOMB, source: 'plugin:evil' }))
  await tp.roles.get('A').registerLocalTool({
    name: 'ping',
    parameters: { type: 'object', properties: { n: { type: 'integer' } }, required: ['n'] },
    handler: (args) => ({ pong: (args as { n: number }).n })
  })
  const outcomes: Array<[string, string]> = []
  const record = (e: CallFinishedEvent): void => { outcomes.push([e.name, e.outcome]) }
  tp.on('call-finished', record)
  const errors: string[] = []
  for (let i = 0; i < 10; i++) {
    const bomb = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'A', name: 'bomb', raw_arguments: DEEP })
    assert.equal(bomb.body.is_error, true)
    errors.push(bomb.body.error)
    const ping = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'A', name: 'ping', arguments: { n: i } })
    assert.equal(ping.body.is_error, false, ping.body.error)
    assert.deepEqual(ping.body.output, { pong: i })
  }
  tp.off('call-finished', record)
  const bombs = outcomes.filter(([name]) => name === 'bomb').map(([, outcome]) => outcome)
  assert.deepEqual(outcomes.filter(([name]) => name === 'ping').map(([, outcome]) => outcome), Array(10).fill('ok'))
  // The first check ran (to its deadline); of the rest, one in a second at most ran to its
  // deadline (its 50 ms share of that second), and the others were cut short.
  assert.equal(bombs[0], 'invalid_arguments')
  assert.match(errors[0] ?? '', CHECK_TOOK_TOO_LONG)
  const refused = bombs.filter((outcome) => outcome === 'check_budget').length
  assert.ok(refused >= 7, `refused ${refused} of 10: ${bombs.join(' ')}`)
  for (const [i, outcome] of bombs.entries()) {
    if (outcome === 'check_budget') {
      assert.match(errors[i] ?? '', /^the arguments could not be checked against the tool's parameters: checking this tool's arguments took more than its share of time lately \(50 ms a second, limits\.maxValidationMs\): until that has passed, only arguments it can check at once are checked \(for up to \d+ s more\)$/)
    } else {
      assert.equal(outcome, 'invalid_arguments')
      assert.match(errors[i] ?? '', CHECK_TOOK_TOO_LONG)
    }
  }
  const metrics = await (await fetch(`${url}/metrics`)).text()
  assert.match(metrics, new RegExp(`^toolport_calls_total\\{role="A",tool="bomb",outcome="check_budget"\\} ${refused}$`, 'm'))
  // Arguments the schema checks at once still pass (and reach the callback, which is not there).
  const shallow = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'A', name: 'bomb', raw_arguments: '{"v":[[[]]]}' })
  assert.match(shallow.body.error, /unreachable/)
})

test('SECURITY.md "Argument validation": once all tools\' costly checks pass the thread\'s share, each check is cut short (outcome check_budget), so many tools cannot take the thread either; cheap checks still pass', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  // Thirteen tools, each with a fresh account of its own: without the thread's account each would
  // run one check to its deadline, 13 × 50 ms against the thread's 250 ms a second.
  for (let i = 0; i < 13; i++) await tp.register(tool(`bomb${i}`, { parameters: BOMB, source: `plugin:evil${i}` }))
  await tp.roles.get('A').registerLocalTool({ name: 'shallow', parameters: BOMB, handler: () => 'ran' })
  const outcomes: string[] = []
  const record = (e: CallFinishedEvent): void => { outcomes.push(e.outcome) }
  tp.on('call-finished', record)
  const errors: string[] = []
  for (let i = 0; i < 13; i++) {
    const call = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'A', name: `bomb${i}`, raw_arguments: DEEP })
    errors.push(call.body.error)
  }
  const cut = outcomes.indexOf('check_budget')
  assert.notEqual(cut, -1, `one of the thirteen is cut short: ${outcomes.join(' ')}`)
  for (const [i, outcome] of outcomes.entries()) {
    if (outcome === 'invalid_arguments') assert.match(errors[i] ?? '', CHECK_TOOK_TOO_LONG)
    else {
      assert.equal(outcome, 'check_budget')
      assert.equal(errors[i], 'the arguments could not be checked against the tool\'s parameters: argument checks took ' +
        'more than their share of time lately (limits.maxValidationMs): until that has passed, only arguments that ' +
        'can be checked at once are checked')
    }
  }
  outcomes.length = 0
  // A check of the same schema on arguments it checks at once passes meanwhile.
  const shallow = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'A', name: 'shallow', raw_arguments: '{"v":[[[]]]}' })
  assert.equal(shallow.body.is_error, false, shallow.body.error)
  assert.equal(shallow.body.output, 'ran')
  tp.off('call-finished', record)
  assert.deepEqual(outcomes, ['ok'])
})
