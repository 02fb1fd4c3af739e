// Where a worker thread's module is loaded from.
//
// Built (dist/…/*.js), a worker module sits next to this module. Run from the sources (the bench
// under tsx, the tests bundled by esbuild), every worker thread would have to load tsx and run
// its hooks on each module it imports, which costs hundreds of milliseconds per thread on a busy
// machine (and the test suite starts many pools). So from the sources a worker loads the compiled
// dist/workers/<name>.js instead, but only when every source file has its compiled file in dist/
// at least as new as the source: a stale or partial build is never used, the worker then loads
// the .ts file, with tsx in its execArgv. TOOLPORT_WORKERS_FROM_SOURCE=1 always loads the
// sources (coverage).
import { readdirSync, statSync } from 'node:fs'
import { join, relative } from 'node:path'
import { fileURLToPath } from 'node:url'

export interface WorkerModule {
  /** The module's file URL. */
  readonly url: string
  /** True when the module is TypeScript and the thread needs tsx's hooks to load it. */
  readonly typescript: boolean
  /**
   * The thread's execArgv: undefined inherits the process's (built and not under tsx); else the
   * process's flags a worker thread accepts, without tsx for a built module.
   */
  readonly execArgv: string[] | undefined
}

/** `distIsFresh`'s answers by root (each is checked once). */
const freshness = new Map<string, boolean>()

/** The module of worker `name` (`src/workers/<name>.ts`, built to `dist/workers/<name>.js`). */
export function workerModule (name: string): WorkerModule {
  if (!import.meta.url.endsWith('.ts')) {
    return { url: new URL(`../../workers/${name}.js`, import.meta.url).href, typescript: false, execArgv: undefined }
  }
  const root = new URL('../../../', import.meta.url)
  if (process.env.TOOLPORT_WORKERS_FROM_SOURCE !== '1' && distIsFresh(fileURLToPath(root))) {
    return { url: new URL(`dist/workers/${name}.js`, root).href, typescript: false, execArgv: workerExecArgv(process.execArgv, false) }
  }
  return sourceWorkerModule(name)
}

/**
 * Worker `name`'s .ts source, for a process that runs the sources (what `workerModule` picks when
 * dist/ is stale or TOOLPORT_WORKERS_FROM_SOURCE=1).
 */
export function sourceWorkerModule (name: string): WorkerModule {
  // Explicit flags here too: inherited, a per-process flag of the parent (--expose-gc, or
  // --input-type under `node -e`) makes the thread fail to start. The .ts file needs tsx in the
  // thread, also when this process runs the sources without tsx's flag (the test suite runs them
  // bundled by esbuild, see scripts/test-node.mjs).
  const execArgv = workerExecArgv(process.execArgv, true)
  if (!execArgv.some((arg) => TSX.test(arg))) execArgv.push('--import', import.meta.resolve('tsx'))
  // piscina first require()s the module. With tsx's CommonJS hook that reaches Node 20's
  // require(esm) for this ES module, which has aborted the thread's V8 (a fatal "IsGraphAsync
  // must be used on an instantiated module") now and then. Without require(esm) the require()
  // fails at once and piscina import()s the module, as it does the built one.
  // (A Node without the feature has no such flag either.)
  if ('require_module' in process.features) execArgv.push('--no-experimental-require-module')
  return { url: new URL(`../../workers/${name}.ts`, import.meta.url).href, typescript: true, execArgv }
}

/** A module specifier or path that names tsx. */
const TSX = /(^|[\\/=])tsx([\\/]|$)/

/**
 * True when `root`'s dist/ holds a compiled file at least as new as each source file under its
 * src/ (checked once per root).
 */
export function distIsFresh (root: string): boolean {
  let isFresh = freshness.get(root)
  if (isFresh === undefined) {
    isFresh = checkDist(root)
    freshness.set(root, isFresh)
  }
  return isFresh
}

function checkDist (root: string): boolean {
  const src = join(root, 'src')
  const dist = join(root, 'dist')
  try {
    for (const entry of readdirSync(src, { withFileTypes: true, recursive: true })) {
      if (!entry.isFile() || !entry.name.endsWith('.ts') || entry.name.endsWith('.d.ts')) continue
      const source = join(entry.parentPath, entry.name)
      const built = join(dist, relative(src, source)).replace(/\.ts$/, '.js')
      const builtStat = statSync(built, { throwIfNoEntry: false })
      if (builtStat === undefined || builtStat.mtimeMs < statSync(source).mtimeMs) return false
    }
    return true
  } catch {
    return false
  }
}

/** Flags without a value that a worker thread accepts and that are worth passing on. */
const WORKER_FLAGS = new Set(['--enable-source-maps', '--no-warnings', '--no-deprecation', '--trace-warnings',
  '--trace-uncaught'])

/**
 * The parent's `execArgv` as a worker thread may take it: module loaders (tsx only when
 * `keepTsx`), `--conditions` and a few harmless flags. Everything else is left out, because a
 * worker thread refuses per-process flags (`--expose-gc`, `--max-old-space-size`, any V8 option)
 * with ERR_WORKER_INVALID_EXEC_ARGV, and `--input-type` (from `node -e`) fails its start.
 */
function workerExecArgv (execArgv: readonly string[], keepTsx: boolean): string[] {
  const kept: string[] = []
  for (let i = 0; i < execArgv.length; i++) {
    const arg = execArgv[i] as string
    if (WORKER_FLAGS.has(arg)) {
      kept.push(arg)
      continue
    }
    const flag = /^(--import|--require|--loader|--experimental-loader|--conditions|-C)(=(.*))?$/.exec(arg)
    if (flag === null) continue
    const hasInlineValue = flag[3] !== undefined
    const value = hasInlineValue ? flag[3] as string : execArgv[i + 1]
    if (!hasInlineValue) i++
    if (value === undefined) continue
    if (!keepTsx && flag[1] !== '--conditions' && flag[1] !== '-C' && TSX.test(value)) continue
    if (hasInlineValue) kept.push(arg)
    else kept.push(arg, value)
  }
  return kept
}
