import Foundation

/// One shard of a family: its entries (a ``RecordTable``), its eviction policy (a ``TinyLFUPolicy``),
/// with an idle expiry its ``IdleHeap``, and what each entry is — live or compact, in use or not, and
/// what it weighs. Guarded by the shard's lock; every operation is O(1) amortized except the trims,
/// which are O(entries removed + busy entries skipped).
///
/// An entry is **live** — a store, as an ``AsyncState`` has — while someone uses it (a caller between
/// ``pin(_:at:make:restore:)`` and ``unpin(_:)``, a fetch in flight, an `updates` subscriber) or while
/// its data is not at rest (never fetched, failed). An entry nobody uses with data at rest is
/// **compact**: its ``StateData``, packed into its record (value and freshness, read by the hit path)
/// and its ``Metadata`` (the rest, ``StateData/Packed``), a few dozen bytes besides the key and value; a hit on it reads the
/// shard alone. Pinning a compact entry makes its store again from that data, and a write or an
/// invalidation of a compact entry changes the data by its own methods, as a store's machine does: so
/// every per-key rule is decided once, in ``StateData`` and ``FetchStateMachine``.
///
/// The hit path (``lookUp(in:_:hash:at:hitWindow:live:)``) is inlinable, so that it is specialized
/// for the caller's key and value types: unspecialized, every step would look up generic metadata.
@usableFromInline
struct FamilyShard<Key: Hashable & Sendable, Value: Sendable> {
    @usableFromInline typealias Store = AsyncStateStore<Value?>
    /// A key's data: what a compact entry is, packed (see ``Metadata``).
    @usableFromInline typealias Data = StateData<Value?>
    @usableFromInline typealias Table = RecordTable<Key, Value>

    /// What an entry holds (see ``entry(at:)``).
    @usableFromInline
    enum Entry {
        /// Data at rest, nobody using it.
        case compact(Data)
        /// Its store.
        case live(Store)
    }

    /// What a compact entry keeps besides its value and freshness (read off the hit path): the rest
    /// of its ``StateData``, packed (see ``StateData/Packed``, the one place data is packed).
    @usableFromInline typealias Metadata = Data.Packed

    /// An entry that left the shard, for the removal callback (called after the lock is released).
    @usableFromInline struct Removed {
        @usableFromInline var key: Key
        @usableFromInline var value: Value?
        @usableFromInline var reason: AsyncStateFamilyRemovalReason
        /// What else the entry held that may be the last reference to an object of the user's,
        /// released with this after the lock (their deinits are user code, which may call the
        /// family): a compact entry's last error (kept once its phase has moved on), or a live
        /// entry's store, whose data and snapshot hold its value and errors.
        @usableFromInline var remains: (lastError: (any Error)?, store: Store?)

        @inlinable
        init(
            key: Key, value: Value?, reason: AsyncStateFamilyRemovalReason,
            remains: (lastError: (any Error)?, store: Store?) = (nil, nil)
        ) {
            (self.key, self.value, self.reason, self.remains) = (key, value, reason, remains)
        }
    }

    /// The entry at `slot` as it leaves for `reason`, with everything it holds (see ``Removed``).
    @inlinable func removed(at slot: Int, reason: AsyncStateFamilyRemovalReason) -> Removed {
        Removed(
            key: table.key(at: slot), value: value(at: slot), reason: reason,
            remains: (metadata[slot]?.lastError, table.records[table.at(slot)].store))
    }

    /// The entries an eviction or a sweep removed, to be reported and released after the lock: the
    /// first inline, since a write that takes the family past its capacity evicts one.
    @usableFromInline typealias Removals = InlineOneArray<Removed>

    /// The entries: records, index and slots.
    @usableFromInline var table = Table()
    /// The eviction policy.
    @usableFromInline var policy: TinyLFUPolicy
    /// The stripe whose ``AccessBuffer`` was last folded in with hits in it, once the shard's lock
    /// has spread (-1 before), and its newest hit's instant: how the buffers tell whether processors
    /// contend for the shard (see ``AccessBuffer/isSampling``). Only ``absorb(_:into:)`` reads and
    /// writes them.
    @usableFromInline var lastAbsorbedStripe: Int32 = -1
    @usableFromInline var lastAbsorbedAt: Duration = .zero
    /// Each entry's last access, by slot, when `tracksIdle` (empty otherwise: nothing reads it).
    @usableFromInline var lastAccess: [Duration] = []
    /// The entries by a lower bound of their last access, when `tracksIdle`.
    @usableFromInline var idle = IdleHeap()
    /// Each entry's callers between `pin` and `unpin`, by slot.
    @usableFromInline var users: [Int32] = []
    /// Stores of entries that became compact, which nobody else references, kept to be made anew
    /// for the next entries made live (``AsyncStateStore/make(restoring:initialValue:configuration:clock:seed:observation:reusing:)``):
    /// a miss then allocates no store, no locks and no cell (nor, with an observer, an event
    /// queue), and frees none when it settles. At most ``spareLimit``.
    @usableFromInline var spareStores: [Store] = []
    /// What a compact entry keeps off the hit path, by slot (`nil` for a live entry).
    @usableFromInline var metadata: [Metadata?] = []
    /// Each entry's weight, by slot (0 without a value; never negative), and their sum: in `Int128`,
    /// so that no number of entries of any weight overflows it. Every change is also added to the
    /// family's ``WeightLedger``, which holds the sum over every shard. Empty without a weigher:
    /// nothing is weighed then.
    @usableFromInline var weights: [Int] = []
    @usableFromInline var totalWeight: Int128 = 0
    @usableFromInline let tracksIdle: Bool
    /// The share of the family's capacity this shard is sized for.
    @usableFromInline let capacity: Int
    /// How an entry is weighed, and the family's total weight; `nil` without a maximum weight.
    @usableFromInline let weigher: (@Sendable (Key, Value) -> Int)?
    @usableFromInline let ledger: WeightLedger?
    /// The family's policies: the emptiness test and expiry of a compact entry's writes and
    /// invalidations (see ``settle(_:_:)``).
    @usableFromInline let configuration: StoreConfiguration<Value?>
    /// The tags of an entry with a value, from its key and value; `nil` without tags, and then the
    /// three tables below stay empty and nothing else is done (a family without tags pays a test).
    @usableFromInline let tagger: (@Sendable (Key, Value) -> [String])?
    /// The compact entries carrying each tag, by slot. A compact entry's value changes only here
    /// (``makeCompact(_:_:)``), so this is exact for them.
    @usableFromInline var tagged: [String: Set<Int32>] = [:]
    /// Each tagged compact entry's tags, by slot (to take them out of ``tagged``).
    @usableFromInline var tagsBySlot: [Int32: [String]] = [:]
    /// The live entries, when tagging: their values change in their stores, out of this shard's
    /// sight, so ``invalidate(tag:at:compact:live:)`` reads their tags when it runs.
    @usableFromInline var liveSlots: Set<Int32> = []

    @inlinable init(
        capacity: Int, weigher: (@Sendable (Key, Value) -> Int)? = nil, ledger: WeightLedger? = nil,
        tracksIdle: Bool = false,
        configuration: StoreConfiguration<Value?> = StoreConfiguration(expiry: .seconds(120), isEmpty: { _ in false }),
        tagger: (@Sendable (Key, Value) -> [String])? = nil
    ) {
        self.configuration = configuration
        self.tagger = tagger
        self.weigher = ledger == nil ? nil : weigher
        self.ledger = ledger
        self.tracksIdle = tracksIdle
        self.capacity = max(1, capacity)
        policy = TinyLFUPolicy(capacity: self.capacity)
    }

    @inlinable var count: Int { table.count }

    /// The bytes this shard's buffers hold (by their capacity): what memory follows, for tests that
    /// an empty shard costs the same whatever its capacity, and that it grows with its entries.
    @inlinable var bufferBytes: Int {
        table.bufferBytes + policy.bufferBytes + idle.bufferBytes + bytes(of: lastAccess) + bytes(of: users)
            + bytes(of: metadata) + bytes(of: weights)
    }

    /// The slot of `key`.
    @inlinable func slot(of key: Key) -> Int32? { table.slot(of: key) }

    // MARK: Entries

    /// The entry at `slot`.
    @inlinable func entry(at slot: Int) -> Entry {
        let position = table.at(slot)
        if let store = table.records[position].store { return .live(store) }
        return .compact(compactData(at: position))
    }

    /// The latest value of the entry at `slot`.
    @inlinable func value(at slot: Int) -> Value? {
        let record = table.records[table.at(slot)]
        return record.store.map { $0.cell.value } ?? record.value
    }

    /// Whether the entry at `slot` is in use: never evicted, swept as idle or made compact then.
    @inlinable func isInUse(_ slot: Int) -> Bool { Self.isInUse(slot, table: table, users: users) }

    /// Whether the entry at `slot` is in use — a caller holds it (between ``pin(_:at:make:)`` and
    /// ``unpin(_:)``), or its store has a flight (``FetchStateMachine/hasFlight``) — from the two
    /// tables it reads, for closures that must not capture the shard. The one "in use" of a family.
    @inlinable static func isInUse(_ slot: Int, table: Table, users: [Int32]) -> Bool {
        Store.isInUse(users: users[slot], hasFlight: table.records[table.at(slot)].store?.hasFlight == true)
    }

    /// Makes the entry at `slot` live with `store`.
    @inlinable mutating func makeLive(_ slot: Int, _ store: Store) {
        let position = table.at(slot)
        table.records[position].store = store
        table.records[position].value = nil
        table.records[position].freshness = nil
        metadata[slot] = nil
        if tagger != nil {
            untag(Int32(slot))
            liveSlots.insert(Int32(slot))
        }
    }

    /// Makes the entry at `slot` compact with `data`, which is at rest: packs it.
    @inlinable mutating func makeCompact(_ slot: Int, _ data: Data) {
        let position = table.at(slot)
        table.records[position].store = nil
        table.records[position].value = data.value
        table.records[position].freshness = data.freshSince
        metadata[slot] = data.packed
        if let tagger {
            liveSlots.remove(Int32(slot))
            let tags = data.value.map { Set(tagger(table.key(at: slot), $0)).sorted() } ?? []
            if tags != tagsBySlot[Int32(slot)] ?? [] {
                untag(Int32(slot))
                tag(Int32(slot), with: tags)
            }
        }
    }

    // MARK: Using an entry

    /// `key`'s store, for a caller that will use it until ``unpin(_:)``: made with `make`, given a
    /// compact entry's data to restore (`nil` for a new key) and a spare store to make anew if the
    /// shard has one (``spareStores``). The access at `now` makes the entry the most
    /// recently used. Returns whether the key's entry is new.
    @inlinable mutating func pin(
        _ key: Key, at now: Duration, make: (Data?, Store?) -> Store
    ) -> (store: Store, inserted: Bool) {
        let hash = key.hashValue
        if let slot = table.slot(of: key, hash: hash) {
            touch(slot, at: now)
            let i = Int(slot)
            users[i] += 1
            if let store = table.records[table.at(i)].store { return (store, false) }
            let store = make(compactData(at: table.at(i)), spareStores.popLast())
            makeLive(i, store)
            return (store, false)
        }
        let store = make(nil, spareStores.popLast())
        let slot = insert(key, hash: hash, at: now)
        makeLive(Int(slot), store)
        users[Int(slot)] = 1
        return (store, true)
    }

    /// A caller is done with `key`'s store: the entry becomes compact if its store says it may rest
    /// (``AsyncStateStore/restingData(users:)``). Returns what a store kept as a spare held, for the
    /// caller to release once the shard's lock is released.
    @inlinable mutating func unpin(_ key: Key) -> Store.Leftovers? {
        guard let slot = table.slot(of: key) else { return nil }  // removed meanwhile
        let i = Int(slot)
        users[i] -= 1
        weigh(i)
        guard var store = table.records[table.at(i)].store, let data = store.restingData(users: users[i]) else {
            return nil
        }
        makeCompact(i, data)
        // The entry no longer holds the store. If nothing else does either — no task, timer or
        // reader (they hold it strongly, and reach it only through the entry, under this lock) —
        // it is kept, emptied, for the next store this shard makes.
        guard spareStores.count < Self.spareLimit, isKnownUniquelyReferenced(&store) else { return nil }
        spareStores.append(store)
        return store.park()
    }

    /// The most spare stores a shard keeps: enough for the misses that settle between two of its
    /// pins, few enough to weigh nothing beside the entries.
    @inlinable static var spareLimit: Int { 2 }

    // MARK: Making and removing entries

    /// A new entry of `key` (whose hash is `hash`), used at `now`, as the most recently used; returns
    /// its slot (its contents are set by the caller).
    @inlinable mutating func insert(_ key: Key, hash: Int, at now: Duration) -> Int32 {
        let slot = table.insert(key, hash: hash)
        let i = Int(slot)
        if i == users.count {
            users.append(0)
            metadata.append(nil)
            if weigher != nil { weights.append(0) }
            if tracksIdle { lastAccess.append(now) }
        }
        (users[i], metadata[i]) = (0, nil)
        if weigher != nil { weights[i] = 0 }
        if tracksIdle {
            lastAccess[i] = now
            idle.push(slot, since: now)
        }
        // An entry pushed from the window to probation starts there unmarked: a hit it had in the
        // window was the window's (see ``RecordTable/Record/referenced``).
        if let pushed = policy.admit(slot, hash: hash, entries: table.count) {
            table.records[table.at(Int(pushed))].referenced = false
        }
        return slot
    }

    /// Removes the entry at `slot` from the policy, the idle heap and the table; its weight goes.
    @inlinable mutating func remove(_ slot: Int32) {
        policy.remove(slot)
        let i = Int(slot)
        if tracksIdle { idle.remove(slot) }
        table.remove(slot)
        metadata[i] = nil
        setWeight(0, of: i)
        if tagger != nil {
            untag(slot)
            liveSlots.remove(slot)
        }
    }

    /// A use of the entry at `slot` at `now` other than a hit (a pin, a `set`): recorded, and the
    /// policy applies it at once.
    @inlinable mutating func touch(_ slot: Int32, at now: Duration) {
        recordAccess(slot, at: now)
        policy.touch(slot, hash: table.hash(at: Int(slot)))
    }

    /// Writes a use of the entry at `slot` at `now` as its last access, with an idle expiry (nothing
    /// reads it otherwise). The clock was read before the lock: a later use may have been recorded
    /// meanwhile, so the later of the two stays.
    @inlinable
    mutating func recordAccess(_ slot: Int32, at now: Duration) {
        Self.recordAccess(slot, at: now, tracksIdle: tracksIdle, in: &lastAccess)
    }

    /// ``recordAccess(_:at:)`` on the last accesses alone (for ``noteHit(_:hash:at:in:)``, which may
    /// not touch the rest of the shard).
    @inlinable
    static func recordAccess(_ slot: Int32, at now: Duration, tracksIdle: Bool, in lastAccess: inout [Duration]) {
        if tracksIdle { lastAccess[Int(slot)] = max(lastAccess[Int(slot)], now) }
    }
}
