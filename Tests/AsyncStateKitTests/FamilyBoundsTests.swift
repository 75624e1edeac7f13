import AsyncStateTesting
import Testing

@testable import AsyncStateKit

/// The family's bounds hold for the family as a whole, after every write, for any weigher output and
/// any capacity.
@Suite struct FamilyBoundsTests {
    @Test func aSetTrimsTheFamilyToItsMaximumWeightAndNeverKeepsAnEntryHeavierThanIt() {
        let removals = RemovalLog()
        let family = AsyncStateFamily<Int, Int>(
            capacity: 1_000, maximumWeight: 100, weigher: { _, value in value }, clock: VirtualClock(),
            onRemoval: removals.callback)
        family.set(10, for: 1)
        family.set(10, for: 2)
        family.set(500, for: 3)  // heavier than the whole maximum: not kept, and nothing else goes for it
        #expect(family.weight == 20)
        #expect(family[3] == nil && family[1] == 10 && family[2] == 10)
        #expect(family.count == 2)
        #expect(removals.entries == ["3=500 evicted"])

        // Over the maximum by a write: others go, never the entry just written.
        family.set(60, for: 4)
        family.set(60, for: 5)
        #expect(family.weight <= 100)
        #expect(family[5] == 60)
        // A key written again, heavier: the same rule.
        family.set(90, for: 5)
        #expect(family.weight <= 100)
        #expect(family[5] == 90)
    }

    @Test func aValueTooHeavyToKeepIsAnsweredThenEvictedAndRefetchedNextTime() async throws {
        let clock = VirtualClock()
        let removals = RemovalLog()
        let calls = LockedValue(0)
        let family = AsyncStateFamily<Int, Int>(
            maximumWeight: 100, weigher: { _, value in value }, clock: clock, onRemoval: removals.callback)
        let load: @Sendable (Int) async throws -> Int = { _ in
            calls.withLock { $0 += 1 }
            return 1_000
        }
        #expect(try await family.value(for: 1, load) == 1_000)  // its callers get it
        #expect(family.count == 0 && family.weight == 0)
        #expect(removals.entries == ["1=1000 evicted"])
        #expect(try await family.value(for: 1, load) == 1_000)
        #expect(calls.withLock { $0 } == 2)
    }

    @Test func theMaximumWeightIsTheFamilysNotAShareOfEachShard() async throws {
        // The example in the article "Many keys": 100,000 entries (16 shards) and 64 MiB. An 8 MiB value is cached.
        let pages = AsyncStateFamily<Int, Int>(
            capacity: 100_000, maximumWeight: 64 << 20, weigher: { _, size in size }, clock: VirtualClock())
        pages.set(8 << 20, for: 1)
        #expect(pages[1] == 8 << 20)
        #expect(try await pages.value(for: 2) { _ in 60 << 20 } == 60 << 20)
        #expect(pages[2] == 60 << 20)  // kept; key 1 went to make room
        #expect(pages.weight == 60 << 20)

        // The default capacity (16 shards) and a maximum of 100: an entry of 10 is kept, by a write
        // or by a fetch.
        let small = AsyncStateFamily<Int, Int>(
            maximumWeight: 100, weigher: { _, value in value }, clock: VirtualClock())
        small.set(10, for: 1)
        #expect(small[1] == 10)
        #expect(try await small.value(for: 2) { _ in 10 } == 10)
        #expect(small[2] == 10)

        // Keys spread over every shard: the family never weighs more than the maximum after a write,
        // and holds exactly as much as fits.
        for key in 0..<1_000 {
            small.set(7, for: key)
            #expect(small.weight <= 100)
        }
        #expect(small.count == 14)  // 14 × 7 = 98
        #expect(small.weight == 98)
    }

    @Test func aNegativeMaximumWeightMeansZero() {
        let family = AsyncStateFamily<Int, Int>(
            maximumWeight: -5, weigher: { _, value in value }, clock: VirtualClock())
        family.set(0, for: 1)  // weighs nothing: kept
        family.set(1, for: 2)
        #expect(family[1] == 0 && family[2] == nil)
        #expect(family.weight == 0)
    }

    @Test func noWeigherOutputCanOverflowTheWeight() async throws {
        let removals = RemovalLog()
        let heavy = AsyncStateFamily<Int, Int>(
            capacity: 100, maximumWeight: .max, weigher: { _, _ in .max }, clock: VirtualClock(),
            onRemoval: removals.callback)
        heavy.set(1, for: 1)
        #expect(heavy.weight == .max)
        heavy.set(2, for: 2)  // twice Int.max together: one of them goes
        #expect(heavy.weight == .max)
        #expect(heavy.count == 1 && heavy[2] == 2)
        // Negative weights count as nothing, even the most negative.
        let negative = AsyncStateFamily<Int, Int>(
            maximumWeight: 10, weigher: { _, _ in .min }, clock: VirtualClock())
        for key in 0..<100 { negative.set(key, for: key) }
        #expect(negative.count == 100 && negative.weight == 0)

        // Entries that cannot be evicted (in use) may together weigh more than `Int.max`: the
        // weight saturates, and falls back once they can go.
        let clock = VirtualClock()
        let busy = AsyncStateFamily<Int, Int>(
            capacity: 100, maximumWeight: .max, weigher: { _, _ in .max }, clock: clock)
        for key in 0..<3 { busy.set(key, for: key) }
        #expect(busy.count == 1)
        let refreshes = (0..<3).map { key in
            clock.task {
                await busy.refresh(for: key) { key in
                    try await clock.sleep(for: .seconds(1))
                    return key
                }
            }
        }
        await clock.advance(by: .seconds(1))
        for refresh in refreshes { _ = await refresh.result }
        #expect(busy.weight == .max)
        #expect(busy.count == 1)
    }

    @Test func anyCapacityIsAcceptedAndAnEmptyFamilyCostsTheSameWhateverItsCapacity() async throws {
        let largest = AsyncStateFamily<Int, Int>(capacity: .max, clock: VirtualClock())
        let hundredMillion = AsyncStateFamily<Int, Int>(capacity: 100_000_000, clock: VirtualClock())
        let thousand = AsyncStateFamily<Int, Int>(capacity: 1_000, clock: VirtualClock())
        // Sixteen shards for the two large ones, one for the small one: each shard's empty buffers
        // are a few hundred bytes, whatever its capacity. (An array's capacity is what the allocator
        // gave it, which may be a little more than asked: hence the margins.)
        let empty = largest.core.bufferBytes
        #expect(abs(empty - hundredMillion.core.bufferBytes) < 1_024)
        #expect(empty < 16 * thousand.core.bufferBytes + 1_024)
        #expect(empty < 16 << 10)

        // It works, and its memory follows the entries it holds.
        for key in 0..<1_000 { largest.set(key, for: key) }
        #expect(try await largest.value(for: 1_000) { $0 } == 1_000)
        #expect(largest.count == 1_001 && largest[500] == 500)
        let perEntry = (largest.core.bufferBytes - empty) / 1_001
        #expect(perEntry < 512)
    }
}
