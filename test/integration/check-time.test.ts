// The main thread's time in argument checks is shared out (SECURITY.md "Argument validation",
// src/main/dispatch/check-time.ts): a tool whose checks keep running into limits.maxValidationMs
// has its checks cut short, and all tools together cannot take the thread either. Real HTTP, real
// checks on the main thread; the assertions count outcomes, never durations. The thread's account
// is per process: the test of it comes last, and no other file shares this process.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import type { CallFinishedEvent } from '../../src/main/events.js'
import { chargeCheck, CheckTime, threadCheckTime, threadOverdrawnForMs } from '../../src/main/dispatch/check-time.js'
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
    if (i === 0) {
      // The first check ran to its deadline and overdrew the tool's account, by a few ms: it
      // drains within tens of ms. Overdraw it by ten seconds' worth, so that the calls below
      // are made while it is, however slow the machine (the assertions count outcomes).
      const account = tp.roles.get('A').registry.get('bomb')!.checkTime
      assert.equal(account.isOverdrawn, true)
      account.debtMs = 500
      account.at = performance.now()
    }
    const ping = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'A', name: 'ping', arguments: { n: i } })
    assert.equal(ping.body.is_error, false, ping.body.error)
    assert.deepEqual(ping.body.output, { pong: i })
  }
  tp.off('call-finished', record)
  const bombs = outcomes.filter(([name]) => name === 'bomb').map(([, outcome]) => outcome)
  assert.deepEqual(outcomes.filter(([name]) => name === 'ping').map(([, outcome]) => outcome), Array(10).fill('ok'))
  // The first check ran (to its deadline); the rest were cut short.
  assert.deepEqual(bombs, ['invalid_arguments', ...Array(9).fill('check_budget')])
  assert.match(errors[0] ?? '', CHECK_TOOK_TOO_LONG)
  const refused = 9
  for (const error of errors.slice(1)) {
    assert.match(error, /^the arguments could not be checked against the tool's parameters: checking this tool's arguments took more than its share of time lately \(50 ms a second, limits\.maxValidationMs\): until that has passed, only arguments it can check at once are checked \(for up to \d+ s more\)$/)
  }
  const metrics = await (await fetch(`${url}/metrics`)).text()
  assert.match(metrics, new RegExp(`^toolport_calls_total\\{role="A",tool="bomb",outcome="check_budget"\\} ${refused}$`, 'm'))
  // Arguments the schema checks at once still pass (and reach the callback, which is not there).
  const shallow = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'A', name: 'bomb', raw_arguments: '{"v":[[[]]]}' })
  assert.match(shallow.body.error, /unreachable/)
})

test('SECURITY.md "Argument validation": while all tools\' costly checks are past the thread\'s share, every tool\'s costly checks are cut (outcome check_budget), a fresh tool\'s too, so many tools cannot take the thread either; cheap checks still pass', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  // Thirteen tools, each with a fresh account of its own: without the thread's account each would
  // run one check to its deadline, 13 × 50 ms against the thread's 250 ms a second.
  for (let i = 0; i < 13; i++) await tp.register(tool(`bomb${i}`, { parameters: BOMB, source: `plugin:evil${i}` }))
  await tp.roles.get('A').registerLocalTool({ name: 'shallow', parameters: BOMB, handler: () => 'ran' })
  // The thread's account overdrawn by ~20 s (this file's last test: it is per process), as costly
  // checks of other tools would leave it, so that every call below is made while it is.
  chargeCheck(new CheckTime(), 5000, 50)
  assert.ok(threadOverdrawnForMs(50) > 0)
  const outcomes: string[] = []
  const record = (e: CallFinishedEvent): void => { outcomes.push(e.outcome) }
  tp.on('call-finished', record)
  const errors: string[] = []
  for (let i = 0; i < 13; i++) {
    const call = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'A', name: `bomb${i}`, raw_arguments: DEEP })
    errors.push(call.body.error)
  }
  assert.deepEqual(outcomes, Array(13).fill('check_budget'))
  for (const error of errors) {
    assert.equal(error, 'the arguments could not be checked against the tool\'s parameters: argument checks took ' +
      'more than their share of time lately (limits.maxValidationMs): until that has passed, only arguments that ' +
      'can be checked at once are checked')
  }
  outcomes.length = 0
  // Just past the thread's share (a debt short of twice it: held there for about a second, a
  // thousand times what a call here takes): a check of the same schema on arguments it checks at
  // once passes, and so does a cheap check that does more than a tool cut short may (150 strings
  // of a format: ~300 000 units of work, past the 2^16 of a cut-short check, under the quantum
  // where a check becomes costly).
  const thread = threadCheckTime()
  const holdJustPast = (): void => {
    thread.debtMs = 499
    thread.at = performance.now()
    thread.isOverdrawn = true
  }
  await tp.roles.get('A').registerLocalTool({
    name: 'emails',
    parameters: { type: 'object', properties: { to: { type: 'array', items: { type: 'string', format: 'email' } } } },
    handler: (args) => (args as { to: string[] }).to.length
  })
  const to = Array.from({ length: 150 }, (_, i) => `user${i}@example.com`)
  const callEmails = async (): Promise<{ is_error: boolean, output: unknown, error?: string }> =>
    (await httpJson(`${url}/api/tools/call`, 'POST', { role: 'A', name: 'emails', arguments: { to } })).body
  holdJustPast()
  const shallow = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'A', name: 'shallow', raw_arguments: '{"v":[[[]]]}' })
  assert.equal(shallow.body.is_error, false, shallow.body.error)
  assert.equal(shallow.body.output, 'ran')
  holdJustPast()
  const emails = await callEmails()
  assert.equal(emails.is_error, false, emails.error)
  assert.equal(emails.output, 150)
  // A costly check of a tool with no debt of its own is still cut, at the quantum.
  await tp.register(tool('fresh', { parameters: BOMB, source: 'plugin:evil-fresh' }))
  holdJustPast()
  const bomb = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'A', name: 'fresh', raw_arguments: DEEP })
  assert.match(bomb.body.error, /argument checks took more than their share of time lately/)
  // Far past it (many tools, each stopped at the quantum, charged): every check is cut short,
  // the 150 strings' too; the shallow one still passes.
  chargeCheck(new CheckTime(), 5000, 50)
  const cutShort = await callEmails()
  assert.match(cutShort.error ?? '', /argument checks took more than their share of time lately/)
  const stillShallow = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'A', name: 'shallow', raw_arguments: '{"v":[[[]]]}' })
  assert.equal(stillShallow.body.is_error, false, stillShallow.body.error)
  tp.off('call-finished', record)
  assert.deepEqual(outcomes, ['ok', 'ok', 'check_budget', 'check_budget', 'ok'])
})
