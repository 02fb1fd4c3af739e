// The web console in a real browser: Debian's chromium driven by puppeteer-core (which never
// downloads a browser). Skipped, with the reason, when no chromium is installed.
import assert from 'node:assert/strict'
import { existsSync } from 'node:fs'
import { after, before, describe, test } from 'node:test'
import puppeteer, { type Browser, type Page } from 'puppeteer-core'
import { startCallbackServer } from '../fixtures/callback-server.js'
import { callbackServer, httpJson, startToolport, waitFor } from '../helpers.js'
import { CONSOLE_CSP } from '../../src/main/http/console.js'

/**
 * The browser: CHROMIUM_PATH when set; else Debian's chromium-headless-shell when installed (the
 * same Blink and V8 without the browser application around them, Chrome's "old headless": about
 * half the CPU of chromium's own headless mode); else chromium.
 */
const BROWSER = [
  { path: process.env.CHROMIUM_PATH, headless: true },
  { path: '/usr/lib/chromium/chromium-headless-shell', headless: 'shell' },
  { path: '/usr/bin/chromium-headless-shell', headless: 'shell' },
  { path: '/usr/bin/chromium', headless: true },
  { path: '/usr/bin/chromium-browser', headless: true },
  { path: '/usr/bin/google-chrome', headless: true }
].find(({ path }) => path !== undefined && path !== '' && existsSync(path))
const skip = BROWSER === undefined ? 'no chromium found (install it: apt-get install -y chromium, or set CHROMIUM_PATH)' : false
const TOKEN = 'console-test-token-that-is-long-enough-0123456789'

interface Watched { page: Page, errors: string[] }

describe('the console in chromium', { skip }, () => {
  let browser: Browser
  before(async () => {
    browser = await puppeteer.launch({
      executablePath: BROWSER?.path as string,
      headless: BROWSER?.headless as true | 'shell',
      // The test runs as root in CI; `attacker.example` resolves to loopback for the Host test.
      // The rest spare processes and services the pages do not use (one renderer for every page,
      // no zygote, no extensions, translation or media router): ~13 % less CPU for this file.
      args: ['--no-sandbox', '--disable-gpu', '--host-resolver-rules=MAP attacker.example 127.0.0.1',
        '--no-zygote', '--renderer-process-limit=1', '--disable-extensions', '--disable-software-rasterizer',
        '--disable-site-isolation-trials',
        '--disable-features=Translate,OptimizationGuideModelDownloading,OptimizationHintsFetching,MediaRouter,site-per-process']
    })
  })
  after(async () => { await browser?.close() })

  /** A new page that records console errors, page errors and CSP violations. */
  async function open (url: string, t: { after: (fn: () => Promise<void>) => void }): Promise<Watched> {
    const page = await browser.newPage()
    t.after(async () => { await page.close() })
    const errors: string[] = []
    page.on('console', (message) => { if (message.type() === 'error') errors.push(message.text()) })
    page.on('pageerror', (err) => { errors.push(`pageerror: ${(err as Error).message}`) })
    // Page-side code is given as text: this project's TypeScript has no DOM types.
    await page.evaluateOnNewDocument(`document.addEventListener('securitypolicyviolation', (e) => {
      console.error('CSP violation: ' + e.violatedDirective + ' ' + e.blockedURI)
    })`)
    await page.goto(url, { waitUntil: 'load' })
    return { page, errors }
  }

  test('it loads with no console errors and no CSP violations, and lists the roles and tools', async (t) => {
    const { tp, url } = await startToolport(t, { roles: ['Lanlan', 'Mochi'] })
    await tp.register({
      name: 'get_weather',
      callback_url: 'http://127.0.0.1:9333/get_weather',
      source: 'plugin:weather',
      role: 'Mochi'
    })
    const res = await fetch(`${url}/`)
    assert.equal(res.headers.get('content-security-policy'), CONSOLE_CSP)
    assert.match(CONSOLE_CSP, /script-src 'self'/)
    const { page, errors } = await open(`${url}/`, t)
    await page.waitForSelector('[data-role="Mochi"] [data-tool="get_weather"]', { timeout: 5000 })
    await page.waitForSelector('#live[data-state="live"]', { timeout: 5000 })
    const roles = await page.evaluate('[...document.querySelectorAll("[data-role]")].map((e) => e.dataset.role)')
    assert.deepEqual(roles, ['Lanlan', 'Mochi'])
    // The charts drew (uPlot from its package) once the first numbers came.
    await page.waitForSelector('#chart-rate .uplot', { timeout: 5000 })
    assert.deepEqual(errors, [])
  })

  test('a tool registered over the API appears within a second, without a reload', async (t) => {
    const { url } = await startToolport(t, { roles: ['Lanlan'] })
    const { page, errors } = await open(`${url}/ui/`, t)
    await page.waitForSelector('#live[data-state="live"]', { timeout: 5000 })
    const registered = await httpJson(`${url}/api/tools/register`, 'POST', {
      name: 'fresh_tool',
      callback_url: 'http://127.0.0.1:9333/fresh'
    })
    assert.equal(registered.statusCode, 200)
    await page.waitForSelector('[data-role="Lanlan"] [data-tool="fresh_tool"]', { timeout: 1000 })
    assert.deepEqual(errors, [])
  })

  test('a playground call shows the plugin\'s output', async (t) => {
    const callback = await callbackServer(t)
    const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
    await tp.register({
      name: 'echo',
      callback_url: `${callback.url}/echo`,
      source: 'plugin:echo',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string' }, days: { type: 'integer' } },
        required: ['city']
      }
    })
    const { page, errors } = await open(`${url}/`, t)
    await page.waitForSelector('#pg-form input[name="city"]', { timeout: 5000 })
    await page.type('#pg-form input[name="city"]', 'Lisbon')
    await page.type('#pg-form input[name="days"]', '3')
    const raw = JSON.parse(await page.evaluate('document.getElementById("pg-raw").value') as string)
    assert.deepEqual(raw, { city: 'Lisbon', days: 3 }, 'the form fills the raw JSON editor')
    await page.click('#pg-call')
    await page.waitForSelector('#pg-result:not([hidden])', { timeout: 5000 })
    const output = await page.$eval('#pg-output', (el) => el.textContent)
    const body = JSON.parse(output ?? 'null')
    assert.deepEqual(body.arguments, { city: 'Lisbon', days: 3 }, 'the echo plugin\'s output')
    assert.equal(body.name, 'echo')
    assert.match(await page.$eval('#pg-timing', (el) => el.textContent ?? ''), /ms round trip/)
    // The call also arrives in the live table, as metadata.
    await page.waitForFunction('document.querySelector("#calls tr td.mono")?.textContent === "echo"', { timeout: 2000 })
    assert.deepEqual(errors, [])
  })

  test('the playground\'s form follows a tool registered again with another schema and description', async (t) => {
    const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
    const register = async (description: string, properties: Record<string, unknown>): Promise<void> => {
      const result = await tp.register({
        name: 'weather',
        description,
        callback_url: 'http://127.0.0.1:9333/weather',
        parameters: { type: 'object', properties }
      })
      assert.equal(result.ok, true)
    }
    await register('by city', { city: { type: 'string' } })
    const { page, errors } = await open(`${url}/`, t)
    await page.waitForSelector('#pg-form input[name="city"]', { timeout: 5000 })
    assert.equal(await page.$eval('#pg-description', (el) => el.textContent), 'by city')
    await register('by coordinates', { lat: { type: 'number' }, lon: { type: 'number' } })
    await page.waitForSelector('#pg-form input[name="lat"]', { timeout: 5000 })
    assert.equal(await page.$('#pg-form input[name="city"]'), null, 'the old field is gone')
    assert.equal(await page.$eval('#pg-description', (el) => el.textContent), 'by coordinates')
    // An unrelated registry change keeps what was typed.
    await page.type('#pg-form input[name="lat"]', '38.7')
    await tp.register({ name: 'other', callback_url: 'http://127.0.0.1:9333/other' })
    await page.waitForSelector('#pg-tool option[value="other"]', { timeout: 5000 })
    await new Promise((resolve) => setTimeout(resolve, 300))
    assert.equal(await page.$eval('#pg-form input[name="lat"]', (el) => (el as unknown as { value: string }).value), '38.7')
    assert.deepEqual(errors, [])
  })

  test('calls do not make the playground read the role\'s definitions again (only registry changes do): a state read after calls fetches no definitions', async (t) => {
    const callback = await callbackServer(t)
    const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
    await tp.register({ name: 'echo', callback_url: `${callback.url}/echo`, parameters: { type: 'object', properties: { a: { type: 'string' } } } })
    const { page, errors } = await open(`${url}/`, t)
    const fetched = { definitions: 0, state: 0 }
    let lastRequestAt = Date.now()
    page.on('requestfinished', (request) => {
      lastRequestAt = Date.now()
      const path = new URL(request.url()).pathname
      if (path === '/api/tools/definitions') fetched.definitions++
      if (path === '/api/console/state') fetched.state++
    })
    await page.waitForSelector('#pg-form input[name="a"]', { timeout: 5000 })
    await page.waitForSelector('#live[data-state="live"]', { timeout: 5000 })
    // The stream's `hello` reads the whole view again, the shown tool's definition with it: wait
    // until the page is quiet (no request for 1.5 s) before counting.
    await waitFor('the page to settle', () => Date.now() - lastRequestAt > 1500, 15_000)
    const before = { ...fetched }
    for (let i = 0; i < 5; i++) assert.equal((await tp.callTool('Lanlan', { name: 'echo', arguments: { a: String(i) } })).is_error, false)
    // The calls' state read (once a second at most) has come and gone.
    await waitFor('a state read after the calls', () => fetched.state > before.state, 10_000)
    await new Promise((resolve) => setTimeout(resolve, 300))
    assert.equal(fetched.definitions, before.definitions, 'definitions read again after calls')
    // A registry change does read them again: the tool's new schema shows.
    await tp.register({ name: 'echo', callback_url: `${callback.url}/echo`, parameters: { type: 'object', properties: { b: { type: 'string' } } } })
    await page.waitForSelector('#pg-form input[name="b"]', { timeout: 5000 })
    assert.ok(fetched.definitions > before.definitions)
    assert.deepEqual(errors, [])
  })

  test('the playground\'s Call button stays disabled while its call runs, also across a registry change, so no older answer can replace a newer one', async (t) => {
    const callback = await callbackServer(t)
    const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
    await tp.register({ name: 'slow', callback_url: `${callback.url}/sleep/1500` })
    const { page, errors } = await open(`${url}/`, t)
    await page.waitForSelector('#pg-tool option[value="slow"]', { timeout: 5000 })
    await page.click('#pg-call')
    await page.waitForSelector('#pg-call:disabled', { timeout: 2000 })
    await tp.register({ name: 'other', callback_url: `${callback.url}/echo` })
    await page.waitForSelector('#pg-tool option[value="other"]', { timeout: 5000 })
    assert.equal(await page.$eval('#pg-result', (el) => (el as unknown as { hidden: boolean }).hidden), true, 'not answered yet')
    assert.notEqual(await page.$('#pg-call:disabled'), null, 'the registry change re-enabled Call during the call')
    await page.waitForSelector('#pg-result:not([hidden])', { timeout: 10_000 })
    await page.waitForSelector('#pg-call:not(:disabled)', { timeout: 2000 })
    assert.deepEqual(errors, [])
  })

  test('a name with bidi controls reads as it is: a right-to-left override shows as its code point instead of reversing the text (a tool "a\\u202etxt.exe" never displays as "aexe.txt")', async (t) => {
    const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
    await tp.register({ name: 'a\u202etxt.exe', callback_url: 'http://127.0.0.1:9333/spoof' })
    const { page, errors } = await open(`${url}/`, t)
    await page.waitForSelector('#pg-tool option', { timeout: 5000 })
    const shown = await page.$eval('#pg-tool option', (el) => el.textContent ?? '')
    assert.equal(shown, 'a⟨U+202E⟩txt.exe')
    // The option still names the tool itself.
    assert.equal(await page.$eval('#pg-tool option', (el) => (el as unknown as { value: string }).value), 'a\u202etxt.exe')
    const cells = await page.evaluate('[...document.querySelectorAll("td")].map((td) => td.textContent).filter((s) => s.includes("txt.exe"))') as string[]
    assert.ok(cells.length > 0 && cells.every((s) => !s.includes('\u202e')), JSON.stringify(cells))
    assert.deepEqual(errors, [])
  })

  test('typing in the playground\'s form keeps the keys of the raw JSON editor the form has no field for; another tool\'s form starts it afresh', async (t) => {
    const callback = await callbackServer(t)
    const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
    await tp.register({ name: 'echo', callback_url: `${callback.url}/echo`, parameters: { type: 'object', properties: { city: { type: 'string' } } } })
    const { page, errors } = await open(`${url}/`, t)
    await page.waitForSelector('#pg-form input[name="city"]', { timeout: 5000 })
    await page.$eval('#pg-raw', (el) => {
      const raw = el as unknown as { value: string, dispatchEvent: (e: unknown) => boolean }
      raw.value = '{"extra":{"deep":true},"n":"7"}'
    })
    await page.evaluate('document.getElementById("pg-raw").dispatchEvent(new Event("input"))')
    await page.type('#pg-form input[name="city"]', 'Oslo')
    const raw = JSON.parse(await page.evaluate('document.getElementById("pg-raw").value') as string)
    assert.deepEqual(raw, { extra: { deep: true }, n: '7', city: 'Oslo' })
    await tp.register({ name: 'other', callback_url: `${callback.url}/echo`, parameters: { type: 'object', properties: { b: { type: 'string' } } } })
    await page.waitForSelector('#pg-tool option[value="other"]', { timeout: 5000 })
    await page.select('#pg-tool', 'other')
    await page.waitForSelector('#pg-form input[name="b"]', { timeout: 5000 })
    assert.deepEqual(JSON.parse(await page.evaluate('document.getElementById("pg-raw").value') as string), {})
    assert.deepEqual(errors, [])
  })

  test('the chart picker tells apart role/tool series that spell alike (role "a" with tool "b/c", role "a/b" with tool "c")', async (t) => {
    const callback = await callbackServer(t)
    const { tp, url } = await startToolport(t, { roles: ['a', 'a/b'] })
    assert.equal((await tp.register({ name: 'b/c', role: 'a', callback_url: `${callback.url}/echo` })).ok, true)
    assert.equal((await tp.register({ name: 'c', role: 'a/b', callback_url: `${callback.url}/echo` })).ok, true)
    assert.equal((await tp.callTool('a', { name: 'b/c', arguments: {} })).is_error, false)
    assert.equal((await tp.callTool('a/b', { name: 'c', arguments: {} })).is_error, false)
    const { page, errors } = await open(`${url}/`, t)
    await page.waitForFunction('document.querySelectorAll("#series-select option").length === 3', { timeout: 5000 })
    const options = await page.evaluate('[...document.querySelectorAll("#series-select option")].map((o) => [o.value, o.textContent])') as Array<[string, string]>
    assert.deepEqual(options.map(([, label]) => label), ['all calls', 'a/b/c', 'a/b/c'])
    const values = options.map(([value]) => value)
    assert.equal(new Set(values).size, 3, `distinct values: ${JSON.stringify(values)}`)
    assert.deepEqual(values.slice(1).map((v) => JSON.parse(v)).sort(), [['a', 'b/c'], ['a/b', 'c']])
    assert.deepEqual(errors, [])
  })

  test('R13: a plugin killed and called three times shows as evicted', async (t) => {
    const callback = await startCallbackServer()
    const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
    await tp.register({ name: 'doomed', callback_url: `${callback.url}/echo`, source: 'plugin:doomed' })
    const { page, errors } = await open(`${url}/`, t)
    await page.waitForSelector(`#origins tr[data-origin="${callback.origin}"]`, { timeout: 5000 })
    await callback.close()
    for (let i = 0; i < 3; i++) {
      const reply = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'Lanlan', name: 'doomed', arguments: {} })
      assert.equal(reply.body.is_error, true)
    }
    await page.waitForSelector(`.eviction[data-origin="${callback.origin}"]`, { timeout: 2000 })
    const text = await page.$eval(`.eviction[data-origin="${callback.origin}"]`, (el) => el.textContent ?? '')
    assert.match(text, /doomed/)
    await page.waitForFunction('document.querySelector(\'[data-tool="doomed"]\') === null', { timeout: 2000 })
    assert.deepEqual(errors.filter((e) => !e.includes('Failed to load resource')), [])
  })

  test('token mode asks for the token once, keeps it for the tab and uses it', async (t) => {
    const { tp, url } = await startToolport(t, { roles: ['Lanlan'], security: { token: TOKEN } })
    await tp.register({ name: 'guarded', callback_url: 'http://127.0.0.1:9333/guarded' })
    const { page, errors } = await open(`${url}/`, t)
    await page.waitForSelector('#token-dialog[open]', { timeout: 5000 })
    await page.type('#token-input', TOKEN)
    await page.click('#token-submit')
    await page.waitForSelector('[data-tool="guarded"]', { timeout: 5000 })
    await page.waitForSelector('#live[data-state="live"]', { timeout: 5000 })
    assert.equal(await page.evaluate('sessionStorage.getItem("toolport.token")'), TOKEN)
    // Only the first, token-less API requests were refused.
    assert.ok(errors.every((e) => e.includes('401')), errors.join('\n'))

    await page.reload({ waitUntil: 'load' })
    await page.waitForSelector('[data-tool="guarded"]', { timeout: 5000 })
    assert.equal(await page.$('#token-dialog[open]'), null, 'not asked again in the same tab')
  })

  test('token mode: the token dialog cannot be dismissed (Escape opens it again), and text no header can carry is refused there, never stored to break the tab', async (t) => {
    const { tp, url } = await startToolport(t, { roles: ['Lanlan'], security: { token: TOKEN } })
    await tp.register({ name: 'guarded', callback_url: 'http://127.0.0.1:9333/guarded' })
    const { page } = await open(`${url}/`, t)
    await page.waitForSelector('#token-dialog[open]', { timeout: 5000 })
    await page.keyboard.press('Escape')
    await page.waitForSelector('#token-dialog[open]', { timeout: 5000 })
    // A pasted token ending in a typographic quote: a header cannot carry it.
    await page.type('#token-input', `${TOKEN}\u201d`)
    await page.click('#token-submit')
    await page.waitForFunction('document.getElementById("token-error").textContent.includes("visible ASCII")', { timeout: 5000 })
    assert.notEqual(await page.$('#token-dialog[open]'), null, 'still asking')
    assert.equal(await page.evaluate('sessionStorage.getItem("toolport.token")'), null)
    await page.$eval('#token-input', (el) => { (el as unknown as { value: string }).value = '' })
    await page.type('#token-input', TOKEN)
    await page.click('#token-submit')
    await page.waitForSelector('[data-tool="guarded"]', { timeout: 5000 })
    await page.waitForSelector('#live[data-state="live"]', { timeout: 5000 })
    // A bad token stored by an older page is dropped on load: the dialog asks again.
    await page.evaluate('sessionStorage.setItem("toolport.token", "bad\u201d")')
    await page.reload({ waitUntil: 'load' })
    await page.waitForSelector('#token-dialog[open]', { timeout: 5000 })
  })

  test('a page opened through a foreign Host name is refused', async (t) => {
    const { port } = await startToolport(t, { roles: ['Lanlan'] })
    const page = await browser.newPage()
    t.after(async () => { await page.close() })
    const res = await page.goto(`http://attacker.example:${port}/`, { waitUntil: 'load' })
    assert.equal(res?.status(), 403)
    const body = JSON.parse(await res.text())
    assert.equal(body.code, 'TP_ERR_HOST_FORBIDDEN')
  })
})
