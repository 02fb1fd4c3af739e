// The slice of autocannon 8's programmatic API the bench uses (the package ships no types).
declare module 'autocannon' {
  import type { EventEmitter } from 'node:events'

  interface AutocannonOptions {
    url: string
    connections?: number
    duration?: number
    amount?: number
    maxOverallRequests?: number
    timeout?: number
    pipelining?: number
    method?: string
    headers?: Record<string, string>
    body?: string
    /** The requests each connection cycles through; `setupRequest` may rewrite one before it is sent. */
    requests?: AutocannonRequest[]
  }

  interface AutocannonRequest {
    method?: string
    path?: string
    headers?: Record<string, string>
    body?: string
    setupRequest?: (request: AutocannonRequest) => AutocannonRequest
  }

  interface Percentiles {
    average: number
    mean: number
    min: number
    max: number
    total: number
    p50: number
    p99: number
  }

  interface AutocannonResult {
    requests: Percentiles & { sent: number }
    latency: Percentiles
    duration: number
    start: Date
    finish: Date
    errors: number
    timeouts: number
    non2xx: number
    resets: number
    statusCodeStats: Record<string, { count: number }>
  }

  interface Instance extends EventEmitter {
    stop: () => void
  }

  type Callback = (err: Error | null, result: AutocannonResult) => void

  function autocannon (options: AutocannonOptions, callback: Callback): Instance

  export default autocannon
  export type { AutocannonOptions, AutocannonResult, Instance }
}
