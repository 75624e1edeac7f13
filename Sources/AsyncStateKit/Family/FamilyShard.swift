/// One shard of a family: its entries, in a dictionary, threaded on a list in order of last access
/// (most recent first). Guarded by the shard's lock; every operation is O(1) except the trims, which
/// are O(entries removed + busy entries skipped).
///
/// The list is exact LRU order, so it serves both eviction for size (drop the least recently used)
/// and idle expiry (the least recently used entry is the first to reach its idle deadline).
///
/// The hit path (`access` of a present key) is inlinable, so that it is specialized for the caller's
/// key and value types: unspecialized, every step would look up generic metadata.
@usableFromInline
struct FamilyShard<Key: Hashable & Sendable, Value: Sendable> {
    @usableFromInline typealias Store = AsyncStateStore<Value?>

    /// One key's entry: its store and its place on the list (slot indices; -1 for none).
    @usableFromInline
    struct Node {
        @usableFromInline var key: Key
        @usableFromInline var store: Store
        @usableFromInline var lastAccess: Duration
        @usableFromInline var newer: Int32 = -1
        @usableFromInline var older: Int32 = -1

        @usableFromInline
        init(key: Key, store: Store, lastAccess: Duration) {
            self.key = key
            self.store = store
            self.lastAccess = lastAccess
        }
    }

    /// An entry that left the shard, for the removal callback (called after the lock is released).
    @usableFromInline
    struct Removed {
        @usableFromInline var key: Key
        @usableFromInline var store: Store
        @usableFromInline var reason: AsyncStateFamilyRemovalReason
    }

    @usableFromInline var index: [Key: Int32] = [:]
    @usableFromInline var nodes: [Node?] = []
    @usableFromInline var freeSlots: [Int32] = []
    /// The most and least recently used entries.
    @usableFromInline var newest: Int32 = -1
    @usableFromInline var oldest: Int32 = -1

    init() {}

    var count: Int { index.count }

    /// The store of `key`, if it has an entry (no access is recorded).
    func peek(_ key: Key) -> Store? {
        index[key].flatMap { nodes[Int($0)]?.store }
    }

    /// The store of `key`, made with `make` if it has none; the access at `now` makes it the most
    /// recently used.
    @inlinable
    mutating func access(_ key: Key, at now: Duration, make: () -> Store) -> (store: Store, inserted: Bool) {
        if let slot = index[key] {
            touch(slot, at: now)
            return (nodes[Int(slot)]!.store, false)
        }
        let store = make()
        let slot = allocate(Node(key: key, store: store, lastAccess: now))
        index[key] = slot
        linkAsNewest(slot)
        return (store, true)
    }

    /// The hit path: if `key` has an entry, records the access at `now` and returns its value if it
    /// is fresh (and not due for a refresh ahead). Reads the store without retaining it.
    @inlinable
    mutating func freshValue(of key: Key, at now: Duration) -> Value? {
        guard let slot = index[key] else { return nil }
        touch(slot, at: now)
        return nodes[Int(slot)]!.store.cell.freshValue(at: now) ?? nil
    }

    /// Evicts up to `excess` least recently used entries that are not busy, into `removed`. Busy
    /// entries (a flight in flight) are skipped, and so is `sparing` (an entry just made, whose
    /// caller is about to fetch). Returns how many it evicted.
    @usableFromInline
    mutating func evict(_ excess: Int, sparing: Key? = nil, into removed: inout [Removed]) -> Int {
        var evicted = 0
        var slot = oldest
        while evicted < excess, slot != -1 {
            let node = nodes[Int(slot)]!
            let newer = node.newer
            if node.key != sparing, !node.store.isBusy {
                remove(slot)
                removed.append(Removed(key: node.key, store: node.store, reason: .evicted))
                evicted += 1
            }
            slot = newer
        }
        return evicted
    }

    /// Removes the entries last accessed at or before `deadline` (idle), oldest first. A busy one is
    /// in use: it counts as accessed `now` instead. Returns the idle deadline of the oldest entry
    /// left (its last access), or `nil` when the shard is empty.
    mutating func removeIdle(accessedBy deadline: Duration, now: Duration, removed: inout [Removed]) -> Duration? {
        while oldest != -1, let node = nodes[Int(oldest)], node.lastAccess <= deadline {
            if node.store.isBusy {
                touch(oldest, at: now)
            } else {
                remove(oldest)
                removed.append(Removed(key: node.key, store: node.store, reason: .idle))
            }
        }
        return oldest == -1 ? nil : nodes[Int(oldest)]!.lastAccess
    }

    /// The last access of the least recently used entry, or `nil` when the shard is empty.
    var oldestAccess: Duration? { oldest == -1 ? nil : nodes[Int(oldest)]!.lastAccess }

    /// Removes `key`'s entry; returns its store.
    mutating func remove(_ key: Key) -> Store? {
        guard let slot = index[key] else { return nil }
        let store = nodes[Int(slot)]!.store
        remove(slot)
        return store
    }

    /// Removes every entry; returns them.
    mutating func removeAll() -> [(Key, Store)] {
        let all = nodes.compactMap { $0.map { ($0.key, $0.store) } }
        self = FamilyShard()
        return all
    }

    /// Every entry, in no particular order.
    var entries: [(key: Key, store: Store)] {
        nodes.compactMap { $0.map { (key: $0.key, store: $0.store) } }
    }

    // MARK: The list

    @inlinable
    mutating func allocate(_ node: Node) -> Int32 {
        if let slot = freeSlots.popLast() {
            nodes[Int(slot)] = node
            return slot
        }
        nodes.append(node)
        return Int32(nodes.count - 1)
    }

    mutating func remove(_ slot: Int32) {
        unlink(slot)
        index[nodes[Int(slot)]!.key] = nil
        nodes[Int(slot)] = nil
        freeSlots.append(slot)
    }

    @inlinable
    mutating func touch(_ slot: Int32, at now: Duration) {
        nodes[Int(slot)]!.lastAccess = now
        guard slot != newest else { return }
        unlink(slot)
        linkAsNewest(slot)
    }

    @inlinable
    mutating func linkAsNewest(_ slot: Int32) {
        nodes[Int(slot)]!.older = newest
        nodes[Int(slot)]!.newer = -1
        if newest != -1 { nodes[Int(newest)]!.newer = slot }
        newest = slot
        if oldest == -1 { oldest = slot }
    }

    @inlinable
    mutating func unlink(_ slot: Int32) {
        let (newer, older) = (nodes[Int(slot)]!.newer, nodes[Int(slot)]!.older)
        if newer != -1 { nodes[Int(newer)]!.older = older } else { newest = older }
        if older != -1 { nodes[Int(older)]!.newer = newer } else { oldest = newer }
    }
}
