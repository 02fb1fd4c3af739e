// GET /api/tools (docs/protocol.md R18) and GET /api/console/state for registries whose JSON is
// longer than V8's longest string: every size the limits allow answers, streamed with an exact
// Content-Length. One JSON.stringify of the whole answer threw "Invalid string length" (a 500,
// after blocking the main thread for seconds, and again on every retry).
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { constants } from 'node:buffer'
import { request } from 'undici'
import type { Toolport } from '../../src/main/index.js'
import { streamedJson } from '../../src/main/http/streamed-json.js'
import { startToolport } from '../helpers.js'

/** The longest description the limits allow here, of U+0001: six characters each in JSON. */
const DESCRIPTION_CHARS = 1024 * 1024
const ROW_JSON_CHARS = 6 * DESCRIPTION_CHARS
/** Roles enough for one global tool's rows to pass V8's longest string. */
const ROLES = Math.ceil(constants.MAX_STRING_LENGTH / ROW_JSON_CHARS) + 4

/** A Toolport on loopback whose every role holds the one tool `big`, registered once for all roles. */
async function hugeRegistry (t: TestContext): Promise<{ tp: Toolport, url: string }> {
  const roles = Array.from({ length: ROLES }, (_, i) => `role_${i}`)
  const { tp, url } = await startToolport(t, { roles, limits: { maxDescriptionChars: DESCRIPTION_CHARS } })
  const result = await tp.register({
    name: 'big',
    description: '\u0001'.repeat(DESCRIPTION_CHARS),
    callback_url: 'http://127.0.0.1:9/big',
    source: 'plugin:big'
  })
  assert.equal(result.affected_roles.length, ROLES)
  return { tp, url }
}

interface Answer {
  statusCode: number
  contentLength: number
  bytes: number
  head: string
  tail: string
}

/** Reads an answer without keeping it: its size, its first and last bytes. */
async function readAnswer (url: string): Promise<Answer> {
  const res = await request(url)
  let bytes = 0
  let head = ''
  let tail = Buffer.alloc(0)
  for await (const chunk of res.body) {
    const piece = chunk as Buffer
    if (head.length < 200) head += piece.subarray(0, 200).toString('latin1')
    bytes += piece.length
    tail = Buffer.concat([tail, piece.subarray(-200)]).subarray(-200)
  }
  return { statusCode: res.statusCode, contentLength: Number(res.headers['content-length']), bytes, head, tail: tail.toString('latin1') }
}

test('R18: a list longer than the longest V8 string is streamed whole with an exact Content-Length, not a 500', async (t) => {
  const { tp, url } = await hugeRegistry(t)
  const row = JSON.stringify(tp.list('role_0').tools_by_role.role_0?.[0])
  let expected = Buffer.byteLength('{"ok":true,"tools_by_role":{}}')
  for (const role of tp.roles.list()) expected += Buffer.byteLength(`${JSON.stringify(role.name)}:[${row}]`)
  expected += ROLES - 1 // the commas between roles
  assert.ok(expected > constants.MAX_STRING_LENGTH)
  // Twice: the second answer is written from the measure remembered for the snapshot.
  for (let i = 0; i < 2; i++) {
    const answer = await readAnswer(`${url}/api/tools`)
    assert.equal(answer.statusCode, 200)
    assert.equal(answer.contentLength, expected)
    assert.equal(answer.bytes, expected)
    assert.ok(answer.head.startsWith('{"ok":true,"tools_by_role":{"role_0":[{"name":"big","description":"\\u0001'))
    assert.ok(answer.tail.endsWith('\\u0001","source":"plugin:big","callback_url":"http://127.0.0.1:9/big","is_remote":true}]}}'))
  }
})

test('R18: the list is the same answer whether written at once, measured first, or streamed', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A', 'B'] })
  const check = async (): Promise<number> => {
    const res = await request(`${url}/api/tools`)
    const text = await res.body.text()
    assert.equal(res.statusCode, 200)
    assert.equal(Number(res.headers['content-length']), Buffer.byteLength(text))
    assert.deepEqual(JSON.parse(text), JSON.parse(JSON.stringify(tp.list())))
    return Buffer.byteLength(text)
  }
  const register = async (from: number, to: number): Promise<void> => {
    for (let i = from; i < to; i++) {
      const result = await tp.register({
        name: `tool_${i}`,
        description: `${i} `.padEnd(16 * 1024, 'é'),
        callback_url: `http://127.0.0.1:9/t${i}`,
        source: `plugin:s${i % 7}`
      })
      assert.equal(result.ok, true)
    }
  }
  // A few tools: one JSON.stringify. 100 × 2 roles of 16 KiB descriptions: their bound (six bytes
  // a character) is past 8 MiB, their JSON (two bytes an é) is not. 300 × 2: streamed.
  await register(0, 5)
  await check()
  await register(5, 100)
  assert.ok(await check() < 8 * 1024 * 1024)
  await register(100, 300)
  assert.ok(await check() > 8 * 1024 * 1024)
  // Asked again, each answer is the same (cached or remembered), also for one role.
  assert.ok(await check() > 8 * 1024 * 1024)
  const one = await request(`${url}/api/tools?role=B`)
  assert.deepEqual(await one.body.json(), JSON.parse(JSON.stringify(tp.list('B'))))
})

test('GET /api/console/state longer than the longest V8 string is streamed whole with an exact Content-Length, not a 500', async (t) => {
  const { url } = await hugeRegistry(t)
  const answer = await readAnswer(`${url}/api/console/state`)
  assert.equal(answer.statusCode, 200)
  assert.ok(answer.bytes > constants.MAX_STRING_LENGTH)
  assert.equal(answer.contentLength, answer.bytes)
  assert.match(answer.head, /^\{"roles":\[\{"name":"role_0","sessions":0,"last_sync":null,"tools":\[\{"name":"big","description":"\\u0001/)
  assert.match(answer.tail, /"evictions":\[\],"calls":\[\]\}$/)
})

test('a streamed answer lets the event loop run while a reader takes it as fast as it is written', async () => {
  // 2 000 rows of ~16 KiB: 32 MB. A reader that never waits (for await, as a socket that always
  // takes the bytes) must not keep other work (a timer, another request) waiting until the end.
  const row = { name: 'x', description: 'd'.repeat(16 * 1024) }
  const body = await streamedJson(['[', Object.freeze(Array.from({ length: 2000 }, () => row)), ']'])
  let read = 0
  let readWhenTheLoopRan = -1
  setImmediate(() => { readWhenTheLoopRan = read })
  for await (const chunk of body.stream()) read += (chunk as Buffer).length
  assert.equal(read, body.bytes)
  assert.ok(readWhenTheLoopRan >= 0 && readWhenTheLoopRan < body.bytes / 4,
    `the event loop ran after ${readWhenTheLoopRan} of ${body.bytes} bytes`)
})
