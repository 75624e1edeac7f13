import Foundation

/// One shard of a family: its entries, in a dictionary, threaded on a list in order of last access
/// (most recent first). Guarded by the shard's lock; every operation is O(1) except the trims, which
/// are O(entries removed + busy entries skipped).
///
/// The list is exact LRU order, so it serves both eviction for size (drop the least recently used)
/// and idle expiry (the least recently used entry is the first to reach its idle deadline).
///
/// An entry is **live** — a store, as an ``AsyncState`` has — while someone uses it (a caller between
/// ``pin(_:at:make:)`` and ``unpin(_:)``, a fetch in flight, an `updates` subscriber) or while its
/// state is not settled data (never fetched, failed). An entry nobody uses with settled data is
/// **compact**: its value, dates and counts only, a few dozen bytes besides the key and value; a
/// hit on it reads the shard alone. Pinning a compact entry makes its store again, in the state it
/// had, so every per-key behaviour is the store's.
///
/// The hit path (``freshValue(of:at:hitWindow:)``) is inlinable, so that it is specialized for the
/// caller's key and value types: unspecialized, every step would look up generic metadata.
@usableFromInline
struct FamilyShard<Key: Hashable & Sendable, Value: Sendable> {
    @usableFromInline typealias Store = AsyncStateStore<Value?>
    @usableFromInline typealias Settled = Store.Machine.Settled

    /// What an entry holds (see ``entry(at:)``).
    @usableFromInline
    enum Entry {
        /// Settled data, nobody using it.
        case compact(Settled)
        /// Its store.
        case live(Store)
    }

    /// An entry's place on the list, when it was last used, and how many callers use it now: plain
    /// data, so that the hit path updates it in place.
    @usableFromInline
    struct Link {
        @usableFromInline var lastAccess: Duration
        @usableFromInline var newer: Int32 = -1
        @usableFromInline var older: Int32 = -1
        /// Callers between `pin` and `unpin`.
        @usableFromInline var users: Int32 = 0

        @usableFromInline
        init(lastAccess: Duration) {
            self.lastAccess = lastAccess
        }
    }

    /// What a compact entry keeps besides its value and freshness (read off the hit path).
    struct Metadata {
        var phase: AsyncPhase
        var lastError: (any Error)?
        var lastSuccess: Date?
        var successCount: Int
    }

    /// An entry that left the shard, for the removal callback (called after the lock is released).
    struct Removed {
        var key: Key
        var value: Value?
        var reason: AsyncStateFamilyRemovalReason
    }

    // The entries, by slot, in parallel arrays (a free slot has no key). A live entry has a store; a
    // compact one has its value, freshness and metadata here instead.
    @usableFromInline var index: [Key: Int32] = [:]
    @usableFromInline var keys: [Key?] = []
    @usableFromInline var links: [Link] = []
    @usableFromInline var stores: [Store?] = []
    @usableFromInline var values: [Value?] = []
    @usableFromInline var freshSince: [Duration?] = []
    var metadata: [Metadata?] = []
    @usableFromInline var freeSlots: [Int32] = []
    /// The most and least recently used entries.
    @usableFromInline var newest: Int32 = -1
    @usableFromInline var oldest: Int32 = -1

    init() {}

    var count: Int { index.count }

    // MARK: Hits

    /// The hit path: if `key` has an entry, records the access at `now` and returns its value if it
    /// is fresh and was not fresh for `hitWindow` or longer (the refresh-ahead age, or the expiry).
    /// A live entry is read without being retained.
    @inlinable
    mutating func freshValue(of key: Key, at now: Duration, hitWindow: Duration) -> Value? {
        guard let slot = index[key] else { return nil }
        touch(slot, at: now)
        let i = Int(slot)
        if let store = stores[i] { return store.cell.freshValue(at: now) ?? nil }
        return isWithinExpiry(since: freshSince[i], at: now, expiry: hitWindow) ? values[i] : nil
    }

    // MARK: Entries

    /// The entry at `slot`.
    func entry(at slot: Int) -> Entry {
        if let store = stores[slot] { return .live(store) }
        let metadata = metadata[slot]!
        return .compact(
            Settled(
                value: values[slot], phase: metadata.phase, freshSince: freshSince[slot],
                lastError: metadata.lastError, lastSuccess: metadata.lastSuccess, successCount: metadata.successCount))
    }

    /// The latest value of the entry at `slot`.
    func value(at slot: Int) -> Value? {
        stores[slot].map { $0.cell.value } ?? values[slot]
    }

    /// Whether the entry at `slot` is in use: never evicted nor dropped as idle then.
    func isBusy(_ slot: Int) -> Bool {
        links[slot].users > 0 || stores[slot]?.isBusy == true
    }

    /// Makes the entry at `slot` live with `store`.
    private mutating func makeLive(_ slot: Int, _ store: Store) {
        stores[slot] = store
        values[slot] = nil
        freshSince[slot] = nil
        metadata[slot] = nil
    }

    /// Makes the entry at `slot` compact with `settled`.
    private mutating func makeCompact(_ slot: Int, _ settled: Settled) {
        stores[slot] = nil
        values[slot] = settled.value
        freshSince[slot] = settled.freshSince
        metadata[slot] = Metadata(
            phase: settled.phase, lastError: settled.lastError, lastSuccess: settled.lastSuccess,
            successCount: settled.successCount)
    }

    // MARK: Using an entry

    /// `key`'s store, for a caller that will use it until ``unpin(_:)``: made with `make` for a new
    /// key, restored with `restore` from a compact entry. The access at `now` makes the entry the
    /// most recently used. Returns whether the key's entry is new.
    mutating func pin(
        _ key: Key, at now: Duration, make: () -> Store, restore: (Settled) -> Store
    ) -> (store: Store, inserted: Bool) {
        if let slot = index[key] {
            touch(slot, at: now)
            let i = Int(slot)
            links[i].users += 1
            if let store = stores[i] { return (store, false) }
            let store = restore(entry(at: i).settled!)
            makeLive(i, store)
            return (store, false)
        }
        let store = make()
        let slot = allocate(key, at: now)
        makeLive(Int(slot), store)
        links[Int(slot)].users = 1
        return (store, true)
    }

    /// A caller is done with `key`'s store: if nobody else uses it and its state is settled, the
    /// entry becomes compact.
    mutating func unpin(_ key: Key) {
        guard let slot = index[key] else { return }  // removed meanwhile
        let i = Int(slot)
        links[i].users -= 1
        guard links[i].users == 0, let store = stores[i], let settled = store.settledState else { return }
        makeCompact(i, settled)
    }

    /// Writes `value` as ``AsyncStateStore/set(_:)`` would, if `key` has no entry or a compact one
    /// that nobody uses: returns `done`, whether it made the entry, and the value it replaced.
    /// Otherwise returns `done == false` and changes nothing (the caller sets through the store).
    mutating func setIfCompact(_ value: Value, for key: Key, at now: Duration, date: Date, isEmpty: Bool) -> (
        done: Bool, inserted: Bool, replaced: Value?
    ) {
        let phase: AsyncPhase = isEmpty ? .empty : .success(date)
        guard let slot = index[key] else {
            let slot = Int(allocate(key, at: now))
            makeCompact(
                slot,
                Settled(
                    value: value, phase: phase, freshSince: now, lastError: nil, lastSuccess: nil, successCount: 0))
            return (true, true, nil)
        }
        let i = Int(slot)
        guard links[i].users == 0, stores[i] == nil else { return (false, false, nil) }
        let replaced = values[i]
        // `set` keeps the metadata (last error, last success, success count).
        values[i] = value
        freshSince[i] = now
        metadata[i]!.phase = phase
        touch(slot, at: now)
        return (true, false, replaced)
    }

    /// Marks `key`'s compact data expired, as ``AsyncStateStore/invalidate()`` would; returns the
    /// store of a live entry instead (for the caller to invalidate), or `nil`.
    mutating func invalidateIfCompact(_ key: Key) -> Store? {
        guard let slot = index[key] else { return nil }
        if let store = stores[Int(slot)] { return store }
        freshSince[Int(slot)] = nil
        return nil
    }

    /// The entry of `key`, if any (no access is recorded).
    func peek(_ key: Key) -> Entry? {
        index[key].map { entry(at: Int($0)) }
    }

    // MARK: Removing entries

    /// An entry as it leaves: its key, entry and latest value.
    struct Leaving {
        var key: Key
        var entry: Entry
        var value: Value? {
            switch entry {
            case .compact(let settled): return settled.value
            case .live(let store): return store.cell.value
            }
        }
    }

    /// Evicts up to `excess` least recently used entries that are not busy, into `removed`. Busy
    /// entries (in use, or with a flight in flight) are skipped, and so is `sparing` (an entry just
    /// made, whose caller is about to fetch). Returns how many it evicted.
    mutating func evict(_ excess: Int, sparing: Key? = nil, into removed: inout [Removed]) -> Int {
        var evicted = 0
        var slot = oldest
        while evicted < excess, slot != -1 {
            let newer = links[Int(slot)].newer
            let key = keys[Int(slot)]!
            if key != sparing, !isBusy(Int(slot)) {
                removed.append(Removed(key: key, value: value(at: Int(slot)), reason: .evicted))
                remove(slot)
                evicted += 1
            }
            slot = newer
        }
        return evicted
    }

    /// Removes the entries last accessed at or before `deadline` (idle), oldest first. A busy one is
    /// in use: it counts as accessed `now` instead. Returns how many it removed.
    mutating func removeIdle(accessedBy deadline: Duration, now: Duration, into removed: inout [Removed]) -> Int {
        var count = 0
        while oldest != -1, links[Int(oldest)].lastAccess <= deadline {
            let slot = oldest
            if isBusy(Int(slot)) {
                touch(slot, at: now)
            } else {
                removed.append(Removed(key: keys[Int(slot)]!, value: value(at: Int(slot)), reason: .idle))
                remove(slot)
                count += 1
            }
        }
        return count
    }

    /// The last access of the least recently used entry, or `nil` when the shard is empty.
    var oldestAccess: Duration? { oldest == -1 ? nil : links[Int(oldest)].lastAccess }

    /// Removes `key`'s entry; returns it.
    mutating func remove(_ key: Key) -> Leaving? {
        guard let slot = index[key] else { return nil }
        let leaving = Leaving(key: key, entry: entry(at: Int(slot)))
        remove(slot)
        return leaving
    }

    /// Removes every entry; returns them.
    mutating func removeAll() -> [Leaving] {
        let all = entries
        self = FamilyShard()
        return all
    }

    /// Every entry, in no particular order.
    var entries: [Leaving] {
        index.map { key, slot in Leaving(key: key, entry: entry(at: Int(slot))) }
    }

    // MARK: The list

    /// A slot for a new entry of `key`, used at `now`, as the most recently used (its contents are
    /// set by the caller).
    mutating func allocate(_ key: Key, at now: Duration) -> Int32 {
        let slot: Int32
        if let free = freeSlots.popLast() {
            slot = free
            keys[Int(slot)] = key
            links[Int(slot)] = Link(lastAccess: now)
        } else {
            slot = Int32(keys.count)
            keys.append(key)
            links.append(Link(lastAccess: now))
            stores.append(nil)
            values.append(nil)
            freshSince.append(nil)
            metadata.append(nil)
        }
        index[key] = slot
        linkAsNewest(slot)
        return slot
    }

    mutating func remove(_ slot: Int32) {
        unlink(slot)
        let i = Int(slot)
        index[keys[i]!] = nil
        keys[i] = nil
        stores[i] = nil
        values[i] = nil
        freshSince[i] = nil
        metadata[i] = nil
        freeSlots.append(slot)
    }

    @inlinable
    mutating func touch(_ slot: Int32, at now: Duration) {
        links[Int(slot)].lastAccess = now
        guard slot != newest else { return }
        unlink(slot)
        linkAsNewest(slot)
    }

    @inlinable
    mutating func linkAsNewest(_ slot: Int32) {
        links[Int(slot)].older = newest
        links[Int(slot)].newer = -1
        if newest != -1 { links[Int(newest)].newer = slot }
        newest = slot
        if oldest == -1 { oldest = slot }
    }

    @inlinable
    mutating func unlink(_ slot: Int32) {
        let (newer, older) = (links[Int(slot)].newer, links[Int(slot)].older)
        if newer != -1 { links[Int(newer)].older = older } else { newest = older }
        if older != -1 { links[Int(older)].newer = newer } else { oldest = newer }
    }
}

extension FamilyShard.Entry {
    /// The settled state of a compact entry.
    var settled: FamilyShard.Settled? {
        if case .compact(let settled) = self { return settled } else { return nil }
    }
}
