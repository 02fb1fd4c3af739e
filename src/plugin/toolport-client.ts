// The SDK's client of Toolport's HTTP API (docs/protocol.md "Routes"): register, clear, list.
//
// One dedicated undici `Pool` for the one Toolport origin, never the global dispatcher: the
// plugin's host application may have configured that one (proxy, mocks), and a proxy must never see
// this loopback traffic or its bearer token. Every failure becomes a `PluginError` so callers can
// tell "try again later" (unreachable, 5xx, no role took it) from "this request is wrong" (4xx).
import { Pool } from 'undici'
import { PLUGIN_ERROR_CODES, PluginError, markNameTaken, type PluginErrorDetail } from './errors.js'
import { isPlainObject } from '../shared/util.js'

/** The wire form of a registration (docs/protocol.md "Register"). */
export interface RegisterBody {
  name: string
  description: string
  parameters: Record<string, unknown>
  callback_url: string
  role: string | null
  source: string
  timeout_seconds: number
}

/** The parts of `POST /api/tools/register`'s answer the SDK uses (docs/protocol.md R8). */
export interface RegisterAnswer {
  registered: string
  affected_roles: string[]
  /** Roles that refused the tool because its name is taken (`owned_by`): `path` is the role. */
  refused: PluginErrorDetail[]
  /** Roles that took the tool and failed to sync it to their sessions (R8): `path` is the role. */
  unsynced: PluginErrorDetail[]
}

/** One row of `GET /api/tools` (docs/protocol.md R18). */
export interface ListedTool {
  name: string
  source?: string
  callback_url?: string
  is_remote?: boolean
}

export interface ToolportClientOptions {
  /** The API base, ending in `/`. */
  baseUrl: URL
  token: string | null
  /** Sent on every request; Toolport's ownership mode binds the source to it. */
  pluginKey: string
  requestTimeoutMs: number
}

// An answer can be large (a list holds our tools' rows in every role), but not this large; past it
// the answer is refused rather than buffered without bound.
const MAX_ANSWER_BYTES = 64 * 1024 * 1024

// The `name=…` query of one list request stays under this many characters: far below Node's 16 KiB
// limit on a request's headers (the request line included) with ours beside it.
const MAX_LIST_QUERY_CHARS = 4096

/** Toolport's answer went past `MAX_ANSWER_BYTES`: it answered, but not with anything usable. */
class AnswerTooLarge extends Error {
  constructor (maxBytes: number) {
    super(`the answer is larger than ${maxBytes} bytes`)
    this.name = 'AnswerTooLarge'
  }
}

/** Errors of registrations that prove the registry does not hold the tool. */
const nothingRegistered = new WeakSet<PluginError>()

/**
 * Whether `err`, thrown by `register`, proves the tool was not registered: Toolport refused the
 * request (4xx), answered `ok: false` with every role refusing it, or could not be connected to.
 * An `ok: false` whose roles took the tool and failed to sync it (R8), or a request sent and never
 * answered, proves nothing.
 */
export function provesNotRegistered (err: unknown): boolean {
  if (!(err instanceof PluginError)) return false
  if (nothingRegistered.has(err)) return true
  return err.code === PLUGIN_ERROR_CODES.refused && err.statusCode !== undefined && err.statusCode >= 400 &&
    err.statusCode < 500
}

export class ToolportClient {
  readonly #pool: Pool
  readonly #base: URL
  readonly #headers: Record<string, string>
  readonly #timeoutMs: number

  constructor (options: ToolportClientOptions) {
    this.#base = options.baseUrl
    this.#timeoutMs = options.requestTimeoutMs
    // Two connections: a poll and a registration may overlap with a `stop()`'s clear.
    this.#pool = new Pool(options.baseUrl.origin, {
      connections: 2,
      connectTimeout: Math.min(options.requestTimeoutMs, 10_000),
      // Toolport closes idle API sockets after fastify's default 72 s; ours go first, so a poll
      // never writes into a socket the server is closing.
      keepAliveTimeout: 4000,
      keepAliveMaxTimeout: 4000
    })
    this.#headers = {
      accept: 'application/json',
      'user-agent': 'toolport-plugin',
      'x-toolport-plugin-key': options.pluginKey
    }
    if (options.token !== null) this.#headers.authorization = `Bearer ${options.token}`
  }

  async register (body: RegisterBody): Promise<RegisterAnswer> {
    const answer = await this.#request('POST', 'api/tools/register', body) as {
      ok?: unknown,
      error?: unknown,
      registered?: unknown,
      affected_roles?: unknown,
      failed_roles?: unknown
    }
    const failed: unknown[] = Array.isArray(answer.failed_roles) ? answer.failed_roles : []
    if (answer.ok !== true) {
      // docs/protocol.md R8: a well-formed registration no role accepted (e.g. Toolport has no role yet).
      const reason = typeof answer.error === 'string' ? answer.error : 'no role accepted it'
      const details = roleProblems(failed)
      const err = new PluginError(PLUGIN_ERROR_CODES.refused,
        `Toolport did not register '${body.name}': ${reason}${problemsText(details)}`, { details })
      // Every role refused it (another source or a local tool owns the name), or there was no
      // role: the registry does not hold it. Otherwise some role took it and its sync failed.
      if (failed.every(isOwnerRefusal)) {
        nothingRegistered.add(err)
        // A name that is taken stays taken: retrying would only wait out startTimeoutMs.
        if (failed.length > 0) markNameTaken(err)
      }
      throw err
    }
    // The answer is read defensively: a field of the wrong type is ignored, never converted (an
    // object's own `toString` key would make String() throw a TypeError instead of a PluginError).
    return {
      registered: typeof answer.registered === 'string' ? answer.registered : body.name,
      affected_roles: Array.isArray(answer.affected_roles)
        ? answer.affected_roles.filter((r): r is string => typeof r === 'string')
        : [],
      refused: roleProblems(failed.filter(isOwnerRefusal)),
      unsynced: roleProblems(failed.filter((f) => !isOwnerRefusal(f)))
    }
  }

  /** `POST /api/tools/clear` (docs/protocol.md R16); resolves to the number of tools removed. */
  async clear (source: string, role: string | null): Promise<number> {
    const answer = await this.#request('POST', 'api/tools/clear', { source, role }) as { removed?: unknown }
    return typeof answer.removed === 'number' ? answer.removed : 0
  }

  /**
   * `GET /api/tools?name=…` (docs/protocol.md R18): the rows of `names` in every current role, or in
   * one, whatever their source (a name another source took over must be seen as taken, not as
   * missing). Only those names are asked for, so the answer does not grow with other plugins'
   * registrations. Names too many for one query are asked for in several requests; a role is kept
   * only when every answer lists it (one added or removed meanwhile is left to the next check).
   */
  async list (role: string | null, names: readonly string[],
    signal?: AbortSignal): Promise<Map<string, ListedTool[]>> {
    const roleQuery = role === null ? '' : `role=${encodeURIComponent(role)}&`
    let byRole: Map<string, ListedTool[]> | null = null
    for (const nameQuery of nameQueries(names)) {
      const answer = await this.#listOnce(`${roleQuery}${nameQuery}`, signal)
      if (byRole === null) {
        byRole = answer
        continue
      }
      for (const [name, rows] of byRole) {
        const more = answer.get(name)
        if (more === undefined) byRole.delete(name)
        else rows.push(...more)
      }
    }
    return byRole ?? new Map()
  }

  async #listOnce (query: string, signal: AbortSignal | undefined): Promise<Map<string, ListedTool[]>> {
    const answer = await this.#request('GET', 'api/tools', undefined, signal, query) as { tools_by_role?: unknown }
    const byRole = new Map<string, ListedTool[]>()
    const raw = answer.tools_by_role
    if (!isPlainObject(raw)) {
      throw new PluginError(PLUGIN_ERROR_CODES.refused, 'Toolport listed no tools_by_role: is this a Toolport API?')
    }
    // Only rows of R18's shape count: an object with a string `name` (the other fields are kept only
    // when they are strings / booleans). Anything else is not one of our tools.
    for (const [name, rows] of Object.entries(raw)) {
      const tools: ListedTool[] = []
      if (Array.isArray(rows)) {
        for (const row of rows as unknown[]) {
          if (!isPlainObject(row) || typeof row.name !== 'string') continue
          const tool: ListedTool = { name: row.name }
          if (typeof row.source === 'string') tool.source = row.source
          if (typeof row.callback_url === 'string') tool.callback_url = row.callback_url
          if (typeof row.is_remote === 'boolean') tool.is_remote = row.is_remote
          tools.push(tool)
        }
      }
      byRole.set(name, tools)
    }
    return byRole
  }

  async close (): Promise<void> {
    await this.#pool.close()
  }

  /** `query` goes into the URL only: messages name the route, not a list of tool names. */
  async #request (method: 'GET' | 'POST', relative: string, body?: unknown,
    signal?: AbortSignal, query = ''): Promise<Record<string, unknown>> {
    const url = new URL(query === '' ? relative : `${relative}?${query}`, this.#base)
    // One controller per request, tied to the caller's signal by a listener removed when the
    // request ends: `AbortSignal.any([signal, timeout])` would register every request as a
    // dependant of the plugin's long-lived stop signal, which Node 20 never forgets.
    const controller = new AbortController()
    let timedOut = false
    const timer = setTimeout(() => {
      timedOut = true
      controller.abort(new DOMException(`no answer within ${this.#timeoutMs} ms`, 'TimeoutError'))
    }, this.#timeoutMs)
    timer.unref() // as AbortSignal.timeout: a request in flight keeps its socket, not the process
    const onAbort = (): void => { controller.abort(signal?.reason) }
    if (signal?.aborted === true) onAbort()
    else signal?.addEventListener('abort', onAbort, { once: true })
    let text: string
    let statusCode = 0
    try {
      const res = await this.#pool.request({
        method,
        path: url.pathname + url.search,
        headers: body === undefined ? this.#headers : { ...this.#headers, 'content-type': 'application/json' },
        body: body === undefined ? null : JSON.stringify(body),
        signal: controller.signal,
        headersTimeout: this.#timeoutMs,
        bodyTimeout: this.#timeoutMs
      })
      statusCode = res.statusCode
      text = await readCapped(res.body, MAX_ANSWER_BYTES)
    } catch (err) {
      // An answer over the cap is still an answer (README "Plugin SDK", the PluginError table:
      // UNREACHABLE means Toolport did not answer, and is retried).
      if (err instanceof AnswerTooLarge) {
        throw new PluginError(PLUGIN_ERROR_CODES.refused,
          `Toolport's answer to ${method} /${relative} is larger than ${MAX_ANSWER_BYTES} bytes`,
          { statusCode, cause: err })
      }
      const what = timedOut ? `no answer within ${this.#timeoutMs} ms` : describe(err)
      const unreachable = new PluginError(PLUGIN_ERROR_CODES.unreachable,
        `cannot reach Toolport at ${this.#base.href} (${method} /${relative}): ${what}`, { cause: err })
      // No connection, so no request: a registration that was never sent registered nothing.
      if (!timedOut && isConnectFailure(err)) nothingRegistered.add(unreachable)
      throw unreachable
    } finally {
      clearTimeout(timer)
      signal?.removeEventListener('abort', onAbort)
    }
    let parsed: unknown
    try {
      parsed = text === '' ? {} : JSON.parse(text)
    } catch {
      parsed = undefined
    }
    const answer = isPlainObject(parsed) ? parsed : null
    if (statusCode >= 300 || answer === null) {
      // Toolport's error body: { ok: false, statusCode, code, error, message, details? }.
      const code = typeof answer?.code === 'string' ? answer.code : undefined
      const message = typeof answer?.message === 'string' ? answer.message : `HTTP ${statusCode}`
      // Only details of the documented shape; a field that is not a string is left empty.
      const details: PluginErrorDetail[] | undefined = Array.isArray(answer?.details)
        ? (answer.details as unknown[]).filter(isPlainObject).map((d) => ({
            path: typeof d.path === 'string' ? d.path : '',
            message: typeof d.message === 'string' ? d.message : ''
          }))
        : undefined
      const detailText = details === undefined ||
        details.length === 0
        ? ''
        : ` (${details.map((d) => `${d.path}: ${d.message}`).join('; ')})`
      throw new PluginError(PLUGIN_ERROR_CODES.refused,
        `Toolport refused ${method} /${relative}: ${message}${code === undefined ? '' : ` [${code}]`}${detailText}`,
        { statusCode, toolportCode: code, details })
    }
    return answer
  }
}

/** `names` as `name=…&name=…` queries of at most MAX_LIST_QUERY_CHARS characters each (one name at least). */
export function nameQueries (names: readonly string[]): string[] {
  const queries: string[] = []
  let query = ''
  for (const name of names) {
    const param = `name=${encodeURIComponent(name)}`
    if (query !== '' && query.length + 1 + param.length > MAX_LIST_QUERY_CHARS) {
      queries.push(query)
      query = ''
    }
    query += query === '' ? param : `&${param}`
  }
  if (query !== '') queries.push(query)
  return queries
}

async function readCapped (body: AsyncIterable<Buffer> & { destroy: (err?: Error) => unknown },
  maxBytes: number): Promise<string> {
  const chunks: Buffer[] = []
  let size = 0
  for await (const chunk of body) {
    size += chunk.length
    if (size > maxBytes) {
      const err = new AnswerTooLarge(maxBytes)
      body.destroy(err)
      throw err
    }
    chunks.push(chunk)
  }
  return Buffer.concat(chunks).toString('utf8')
}

/** A `failed_roles` entry of a role that refused the tool because another owner holds its name. */
function isOwnerRefusal (entry: unknown): boolean {
  return isPlainObject(entry) && typeof entry.owned_by === 'string'
}

/** `failed_roles` entries as details, `path` naming the role (entries of the wrong shape are skipped). */
function roleProblems (failed: unknown[]): PluginErrorDetail[] {
  const problems: PluginErrorDetail[] = []
  for (const entry of failed) {
    if (!isPlainObject(entry) || typeof entry.role !== 'string') continue
    problems.push({ path: entry.role, message: typeof entry.error === 'string' ? entry.error : 'failed' })
  }
  return problems
}

/** ` (Lanlan: …; Yui: …)`, at most three roles named (each message cut at 200 characters), or ''. */
export function problemsText (problems: readonly PluginErrorDetail[]): string {
  if (problems.length === 0) return ''
  const cut = (text: string): string => text.length > 200 ? `${text.slice(0, 200)}…` : text
  const named = problems.slice(0, 3).map((p) => `${cut(p.path)}: ${cut(p.message)}`).join('; ')
  return ` (${named}${problems.length > 3 ? `; and ${problems.length - 3} more` : ''})`
}

/** A connection that could not be made (refused, unreachable, connect timeout): nothing was sent. */
function isConnectFailure (err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code
  return code === 'ECONNREFUSED' || code === 'EHOSTUNREACH' || code === 'ENETUNREACH' || code === 'EADDRNOTAVAIL' ||
    code === 'UND_ERR_CONNECT_TIMEOUT'
}

function describe (err: unknown): string {
  const e = err as { code?: unknown, message?: unknown, cause?: { code?: unknown } }
  const code = typeof e?.code === 'string' ? e.code : typeof e?.cause?.code === 'string' ? e.cause.code : ''
  const message = typeof e?.message === 'string' ? e.message : String(err)
  return code === '' ? message : `${code}: ${message}`
}
