// The set of roles of one Runtime (`tp.roles`).
import { Role, type RoleOptions } from './role.js'
import { ClosedError, ConfigError, RoleExistsError, RoleNotFoundError } from '../errors.js'
import { kCloseRoles, kRoleClosed, kRoleRemoved } from '../symbols.js'
import { roleNameProblem } from '../config.js'

/**
 * The current roles. A role added later starts with an empty registry: a global registration
 * reaches only the roles that exist when it is handled (docs/protocol.md R4).
 *
 * @example
 * tp.roles.add('Nova'); tp.roles.names() // [..., 'Nova']
 */
export class RoleManager {
  readonly #roles = new Map<string, Role>()
  readonly #options: RoleOptions

  #isClosed = false

  constructor (options: RoleOptions) {
    this.#options = options
  }

  /** The runtime closed: every role's sync in flight ends, and no role is added any more. */
  [kCloseRoles] (): void {
    this.#isClosed = true
    for (const role of this.#roles.values()) role[kRoleClosed]()
  }

  /** Creates a role; throws TP_ERR_ROLE_EXISTS when it exists, TP_ERR_CLOSED once the runtime closed. */
  add (name: string): Role {
    if (this.#isClosed) throw new ClosedError()
    const problem = roleNameProblem(name)
    if (problem !== undefined) throw new ConfigError(`role name: ${problem}`)
    if (this.#roles.has(name)) throw new RoleExistsError(name)
    const role = new Role(name, this.#options)
    this.#roles.set(name, role)
    if (this.#options.events.listenerCount('role-added') > 0) this.#options.events.emit('role-added', { role: name })
    return role
  }

  /**
   * Removes a role and its registry; true when it existed. Its sessions are dropped (the MCP
   * endpoint ends its MCP sessions on the `role-removed` event; a Realtime adapter closes on its
   * next server event).
   */
  remove (name: string): boolean {
    const role = this.#roles.get(name)
    if (role === undefined) return false
    this.#roles.delete(name)
    role[kRoleRemoved]()
    if (this.#options.events.listenerCount('role-removed') > 0) {
      this.#options.events.emit('role-removed',
        { role: name })
    }
    return true
  }

  /** The role, or TP_ERR_ROLE_NOT_FOUND (HTTP 404). */
  get (name: string): Role {
    const role = this.#roles.get(name)
    if (role === undefined) throw new RoleNotFoundError(name)
    return role
  }

  /** The role, or undefined. */
  find (name: string): Role | undefined {
    return this.#roles.get(name)
  }

  has (name: string): boolean {
    return this.#roles.has(name)
  }

  /** Role names in creation order. */
  names (): string[] {
    return [...this.#roles.keys()]
  }

  /** Roles in creation order. */
  list (): Role[] {
    return [...this.#roles.values()]
  }

  get size (): number { return this.#roles.size }
}
