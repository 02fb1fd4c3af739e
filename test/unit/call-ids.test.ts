// A pending call's id in the dispatcher's slot table (src/main/dispatch/dispatcher.ts):
// `generation × space + slot`, its slot read back as `id % space`, for as long as Toolport runs.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { lastGeneration, nextGeneration } from '../../src/main/dispatch/dispatcher.js'

test('call ids: every generation\'s ids are exact doubles whose slot reads back, up to the wrap, which starts again at 1', () => {
  // The slot spaces of maxPending 1 .. 1 000 000 (the option's bounds).
  for (let space = 1; space <= 2 ** 20; space *= 2) {
    // Just before the last generation whose ids are exact (2^33 calls in with 1 000 000 slots).
    const start = Math.floor(Number.MAX_SAFE_INTEGER / space) - 6
    let generation = start
    let steps = 0
    while (generation !== 1) {
      assert.ok(generation >= start, `space ${space}: went from ${start} to ${generation}`)
      for (const slot of new Set([0, 1 % space, space - 1])) {
        const id = generation * space + slot
        assert.ok(Number.isSafeInteger(id), `space ${space}, generation ${generation}: id ${id}`)
        assert.equal(id % space, slot, `space ${space}, generation ${generation}`)
      }
      generation = nextGeneration(generation, lastGeneration(space))
      assert.ok(++steps <= 6, `space ${space}: no wrap by generation ${generation}`)
    }
    assert.equal(nextGeneration(1, lastGeneration(space)), 2)
  }
})
