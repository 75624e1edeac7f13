/// A hash index from a ``FamilyShard``'s keys to the positions of their records: open addressing with
/// linear probing and backward-shift deletion (no tombstones), in one array of 64-bit buckets that
/// hold half of the key's mixed hash and the position. Finding a key reads its buckets, then compares
/// the key in the record only where the hash's half matches. The keys themselves live in the shard's
/// records; the shard reads the index only for a key whose record is not near its home (see
/// ``FamilyShard/position(of:hash:)``), or that has none.
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
    private(set) var count = 0

    /// The number of buckets of a new index.
    @usableFromInline static var initialCount: Int { 8 }

    /// An empty index of `bucketCount` buckets, a power of two.
    init(bucketCount: Int = initialCount) {
        precondition(bucketCount > 0 && bucketCount & (bucketCount - 1) == 0, "a power of two")
        buckets = Array(repeating: 0, count: bucketCount)
        mask = bucketCount - 1
    }

    /// The half of `hash`, mixed, that a bucket keeps. Mixed first: a key type's own `hashValue` may
    /// leave the upper bits zero (as may a 32-bit `Int`), which would put every key in one run.
    @inlinable
    static func tag(_ hash: Int) -> UInt64 { FrequencySketch.spread(hash) >> 32 }

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
    mutating func insert(_ hash: Int, position: Int32) {
        if (count + 1) * 2 > buckets.count { grow() }
        place(Self.tag(hash) << 32 | UInt64(UInt32(bitPattern: position &+ 1)))
        count += 1
    }

    /// Removes `position`, the position of a key with `hash`. Nothing if it is not in the index.
    mutating func remove(_ hash: Int, position: Int32) {
        let entry = Self.tag(hash) << 32 | UInt64(UInt32(bitPattern: position &+ 1))
        var hole = home(Self.tag(hash))
        while buckets[hole] != entry {
            if buckets[hole] == 0 { return }
            hole = (hole + 1) & mask
        }
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
    mutating func move(_ hash: Int, from old: Int32, to new: Int32) {
        let tag = Self.tag(hash)
        let entry = tag << 32 | UInt64(UInt32(bitPattern: old &+ 1))
        var bucket = home(tag)
        while buckets[bucket] != entry {
            if buckets[bucket] == 0 {
                assertionFailure("the position of a record that moved was not in the index")
                return
            }
            bucket = (bucket + 1) & mask
        }
        buckets[bucket] = tag << 32 | UInt64(UInt32(bitPattern: new &+ 1))
    }

    /// How far from its home bucket `position`, a key's with `hash`, is (for tests); `nil` if absent.
    func distance(of hash: Int, position: Int32) -> Int? {
        let entry = Self.tag(hash) << 32 | UInt64(UInt32(bitPattern: position &+ 1))
        let home = home(Self.tag(hash))
        var bucket = home
        while buckets[bucket] != entry {
            if buckets[bucket] == 0 { return nil }
            bucket = (bucket + 1) & mask
        }
        return (bucket - home) & mask
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
