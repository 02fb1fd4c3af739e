// The logger the runtime, fastify and the CLI share.
import { pino, type DestinationStream, type Logger } from 'pino'
import type { ResolvedOptions } from './config.js'

export interface LoggerOutput {
  /** Human-readable lines through pino-pretty (the CLI uses it on a terminal). */
  pretty?: boolean
  /** Where JSON lines go (default stdout); ignored when `pretty`. */
  destination?: DestinationStream
}

/**
 * The logger of a Runtime; pino `redact` is a safety net for private data (arguments, outputs and
 * callback bodies are never logged on purpose: docs/protocol.md R14).
 *
 * @example
 * const log = createLogger('info', { pretty: process.stdout.isTTY === true })
 */
export function createLogger (setting: ResolvedOptions['logger'], output: LoggerOutput = {}): Logger {
  const level = setting === true ? 'info' : setting === false ? 'silent' : setting
  const options = {
    level,
    redact: {
      paths: ['arguments', 'raw_arguments', 'output', 'body', '*.arguments', '*.raw_arguments', '*.output', '*.body',
        'req.headers.authorization', 'req.headers.cookie'],
      censor: '[redacted]'
    }
  }
  if (output.pretty === true) {
    return pino({
      ...options,
      transport: {
        target: 'pino-pretty',
        options: {
          colorize: true,
          translateTime: 'HH:MM:ss.l',
          ignore: 'pid,hostname'
        }
      }
    })
  }
  return output.destination === undefined ? pino(options) : pino(options, output.destination)
}
