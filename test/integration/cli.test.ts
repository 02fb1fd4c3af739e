// The `toolport` command driven over real HTTP on 127.0.0.1: a real child process for the smoke
// tests (the program entry, its signals and exit codes), `main(argv, io)` in-process for the flags.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { EventEmitter, once } from 'node:events'
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { PassThrough } from 'node:stream'
import { fileURLToPath } from 'node:url'
import { main } from '../../src/main/cli.js'
import { httpJson, tool, toolportCliArgs } from '../helpers.js'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const URL_LINE = /(http:\/\/127\.0\.0\.1:(\d+))/
const SLOW = { timeout: 60_000 }

interface Exit { code: number | null, signal: NodeJS.Signals | null }

interface Cli {
  /** Stops the command as SIGTERM/SIGINT would. */
  stop: (signal: NodeJS.Signals) => void
  exited: Promise<Exit>
  /** Every stdout line so far; `lines` emits `line` for each new one. */
  stdout: string[]
  lines: EventEmitter
  stderr: () => string
}

/** Environment without any TOOLPORT_* variable of the machine running the tests. */
function cleanEnv (extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {}
  for (const [key, value] of Object.entries(process.env)) if (!key.startsWith('TOOLPORT_')) env[key] = value
  return { ...env, ...extra }
}

/** Spawns `toolport <args>` (see toolportCliArgs); killed in t.after if still running. */
function runCli (t: TestContext, args: string[], env: Record<string, string> = {}): Cli {
  const child = spawn(process.execPath, [...toolportCliArgs(), ...args], {
    cwd: ROOT,
    env: cleanEnv(env),
    stdio: ['ignore', 'pipe', 'pipe']
  })
  const exited = once(child, 'exit').then(([code, signal]) => ({ code, signal }) as Exit)
  t.after(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL')
      await exited
    }
  })
  const stdout: string[] = []
  const lines = new EventEmitter()
  createInterface({ input: child.stdout as NodeJS.ReadableStream }).on('line', (line) => {
    stdout.push(line)
    lines.emit('line', line)
  })
  let stderr = ''
  child.stderr?.setEncoding('utf8')
  child.stderr?.on('data', (chunk: string) => { stderr += chunk })
  return { stop: (signal) => child.kill(signal), exited, stdout, lines, stderr: () => stderr }
}

/**
 * Runs `main(args, io)` in this process with its own streams, environment (only `env`) and stop
 * signal: the same command as the child process, without a process start per test. Stopped in
 * t.after if still running.
 */
function runMain (t: TestContext, args: string[], env: Record<string, string> = {}): Cli {
  const out = new PassThrough()
  const err = new PassThrough()
  const controller = new AbortController()
  const code = main(args, {
    stdin: new PassThrough(),
    stdout: out,
    stderr: err,
    env: { ...env },
    stop: controller.signal
  })
  const exited = code.then((exitCode) => ({ code: exitCode, signal: null }) as Exit)
  t.after(async () => {
    controller.abort('SIGTERM')
    await exited
  })
  const stdout: string[] = []
  const lines = new EventEmitter()
  createInterface({ input: out }).on('line', (line) => {
    stdout.push(line)
    lines.emit('line', line)
  })
  let stderr = ''
  err.setEncoding('utf8')
  err.on('data', (chunk: string) => { stderr += chunk })
  // The streams end with the command, so every line was seen once `exited` resolves.
  const ended = exited.then(async (exit) => {
    out.end()
    err.end()
    await Promise.all([once(out, 'end'), once(err, 'end')])
    return exit
  })
  return { stop: (signal) => controller.abort(signal), exited: ended, stdout, lines, stderr: () => stderr }
}

/** Resolves with the URL of the first stdout line that names it; rejects if the process exits first. */
async function listeningUrl (cli: Cli): Promise<string> {
  let check: (line: string) => void = () => {}
  const found = new Promise<string>((resolve) => {
    check = (line: string): void => {
      const match = URL_LINE.exec(line)
      if (match !== null) resolve(match[1] as string)
    }
    for (const line of cli.stdout) check(line)
    cli.lines.on('line', check)
  })
  const died = cli.exited.then((exit) => {
    throw new Error(`toolport exited (${JSON.stringify(exit)}) before printing its URL: ${cli.stderr()}`)
  })
  // Once the URL is found, the later exit must not become an unhandled rejection.
  died.catch(() => {})
  try {
    return await Promise.race([found, died])
  } finally {
    cli.lines.off('line', check)
  }
}

test('CLI: serve --port 0 --role A --role B prints its URL, serves the API over real HTTP, and exits 0 on SIGTERM', SLOW, async (t) => {
  const cli = runCli(t, ['serve', '--port', '0', '--role', 'A', '--role', 'B'])
  const url = await listeningUrl(cli)
  assert.notEqual(Number(URL_LINE.exec(url)?.[2]), 0)

  const listed = await httpJson(`${url}/api/tools`, 'GET')
  assert.deepEqual(listed.body, { ok: true, tools_by_role: { A: [], B: [] } })
  const registered = await httpJson(`${url}/api/tools/register`, 'POST', tool('get_weather',
    { source: 'plugin:weather' }))
  assert.deepEqual(registered.body, {
    ok: true,
    registered: 'get_weather',
    affected_roles: ['A', 'B'],
    failed_roles: []
  })
  const one = await httpJson(`${url}/api/tools?role=B`, 'GET')
  assert.deepEqual(one.body.tools_by_role.B.map((r: { name: string }) => r.name), ['get_weather'])
  const missing = await httpJson(`${url}/api/tools?role=Nobody`, 'GET')
  assert.equal(missing.statusCode, 404)
  assert.equal(missing.body.code, 'TP_ERR_ROLE_NOT_FOUND')

  cli.stop('SIGTERM')
  assert.deepEqual(await cli.exited, { code: 0, signal: null })
})

test('CLI: serve with no --role creates one role named default, names its V8 setting, and exits 0 on SIGINT', SLOW, async (t) => {
  const cli = runCli(t, ['serve', '--port', '0', '--log-level', 'silent'])
  const url = await listeningUrl(cli)
  assert.match(cli.stdout.find((line) => line.includes(url)) ?? '', /; V8: --no-allocation-site-pretenuring --heap-growing-percent=300\)$/)
  const listed = await httpJson(`${url}/api/tools`, 'GET')
  assert.deepEqual(listed.body, { ok: true, tools_by_role: { default: [] } })
  cli.stop('SIGINT')
  assert.deepEqual(await cli.exited, { code: 0, signal: null })
})

test('CLI: TOOLPORT_ROLES sets the roles, and --role wins over it', SLOW, async (t) => {
  const fromEnv = runMain(t, ['serve', '--port', '0', '--log-level', 'silent'], { TOOLPORT_ROLES: 'Lanlan, Mochi' })
  const envUrl = await listeningUrl(fromEnv)
  assert.deepEqual(Object.keys((await httpJson(`${envUrl}/api/tools`, 'GET')).body.tools_by_role), ['Lanlan', 'Mochi'])
  fromEnv.stop('SIGTERM')
  assert.equal((await fromEnv.exited).code, 0)

  const flagWins = runMain(t, ['serve', '--port', '0', '--log-level', 'silent', '--role', 'Nova'],
    { TOOLPORT_ROLES: 'Lanlan' })
  const flagUrl = await listeningUrl(flagWins)
  assert.deepEqual(Object.keys((await httpJson(`${flagUrl}/api/tools`, 'GET')).body.tools_by_role), ['Nova'])
  flagWins.stop('SIGTERM')
  assert.equal((await flagWins.exited).code, 0)
})

test('CLI: --config reads a JSON options file', SLOW, async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'toolport-cli-'))
  t.after(() => rm(dir, { recursive: true, force: true }))
  const file = join(dir, 'toolport.json')
  await writeFile(file, JSON.stringify({
    roles: ['FromFile'],
    port: 0,
    logger: 'silent',
    dispatch: { mode: 'inline' }
  }))
  const cli = runMain(t, ['serve', '--config', file])
  const url = await listeningUrl(cli)
  assert.deepEqual(Object.keys((await httpJson(`${url}/api/tools`, 'GET')).body.tools_by_role), ['FromFile'])
  cli.stop('SIGTERM')
  assert.equal((await cli.exited).code, 0)
})

test('CLI: an unknown flag prints an error and exits non-zero without serving', SLOW, async (t) => {
  const cli = runMain(t, ['serve', '--port', '0', '--bogus'])
  const exit = await cli.exited
  assert.notEqual(exit.code, 0)
  assert.equal(exit.signal, null)
  assert.notEqual(cli.stderr().trim(), '')
  assert.ok(!cli.stdout.some((line) => URL_LINE.test(line)))
})

test('CLI: a port that is not a number prints an error and exits non-zero', SLOW, async (t) => {
  const cli = runMain(t, ['serve', '--port', 'eighty'])
  const exit = await cli.exited
  assert.notEqual(exit.code, 0)
  assert.notEqual(cli.stderr().trim(), '')
})

test('CLI: an unknown command prints an error and exits non-zero', SLOW, async (t) => {
  const cli = runMain(t, ['launch'])
  const exit = await cli.exited
  assert.notEqual(exit.code, 0)
  assert.notEqual(cli.stderr().trim(), '')
})

test('CLI: a missing config file prints an error and exits non-zero', SLOW, async (t) => {
  const cli = runMain(t, ['serve', '--port', '0', '--config', join(tmpdir(), `toolport-missing-${process.pid}.json`)])
  const exit = await cli.exited
  assert.notEqual(exit.code, 0)
  assert.notEqual(cli.stderr().trim(), '')
})

test('CLI: --host with a non-loopback address and no --allow-non-loopback-bind exits non-zero without binding', SLOW, async (t) => {
  const cli = runMain(t, ['serve', '--port', '0', '--host', '0.0.0.0'])
  const exit = await cli.exited
  assert.notEqual(exit.code, 0)
  assert.notEqual(cli.stderr().trim(), '')
  assert.ok(!cli.stdout.some((line) => /listening/i.test(line)))
})

test('CLI: --help prints the usage and exits 0', SLOW, async (t) => {
  const cli = runMain(t, ['serve', '--help'])
  const exit = await cli.exited
  assert.equal(exit.code, 0)
  assert.ok(cli.stdout.some((line) => line.includes('serve')))
})

test('CLI: serve goes on serving when the reader of its stdout goes away (EPIPE); stderr says so once, and SIGTERM still exits 0', SLOW, async (t) => {
  const child = spawn(process.execPath, [...toolportCliArgs(), 'serve', '--port', '0', '--log-level', 'info'], {
    cwd: ROOT,
    env: cleanEnv(),
    stdio: ['ignore', 'pipe', 'pipe']
  })
  const exited = once(child, 'exit')
  t.after(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
  let stderr = ''
  child.stderr.setEncoding('utf8')
  child.stderr.on('data', (chunk: string) => { stderr += chunk })
  const url = await new Promise<string>((resolve) => {
    createInterface({ input: child.stdout }).on('line', (line) => {
      const match = URL_LINE.exec(line)
      if (match !== null) resolve(match[1] as string)
    })
  })
  // The reader goes away: every later write to the pipe fails with EPIPE.
  child.stdout.destroy()
  for (let i = 0; i < 5; i++) {
    const registered = await httpJson(`${url}/api/tools/register`, 'POST', tool(`t${i}`))
    assert.equal(registered.statusCode, 200)
  }
  const health = await httpJson(`${url}/api/health`, 'GET')
  assert.equal(health.statusCode, 200)
  assert.equal(child.exitCode, null, stderr)
  assert.equal(stderr.match(/stdout failed/g)?.length, 1, stderr)
  child.kill('SIGTERM')
  const [code] = await exited
  assert.equal(code, 0, stderr)
})

test('CLI: an empty --token-file or --config is a usage mistake (exit 2), not "no file": it never starts a server without the token or the config the environment names', SLOW, async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'toolport-cli-'))
  t.after(() => rm(dir, { recursive: true, force: true }))
  const tokenFile = join(dir, 'token')
  await writeFile(tokenFile, 'k'.repeat(40), { mode: 0o600 })
  for (const [flag, variable] of [['--token-file', 'TOOLPORT_TOKEN_FILE'], ['--config', 'TOOLPORT_CONFIG']] as const) {
    const cli = runMain(t, ['serve', '--port', '0', flag, ''], { [variable]: tokenFile })
    const exit = await cli.exited
    assert.equal(exit.code, 2, flag)
    assert.match(cli.stderr(), new RegExp(`^toolport: ${flag} needs a file name`, 'm'))
    assert.ok(!cli.stdout.some((line) => /listening/i.test(line)), flag)
  }
})

test('CLI: a token or config file is read only so far: a device that never ends (/dev/zero) is refused at once, and a config file that is not UTF-8 is refused (a role would be renamed)', SLOW, async (t) => {
  const zero = runMain(t, ['serve', '--port', '0', '--config', '/dev/zero'])
  assert.equal((await zero.exited).code, 2)
  assert.match(zero.stderr(), /^toolport: the config file \/dev\/zero is larger than 4194304 bytes$/m)
  // World-readable, so refused before a byte is read.
  const token = runMain(t, ['serve', '--port', '0', '--token-file', '/dev/zero'])
  assert.equal((await token.exited).code, 2)
  assert.match(token.stderr(), /the token file \/dev\/zero is readable by others/)

  const dir = await mkdtemp(join(tmpdir(), 'toolport-cli-'))
  t.after(() => rm(dir, { recursive: true, force: true }))
  const latin1 = join(dir, 'latin1.json')
  await writeFile(latin1, Buffer.from('{"port":0,"roles":["caf\xe9"]}', 'latin1'))
  const refused = runMain(t, ['serve', '--config', latin1])
  assert.equal((await refused.exited).code, 2)
  assert.match(refused.stderr(), /is not UTF-8 text/)
  const bom = join(dir, 'bom.json')
  await writeFile(bom, '\uFEFF{"port":0,"roles":["café"],"logger":"silent"}')
  const served = runMain(t, ['serve', '--config', bom])
  const url = await listeningUrl(served)
  assert.deepEqual(Object.keys((await httpJson(`${url}/api/tools`, 'GET')).body.tools_by_role), ['café'])
})

test('CLI: a config file that holds security.token must be private to its owner, as a token file must: group- or world-readable it exits 2 naming it; 0600 serves; without a token it may be 0644 (SECURITY.md "Token mode"; README "The command")', SLOW, async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'toolport-cli-'))
  t.after(() => rm(dir, { recursive: true, force: true }))
  const token = 'k'.repeat(40)
  for (const mode of [0o644, 0o640, 0o604]) {
    const file = join(dir, `token-${mode.toString(8)}.json`)
    await writeFile(file, JSON.stringify({ port: 0, logger: 'silent', security: { token } }))
    await chmod(file, mode)
    for (const [args, env] of [[['--config', file], {}], [[], { TOOLPORT_CONFIG: file }]] as Array<[string[], Record<string, string>]>) {
      const cli = runMain(t, ['serve', ...args], env)
      const served = await Promise.race([cli.exited.then(() => false), listeningUrl(cli).then(() => true, () => false)])
      assert.equal(served, false, `served with a ${mode.toString(8)} config file holding the token`)
      assert.equal((await cli.exited).code, 2, mode.toString(8))
      assert.equal(cli.stderr(), `toolport: the config file ${file} holds security.token and is readable by others ` +
        `(mode ${mode.toString(8)}); chmod 600 it, or give the token with --token-file\n`)
      assert.deepEqual(cli.stdout, [])
    }
  }
  const owner = join(dir, 'token-600.json')
  await writeFile(owner, JSON.stringify({ port: 0, logger: 'silent', security: { token } }))
  await chmod(owner, 0o600)
  const served = runMain(t, ['serve', '--config', owner])
  const url = await listeningUrl(served)
  assert.equal((await httpJson(`${url}/api/health`, 'GET')).statusCode, 401, 'token mode is on')
  const open = join(dir, 'open.json')
  await writeFile(open, JSON.stringify({ port: 0, logger: 'silent' }))
  await chmod(open, 0o644)
  await listeningUrl(runMain(t, ['serve', '--config', open]))
})

test('CLI: TOOLPORT_PORT and TOOLPORT_LOG_LEVEL that are not one are refused naming the variable; --log-level names the levels; a flag overriding a bad variable wins', SLOW, async (t) => {
  const port = runMain(t, ['serve'], { TOOLPORT_PORT: '-1' })
  assert.equal((await port.exited).code, 2)
  assert.match(port.stderr(), /TOOLPORT_PORT must be a number from 0 to 65535 \(got "-1"\)/)
  const level = runMain(t, ['serve', '--port', '0'], { TOOLPORT_LOG_LEVEL: 'loud' })
  assert.equal((await level.exited).code, 2)
  assert.match(level.stderr(), /TOOLPORT_LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent \(got "loud"\)/)
  const flag = runMain(t, ['serve', '--port', '0', '--log-level', 'false'])
  assert.equal((await flag.exited).code, 2)
  assert.match(flag.stderr(), /--log-level must be one of fatal, error, warn, info, debug, trace, silent \(got "false"\)/)
  const overridden = runMain(t, ['serve', '--port', '0', '--log-level', 'silent'], { TOOLPORT_PORT: 'abc', TOOLPORT_LOG_LEVEL: 'loud' })
  await listeningUrl(overridden)
})

test('CLI: a TOOLPORT_DISPATCH_MODE or TOOLPORT_ROLES that is not one is refused naming the variable, not an option path (README "The command": the message names the setting)', SLOW, async (t) => {
  const cases: Array<[Record<string, string>, RegExp]> = [
    [{ TOOLPORT_DISPATCH_MODE: 'Inline' }, /^toolport: .*TOOLPORT_DISPATCH_MODE must be pool or inline \(got "Inline"\)/],
    [{ TOOLPORT_ROLES: 'a,..' }, /^toolport: .*TOOLPORT_ROLES names "\.\.", which is not a role name/],
    [{ TOOLPORT_ROLES: 'a, b, a' }, /^toolport: .*TOOLPORT_ROLES names "a" more than once/]
  ]
  for (const [env, message] of cases) {
    const cli = runMain(t, ['serve', '--port', '0', '--log-level', 'silent'], env)
    assert.equal((await cli.exited).code, 2, JSON.stringify(env))
    assert.match(cli.stderr(), message)
    assert.doesNotMatch(cli.stderr(), /dispatch\.mode|roles\.\d/, 'no option path the operator never wrote')
    assert.deepEqual(cli.stdout, [])
  }
  // A flag wins over its variable, whatever the variable holds.
  const overridden = runMain(t, ['serve', '--port', '0', '--log-level', 'silent', '--inline', '--role', 'A'],
    { TOOLPORT_DISPATCH_MODE: 'Inline', TOOLPORT_ROLES: 'a,..' })
  await listeningUrl(overridden)
})

test('CLI: a --host or TOOLPORT_HOST that is no address (a port, a scheme, a space) is refused as such, naming it, even with --allow-non-loopback-bind, whose advice could not help (README "The command")', SLOW, async (t) => {
  for (const host of ['127.0.0.1:8080', 'http://127.0.0.1', ' 127.0.0.1']) {
    for (const [args, env, name] of [
      [['--host', host], {}, '--host'],
      [['--host', host, '--allow-non-loopback-bind'], {}, '--host'],
      [[], { TOOLPORT_HOST: host }, 'TOOLPORT_HOST']
    ] as Array<[string[], Record<string, string>, string]>) {
      const cli = runMain(t, ['serve', '--port', '0', '--log-level', 'silent', ...args], env)
      const described = `${JSON.stringify(args)} ${JSON.stringify(env)}`
      assert.equal((await cli.exited).code, 2, described)
      const first = cli.stderr().split('\n')[0] ?? ''
      assert.ok(first.startsWith(`toolport: ${name === '--host' ? '' : 'invalid Toolport options: '}${name} ${JSON.stringify(host)} is not an address`), `${described}: ${first}`)
      assert.doesNotMatch(first, /loopback/, described)
      assert.deepEqual(cli.stdout, [], described)
    }
  }
})

test('CLI: a non-loopback host is refused naming where it was given (--host, TOOLPORT_HOST, the config file) and the flag that allows it (README "The command")', SLOW, async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'toolport-cli-'))
  t.after(() => rm(dir, { recursive: true, force: true }))
  const file = join(dir, 'host.json')
  await writeFile(file, JSON.stringify({ host: '192.0.2.10' }))
  for (const [args, env, from] of [
    [['--host', '192.0.2.10'], {}, '--host'],
    [[], { TOOLPORT_HOST: '192.0.2.10' }, 'TOOLPORT_HOST'],
    [['--config', file], {}, `host in ${file}`]
  ] as Array<[string[], Record<string, string>, string]>) {
    const cli = runMain(t, ['serve', '--port', '0', '--log-level', 'silent', ...args], env)
    assert.equal((await cli.exited).code, 2, from)
    const first = cli.stderr().split('\n')[0] ?? ''
    assert.ok(first.includes(`refusing to bind 192.0.2.10 (${from}): not a loopback address; add --allow-non-loopback-bind`), first)
    assert.doesNotMatch(first, /security\.allowNonLoopbackBind/)
  }
})

test('CLI: bound to 0.0.0.0 or :: (--allow-non-loopback-bind), every URL in the log lines is the one the banner prints, the loopback one that answers (README "The command"; docs/protocol.md R1)', SLOW, async (t) => {
  for (const host of ['0.0.0.0', '::']) {
    const cli = runMain(t, ['serve', '--port', '0', '--host', host, '--allow-non-loopback-bind', '--log-level', 'info'])
    const banner = await new Promise<string>((resolve, reject) => {
      const check = (l: string): void => {
        const url = /^Toolport listening on (http:\/\/\S+)/.exec(l)?.[1]
        if (url !== undefined) resolve(url)
      }
      for (const l of cli.stdout) check(l)
      cli.lines.on('line', check)
      cli.exited.then(() => { reject(new Error(cli.stderr())) }, reject)
    })
    assert.equal((await httpJson(`${banner}/api/health`, 'GET')).statusCode, 200)
    cli.stop('SIGTERM')
    assert.equal((await cli.exited).code, 0)
    const messages = cli.stdout.filter((l) => l.startsWith('{')).map((l) => String((JSON.parse(l) as { msg: unknown }).msg))
    assert.ok(messages.some((m) => m.startsWith('Server listening at ')), `${host}: fastify's line is there: ${messages.join('\n')}`)
    for (const message of messages) {
      for (const [url] of message.matchAll(/https?:\/\/[^\s;,)]+/g)) assert.equal(url, banner, `${host}: ${message}`)
    }
  }
})

test('CLI: --host [::1] (bracketed, as in a URL) binds ::1 and prints a URL the server answers', SLOW, async (t) => {
  const cli = runMain(t, ['serve', '--port', '0', '--host', '[::1]', '--log-level', 'silent'])
  const line = await new Promise<string>((resolve, reject) => {
    const check = (l: string): void => { if (/listening/.test(l)) resolve(l) }
    for (const l of cli.stdout) check(l)
    cli.lines.on('line', check)
    cli.exited.then(() => { reject(new Error(cli.stderr())) }, reject)
  })
  const url = /(http:\/\/\[::1\]:\d+)/.exec(line)?.[1]
  assert.ok(url !== undefined, line)
  assert.equal((await httpJson(`${url}/api/health`, 'GET')).statusCode, 200)
})
