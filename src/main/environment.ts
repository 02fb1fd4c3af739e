// The TOOLPORT_* environment variables, by what each sets: a module of its own so the CLI's
// usage text does not load the option schema (zod) to print them.

/** Environment variables the CLI reads, and the option each one sets. */
export const ENVIRONMENT = Object.freeze({
  TOOLPORT_HOST: 'host',
  TOOLPORT_PORT: 'port',
  TOOLPORT_ROLES: 'roles (comma-separated)',
  TOOLPORT_CONFIG: 'a JSON options file',
  TOOLPORT_LOG_LEVEL: 'logger',
  TOOLPORT_DISPATCH_MODE: 'dispatch.mode',
  TOOLPORT_TOKEN_FILE: 'security.token, read from this file (CLI only)',
  TOOLPORT_URL: 'the server `toolport mcp` bridges to (default http://127.0.0.1:3917)'
} as const)
