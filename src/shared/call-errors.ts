// How a failed callback call is classified and described (docs/protocol.md R13: only failures before a
// connection existed count towards eviction). Pure; shared by both threads.
import { isConnectError } from './loopback-connector.js'
import { OutcomeKind } from '../workers/protocol.js'

// Error codes that mean "no connection was ever established" (R13 counts these towards eviction).
// Errors reported by our own connector are recognised without this list (see `connectErrors`); the
// list is only a fallback, so it holds codes that cannot occur once a connection exists.
const CONNECT_CODES = new Set([
  'ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'EADDRNOTAVAIL', 'ENOTFOUND', 'EAI_AGAIN',
  'UND_ERR_CONNECT_TIMEOUT', 'TP_PEER_NOT_LOOPBACK'
])
// Errors after the request was handed to a live connection: the reply broke or was not HTTP.
const PROTOCOL_CODES = new Set([
  'UND_ERR_SOCKET', 'ECONNRESET', 'EPIPE', 'ECONNABORTED', 'ETIMEDOUT', 'EPROTO',
  'UND_ERR_RES_CONTENT_LENGTH_MISMATCH', 'UND_ERR_INFO', 'UND_ERR_NOT_SUPPORTED',
  // The reply's headers passed undici's header size limit (16 KiB by default).
  'UND_ERR_HEADERS_OVERFLOW'
])
// This process ran out of descriptors (per process, per system): only opening a socket needs one.
const NO_DESCRIPTOR_CODES = new Set(['EMFILE', 'ENFILE'])
// Out of buffers or memory: a shortage of ours when opening the connection; on a connection
// already used, the request may have been sent (then it is a broken reply, `protocol`).
const NO_BUFFER_CODES = new Set(['ENOBUFS', 'ENOMEM'])
// undici's own per-request timers; we set both to the remaining budget, so they are the deadline.
const TIMEOUT_CODES = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT'])
// The pool was destroyed under the call: only `close()` does that.
const CLOSED_CODES = new Set(['UND_ERR_DESTROYED', 'UND_ERR_CLOSED'])

const MAX_MESSAGE_CHARS = 200

function errorCode (err: unknown): string {
  // Prefer the stable `code`; fall back to the class name (undici's HTTPParserError may lack one).
  const code = (err as { code?: unknown } | null)?.code
  if (typeof code === 'string' && code !== '') return code
  const name = (err as { name?: unknown } | null)?.name
  return typeof name === 'string' && name !== '' ? name : 'ERROR'
}

/** `CODE: message`, short, single line: never a body, never a stack. */
export function describeError (err: unknown): string {
  let text = messageOf(err)
  // net's happy-eyeballs failure (`localhost` → 127.0.0.1 and ::1) is an AggregateError with an
  // empty message; its attempts say what happened.
  const attempts = (err as { errors?: unknown } | null)?.errors
  if (text === '' && Array.isArray(attempts)) text = attempts.map(messageOf).join('; ')
  const message = `${errorCode(err)}: ${text}`
  return message.length > MAX_MESSAGE_CHARS ? message.slice(0, MAX_MESSAGE_CHARS) : message
}

function messageOf (err: unknown): string {
  const raw = (err as { message?: unknown } | null)?.message
  return (typeof raw === 'string' ? raw : String(err)).replace(/\s+/g, ' ')
}

/**
 * Whether a call failed for want of Toolport's own resources before its connection existed. A
 * happy-eyeballs failure (`localhost` → 127.0.0.1 and ::1) is one error per attempt: any attempt
 * short of them counts, whatever the first attempt's code.
 */
function isOwnShortage (err: unknown, code: string): boolean {
  if (NO_DESCRIPTOR_CODES.has(code) || (NO_BUFFER_CODES.has(code) && isConnectError(err))) return true
  const attempts = (err as { errors?: unknown } | null)?.errors
  // Only net's connect fails with one error per attempt (an AggregateError): all before a connection.
  return Array.isArray(attempts) && attempts.some((attempt) => {
    const attempted = errorCode(attempt)
    return NO_DESCRIPTOR_CODES.has(attempted) || NO_BUFFER_CODES.has(attempted)
  })
}

export function classifyError (err: unknown): OutcomeKind {
  // Toolport's own shortage while opening the connection (out of file descriptors or buffers):
  // the plugin was not called and is not to blame, so it is `busy` (try again), never a
  // connection failure towards eviction.
  const code = errorCode(err)
  if (isOwnShortage(err, code)) return OutcomeKind.busy
  if (isConnectError(err)) return OutcomeKind.connect
  if (CONNECT_CODES.has(code) || code.startsWith('ERR_TLS_') || code.startsWith('ERR_SSL_')) {
    return OutcomeKind.connect
  }
  // undici's HTTPParserError has an `HPE_*` code only for some parser failures; its name is stable.
  if (PROTOCOL_CODES.has(code) || code.startsWith('HPE_') || (err as Error | null)?.name === 'HTTPParserError') {
    return OutcomeKind.protocol
  }
  if (TIMEOUT_CODES.has(code)) return OutcomeKind.timeout
  if (CLOSED_CODES.has(code)) return OutcomeKind.cancelled
  return OutcomeKind.internal
}
