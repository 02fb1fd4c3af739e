// Ownership mode (`security.enforceOwnership`): every `source` is bound to the credential that
// first registered a tool with it, and only that credential may register, unregister or clear
// the source's tools afterwards.
//
// The credential of an API request is its plugin key (`X-Toolport-Plugin-Key`), a secret the
// plugin makes up itself. Token mode's bearer token cannot serve: every plugin of an installation
// shares it, so it tells Toolport "a client the user trusts", not "which plugin". A key chosen by
// the plugin (rather than issued by Toolport) lets a plugin register its tools concurrently
// without a race for who gets the key, and lets a plugin that keeps its key (in a 0600 file, as
// the token) take its source back after a restart. The embedding host, calling the library
// without a key, owns every source (it runs the process; it could change the registry anyway).
//
// Only a SHA-256 digest of a key is kept. A binding ends when the source has no tool left in
// any role (its owner cleared it, the tools were unregistered or evicted): the source is then
// free again, as a free tool name is.
import { createHash, timingSafeEqual } from 'node:crypto'
import { NotOwnerError, PluginKeyRequiredError } from './errors.js'

/** The request header that carries a plugin key. */
export const PLUGIN_KEY_HEADER = 'x-toolport-plugin-key'

/** 32–512 visible ASCII characters (no spaces): a base64url or hex secret of ≥ 192 bits fits. */
const PLUGIN_KEY_PATTERN = /^[\x21-\x7e]{32,512}$/

/** The embedding host: owns every source, and binds the sources it registers first. */
export const HOST_OWNER = Symbol('host')

/** Who asks for a change: the digest of a plugin key, or the host. */
export type Owner = Buffer | typeof HOST_OWNER

/**
 * The owner of the request: the digest of `pluginKey`, or the host when there is none.
 * Throws 401 TP_ERR_PLUGIN_KEY_REQUIRED for a malformed key.
 */
export function ownerOf (pluginKey: string | undefined): Owner {
  if (pluginKey === undefined) return HOST_OWNER
  if (!isPluginKey(pluginKey)) throw new PluginKeyRequiredError()
  return createHash('sha256').update(pluginKey).digest()
}

/** Whether `value` has the form of a plugin key. */
export function isPluginKey (value: unknown): value is string {
  return typeof value === 'string' && PLUGIN_KEY_PATTERN.test(value)
}

/** Which owner each source is bound to. */
export class SourceOwners {
  readonly #owners = new Map<string, Owner>()
  readonly #hasTools: (source: string) => boolean

  /** `hasTools(source)`: whether any role still holds a tool of that source. */
  constructor (hasTools: (source: string) => boolean) {
    this.#hasTools = hasTools
  }

  /** Whether `owner` may change the tools of `source`. */
  allows (source: string, owner: Owner): boolean {
    // Asked before a change, so a binding whose tools are all gone is released now: once the
    // change adds a tool, claim() must find the source free, not that stale binding back in force
    // (the host registering a freed source would otherwise leave it to the key that once held it).
    const bound = this.#boundOwner(source)
    if (owner === HOST_OWNER || bound === undefined) return true
    // Digests of equal length; constant time so that no timing tells how close a guess was.
    return bound !== HOST_OWNER && timingSafeEqual(bound, owner)
  }

  /** Throws 403 TP_ERR_NOT_OWNER unless `owner` may change the tools of `source`. */
  assert (source: string, owner: Owner): void {
    if (!this.allows(source, owner)) throw new NotOwnerError(source)
  }

  /** Binds `source` to `owner` if it is free. Call synchronously after `assert`, in the same turn. */
  claim (source: string, owner: Owner): void {
    if (this.#boundOwner(source) === undefined) this.#owners.set(source, owner)
  }

  /**
   * Releases the binding of `source` if it has no tool left. Call before adding a tool by a way
   * that asks no owner (a host's local tool), so that it does not bring an ended binding back.
   */
  release (source: string): void {
    this.#boundOwner(source)
  }

  /** Forgets the bindings of sources that have no tool left (an unref'd sweep calls it). */
  sweep (): void {
    for (const source of this.#owners.keys()) {
      if (!this.#hasTools(source)) this.#owners.delete(source)
    }
  }

  /** The bound owner, or undefined when the source is free (a binding without tools is released). */
  #boundOwner (source: string): Owner | undefined {
    const bound = this.#owners.get(source)
    if (bound === undefined) return undefined
    if (this.#hasTools(source)) return bound
    this.#owners.delete(source)
    return undefined
  }
}
