// Renders the console with a few roles, tools, plugins and calls, and saves docs/console.png.
// Needs a chromium (Debian: `apt-get install -y chromium`); run: node --import tsx scripts/console-screenshot.ts
import { existsSync, statSync } from 'node:fs'
import { setTimeout as sleep } from 'node:timers/promises'
import puppeteer from 'puppeteer-core'
import { createToolport } from '../src/main/index.js'
import { createPlugin } from '../src/plugin/index.js'

const CHROMIUM = process.env.CHROMIUM_PATH ?? ['/usr/bin/chromium', '/usr/bin/chromium-browser',
  '/usr/bin/google-chrome'].find((p) => existsSync(p))
if (CHROMIUM === undefined) {
  throw new Error('no chromium found: apt-get install -y chromium (or set CHROMIUM_PATH)')
}
const out = process.argv[2] ?? 'docs/console.png'
const theme = process.argv[3] ?? 'light'

const tp = await createToolport({ roles: ['Lanlan', 'Mochi', 'Nova'], logger: false })
const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
const weather = createPlugin({
  toolportUrl: url,
  source: 'plugin:weather',
  tools: {
    get_weather: {
      description: 'Current weather for a city.',
      parameters: {
        type: 'object',
        properties: {
          city: { type: 'string', description: 'City name' },
          unit: { type: 'string', enum: ['c', 'f'] }
        },
        required: ['city']
      },
      handler: async (args: Record<string, unknown>) => {
        await sleep(2 + Math.random() * 8); return {
          city: args.city,
          temperature_c: 28
        }
      }
    },
    get_forecast: {
      description: 'Three-day forecast.',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string' }, days: { type: 'integer' } },
        required: ['city']
      },
      handler: async () => { await sleep(5 + Math.random() * 30); return { days: [] } }
    }
  }
})
const notes = createPlugin({
  toolportUrl: url,
  source: 'plugin:notes',
  role: 'Mochi',
  tools: {
    save_note: {
      description: 'Save a note for later.',
      parameters: {
        type: 'object',
        properties: { text: { type: 'string' } }
      },
      handler: () => ({ saved: true })
    }
  }
})
await weather.start()
await notes.start()
await tp.roles.get('Nova').registerLocalTool({
  name: 'roll_dice',
  description: 'Roll an n-sided die.',
  handler: () => Math.ceil(Math.random() * 6)
})
const detach = tp.roles.get('Lanlan').attachSession({ id: 'rt-1', syncTools: async () => { await sleep(3) } })
await tp.roles.get('Lanlan').sync()

const browser = await puppeteer.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: ['--no-sandbox',
    '--disable-gpu']
})
const page = await browser.newPage()
await page.emulateMediaFeatures([{ name: 'prefers-color-scheme', value: theme }])
await page.setViewport({ width: 1400, height: 1150, deviceScaleFactor: 1 })
await page.goto(`${url}/`, { waitUntil: 'load' })
// A dead plugin, called three times, is evicted (docs/protocol.md R13).
await tp.register({ name: 'stale_tool', callback_url: 'http://127.0.0.1:9/stale', source: 'plugin:stale' })
for (let i = 0; i < 3; i++) await tp.callTool('Lanlan', { name: 'stale_tool', arguments: {} })
for (let round = 0; round < 40; round++) {
  const calls = []
  for (let i = 0; i < 6; i++) {
    calls.push(tp.callTool('Lanlan', { name: 'get_weather', arguments: { city: 'Lisbon' } }))
    if (i % 2 === 0) calls.push(tp.callTool('Mochi', { name: 'get_forecast', arguments: { city: 'Oslo' } }))
    if (i % 3 === 0) calls.push(tp.callTool('Mochi', { name: 'save_note', arguments: { text: 'hi' } }))
  }
  calls.push(tp.callTool('Nova', { name: 'roll_dice', arguments: {} }))
  await Promise.all(calls)
  await sleep(100)
}
await page.select('#pg-role', 'Lanlan')
await page.select('#pg-tool', 'get_weather')
await sleep(300)
await page.type('input[name=city]', 'Lisbon')
await page.click('#pg-call')
await page.waitForSelector('#pg-result:not([hidden])')
await sleep(2500)
await page.screenshot({ path: out, type: 'png', fullPage: true })
console.log(`saved ${out} (${Math.round(statSync(out).size / 1024)} KB)`)
await browser.close()
detach()
await weather.stop()
await notes.stop()
await tp.close()
