import Foundation

/// A family of fetched values, one per key, each with the semantics of an ``AsyncState`` — in
/// bounded memory.
///
/// ```swift
/// struct ProfileService {
///     @AsyncStateFamily(expiry: .seconds(60), capacity: 10_000, idleExpiry: .seconds(600))
///     var profiles: [UserID: Profile]
///
///     func profile(_ id: UserID) async throws -> Profile {
///         try await $profiles.value(for: id) { id in try await database.profile(id) }
///     }
/// }
/// ```
///
/// Each key has its own phase, expiry, single flight, retries, timeout, stale-while-revalidate,
/// refresh ahead, negative cache, `set`, `invalidate`, `cancel`, snapshot and `updates` — exactly
/// those of an ``AsyncState`` declared with the same arguments. Fifty concurrent requests for one key
/// run one operation; requests for different keys run in parallel and never wait for each other.
///
/// ## Bounded memory
///
/// - **Capacity.** The family holds at most `capacity` entries. A new key beyond it evicts an entry
///   chosen by W-TinyLFU, Caffeine's policy: recently used entries are kept, and a new key is kept
///   over an old one only if its key has been used more often recently — so a scan of keys used once
///   does not flush the keys used again and again (a `value`, `fetch`, `refresh`, `values` or
///   `updates` counts as a use; `subscript` and `snapshot(for:)` do not). An entry whose fetch is in
///   flight, or that a caller is using, is never evicted: while every candidate is busy the family
///   runs over capacity, and evicts once a use ends. A family of 1,024 or more entries is split into
///   shards (4, or 16 from 4,096), each with its own lock and policy sized for its share of the
///   capacity; the capacity itself stays exact for the whole family.
/// - **Idle expiry.** With `idleExpiry`, an entry not used for that long is removed (TanStack Query's
///   `gcTime`, Caffeine's `expireAfterAccess`) — at that instant on the family's clock, by one sweeper
///   task per family that sleeps until the oldest entry's deadline, not a timer per key.
/// - **Removal callback.** `onRemoval` is told of every entry that leaves, with its last value and
///   why (``AsyncStateFamilyRemovalReason``), after every lock is released.
///
/// A removed or evicted entry's fetch in flight is cancelled (only `remove`; eviction skips them) and
/// its `updates(for:)` streams finish. A later request for the key starts from nothing.
///
/// ## Batches
///
/// ``values(for:retry:_:)`` asks for many keys at once, like GraphQL's DataLoader or Caffeine's
/// `getAll`: one operation loads every key that is neither fresh nor in flight; keys in flight join
/// their flights; each key keeps its own phase and error.
///
/// ## Lifetime
///
/// As for ``AsyncState``: an entry keeps an operation only while its fetch is in flight, so an
/// operation capturing the family's owner never keeps the owner alive.
@propertyWrapper
public struct AsyncStateFamily<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    /// The operation that fetches one key's value.
    public typealias Operation = @Sendable (Key) async throws -> Value
    /// The operation that fetches many keys' values at once; a key missing from its answer fails
    /// with ``AsyncStateError/missingFromBatch``.
    public typealias BatchOperation = @Sendable ([Key]) async throws -> [Key: Value]

    @usableFromInline let core: FamilyCore<Key, Value>

    /// Creates an empty family.
    ///
    /// - Parameters:
    ///   - expiry: How long each key's fetched data stays fresh. Defaults to 120 seconds.
    ///   - capacity: The most entries the family holds; values below 1 mean 1. Defaults to 10,000.
    ///     Any capacity is accepted: memory follows the entries held, not the capacity.
    ///   - maximumWeight: The most the entries may weigh together, as `weigher` weighs them (each
    ///     entry with a value weighs 1 without one); `nil` (the default): no limit but the capacity.
    ///     The bound is the family's, whatever its shards: after any write, and whenever a use of an
    ///     entry ends, the family evicts until it is within both bounds (entries in use or with a
    ///     fetch in flight are never evicted; it then evicts when their use ends). An entry that
    ///     alone weighs more than the maximum is never kept: it is evicted, and reported to
    ///     `onRemoval`, as soon as nobody uses it. An entry is weighed when its value is set and
    ///     when a use of it ends (a background refresh that lands changes its weight at its next
    ///     use). Values below 0 mean 0.
    ///   - weigher: An entry's weight from its key and value (negative weights count as 0; any
    ///     weight up to `Int.max`, summed without overflow). Without a `maximumWeight` it is not used.
    ///   - idleExpiry: An entry not used for this long is removed; `nil` (the default), zero or less:
    ///     never.
    ///   - clock: The clock of every expiry, retry, timeout and the idle sweep. Defaults to
    ///     `ContinuousClock()`; pass a `VirtualClock` in tests.
    ///   - retry: How each key's failed fetches are retried.
    ///   - timeout: The longest one attempt may run (see ``AsyncState``).
    ///   - softTimeout: How long a key's callers wait before they get its value instead, while the
    ///     fetch goes on in the background (see ``AsyncState``). `nil` (the default): off.
    ///   - failureExpiry: How long each key's failure is answered from memory.
    ///   - staleWhileRevalidate: Serve a key's stale value at once and refresh it in the background.
    ///   - refreshAfter: Refresh ahead: a hit on a key's data at least this old, but still fresh,
    ///     returns it and starts one background refresh (see ``AsyncState``).
    ///   - maxStaleAge: Fail-safe: a key's callers get its last good value instead of a failure while
    ///     that value is younger than this (see ``AsyncState`` and <doc:WhenTheSourceIsDown>).
    ///     `nil` (the default), zero or less: off.
    ///   - tags: An entry's tags, from its key and value, for ``invalidate(tag:)`` (a tenant, a
    ///     category, a parent's id; duplicates count once). Computed when an entry's value arrives and
    ///     when a use of it ends, under the family's lock: keep it quick. `nil` (the default): no
    ///     tags, and no cost. Each tagged entry at rest costs its tags' strings and about 100 bytes
    ///     in the index (see <doc:ManyKeys>).
    ///   - isEmpty: Decides whether a fetched value is ``AsyncPhase/empty``. Defaults to never;
    ///     a family of collections or of optionals has its own initializers, whose default is the
    ///     one ``AsyncState`` has (an empty collection, `nil`).
    ///   - onRemoval: Called when an entry leaves the family or its value is replaced by
    ///     ``set(_:for:)``, with the key, its last value and the reason; after every lock is
    ///     released, on the thread that caused it. Keep it short.
    ///   - name: What the family reports as to `observer`.
    ///   - observer: Receives what every entry does, with its key (see ``AsyncStateObserver``), and
    ///     every removal; `nil` (the default): nothing is recorded.
    ///   - secondLevel: A cache the family's replicas share behind their memory, read on a miss
    ///     before the source, with fleet-wide single flight (see ``AsyncStateSecondLevelOptions``);
    ///     `nil` (the default): none. Batches (``values(for:retry:_:)``) and coalesced misses do not use it.
    public init(
        expiry: Duration = .seconds(120),
        capacity: Int = 10_000,
        maximumWeight: Int? = nil,
        weigher: (@Sendable (Key, Value) -> Int)? = nil,
        idleExpiry: Duration? = nil,
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        softTimeout: Duration? = nil,
        failureExpiry: Duration = .zero,
        staleWhileRevalidate: Bool = false,
        refreshAfter: Duration? = nil,
        maxStaleAge: Duration? = nil,
        tags: (@Sendable (Key, Value) -> [String])? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil,
        onRemoval: (@Sendable (Key, Value?, AsyncStateFamilyRemovalReason) -> Void)? = nil,
        name: String = "",
        observer: (any AsyncStateObserver)? = nil,
        secondLevel: AsyncStateSecondLevelOptions<Value>? = nil
    ) {
        self.init(
            expiry, capacity, maximumWeight, weigher, idleExpiry, clock, retry, timeout, softTimeout, failureExpiry,
            staleWhileRevalidate, refreshAfter, maxStaleAge, tags, onRemoval, name, observer,
            secondLevel, isEmpty: isEmpty)
    }

    /// Creates an empty family of collections; an empty collection is ``AsyncPhase/empty``, as in an
    /// ``AsyncState`` of a collection.
    ///
    /// The parameters are those of
    /// ``init(expiry:capacity:maximumWeight:weigher:idleExpiry:clock:retry:timeout:softTimeout:failureExpiry:staleWhileRevalidate:refreshAfter:maxStaleAge:tags:isEmpty:onRemoval:name:observer:secondLevel:)-8qgzw``;
    /// `isEmpty` overrides `Collection.isEmpty` as the emptiness test.
    public init(
        expiry: Duration = .seconds(120),
        capacity: Int = 10_000,
        maximumWeight: Int? = nil,
        weigher: (@Sendable (Key, Value) -> Int)? = nil,
        idleExpiry: Duration? = nil,
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        softTimeout: Duration? = nil,
        failureExpiry: Duration = .zero,
        staleWhileRevalidate: Bool = false,
        refreshAfter: Duration? = nil,
        maxStaleAge: Duration? = nil,
        tags: (@Sendable (Key, Value) -> [String])? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil,
        onRemoval: (@Sendable (Key, Value?, AsyncStateFamilyRemovalReason) -> Void)? = nil,
        name: String = "",
        observer: (any AsyncStateObserver)? = nil,
        secondLevel: AsyncStateSecondLevelOptions<Value>? = nil
    ) where Value: Collection {
        self.init(
            expiry, capacity, maximumWeight, weigher, idleExpiry, clock, retry, timeout, softTimeout, failureExpiry,
            staleWhileRevalidate, refreshAfter, maxStaleAge, tags, onRemoval, name, observer,
            secondLevel, isEmpty: isEmpty ?? { $0.isEmpty })
    }

    /// Creates an empty family of optionals; `nil` is ``AsyncPhase/empty``, as in an ``AsyncState``
    /// of an optional.
    ///
    /// The parameters are those of
    /// ``init(expiry:capacity:maximumWeight:weigher:idleExpiry:clock:retry:timeout:softTimeout:failureExpiry:staleWhileRevalidate:refreshAfter:maxStaleAge:tags:isEmpty:onRemoval:name:observer:secondLevel:)-8qgzw``;
    /// `isEmpty` overrides `== nil` as the emptiness test.
    public init<Wrapped: Sendable>(
        expiry: Duration = .seconds(120),
        capacity: Int = 10_000,
        maximumWeight: Int? = nil,
        weigher: (@Sendable (Key, Value) -> Int)? = nil,
        idleExpiry: Duration? = nil,
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        softTimeout: Duration? = nil,
        failureExpiry: Duration = .zero,
        staleWhileRevalidate: Bool = false,
        refreshAfter: Duration? = nil,
        maxStaleAge: Duration? = nil,
        tags: (@Sendable (Key, Value) -> [String])? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil,
        onRemoval: (@Sendable (Key, Value?, AsyncStateFamilyRemovalReason) -> Void)? = nil,
        name: String = "",
        observer: (any AsyncStateObserver)? = nil,
        secondLevel: AsyncStateSecondLevelOptions<Value>? = nil
    ) where Value == Wrapped? {
        self.init(
            expiry, capacity, maximumWeight, weigher, idleExpiry, clock, retry, timeout, softTimeout, failureExpiry,
            staleWhileRevalidate, refreshAfter, maxStaleAge, tags, onRemoval, name, observer,
            secondLevel, isEmpty: isEmpty ?? { $0 == nil })
    }

    /// Creates a family holding `wrappedValue`'s values, fresh from now, as if each were given to
    /// ``set(_:for:)`` (beyond the capacity, the first ones are evicted).
    ///
    /// The other parameters are those of
    /// ``init(expiry:capacity:maximumWeight:weigher:idleExpiry:clock:retry:timeout:softTimeout:failureExpiry:staleWhileRevalidate:refreshAfter:maxStaleAge:tags:isEmpty:onRemoval:name:observer:secondLevel:)-8qgzw``.
    public init(
        wrappedValue: [Key: Value],
        expiry: Duration = .seconds(120),
        capacity: Int = 10_000,
        maximumWeight: Int? = nil,
        weigher: (@Sendable (Key, Value) -> Int)? = nil,
        idleExpiry: Duration? = nil,
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        softTimeout: Duration? = nil,
        failureExpiry: Duration = .zero,
        staleWhileRevalidate: Bool = false,
        refreshAfter: Duration? = nil,
        maxStaleAge: Duration? = nil,
        tags: (@Sendable (Key, Value) -> [String])? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil,
        onRemoval: (@Sendable (Key, Value?, AsyncStateFamilyRemovalReason) -> Void)? = nil,
        name: String = "",
        observer: (any AsyncStateObserver)? = nil,
        secondLevel: AsyncStateSecondLevelOptions<Value>? = nil
    ) {
        self.init(
            expiry, capacity, maximumWeight, weigher, idleExpiry, clock, retry, timeout, softTimeout, failureExpiry,
            staleWhileRevalidate, refreshAfter, maxStaleAge, tags, onRemoval, name, observer,
            secondLevel, isEmpty: isEmpty)
        for (key, value) in wrappedValue { set(value, for: key) }
    }

    /// Creates a family of collections holding `wrappedValue`'s values, as
    /// ``init(wrappedValue:expiry:capacity:maximumWeight:weigher:idleExpiry:clock:retry:timeout:softTimeout:failureExpiry:staleWhileRevalidate:refreshAfter:maxStaleAge:tags:isEmpty:onRemoval:name:observer:secondLevel:)``
    /// does; an empty collection is ``AsyncPhase/empty``.
    public init(
        wrappedValue: [Key: Value],
        expiry: Duration = .seconds(120),
        capacity: Int = 10_000,
        maximumWeight: Int? = nil,
        weigher: (@Sendable (Key, Value) -> Int)? = nil,
        idleExpiry: Duration? = nil,
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        softTimeout: Duration? = nil,
        failureExpiry: Duration = .zero,
        staleWhileRevalidate: Bool = false,
        refreshAfter: Duration? = nil,
        maxStaleAge: Duration? = nil,
        tags: (@Sendable (Key, Value) -> [String])? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil,
        onRemoval: (@Sendable (Key, Value?, AsyncStateFamilyRemovalReason) -> Void)? = nil,
        name: String = "",
        observer: (any AsyncStateObserver)? = nil,
        secondLevel: AsyncStateSecondLevelOptions<Value>? = nil
    ) where Value: Collection {
        self.init(
            expiry, capacity, maximumWeight, weigher, idleExpiry, clock, retry, timeout, softTimeout, failureExpiry,
            staleWhileRevalidate, refreshAfter, maxStaleAge, tags, onRemoval, name, observer,
            secondLevel, isEmpty: isEmpty ?? { $0.isEmpty })
        for (key, value) in wrappedValue { set(value, for: key) }
    }

    /// Creates a family of optionals holding `wrappedValue`'s values, as
    /// ``init(wrappedValue:expiry:capacity:maximumWeight:weigher:idleExpiry:clock:retry:timeout:softTimeout:failureExpiry:staleWhileRevalidate:refreshAfter:maxStaleAge:tags:isEmpty:onRemoval:name:observer:secondLevel:)``
    /// does; `nil` is ``AsyncPhase/empty``.
    public init<Wrapped: Sendable>(
        wrappedValue: [Key: Value],
        expiry: Duration = .seconds(120),
        capacity: Int = 10_000,
        maximumWeight: Int? = nil,
        weigher: (@Sendable (Key, Value) -> Int)? = nil,
        idleExpiry: Duration? = nil,
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        softTimeout: Duration? = nil,
        failureExpiry: Duration = .zero,
        staleWhileRevalidate: Bool = false,
        refreshAfter: Duration? = nil,
        maxStaleAge: Duration? = nil,
        tags: (@Sendable (Key, Value) -> [String])? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil,
        onRemoval: (@Sendable (Key, Value?, AsyncStateFamilyRemovalReason) -> Void)? = nil,
        name: String = "",
        observer: (any AsyncStateObserver)? = nil,
        secondLevel: AsyncStateSecondLevelOptions<Value>? = nil
    ) where Value == Wrapped? {
        self.init(
            expiry, capacity, maximumWeight, weigher, idleExpiry, clock, retry, timeout, softTimeout, failureExpiry,
            staleWhileRevalidate, refreshAfter, maxStaleAge, tags, onRemoval, name, observer,
            secondLevel, isEmpty: isEmpty ?? { $0 == nil })
        for (key, value) in wrappedValue { set(value, for: key) }
    }

    /// What the public initializers share; they differ only in the default emptiness test (and in
    /// the values some of them start with).
    private init(
        _ expiry: Duration, _ capacity: Int, _ maximumWeight: Int?, _ weigher: (@Sendable (Key, Value) -> Int)?,
        _ idleExpiry: Duration?, _ clock: some Clock<Duration>, _ retry: RetryPolicy, _ timeout: Duration?,
        _ softTimeout: Duration?,
        _ failureExpiry: Duration, _ staleWhileRevalidate: Bool, _ refreshAfter: Duration?, _ maxStaleAge: Duration?,
        _ tags: (@Sendable (Key, Value) -> [String])?,
        _ onRemoval: (@Sendable (Key, Value?, AsyncStateFamilyRemovalReason) -> Void)?, _ name: String,
        _ observer: (any AsyncStateObserver)?, _ secondLevel: AsyncStateSecondLevelOptions<Value>?,
        isEmpty: (@Sendable (Value) -> Bool)?
    ) {
        // No test at all when none is given (never empty): the test is generic code, called on
        // every success. `guard let` rather than `map` inside it: `Optional.map` looked up its
        // metadata on every call.
        var emptiness: (@Sendable (Value?) -> Bool)?
        if let isEmpty {
            emptiness = { value in
                guard let value else { return false }
                return isEmpty(value)
            }
        }
        let configuration = StoreConfiguration<Value?>(
            expiry: expiry, failureExpiry: failureExpiry,
            isEmpty: emptiness, retry: retry,
            timeout: timeout, softTimeout: softTimeout, staleWhileRevalidate: staleWhileRevalidate,
            refreshAfter: refreshAfter, maxStaleAge: maxStaleAge)
        core = FamilyCore(
            capacity: capacity, maximumWeight: maximumWeight, weigher: weigher, idleExpiry: idleExpiry,
            configuration: configuration, clock: StoreClock(clock), onRemoval: onRemoval, name: name,
            observer: observer, tagger: tags, secondLevel: secondLevel)
    }

    // MARK: Reading

    /// The values the family holds now, by key (a copy; keys without a value are left out).
    /// Specialized in the caller's module, as the other reads are.
    @inlinable
    public var wrappedValue: [Key: Value] {
        var values: [Key: Value] = [:]
        values.reserveCapacity(core.count)
        core.forEachValue { values[$0] = $1 }
        return values
    }

    /// The family itself: `$profiles.value(for:) { … }` and the rest of the API.
    public var projectedValue: AsyncStateFamily<Key, Value> { self }

    /// The latest value of `key`, or `nil` if it has none (never fetched, or not in the family). Does
    /// not count as a use. Specialized in the caller's module, as ``value(for:retry:_:)`` is: one
    /// shard's lock, no allocation.
    @inlinable
    public subscript(key: Key) -> Value? {
        core.latestValue(of: key)
    }

    /// The current snapshot of `key` — its value (`nil` before its first fetch), phase, expiry and
    /// metadata — or `nil` when the key has no entry. Does not count as a use. Specialized in the
    /// caller's module, as the subscript is.
    @inlinable
    public func snapshot(for key: Key) -> AsyncSnapshot<Value?>? {
        core.snapshot(of: key, at: core.clock.now())
    }

    /// The snapshots of every entry.
    @inlinable
    public var snapshots: [Key: AsyncSnapshot<Value?>] {
        var snapshots: [Key: AsyncSnapshot<Value?>] = [:]
        snapshots.reserveCapacity(core.count)
        core.forEachSnapshot(at: core.clock.now()) { snapshots[$0] = $1 }
        return snapshots
    }

    /// What the family's second level has done (see ``AsyncStateSecondLevelOptions``), or `nil`
    /// without one.
    public var secondLevelStatistics: AsyncStateSecondLevelStatistics? { core.secondLevel?.statistics }

    /// The number of entries (keys with a value, a fetch in flight, a failure or a subscriber).
    public var count: Int { core.count }

    /// What the entries weigh together, as the `weigher` last weighed them (at most `Int.max`: the
    /// sum itself never overflows); 0 without a `maximumWeight`. No more than the maximum weight,
    /// except while entries in use, which are never evicted, weigh more.
    public var weight: Int { core.weight }

    /// `key`'s current snapshot first, then one per transition, in order, like
    /// ``AsyncState/updates``. Makes the key's entry if it has none, and counts as a use; the stream
    /// finishes when the entry leaves the family (removed, evicted or idle).
    @inlinable
    public func updates(for key: Key) -> AsyncStream<AsyncSnapshot<Value?>> {
        core.usingNow(key) { $0.cell.subscribe(at: core.clock.now()) }
    }
}
