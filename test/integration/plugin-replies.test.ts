// Tool errors and images as the originating application's plugins send them (docs/protocol.md
// R11; README "Errors and images from a plugin"), from a real Python callback server
// (test/fixtures/neko_plugin.py), through every way a model reaches a tool: callTool,
// POST /api/tools/call, MCP (the official SDK Client over Streamable HTTP) and the Realtime
// adapter (a local `ws` provider). Both dispatch modes.
import { after, describe, test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import { once } from 'node:events'
import type { AddressInfo } from 'node:net'
import { createInterface } from 'node:readline'
import { WebSocket, WebSocketServer } from 'ws'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js'
import { createRealtimeSession, toolResultBlock, type Toolport } from '../../src/main/index.js'
import { httpJson, startToolport } from '../helpers.js'

type Json = Record<string, any>

const hasPython = spawnSync('python3', ['--version']).status === 0
const SKIP = hasPython ? false : 'python3 is not installed'

interface Plugin {
  url: string
  red: string
  blue: string
  jpeg: string
}

async function startPlugin (t: TestContext): Promise<Plugin> {
  const child = spawn('python3', ['test/fixtures/neko_plugin.py'], { stdio: ['pipe', 'pipe', 'inherit'] })
  t.after(async () => {
    if (child.exitCode !== null) return
    const exited = once(child, 'exit')
    child.stdin.end()
    const timer = setTimeout(() => child.kill('SIGKILL'), 2000)
    await exited
    clearTimeout(timer)
  })
  const [line] = await once(createInterface({ input: child.stdout }), 'line') as [string]
  const info = JSON.parse(line) as { port: number, red: string, blue: string, jpeg: string }
  return { url: `http://127.0.0.1:${info.port}`, red: info.red, blue: info.blue, jpeg: info.jpeg }
}

const ROUTES = ['no_data', 'not_running', 'exception', 'picture', 'bad_images', 'too_many', 'images_only']

interface Setup {
  tp: Toolport
  url: string
  plugin: Plugin
}

/** A listening Toolport (role Lanlan) with one tool per route of the Python plugin. */
async function setup (t: TestContext, mode: 'pool' | 'inline'): Promise<Setup> {
  const plugin = await startPlugin(t)
  const { tp, url } = await startToolport(t, {
    roles: ['Lanlan'],
    dispatch: { mode, maxImages: 3, maxImageBytes: 200 }
  })
  for (const route of ROUTES) {
    const result = await tp.register({
      name: route,
      callback_url: `${plugin.url}/${route}`,
      source: 'plugin:neko',
      parameters: { type: 'object', properties: { location: { type: 'string' } } }
    })
    assert.equal(result.ok, true)
  }
  return { tp, url, plugin }
}

async function mcpClient (t: TestContext, url: string): Promise<Client> {
  const client = new Client({ name: 'toolport-test', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/Lanlan`)))
  t.after(() => client.close())
  return client
}

const NO_DATA_TEXT = '{"error":"NO_DATA","output":{"reason":"no_data"}}'

for (const mode of ['pool', 'inline'] as const) {
  describe(`plugin replies like the originating application's (${mode} mode)`, { skip: SKIP }, () => {
    // One plugin process and one Toolport for the whole suite: the tests only call the tools, and
    // each closes what it opens (MCP clients, realtime sessions).
    let shared: Promise<Setup> | undefined
    const cleanups: Array<() => unknown> = []
    const suiteScope = { after: (fn: () => unknown) => { cleanups.push(fn) } } as unknown as TestContext
    const setupOnce = (): Promise<Setup> => (shared ??= setup(suiteScope, mode))
    after(async () => {
      for (const cleanup of cleanups.reverse()) await cleanup()
    })

    test('R11: an error reply keeps error and output; the model text carries both, or only the error when output is null', async (t) => {
      const { tp } = await setupOnce()
      const noData = await tp.callTool('Lanlan', { name: 'no_data', arguments: {} })
      assert.equal(noData.is_error, true)
      assert.equal(noData.error, 'NO_DATA')
      assert.deepEqual(noData.output, { reason: 'no_data' })
      assert.equal(noData.text, NO_DATA_TEXT)

      const notRunning = await tp.callTool('Lanlan', { name: 'not_running', arguments: {} })
      assert.equal(notRunning.error, "plugin 'weather' is not running")
      assert.equal(notRunning.output, null)
      assert.equal(notRunning.text, '{"error":"plugin \'weather\' is not running"}')

      const exception = await tp.callTool('Lanlan', { name: 'exception', arguments: {} })
      assert.deepEqual(JSON.parse(exception.text), {
        error: 'PLUGIN_ERROR',
        output: {
          reason: 'exception',
          detail: 'ValueError: kaput'
        }
      })
      assert.deepEqual(exception.output, { reason: 'exception', detail: 'ValueError: kaput' })
    })

    test('R11: POST /api/tools/call answers the error with its output', async (t) => {
      const { url } = await setupOnce()
      const reply = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'Lanlan', name: 'no_data', arguments: {} })
      assert.equal(reply.statusCode, 200)
      assert.deepEqual(reply.body, {
        is_error: true,
        output: { reason: 'no_data' },
        error: 'NO_DATA',
        text: NO_DATA_TEXT
      })
      const nullOutput = await httpJson(`${url}/api/tools/call`, 'POST', {
        role: 'Lanlan',
        name: 'not_running',
        arguments: {}
      })
      assert.equal(nullOutput.body.output, null)
      assert.equal(nullOutput.body.error, "plugin 'weather' is not running")
    })

    test('R11: MCP tools/call answers isError with the error and output as text (SDK client)', async (t) => {
      const { url } = await setupOnce()
      const client = await mcpClient(t, url)
      const result = await client.callTool({ name: 'no_data', arguments: {} }) as CallToolResult
      assert.equal(result.isError, true)
      assert.deepEqual(result.content, [{ type: 'text', text: NO_DATA_TEXT }])
      assert.equal(result.structuredContent, undefined)
    })

    test('images: checked images reach the ToolResult with their prompt, and the output stays as sent', async (t) => {
      const { tp, plugin } = await setupOnce()
      const result = await tp.callTool('Lanlan', { name: 'picture', arguments: { location: 'Oslo' } })
      assert.equal(result.is_error, false)
      assert.deepEqual(result.output, { caption: '天气图', location: 'Oslo' })
      assert.equal(result.text, '{"caption":"天气图","location":"Oslo"}')
      assert.deepEqual(result.images, [
        { mime_type: 'image/png', data_base64: plugin.red, prompt: 'Describe the weather map.' },
        { mime_type: 'image/jpeg', data_base64: plugin.jpeg }
      ])
    })

    test('images: POST /api/tools/call and MCP answer them (MCP as image content items beside the text)', async (t) => {
      const { url, plugin } = await setupOnce()
      const reply = await httpJson(`${url}/api/tools/call`, 'POST', {
        role: 'Lanlan',
        name: 'picture',
        arguments: { location: 'Oslo' }
      })
      assert.deepEqual(reply.body.images, [
        { mime_type: 'image/png', data_base64: plugin.red, prompt: 'Describe the weather map.' },
        { mime_type: 'image/jpeg', data_base64: plugin.jpeg }
      ])
      assert.deepEqual(reply.body.output, { caption: '天气图', location: 'Oslo' })

      const client = await mcpClient(t, url)
      const result = await client.callTool({ name: 'picture', arguments: { location: 'Oslo' } }) as CallToolResult
      assert.equal(result.isError, false)
      assert.deepEqual(result.content, [
        { type: 'text', text: '{"caption":"天气图","location":"Oslo"}' },
        { type: 'image', data: plugin.red, mimeType: 'image/png' },
        { type: 'image', data: plugin.jpeg, mimeType: 'image/jpeg' }
      ])
      assert.deepEqual(result.structuredContent, { caption: '天气图', location: 'Oslo' })
    })

    test('images: bad base64, a mime mismatch, an image over the size cap and one over the count cap become _image_warnings; the call is answered', async (t) => {
      const { tp } = await setupOnce()
      const result = await tp.callTool('Lanlan', { name: 'bad_images', arguments: {} })
      assert.equal(result.is_error, false)
      assert.equal(result.images, undefined)
      const output = result.output as { caption: string, _image_warnings: string[] }
      assert.equal(output.caption, 'mixed')
      assert.equal(output._image_warnings.length, 4)
      const [base64, mismatch, tooBig, tooMany] = output._image_warnings
      assert.match(base64 ?? '', /^image 1: .*not valid base64/)
      assert.match(mismatch ?? '', /^image 2: mime "image\/jpeg" does not match the data, which is PNG/)
      assert.match(tooBig ?? '', /^image 3: 284 bytes of base64, more than the 200 allowed/)
      assert.match(tooMany ?? '', /^images: 4 sent, at most 3 are passed on/)
      assert.deepEqual(JSON.parse(result.text), output)
    })

    test('images: past the count cap the first ones still pass; a string output is wrapped beside its warnings', async (t) => {
      const { tp, plugin } = await setupOnce()
      const result = await tp.callTool('Lanlan', { name: 'too_many', arguments: {} })
      assert.deepEqual(result.images?.map((image) => image.data_base64), [plugin.red, plugin.blue, plugin.red])
      const output = result.output as { output: string, _image_warnings: string[] }
      assert.equal(output.output, 'three pictures')
      assert.equal(output._image_warnings.length, 1)
      assert.deepEqual(JSON.parse(result.text), output)
    })

    test('images: with no output, the good image passes and the model reads only the warnings', async (t) => {
      const { tp, plugin, url } = await setupOnce()
      const result = await tp.callTool('Lanlan', { name: 'images_only', arguments: {} })
      assert.deepEqual(result.images, [{ mime_type: 'image/png', data_base64: plugin.blue }])
      assert.deepEqual(Object.keys(result.output as object), ['_image_warnings'])
      assert.match((result.output as { _image_warnings: string[] })._image_warnings[0] ?? '', /^image 2: .*which is JPEG/)
      const reply = await httpJson(`${url}/api/tools/call`, 'POST', {
        role: 'Lanlan',
        name: 'images_only',
        arguments: {}
      })
      assert.deepEqual(reply.body.output, result.output)
    })

    test('images: toolResultBlock shapes Anthropic tool_result and OpenAI Responses function_call_output with the images', async (t) => {
      const { tp, plugin } = await setupOnce()
      const result = await tp.callTool('Lanlan', { name: 'picture', arguments: { location: 'Oslo' } })
      const text = '{"caption":"天气图","location":"Oslo"}'
      assert.deepEqual(toolResultBlock(result, 'anthropic', 'toolu_1'), {
        type: 'tool_result',
        tool_use_id: 'toolu_1',
        content: [
          { type: 'text', text },
          { type: 'text', text: 'Describe the weather map.' },
          { type: 'image', source: { type: 'base64', media_type: 'image/png', data: plugin.red } },
          { type: 'image', source: { type: 'base64', media_type: 'image/jpeg', data: plugin.jpeg } }
        ]
      })
      assert.deepEqual(toolResultBlock(result, 'openai-responses', 'call_1'), {
        type: 'function_call_output',
        call_id: 'call_1',
        output: [
          { type: 'input_text', text },
          { type: 'input_text', text: 'Describe the weather map.' },
          { type: 'input_image', image_url: `data:image/png;base64,${plugin.red}`, detail: 'auto' },
          { type: 'input_image', image_url: `data:image/jpeg;base64,${plugin.jpeg}`, detail: 'auto' }
        ]
      })
      const error = await tp.callTool('Lanlan', { name: 'no_data', arguments: {} })
      assert.deepEqual(toolResultBlock(error, 'anthropic', 'toolu_2'), {
        type: 'tool_result',
        tool_use_id: 'toolu_2',
        content: NO_DATA_TEXT,
        is_error: true
      })
      assert.deepEqual(toolResultBlock(error, 'openai-chat', 'call_2'), {
        role: 'tool',
        tool_call_id: 'call_2',
        content: NO_DATA_TEXT
      })
    })

    test('Realtime: function_call_output carries the error with its output, and says how many images were omitted', async (t) => {
      const { tp } = await setupOnce()
      const server = new WebSocketServer({ host: '127.0.0.1', port: 0 })
      await once(server, 'listening')
      const received: Json[] = []
      const arrived = new EventTarget()
      let provider: WebSocket | undefined
      server.on('connection', (socket) => {
        provider = socket
        socket.on('message', (data) => {
          const event = JSON.parse(data.toString()) as Json
          received.push(event)
          if (event.type === 'session.update') {
            socket.send(JSON.stringify({
              type: 'session.updated',
              session: event.session
            }))
          }
          arrived.dispatchEvent(new Event('event'))
        })
      })
      const ws = new WebSocket(`ws://127.0.0.1:${(server.address() as AddressInfo).port}`)
      await once(ws, 'open')
      const session = createRealtimeSession({
        toolport: tp,
        role: 'Lanlan',
        send: (event) => { ws.send(JSON.stringify(event)) }
      })
      ws.on('message', (data) => session.handleServerEvent(data.toString()))
      t.after(async () => {
        session.close()
        ws.terminate()
        for (const client of server.clients) client.terminate()
        await new Promise<void>((resolve) => server.close(() => resolve()))
      })
      await tp.roles.get('Lanlan').sync()

      const calls = [['call_a', 'no_data'], ['call_b', 'picture']] as const
      const output = calls.map(([callId, name]) => ({
        type: 'function_call',
        status: 'completed',
        call_id: callId,
        name,
        arguments: '{"location":"Oslo"}'
      }))
      provider?.send(JSON.stringify({
        type: 'response.created',
        response: {
          id: 'resp_1',
          status: 'in_progress',
          output: []
        }
      }))
      provider?.send(JSON.stringify({ type: 'response.done', response: { id: 'resp_1', status: 'completed', output } }))
      while (!received.some((event) => event.type === 'response.create')) await once(arrived, 'event')
      const outputs = new Map(received.filter((e) => e.type === 'conversation.item.create').map((e) => [e.item.call_id,
        e.item.output]))
      assert.equal(outputs.get('call_a'), NO_DATA_TEXT)
      assert.equal(outputs.get('call_b'),
        '{"caption":"天气图","location":"Oslo"}\n[2 images from the tool omitted: this session takes text only]')
    })
  })
}
