// The floors of the end-to-end scenario. `startBareProxy`: a server answering `POST /api/tools/call` over HTTP by
// calling a callback over HTTP, with no logic and on one thread. A bare node:http server that reads the
// request body (and nothing more: no routing, no guard, no JSON parsing), sends Toolport's exact
// callback request with raw undici on the same thread (`Pool.request`, the dispatch scenario's
// floor), and answers the callback's reply text as the body. Two HTTP hops, no logic: what the
// ceiling (one hop, straight to the callback server) costs twice, plus a body read. A design that
// runs the client on a second thread (Toolport's pool mode) can beat it in req/s.
// `startBareResponder`: a bare node:http server that reads the body and answers, at once, the bytes
// Toolport's call route answers for the ~100 B tool, calling nothing: what HTTP alone costs the
// thread that serves it, the floor of pool mode's main thread (whose callback calls run on a
// worker).
import { createServer, type RequestListener } from 'node:http'
import type { AddressInfo } from 'node:net'
import { once } from 'node:events'
import { Pool } from 'undici'
import { callbackBody, callbackHeaders, CONNECTIONS, ROUTES } from './clients.js'
import { SMALL_REPLY } from '../fixtures/payloads.js'
import { toolResultBody } from '../../src/main/http/tools.js'

export interface BareProxy {
  url: string
  close: () => Promise<void>
}

/** Starts the bare proxy on a loopback port; every request calls `origin`'s /small route. */
export async function startBareProxy (origin: string): Promise<BareProxy> {
  const pool = new Pool(origin, { connections: CONNECTIONS, pipelining: 1 })
  let seq = 0
  const handler: RequestListener = (req, res) => {
    req.resume()
    req.on('end', () => {
      const callId = `call_${++seq}`
      pool.request({
        method: 'POST', path: ROUTES.small, headers: callbackHeaders(callId, 60_000), body: callbackBody('small', callId)
      })
        .then(async ({ statusCode, body }) => {
          const text = await body.text()
          res.writeHead(statusCode === 200 ? 200 : 502, { 'content-type': 'application/json; charset=utf-8' })
          res.end(text)
        })
        .catch(() => {
          res.writeHead(502)
          res.end()
        })
    })
  }
  return await listen(handler, async () => { await pool.destroy() })
}

/** Starts the bare responder on a loopback port. */
export async function startBareResponder (): Promise<BareProxy> {
  // The call route's own body builder, given the result the ~100 B tool's reply maps to.
  const output = (JSON.parse(SMALL_REPLY) as { output: unknown }).output
  const answer = toolResultBody({ is_error: false, output, text: JSON.stringify(output) })
  return await listen((req, res) => {
    req.resume()
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json; charset=utf-8' })
      res.end(answer)
    })
  }, async () => {})
}

async function listen (handler: RequestListener, release: () => Promise<void>): Promise<BareProxy> {
  const server = createServer(handler)
  server.keepAliveTimeout = 65_000
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const { port } = server.address() as AddressInfo
  return {
    url: `http://127.0.0.1:${port}/api/tools/call`,
    close: async () => {
      server.closeAllConnections()
      server.close()
      await release()
    }
  }
}
