/// Where a shard finds its entries: each key's record near the key's home in an open-addressed table,
/// with a hash index (``SlotIndex``) to find the few that are not, and a slot per entry that does not
/// move while the entry lives (the shard's and the policy's arrays are by slot).
///
/// Its invariant, kept inside this type: a record's home is computed the same way for lookup,
/// placement and removal (``home(of:mask:)``), and no free position ever lies between a record and
/// its home. A lookup so finds a record at its home or a few positions on (see
/// ``position(of:hash:)``), or meets a free position first, and then the key has none.
@usableFromInline
struct RecordTable<Key: Hashable & Sendable, Value: Sendable> {
    @usableFromInline typealias Store = AsyncStateStore<Value?>

    /// What the hit path reads of an entry, together: its key, its slot, and its store or its value
    /// and freshness. A free position has no key. The freshness is a `Duration` with a value for
    /// "none" rather than an optional, which would take 8 more bytes, and the fields are in the order
    /// that packs them.
    @usableFromInline
    struct Record {
        /// When a compact entry's data became fresh, or ``notFresh`` (see ``freshness``).
        @usableFromInline var freshSince: Duration = Self.notFresh
        /// A live entry's store.
        @usableFromInline var store: Store?
        @usableFromInline var key: Key?
        /// Whether the entry was hit while its shard's policy had no room to note the hit (see
        /// ``FamilyShard/noteHit(_:position:hash:at:in:)``) since it left the window: cleared when the
        /// policy gives it the second chance the hit would have, and as it leaves the window (a
        /// window's hit moves its entry within the window, not to protected). Right after the key, where the next field's alignment
        /// leaves room: the record is no larger (56 bytes with `Int` keys and values, 64 with
        /// `String`s, as before).
        @usableFromInline var referenced = false
        /// The entry's slot: its place in the shard's other arrays.
        @usableFromInline var slot: Int32
        /// A compact entry's value (`nil` for a live entry, whose store has it).
        @usableFromInline var value: Value?

        @inlinable
        init(key: Key?, slot: Int32) {
            self.key = key
            self.slot = slot
        }

        /// A free position.
        @inlinable static var free: Record { Record(key: nil, slot: -1) }

        /// ``freshSince`` when the data is not fresh: earlier than any instant a clock gives.
        @inlinable static var notFresh: Duration { .seconds(Int64.min) }

        /// When a compact entry's data became fresh: `nil` if it is not (never fetched, invalidated,
        /// failed) or the entry is live.
        @inlinable
        var freshness: Duration? {
            // Compared in attoseconds: `Duration`'s `==` is a call into the standard library.
            get { freshSince.attoseconds == Self.notFresh.attoseconds ? nil : freshSince }
            set { freshSince = newValue ?? Self.notFresh }
        }
    }

    @usableFromInline var index = SlotIndex()
    /// A power of two of positions, at most three quarters used (see ``growRecords()``); one free
    /// position in an empty table, so that memory follows the entries held.
    @usableFromInline var records = [Record.free]
    /// A slot: its key's hash (for moving its record, and for the policy's sketch) and its record's
    /// position in `records` (-1 for a free slot). One array for both, so that the slots grow with
    /// one allocation at a time.
    @usableFromInline
    struct Slot {
        @usableFromInline var hash: Int
        @usableFromInline var position: Int32

        @inlinable
        init(hash: Int, position: Int32) {
            (self.hash, self.position) = (hash, position)
        }
    }

    /// Each slot, by slot.
    @usableFromInline var slots: [Slot] = []
    /// Slots of removed entries, to be used again.
    @usableFromInline var freeSlots: [Int32] = []

    /// The number of entries.
    @inlinable var count: Int { index.count }

    /// The number of slots, used or free: the length of every array by slot.
    @inlinable var slotCount: Int { slots.count }

    /// How many positions from its home a lookup tries before it asks the index.
    @inlinable static var nearby: Int { 4 }

    /// The position of `key`'s record, whose hash is `hash`. The records are kept as linear probing
    /// keeps keys: each is put at the first free position from its key's home, and moved back when a
    /// removal frees a position before it (see ``vacate(_:)``). A lookup so finds the record at its
    /// home or a few positions on — a read of memory whose address needs no other read first — or
    /// meets a free position first, and then the key has none. Only when the ``nearby`` positions
    /// from the home all hold other keys (for about 3 keys in 100 when half the positions are used,
    /// 12 when three quarters are, the most) does it read the index, which holds every record's
    /// position. A hit is then one cache miss, not the index's and then the record's in a chain.
    ///
    /// Always inlined: called, the shard it belongs to was copied on every hit.
    @inlinable @inline(__always)
    func position(of key: Key, hash: Int) -> Int? {
        records.withUnsafeBufferPointer { records in
            let mask = records.count &- 1
            var position = home(of: hash, mask: mask)
            for _ in 0..<Self.nearby {
                guard let found = records[position].key else { return nil }
                if found == key { return position }
                position = (position &+ 1) & mask
            }
            return index.find(hash) { records[Int($0)].key == key }.map { Int($0) }
        }
    }

    /// The slot of `key`, whose hash is `hash`.
    @inlinable
    func slot(of key: Key, hash: Int) -> Int32? {
        position(of: key, hash: hash).map { records[$0].slot }
    }

    /// The slot of `key`.
    @inlinable func slot(of key: Key) -> Int32? { slot(of: key, hash: key.hashValue) }

    /// The home of a key whose hash is `hash` in `records` (`mask + 1` positions): where a lookup
    /// starts, where a new record is placed from, and what a removal's move back keeps each record
    /// after — one definition for the three, or records would be lost.
    @inlinable @inline(__always)
    func home(of hash: Int, mask: Int) -> Int { index.home(SlotIndex.tag(hash), mask: mask) }

    /// The position of the record of the entry at `slot`.
    @inlinable
    func at(_ slot: Int) -> Int { Int(slots[slot].position) }

    /// The hash of the key of the entry at `slot`.
    @inlinable func hash(at slot: Int) -> Int { slots[slot].hash }

    /// Whether `slot` holds an entry (it is not free).
    @inlinable func holdsEntry(_ slot: Int) -> Bool { slots[slot].position >= 0 }

    /// The key of the entry at `slot`.
    @inlinable func key(at slot: Int) -> Key { records[at(slot)].key! }

    /// Adds a record for `key`, whose hash is `hash` and which has none; returns its slot (a free one,
    /// or a new one: then ``slotCount`` grew by one, and so must every array by slot).
    @inlinable mutating func insert(_ key: Key, hash: Int) -> Int32 {
        let slot: Int32
        if let free = freeSlots.popLast() {
            slot = free
        } else {
            slot = Int32(slots.count)
            slots.append(Slot(hash: hash, position: -1))
        }
        slots[Int(slot)].hash = hash
        if (index.count + 1) * 4 > records.count * 3 { growRecords() }
        let position = freePosition(from: hash)
        records[position] = Record(key: key, slot: slot)
        slots[Int(slot)].position = Int32(position)
        index.insert(hash, position: Int32(position))
        return slot
    }

    /// Removes the record of the entry at `slot`; the slot is free to be used again.
    @inlinable mutating func remove(_ slot: Int32) {
        let i = Int(slot)
        let position = at(i)
        index.remove(slots[i].hash, position: Int32(position))
        vacate(position)
        slots[i].position = -1
        freeSlots.append(slot)
    }

    /// The first free position from the home of a key whose hash is `hash`.
    @inlinable func freePosition(from hash: Int) -> Int {
        let mask = records.count - 1
        var position = home(of: hash, mask: mask)
        while records[position].key != nil { position = (position + 1) & mask }
        return position
    }

    /// Frees the record at `position`, and moves back each following record of its run that may
    /// move into the freed place (its home is not between that place and it), as the index does
    /// with its buckets: no free position is left between a record and its home, and records stay
    /// as near their homes as if the removed one had never been placed. (Only freed, positions
    /// would drift away from their homes as entries come and go.)
    @inlinable mutating func vacate(_ position: Int) {
        let mask = records.count - 1
        records[position] = .free
        var hole = position
        var next = position
        while true {
            next = (next + 1) & mask
            guard records[next].key != nil else { return }
            let slot = Int(records[next].slot)
            let hash = slots[slot].hash
            let home = home(of: hash, mask: mask)
            if (next - home) & mask >= (next - hole) & mask {
                records.swapAt(hole, next)
                slots[slot].position = Int32(hole)
                index.move(hash, from: Int32(next), to: Int32(hole))
                hole = next
            }
        }
    }

    /// Doubles `records`, and puts each record at the first free position from its home in the new
    /// size (which is not the old one's for half of them); the index is made again to match. O(n).
    /// Called when a new entry would fill more than three quarters of the positions, so that a table
    /// that has only grown uses between three eighths and three quarters of them (it never shrinks).
    /// Kept at most half used, the records would be nearer their homes, but just after a doubling
    /// they would take twice the memory they need (see Benchmarks/README.md, "Memory").
    @inlinable mutating func growRecords() {
        let old = records
        records = Array(repeating: .free, count: old.count * 2)
        index = SlotIndex(bucketCount: records.count)
        for record in old where record.key != nil {
            let hash = slots[Int(record.slot)].hash
            let position = freePosition(from: hash)
            records[position] = record
            slots[Int(record.slot)].position = Int32(position)
            index.insert(hash, position: Int32(position))
        }
    }

    /// The bytes the table's buffers hold (by their capacity).
    @inlinable var bufferBytes: Int {
        bytes(of: records) + bytes(of: index.buckets) + bytes(of: slots) + bytes(of: freeSlots)
    }
}

/// The bytes `array`'s buffer holds (by its capacity): what the families' memory tests add up.
@usableFromInline func bytes<Element>(of array: [Element]) -> Int { array.capacity * MemoryLayout<Element>.stride }
