// The README's install path for MCP clients: `npm pack`, `npm install -g ./toolport-*.tgz`, then
// the `toolport` command. The test builds the current sources, packs them, installs the tarball
// into a temporary global prefix (--prefer-offline: the dependency tarballs are in npm's cache after `npm ci`),
// starts the installed `toolport serve`, and connects the official MCP SDK client to the
// installed `toolport mcp` bridge exactly as the README's Claude Desktop config launches it.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { cp, copyFile, mkdir, mkdtemp, readdir, readFile, rm, stat } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { httpJson } from '../helpers.js'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const STEP_TIMEOUT_MS = 180_000

function run (file: string, args: string[], cwd: string): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { cwd, timeout: STEP_TIMEOUT_MS, maxBuffer: 16 * 1024 * 1024 }, (err, stdout, stderr) => {
      if (err !== null) reject(new Error(`${file} ${args.join(' ')} failed: ${err.message}\n${stdout}\n${stderr}`))
      else resolve(stdout)
    })
  })
}

/** The newest modification time of any file under `dir` (0 when it does not exist). */
async function newestMtime (dir: string): Promise<number> {
  let newest = 0
  let entries
  try {
    entries = await readdir(dir, { withFileTypes: true, recursive: true })
  } catch {
    return 0
  }
  for (const entry of entries) {
    if (entry.isFile()) newest = Math.max(newest, (await stat(join(entry.parentPath, entry.name))).mtimeMs)
  }
  return newest
}

/** Resolves with the URL `toolport serve` prints once it listens. */
async function listeningUrl (child: ChildProcess): Promise<string> {
  let out = ''
  const stdout = child.stdout
  assert.ok(stdout !== null)
  for await (const chunk of stdout) {
    out += String(chunk)
    const match = /Toolport listening on (http:\/\/\S+)/.exec(out)
    if (match !== null) return match[1] as string
  }
  throw new Error(`toolport serve exited before listening:\n${out}`)
}

test('the packed tarball installs globally and its toolport bin serves, and bridges MCP as the README says', { timeout: 4 * STEP_TIMEOUT_MS }, async (t) => {
  const work = await mkdtemp(join(tmpdir(), 'toolport-pack-'))
  t.after(() => rm(work, { recursive: true, force: true }))
  const pkg = join(work, 'pkg')
  const prefix = join(work, 'prefix')
  await mkdir(pkg)
  await mkdir(prefix)

  // A package directory of its own with the sources as they are now: the checkout's dist when
  // `npm run build` made it after the last source change (CI), else a fresh build (the
  // checkout's dist is never written). Then pack and install it the README's way.
  const dist = join(ROOT, 'dist')
  if (await newestMtime(dist) > await newestMtime(join(ROOT, 'src'))) {
    await cp(dist, join(pkg, 'dist'), { recursive: true })
  } else {
    await run(process.execPath, [join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', join(ROOT, 'tsconfig.build.json'),
      '--outDir', join(pkg, 'dist')], ROOT)
  }
  for (const file of ['package.json', 'README.md']) await copyFile(join(ROOT, file), join(pkg, file))
  // The rest of what package.json's `files` ships (the console's static files).
  const { files } = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { files: string[] }
  for (const entry of files) if (entry !== 'dist') await cp(join(ROOT, entry), join(pkg, entry), { recursive: true })
  await run('npm', ['pack', '--silent', '--pack-destination', work], pkg)
  const tarball = (await readdir(work)).find((f) => /^toolport-.*\.tgz$/.test(f))
  assert.ok(tarball !== undefined, 'npm pack wrote toolport-<version>.tgz')
  await run('npm', ['install', '-g', '--prefix', prefix, '--prefer-offline', '--no-audit', '--no-fund', join(work,
    tarball)], work)
  const bin = join(prefix, 'bin', 'toolport')

  const help = await run(bin, ['--help'], work)
  assert.match(help, /toolport <command>/)

  const server = spawn(bin, ['serve', '--port', '0', '--role', 'Lanlan', '--inline', '--log-level', 'warn'],
    { cwd: work, stdio: ['ignore', 'pipe', 'pipe'] })
  t.after(async () => {
    if (server.exitCode === null) {
      server.kill('SIGTERM')
      await once(server, 'exit')
    }
  })
  const url = await listeningUrl(server)
  const health = await httpJson(`${url}/api/health`, 'GET')
  assert.equal(health.statusCode, 200)
  assert.equal(health.body.ok, true)
  // The web console ships in the package and is served from it.
  const page = await fetch(`${url}/`)
  assert.equal(page.status, 200)
  assert.match(await page.text(), /<html/i)
  const registered = await httpJson(`${url}/api/tools/register`, 'POST',
    { name: 'get_weather', description: 'Weather now', callback_url: 'http://127.0.0.1:9/tools/get_weather' })
  assert.equal(registered.statusCode, 200)

  // The README's stdio config: { "command": "toolport", "args": ["mcp", "--role", …, "--url", …] }.
  const client = new Client({ name: 'package-install-test', version: '1.0.0' })
  await client.connect(new StdioClientTransport({
    command: bin,
    args: ['mcp', '--role', 'Lanlan', '--url', url],
    stderr: 'pipe'
  }))
  t.after(() => client.close())
  const listed = await client.listTools()
  assert.deepEqual(listed.tools.map((tool) => tool.name), ['get_weather'])
})
