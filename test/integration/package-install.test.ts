// The README's install path for MCP clients: `npm ci && npm pack` in a checkout, `npm install -g
// ./toolport-*.tgz`, then the `toolport` command. The test copies the checkout as a fresh clone
// has it (sources, build config and scripts, no dist/: it is gitignored) with the checkout's
// node_modules, packs it (package.json's `prepack` builds it), installs the tarball into a
// temporary global prefix (--prefer-offline: the dependency tarballs are in npm's cache after
// `npm ci`), starts the installed `toolport serve`, and connects the official MCP SDK client to
// the installed `toolport mcp` bridge exactly as the README's Claude Desktop config launches it.
// The checkout's own dist/ is never read or written.
import { after, test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { access, cp, mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { dirname, join, resolve, sep } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { httpJson } from '../helpers.js'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const STEP_TIMEOUT_MS = 180_000

/**
 * What a checkout has that packing reads besides package.json's `files`: the build's inputs, and
 * the files npm always packs (README, LICENSE).
 */
const CHECKOUT_INPUTS = ['package.json', 'package-lock.json', 'tsconfig.json', 'tsconfig.build.json', 'src', 'scripts',
  'README.md', 'LICENSE']

function run (file: string, args: string[], cwd: string): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { cwd, timeout: STEP_TIMEOUT_MS, maxBuffer: 16 * 1024 * 1024 }, (err, stdout, stderr) => {
      if (err !== null) reject(new Error(`${file} ${args.join(' ')} failed: ${err.message}\n${stdout}\n${stderr}`))
      else resolve(stdout)
    })
  })
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

interface Installed {
  /** A directory of the test's own (removed after the file's tests). */
  work: string
  /** The `toolport` command the global install made. */
  bin: string
  /** The installed package's directory. */
  dir: string
}

let installing: Promise<Installed> | undefined
let workDir: string | undefined
after(async () => { if (workDir !== undefined) await rm(workDir, { recursive: true, force: true }) })

/** Packs an unbuilt copy of the checkout and installs the tarball globally, once for the file's tests. */
function installedPackage (): Promise<Installed> {
  installing ??= (async () => {
    const work = await mkdtemp(join(tmpdir(), 'toolport-pack-'))
    workDir = work
    const checkout = join(work, 'checkout')
    const prefix = join(work, 'prefix')
    await mkdir(checkout)
    await mkdir(prefix)
    const { files } = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { files: string[] }
    for (const entry of new Set([...CHECKOUT_INPUTS, ...files.filter((f) => f !== 'dist')])) {
      await cp(join(ROOT, entry), join(checkout, entry), { recursive: true })
    }
    await symlink(join(ROOT, 'node_modules'), join(checkout, 'node_modules'), 'dir')
    await run('npm', ['pack', '--silent', '--pack-destination', work], checkout)
    const tarball = (await readdir(work)).find((f) => /^toolport-.*\.tgz$/.test(f))
    assert.ok(tarball !== undefined, 'npm pack wrote toolport-<version>.tgz')
    // --engine-strict: no package of the tree may need a newer Node than package.json's engines
    // allow (README: Node.js ≥ 20.18.1) on the Node running the tests.
    await run('npm', ['install', '-g', '--prefix', prefix, '--prefer-offline', '--engine-strict', '--no-audit', '--no-fund',
      join(work, tarball)], work)
    return { work, bin: join(prefix, 'bin', 'toolport'), dir: join(prefix, 'lib', 'node_modules', 'toolport') }
  })()
  return installing
}

test('the packed tarball of a never-built checkout (npm pack builds it first) installs globally and its toolport bin serves, and bridges MCP as the README says', { timeout: 4 * STEP_TIMEOUT_MS }, async (t) => {
  const { work, bin } = await installedPackage()
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

/** Folders of the repository the README links to that are no part of the npm package. */
const REPOSITORY_ONLY = ['bench/', 'examples/', 'python/']

test('the installed package holds what its README links to (docs/, SECURITY.md, LICENSE: package.json says MIT), and the sources its source maps name', { timeout: 4 * STEP_TIMEOUT_MS }, async () => {
  const { dir } = await installedPackage()
  const manifest = JSON.parse(await readFile(join(dir, 'package.json'), 'utf8')) as { license: string }
  assert.equal(manifest.license, 'MIT')
  assert.match(await readFile(join(dir, 'LICENSE'), 'utf8'), /^MIT License\n\nCopyright \(c\) \d{4} Toolport contributors\n/)

  const readme = await readFile(join(dir, 'README.md'), 'utf8')
  const targets = new Set([...readme.matchAll(/\]\(([^)#\s]+)(?:#[^)]*)?\)/g)].map((m) => m[1] as string)
    .filter((target) => !/^[a-z]+:/i.test(target)))
  assert.ok(targets.has('SECURITY.md') && targets.has('docs/protocol.md'), [...targets].join(' '))
  for (const target of targets) {
    if (REPOSITORY_ONLY.some((folder) => target.startsWith(folder) || `${target}/` === folder)) continue
    await access(join(dir, target)).catch(() => { assert.fail(`the README links to ${target}, which the package lacks`) })
  }

  // tsc's maps (and declaration maps: an editor's "go to definition") name src/*.ts; the bundles'
  // name those too, and their dependencies' files, which npm installs (not checked here).
  let named = 0
  for (const entry of await readdir(join(dir, 'dist'), { recursive: true, withFileTypes: true })) {
    if (!entry.isFile() || !entry.name.endsWith('.map')) continue
    const map = join(entry.parentPath, entry.name)
    const { sources, sourceRoot } = JSON.parse(await readFile(map, 'utf8')) as { sources: string[], sourceRoot?: string }
    for (const source of sources) {
      if (source.split('/').includes('node_modules')) continue
      const file = resolve(dirname(map), sourceRoot ?? '', source)
      assert.ok(file.startsWith(join(dir, 'src') + sep), `${map} names ${source}, outside the package's src/`)
      await access(file).catch(() => { assert.fail(`${map} names ${source}, which the package lacks`) })
      named++
    }
  }
  assert.ok(named > 0, 'the package has source maps')
})

/** A TypeScript program that embeds Toolport and writes a plugin, as the README shows. */
const CONSUMER = `import { createRealtimeSession, createToolport, isToolportError, type ToolportOptions } from 'toolport'
import { createPlugin } from 'toolport/plugin'

// Optional settings read from somewhere, maybe absent: every option type takes \`undefined\`
// (exactOptionalPropertyTypes).
const maybe = <T>(value: T): T | undefined => (process.env.TOOLPORT_NONE === undefined ? undefined : value)
const options: ToolportOptions = { roles: ['Lanlan'], port: maybe(0) }
const tp = await createToolport(options)
try {
  await tp.listen({ host: maybe('127.0.0.1'), port: maybe(0) })
} catch (err) {
  if (isToolportError(err)) console.log(err.code, err.statusCode)
}
await tp.roles.get('Lanlan').registerLocalTool({
  name: 'now', description: maybe('Now'), source: maybe('host'), timeoutSeconds: maybe(5), handler: () => Date.now()
})
createRealtimeSession({
  toolport: tp, role: 'Lanlan', send: () => {}, attach: false, ackTimeoutMs: maybe(1000), autoRespond: maybe(true),
  dialect: maybe('flat'), rateLimit: maybe(false), sessionFields: maybe({}), id: maybe('rt')
}).close()
await tp.close()
export const plugin: unknown = createPlugin
`

test('the installed package\'s types check in a TypeScript program under moduleResolution node16 and bundler, with skipLibCheck off and exactOptionalPropertyTypes on, as an embedder may have them (README "Embedding: the library")', { timeout: 4 * STEP_TIMEOUT_MS }, async () => {
  const { work, dir } = await installedPackage()
  const consumer = join(work, 'consumer')
  await mkdir(join(consumer, 'node_modules'), { recursive: true })
  await symlink(dir, join(consumer, 'node_modules', 'toolport'), 'dir')
  await writeFile(join(consumer, 'package.json'), JSON.stringify({ name: 'consumer', private: true, type: 'module' }))
  await writeFile(join(consumer, 'main.ts'), CONSUMER)
  const tsc = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc')
  for (const [module, moduleResolution] of [['node16', 'node16'], ['esnext', 'bundler']] as const) {
    // Every error is a line of tsc's output; its exit code says whether there was one.
    await run(process.execPath, [tsc, '--noEmit', '--strict', '--exactOptionalPropertyTypes', '--skipLibCheck', 'false',
      '--target', 'es2022',
      '--module', module, '--moduleResolution', moduleResolution, '--types', 'node',
      '--typeRoots', join(ROOT, 'node_modules', '@types'), 'main.ts'], consumer)
  }
})
