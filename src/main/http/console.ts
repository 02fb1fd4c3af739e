// The web console: static files at `/` and `/ui/`, served from the package itself (no CDN, works
// offline). The page is plain HTML, CSS and ES modules; uPlot (charts) and eventsource-parser
// (the SSE parser) are served from their installed packages, never copied into this repository.
//
// The page's files hold no data and no secret, so in token mode they are served without the
// token (the page then asks for it and sends it on every API request); every other check of the
// guard (loopback peer, Host, Origin) applies to them as to any route. A strict
// Content-Security-Policy allows scripts, styles and connections to this origin only.
import { createRequire } from 'node:module'
import { dirname } from 'node:path'
import { fileURLToPath } from 'node:url'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fastifyStatic from '@fastify/static'
import { buildGuard, type GuardHook, type GuardOptions } from './guard.js'

const require = createRequire(import.meta.url)

/** The console's own files: `console/` at the package root (beside `dist/` and `src/`). */
export const CONSOLE_DIR = fileURLToPath(new URL('../../../console/', import.meta.url))

/**
 * No inline script or style, nothing from another origin; images may be data: URLs (the
 * playground shows a tool's images). `frame-ancestors 'none'` keeps the page out of frames.
 */
export const CONSOLE_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'"
].join('; ')

/** True for a GET/HEAD of the console's files (`/`, `/ui`, `/ui/…`). */
export function isConsolePath (request: FastifyRequest): boolean {
  if (request.method !== 'GET' && request.method !== 'HEAD') return false
  const url = request.url
  const query = url.indexOf('?')
  const path = query === -1 ? url : url.slice(0, query)
  return path === '/' || path === '/ui' || path.startsWith('/ui/')
}

/**
 * The guard of the standalone app, with the one exemption the console needs: in token mode its
 * static files skip the token check (the page then asks for the token and sends it to the API,
 * which still requires it). Its own-origin requests pass the shared guard's Origin rule
 * (src/main/http/guard.ts: `Origin` = `http://<Host>` once the Host check passed).
 */
export function buildAppGuard (security: GuardOptions, hasConsole: boolean): GuardHook {
  const guard = buildGuard(security)
  if (!hasConsole || security.token === undefined) return guard
  const withoutToken = buildGuard({ ...security, token: undefined })
  return function toolportAppGuard (request, reply, done): void {
    (isConsolePath(request) ? withoutToken : guard)(request, reply, done)
  }
}

/** Registers the console's routes on `app` (in their own context, so its hooks stay local). */
export function registerConsole (app: FastifyInstance): void {
  const uplotDir = dirname(require.resolve('uplot'))
  const parserDir = dirname(require.resolve('eventsource-parser'))
  app.register(async function consoleContext (child) {
    child.addHook('onSend', async function consoleHeaders (_request, reply, payload) {
      reply.header('content-security-policy', CONSOLE_CSP)
      reply.header('x-frame-options', 'DENY')
      reply.header('referrer-policy', 'no-referrer')
      reply.header('cache-control', 'no-store')
      return payload
    })
    child.register(fastifyStatic, {
      root: CONSOLE_DIR,
      prefix: '/ui/',
      // The guard's `no-store` stands: a console from an older version is never cached.
      cacheControl: false,
      etag: false,
      lastModified: false
    })
    child.register(fastifyStatic, {
      root: uplotDir,
      prefix: '/ui/vendor/uplot/',
      decorateReply: false,
      cacheControl: false,
      allowedPath: (path) => path === '/uPlot.esm.js' || path === '/uPlot.min.css'
    })
    child.get('/ui/vendor/eventsource-parser.js', { schema: { hide: true } }, function parserRoute (
      _request: FastifyRequest, reply: FastifyReply) {
      return reply.sendFile('index.js', parserDir)
    })
    child.get('/ui', { schema: { hide: true } }, function consoleRedirectRoute (_request: FastifyRequest,
      reply: FastifyReply) {
      return reply.redirect('/ui/', 301)
    })
    child.get('/', { schema: { hide: true } }, function consoleIndexRoute (_request: FastifyRequest,
      reply: FastifyReply) {
      return reply.sendFile('index.html')
    })
  })
}
