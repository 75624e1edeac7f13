import AsyncStateTesting
import Testing

@testable import AsyncStateKit

/// The family's policy sizes its admission window from its mistakes (``EvictionHistory``): it grows
/// on traffic that a recency cache serves best and shrinks back on traffic that a frequency cache
/// does, and the history it learns from agrees with a plain reference.
@Suite struct AdaptiveWindowTests {
    /// A family of `capacity` entries on a virtual clock (nothing expires during a test).
    static func family(capacity: Int) -> AsyncStateFamily<Int, Int> {
        AsyncStateFamily(expiry: .seconds(1_000_000), capacity: capacity, clock: VirtualClock())
    }

    /// The window's limit of the family's only shard.
    static func window(of family: AsyncStateFamily<Int, Int>) -> Int {
        family.core.shards[0].withLock { $0.policy.windowLimit }
    }

    /// Uses `keys` in order, each as a cache's caller would (a hit if the family holds it, else a write
    /// of its value: the miss path without an operation, so that the test is quick); returns the hits.
    static func replay(_ keys: some Sequence<Int>, on family: AsyncStateFamily<Int, Int>) -> Int {
        var hits = 0
        for key in keys {
            if family[key] != nil { hits += 1 }
            family.set(key, for: key)
        }
        return hits
    }

    /// Each key asked twice, the second time 10 new keys later, and never again.
    static func askedTwice(_ count: Int, distance: Int = 10) -> [Int] {
        var keys: [Int] = []
        for n in 0..<count {
            keys.append(n)
            if n >= distance { keys.append(n - distance) }
        }
        return keys
    }

    /// On ``askedTwice(_:distance:)``, an LRU of 200 entries hits every second request; a window of
    /// 1 % (2 entries) would refuse each key before its second request. The window grows past the
    /// distance, and the family hits as an LRU does.
    @Test func theWindowGrowsOnRecencyTraffic() {
        let family = Self.family(capacity: 200)
        #expect(Self.window(of: family) == 2)
        let keys = Self.askedTwice(10_000)
        _ = Self.replay(keys.prefix(2_000), on: family)  // full, and learning
        let hits = Self.replay(keys.dropFirst(2_000), on: family)
        #expect(Self.window(of: family) > 10)
        #expect(Double(hits) / Double(keys.count - 2_000) > 0.48)
    }

    /// Then a hot set of 190 keys asked again and again, each request followed by a key asked once
    /// (a scan): a window of more than 10 entries leaves main too small for the hot keys, and the scan
    /// pushes them out. It shrinks back, and the hot keys stay: the family hits on nearly every hot
    /// request.
    @Test func theWindowShrinksBackOnFrequencyTraffic() {
        let family = Self.family(capacity: 200)
        _ = Self.replay(Self.askedTwice(10_000), on: family)
        let grown = Self.window(of: family)
        #expect(grown > 10)

        var random = FamilyModelTests.Random(state: 7)
        var keys: [Int] = []
        for step in 0..<40_000 { keys.append(step % 2 == 0 ? random.next(190) : 1_000_000 + step) }
        _ = Self.replay(keys.prefix(20_000), on: family)
        let hits = Self.replay(keys.dropFirst(20_000), on: family)
        #expect(Self.window(of: family) <= 10)
        #expect(Double(hits) / Double(10_000) > 0.9)  // every hit is a hot key's: 10,000 hot requests
    }

    /// The history against a reference: each side keeps the keys of its last `limit` evictions, a
    /// key taken back says its side once and is forgotten, and a key remembered again counts from its
    /// latest eviction only.
    @Test(arguments: [1, 3, 16])
    func theHistoryAgreesWithAReference(limit: Int) {
        var history = EvictionHistory(limit: limit)
        // Each side's last `limit` evictions, oldest first; `nil` where the key was taken back or
        // evicted again since.
        var refused: [Int?] = []
        var displaced: [Int?] = []
        func forget(_ key: Int) {
            refused = refused.map { $0 == key ? nil : $0 }
            displaced = displaced.map { $0 == key ? nil : $0 }
        }
        var random = FamilyModelTests.Random(state: UInt64(limit))
        // Few distinct hashes, so that keys come back while remembered, and on the other side.
        func hash(_ n: Int) -> Int { Int(bitPattern: UInt(n) &* 0x9E37_79B9_7F4A_7C15) }
        var takenBack = (refused: 0, displaced: 0)
        for step in 0..<5_000 {
            let key = hash(random.next(limit * 4 + 2))
            if random.next(3) == 0 {
                let expected: Bool? = refused.contains(key) ? true : displaced.contains(key) ? false : nil
                let answer = history.takeBack(key)
                #expect(answer == expected, "step \(step)")
                if answer == true { takenBack.refused += 1 }
                if answer == false { takenBack.displaced += 1 }
                forget(key)
            } else {
                let isRefused = random.next(2) == 0
                history.remember(key, refused: isRefused)
                forget(key)
                if isRefused {
                    refused = Array((refused + [key]).suffix(limit))
                } else {
                    displaced = Array((displaced + [key]).suffix(limit))
                }
            }
        }
        // Both sides were exercised.
        #expect(takenBack.refused > 50 && takenBack.displaced > 50)
    }
}
