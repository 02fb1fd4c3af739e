// The connector of every callback socket: `localhost` resolves to loopback only, and a socket whose
// peer is not a loopback address is destroyed before any byte is written (docs/protocol.md R1, R2 at call
// time). Shared by both threads: the workers use it in pool mode, the main thread inline.
import type { LookupAddress, LookupOptions } from 'node:dns'
import type { Socket } from 'node:net'
import { buildConnector } from 'undici'
import { createLocalhostV6Ports, isLoopbackAddress } from './loopback.js'

// Every error our connector hands to undici. undici passes the same object to the request's
// handler, so membership proves the failure happened before a connection existed, whatever the
// code (TLS certificate errors alone have dozens of codes).
const connectErrors = new WeakSet<Error>()

/** True for an error this connector reported: no connection was ever established. */
export function isConnectError (err: unknown): boolean {
  return err instanceof Error && connectErrors.has(err)
}

/** A socket whose peer is not a loopback address; destroyed before any byte was written. */
class PeerNotLoopbackError extends Error {
  readonly code = 'TP_PEER_NOT_LOOPBACK'
  constructor (address: string | undefined) {
    super(`connected peer ${address ?? '(unknown)'} is not a loopback address`)
    this.name = 'PeerNotLoopbackError'
  }
}

const LOOPBACK_V4: LookupAddress = { address: '127.0.0.1', family: 4 }
const LOOPBACK_V6: LookupAddress = { address: '::1', family: 6 }
const V4_FIRST: readonly LookupAddress[] = [LOOPBACK_V4, LOOPBACK_V6]
const V6_FIRST: readonly LookupAddress[] = [LOOPBACK_V6, LOOPBACK_V4]

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void
type Lookup = (hostname: string, options: LookupOptions, callback: LookupCallback) => void

/**
 * The resolver of every callback socket: `localhost` is 127.0.0.1 and ::1 (RFC 6761 §6.3), so a
 * hosts file or DNS answer can never point a callback elsewhere, and nothing else resolves (IP
 * literals never reach a lookup). `both` is the order the two are tried in. net calls it with
 * `all: true` when it races address families (autoSelectFamily) and without it otherwise; both
 * forms are answered. Always asynchronous, as dns.lookup is, so net sees the callback timing it was
 * written for.
 */
function pinnedLookup (both: readonly LookupAddress[]): Lookup {
  return function lookupLoopback (hostname, options, callback) {
    if (hostname !== 'localhost') {
      const err: NodeJS.ErrnoException = new Error(`refusing to resolve ${hostname}: only localhost is resolved`)
      err.code = 'ENOTFOUND'
      process.nextTick(callback, err, '', 0)
      return
    }
    const family = options.family as number | string | undefined
    const addresses = family === 4 || family === 'IPv4'
      ? [LOOPBACK_V4]
      : family === 6 || family === 'IPv6' ? [LOOPBACK_V6] : both
    if (options.all === true) {
      process.nextTick(callback, null, addresses.slice())
    } else {
      const first = addresses[0] as LookupAddress
      process.nextTick(callback, null, first.address, first.family)
    }
  }
}

function failConnect (callback: buildConnector.Callback, err: Error): void {
  connectErrors.add(err)
  callback(err, null)
}

/**
 * undici's connector with the pinned lookup, plus a peer check on the TCP socket before undici
 * sees it: a socket whose `remoteAddress` is not loopback is destroyed before any byte is written
 * (for https, before the TLS handshake starts: TCP first, then TLS over the checked socket).
 */
export function createLoopbackConnector (connectTimeoutMs: number,
  localhostV6Ports = createLocalhostV6Ports()): buildConnector.connector {
  // `localhost` tries 127.0.0.1 and ::1, whichever the plugin listens on: 127.0.0.1 first, and ::1
  // first for a port whose last connection was over ::1. Both loopback addresses are free sockets
  // for any local process to bind: a plugin that listens on ::1 alone must keep its calls when
  // another process binds its port on 127.0.0.1 later (SECURITY.md, no name resolution).
  const connector = (order: readonly LookupAddress[]): buildConnector.connector =>
    buildConnector({ timeout: connectTimeoutMs, lookup: pinnedLookup(order), autoSelectFamily: true })
  const connectV4First = connector(V4_FIRST)
  const connectV6First = connector(V6_FIRST)
  // The ports of `localhost` callbacks whose last connection was over ::1: 1 at the port's index.
  // Shared by every thread that calls callbacks (pool mode), so that what one learnt holds for all.
  const v6Ports = new Uint8Array(localhostV6Ports)
  return function connectLoopback (options, callback) {
    const isHttps = options.protocol === 'https:'
    // Step 1 is always plain TCP; undici's URL drops a default port, so make it explicit.
    const port = options.port === '' ? (isHttps ? '443' : '80') : options.port
    const tcpOptions = isHttps ? { ...options, protocol: 'http:', port } : options
    const isLocalhost = options.hostname === 'localhost'
    const portIndex = Number(port)
    const connectBase = isLocalhost && Atomics.load(v6Ports, portIndex) === 1 ? connectV6First : connectV4First
    connectBase(tcpOptions, function onTcp (err, socket) {
      if (err !== null) {
        failConnect(callback, err)
        return
      }
      if (!isLoopbackAddress(socket.remoteAddress)) {
        const refusal = new PeerNotLoopbackError(socket.remoteAddress)
        socket.destroy()
        failConnect(callback, refusal)
        return
      }
      if (isLocalhost) Atomics.store(v6Ports, portIndex, socket.remoteFamily === 'IPv6' ? 1 : 0)
      if (!isHttps) {
        callback(null, socket)
        return
      }
      connectBase({ ...options, httpSocket: socket as Socket }, function onTls (tlsErr, tlsSocket) {
        if (tlsErr !== null) {
          socket.destroy()
          failConnect(callback, tlsErr)
          return
        }
        callback(null, tlsSocket)
      })
    })
  }
}
