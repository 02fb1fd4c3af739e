// Child processes of the bench: the callback server(s), the autocannon load generator, the
// memory probe and the optional Python peers. Every child is ours: it is started here, stopped
// here by its own handle, and exits by itself when its stdin closes (if the bench dies).
import { spawn, spawnSync } from 'node:child_process'
import type { ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { createInterface } from 'node:readline'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import type { CpuPerCall } from './cpu.js'

/** The tsx loader, resolved once, so children work whatever their cwd. */
export const TSX = import.meta.resolve('tsx')

export const BENCH_DIR = fileURLToPath(new URL('..', import.meta.url))

export function benchFile (relative: string): string {
  return fileURLToPath(new URL(`../${relative}`, import.meta.url))
}

export interface CallbackServerHandle {
  port: number
  pid: number
  origin: string
  url: (path: string) => string
  largeBytes: number
  smallBytes: number
  close: () => Promise<void>
}

export interface CallbackServerOptions {
  /** Idle keep-alive timeout of the server's sockets (default 60 s: the client decides). */
  keepAliveMs?: number
  /** false: no `Keep-Alive: timeout=N` hint, idle sockets closed silently (uvicorn-like). */
  sendHint?: boolean
}

/** Spawns `bench/fixtures/callback-server.ts` in its own process and waits for its port. */
export async function startCallbackServer (options: CallbackServerOptions = {}): Promise<CallbackServerHandle> {
  const args = ['--import', TSX, benchFile('fixtures/callback-server.ts')]
  if (options.keepAliveMs !== undefined) args.push('--keep-alive-ms', String(options.keepAliveMs))
  if (options.sendHint === false) args.push('--no-hint')
  const child = spawn(process.execPath, args, { stdio: ['pipe', 'pipe', 'inherit'] })
  const info = await firstJsonLine(child, 20_000) as {
    port: number,
    pid: number,
    largeBytes: number,
    smallBytes: number
  }
  const origin = `http://127.0.0.1:${info.port}`
  return {
    port: info.port,
    pid: info.pid,
    origin,
    largeBytes: info.largeBytes,
    smallBytes: info.smallBytes,
    url: (path: string) => origin + path,
    close: () => stopChild(child)
  }
}

/**
 * Runs a node script (under tsx) that prints one JSON line on stdout, and returns it parsed.
 * Lines of the form `{"event":"name"}` printed before it are passed to `onEvent` (e.g. the load
 * generator saying its measured run starts). Its stderr goes to ours.
 */
export async function runNodeJson (script: string, args: readonly string[],
  options: { timeoutMs: number, nodeArgs?: readonly string[], onEvent?: (name: string) => void }): Promise<unknown> {
  const child = spawn(process.execPath, [...(options.nodeArgs ?? []), '--import', TSX, benchFile(script), ...args],
    { stdio: ['pipe', 'pipe', 'inherit'] })
  try {
    return await firstJsonLine(child, options.timeoutMs, options.onEvent)
  } finally {
    await stopChild(child)
  }
}

/** What `bench/fixtures/profile-target.ts` runs: one dispatch path, or the call route (`route`). */
export interface ProfileTargetOptions {
  path: 'pool' | 'inline' | 'raw' | 'route' | 'mcp'
  route: 'small' | 'large'
  concurrency: number
  seconds: number
  /**
   * Another checkout of Toolport whose `createToolport` this target runs instead of this tree's
   * (`npm run ab` against a tree older than this harness); its own V8 setting only if it has one.
   */
  toolport?: string
  /** With `toolport`: its build (`dist/main/index.js`, what `npm start` runs), not its sources under tsx. */
  toolportBuild?: boolean
}

/** The command-line flags that choose a target run, as `npm run ab` and `npm run profile` take them. */
export interface TargetFlags {
  path: ProfileTargetOptions['path']
  reply: ProfileTargetOptions['route']
  concurrency: number
  seconds: number
}

/**
 * Checks the flags as a whole once read: `mcp` runs on one MCP session, which takes at most
 * `maxMcpConcurrency` calls at once (a larger -c is lowered to it, so every label shows what ran),
 * and always calls the small tool.
 */
export function settleTargetFlags (flags: TargetFlags, maxMcpConcurrency: number,
  fail: (message: string) => never): void {
  if (flags.path !== 'mcp') return
  if (flags.reply !== 'small') fail('--path mcp calls the ~100 B tool only (no --reply large)')
  flags.concurrency = Math.min(flags.concurrency, maxMcpConcurrency)
}

/**
 * Reads `flag` into `flags` when it is one of the target flags (`--path`, `--reply`, `-c`,
 * `--seconds`), each taking `value`; false for any other flag. A bad value goes to `fail`.
 */
export function readTargetFlag (flag: string, value: string | undefined, flags: TargetFlags,
  fail: (message: string) => never): boolean {
  const count = (max: number): number => {
    const n = Number(value)
    if (!Number.isInteger(n) || n < 1 || n > max) fail(`${flag} needs an integer from 1 to ${max}`)
    return n
  }
  switch (flag) {
    case '--path':
      if (value !== 'pool' && value !== 'inline' && value !== 'raw' && value !== 'route' && value !== 'mcp') {
        fail('--path is pool, inline, raw, route or mcp')
      }
      flags.path = value
      return true
    case '--reply':
      if (value !== 'small' && value !== 'large') fail('--reply is small or large')
      flags.reply = value
      return true
    case '-c': flags.concurrency = count(10_000); return true
    case '--seconds': flags.seconds = count(120); return true
    default: return false
  }
}

/** The target's line once warmed up: its pid and its pool workers' thread ids. */
export interface ProfileTargetReady {
  pid: number
  workers: number[]
}

/** The target's figures for its measured window. */
export interface ProfileTargetResult {
  rps: number
  calls: number
  errors: number
  p50Us: number
  cpu: CpuPerCall | null
}

/**
 * Runs `bench/fixtures/profile-target.ts` of `tree` (default: this checkout) in a process of its
 * own, under tsx with `nodeArgs` before it and in `cwd`; `onReady` is told when the measured
 * window starts. Rejects when the process fails or prints no figures.
 */
export async function runProfileTarget (options: ProfileTargetOptions, run: {
  tree?: string
  nodeArgs?: readonly string[]
  cwd?: string
  onReady?: (ready: ProfileTargetReady) => void
} = {}): Promise<ProfileTargetResult> {
  const script = run.tree === undefined ? benchFile('fixtures/profile-target.ts') : join(run.tree, 'bench/fixtures/profile-target.ts')
  const child = spawn(process.execPath, [...(run.nodeArgs ?? []), '--import', TSX, script, JSON.stringify(options)],
    { cwd: run.cwd ?? run.tree, stdio: ['pipe', 'pipe', 'inherit'] })
  let result: ProfileTargetResult | null = null
  createInterface({ input: child.stdout }).on('line', (line) => {
    if (!line.startsWith('{')) return
    const message = JSON.parse(line) as Partial<ProfileTargetReady & ProfileTargetResult> & { event?: string }
    if (message.event === 'ready') run.onReady?.({ pid: message.pid as number, workers: message.workers ?? [] })
    else if (message.event === undefined) result = message as ProfileTargetResult
  })
  const [code] = await once(child, 'exit') as [number | null]
  const figures = result as ProfileTargetResult | null
  if (code !== 0 || figures === null) throw new Error(`${script} exited with code ${String(code)} and no figures`)
  return figures
}

/** Runs a command that prints one JSON line; null when the command is missing or fails. */
export async function runJson (command: string, args: readonly string[], timeoutMs: number): Promise<unknown> {
  const child = spawn(command, args, { stdio: ['pipe', 'pipe', 'inherit'] })
  try {
    return await firstJsonLine(child, timeoutMs)
  } finally {
    await stopChild(child)
  }
}

/** True when `python -c code` exits 0 (quietly; a missing interpreter is false). */
export function pythonHas (python: string, code: string): boolean {
  const run = spawnSync(python, ['-c', code], { stdio: 'ignore', timeout: 10_000 })
  return run.status === 0
}

async function firstJsonLine (child: ChildProcess, timeoutMs: number,
  onEvent?: (name: string) => void): Promise<unknown> {
  const stdout = child.stdout
  if (stdout === null) throw new Error('child has no stdout')
  const lines = createInterface({ input: stdout })
  let timer: NodeJS.Timeout | undefined
  try {
    return await new Promise((resolve, reject) => {
      timer = setTimeout(() => { reject(new Error(`child ${child.pid ?? ''} printed nothing within ${timeoutMs} ms`)) },
        timeoutMs)
      child.once('error', reject)
      child.once('close',
        (code) => { reject(new Error(`child exited (code ${code ?? 'signal'}) before printing its result`)) })
      lines.on('line', (line) => {
        const text = line.trim()
        if (!text.startsWith('{')) return
        let value: unknown
        try {
          value = JSON.parse(text)
        } catch (err) {
          reject(err)
          return
        }
        const event = (value as { event?: unknown }).event
        if (typeof event === 'string') onEvent?.(event)
        else resolve(value)
      })
    })
  } finally {
    clearTimeout(timer)
    lines.close()
  }
}

/** Closes the child's stdin (it exits by itself), then SIGTERM after 3 s, SIGKILL after 6 s. */
export async function stopChild (child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return
  const exited = once(child, 'exit')
  child.stdin?.end()
  const term = setTimeout(() => { child.kill('SIGTERM') }, 3_000)
  const kill = setTimeout(() => { child.kill('SIGKILL') }, 6_000)
  try {
    await exited
  } finally {
    clearTimeout(term)
    clearTimeout(kill)
  }
}
