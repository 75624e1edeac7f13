public import Foundation

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

    // MARK: Tags

    /// Files the compact entry at `slot` under `tags` (without duplicates).
    @inlinable mutating func tag(_ slot: Int32, with tags: [String]) {
        guard !tags.isEmpty else { return }
        tagsBySlot[slot] = tags
        for tag in tags { tagged[tag, default: []].insert(slot) }
    }

    /// Takes the entry at `slot` out of the tag index.
    @inlinable mutating func untag(_ slot: Int32) {
        guard let tags = tagsBySlot.removeValue(forKey: slot) else { return }
        for tag in tags {
            tagged[tag]?.remove(slot)
            if tagged[tag]?.isEmpty == true { tagged[tag] = nil }
        }
    }

    /// Marks expired every entry carrying `tag`: the compact ones here (their keys added to
    /// `compact`), found in the index; the live ones' stores added to `live`, for the caller to
    /// invalidate: those whose current value carries the tag, and those with a fetch in flight, whose
    /// result may (as a key's invalidation expires the fetch in flight). O(compact entries tagged +
    /// live entries).
    @inlinable mutating func invalidate(
        tag: String, at now: Duration, compact: inout [Key], live: inout [Store]
    ) {
        guard let tagger else { return }
        let expiry = configuration.expiry
        for slot in tagged[tag] ?? [] {
            settle(Int(slot)) { _ = $0.invalidate(now: now, expiry: expiry) }
            compact.append(table.key(at: Int(slot)))
        }
        for slot in liveSlots {
            guard let store = table.records[table.at(Int(slot))].store else { continue }
            if store.hasFlight || store.cell.value.map({ tagger(table.key(at: Int(slot)), $0).contains(tag) }) == true {
                live.append(store)
            }
        }
    }

    /// The number of compact entries filed under each tag and the live entries tracked (for tests).
    @inlinable var tagIndexSizes: (tags: Int, filed: Int, live: Int) {
        (tagged.count, tagsBySlot.count, liveSlots.count)
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

    /// Weighs the entry at `slot` again (its value may have changed). Without a weigher, nothing.
    @inlinable mutating func weigh(_ slot: Int) {
        guard let weigher else { return }
        let weight = value(at: slot).map { max(0, weigher(table.key(at: slot), $0)) } ?? 0
        setWeight(weight, of: slot)
    }

    /// Sets the weight of the entry at `slot`, in this shard's total and the family's ledger.
    @inlinable mutating func setWeight(_ weight: Int, of slot: Int) {
        guard weigher != nil else { return }
        let change = Int128(weight) - Int128(weights[slot])
        guard change != 0 else { return }
        weights[slot] = weight
        totalWeight += change
        ledger?.add(change)
    }

    /// Writes `value` if `key` has no entry or a compact one that nobody uses: returns `done`,
    /// whether it made the entry, and the value it replaced. Otherwise returns `done == false` and
    /// changes nothing (the caller sets through the store). The write is the data's own
    /// (``StateData/set(_:isEmpty:shift:now:date:)``, as a store's; see ``settle(_:_:)``).
    @inlinable mutating func setIfCompact(_ value: Value, for key: Key, at now: Duration, date: Date) -> (
        done: Bool, inserted: Bool, replaced: Value?
    ) {
        let hash = key.hashValue
        let isEmpty = configuration.isEmpty(value)
        let shift = configuration.freshnessShift(of: value)
        guard let slot = table.slot(of: key, hash: hash) else {
            let slot = Int(insert(key, hash: hash, at: now))
            var data = Data(initialValue: nil)
            data.set(value, isEmpty: isEmpty, shift: shift, now: now, date: date)
            makeCompact(slot, data)
            weigh(slot)
            return (true, true, nil)
        }
        let i = Int(slot)
        let position = table.at(i)
        guard users[i] == 0, table.records[position].store == nil else { return (false, false, nil) }
        let replaced = table.records[position].value
        settle(i) { $0.set(value, isEmpty: isEmpty, shift: shift, now: now, date: date) }
        weigh(i)
        touch(slot, at: now)
        return (true, false, replaced)
    }

    /// Marks `key`'s compact data expired (``StateData/invalidate(now:expiry:)``, as a store's), and
    /// returns `.compact`; returns a live entry's store instead (for the caller to invalidate); `nil`
    /// without an entry.
    /// With a second-level `version`, a compact entry that is that version or newer is left as it
    /// is (`nil`), and one that is older learns the version (see
    /// ``StateData/invalidate(now:expiry:version:)``).
    @inlinable mutating func invalidateIfCompact(_ key: Key, at now: Duration, version: UInt64? = nil) -> Entry? {
        guard let slot = table.slot(of: key) else { return nil }
        if let store = table.records[table.at(Int(slot))].store { return .live(store) }
        var data = compactData(at: table.at(Int(slot)))
        guard data.invalidate(now: now, expiry: configuration.expiry, version: version) != nil else { return nil }
        makeCompact(Int(slot), data)
        return entry(at: Int(slot))
    }

    /// Marks expired, as ``invalidateIfCompact(_:at:)`` does each, the entries that `isIncluded`
    /// accepts among at most `budget` slots from `start` (so that the caller can release the lock
    /// between calls): the compact ones here, their keys added to `compact`; the live ones' stores
    /// added to `live`, for the caller to invalidate. By slot, which does not move while an entry
    /// lives (its record may), so no entry is missed across calls. Returns the next slot, or `nil`
    /// when done.
    @inlinable mutating func invalidate(
        fromSlot start: Int, budget: Int, at now: Duration, where isIncluded: (Key) throws -> Bool,
        compact: inout [Key], live: inout [Store]
    ) rethrows -> Int? {
        let end = min(table.slotCount, start + budget)
        let expiry = configuration.expiry
        for slot in start..<end where table.holdsEntry(slot) {
            let position = table.at(slot)
            guard let key = table.records[position].key, try isIncluded(key) else { continue }
            if let store = table.records[position].store {
                live.append(store)
            } else {
                settle(slot) { _ = $0.invalidate(now: now, expiry: expiry) }
                compact.append(key)
            }
        }
        return end < table.slotCount ? end : nil
    }

    /// Applies `change` to the data of the compact entry at `slot` and packs the result: a compact
    /// entry changes by the data's own methods, as a store's machine does. The change must leave the
    /// data at rest (a write, an invalidation).
    @inlinable mutating func settle(_ slot: Int, _ change: (inout Data) -> Void) {
        var data = compactData(at: table.at(slot))
        change(&data)
        makeCompact(slot, data)
    }

    /// The entry of `key`, if any (no access is recorded).
    @inlinable func peek(_ key: Key) -> Entry? {
        table.slot(of: key).map { entry(at: Int($0)) }
    }

    // MARK: Removing entries

    /// An entry as it leaves (or as it is listed): its key and entry.
    @usableFromInline struct Leaving {
        @usableFromInline var key: Key
        @usableFromInline var entry: Entry

        @inlinable
        init(key: Key, entry: Entry) {
            (self.key, self.entry) = (key, entry)
        }

        /// Its latest value.
        @inlinable var value: Value? {
            switch entry {
            case .compact(let data): return data.value
            case .live(let store): return store.cell.value
            }
        }
        /// What a warm restart saves of it (see ``StateData/archived``).
        @inlinable var archived: (value: Value?, isEmpty: Bool, lastSuccess: Date?)? {
            switch entry {
            case .compact(let data): return data.archived
            case .live(let store): return store.archived
            }
        }
    }

    /// Evicts one entry that is not busy, as the policy chooses, into `removed`; returns whether
    /// there was one. Busy entries (in use, or with a flight in flight) are skipped, and so is
    /// `sparing` (an entry just made or written, whose caller expects to find it).
    @inlinable mutating func evictOne(sparing: Key? = nil, into removed: inout Removals) -> Bool {
        policy.applyReads()
        let chosen: (slot: Int32, refused: Bool)?
        do {
            // The closures read copies of the two tables (references, not their storage): capturing
            // `self` while `policy` is being read made the compiler copy the whole shard for each call.
            // The copies end here, before `remove` writes to the tables.
            let (table, users) = (table, users)
            chosen = policy.victim(
                where: { table.key(at: Int($0)) != sparing && !Self.isInUse(Int($0), table: table, users: users) },
                hash: { table.hash(at: Int($0)) })
        }
        guard let (slot, refused) = chosen else { return false }
        removed.append(self.removed(at: Int(slot), reason: .evicted))
        policy.evicted(table.hash(at: Int(slot)), refused: refused, entries: table.count)
        remove(slot)
        return true
    }

    /// Evicts `key`'s entry if it is not busy and, given `maximum`, if it alone weighs more than
    /// that (the family could never hold it); returns whether it did. A busy one stays.
    @inlinable mutating func evict(_ key: Key, ifHeavierThan maximum: Int? = nil, into removed: inout Removals) -> Bool
    {
        guard let slot = table.slot(of: key), !isInUse(Int(slot)) else { return false }
        if let maximum, weigher == nil || weights[Int(slot)] <= maximum { return false }  // nothing weighed: no weight
        removed.append(self.removed(at: Int(slot), reason: .evicted))
        remove(slot)
        return true
    }

    /// Removes the entries last accessed at or before `deadline` (idle), in the heap's order. A busy
    /// one is in use: it counts as accessed `now` instead. An entry whose heap place is older than
    /// its last access is placed by its last access — those placed before `ahead` too, although not
    /// due yet, so that the sweeper wakes once for many of them rather than once for each. Looks at
    /// no more than `budget` entries, so that the caller can release the lock between calls.
    /// Returns how many it removed and whether it is done. Needs `tracksIdle`.
    @inlinable mutating func removeIdle(
        accessedBy deadline: Duration, placingUntil ahead: Duration, now: Duration, budget: Int,
        into removed: inout Removals
    ) -> (removed: Int, done: Bool) {
        var count = 0
        for _ in 0..<budget {
            guard let root = idle.root, root.since <= max(deadline, ahead) else { return (count, true) }
            let i = Int(root.slot)
            let lastUse = lastAccess[i]
            if lastUse > deadline {
                // Not idle: placed by its last use. Placed there already, it is due at its own idle
                // deadline, when the sweeper wakes next; the entries after it wait until then.
                guard lastUse > root.since else { return (count, true) }
                idle.raiseRoot(to: lastUse)
            } else if isInUse(i) {
                lastAccess[i] = now
                idle.raiseRoot(to: now)
            } else {
                removed.append(self.removed(at: i, reason: .idle))
                remove(root.slot)
                count += 1
            }
        }
        return (count, false)
    }

    /// A lower bound of the oldest last access in the shard (the idle heap's root), or `nil` when the
    /// shard is empty or does not track idle entries. The sweep is due when it becomes idle.
    @inlinable var oldestAccess: Duration? { idle.root?.since }

    /// Removes `key`'s entry; returns it.
    @inlinable mutating func remove(_ key: Key) -> Leaving? {
        guard let slot = table.slot(of: key) else { return nil }
        let leaving = Leaving(key: key, entry: entry(at: Int(slot)))
        remove(slot)
        return leaving
    }

    /// Removes every entry; returns them.
    @inlinable mutating func removeAll() -> [Leaving] {
        let all = entries
        ledger?.add(-totalWeight)
        self = FamilyShard(
            capacity: capacity, weigher: weigher, ledger: ledger, tracksIdle: tracksIdle, configuration: configuration,
            tagger: tagger)
        return all
    }

    /// Every entry, in no particular order.
    @inlinable var entries: [Leaving] {
        table.records.compactMap { record in
            record.key.map { Leaving(key: $0, entry: entry(at: Int(record.slot))) }
        }
    }

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
        policy.admit(slot, hash: hash, entries: table.count)
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
