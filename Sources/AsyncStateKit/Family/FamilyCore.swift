import Foundation
public import Synchronization

/// The shared part of an ``AsyncStateFamily``: its shards, its configuration and its idle sweeper.
///
/// Each key has its own store while it is used (the same as an ``AsyncState``'s, with `Value?` so
/// that a key has no value before its first fetch), made with the family's configuration and clock,
/// and its data at rest, packed, while nobody uses it (see ``FamilyShard``). A key belongs
/// to one shard, chosen by its hash; each shard has its own lock and eviction policy. The capacity
/// and the maximum weight are the family's, not a shard's: the entries are counted by an atomic
/// count, and weighed by a ``WeightLedger``, across shards. A write or the end of a use that takes
/// the family past either evicts within its own shard first, then from the other shards in turn
/// (see ``trim(after:)``), so any entry no heavier than the maximum can be held however
/// the keys fall into shards. The hit path takes one shard's lock (and, for a live entry, its
/// store's); no lock or actor is shared by all keys.
///
/// Lock order: the sweeper's lock, then a shard's, then a store's or the weight ledger's. Removal
/// callbacks run after every lock is released.
@usableFromInline
final class FamilyCore<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    @usableFromInline typealias Shard = FamilyShard<Key, Value>
    @usableFromInline typealias Store = AsyncStateStore<Value?>
    @usableFromInline typealias OnRemoval = @Sendable (Key, Value?, AsyncStateFamilyRemovalReason) -> Void

    @usableFromInline let shards: [ReadMostlyLock<Shard>]
    /// The shards' storage, unretained (``shards`` keeps it alive): a hit reads its shard here (see
    /// ``withHitShard(_:_:)``).
    @usableFromInline let unretainedShards: UnretainedShards
    @usableFromInline let shardMask: Int
    /// Whether there is an observer: all the hit path reads without one. The fields a hit reads come
    /// first, together (placed after the observer, which grew by a key, this one cost a 1,000-key
    /// hit 2 ns in `HitLoop family 1000`, 50 against 48 ns).
    @usableFromInline let isObserved: Bool
    @usableFromInline let clock: StoreClock
    /// How long a hit is answered from the shard (see ``StoreConfiguration/hitWindow``).
    @usableFromInline let hitWindow: Duration
    @usableFromInline let configuration: StoreConfiguration<Value?>
    /// How long data stays fresh (for snapshots).
    @usableFromInline let expiry: Duration
    @usableFromInline let capacity: Int
    /// What the entries weigh together, with the maximum; `nil` without a maximum weight.
    @usableFromInline let ledger: WeightLedger?
    @usableFromInline let idleExpiry: Duration?
    @usableFromInline let onRemoval: OnRemoval?
    /// The family's observer, reporting as the family (each entry reports with its key: see
    /// ``observation(of:)``).
    @usableFromInline let observer: Observation?
    /// The number of entries, across shards (changed under a shard's lock, read anywhere).
    @usableFromInline let population = Atomic<Int>(0)
    /// Seeds for the stores' retry jitter (a random seed per store would cost a system call each).
    @usableFromInline let seeds = Atomic<UInt64>(UInt64.random(in: .min ... .max))
    @usableFromInline let sweeper = LockedValue<Sweeper>(Sweeper())
    /// The open batch of coalesced misses, made by the first such miss (a family that never
    /// coalesces allocates nothing for it).
    @usableFromInline let coalescerReference = AtomicLazyReference<BatchCoalescer<Key, Value>>()
    /// What a miss does with the second level, if the family has one (see
    /// ``AsyncStateSecondLevelOptions``); hits never read it.
    @usableFromInline let secondLevel: SecondLevelLoader<Value>?

    /// The family's batch coalescer (see ``BatchCoalescer``).
    @inlinable
    var coalescer: BatchCoalescer<Key, Value> {
        coalescerReference.load() ?? coalescerReference.storeIfNil(BatchCoalescer(clock: clock, observer: observer))
    }

    /// The idle sweeper's task: one per family, sleeping until the oldest entry's idle deadline.
    @usableFromInline struct Sweeper {
        @usableFromInline var running = false
        @usableFromInline var task: Task<Void, Never>?
    }

    @inlinable init(
        capacity: Int, maximumWeight: Int? = nil, weigher: (@Sendable (Key, Value) -> Int)? = nil,
        idleExpiry: Duration?, configuration: StoreConfiguration<Value?>, clock: StoreClock, onRemoval: OnRemoval?,
        name: String = "", observer: (any AsyncStateObserver)? = nil,
        tagger: (@Sendable (Key, Value) -> [String])? = nil, secondLevel: AsyncStateSecondLevelOptions<Value>? = nil
    ) {
        self.observer = observer.map { Observation(name: name, key: nil, observer: $0) }
        self.secondLevel = secondLevel.map { options in
            SecondLevelLoader(options: options, clock: clock) { value in
                configuration.lifetime(of: value)
            }
        }
        isObserved = observer != nil
        let capacity = max(1, capacity)
        // One shard for a small family (one policy for the whole family); up to 16
        // for a large one, so that concurrent hits on different keys rarely share a lock.
        let shardCount = capacity >= 16 * 256 ? 16 : capacity >= 4 * 256 ? 4 : 1
        // Without a weigher an entry with a value weighs 1. A negative maximum means zero.
        let weigher = maximumWeight == nil ? nil : weigher ?? { _, _ in 1 }
        let ledger = maximumWeight.map { WeightLedger(maximum: max(0, $0)) }
        let idleExpiry = idleExpiry.flatMap { $0 > .zero ? $0.clampedToLimits : nil }
        shards = (0..<shardCount).map { index in
            // Each shard's policy is sized for its share of the capacity; the maximum weight is the
            // family's (the ledger).
            ReadMostlyLock(
                Shard(
                    capacity: capacity / shardCount + (index < capacity % shardCount ? 1 : 0),
                    weigher: weigher, ledger: ledger, tracksIdle: idleExpiry != nil, configuration: configuration,
                    tagger: tagger))
        }
        unretainedShards = UnretainedShards(shards)
        self.ledger = ledger
        shardMask = shardCount - 1
        self.capacity = capacity
        self.idleExpiry = idleExpiry
        self.configuration = configuration
        hitWindow = configuration.hitWindow
        expiry = configuration.expiry
        self.clock = clock
        self.onRemoval = onRemoval
    }

    deinit {
        sweeper.withLock { $0.task }?.cancel()
        unretainedShards.storage.deallocate()
    }

    @inlinable
    func shard(for key: Key) -> ReadMostlyLock<Shard> {
        shards[shardIndex(for: key)]
    }

    /// The index of `key`'s shard.
    @inlinable
    func shardIndex(for key: Key) -> Int {
        shardMask == 0 ? 0 : key.hashValue & shardMask
    }

    // MARK: Reads that are not uses

    /// The latest value of `key`, if it has an entry with one; no access is recorded. Inlinable, as
    /// the hit paths are: specialized in the caller's module, it looks up no generic metadata.
    @inlinable
    func latestValue(of key: Key) -> Value? {
        let hash = key.hashValue
        return withHitShard(hash, read: { Shard.latestValue(in: $0, of: key, hash: hash) })
    }

    /// The snapshot of `key`'s entry at `now`, or `nil` without an entry; no access is recorded.
    /// Inlinable, as ``latestValue(of:)``.
    @inlinable
    func snapshot(of key: Key, at now: Duration) -> AsyncSnapshot<Value?>? {
        let hash = key.hashValue
        return withHitShard(hash, read: { Shard.snapshot(in: $0, of: key, hash: hash, at: now, expiry: expiry) })
    }

    /// Calls `body` with every entry's key and snapshot at `now`, shard by shard, under each shard's
    /// lock (so `body` must not use the family). Inlinable, as the single reads are.
    @inlinable
    func forEachSnapshot(at now: Duration, _ body: (Key, AsyncSnapshot<Value?>) -> Void) {
        for shard in shards { shard.withLock { $0.forEachSnapshot(at: now, expiry: expiry, body) } }
    }

    /// Calls `body` with every entry's key and latest value, for the entries that have one, as
    /// ``forEachSnapshot(at:_:)`` does.
    @inlinable
    func forEachValue(_ body: (Key, Value) -> Void) {
        for shard in shards { shard.withLock { $0.forEachValue(body) } }
    }

    // MARK: Hits

    /// The hit path of every read of the family that answers fresh data at once (`value(for:)`,
    /// `fetch(for:)`, `snapshot(for:)`, a batch's keys): `find` on `key`'s shard with the key's hash,
    /// which changes nothing and gives the entry's record position and the answer, if any (see
    /// ``FamilyShard/lookUp(in:_:hash:at:hitWindow:live:)``). The access at `now` is noted on the
    /// entry's slot (``FamilyShard/noteHit(_:position:hash:at:in:)``) at once by a reader that holds the
    /// shard's mutex, or, once the shard's lock has spread, in the reader's stripe's ``AccessBuffer``.
    /// An answer is reported to the observer as a hit.
    @inlinable @inline(__always)
    func hit<Result>(
        _ key: Key, at now: Duration,
        _ find: (UnsafePointer<Shard>, Int) -> (position: Int32, result: Result?)?
    ) -> Result? {
        let hash = key.hashValue
        let fresh = withHitShard(hash) { shard, access -> Result? in
            // The record's position, not the entry's slot, comes back with the answer (the slot is read
            // here, from the record the look-up just read): a pair of it and the answer, as the slot
            // was; a larger tuple holding a generic snapshot was copied through the runtime's generic
            // witnesses, and a snapshot hit took half as long again.
            guard let found = find(shard, hash) else { return nil }
            let position = Int(found.position)
            let slot = shard.pointee.table.records[position].slot
            switch access {
            case .exclusive(let shard): Shard.noteHit(slot, position: position, hash: hash, at: now, in: shard)
            case .shared(let accesses):
                accesses.pointee.append(slot, hash: hash, at: now, lossless: shard.pointee.tracksIdle)
            }
            return found.result
        }
        if isObserved, fresh != nil { observeHit(of: key) }
        return fresh
    }

    /// `key`'s value if it has an entry with fresh data at `now` (see ``hit(_:at:_:)``).
    @inlinable
    func freshValue(of key: Key, at now: Duration) -> Value? {
        hit(key, at: now) { Shard.freshValue(in: $0, of: key, hash: $1, at: now, hitWindow: hitWindow) }
    }

    /// `key`'s snapshot if it has an entry with fresh data at `now` (see ``hit(_:at:_:)``).
    @inlinable
    func freshSnapshot(of key: Key, at now: Duration) -> AsyncSnapshot<Value?>? {
        hit(key, at: now) {
            Shard.freshSnapshot(in: $0, of: key, hash: $1, at: now, hitWindow: hitWindow, expiry: expiry)
        }
    }

    /// Runs `body` on the shard of a key whose hash is `hash`, as a read of its ``ReadMostlyLock``
    /// (see ``ReadMostlyLock/access(_:)``): the hit paths' way to their shard. The shard's storage is
    /// neither retained nor released (an array's element, even read through its buffer, is: a write
    /// to the shard's reference count, which every reader of the shard would share): it is read
    /// through ``unretainedShards``. Always inlined, and `body` with it, so that no closure is called
    /// on a hit.
    @inlinable @inline(__always)
    func withHitShard<Result>(
        _ hash: Int, _ body: (UnsafePointer<Shard>, ReadAccess<Shard>) -> Result
    ) -> Result {
        unretainedShards.storage[hash & shardMask]._withUnsafeGuaranteedRef { $0.access(body) }
    }

    /// Runs `read` on the shard of a key whose hash is `hash`, which it must not change (see
    /// ``withHitShard(_:_:)``).
    @inlinable @inline(__always)
    func withHitShard<Result>(_ hash: Int, read: (UnsafePointer<Shard>) -> Result) -> Result {
        withHitShard(hash) { shard, _ in read(shard) }
    }

    /// The shards' storage, unretained, for the hit path (see ``withHitShard(_:_:)``).
    @usableFromInline
    struct UnretainedShards: @unchecked Sendable {
        // @unchecked Sendable is sound: the buffer is written once, in the family's `init`, before
        // the family is shared, and only read afterwards; each reference in it is kept alive by the
        // family's `shards` until the family's deinit frees the buffer; and what each refers to is a
        // `ReadMostlyLock`'s storage, which that lock makes safe to share.
        @usableFromInline let storage: UnsafeMutableBufferPointer<Unmanaged<ReadMostlyStorage<Shard>>>

        @usableFromInline init(_ shards: [ReadMostlyLock<Shard>]) {
            storage = .allocate(capacity: shards.count)
            _ = storage.initialize(from: shards.map { Unmanaged.passUnretained($0.storage) })
        }
    }

    /// Reports a hit on `key` (outside any lock). Never inlined, as a state's
    /// (``AsyncStateStore/observeHit()``): the event would be part of every caller's async frame.
    @inlinable @inline(never)
    func observeHit(of key: Key) {
        observer?.deliver(.hit, describing: key)
    }

    /// How `key`'s store reports, if the family has an observer.
    @inlinable func observation(of key: Key) -> Observation? {
        // `isObserved` first: reading `observer` copies an optional existential, a cost every miss
        // paid without an observer.
        guard isObserved else { return nil }
        return observer?.entry(key)
    }

    // MARK: Using an entry

    /// Runs `body` with `key`'s store — made for a new key, restored for a compact entry — and
    /// records an access. While `body` runs the entry is in use: it is neither evicted nor made
    /// compact. Afterwards it becomes compact if it settled and nobody else uses it, and the family is
    /// trimmed to its capacity.
    /// Inlinable and always inlined: a miss path that waits then runs in one specialized frame.
    @inlinable @inline(__always)
    nonisolated(nonsending) func using<Result>(_ key: Key, _ body: (Store) async throws -> Result) async rethrows
        -> Result
    {
        // The caller's reference is moved into the call, so that it is gone by the unpin: a store
        // nothing else references is kept as a spare (see ``FamilyShard/unpin(_:)``).
        var store = Optional(pin(key))
        defer { unpin(key) }
        return try await body(store.take().unsafelyUnwrapped)
    }

    /// As ``using(_:_:)``, for synchronous work.
    @inlinable func usingNow<Result>(_ key: Key, _ body: (Store) throws -> Result) rethrows -> Result {
        var store = Optional(pin(key))
        defer { unpin(key) }
        return try body(store.take().unsafelyUnwrapped)
    }

    /// Marks `key`'s entry in use and returns its store (see ``using(_:_:)``). Every pin needs its
    /// ``unpin(_:)``.
    @inlinable
    func pin(_ key: Key) -> Store {
        let now = clock.now()
        let (store, inserted) = shard(for: key).withLock { shard in
            shard.pin(
                key, at: now,
                make: { data, spare in
                    Store.make(
                        restoring: data, initialValue: nil, configuration: configuration, clock: clock,
                        seed: nextSeed(), observation: observation(of: key), reusing: spare)
                })
        }
        if inserted { entered(key) }
        return store
    }

    /// Ends a use of `key`'s entry.
    @inlinable
    func unpin(_ key: Key) {
        // What a store kept as a spare held (the key's value among it) is released as this returns,
        // after the shard's lock: a value's deinit is user code.
        _ = shard(for: key).withLock { $0.unpin(key) }
        trim(after: key)
    }

    /// The total weight of the entries (0 without a maximum weight), at most `Int.max`.
    @inlinable var weight: Int { ledger?.weight ?? 0 }

    /// A store's jitter seed: the next output of a SplitMix64 sequence kept in ``seeds``. Its output,
    /// not its state: a store's generator steps its state by the same constant, so states taken one
    /// step apart would give each store the sequence of the one before it, one draw later (the second
    /// flight of one key would have the backoffs of the first flight of the next).
    @inlinable func nextSeed() -> UInt64 {
        var generator = SplitMix64(seed: seeds.wrappingAdd(0x9E37_79B9_7F4A_7C15, ordering: .relaxed).oldValue)
        return generator.next()
    }

    /// After `key`'s entry was made: counts it, evicts if the family is over its capacity, and starts
    /// the idle sweeper.
    @inlinable func entered(_ key: Key) {
        population.add(1, ordering: .relaxed)
        trim(after: key)
        startSweeperIfNeeded()
    }

    /// Every entry, shard by shard (each shard's entries are read under its lock).
    @inlinable var entries: [Shard.Leaving] {
        shards.flatMap { $0.withLock { $0.entries } }
    }

    /// The number of entries.
    @inlinable var count: Int { population.load(ordering: .relaxed) }

    /// The bytes the shards' buffers hold (see ``FamilyShard/bufferBytes``), for tests.
    @inlinable var bufferBytes: Int { shards.reduce(0) { $0 + $1.withLock { $0.bufferBytes } } }

}
