/// A hash index from a ``FamilyShard``'s keys to the positions of their records: open addressing with
/// linear probing and backward-shift deletion (no tombstones), in one array of 64-bit buckets that
/// hold half of the key's mixed hash and the position. Finding a key reads its buckets, then compares
/// the key in the record only where the hash's half matches. The keys themselves live in the shard's
/// records; the table reads the index only for a key whose record is not near its home (see
/// ``RecordTable/position(of:hash:)``), or that has none.
///
/// The table is at most half full, so a probe is short; it doubles when it would not be. A key's home
/// bucket is read from the half of its hash that the bucket keeps, so growing needs no key.
@usableFromInline
struct SlotIndex {
    /// 0 for an empty bucket; otherwise the upper 32 bits of the key's mixed hash, then the position
    /// plus one.
    @usableFromInline var buckets: [UInt64]
    @usableFromInline var mask: Int
    /// The number of keys.
    @usableFromInline private(set) var count = 0

    /// The number of buckets of a new index.
    @usableFromInline static var initialCount: Int { 1 }

    /// An empty index of `bucketCount` buckets, a power of two.
    @usableFromInline init(bucketCount: Int = initialCount) {
        precondition(bucketCount > 0 && bucketCount & (bucketCount - 1) == 0, "a power of two")
        buckets = Array(repeating: 0, count: bucketCount)
        mask = bucketCount - 1
    }

    /// The half of `hash`, mixed, that a bucket keeps. Mixed first: a key type's own `hashValue` may
    /// leave the upper bits zero (as may a 32-bit `Int`), which would put every key in one run.
    @inlinable
    static func tag(_ hash: Int) -> UInt64 { KeyHash.mix(hash) >> 32 }

    /// The first bucket to probe for a key whose hash has `tag`.
    @inlinable
    func home(_ tag: UInt64) -> Int { home(tag, mask: mask) }

    /// The home of a key whose hash has `tag` in a table of `mask + 1` places (a power of two): the
    /// index's own buckets, or the shard's records.
    @inlinable
    func home(_ tag: UInt64, mask: Int) -> Int { Int(truncatingIfNeeded: tag) & mask }

    /// The position of the key with `hash` for which `isKey` is true, or `nil`.
    @inlinable
    func find(_ hash: Int, where isKey: (Int32) -> Bool) -> Int32? {
        let tag = Self.tag(hash)
        return buckets.withUnsafeBufferPointer { buckets in
            var bucket = home(tag)
            while true {
                let entry = buckets[bucket]
                if entry == 0 { return nil }
                if entry >> 32 == tag {
                    let position = Int32(truncatingIfNeeded: entry & 0xFFFF_FFFF) &- 1
                    if isKey(position) { return position }
                }
                bucket = (bucket &+ 1) & mask
            }
        }
    }

    /// Adds `position` for a key with `hash` that has none.
    @usableFromInline mutating func insert(_ hash: Int, position: Int32) {
        if (count + 1) * 2 > buckets.count { grow() }
        place(Self.entry(hash, position))
        count += 1
    }

    /// Removes `position`, the position of a key with `hash`. Nothing if it is not in the index.
    @usableFromInline mutating func remove(_ hash: Int, position: Int32) {
        guard var hole = bucket(holding: Self.entry(hash, position)) else { return }
        count -= 1
        // Shift back each following entry of the run that may move into the hole (its home is not
        // between the hole and it), so that no probe meets an empty bucket before its key.
        var next = hole
        while true {
            next = (next + 1) & mask
            let moving = buckets[next]
            if moving == 0 { break }
            let home = home(moving >> 32)
            if (next - home) & mask >= (next - hole) & mask {
                buckets[hole] = moving
                hole = next
            }
        }
        buckets[hole] = 0
    }

    /// Changes the position of the key with `hash` from `old` to `new` (its record moved). Nothing
    /// if `old` is not in the index.
    @usableFromInline mutating func move(_ hash: Int, from old: Int32, to new: Int32) {
        guard let bucket = bucket(holding: Self.entry(hash, old)) else {
            assertionFailure("the position of a record that moved was not in the index")
            return
        }
        buckets[bucket] = Self.entry(hash, new)
    }

    /// How far from its home bucket `position`, a key's with `hash`, is (for tests); `nil` if absent.
    func distance(of hash: Int, position: Int32) -> Int? {
        let entry = Self.entry(hash, position)
        return bucket(holding: entry).map { ($0 - home(entry >> 32)) & mask }
    }

    /// The bucket of a key with `hash` at `position`: the half of the hash, then the position plus
    /// one (never 0, an empty bucket).
    private static func entry(_ hash: Int, _ position: Int32) -> UInt64 {
        tag(hash) << 32 | UInt64(UInt32(bitPattern: position &+ 1))
    }

    /// The bucket that holds `entry`, or `nil`.
    private func bucket(holding entry: UInt64) -> Int? {
        var bucket = home(entry >> 32)
        while buckets[bucket] != entry {
            if buckets[bucket] == 0 { return nil }
            bucket = (bucket + 1) & mask
        }
        return bucket
    }

    /// Puts `entry` in the first empty bucket from its home.
    private mutating func place(_ entry: UInt64) {
        var bucket = home(entry >> 32)
        while buckets[bucket] != 0 { bucket = (bucket + 1) & mask }
        buckets[bucket] = entry
    }

    /// Doubles the table.
    private mutating func grow() {
        let old = buckets
        buckets = Array(repeating: 0, count: old.count * 2)
        mask = buckets.count - 1
        for entry in old where entry != 0 { place(entry) }
    }
}
