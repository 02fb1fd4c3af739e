// createToolport: a Runtime plus its HTTP server.
import type { FastifyInstance } from 'fastify'
import type { AddressInfo } from 'node:net'
import { Runtime } from './runtime.js'
import { buildApp } from './http/app.js'
import { bindHostProblem, unbracket, type ToolportOptions } from './config.js'
import { isIPv4MappedAddress, isLoopbackAddress, isUnspecifiedAddress } from '../shared/loopback.js'
import { ClosedError, ConfigError } from './errors.js'
import { kDispatchReady } from './symbols.js'
import { answersSent } from './http/tools.js'
import { describeValue, noop } from '../shared/util.js'

export interface ListenOptions {
  /** Address to bind (default: the `host` option, 127.0.0.1). */
  host?: string | undefined
  /** Port (default: the `port` option; 0 = any free port). */
  port?: number | undefined
}

export interface ListenResult {
  /** `http://host:port` with the real port. */
  url: string
  host: string
  port: number
}

/**
 * A Toolport instance: the runtime (registry, sessions, dispatch) and, on demand, its HTTP API.
 * Not listening until `listen()`; never exits the process or installs signal handlers.
 */
export class Toolport extends Runtime {
  #app: FastifyInstance | null = null
  /** The server's listen() while under way or done; null again after one that failed. */
  #listening: Promise<unknown> | null = null
  #closingAll: Promise<void> | undefined

  /** The fastify app serving the API (built on first use; `inject()` works without listening). */
  get app (): FastifyInstance {
    if (this.#app === null) this.#app = buildApp(this)
    return this.#app
  }

  /**
   * Starts the HTTP server. A non-loopback address needs `security.allowNonLoopbackBind`; bad
   * arguments (a port outside 0..65535, an IPv4-mapped IPv6 host) are TP_ERR_CONFIG.
   */
  async listen (options: ListenOptions = {}): Promise<ListenResult> {
    if (this.closed) throw new ClosedError()
    this.#assertNotListening()
    if (typeof options !== 'object' || options === null) {
      throw new ConfigError(`listen(): the argument must be an object of { host, port } (got ${describeValue(options)})`)
    }
    const given = options.host ?? this.options.host
    const port = options.port ?? this.options.port
    if (typeof given !== 'string' || given === '') {
      throw new ConfigError(`listen(): host must be a non-empty string (got ${describeValue(given)})`)
    }
    if (typeof port !== 'number' || !Number.isInteger(port) || port < 0 || port > 65_535) {
      throw new ConfigError(`listen(): port must be an integer from 0 to 65535 (got ${describeValue(port)})`)
    }
    const { host, isLoopback } = resolveBindHost(given)
    if (!isLoopback) {
      if (!this.options.security.allowNonLoopbackBind) {
        throw new ConfigError(`refusing to bind ${host}: not a loopback address (set security.allowNonLoopbackBind to allow it)`)
      }
      this.log.warn({ host }, 'binding a non-loopback address; non-loopback clients are still refused (403)')
    }
    await this[kDispatchReady]
    // close() may have begun meanwhile: it must not be left a server it does not know of.
    if (this.closed) throw new ClosedError()
    this.#assertNotListening()
    const listening = this.app.listen({ host, port, listenTextResolver: listenText(host) })
    this.#listening = listening
    try {
      await listening
    } catch (err) {
      this.#listening = null
      throw err
    }
    this.app.server.maxConnections = this.options.limits.maxConnections
    const realPort = this.#address()?.port ?? port
    return { url: listeningUrl(host, realPort), host, port: realPort }
  }

  /**
   * One server a runtime: a second listen() (fastify's FST_ERR_REOPENED_SERVER) is TP_ERR_CONFIG.
   * After a listen that failed (a port in use), another may be tried.
   */
  #assertNotListening (): void {
    if (this.#listening === null) return
    const address = this.#address()
    throw new ConfigError(`listen(): already listening${address === null ? '' : ` on ${listeningUrl(address.address, address.port)}`}; ` +
      'a runtime serves one address')
  }

  /** The address the server is bound to, once it is. */
  #address (): AddressInfo | null {
    const address = this.app.server.address()
    return typeof address === 'object' && address !== null ? address : null
  }

  /**
   * Closes the runtime, then the HTTP server (if any). The runtime first: tool calls in flight get
   * `dispatch.closeGraceMs` to finish and the rest are answered as cancelled, and the call route
   * sends those answers before the server ends event streams and MCP sessions and closes every
   * connection. Requests meanwhile are answered 503 TP_ERR_CLOSED. Every call of close() returns
   * the first one's promise.
   */
  override close (): Promise<void> {
    this.#closingAll ??= this.#closeAll()
    return this.#closingAll
  }

  async #closeAll (): Promise<void> {
    await super.close()
    if (this.#app === null) return
    await this.#listening?.catch(noop)
    // One turn for the call routes to send the answers the runtime's close gave their calls.
    await new Promise((resolve) => setImmediate(resolve))
    await answersSent(this, this.options.dispatch.closeGraceMs)
    await this.#app.close()
  }
}

/**
 * The URL a server bound to `host` answers on. A wildcard bind (`0.0.0.0`, `::`) is reached on
 * loopback: its own address is no Host the guard accepts, and no peer may use it.
 */
export function listeningUrl (host: string, port: number): string {
  const reachable = isUnspecifiedAddress(host) ? (host.includes(':') ? '::1' : '127.0.0.1') : host
  return `http://${reachable.includes(':') ? `[${reachable}]` : reachable}:${port}`
}

/**
 * fastify's info line for each address it bound. For a wildcard bind (`0.0.0.0`, `::`) fastify
 * logs every interface's address (`http://192.0.2.2:PORT`, which answers 403: docs/protocol.md R1)
 * or `http://[::]:PORT` (no address to connect to), beside the banner's loopback URL: those lines
 * name the loopback URL (listeningUrl) instead, and an interface that refuses every client is
 * named as bound, without a URL to follow.
 */
function listenText (host: string): (address: string) => string {
  if (!isUnspecifiedAddress(host)) return (address) => `Server listening at ${address}`
  return (address) => {
    let url: URL
    try {
      url = new URL(address)
    } catch {
      return `Server listening at ${address}`
    }
    const ip = unbracket(url.hostname)
    if (isLoopbackAddress(ip)) return `Server listening at ${address}`
    const reachable = listeningUrl(host, Number(url.port))
    if (isUnspecifiedAddress(ip)) return `Server listening at ${reachable} (bound to every address; non-loopback clients are refused)`
    return `Server also bound to ${ip} (${host} is every address), where non-loopback clients are refused; it answers at ${reachable}`
  }
}

/**
 * The host `listen()` binds for `given` (unbracketed, `localhost` in lower case) and whether it is
 * a loopback one; TP_ERR_CONFIG for a host it never binds, whatever the options say: one that is
 * no address (see bindHostProblem), or an IPv4-mapped one. The CLI judges its settings with it
 * before it starts anything, to name the flag or variable that gave the host.
 */
export function resolveBindHost (given: string): { host: string, isLoopback: boolean } {
  const problem = bindHostProblem(given)
  if (problem !== undefined) throw new ConfigError(`refusing to bind ${JSON.stringify(given)}: it ${problem}`)
  // An IPv6 address may come bracketed as in a URL (`[::1]`): the address is inside.
  const unbracketed = unbracket(given)
  if (isIPv4MappedAddress(unbracketed)) {
    // The guard judges the Host header `[::ffff:…]` as no loopback name (403): the URL this would
    // answer could never be served.
    throw new ConfigError(`refusing to bind ${given}: an IPv4-mapped IPv6 address; bind the IPv4 address itself (e.g. 127.0.0.1)`)
  }
  // Host names are case-insensitive (the guard compares them in lower case): `LOCALHOST` is localhost.
  const host = unbracketed.toLowerCase() === 'localhost' ? 'localhost' : unbracketed
  return { host, isLoopback: host === 'localhost' || isLoopbackAddress(host) }
}

/**
 * Creates a Toolport runtime with the given roles and options. It is not listening yet.
 *
 * @example
 * const tp = await createToolport({ roles: ['Lanlan', 'Mochi'] })
 * const { url } = await tp.listen({ port: 0 })
 */
export async function createToolport (options: ToolportOptions = {}): Promise<Toolport> {
  const tp = new Toolport(options)
  try {
    await tp[kDispatchReady]
  } catch (err) {
    await tp.close()
    throw err
  }
  return tp
}
