/// The shared part of an ``AsyncStateFamily``: its shards, its configuration and its idle sweeper.
///
/// Each key has its own store (the same as an ``AsyncState``'s, with `Value?` so that a key has no
/// value before its first fetch), made on first use with the family's configuration and clock. A key
/// belongs to one shard, chosen by its hash; each shard has its own lock and an exact LRU list, and
/// holds its share of the capacity. The hit path takes the shard's lock (to find the store and record
/// the access) and then the store's; no lock or actor is shared by all keys.
///
/// Lock order: the sweeper's lock, then a shard's, then a store's. Removal callbacks run after every
/// lock is released.
final class FamilyCore<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    typealias Shard = FamilyShard<Key, Value>
    typealias Store = AsyncStateStore<Value?>
    typealias OnRemoval = @Sendable (Key, Value?, AsyncStateFamilyRemovalReason) -> Void

    private let shards: [LockedValue<Shard>]
    private let shardMask: Int
    let configuration: StoreConfiguration<Value?>
    let clock: StoreClock
    let capacity: Int
    let idleExpiry: Duration?
    private let onRemoval: OnRemoval?
    private let sweeper = LockedValue<Sweeper>(Sweeper())

    /// The idle sweeper's task: one per family, sleeping until the oldest entry's idle deadline.
    private struct Sweeper {
        var running = false
        var task: Task<Void, Never>?
    }

    init(
        capacity: Int, idleExpiry: Duration?, configuration: StoreConfiguration<Value?>, clock: StoreClock,
        onRemoval: OnRemoval?
    ) {
        let capacity = max(1, capacity)
        // One shard for a small family (its LRU order is then exact for the whole family); up to 16
        // for a large one, so that concurrent hits on different keys rarely share a lock.
        let shardCount = capacity >= 16 * 256 ? 16 : capacity >= 4 * 256 ? 4 : 1
        shards = (0..<shardCount).map { index in
            // The capacity is shared out exactly: the first shards take the remainder.
            LockedValue(Shard(capacity: capacity / shardCount + (index < capacity % shardCount ? 1 : 0)))
        }
        shardMask = shardCount - 1
        self.capacity = capacity
        self.idleExpiry = idleExpiry.flatMap { $0 > .zero ? $0.clampedToLimits : nil }
        self.configuration = configuration
        self.clock = clock
        self.onRemoval = onRemoval
    }

    deinit {
        sweeper.withLock { $0.task }?.cancel()
    }

    private func shard(for key: Key) -> LockedValue<Shard> {
        shards[key.hashValue & shardMask]
    }

    // MARK: Entries

    /// The store of `key`, made if the key has none; records an access at `now`.
    func access(_ key: Key, at now: Duration) -> Store {
        var removed: [Shard.Removed] = []
        let (store, inserted) = shard(for: key).withLock { shard in
            shard.access(key, at: now, removed: &removed) {
                Store(initialValue: nil, configuration: configuration, clock: clock)
            }
        }
        report(removed)
        if inserted { startSweeperIfNeeded() }
        return store
    }

    /// The store of `key`, if it has an entry (no access recorded, nothing made).
    func peek(_ key: Key) -> Store? {
        shard(for: key).withLock { $0.peek(key) }
    }

    /// Evicts what a shard kept over its capacity because it was busy (after a fetch settled).
    func trim(after key: Key) {
        var removed: [Shard.Removed] = []
        shard(for: key).withLock { shard in
            if shard.count > shard.capacity { shard.trimToCapacity(removed: &removed) }
        }
        report(removed)
    }

    /// Removes `key`'s entry: its fetch in flight is cancelled and its `updates` streams finish.
    /// Returns whether there was one.
    @discardableResult
    func remove(_ key: Key) -> Bool {
        guard let store = shard(for: key).withLock({ $0.remove(key) }) else { return false }
        store.cancel()
        report([.init(key: key, store: store, reason: .removed)])
        return true
    }

    /// Removes every entry (as ``remove(_:)`` does each).
    func removeAll() {
        for shard in shards {
            let all = shard.withLock { $0.removeAll() }
            for (_, store) in all { store.cancel() }
            report(all.map { .init(key: $0.0, store: $0.1, reason: .removed) })
        }
    }

    /// Every entry, shard by shard (each shard's entries are read under its lock).
    var entries: [(key: Key, store: Store)] {
        shards.flatMap { $0.withLock { $0.entries } }
    }

    /// The number of entries.
    var count: Int {
        shards.reduce(0) { $0 + $1.withLock { $0.count } }
    }

    /// Reports a replaced value to the removal callback.
    func reportReplaced(_ key: Key, _ value: Value?) {
        onRemoval?(key, value, .replaced)
    }

    private func report(_ removed: [Shard.Removed]) {
        guard let onRemoval else { return }
        for entry in removed { onRemoval(entry.key, entry.store.cell.value, entry.reason) }
    }

    // MARK: Idle expiry

    /// Starts the sweeper if the family has an idle expiry and it is not running.
    private func startSweeperIfNeeded() {
        guard idleExpiry != nil else { return }
        let start = sweeper.withLock { sweeper in
            defer { sweeper.running = true }
            return !sweeper.running
        }
        guard start else { return }
        let task = Task(executorPreference: clock.executor) { [weak self, clock] in
            while let deadline = self?.nextSweep() {
                do {
                    try await clock.sleep(deadline)
                } catch {
                    // Cancelled (the family is gone), or a clock that cannot sleep: stop; the next new
                    // entry starts a sweeper again.
                    self?.sweeper.withLock { $0.running = false }
                    return
                }
                self?.sweep()
            }
        }
        sweeper.withLock { $0.task = task }
    }

    /// When the oldest entry becomes idle; `nil` (and the sweeper stops) when there is no entry.
    private func nextSweep() -> Duration? {
        guard let idleExpiry else { return nil }
        return sweeper.withLock { sweeper in
            let oldest = shards.compactMap { $0.withLock { $0.oldestAccess } }.min()
            if oldest == nil { sweeper.running = false }
            return oldest.map { $0.saturatingAdd(idleExpiry) }
        }
    }

    /// Removes every entry not accessed for the idle expiry.
    private func sweep() {
        guard let idleExpiry else { return }
        let now = clock.now()
        var removed: [Shard.Removed] = []
        for shard in shards {
            _ = shard.withLock { $0.removeIdle(accessedBy: now - idleExpiry, now: now, removed: &removed) }
        }
        report(removed)
    }
}
