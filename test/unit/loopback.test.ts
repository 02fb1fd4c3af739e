// The loopback predicates (docs/protocol.md R1 peers, R2 callback URLs): every case the rule names, plus
// property tests against an oracle built independently from WHATWG `URL`, node:net and
// ipaddr.js CIDR matching.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { BlockList, isIPv4 } from 'node:net'
import fc from 'fast-check'
import ipaddr from 'ipaddr.js'
import { checkCallbackUrl, isLoopbackAddress } from '../../src/shared/loopback.js'
import { byte, loopbackV4Spelling } from '../helpers.js'

/** [input, canonical href the registry must store, origin with the port explicit] */
const ACCEPTED: Array<[string, string, string]> = [
  ['http://localhost/x', 'http://localhost/x', 'http://localhost:80'],
  ['http://LOCALHOST:9333/tools', 'http://localhost:9333/tools', 'http://localhost:9333'],
  ['https://LocalHost/', 'https://localhost/', 'https://localhost:443'],
  ['http://127.0.0.1:9333/tools/get_weather', 'http://127.0.0.1:9333/tools/get_weather', 'http://127.0.0.1:9333'],
  ['https://127.0.0.1:8443/cb?x=1', 'https://127.0.0.1:8443/cb?x=1', 'https://127.0.0.1:8443'],
  ['http://127.255.255.254/', 'http://127.255.255.254/', 'http://127.255.255.254:80'],
  ['http://127.42.0.7:1/', 'http://127.42.0.7:1/', 'http://127.42.0.7:1'],
  ['http://127.1/', 'http://127.0.0.1/', 'http://127.0.0.1:80'],
  ['http://127.0.1/', 'http://127.0.0.1/', 'http://127.0.0.1:80'],
  ['http://0x7f.0.0.1/', 'http://127.0.0.1/', 'http://127.0.0.1:80'],
  ['http://0x7f.1/', 'http://127.0.0.1/', 'http://127.0.0.1:80'],
  ['http://0x7f000001/', 'http://127.0.0.1/', 'http://127.0.0.1:80'],
  ['http://2130706433/', 'http://127.0.0.1/', 'http://127.0.0.1:80'],
  ['http://0177.0.0.1/', 'http://127.0.0.1/', 'http://127.0.0.1:80'],
  ['http://127.000.000.001/', 'http://127.0.0.1/', 'http://127.0.0.1:80'],
  ['http://[::1]:8080/cb', 'http://[::1]:8080/cb', 'http://[::1]:8080'],
  ['http://[0:0:0:0:0:0:0:1]/', 'http://[::1]/', 'http://[::1]:80'],
  ['http://[::ffff:127.0.0.1]:9/', 'http://[::ffff:7f00:1]:9/', 'http://[::ffff:7f00:1]:9'],
  ['http://[::ffff:7f00:1]/', 'http://[::ffff:7f00:1]/', 'http://[::ffff:7f00:1]:80'],
  ['http://[::FFFF:127.9.8.7]/', 'http://[::ffff:7f09:807]/', 'http://[::ffff:7f09:807]:80'],
  ['http://[0:0:0:0:0:ffff:7f00:1]/', 'http://[::ffff:7f00:1]/', 'http://[::ffff:7f00:1]:80']
]

const REFUSED: Record<string, string[]> = {
  userinfo: [
    'http://user@127.0.0.1/',
    'http://user:pass@localhost/',
    'http://:secret@localhost/',
    'http://127.0.0.1@localhost/',
    'http://localhost@evil.example/'
  ],
  'an empty host': ['http://', 'http:///', 'https://:9333/', 'http://?x', 'http://#x'],
  'the unspecified address': [
    'http://0.0.0.0:9333/', 'http://0/', 'http://[::]/', 'http://[0:0:0:0:0:0:0:0]/', 'http://[::ffff:0.0.0.0]/'
  ],
  'localhost with a trailing dot': ['http://localhost./', 'http://LOCALHOST.:80/x'],
  'a subdomain of localhost': ['http://foo.localhost/', 'http://a.b.localhost/', 'http://localhost.localhost/'],
  'an IPv6 zone id': ['http://[fe80::1%25eth0]/', 'http://[::1%25lo]/', 'http://[::1%lo]/'],
  'a scheme other than http and https': [
    'ftp://127.0.0.1/', 'ws://localhost/', 'wss://localhost/', 'file:///etc/passwd', 'javascript:alert(1)',
    'data:text/plain,x', 'gopher://127.0.0.1/', 'localhost:9333/x'
  ],
  'a non-loopback IPv4 address': [
    'http://10.0.0.1/', 'http://192.168.1.10:9333/', 'http://192.0.2.2/', 'http://8.8.8.8/', 'http://128.0.0.1/',
    'http://126.255.255.255/', 'http://169.254.169.254/', 'http://0x7e.0.0.1/', 'http://2130706432.1/'
  ],
  'a non-loopback IPv6 address': [
    'http://[::2]/', 'http://[::ffff:10.0.0.1]/', 'http://[::127.0.0.1]/', 'http://[64:ff9b::127.0.0.1]/',
    'http://[fe80::1]/', 'http://[fd00::2]/', 'http://[2001:db8::1]/', 'http://[::ffff:128.0.0.1]/'
  ],
  'a host name other than localhost': [
    'http://example.com/', 'http://localhost.example.com/', 'http://127.0.0.1.nip.io/', 'http://localhos/',
    'http://local-host/', 'http://xn--localhost-/', 'http://ip6-localhost/'
  ],
  'text that is not an absolute URL': ['', 'not a url', '/relative/path', '127.0.0.1:9333', '//127.0.0.1/x']
}

for (const [input, href, origin] of ACCEPTED) {
  test(`R2: the callback URL ${input} is accepted and stored as ${href}`, () => {
    const verdict = checkCallbackUrl(input)
    assert.ok(verdict.ok, `expected ${input} to be accepted`)
    assert.equal(verdict.parts.href, href)
    assert.equal(verdict.parts.origin, origin)
  })
}

for (const [what, inputs] of Object.entries(REFUSED)) {
  test(`R2: a callback URL with ${what} is refused`, () => {
    for (const input of inputs) {
      assert.equal(checkCallbackUrl(input).ok, false, `expected ${JSON.stringify(input)} to be refused`)
    }
  })
}

test('R2: the stored parts of an accepted URL give the path, port and scheme separately', () => {
  const verdict = checkCallbackUrl('HTTPS://LOCALHOST:8443/a/b?c=d#frag')
  assert.ok(verdict.ok)
  assert.deepEqual(verdict.parts, {
    href: 'https://localhost:8443/a/b?c=d#frag',
    origin: 'https://localhost:8443',
    path: '/a/b?c=d',
    hostname: 'localhost',
    port: 8443,
    isHttps: true
  })
})

const LOOPBACK_PEERS = [
  '127.0.0.1', '127.0.0.2', '127.255.255.255', '127.1.2.3', '::1', '0:0:0:0:0:0:0:1',
  '::ffff:127.0.0.1', '::ffff:127.200.1.1', '::ffff:7f00:1', '0:0:0:0:0:ffff:7f00:1'
]
const FOREIGN_PEERS: Array<string | undefined | null> = [
  '10.1.2.3', '192.168.0.5', '192.0.2.2', '0.0.0.0', '128.0.0.1', '126.255.255.255', '::', '::2', 'fe80::1',
  'fe80::1%eth0', '::1%lo', '::ffff:10.1.2.3', '::ffff:0.0.0.0', '::7f00:1', 'fd00::2', '64:ff9b::7f00:1',
  '127.1', '0x7f.0.0.1', '2130706433', '127.0.0.1.', 'localhost', '', 'garbage', undefined, null
]

test('R1: loopback peer addresses (127/8, ::1, ::ffff:127.0.0.0/104) are loopback', () => {
  for (const peer of LOOPBACK_PEERS) assert.equal(isLoopbackAddress(peer), true, peer)
})

test('R1: every other peer address, and an unknown or unparseable one, is not loopback', () => {
  for (const peer of FOREIGN_PEERS) assert.equal(isLoopbackAddress(peer), false, String(peer))
})

test('R1: an IPv4-compatible peer address (::127.0.0.1, i.e. ::7f00:1, outside ::ffff:127.0.0.0/104) is not loopback', () => {
  // Node's inet_ntop prints ::7f00:1 as "::127.0.0.1", so this is the spelling a socket reports.
  assert.equal(isLoopbackAddress('::7f00:1'), false)
  assert.equal(isLoopbackAddress('::127.0.0.1'), false)
  assert.equal(isLoopbackAddress('::127.1.2.3'), false)
})

// ---- Property tests ------------------------------------------------------------------------

const LOOPBACK_V4 = ipaddr.IPv4.parseCIDR('127.0.0.0/8')
const LOOPBACK_V6 = ipaddr.IPv6.parseCIDR('::1/128')
const MAPPED_LOOPBACK = ipaddr.IPv6.parseCIDR('::ffff:127.0.0.0/104')

/**
 * The oracle for a peer address: node:net's BlockList with the three ranges of docs/protocol.md R1. (Not
 * ipaddr.js: it reads the deprecated IPv4-compatible form `::a.b.c.d` as `::ffff:a.b.c.d`.)
 */
const LOOPBACK_PEER_RANGES = new BlockList()
LOOPBACK_PEER_RANGES.addSubnet('127.0.0.0', 8, 'ipv4')
LOOPBACK_PEER_RANGES.addAddress('::1', 'ipv6')
LOOPBACK_PEER_RANGES.addSubnet('::ffff:127.0.0.0', 104, 'ipv6')

function oraclePeer (address: string): boolean {
  if (isIPv4(address)) return LOOPBACK_PEER_RANGES.check(address, 'ipv4')
  if (address.includes('%')) return false
  return LOOPBACK_PEER_RANGES.check(address, 'ipv6')
}

/** An IPv6 URL host (WHATWG-canonical, so always hex, never dotted) against ipaddr.js CIDRs. */
function oracleV6Host (inner: string): boolean {
  if (!ipaddr.IPv6.isValid(inner)) return false
  const v6 = ipaddr.IPv6.parse(inner)
  return v6.match(LOOPBACK_V6) || v6.match(MAPPED_LOOPBACK)
}

/** The oracle for R2: WHATWG parsing, then the rule stated in docs/protocol.md R2, on the canonical host. */
function oracleUrl (input: string): boolean {
  let url: URL
  try {
    url = new URL(input)
  } catch {
    return false
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return false
  if (url.username !== '' || url.password !== '') return false
  // The parser drops an empty userinfo ("http://:@host"); the rule refuses any userinfo syntax.
  if (/^\s*[a-z][a-z0-9+.-]*:[/\\]*[^/\\?#]*@/i.test(input)) return false
  if (url.port === '0') return false
  const host = url.hostname
  if (host === 'localhost') return true
  if (host.startsWith('[') && host.endsWith(']')) return oracleV6Host(host.slice(1, -1))
  return isIPv4(host) && ipaddr.IPv4.parse(host).match(LOOPBACK_V4)
}

/** A purely textual check of a WHATWG-canonical hostname: is it one of the loopback forms? */
function canonicalHostIsLoopback (hostname: string): boolean {
  return hostname === 'localhost' ||
    hostname === '[::1]' ||
    /^127\.(25[0-5]|2[0-4]\d|1?\d?\d)\.(25[0-5]|2[0-4]\d|1?\d?\d)\.(25[0-5]|2[0-4]\d|1?\d?\d)$/.test(hostname) ||
    /^\[::ffff:7f[0-9a-f]{2}:[0-9a-f]{1,4}\]$/.test(hostname)
}

const mappedV6 = fc.tuple(byte, byte, byte, byte, fc.boolean()).map(([a, b, c, d, dotted]) => dotted
  ? `[::ffff:${a}.${b}.${c}.${d}]`
  : `[::ffff:${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}]`)

const localhostVariant = fc.tuple(
  fc.mixedCase(fc.constant('localhost')),
  fc.constantFrom('', '', '.', '.localhost', '.example.com', '-', '%2e'),
  fc.constantFrom('', '', 'a.', 'xn--a.', '%6c')
).map(([name, suffix, prefix]) => prefix + name + suffix)

const awkwardHost = fc.constantFrom(
  '0.0.0.0', '0', '[::]', '[::1%25lo]', '[fe80::1%25eth0]', '', '127.0.0.1.nip.io', 'localhost.localdomain',
  '[::127.0.0.1]', '[64:ff9b::7f00:1]', '%6c%6fcalhost', '127.0.0.1.', '１２７.０.０.１', '[::ffff:0:0]',
  '127.0.0.256', '127.0.0.1:80@10.0.0.1', '10.0.0.1#@127.0.0.1', '127.0.0.1\\@10.0.0.1', '[::1]:80@evil',
  '127.0.0.1%00.evil', '127.0.0.1/.evil', '[::1]]', '[[::1]]', 'localhost:0x50'
)

const anyHost = fc.oneof(
  loopbackV4Spelling,
  fc.ipV4().map(String),
  fc.ipV4Extended(),
  fc.ipV6().map((a) => `[${a}]`),
  mappedV6,
  localhostVariant,
  fc.domain(),
  awkwardHost,
  fc.string({ maxLength: 20 }),
  fc.string({ unit: 'binary', maxLength: 12 })
)

const anyUrl = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.record({
      scheme: fc.constantFrom('http', 'https', 'HTTP', 'HtTpS', 'ftp', 'ws', 'file', 'javascript', 'gopher'),
      userinfo: fc.constantFrom('', '', '', '', 'user@', 'user:pass@', ':pass@', '@', ':@', 'localhost@', '127.0.0.1@'),
      host: anyHost,
      port: fc.option(fc.integer({ min: 0, max: 70_000 })),
      path: fc.webPath()
    }).map(({ scheme, userinfo, host, port, path }) => `${scheme}://${userinfo}${host}${port === null ? '' : `:${port}`}${path}`)
  },
  { weight: 1, arbitrary: fc.webUrl({ withQueryParameters: true, withFragments: true }) },
  { weight: 1, arbitrary: fc.string({ maxLength: 40 }).map((s) => `http://${s}`) },
  { weight: 1, arbitrary: fc.string({ maxLength: 40 }) }
)

test('R2 (property): no URL whose canonical host is outside loopback is ever accepted', () => {
  fc.assert(fc.property(anyUrl, (input) => {
    const verdict = checkCallbackUrl(input)
    if (!verdict.ok) return
    const url = new URL(input)
    assert.ok(canonicalHostIsLoopback(url.hostname), `accepted ${input} whose canonical host is ${url.hostname}`)
    assert.ok(url.protocol === 'http:' || url.protocol === 'https:')
    assert.equal(url.username + url.password, '')
    assert.equal(verdict.parts.href, url.href)
  }), { numRuns: 5000 })
})

test('R2 (property): the callback-URL decision agrees with an independent URL + ipaddr.js oracle', () => {
  fc.assert(fc.property(anyUrl, (input) => {
    assert.equal(checkCallbackUrl(input).ok, oracleUrl(input), input)
  }), { numRuns: 5000 })
})

test('R2 (property): every 127/8 address in any spelling the URL parser accepts is accepted', () => {
  fc.assert(fc.property(loopbackV4Spelling, fc.constantFrom('http', 'https'), (host, scheme) => {
    assert.equal(checkCallbackUrl(`${scheme}://${host}:9333/cb`).ok, true, host)
  }))
})

test('R2 (property): an IPv4-mapped address is accepted exactly when its IPv4 part is in 127/8', () => {
  fc.assert(fc.property(mappedV6, (host) => {
    const inner = new URL(`http://${host}/`).hostname.slice(1, -1)
    const v4 = ipaddr.IPv6.parse(inner).toIPv4Address()
    assert.equal(checkCallbackUrl(`http://${host}/`).ok, v4.octets[0] === 127, host)
  }))
})

test('R1 (property): an IPv4 peer is loopback exactly when it is in 127/8', () => {
  fc.assert(fc.property(fc.ipV4(), (address) => {
    assert.equal(isLoopbackAddress(address), address.startsWith('127.'), address)
  }), { numRuns: 2000 })
})

test('R1 (property): an IPv6 peer is loopback exactly when the CIDR oracle says so', () => {
  // Half the embedded IPv4 parts start with 127, so the loopback edge is hit on every run.
  const firstOctet = fc.oneof(fc.constant(127), byte)
  const peer = fc.oneof(
    fc.ipV6(),
    fc.tuple(firstOctet, byte, byte, byte).map(([a, b, c, d]) => `::ffff:${a}.${b}.${c}.${d}`),
    fc.tuple(firstOctet, byte, byte, byte).map(([a, b, c, d]) => `::${a}.${b}.${c}.${d}`),
    fc.constantFrom('::1', '::', '0:0:0:0:0:0:0:1', '::ffff:7f00:1', '::ffff:7fff:ffff', '::ffff:8000:1')
  )
  fc.assert(fc.property(peer, (address) => {
    assert.equal(isLoopbackAddress(address), oraclePeer(address), address)
  }), { numRuns: 2000 })
})

test('a wildcard bind (0.0.0.0, ::) is announced by a loopback URL, which the Host check accepts; other hosts as they are', async () => {
  const { listeningUrl } = await import('../../src/main/toolport.js')
  assert.equal(listeningUrl('0.0.0.0', 3917), 'http://127.0.0.1:3917')
  assert.equal(listeningUrl('::', 3917), 'http://[::1]:3917')
  assert.equal(listeningUrl('0:0::0', 3917), 'http://[::1]:3917')
  assert.equal(listeningUrl('127.0.0.1', 1), 'http://127.0.0.1:1')
  assert.equal(listeningUrl('::1', 1), 'http://[::1]:1')
  assert.equal(listeningUrl('localhost', 1), 'http://localhost:1')
  assert.equal(listeningUrl('10.0.0.2', 1), 'http://10.0.0.2:1')
})
