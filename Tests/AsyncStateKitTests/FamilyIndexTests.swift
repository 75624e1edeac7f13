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
                index.insert(h, position: nextSlot)
                reference[nextSlot] = h
                live.append(nextSlot)
                nextSlot += 1
            } else {
                let position = random.next(live.count)
                let slot = live[position]
                live.swapAt(position, live.count - 1)
                live.removeLast()
                index.remove(reference[slot]!, position: slot)
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
        index.remove(hash(0), position: nextSlot + 5)
        #expect(index.count == count)
    }

    /// Hashes whose upper half is zero (a key type whose `hashValue` is its id, or a 32-bit `Int`)
    /// still spread over the table: no key sits far from its home bucket.
    @Test func smallHashesDoNotPileUpInOneRun() {
        var index = SlotIndex()
        for n in 0..<20_000 { index.insert(n, position: Int32(n)) }
        let distances = (0..<20_000).map { index.distance(of: $0, position: Int32($0)) }
        #expect(!distances.contains(nil))
        #expect(distances.compactMap { $0 }.max()! < 64)  // one run of all keys would reach 19,999
        for n in stride(from: 0, to: 20_000, by: 7) {
            #expect(index.find(n) { $0 == Int32(n) } == Int32(n))
        }
    }

    /// A key whose hash is its id modulo `hashes`: with few hashes, the records pile up around few
    /// homes, so that most are found through the index rather than near their home.
    struct Colliding: Hashable, Sendable {
        var id: Int
        var hashes: Int
        func hash(into hasher: inout Hasher) { hasher.combine(id % hashes) }
    }

    /// The shard's records against a dictionary, through growths of the records, removals (which
    /// move later records back), and slots and positions used again: every key's record is found,
    /// at the position its slot names, with its value; a key removed or never set is not found; and
    /// no free position lies between a record and its home, which is what lets a lookup stop at one.
    /// With three hashes the records of one hash lie in one run, most of them too far from their home
    /// to be found without the index.
    @Test(arguments: [3, Int.max])
    func everyRecordIsFoundThroughGrowthAndRemoval(hashes: Int) {
        var shard = FamilyShard<Colliding, Int>(capacity: 100_000)
        var random = FamilyModelTests.Random(state: UInt64(hashes % 1_000))
        var reference: [Colliding: Int] = [:]
        var present: [Colliding] = []
        var removed: [Colliding] = []
        func lookUp(_ key: Colliding) -> Int? {
            shard.freshValue(of: key, hash: key.hashValue, at: .zero, hitWindow: .seconds(1))
        }
        func check(_ step: Int) {
            #expect(shard.count == reference.count, "step \(step)")
            let mask = shard.table.records.count - 1
            var far = 0
            for (key, value) in reference {
                #expect(lookUp(key) == value, "step \(step), key \(key.id)")
                guard let slot = shard.slot(of: key) else { continue }
                let position = shard.table.at(Int(slot))
                let record = shard.table.records[position]
                #expect(record.key == key && record.slot == slot, "step \(step), key \(key.id)")
                let home = shard.table.index.home(SlotIndex.tag(key.hashValue), mask: mask)
                let distance = (position - home) & mask
                if distance >= RecordTable<Colliding, Int>.nearby { far += 1 }
                let gap = (0..<distance).first { shard.table.records[(home + $0) & mask].key == nil }
                #expect(gap == nil, "step \(step), key \(key.id): a free position before its record")
            }
            for key in removed.suffix(20) where reference[key] == nil {
                #expect(lookUp(key) == nil, "step \(step), removed key \(key.id)")
            }
            // Never set, with the hash of present keys when there are three.
            #expect(lookUp(Colliding(id: 1_002, hashes: hashes)) == nil)
            if hashes == 3, reference.count > 100 { #expect(far > reference.count / 2, "step \(step)") }
        }
        for step in 0..<2_000 {
            if present.isEmpty || random.next(4) != 0 {
                let key = Colliding(id: random.next(1_000), hashes: hashes)
                _ = shard.setIfCompact(step, for: key, at: .zero, date: .now, version: 0)
                if reference.updateValue(step, forKey: key) == nil { present.append(key) }
            } else {
                let position = random.next(present.count)
                let key = present[position]
                present.swapAt(position, present.count - 1)
                present.removeLast()
                #expect(shard.remove(key) != nil)
                reference[key] = nil
                removed.append(key)
            }
            if step % 401 == 0 { check(step) }
        }
        check(2_000)
        #expect(reference.count > 400)
    }

    /// With hashes spread, nearly every record is within ``RecordTable/nearby`` positions of its
    /// home, where a hit finds it without the index — also after many removals and new entries,
    /// which move records back rather than leave them where they were put (at this fill, 61 % of
    /// the positions, linear probing puts about 94 % there; when a removal only freed its position,
    /// 64 % were found so). Checked with the index emptied: what is found then was found near its
    /// home.
    @Test func aHitFindsNearlyEveryRecordWithoutTheIndex() {
        var shard = FamilyShard<Int, Int>(capacity: 100_000)
        var random = FamilyModelTests.Random(state: 61)
        var present = Array(0..<2_500)
        for key in present {
            _ = shard.setIfCompact(key, for: key, at: .zero, date: .now, version: 0)
        }
        #expect(shard.table.records.count == 4_096)
        // 10,000 removals, each followed by a new key: the fill stays the same.
        for next in 2_500..<12_500 {
            let position = random.next(present.count)
            #expect(shard.remove(present[position]) != nil)
            present[position] = next
            _ = shard.setIfCompact(next, for: next, at: .zero, date: .now, version: 0)
        }
        #expect(shard.table.records.count == 4_096)
        shard.table.index = SlotIndex()
        let found = present.filter { key in
            shard.freshValue(of: key, hash: key.hashValue, at: .zero, hitWindow: .seconds(1)) == key
        }
        #expect(found.count > 2_250)
    }

    /// A sweep over many entries used since they were placed looks at a bounded number per call and
    /// is done in several, and it places entries due soon by their last use, so the sweeper's next
    /// wake-up comes once for them all rather than once for each.
    @Test func aSweepIsBoundedPerCallAndPlacesEntriesDueSoon() {
        var shard = FamilyShard<Int, Int>(capacity: 10_000, tracksIdle: true)
        for key in 0..<5_000 {
            _ = shard.setIfCompact(key, for: key, at: .zero, date: .now, version: 0)
        }
        // Every entry used again at a different instant between 1 s and 2 s.
        for key in 0..<5_000 {
            _ = shard.freshValue(
                of: key, hash: key.hashValue, at: .milliseconds(1_000 + key / 5), hitWindow: .seconds(3_600))
        }
        // At 10 s with an idle expiry of 10 s: nothing idle (all used after 0), all placed again.
        var removed = FamilyShard<Int, Int>.Removals()
        var calls = 0
        var done = false
        while !done {
            let result = shard.removeIdle(
                accessedBy: .zero, placingUntil: .seconds(2), now: .seconds(10), budget: 1_024, into: &removed)
            #expect(result.removed == 0)
            done = result.done
            calls += 1
        }
        #expect(calls == 5)  // 5,000 entries, 1,024 a call
        #expect(removed.isEmpty)
        // The earliest is placed by its last use: the next wake-up is its idle deadline, 11 s.
        #expect(shard.oldestAccess == .milliseconds(1_000))
        #expect(shard.count == 5_000)
    }

    /// More than a read buffer's worth of hits between two new entries, and more than a batch: the
    /// hits the policy drops still count for idle expiry, whose instants stay exact for every key.
    /// Also with the shards' locks spread (as contention spreads them): hits are then noted in the
    /// stripes' buffers and folded in later, and none may be lost, or a key in use would go as idle.
    @Test(arguments: [false, true])
    func idleExpiryIsExactForEveryKeyWhateverTheHitsBetween(spread: Bool) async throws {
        let clock = VirtualClock()
        let removals = LockedValue<[(key: Int, at: Duration)]>([])
        let idle = Duration.seconds(10)
        let family = AsyncStateFamily<Int, Int>(
            expiry: .seconds(3_600), capacity: 10_000, idleExpiry: idle, clock: clock,
            onRemoval: { key, _, reason in
                #expect(reason == .idle)
                removals.withLock { $0.append((key, clock.now.offset)) }
            })
        if spread { for shard in family.core.shards { shard.spreadNow() } }
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

/// The frequency sketch: counts, saturation, halving, and the conservative update that keeps a
/// collision from inflating a counter past every key counted in it.
@Suite struct FrequencySketchTests {
    /// The counters of the key with `hash`: (word index, bit shift) for each of its four rows.
    static func counters(of hash: Int, in sketch: FrequencySketch) -> [(word: Int, shift: UInt64)] {
        let spread = KeyHash.mix(hash)
        let base = (Int(truncatingIfNeeded: spread) & sketch.blockMask) * 8
        return (0..<4).map { row in
            let (word, shift) = FrequencySketch.position(spread, row: row)
            return (base + word, shift)
        }
    }

    @Test func aKeyIsCountedUpToFifteenAndHalved() {
        var sketch = FrequencySketch(capacity: 1_000)
        for count in 1...20 {
            sketch.increment(42)
            #expect(sketch.estimate(42) == min(count, 15))
        }
        sketch.halve()
        #expect(sketch.estimate(42) == 7)
    }

    /// Many keys in a small sketch share counters. Each use raises only the key's smallest counters,
    /// so a counter never exceeds the largest estimate among the keys counted in it (a plain
    /// count-min sketch adds every key's uses to every counter it shares, and fails this).
    @Test func noCounterExceedsTheLargestEstimateOfItsKeys() {
        var sketch = FrequencySketch(capacity: 16)  // 256 counters; halves after 160 uses
        var random = FamilyModelTests.Random(state: 7)
        let keys: [Int] = (0..<60).map { $0 &* 0x9E37_79B9 }
        var uses = 0
        for key in keys {
            for _ in 0...random.next(2) {
                sketch.increment(key)
                uses += 1
            }
        }
        #expect(uses < sketch.sampleSize)  // no halving in between
        var largest: [Int: Int] = [:]  // counter (word * 64 + shift) -> the largest estimate of its keys
        for key in keys {
            for (word, shift) in Self.counters(of: key, in: sketch) {
                largest[word * 64 + Int(shift), default: 0] = max(
                    largest[word * 64 + Int(shift), default: 0], sketch.estimate(key))
            }
        }
        var shared = 0
        for key in keys {
            for (word, shift) in Self.counters(of: key, in: sketch) {
                let value = Int((sketch.words[word] >> shift) & 0xF)
                #expect(value <= largest[word * 64 + Int(shift)]!)
                if value > sketch.estimate(key) { shared += 1 }
            }
        }
        #expect(shared > 0)  // the keys do collide: the check above is not vacuous
    }
}

extension FamilyShard {
    /// A hit on `key` as ``FamilyCore/hit(_:at:_:)`` makes it while the shard's lock has not spread:
    /// the look-up, then the access noted at once; its value if its data is fresh at `now` and within
    /// `hitWindow`.
    mutating func freshValue(of key: Key, hash: Int, at now: Duration, hitWindow: Duration) -> Value? {
        withUnsafeMutablePointer(to: &self) { shard in
            guard let found = Self.freshValue(in: shard, of: key, hash: hash, at: now, hitWindow: hitWindow) else {
                return nil
            }
            let position = Int(found.position)
            Self.noteHit(shard.pointee.table.records[position].slot, position: position, hash: hash, at: now, in: shard)
            return found.result
        }
    }
}
