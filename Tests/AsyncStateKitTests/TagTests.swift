import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// Tags: a family's entries carry tags computed from their key and value, and `invalidate(tag:)`
/// expires exactly the entries that carry one, here and, over the bus, on every replica.
@Suite struct TagTests {
    /// A product and the category it is in: the tag comes from the value, the key's parity from the key.
    struct Product: Sendable, Equatable {
        var category: String
    }

    static func tags(_ id: Int, _ product: Product) -> [String] {
        ["category:\(product.category)", id.isMultiple(of: 2) ? "even" : "odd", "category:\(product.category)"]
    }

    static func family(
        clock: VirtualClock, capacity: Int = 10_000, log: EventLog? = nil
    ) -> AsyncStateFamily<Int, Product> {
        AsyncStateFamily<Int, Product>(
            expiry: .seconds(60), capacity: capacity, clock: clock, tags: Self.tags, name: "p", observer: log)
    }

    /// The keys of `family` among `keys` whose data is expired.
    static func expired(_ family: AsyncStateFamily<Int, Product>, among keys: Range<Int>) -> [Int] {
        keys.filter { family.snapshot(for: $0)?.isExpired == true }
    }

    @Test func aTagExpiresExactlyTheEntriesThatCarryItAtRest() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let family = Self.family(clock: clock, log: log)
        for id in 0..<10 { _ = try await family.value(for: id) { Product(category: $0 < 4 ? "books" : "games") } }
        log.clear()
        #expect(family.invalidate(tag: "category:books") == 4)
        #expect(Self.expired(family, among: 0..<10) == [0, 1, 2, 3])
        #expect(log.all.filter { $0.hasSuffix("invalidated") }.count == 4)
        #expect(log.all.last == "p invalidatedTag(category:books, 4 entries)")
        // A tag from the key, across categories.
        #expect(family.invalidate(tag: "odd") == 5)
        #expect(Self.expired(family, among: 0..<10) == [0, 1, 2, 3, 5, 7, 9])
        // The next read refetches only what was expired.
        let calls = LockedValue(0)
        for id in 0..<10 {
            _ = try await family.value(for: id) { _ in
                calls.withLock { $0 += 1 }
                return Product(category: "games")
            }
        }
        #expect(calls.withLock { $0 } == 7)
    }

    @Test func aTagNoEntryCarriesAndAFamilyWithoutTagsChangeNothing() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let family = Self.family(clock: clock, log: log)
        _ = try await family.value(for: 1) { _ in Product(category: "books") }
        log.clear()
        #expect(family.invalidate(tag: "category:toys") == 0)
        #expect(Self.expired(family, among: 0..<2) == [])
        #expect(log.all == ["p invalidatedTag(category:toys, 0 entries)"])

        let untagged = AsyncStateFamily<Int, Product>(expiry: .seconds(60), clock: clock)
        _ = try await untagged.value(for: 1) { _ in Product(category: "books") }
        #expect(untagged.invalidate(tag: "category:books") == 0)
        #expect(untagged.snapshot(for: 1)?.isExpired == false)
        #expect(untagged.core.shards[0].withLock { $0.tagIndexSizes } == (0, 0, 0))
    }

    @Test func aNewValueIsTaggedAgain() async throws {
        let clock = VirtualClock()
        let family = Self.family(clock: clock)
        _ = try await family.value(for: 1) { _ in Product(category: "books") }
        family.set(Product(category: "games"), for: 1)
        #expect(family.invalidate(tag: "category:books") == 0)
        #expect(family.invalidate(tag: "category:games") == 1)
        // A refetch that changes the value re-tags it when its use ends.
        _ = try await family.value(for: 1) { _ in Product(category: "music") }
        #expect(family.invalidate(tag: "category:games") == 0)
        #expect(family.invalidate(tag: "category:music") == 1)
    }

    @Test func aLiveEntryIsAskedForItsTagsAndOneWithAFetchInFlightIsExpiredWithIt() async throws {
        let clock = VirtualClock()
        let family = Self.family(clock: clock)
        _ = try await family.value(for: 1) { _ in Product(category: "books") }
        _ = try await family.value(for: 2) { _ in Product(category: "games") }
        // A subscriber keeps entry 1 live; its value changes in its store, out of the index's sight.
        let updates = family.updates(for: 1)
        defer { withExtendedLifetime(updates) {} }
        family.set(Product(category: "music"), for: 1)
        #expect(family.invalidate(tag: "category:books") == 0)
        #expect(family.invalidate(tag: "category:music") == 1)
        #expect(family.snapshot(for: 1)?.isExpired == true)
        // Entry 2 is fetching a value that will carry the tag: the fetch lands already expired.
        family.invalidate(2)
        let fetch = clock.task {
            try await family.value(for: 2) { _ in
                try await clock.sleep(for: .seconds(1))
                return Product(category: "toys")
            }
        }
        await clock.advance(by: .zero)
        #expect(family.invalidate(tag: "category:toys") == 1)
        await clock.advance(by: .seconds(1))
        #expect(try await fetch.value == Product(category: "toys"))
        #expect(family.snapshot(for: 2)?.isExpired == true)
    }

    @Test func removedEvictedAndClearedEntriesLeaveTheIndex() async throws {
        let clock = VirtualClock()
        let family = Self.family(clock: clock, capacity: 4)
        for id in 0..<20 { _ = try await family.value(for: id) { _ in Product(category: "books") } }
        #expect(family.count <= 4)
        let sizes = family.core.shards[0].withLock { $0.tagIndexSizes }
        #expect(sizes.filed == family.count && sizes.live == 0)
        #expect(family.invalidate(tag: "category:books") == family.count)
        for id in 0..<20 { family.remove(id) }
        #expect(family.core.shards[0].withLock { $0.tagIndexSizes } == (0, 0, 0))
        for id in 0..<3 { family.set(Product(category: "games"), for: id) }
        family.removeAll()
        #expect(family.core.shards[0].withLock { $0.tagIndexSizes } == (0, 0, 0))
        #expect(family.invalidate(tag: "category:games") == 0)
    }

    @Test func invalidateAllExpiresEveryEntry() async throws {
        let clock = VirtualClock()
        let family = Self.family(clock: clock)
        for id in 0..<5 { _ = try await family.value(for: id) { _ in Product(category: "books") } }
        family.invalidateAll()
        #expect(Self.expired(family, among: 0..<5) == [0, 1, 2, 3, 4])
    }

    @Test func aTagMessageIsSignedAndReadBackAndAnOldMessageIsSignedAsBefore() throws {
        let tagged = AsyncStateInvalidation(topic: "products", tag: "category:books")
        #expect(try AsyncStateInvalidation(payload: tagged.payload()) == tagged)
        #expect(tagged.description == "products#category:books")
        #expect(tagged.signedContent == "8:products-#14:category:books")
        // Without a tag, the content (and so every signature) is what it was before tags.
        #expect(AsyncStateInvalidation(topic: "products", key: "1").signedContent == "8:products1:1")
        #expect(
            AsyncStateInvalidation(topic: "t", key: "a#1:b").signedContent
                != AsyncStateInvalidation(topic: "t", key: "a", tag: "b").signedContent)
        #expect(try AsyncStateInvalidation(payload: #"{"topic":"products"}"#).tag == nil)
    }

    @Test func aTagInvalidationReachesEveryReplica() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        var replicas: [(AsyncStateInvalidator, AsyncStateFamily<Int, Product>, Task<Void, Never>)] = []
        for _ in 0..<3 {
            let bus = network.bus()
            let invalidator = AsyncStateInvalidator(bus: bus, invalidateAllInterval: .zero)
            let family = Self.family(clock: clock)
            invalidator.subscribe(family, to: "products")
            let runner = Task { await invalidator.run() }
            _ = await soon { bus.listenerCount == 1 && invalidator.deliveriesApplied == 1 }
            for id in 0..<4 { _ = try await family.value(for: id) { Product(category: $0 < 2 ? "books" : "games") } }
            replicas.append((invalidator, family, runner))
        }
        try await replicas[0].0.invalidate("products", tag: "category:games")
        #expect(Self.expired(replicas[0].1, among: 0..<4) == [2, 3])  // at once on the writer
        #expect(await soon { replicas.allSatisfy { Self.expired($0.1, among: 0..<4) == [2, 3] } })
        for replica in replicas { replica.2.cancel() }
    }
}
