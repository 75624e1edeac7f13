import Synchronization

/// The shared part of an ``AsyncStateFamily``: its shards, its configuration and its idle sweeper.
///
/// Each key has its own store (the same as an ``AsyncState``'s, with `Value?` so that a key has no
/// value before its first fetch), made on first use with the family's configuration and clock. A key
/// belongs to one shard, chosen by its hash; each shard has its own lock and an exact LRU list. The
/// capacity is the family's, kept by an atomic count of entries: a new entry that takes the count
/// past it evicts from its own shard's least recently used end, under the same lock. The hit path takes the shard's lock (to find the store and record
/// the access) and then the store's; no lock or actor is shared by all keys.
///
/// Lock order: the sweeper's lock, then a shard's, then a store's. Removal callbacks run after every
/// lock is released.
@usableFromInline
final class FamilyCore<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    /// The number of entries, across shards (changed under a shard's lock, read anywhere).
    let population = Atomic<Int>(0)
    @usableFromInline typealias Shard = FamilyShard<Key, Value>
    @usableFromInline typealias Store = AsyncStateStore<Value?>
    typealias OnRemoval = @Sendable (Key, Value?, AsyncStateFamilyRemovalReason) -> Void

    @usableFromInline let shards: [LockedValue<Shard>]
    @usableFromInline let shardMask: Int
    let configuration: StoreConfiguration<Value?>
    @usableFromInline let clock: StoreClock
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
        shards = (0..<shardCount).map { _ in LockedValue(Shard()) }
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

    @inlinable
    func shard(for key: Key) -> LockedValue<Shard> {
        shardMask == 0 ? shards[0] : shards[key.hashValue & shardMask]
    }

    // MARK: Entries

    /// `key`'s value if it has an entry with fresh data (not due for a refresh ahead); records an
    /// access at `now` if it has an entry.
    @inlinable
    func freshValue(of key: Key, at now: Duration) -> Value? {
        shard(for: key).withLock { $0.freshValue(of: key, at: now) }
    }

    /// The store of `key`, made if the key has none; records an access at `now`.
    @inlinable
    func access(_ key: Key, at now: Duration) -> Store {
        let (store, inserted) = shard(for: key).withLock { shard in
            shard.access(key, at: now) { makeStore() }
        }
        if inserted { entered(key) }
        return store
    }

    /// A new key's store.
    @usableFromInline
    func makeStore() -> Store {
        Store(initialValue: nil, configuration: configuration, clock: clock)
    }

    /// After `key`'s entry was made: counts it, evicts if the family is over its capacity, and starts
    /// the idle sweeper.
    @usableFromInline
    func entered(_ key: Key) {
        population.add(1, ordering: .relaxed)
        trim(after: key, sparing: key)
        startSweeperIfNeeded()
    }

    /// The store of `key`, if it has an entry (no access recorded, nothing made).
    func peek(_ key: Key) -> Store? {
        shard(for: key).withLock { $0.peek(key) }
    }

    /// While the family is over its capacity, evicts the least recently used entries of `key`'s shard
    /// that are not busy (and not `sparing`). Called when an entry is made and when a fetch settles
    /// (an entry that was busy may be evicted now).
    func trim(after key: Key, sparing: Key? = nil) {
        guard population.load(ordering: .relaxed) > capacity else { return }
        var removed: [Shard.Removed] = []
        shard(for: key).withLock { shard in
            let excess = population.load(ordering: .relaxed) - capacity
            guard excess > 0 else { return }
            population.subtract(shard.evict(excess, sparing: sparing, into: &removed), ordering: .relaxed)
        }
        report(removed)
    }

    /// Removes `key`'s entry: its fetch in flight is cancelled and its `updates` streams finish.
    /// Returns whether there was one.
    @discardableResult
    func remove(_ key: Key) -> Bool {
        guard
            let store = shard(for: key).withLock({ shard -> Store? in
                let store = shard.remove(key)
                if store != nil { population.subtract(1, ordering: .relaxed) }
                return store
            })
        else { return false }
        store.cancel()
        report([.init(key: key, store: store, reason: .removed)])
        return true
    }

    /// Removes every entry (as ``remove(_:)`` does each).
    func removeAll() {
        for shard in shards {
            let all = shard.withLock { shard in
                let all = shard.removeAll()
                population.subtract(all.count, ordering: .relaxed)
                return all
            }
            for (_, store) in all { store.cancel() }
            report(all.map { .init(key: $0.0, store: $0.1, reason: .removed) })
        }
    }

    /// Every entry, shard by shard (each shard's entries are read under its lock).
    var entries: [(key: Key, store: Store)] {
        shards.flatMap { $0.withLock { $0.entries } }
    }

    /// The number of entries.
    var count: Int { population.load(ordering: .relaxed) }

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
            shard.withLock { shard in
                let before = removed.count
                _ = shard.removeIdle(accessedBy: now - idleExpiry, now: now, removed: &removed)
                population.subtract(removed.count - before, ordering: .relaxed)
            }
        }
        report(removed)
    }
}
