#!/usr/bin/env node
// The `toolport` command. The only module that reads argv, installs signal handlers or exits.
//
// `main(argv, io)` is the whole command with its process surroundings passed in (streams,
// environment, a stop signal), so tests drive it in-process; the bottom of this file binds it to
// the real process when this file is the program being run.
//
// Each command imports what it runs when it runs (`--help` loads no server, `mcp` no fastify):
// the whole server's modules cost ~0.7 s of CPU to load, which a bridge an MCP client spawns, or
// a `--help`, should not pay.
import { parseArgs, type ParseArgsConfig } from 'node:util'
import { closeSync, fstatSync, openSync, readSync, realpathSync } from 'node:fs'
import type { Readable, Writable } from 'node:stream'
import { fileURLToPath } from 'node:url'
import { ENVIRONMENT } from './environment.js'
import { ConfigError, isToolportError } from './errors.js'
import { errorText, isPlainObject, noop } from '../shared/util.js'
import { kDispatchMode } from './symbols.js'

const USAGE = `Usage: toolport <command> [options]

Commands:
  serve     run the Toolport server
  mcp       a stdio MCP server with one role's tools, bridged to a running Toolport

Options for serve:
  --host ADDRESS   address to bind (default 127.0.0.1; env TOOLPORT_HOST)
  --port N         port to bind, 0 for any free port (default 3917; env TOOLPORT_PORT)
  --role NAME      a role to create; repeat for more (default: one role named "default";
                   env TOOLPORT_ROLES, comma-separated)
  --config FILE    a JSON file of options (env TOOLPORT_CONFIG); flags win over it; one that
                   holds security.token must not be readable by group or others (chmod 600)
  --inline         dispatch callbacks on the main thread instead of the worker pool
                   (env TOOLPORT_DISPATCH_MODE=inline)
  --log-level L    fatal|error|warn|info|debug|trace|silent (default info; env TOOLPORT_LOG_LEVEL)
  --allow-non-loopback-bind   allow --host to be a non-loopback address (clients must still be loopback)
  --token-file FILE  token mode: every request needs "Authorization: Bearer <token>"; FILE holds the
                   token (>= 32 bytes of visible ASCII) and must not be readable by group or
                   others (chmod 600) (env TOOLPORT_TOKEN_FILE)
  -h, --help       show this help

Options for mcp:
  --role NAME      the role whose tools the MCP client gets (required)
  --url URL        the running Toolport (default http://127.0.0.1:3917; env TOOLPORT_URL)
  --token-file FILE  the token, when that Toolport runs in token mode (env TOOLPORT_TOKEN_FILE)

Environment: ${Object.keys(ENVIRONMENT).join(', ')}
`

/** A mistake in how the command was called: printed with the usage text. */
class UsageError extends Error {}
/** A problem with a file the command was pointed at: printed alone. */
class InputError extends Error {}

/** What the command reads and writes besides its arguments: the process's, or a test's. */
export interface CliIo {
  stdin: Readable
  /** `isTTY` picks human-readable log lines over JSON lines. */
  stdout: Writable & { isTTY?: boolean }
  stderr: Writable
  env: NodeJS.ProcessEnv
  /** Aborted when the command is asked to stop (SIGINT, SIGTERM); its `reason` names the signal. */
  stop: AbortSignal
}

/**
 * Runs `toolport <argv>` and resolves with the exit code; never rejects (a failure is a message on
 * `io.stderr` and a non-zero code: 2 for a usage or input mistake, a bad setting included however
 * it was given (flag, variable or config file: TP_ERR_CONFIG), 1 otherwise).
 *
 * @example
 * const code = await main(['serve', '--port', '0'], { stdin, stdout, stderr, env: {}, stop: controller.signal })
 */
export async function main (argv: string[], io: CliIo): Promise<number> {
  try {
    return await run(argv, io)
  } catch (err) {
    return report(err, io)
  }
}

async function run (argv: string[], io: CliIo): Promise<number> {
  const [command, ...rest] = argv
  // No command is a usage mistake like an unknown one: the usage goes to stderr with the reason.
  if (command === undefined) throw new UsageError('a command is needed (serve or mcp)')
  if (command === '-h' || command === '--help' || command === 'help') {
    io.stdout.write(USAGE)
    return 0
  }
  if (command === 'mcp') return await mcp(rest, io)
  if (command !== 'serve') throw new UsageError(`unknown command '${command}'`)
  return await serve(rest, io)
}

function report (err: unknown, io: CliIo): number {
  if (err instanceof UsageError) {
    io.stderr.write(`toolport: ${err.message}\n\n${USAGE}`)
    return 2
  }
  if (err instanceof InputError) {
    io.stderr.write(`toolport: ${err.message}\n`)
    return 2
  }
  if (isToolportError(err)) {
    io.stderr.write(`toolport: ${err.message} (${err.code})\n`)
    // Every TP_ERR_CONFIG here comes from the settings: an input mistake, as `--port abc` is.
    return err.code === 'TP_ERR_CONFIG' ? 2 : 1
  }
  io.stderr.write(`toolport: ${errorText(err)}\n`)
  return 1
}

/** Resolves with the stop signal's reason once `signal` is aborted. */
function stopped (signal: AbortSignal): Promise<unknown> {
  if (signal.aborted) return Promise.resolve(signal.reason)
  return new Promise((resolve) => {
    signal.addEventListener('abort', () => { resolve(signal.reason) }, { once: true })
  })
}

/** `toolport mcp`: stdout carries the MCP protocol, so every message goes to stderr. */
async function mcp (args: string[], io: CliIo): Promise<number> {
  const flags = parseFlags(args, {
    role: { type: 'string' },
    url: { type: 'string' },
    'token-file': { type: 'string' },
    help: { type: 'boolean', short: 'h' }
  })
  if (flags.help === true) {
    io.stderr.write(USAGE)
    return 0
  }
  if (flags.role === undefined || flags.role === '') throw new UsageError('mcp needs --role NAME')
  const envUrl = io.env.TOOLPORT_URL
  const fromEnv = flags.url === undefined && envUrl !== undefined && envUrl !== ''
  const url = flags.url ?? (fromEnv ? envUrl : 'http://127.0.0.1:3917')
  const tokenFile = fileFlag(flags['token-file'], '--token-file') ?? io.env.TOOLPORT_TOKEN_FILE
  const headers: Record<string, string> = {}
  if (tokenFile !== undefined && tokenFile !== '') headers.authorization = `Bearer ${await readTokenFile(tokenFile)}`
  const { BridgeSettingError, startBridge } = await import('./cli-bridge.js')
  let bridge
  try {
    // The bridge watches the stop signal itself: it may come while the bridge still connects.
    bridge = await startBridge({
      role: flags.role,
      url,
      headers,
      stdin: io.stdin,
      stdout: io.stdout,
      signal: io.stop,
      log: (line) => io.stderr.write(`${line}\n`)
    })
  } catch (err) {
    if (err instanceof BridgeSettingError) {
      throw new UsageError(`${err.setting === 'role' ? '--role' : fromEnv ? 'TOOLPORT_URL' : '--url'} ${err.message}`)
    }
    // A role the Toolport does not have, a token it refuses: reported with their TP_ERR_* code.
    throw err
  }
  await bridge.closed
  return 0
}

async function serve (args: string[], io: CliIo): Promise<number> {
  const flags = parseFlags(args, {
    host: { type: 'string' },
    port: { type: 'string' },
    role: { type: 'string', multiple: true },
    config: { type: 'string' },
    inline: { type: 'boolean' },
    'log-level': { type: 'string' },
    'allow-non-loopback-bind': { type: 'boolean' },
    'token-file': { type: 'string' },
    help: { type: 'boolean', short: 'h' }
  })
  if (flags.help === true) {
    io.stdout.write(USAGE)
    return 0
  }
  const [config, { Toolport, resolveBindHost }, { createLogger }, { applyServerV8Flags }] =
    await Promise.all([import('./config.js'), import('./toolport.js'), import('./logger.js'), import('./v8-flags.js')])
  const { bindHostProblem, logLevelProblem, optionsFromEnv, parseOptions, portProblem } = config
  // A reader of stdout that goes away (`serve | head`, a log shipper restarting) must not take the
  // server down: its EPIPE is an 'error' event, which ends the process when nobody listens. The
  // log lines are lost from then on, and stderr says so once.
  let stdoutLost = false
  io.stdout.on('error', (err: NodeJS.ErrnoException) => {
    if (stdoutLost) return
    stdoutLost = true
    io.stderr.write(`toolport: stdout failed (${err.code ?? err.message}); log lines are no longer written, the server goes on\n`)
  })
  io.stderr.on('error', noop)
  const configFile = fileFlag(flags.config, '--config') ?? io.env.TOOLPORT_CONFIG
  // The file's object itself, not copied onto another: an own `__proto__` key stays a key (that
  // the schema refuses, as the library does) instead of becoming the options' prototype.
  const options = configFile !== undefined && configFile !== '' ? readConfigFile(configFile) : {}
  // A variable a flag overrides is not read: the flag wins, whatever the variable holds.
  const env = { ...io.env }
  if (flags.host !== undefined) delete env.TOOLPORT_HOST
  if (flags.port !== undefined) delete env.TOOLPORT_PORT
  if (flags['log-level'] !== undefined) delete env.TOOLPORT_LOG_LEVEL
  if (flags.role !== undefined) delete env.TOOLPORT_ROLES
  if (flags.inline === true) delete env.TOOLPORT_DISPATCH_MODE
  mergeOptions(options, optionsFromEnv(env))
  if (flags.host !== undefined) {
    const problem = bindHostProblem(flags.host)
    if (problem !== undefined) throw new UsageError(`--host ${JSON.stringify(flags.host)} ${problem}`)
    options.host = flags.host
  }
  if (flags.port !== undefined) {
    const problem = portProblem(flags.port)
    if (problem !== undefined) throw new UsageError(`--port ${problem}`)
    options.port = Number(flags.port)
  }
  if (flags.role !== undefined) options.roles = flags.role
  if (flags.inline === true) mergeOptions(options, { dispatch: { mode: 'inline' } })
  if (flags['log-level'] !== undefined) {
    const problem = logLevelProblem(flags['log-level'])
    if (problem !== undefined) throw new UsageError(`--log-level ${problem}`)
    options.logger = flags['log-level']
  }
  if (flags['allow-non-loopback-bind'] === true) mergeOptions(options, { security: { allowNonLoopbackBind: true } })
  const tokenFile = fileFlag(flags['token-file'], '--token-file') ?? io.env.TOOLPORT_TOKEN_FILE
  if (tokenFile !== undefined && tokenFile !== '') {
    mergeOptions(options,
      { security: { token: await readTokenFile(tokenFile) } })
  }
  // The CLI's defaults fill only what no source set: a bad value (`"roles": "A"`, `"logger":
  // null`) is left for the schema to report.
  if (options.roles === undefined || (Array.isArray(options.roles) && options.roles.length === 0)) {
    options.roles = ['default']
  }
  if (options.logger === undefined) options.logger = 'info'

  // Human-readable logs on a terminal, JSON lines otherwise (for log collectors).
  const settings = parseOptions(options)
  // listen() would refuse a non-loopback host naming the option; the operator gave a flag, a
  // variable or the config file's key, and the way to allow it here is the flag.
  const bind = resolveBindHost(settings.host)
  if (!bind.isLoopback && !settings.security.allowNonLoopbackBind) {
    const from = flags.host !== undefined
      ? '--host'
      : env.TOOLPORT_HOST !== undefined && env.TOOLPORT_HOST !== '' ? 'TOOLPORT_HOST' : `host in ${configFile ?? 'the options'}`
    throw new ConfigError(`refusing to bind ${bind.host} (${from}): not a loopback address; add --allow-non-loopback-bind ` +
      'to allow it (clients must still be loopback)')
  }
  // Before the first call: a process settles into its GC regime in its first seconds of load.
  const v8Flags = applyServerV8Flags(process.execArgv)
  const tp = new Toolport(settings, createLogger(settings.logger, {
    pretty: io.stdout.isTTY === true,
    destination: io.stdout
  }))
  try {
    const { url } = await tp.listen()
    io.stdout.write(`Toolport listening on ${url} (roles: ${tp.roles.names().join(', ')}; dispatch: ${tp[kDispatchMode]}` +
      `${v8Flags.length === 0 ? '' : `; V8: ${v8Flags.join(' ')}`})\n`)
    io.stdout.write(`Toolport stopping (${String(await stopped(io.stop))})\n`)
  } finally {
    await tp.close()
  }
  return 0
}

/**
 * A file flag's value. An empty one is a mistake (`--token-file "$UNSET"` in a script), not "no
 * file": it would quietly start a server without its token or its config file, whatever the
 * environment says. An empty variable does mean unset, as for every TOOLPORT_* variable.
 */
function fileFlag (value: string | undefined, flag: string): string | undefined {
  if (value === '') throw new UsageError(`${flag} needs a file name (it was given an empty one)`)
  return value
}

/** Strict flag parsing; a bad flag is a usage error (printed with the usage text, exit 2). */
function parseFlags<const T extends NonNullable<ParseArgsConfig['options']>> (args: string[],
  options: T): ReturnType<typeof parseArgs<{
    args: string[],
    strict: true,
    allowPositionals: false,
    options: T
  }>>['values'] {
  try {
    return parseArgs({ args, strict: true, allowPositionals: false, options }).values
  } catch (err) {
    throw new UsageError(errorText(err))
  }
}

/** Largest token file and config file read: a device (`/dev/zero`) must not fill the memory. */
const MAX_TOKEN_FILE_BYTES = 64 * 1024
const MAX_CONFIG_FILE_BYTES = 4 * 1024 * 1024

/**
 * The bytes of `file`, at most `maxBytes` of them (more is an InputError naming `what`), and its
 * mode, which `check` may refuse before a byte is read; read from the open file, so that what is
 * read is what was checked.
 */
function readCapped (file: string, what: string, maxBytes: number,
  check?: (mode: number) => void): { bytes: Buffer, mode: number } {
  let fd: number
  try {
    fd = openSync(file, 'r')
  } catch (err) {
    throw new InputError(`cannot read the ${what} ${file}: ${(err as NodeJS.ErrnoException).code ?? errorText(err)}`)
  }
  try {
    const { mode } = fstatSync(fd)
    check?.(mode)
    const chunks: Buffer[] = []
    let total = 0
    for (;;) {
      const chunk = Buffer.allocUnsafe(64 * 1024)
      const n = readSync(fd, chunk, 0, chunk.length, null)
      if (n === 0) break
      total += n
      if (total > maxBytes) throw new InputError(`the ${what} ${file} is larger than ${maxBytes} bytes`)
      chunks.push(chunk.subarray(0, n))
    }
    return { bytes: Buffer.concat(chunks, total), mode }
  } catch (err) {
    if (err instanceof InputError) throw err
    throw new InputError(`cannot read the ${what} ${file}: ${(err as NodeJS.ErrnoException).code ?? errorText(err)}`)
  } finally {
    closeSync(fd)
  }
}

/** UTF-8 text, refused if it is not: a replaced byte would quietly rename a role. */
function utf8Text (bytes: Buffer, what: string, file: string): string {
  try {
    return new TextDecoder('utf-8', { fatal: true, ignoreBOM: false }).decode(bytes)
  } catch {
    throw new InputError(`the ${what} ${file} is not UTF-8 text`)
  }
}

/**
 * Refuses a file that holds the token and that others may read (`mode` not 0600 or stricter);
 * `what` names it, `advice` follows "chmod 600 it".
 */
function assertPrivate (what: string, mode: number, advice = ''): void {
  if ((mode & 0o077) === 0) return
  throw new InputError(`${what} readable by others (mode ${(mode & 0o777).toString(8)}); chmod 600 it${advice}`)
}

/** Reads the token of token mode; the file must be private to its owner (0600 or stricter). */
async function readTokenFile (file: string): Promise<string> {
  const { bytes } = readCapped(file, 'token file', MAX_TOKEN_FILE_BYTES, (mode) => {
    assertPrivate(`the token file ${file} is`, mode)
  })
  const token = utf8Text(bytes, 'token file', file).trim()
  // The rule of `security.token` (README "Options"), also for the bridge's token.
  const { tokenProblem } = await import('./config.js')
  const problem = tokenProblem(token)
  if (problem !== undefined) throw new InputError(`the token in ${file} (security.token) ${problem}`)
  return token
}

/** ` at line L, column C` of a JSON syntax error whose message gives its position, else ''. */
function jsonErrorPlace (text: string, err: SyntaxError): string {
  const position = /at position (\d+)/.exec(err.message)
  if (position === null) return ''
  const before = text.slice(0, Number(position[1])).split('\n')
  return ` at line ${before.length}, column ${(before.at(-1)?.length ?? 0) + 1}`
}

/**
 * Reads the `--config` file. One that holds `security.token` must be private to its owner, as a
 * token file must (0600 or stricter): the token is the same secret, however it is given.
 */
function readConfigFile (file: string): Record<string, unknown> {
  const { bytes, mode } = readCapped(file, 'config file', MAX_CONFIG_FILE_BYTES)
  // The decoder drops a leading byte order mark (some editors write one): it is not part of the JSON.
  const text = utf8Text(bytes, 'config file', file)
  let options: Record<string, unknown>
  try {
    const value: unknown = JSON.parse(text)
    if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error('not a JSON object')
    options = value as Record<string, unknown>
  } catch (err) {
    // Not V8's message for a syntax error: it quotes the file around the error, and the file may
    // hold the token.
    const why = err instanceof SyntaxError ? `not valid JSON${jsonErrorPlace(text, err)}` : errorText(err)
    throw new InputError(`the config file ${file} is not a JSON object of options: ${why}`)
  }
  const security = options.security
  if (isPlainObject(security) && Object.hasOwn(security, 'token')) {
    assertPrivate(`the config file ${file} holds security.token and is`, mode, ', or give the token with --token-file')
  }
  return options
}

/**
 * Shallow-merges one level of nested option groups (dispatch, security, limits). A group that is
 * set but not an object (`"dispatch": "inline"` in the config file) is kept as it is, for the
 * schema to report, rather than replaced by the group merged into it.
 */
function mergeOptions (target: Record<string, unknown>, source: Record<string, unknown>): void {
  for (const [key, value] of Object.entries(source)) {
    const current = target[key]
    if (isPlainObject(value) && current !== undefined) {
      if (isPlainObject(current)) target[key] = { ...current, ...value }
    } else target[key] = value
  }
}

/** True when this file is the program being run (`toolport …`, or node/tsx on this file). */
function isProgram (): boolean {
  const entry = process.argv[1]
  if (entry === undefined) return false
  try {
    // The npm bin is a symlink to this file.
    return realpathSync(entry) === fileURLToPath(import.meta.url)
  } catch {
    return false
  }
}

/** Binds `main` to the real process: argv, stdio, environment, SIGINT/SIGTERM, the exit code. */
function runAsProgram (): void {
  const controller = new AbortController()
  const onSignal = (signal: NodeJS.Signals): void => {
    // Once: a second signal gets Node's default handling (the process ends at once).
    process.off('SIGINT', onSignal)
    process.off('SIGTERM', onSignal)
    controller.abort(signal)
  }
  process.on('SIGINT', onSignal)
  process.on('SIGTERM', onSignal)
  const io: CliIo = {
    stdin: process.stdin,
    stdout: process.stdout,
    stderr: process.stderr,
    env: process.env,
    stop: controller.signal
  }
  main(process.argv.slice(2), io).then((code) => {
    process.off('SIGINT', onSignal)
    process.off('SIGTERM', onSignal)
    process.exitCode = code
  }, (err: unknown) => {
    // Unreachable (main never rejects), but a bug must not pass silently.
    process.stderr.write(`toolport: ${String(err)}\n`)
    process.exitCode = 1
  })
}

if (isProgram()) runAsProgram()
