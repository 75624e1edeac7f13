import AsyncStateTesting
import Testing

@testable import AsyncStateKit

/// The family's internals that its hit path relies on: the slot index, the read buffer and the idle
/// heap, each checked against a plain reference on long seeded sequences.
@Suite struct FamilyIndexTests {
    /// Inserts, finds and removes against a dictionary, with hashes drawn from few values so that
    /// long probe runs, wrap-arounds at the table's end and backward shifts all happen.
    @Test(arguments: [1, 7, 1_000])
    func theSlotIndexAgreesWithADictionary(distinctHashes: Int) {
        var random = FamilyModelTests.Random(state: UInt64(distinctHashes))
        var index = SlotIndex()
        var reference: [Int32: Int] = [:]  // slot -> hash
        var live: [Int32] = []
        var nextSlot: Int32 = 0
        // A hash's upper half is what the index keeps; spread the few values over it.
        func hash(_ n: Int) -> Int { Int(bitPattern: UInt(n) &* 0x9E37_79B9_7F4A_7C15) }
        for step in 0..<4_000 {
            if reference.isEmpty || random.next(3) != 0 {
                let h = hash(random.next(distinctHashes))
                index.insert(h, slot: nextSlot)
                reference[nextSlot] = h
                live.append(nextSlot)
                nextSlot += 1
            } else {
                let position = random.next(live.count)
                let slot = live[position]
                live.swapAt(position, live.count - 1)
                live.removeLast()
                index.remove(reference[slot]!, slot: slot)
                reference[slot] = nil
            }
            #expect(index.count == reference.count)
            if step % 97 == 0 || step > 3_950 {
                for (slot, h) in reference {
                    #expect(index.find(h) { $0 == slot } == slot, "step \(step)")
                }
                #expect(index.find(hash(distinctHashes + 1)) { _ in true } == nil)
            }
        }
        // Removing a slot the index does not hold changes nothing.
        let count = index.count
        index.remove(hash(0), slot: nextSlot + 5)
        #expect(index.count == count)
    }

    /// More than a read buffer's worth of hits between two new entries, and more than a batch: the
    /// hits the policy drops still count for idle expiry, whose instants stay exact for every key.
    @Test func idleExpiryIsExactForEveryKeyWhateverTheHitsBetween() async throws {
        let clock = VirtualClock()
        let removals = LockedValue<[(key: Int, at: Duration)]>([])
        let idle = Duration.seconds(10)
        let family = AsyncStateFamily<Int, Int>(
            expiry: .seconds(3_600), capacity: 10_000, idleExpiry: idle, clock: clock,
            onRemoval: { key, _, reason in
                #expect(reason == .idle)
                removals.withLock { $0.append((key, clock.now.offset)) }
            })
        var random = FamilyModelTests.Random(state: 0x1d1e)
        var lastUse: [Int: Duration] = [:]
        var removed = 0
        for round in 0..<400 {
            let now = clock.now.offset
            for _ in 0..<random.next(300) {
                let key = random.next(300)
                if lastUse[key] == nil {
                    family.set(key, for: key)  // a new entry
                } else {
                    #expect(try await family.value(for: key) { _ in -1 } == key)  // a hit
                }
                lastUse[key] = now
            }
            await clock.advance(by: .milliseconds(100 * (1 + random.next(40))))
            // Every removal came exactly `idle` after the key's last use; every key idle by now went.
            for removal in removals.withLock({ log in
                defer { log = [] }
                return log
            }) {
                #expect(lastUse[removal.key].map { $0 + idle } == removal.at, "round \(round), key \(removal.key)")
                lastUse[removal.key] = nil
                removed += 1
            }
            #expect(!lastUse.values.contains { $0 + idle <= clock.now.offset }, "round \(round)")
            #expect(family.count == lastUse.count, "round \(round)")
        }
        await clock.advance(by: idle)
        #expect(family.count == 0)
        #expect(removed > 1_000)
    }
}
