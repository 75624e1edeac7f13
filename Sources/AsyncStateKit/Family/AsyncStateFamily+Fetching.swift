import Foundation

extension AsyncStateFamily {
    // MARK: Fetching

    /// Returns `key`'s value, fetching it with `operation` unless it is fresh, like
    /// ``AsyncState/value(retry:_:)``: concurrent callers for one key share one fetch.
    ///
    /// - Parameters:
    ///   - key: The key; its entry is made if it has none.
    ///   - retry: The retry policy for a fetch this call starts; `nil` for the family's.
    ///   - operation: Fetches the value of the key it is given.
    /// - Throws: What ``AsyncState/value(retry:_:)`` throws.
    @inlinable
    public nonisolated(nonsending) func value(
        for key: Key, retry: RetryPolicy? = nil, _ operation: @escaping Operation
    ) async throws -> Value {
        // The hit path is inlined into the caller (and specialized there): a clock read, the shard's
        // lock and, under it, the entry's.
        if let fresh = core.freshValue(of: key, at: core.clock.now()) { return fresh }
        return try await fetchFromStore(key, .value, retry: retry, .plain(operation))
    }

    /// Returns `key`'s value like ``value(for:retry:_:)``, passing `context` to an operation that
    /// captures nothing, so that a hit allocates nothing whatever the operation needs (a closure that
    /// captures values has them boxed each time it is formed, even when it never runs):
    ///
    /// ```swift
    /// let profile = try await $profiles.value(for: id, using: database) { id, database in
    ///     try await database.profile(id)
    /// }
    /// ```
    ///
    /// - Parameters:
    ///   - key: The key; its entry is made if it has none.
    ///   - context: What the operation needs besides the key. On a miss it is kept with the operation
    ///     while the fetch is in flight.
    ///   - retry: The retry policy for a fetch this call starts; `nil` for the family's.
    ///   - operation: Fetches the value of the key it is given, from `context`. It should capture
    ///     nothing.
    /// - Throws: What ``AsyncState/value(retry:_:)`` throws.
    @inlinable
    public nonisolated(nonsending) func value<Context: Sendable>(
        for key: Key, using context: Context, retry: RetryPolicy? = nil,
        _ operation: @escaping @Sendable (Key, Context) async throws -> Value
    ) async throws -> Value {
        if let fresh = core.freshValue(of: key, at: core.clock.now()) { return fresh }
        return try await fetchFromStore(key, .value, retry: retry, .plain { try await operation($0, context) })
    }

    /// Answers like ``value(for:retry:_:)`` but returns `key`'s value with its metadata in one
    /// snapshot, like ``AsyncState/snapshot(retry:_:)``: a failed fetch is the snapshot's phase, not
    /// an error.
    ///
    /// - Parameters:
    ///   - key: The key; its entry is made if it has none.
    ///   - retry: The retry policy for a fetch this call starts; `nil` for the family's.
    ///   - operation: Fetches the value of the key it is given.
    /// - Returns: `key`'s snapshot once the call is answered (its value is `nil` if the key never had
    ///   one).
    /// - Throws: What ``AsyncState/snapshot(retry:_:)`` throws.
    @inlinable
    public nonisolated(nonsending) func snapshot(
        for key: Key, retry: RetryPolicy? = nil, _ operation: @escaping Operation
    ) async throws -> AsyncSnapshot<Value?> {
        if let fresh = core.freshSnapshot(of: key, at: core.clock.now()) { return fresh }
        return try await snapshotFromStore(for: key, retry: retry, .plain(operation))
    }

    /// Answers like ``snapshot(for:retry:_:)``, passing `context` to an operation that captures
    /// nothing, so that a hit allocates nothing whatever the operation needs (see
    /// ``value(for:using:retry:_:)``):
    ///
    /// ```swift
    /// let snapshot = try await $profiles.snapshot(for: id, using: database) { id, database in
    ///     try await database.profile(id)
    /// }
    /// ```
    ///
    /// - Parameters:
    ///   - key: The key; its entry is made if it has none.
    ///   - context: What the operation needs besides the key. On a miss it is kept with the operation
    ///     while the fetch is in flight.
    ///   - retry: The retry policy for a fetch this call starts; `nil` for the family's.
    ///   - operation: Fetches the value of the key it is given, from `context`. It should capture
    ///     nothing.
    /// - Returns: `key`'s snapshot once the call is answered (its value is `nil` if the key never had
    ///   one).
    /// - Throws: What ``AsyncState/snapshot(retry:_:)`` throws.
    @inlinable
    public nonisolated(nonsending) func snapshot<Context: Sendable>(
        for key: Key, using context: Context, retry: RetryPolicy? = nil,
        _ operation: @escaping @Sendable (Key, Context) async throws -> Value
    ) async throws -> AsyncSnapshot<Value?> {
        if let fresh = core.freshSnapshot(of: key, at: core.clock.now()) { return fresh }
        return try await snapshotFromStore(for: key, retry: retry, .plain { try await operation($0, context) })
    }

    /// The miss path of ``snapshot(for:retry:_:)``: the snapshot once `key`'s store has answered.
    /// Specialized in the caller's module but never inlined into it, as ``fetchFromStore(_:_:retry:_:)``.
    @inlinable @inline(never)
    nonisolated(nonsending) func snapshotFromStore(
        for key: Key, retry: RetryPolicy?, _ operation: KeyedOperation
    ) async throws -> AsyncSnapshot<Value?> {
        try await core.using(key) { store in
            do {
                _ = try await fetch(key, from: store, .value, retry: retry, operation)
            } catch {
                try rethrowIfNotInPhase(error)
            }
            // Read while the entry is still in use: it is this store's latest snapshot.
            return store.cell.snapshot(at: core.clock.now())
        }
    }

    /// The miss path of ``value(for:retry:_:)``: specialized in the caller's module (as
    /// ``AsyncState``'s), but never inlined into it, so that the hit path stays small.
    @inlinable @inline(never)
    nonisolated(nonsending) func fetchFromStore(
        _ key: Key, _ request: FetchRequest, retry: RetryPolicy?, _ operation: KeyedOperation
    ) async throws -> Value {
        try await core.using(key) { store in try await fetch(key, from: store, request, retry: retry, operation) }
    }

    /// Fetches `key` unless it is fresh, like ``AsyncState/fetch(retry:_:)``; never throws (the outcome
    /// is in the key's snapshot).
    @inlinable
    public nonisolated(nonsending) func fetch(
        for key: Key, retry: RetryPolicy? = nil, _ operation: @escaping Operation
    ) async {
        if core.freshValue(of: key, at: core.clock.now()) != nil { return }
        _ = try? await fetchFromStore(key, .fetch, retry: retry, .plain(operation))
    }

    /// Fetches `key` now, fresh or not, like ``AsyncState/refresh(retry:_:)``.
    @inlinable
    public nonisolated(nonsending) func refresh(
        for key: Key, retry: RetryPolicy? = nil, _ operation: @escaping Operation
    ) async {
        await core.using(key) { store in
            _ = try? await fetch(key, from: store, .refresh, retry: retry, .plain(operation))
        }
    }

    /// Re-runs `key`'s fetch when its phase is failure or empty, with `operation`, bypassing the
    /// failure expiry; starts a pending automatic retry now; otherwise does nothing — like
    /// ``AsyncState/retry(_:)``. Returns once the fetch has settled.
    @inlinable
    public nonisolated(nonsending) func retry(for key: Key, _ operation: @escaping Operation) async {
        await core.using(key) { store in _ = try? await store.retry(storeOperation(key, store, .plain(operation))) }
    }

    /// Returns the values of `keys`: one run of `operation` loads every key that is neither fresh
    /// nor in flight; a key in flight joins its flight; a fresh key is answered at once.
    ///
    /// ```swift
    /// let results = await $profiles.values(for: ids) { missing in try await database.profiles(missing) }
    /// ```
    ///
    /// Each key gets its own result and phase: a key missing from the operation's answer fails with
    /// ``AsyncStateError/missingFromBatch``; a failed batch fails each of its keys. A key's retries
    /// (its retry policy) load that key alone. Duplicate keys are asked once.
    ///
    /// - Parameters:
    ///   - keys: The keys; their entries are made if they have none.
    ///   - retry: The retry policy of the flights this call starts; `nil` for the family's.
    ///   - operation: Loads the keys it is given, once for all of them.
    /// - Returns: Every requested key's value or error.
    @inlinable
    public nonisolated(nonsending) func values(
        for keys: some Sequence<Key>, retry: RetryPolicy? = nil, _ operation: @escaping BatchOperation
    ) async -> [Key: Result<Value, any Error>] {
        // Inlinable, so that it is specialized in the caller's module: compiled once, generic, in the
        // library, it would look up generic metadata at every step.
        var results: [Key: Result<Value, any Error>] = [:]
        if Task.isCancelled {
            for key in keys { results[key] = .failure(CancellationError()) }
            return results
        }
        let batch = BatchLoad<Key, Value>(operation: operation, observer: core.observer)
        var waiting: [(Key, AsyncStateStore<Value?>, UInt64, Bool)] = []
        var started: [Key] = []
        var attempts: [UInt64] = []
        var fetches: [AsyncStateFetch] = []
        var seen = Set<Key>()
        var pinned: [Key] = []
        defer { for key in pinned { core.unpin(key) } }
        let now = core.clock.now()
        for key in keys where seen.insert(key).inserted {
            if let fresh = core.freshValue(of: key, at: now) {
                results[key] = .success(fresh)
                continue
            }
            let store = core.pin(key)
            pinned.append(key)
            do {
                let attempt: UInt64?
                switch try store.enter(.value, policy: retry, .plain { try await batch.value(for: key) }) {
                case .value(let value, let didStart):
                    results[key] = .success(Self.answered(value))
                    attempt = didStart  // a background refresh (stale or ahead)
                case .wait(let waiter, let didStart):
                    waiting.append((key, store, waiter, didStart != nil))
                    attempt = didStart
                }
                if let attempt {
                    started.append(key)
                    attempts.append(attempt)
                    if let fetch = store.observedFetch { fetches.append(fetch) }
                }
            } catch {
                results[key] = .failure(error)
            }
        }
        // Every flight this call started is known: the batch loads exactly their keys.
        if !started.isEmpty {
            batch.start(started, attempts: attempts, fetches: fetches, executor: core.clock.executor)
        }
        for (key, store, waiter, started) in waiting {
            do {
                results[key] = .success(Self.answered(try await store.wait(waiter, started: started)))
            } catch {
                results[key] = .failure(error)
            }
        }
        // The stores go before the unpins (deferred above), so that a store nothing else holds is
        // kept as a spare, as a single key's is.
        waiting = []
        return results
    }

    /// Returns `key`'s value like ``value(for:retry:_:)``, loading a missing key together with the
    /// other keys missed at about the same time, in one call of a batch operation (DataLoader's
    /// batching, under the family's expiry and eviction):
    ///
    /// ```swift
    /// let profile = try await profiles.value(for: id, batchWindow: .milliseconds(2)) { ids in
    ///     try await database.profiles(ids)  // one query for every id missed within 2 ms
    /// }
    /// ```
    ///
    /// A miss that starts its key's fetch adds the key to the family's open batch, opening one if
    /// there is none. The batch's operation runs once for all its keys when it holds `maxBatchSize`
    /// keys, or when `batchWindow` has passed on the family's clock since it opened, whichever comes
    /// first. A miss whose key is already being fetched waits for that fetch, so each key is loaded
    /// once, and `N` concurrent misses of distinct keys within a window make `⌈N / maxBatchSize⌉`
    /// operation calls. A hit is answered at once, as by ``value(for:retry:_:)``.
    ///
    /// The batch is the family's, not the call's: calls that coalesce should pass the same operation,
    /// window and size. A batch runs the operation of the call that opened it, and keeps its window
    /// and size. The rest is as in ``values(for:retry:_:)``: a key missing from the operation's answer
    /// fails with ``AsyncStateError/missingFromBatch``, a retry of one key runs the operation for that
    /// key alone, and the batch is cancelled once every key's fetch has been.
    ///
    /// - Parameters:
    ///   - key: The key; its entry is made if it has none.
    ///   - batchWindow: How long a batch collects keys after its first; clamped to
    ///     `0...AsyncStateLimits.maximumDuration` (zero: the keys missed before the batch's task
    ///     runs).
    ///   - maxBatchSize: The most keys one operation call loads; less than 1 is taken as 1.
    ///   - retry: The retry policy for a fetch this call starts; `nil` for the family's.
    ///   - operation: Loads the keys it is given, once for all of them.
    /// - Throws: What ``value(for:retry:_:)`` throws, and ``AsyncStateError/missingFromBatch``.
    @inlinable
    public nonisolated(nonsending) func value(
        for key: Key, batchWindow: Duration, maxBatchSize: Int = 100, retry: RetryPolicy? = nil,
        _ operation: @escaping BatchOperation
    ) async throws -> Value {
        if let fresh = core.freshValue(of: key, at: core.clock.now()) { return fresh }
        return try await core.using(key) { store in
            switch try core.coalescer.enter(
                key, in: store, window: batchWindow, maxSize: maxBatchSize, retry: retry, operation)
            {
            case .value(let value, _): return Self.answered(value)
            case .wait(let waiter, let started):
                return Self.answered(try await store.wait(waiter, started: started != nil))
            }
        }
    }

    /// The miss path: waits for `key`'s store to answer `request`.
    @inlinable
    nonisolated(nonsending) func fetch(
        _ key: Key, from store: AsyncStateStore<Value?>, _ request: FetchRequest, retry: RetryPolicy?,
        _ operation: KeyedOperation
    ) async throws -> Value {
        Self.answered(try await store.fetch(request, policy: retry, storeOperation(key, store, operation)))
    }

    /// How a key's operation was given: what ``storeOperation(_:_:_:)`` makes `key`'s store's
    /// operation of.
    @usableFromInline
    enum KeyedOperation: Sendable {
        /// Fetches a key's value (``Operation``).
        case plain(Operation)
        /// Answers a key's value or "not modified", given the value it would replace
        /// (``ConditionalOperation``).
        case conditional(ConditionalOperation)
    }

    /// The operation `key`'s store runs: `operation` for `key`, through the second level if the
    /// family has one. Never inlined into the async miss path: its branches would grow every waiting
    /// caller's frame past the memory a new task starts with (a second slab, one more allocation per
    /// caller).
    @inlinable @inline(never)
    func storeOperation(_ key: Key, _ store: AsyncStateStore<Value?>, _ operation: KeyedOperation)
        -> AsyncStateStore<Value?>.Operation
    {
        let keyed: AsyncStateStore<Value?>.Operation
        switch operation {
        case .plain(let operation):
            keyed = .plain { try await operation(key) }
        case .conditional(let operation):
            keyed = .reading { input in
                switch try await operation(key, input.previous ?? nil) {
                case .modified(let value): return .value(value)
                case .notModified: return .notModified
                }
            }
        }
        guard let secondLevel = core.secondLevel else { return keyed }
        return secondLevel.operation(
            named: secondLevel.key(of: key), reportingTo: store, keyed, unwrap: { $0 }, stored: { $0 })
    }

    /// A value a key's store answered with. A store answers with a value only after a success or a
    /// write (``StateData/hasValue``), and a family's operations and writes give a `Value`, never
    /// `nil`: the entry's `Value?` is `nil` only before its first value, which no answer carries.
    @inlinable
    static func answered(_ value: Value?) -> Value {
        guard let value else { preconditionFailure("a family's entry answered without a value") }
        return value
    }
}
