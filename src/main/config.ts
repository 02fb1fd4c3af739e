// One zod schema for every option, with its default and its environment/flag name.
//
// The library reads options only through `parseOptions`; the CLI maps flags and environment
// variables onto the same schema with `optionsFromEnv`, so both see one set of defaults.
import { isIP } from 'node:net'
import { z } from 'zod'
import { ConfigError } from './errors.js'
import { isWellFormedText } from '../shared/util.js'

/**
 * A role name: 1 to 128 characters, not `.` or `..` (a URL path cannot carry those as a segment,
 * so `/mcp/<role>` could never reach the role), and well-formed Unicode (a lone surrogate has no
 * UTF-8 form: no URL can carry it). The one rule, used by the options, by `tp.roles.add` and by
 * `toolport mcp --role`.
 */
export const roleNameSchema = z.string().min(1).max(128)
  .refine((name) => name !== '.' && name !== '..', { message: 'a role cannot be named . or ..: URLs cannot name it' })
  .refine(isWellFormedText, { message: 'a role name must be well-formed Unicode (no lone surrogates)' })

/** Why `name` is not a role name (roleNameSchema's first complaint); undefined when it is one. */
export function roleNameProblem (name: unknown): string | undefined {
  const checked = roleNameSchema.safeParse(name)
  return checked.success ? undefined : checked.error.issues[0]?.message ?? 'must be a string of 1 to 128 characters'
}

/** A DNS name: labels of letters, digits, `-` and `_`, joined by dots, a final dot allowed. */
const HOST_NAME = /^[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*\.?$/i

/**
 * Why `host` is no address to bind (the `host` option, `listen({ host })`, `--host`,
 * TOOLPORT_HOST), or undefined: it must be an IP address (an IPv6 one bracketed or not) or a host
 * name, alone. A port, a scheme or a space would make it a name to look up (ENOTFOUND), and calling
 * it "not a loopback address" would send the operator to allow non-loopback binds, which cannot
 * help. The text follows the value, e.g. `"127.0.0.1:8080" is not an address: …`.
 */
export function bindHostProblem (host: string): string | undefined {
  const inner = unbracket(host)
  if (inner !== host ? isIP(inner) === 6 : isIP(inner) !== 0 || HOST_NAME.test(inner)) return undefined
  return 'is not an address: give the address or host name alone, without a scheme, port or spaces ' +
    '(e.g. 127.0.0.1 or ::1; the port is a setting of its own)'
}

/** `host` without the brackets an IPv6 address may come in, as in a URL (`[::1]` → `::1`). */
export function unbracket (host: string): string {
  return /^\[[^[\]]*\]$/.test(host) ? host.slice(1, -1) : host
}

/** A token of token mode (see `security.token`): the options' rule, and the token files' of the CLI. */
const tokenSchema = z.string().refine((t) => Buffer.byteLength(t) >= 32, { message: 'is shorter than 32 bytes' })
  .refine((t) => /^[\x21-\x7e]*$/.test(t), {
    message: 'must be visible ASCII characters only (0x21–0x7E; no space, line break or other character): ' +
      'a client\'s Authorization header could not carry it unchanged, so it could never match'
  })

/** Why `token` cannot be a token of token mode (tokenSchema's first complaint); undefined when it can. */
export function tokenProblem (token: string): string | undefined {
  const checked = tokenSchema.safeParse(token)
  return checked.success ? undefined : checked.error.issues[0]?.message
}

/** How an error in the options (or the environment variables read as options) begins. */
const OPTIONS_PREFIX = 'invalid Toolport options: '

/** `dispatch.mode`'s values. */
const DISPATCH_MODES = ['pool', 'inline'] as const

const dispatchSchema = z.strictObject({
  /** `pool`: callbacks run in worker threads (default). `inline`: on the main thread. */
  mode: z.enum(DISPATCH_MODES).default('pool'),
  /** Worker threads; 1 measured best on 2 cores for this I/O-bound work. */
  threads: z.number().int().min(1).max(64).default(1),
  /** The calls of one event-loop turn travel to a worker as one message, at most this many. */
  maxBatch: z.number().int().min(1).max(1024).default(64),
  /** Calls admitted at once (queued or running); beyond it a call is answered `busy` at once. */
  maxPending: z.number().int().min(1).max(1_000_000).default(4096),
  /** Calls to one callback origin with the workers at once; more wait in that origin's queue. */
  maxInFlightPerOrigin: z.number().int().min(1).max(1_000_000).default(256),
  /** Calls to one callback origin waiting behind its in-flight bound; beyond it they are `busy`. */
  maxQueuedPerOrigin: z.number().int().min(0).max(1_000_000).default(1024),
  /** Reply bytes buffered at once over all calls; a reply that does not fit fails its call. */
  maxBufferedReplyBytes: z.number().int().min(1024).max(1024 ** 3).default(256 * 1024 * 1024),
  /** undici connections per callback origin per thread. */
  connectionsPerOrigin: z.number().int().min(1).max(1024).default(64),
  /** Cap on a callback reply body. */
  maxResponseBytes: z.number().int().min(1).max(1024 ** 3).default(4 * 1024 * 1024),
  /** Most images passed on from one reply's `images`; the rest are dropped with a warning. */
  maxImages: z.number().int().min(0).max(64).default(2),
  /**
   * Largest image in a reply's `images`, in bytes of its base64 text (`data_b64`); a larger one
   * is dropped with a warning.
   */
  maxImageBytes: z.number().int().min(1).max(1024 ** 3).default(2 * 1024 * 1024),
  /** Idle keep-alive sockets to callbacks are closed after this. */
  keepAliveTimeoutMs: z.number().int().min(1).max(600_000).default(4_000),
  /** Connect timeout (each call's own deadline still applies). */
  connectTimeoutMs: z.number().int().min(1).max(300_000).default(10_000),
  /** `close()` lets in-flight calls finish for this long before destroying the pool. */
  closeGraceMs: z.number().int().min(0).max(600_000).default(5_000)
})

// The allow-lists are compared as browsers send their entries (the guard matches exactly): an
// entry in another form would be accepted here and never match anything.

/**
 * `security.allowedOrigins`: an origin as a browser sends it: `new URL(o).origin` for http(s) and
 * the other special schemes; `scheme://host` for the others (an extension's
 * `chrome-extension://<id>`, which the URL standard serialises as "null").
 */
function originProblem (origin: string, ctx: z.RefinementCtx): void {
  let serialised = ''
  try {
    const url = new URL(origin)
    serialised = url.origin === 'null' && url.host !== '' ? `${url.protocol}//${url.host}` : url.origin
  } catch {}
  if (serialised === origin) return
  ctx.addIssue({
    code: 'custom',
    message: serialised === '' || serialised === 'null'
      ? `${JSON.stringify(origin)} is not an origin (scheme://host[:port])`
      : `${JSON.stringify(origin)} is not an origin as a browser sends it: write ${JSON.stringify(serialised)}`
  })
}

/**
 * `security.allowedHosts`: an ASCII host name (a Host header carries an international name in its
 * `xn--` form), an IPv4 address or a bracketed IPv6 address, without a scheme, port or path.
 */
function hostNameProblem (host: string, ctx: z.RefinementCtx): void {
  if (/^(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)$/i.test(host)) return
  ctx.addIssue({
    code: 'custom',
    message: `${JSON.stringify(host)} is not a host name: give the name alone, in ASCII (an international name ` +
      'in its xn-- form); the Host header\'s port is not compared'
  })
}

const securitySchema = z.strictObject({
  /** Check the Host header against loopback names (DNS-rebinding defence). */
  checkHost: z.boolean().default(true),
  /** Extra Host names accepted besides localhost, 127/8 and [::1]. */
  allowedHosts: z.array(z.string().min(1).superRefine(hostNameProblem)).default([]),
  /** Browser origins allowed to call the API (exact `scheme://host[:port]`); empty by default. */
  allowedOrigins: z.array(z.string().min(1).superRefine(originProblem)).default([]),
  /** Check Origin and Sec-Fetch-Site (cross-site request defence). */
  checkOrigin: z.boolean().default(true),
  /** Allow binding a non-loopback address (peers are still checked: R1). */
  allowNonLoopbackBind: z.boolean().default(false),
  /**
   * Token mode: every request must carry `Authorization: Bearer <token>` (else 401). At least 32
   * bytes, visible ASCII only (0x21–0x7E): a client's Authorization header is read trimmed and as
   * Latin-1, and HTTP clients refuse line breaks (or, like undici, anything beyond Latin-1) in it,
   * so a token with a space at either end, a control or a non-ASCII character could never match
   * as every client sends it; visible ASCII is what every client sends, and Toolport reads,
   * unchanged. The CLI reads it from a 0600 file (`--token-file`), never from argv.
   */
  token: tokenSchema.optional(),
  /** Ownership mode: a registration may not replace a tool that another `source` owns. */
  enforceOwnership: z.boolean().default(false)
})

/** `limits.reservedConnections` when unset (and `maxConnections` leaves room for it). */
const DEFAULT_RESERVED_CONNECTIONS = 64

const limitsSchema = z.strictObject({
  /** Largest request body in bytes. */
  maxBodyBytes: z.number().int().min(1024).max(64 * 1024 * 1024).default(1024 * 1024),
  /** Deepest JSON nesting accepted in a request body. */
  maxJsonDepth: z.number().int().min(4).max(1024).default(64),
  /** Largest `parameters` schema, in bytes of JSON. */
  maxParametersBytes: z.number().int().min(256).max(16 * 1024 * 1024).default(64 * 1024),
  /** Deepest nesting inside a `parameters` schema. */
  maxParametersDepth: z.number().int().min(2).max(1024).default(32),
  /**
   * Longest a `parameters` schema may take to compile into its argument validator, in ms (on the
   * schema compiler thread; over it, the registration is a 422).
   */
  maxSchemaCompileMs: z.number().int().min(50).max(60_000).default(2000),
  /** Largest validator code a `parameters` schema may compile into, in bytes (over it: 422). */
  maxSchemaCodeBytes: z.number().int().min(64 * 1024).max(256 * 1024 * 1024).default(4 * 1024 * 1024),
  /**
   * Longest the check of one call's arguments against its tool's `parameters` may take, in ms (on
   * the main thread; past it the call is refused as a tool error, "could not be checked").
   */
  maxValidationMs: z.number().int().min(1).max(60_000).default(50),
  /** Longest tool `description`, in characters. */
  maxDescriptionChars: z.number().int().min(1).max(1024 * 1024).default(16 * 1024),
  /** Most tools one role may hold. */
  maxToolsPerRole: z.number().int().min(1).max(1_000_000).default(10_000),
  /** Most tools one `source` may hold in one role. */
  maxToolsPerSource: z.number().int().min(1).max(1_000_000).default(1_000),
  /** Most simultaneous HTTP connections to the API server. */
  maxConnections: z.number().int().min(1).max(1_000_000).default(1024),
  /**
   * Connections kept free for new clients: from `maxConnections - reservedConnections` open
   * connections on, each new one closes the longest-idle one (token holders' last). Less than
   * `maxConnections`; unset, 64 or `maxConnections - 1`, whichever is less (see the transform below).
   */
  reservedConnections: z.number().int().min(0).max(1_000_000).optional(),
  /** Idle timeout of API sockets while the reserve is in use (else the 65 s keep-alive timeout). */
  pressureIdleTimeoutMs: z.number().int().min(10).max(600_000).default(2_000),
  /**
   * Most bytes of answers written and not yet taken by their clients, all API connections
   * together (a client that stops reading leaves its answer in memory); past it the answers that
   * have waited longest are cut (their sockets closed), never the one just written.
   */
  maxUnsentAnswerBytes: z.number().int().min(1024 * 1024).max(64 * 1024 ** 3).default(256 * 1024 * 1024),
  /** Longest a written answer may wait for its client to take it, in ms; then its socket is closed. */
  answerStallTimeoutMs: z.number().int().min(100).max(3_600_000).default(30_000),
  /**
   * Largest `GET /api/tools/definitions` answer, in bytes of JSON; past it the route answers 422
   * TP_ERR_LIMIT_EXCEEDED. The answer is streamed, so this bounds the time and bandwidth, not memory.
   */
  maxDefinitionsBytes: z.number().int().min(1024).max(16 * 1024 ** 3).default(1024 ** 3)
}).transform((limits, ctx) => {
  // The reserve must leave room for clients; the default one shrinks under a small `maxConnections`.
  const reservedConnections = limits.reservedConnections ??
    Math.min(DEFAULT_RESERVED_CONNECTIONS, limits.maxConnections - 1)
  if (reservedConnections >= limits.maxConnections) {
    ctx.addIssue({
      code: 'custom',
      path: ['reservedConnections'],
      message: `must be less than limits.maxConnections (got ${reservedConnections} >= ${limits.maxConnections})`
    })
    return z.NEVER
  }
  return { ...limits, reservedConnections }
})

const mcpSchema = z.strictObject({
  /** MCP sessions at once, all roles together; when full, idle ones are evicted. */
  maxSessions: z.number().int().min(1).max(100_000).default(256),
  /** MCP sessions one client (the connection that initializes) holds; its next evicts its oldest idle one. */
  maxSessionsPerClient: z.number().int().min(1).max(100_000).default(32),
  /** `tools/call` in flight per MCP session; beyond it a call answers a tool error. */
  maxCallsPerSession: z.number().int().min(1).max(1_000_000).default(32),
  /** `tools/call` in flight over all sessions of one MCP client. */
  maxCallsPerClient: z.number().int().min(1).max(1_000_000).default(128),
  /** `tools/call` in flight over every MCP session (default: a quarter of `dispatch.maxPending`). */
  maxCalls: z.number().int().min(1).max(1_000_000).optional(),
  /** The `retry` (ms) a resumable stream's priming event suggests. */
  retryIntervalMs: z.number().int().min(0).max(600_000).default(2000),
  /** Events each session keeps for resumed streams. */
  eventStoreMaxEvents: z.number().int().min(1).max(1_000_000).default(512),
  /** Bytes of messages each session keeps for resumed streams. */
  eventStoreMaxBytes: z.number().int().min(0).max(1024 ** 3).default(256 * 1024)
})

const eventsSchema = z.strictObject({
  /** Events kept for `Last-Event-ID` replay on `GET /api/events` (a ring; the oldest go first). */
  replaySize: z.number().int().min(16).max(1_000_000).default(2048),
  /**
   * The replay ring's size at most, counted as its events' encoded frames' characters (and a few
   * bytes an event besides). With many roles an event names each (a global registration), and
   * `replaySize` such events could hold hundreds of MB.
   */
  replayMaxBytes: z.number().int().min(64 * 1024).max(1024 ** 3).default(16 * 1024 * 1024),
  /** A comment line sent to every subscriber this often, so idle proxies and clients see life. */
  heartbeatMs: z.number().int().min(100).max(600_000).default(15_000),
  /** Bytes an event-stream subscriber may leave unread before it is dropped (never slows dispatch). */
  maxSubscriberBufferBytes: z.number().int().min(1024).max(256 * 1024 * 1024).default(1024 * 1024),
  /** Simultaneous event-stream subscribers; one more is answered 503. */
  maxSubscribers: z.number().int().min(1).max(10_000).default(64),
  /** `call` events streamed per second at most; every call is still counted in the console's stats. */
  maxCallEventsPerSecond: z.number().int().min(0).max(1_000_000).default(500)
})

/** The `logger` option's level names (pino's). */
export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const

/** Every option of `createToolport` and `toolport serve`. */
export const optionsSchema = z.strictObject({
  /** Roles that exist from the start. */
  roles: z.array(roleNameSchema).superRefine((names, ctx) => {
    const twice = names.find((name, i) => names.indexOf(name) !== i)
    if (twice !== undefined) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(twice)} is named more than once` })
  }).default([]),
  /** Address `listen()` binds by default. */
  host: z.string().min(1).superRefine((host, ctx) => {
    const problem = bindHostProblem(host)
    if (problem !== undefined) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(host)} ${problem}` })
  }).default('127.0.0.1'),
  /** Port `listen()` binds by default (0 = any free port). */
  port: z.number().int().min(0).max(65_535).default(3917),
  /** A role's sync to its model sessions fails after this long. */
  syncTimeoutMs: z.number().int().min(1).max(600_000).default(10_000),
  /** Consecutive connection failures at one origin that evict its `plugin:` tools (docs/protocol.md R13). */
  evictionThreshold: z.number().int().min(1).max(1000).default(3),
  /** Serve Prometheus metrics at GET /metrics (and count them). */
  metrics: z.boolean().default(true),
  /** fastify/pino logger: false (silent), true (info) or a level name. */
  logger: z.union([z.boolean(), z.enum(LOG_LEVELS)], {
    error: `must be false, true or a pino level (${LOG_LEVELS.join(', ')})`
  }).default(false),
  /** Serve the web console at `/` and `/ui/` (static files; the API it reads is guarded as usual). */
  console: z.boolean().default(true),
  events: eventsSchema.prefault({}),
  dispatch: dispatchSchema.prefault({}),
  security: securitySchema.prefault({}),
  limits: limitsSchema.prefault({}),
  /** The MCP endpoint's bounds (`/mcp/<role>`). */
  mcp: mcpSchema.prefault({})
})

/** Options as a caller writes them (everything optional). */
export type ToolportOptions = z.input<typeof optionsSchema>
/** Options after defaults are applied. */
export type ResolvedOptions = z.output<typeof optionsSchema>
export type DispatchOptions = ResolvedOptions['dispatch']

/** Validates options and applies defaults; throws TP_ERR_CONFIG naming every bad field. */
export function parseOptions (input: unknown = {}): ResolvedOptions {
  const parsed = optionsSchema.safeParse(input ?? {})
  if (parsed.success) return parsed.data
  const problems = parsed.error.issues.map((issue) => `${issue.path.join('.') || '(root)'}: ${issue.message}`)
  throw new ConfigError(`${OPTIONS_PREFIX}${problems.join('; ')}`)
}

export { ENVIRONMENT } from './environment.js'

/**
 * Maps TOOLPORT_* variables onto an options object. A value the schema would refuse is refused
 * here, naming the variable (TP_ERR_CONFIG): the schema's message names an option path
 * (`dispatch.mode`, `roles.1`) the operator never wrote. Whether TOOLPORT_HOST may be bound (a
 * loopback address, or `security.allowNonLoopbackBind`) depends on other settings: the CLI judges
 * that once they are all read, naming the variable too.
 */
export function optionsFromEnv (env: NodeJS.ProcessEnv): Record<string, unknown> {
  const out: Record<string, unknown> = {}
  if (env.TOOLPORT_HOST !== undefined && env.TOOLPORT_HOST !== '') {
    const problem = bindHostProblem(env.TOOLPORT_HOST)
    if (problem !== undefined) throw new ConfigError(`${OPTIONS_PREFIX}TOOLPORT_HOST ${JSON.stringify(env.TOOLPORT_HOST)} ${problem}`)
    out.host = env.TOOLPORT_HOST
  }
  if (env.TOOLPORT_PORT !== undefined && env.TOOLPORT_PORT !== '') {
    // Named as the variable, as `--port` is named: the schema's own message ("expected number,
    // received string") would blame the type of a value the operator typed as a number.
    const problem = portProblem(env.TOOLPORT_PORT)
    if (problem !== undefined) throw new ConfigError(`${OPTIONS_PREFIX}TOOLPORT_PORT ${problem}`)
    out.port = Number(env.TOOLPORT_PORT)
  }
  if (env.TOOLPORT_ROLES !== undefined && env.TOOLPORT_ROLES !== '') {
    const roles = env.TOOLPORT_ROLES.split(',').map((r) => r.trim()).filter((r) => r !== '')
    // Named as the variable: the schema's path (`roles.1`) is an index into a list the operator
    // never wrote as one.
    const problem = rolesProblem(roles)
    if (problem !== undefined) throw new ConfigError(`${OPTIONS_PREFIX}TOOLPORT_ROLES ${problem}`)
    out.roles = roles
  }
  if (env.TOOLPORT_LOG_LEVEL !== undefined && env.TOOLPORT_LOG_LEVEL !== '') {
    const problem = logLevelProblem(env.TOOLPORT_LOG_LEVEL)
    if (problem !== undefined) throw new ConfigError(`${OPTIONS_PREFIX}TOOLPORT_LOG_LEVEL ${problem}`)
    out.logger = env.TOOLPORT_LOG_LEVEL
  }
  if (env.TOOLPORT_DISPATCH_MODE !== undefined && env.TOOLPORT_DISPATCH_MODE !== '') {
    const mode = env.TOOLPORT_DISPATCH_MODE
    if (!(DISPATCH_MODES as readonly string[]).includes(mode)) {
      throw new ConfigError(`${OPTIONS_PREFIX}TOOLPORT_DISPATCH_MODE must be ${DISPATCH_MODES.join(' or ')} (got ${JSON.stringify(mode)})`)
    }
    out.dispatch = { mode }
  }
  return out
}

/** Why a list of role names given as text (TOOLPORT_ROLES) is refused, or undefined. */
function rolesProblem (roles: string[]): string | undefined {
  for (const [i, name] of roles.entries()) {
    const problem = roleNameProblem(name)
    if (problem !== undefined) return `names ${JSON.stringify(name)}, which is not a role name: ${problem}`
    if (roles.indexOf(name) !== i) return `names ${JSON.stringify(name)} more than once`
  }
  return undefined
}

/** Why a port given as text (a flag, a variable) is refused, or undefined. */
export function portProblem (port: string): string | undefined {
  if (/^\d{1,5}$/.test(port) && Number(port) <= 65_535) return undefined
  return `must be a number from 0 to 65535 (got ${JSON.stringify(port)})`
}

/**
 * Why a log level given as text (a flag, a variable) is refused, or undefined. The `logger`
 * option's own message also offers `false` and `true`, which text cannot give.
 */
export function logLevelProblem (level: string): string | undefined {
  if ((LOG_LEVELS as readonly string[]).includes(level)) return undefined
  return `must be one of ${LOG_LEVELS.join(', ')} (got ${JSON.stringify(level)})`
}
