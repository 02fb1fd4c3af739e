// The typed events a Runtime emits for embedding hosts.
import type { EventEmitter } from 'node:events'
import type { OutcomeKind } from '../workers/protocol.js'

/**
 * Emitted, under this symbol (not one of ToolportEvents), once the synchronous part of a registry
 * change is done: a register, unregister or clear, a local tool's change. The event stream groups
 * that change's `tool-registered`/`tool-removed` events into its own events here; without it,
 * concurrent changes that resume in one run of microtasks (registrations waiting on one schema
 * compile) were merged and published out of order.
 */
export const kChangeEnd = Symbol('toolport.changeEnd')

/** Emits `kChangeEnd` on `events` when someone listens. */
export function emitChangeEnd (events: EventEmitter<ToolportEvents>): void {
  const emitter = events as unknown as EventEmitter
  if (emitter.listenerCount(kChangeEnd) > 0) emitter.emit(kChangeEnd)
}

/** Why a tool left a role's registry. */
export type RemovalReason = 'unregister' | 'clear' | 'evicted' | 'replaced' | 'local'

export interface ToolRegisteredEvent {
  role: string
  name: string
  source: string
  isRemote: boolean
  /** `scheme://host:port` of the callback; '' for a local tool. */
  origin: string
}
export interface ToolRemovedEvent {
  role: string
  name: string
  source: string
  reason: RemovalReason
  /** `scheme://host:port` of the callback; '' for a local tool. */
  origin: string
}
export interface OriginEvictedEvent {
  /** `scheme://host:port` of the callbacks that failed. */
  origin: string
  /** Names of the `plugin:` tools removed. */
  tools: string[]
  /** Roles that lost at least one tool. */
  roles: string[]
  /** Consecutive connection-level failures that triggered it. */
  failures: number
}
export interface CallFinishedEvent {
  role: string
  name: string
  callId: string
  outcome: OutcomeKind | 'invalid_arguments' | 'check_budget' | 'unknown_tool' | 'local_error'
  isError: boolean
  durationMs: number
  /** The tool's `source`; '' when the name matched no tool. */
  source: string
  /** Bytes of callback reply read; 0 for local tools and calls that never reached a callback. */
  bytes: number
}
export interface SyncFailedEvent { role: string, error: string }
/** Every sync that ran (the role had sessions), once, however many mutations shared it. */
export interface SyncFinishedEvent {
  role: string
  ok: boolean
  error: string
  durationMs: number
  sessions: number
  /** Sessions that did not take the tools (0 when `ok`). */
  failures?: number
}

/** A role was created or removed (`tp.roles.add` / `tp.roles.remove`). */
export interface RoleChangedEvent { role: string }

/** Event name → listener arguments, for `EventEmitter<ToolportEvents>`. */
export interface ToolportEvents {
  'tool-registered': [ToolRegisteredEvent]
  'tool-removed': [ToolRemovedEvent]
  'origin-evicted': [OriginEvictedEvent]
  'call-finished': [CallFinishedEvent]
  'sync-failed': [SyncFailedEvent]
  'sync-finished': [SyncFinishedEvent]
  'role-added': [RoleChangedEvent]
  'role-removed': [RoleChangedEvent]
}
