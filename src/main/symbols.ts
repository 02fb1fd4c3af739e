// Keys of the internals that other modules of Toolport (the CLI, the observer) and the tests reach
// on the public classes. Symbol keys keep them off the documented surface and out of autocomplete,
// as fastify's lib/symbols.js and undici's lib/core/symbols.js do; they are not exported from the
// library entry, so they may change in any release.

/** `Runtime[kOriginFailures](origin)`: consecutive connection failures counted at an origin now. */
export const kOriginFailures = Symbol('toolport.originFailures')
/** `Runtime[kWorkerThreads]`: the dispatch pool's worker threads (empty in inline mode). */
export const kWorkerThreads = Symbol('toolport.workerThreads')
/** `Runtime[kPendingCalls]`: calls admitted and not yet answered by a callback. */
export const kPendingCalls = Symbol('toolport.pendingCalls')
/** `Runtime[kDispatchMode]`: the dispatch mode in use, `'pool'` or `'inline'`. */
export const kDispatchMode = Symbol('toolport.dispatchMode')
/**
 * `Runtime[kDispatchReady]`: resolves when calls can be sent without waiting (inline mode loads
 * its client's module first; see `loadInlineClient`).
 */
export const kDispatchReady = Symbol('toolport.dispatchReady')
/** `Role[kSyncCount]`: syncs the role started so far (sessions present). */
export const kSyncCount = Symbol('toolport.syncCount')
/**
 * `Role[kRoleClosed]()`: the runtime closed; the role takes no local tool, its sync in flight ends
 * as failed (its sessions' signal aborts) and no later sync pushes to its sessions.
 */
export const kRoleClosed = Symbol('toolport.roleClosed')
/** `Role[kRoleRemoved]()`: the role left its runtime; a reference kept to it takes nothing more. */
export const kRoleRemoved = Symbol('toolport.roleRemoved')
/**
 * `event[kFromRemovedRole]`: set (true) on a `call-finished` event whose call began in a role that
 * was removed before it ended, also when a role of that name exists again: its per-role series
 * (metrics) must not count it under the new role.
 */
export const kFromRemovedRole = Symbol('toolport.fromRemovedRole')
/** `RoleManager[kCloseRoles]()`: the runtime closed; every role's sync ends and no role is added. */
export const kCloseRoles = Symbol('toolport.closeRoles')
/**
 * `Runtime[kOnClose](hook)`: runs `hook` once the runtime has closed (its calls answered), also
 * when a host's app stays up; returns a function that removes it.
 */
export const kOnClose = Symbol('toolport.onClose')
/**
 * `Runtime[kRefuseCall](role, name, message)`: answers a call of a known tool that its caller's
 * own bounds refused (an MCP session's call limits) as `busy`, counted and reported like any call.
 */
export const kRefuseCall = Symbol('toolport.refuseCall')
/**
 * `callTool(role, call, { [kJsonArguments]: true })`: the call's `arguments` were just read from
 * JSON (the HTTP route's body, an MCP request), so their JSON form is the value itself and is not
 * read back again (dispatch/arguments.ts).
 */
export const kJsonArguments = Symbol('toolport.jsonArguments')
