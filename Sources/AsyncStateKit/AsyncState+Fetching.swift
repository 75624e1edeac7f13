extension AsyncState {
    // MARK: Fetching

    /// Fetches unless the data is fresh, and returns once the fetch has settled.
    ///
    /// Joins a fetch in flight instead of starting another. Never throws: the outcome is in ``phase``
    /// (a failure is ``AsyncPhase/failure(_:)``). Returns at once when the caller's task is cancelled,
    /// and while a failure is within the state's `failureExpiry`. Unlike ``value(retry:_:)``, it waits
    /// for the fetch even with `staleWhileRevalidate`.
    ///
    /// - Parameters:
    ///   - retry: The retry policy for a fetch this call starts; `nil` for the state's.
    ///   - operation: Fetches the value. The state keeps it only while the fetch is in flight.
    @inlinable
    public nonisolated(nonsending) func fetch(retry: RetryPolicy? = nil, _ operation: @escaping Operation) async {
        if store.hit(\.value) != nil { return }
        _ = try? await fetchFromStore(.fetch, .plain(operation), retry: retry)
    }

    /// Fetches even if the data is fresh, replacing a fetch in flight (whose result is discarded), and
    /// returns once the fetch has settled.
    ///
    /// - Parameters:
    ///   - retry: The retry policy for this fetch; `nil` for the state's.
    ///   - operation: Fetches the value.
    @inlinable
    public nonisolated(nonsending) func refresh(retry: RetryPolicy? = nil, _ operation: @escaping Operation) async {
        _ = try? await store.fetch(.refresh, policy: retry, storeOperation(.plain(operation)))
    }

    /// Returns the value: at once when fresh, else from the fetch in flight or a new one.
    ///
    /// ```swift
    /// let config = try await $config.value { try await loadConfig() }
    /// ```
    ///
    /// With `staleWhileRevalidate`, expired data that was fetched before is returned at once too,
    /// while a background fetch (one at a time) refreshes it. With `failureExpiry`, a failure within
    /// it is thrown at once, without calling the source.
    ///
    /// - Parameters:
    ///   - retry: The retry policy for a fetch this call starts; `nil` for the state's.
    ///   - operation: Fetches the value.
    /// - Throws: The operation's error when the fetch fails (after its retries), or the cached one
    ///   within the failure expiry; ``AsyncStateError/timedOut(after:)`` when it timed out;
    ///   ``AsyncStateError/tooManyAbandonedOperations(limit:)`` when timed-out operations pile up;
    ///   `CancellationError` when the caller's task is cancelled or the fetch is cancelled
    ///   (``cancel()``, ``reset()``);
    ///   ``AsyncStateError/reentrantCall`` when called from inside this state's own operation.
    @inlinable
    public nonisolated(nonsending) func value(retry: RetryPolicy? = nil, _ operation: @escaping Operation)
        async throws -> Value
    {
        // The hit path is inlined into the caller (and specialized there): a lock and a clock read.
        if let fresh = store.hit(\.value) { return fresh }
        return try await fetchFromStore(.value, .plain(operation), retry: retry)
    }

    /// Answers like ``value(retry:_:)`` — at once when fresh (or stale under `staleWhileRevalidate`),
    /// else once the fetch settles — but returns the value together with its metadata as one
    /// snapshot, both from the same moment: the phase, the date of the success, whether it was
    /// expired, the failure count.
    ///
    /// Reading ``snapshot`` after ``value(retry:_:)`` is two reads: another transition may land
    /// between them, pairing the value with someone else's date. Here the value and its metadata are
    /// one snapshot, so a handler can turn it into a response with ``AsyncSnapshot/fold(initial:loading:empty:success:failure:)``:
    ///
    /// ```swift
    /// let snapshot = try await $config.snapshot { try await loadConfig() }
    /// let age = snapshot.lastSuccess.map { Date().timeIntervalSince($0) }  // an `Age` header
    /// ```
    ///
    /// A failed fetch is not thrown: it is the snapshot's phase (``AsyncPhase/failure(_:)``), with the
    /// previous value, if any, in ``AsyncSnapshot/previousValue``. Under a failure expiry the cached
    /// failure is returned the same way, without calling the source. Under stale-while-revalidate,
    /// a stale value comes with the phase ``AsyncPhase/loading`` of the refresh it started.
    ///
    /// - Parameters:
    ///   - retry: The retry policy for a fetch this call starts; `nil` for the state's.
    ///   - operation: Fetches the value.
    /// - Returns: The snapshot once the call is answered (a later transition may already be in it: a
    ///   snapshot is always the state's latest as a whole, never a mix of two).
    /// - Throws: `CancellationError` when the caller's task is cancelled;
    ///   ``AsyncStateError/reentrantCall`` and ``AsyncStateError/tooManyAbandonedOperations(limit:)``,
    ///   which no fetch ran to put in the phase.
    @inlinable
    public nonisolated(nonsending) func snapshot(retry: RetryPolicy? = nil, _ operation: @escaping Operation)
        async throws -> AsyncSnapshot<Value>
    {
        if let fresh = store.hit(\.freshSnapshot) { return fresh }
        return try await snapshotFromStore(.plain(operation), retry: retry)
    }

    /// Answers like ``snapshot(retry:_:)``, passing `context` to an operation that captures nothing,
    /// so that a hit allocates nothing whatever the operation needs (see ``value(using:retry:_:)``):
    ///
    /// ```swift
    /// let snapshot = try await $config.snapshot(using: client) { try await $0.loadConfig() }
    /// ```
    ///
    /// - Parameters:
    ///   - context: What the operation needs. On a miss it is kept with the operation while the fetch
    ///     is in flight.
    ///   - retry: The retry policy for a fetch this call starts; `nil` for the state's.
    ///   - operation: Fetches the value from `context`. It should capture nothing.
    /// - Returns: The snapshot once the call is answered, as ``snapshot(retry:_:)`` does.
    /// - Throws: What ``snapshot(retry:_:)`` throws.
    @inlinable
    public nonisolated(nonsending) func snapshot<Context: Sendable>(
        using context: Context, retry: RetryPolicy? = nil,
        _ operation: @escaping @Sendable (Context) async throws -> Value
    ) async throws -> AsyncSnapshot<Value> {
        if let fresh = store.hit(\.freshSnapshot) { return fresh }
        return try await snapshotFromStore(.plain { try await operation(context) }, retry: retry)
    }

    /// The miss path of ``snapshot(retry:_:)``: the latest snapshot once the store has answered.
    /// Specialized in the caller's module, never inlined into it (as ``fetchFromStore(_:_:retry:)``).
    @inlinable @inline(never)
    nonisolated(nonsending) func snapshotFromStore(_ operation: AsyncStateStore<Value>.Operation, retry: RetryPolicy?)
        async throws -> AsyncSnapshot<Value>
    {
        do {
            _ = try await fetchFromStore(.value, operation, retry: retry)
        } catch {
            try rethrowIfNotInPhase(error)
        }
        return snapshot
    }

    /// Returns the value like ``value(retry:_:)``, passing `context` to an operation that captures
    /// nothing, so that a hit allocates nothing whatever the operation needs.
    ///
    /// A closure that captures values (`{ try await db.profile(id) }`) has its captures boxed on the
    /// heap each time it is formed — on every call, even when the data is fresh and the closure never
    /// runs. Pass them as `context` instead; the operation is formed only when the state must fetch:
    ///
    /// ```swift
    /// let profile = try await $profile.value(using: (db, id)) { try await $0.0.profile($0.1) }
    /// ```
    ///
    /// - Parameters:
    ///   - context: What the operation needs (a client, a key, a tuple of them). On a miss it is kept
    ///     with the operation while the fetch is in flight.
    ///   - retry: The retry policy for a fetch this call starts; `nil` for the state's.
    ///   - operation: Fetches the value from `context`. It should capture nothing.
    /// - Throws: What ``value(retry:_:)`` throws.
    @inlinable
    public nonisolated(nonsending) func value<Context: Sendable>(
        using context: Context, retry: RetryPolicy? = nil,
        _ operation: @escaping @Sendable (Context) async throws -> Value
    ) async throws -> Value {
        if let fresh = store.hit(\.value) { return fresh }
        return try await fetchFromStore(.value, .plain { try await operation(context) }, retry: retry)
    }

    /// Fetches unless the data is fresh, like ``fetch(retry:_:)``, passing `context` to an operation
    /// that captures nothing, so that a hit allocates nothing (see ``value(using:retry:_:)``).
    ///
    /// - Parameters:
    ///   - context: What the operation needs. On a miss it is kept with the operation while the fetch
    ///     is in flight.
    ///   - retry: The retry policy for a fetch this call starts; `nil` for the state's.
    ///   - operation: Fetches the value from `context`. It should capture nothing.
    @inlinable
    public nonisolated(nonsending) func fetch<Context: Sendable>(
        using context: Context, retry: RetryPolicy? = nil,
        _ operation: @escaping @Sendable (Context) async throws -> Value
    ) async {
        if store.hit(\.value) != nil { return }
        _ = try? await fetchFromStore(.fetch, .plain { try await operation(context) }, retry: retry)
    }

    /// The miss path of ``value(retry:_:)`` and ``fetch(retry:_:)``: asks the store for `request`.
    /// Inlinable, so that it is specialized for the caller's `Value` (a cold caller then looks up no
    /// generic metadata), but never inlined: the hit path it follows stays small.
    @inlinable @inline(never)
    nonisolated(nonsending) func fetchFromStore(
        _ request: FetchRequest, _ operation: AsyncStateStore<Value>.Operation, retry: RetryPolicy?
    ) async throws -> Value {
        try await store.fetch(request, policy: retry, storeOperation(operation))
    }

    /// The operation the store runs: `operation`, through the second level if the state has one.
    /// Never inlined into the async miss path, whose frame its branches would grow (see
    /// ``AsyncStateFamily``'s).
    @inlinable @inline(never)
    func storeOperation(_ operation: AsyncStateStore<Value>.Operation) -> AsyncStateStore<Value>.Operation {
        guard let secondLevel else { return operation }
        return secondLevel.operation(
            named: secondLevel.stateKey, reportingTo: store, operation, unwrap: { $0 }, stored: { $0 })
    }

    /// Re-runs the fetch when the phase is ``AsyncPhase/failure(_:)`` or ``AsyncPhase/empty`` — with
    /// `operation`, bypassing the failure expiry — and returns once it has settled. While a fetch waits
    /// out its backoff before an automatic retry, starts that retry now instead (with the fetch's own
    /// operation). Otherwise — a fetch running, or any other phase — does nothing.
    ///
    /// ```swift
    /// if case .failure = $quotes.phase { await $quotes.retry { try await self.client.load() } }
    /// ```
    ///
    /// - Parameter operation: Fetches the value. The state keeps it only while the fetch is in flight.
    @inlinable
    public nonisolated(nonsending) func retry(_ operation: @escaping Operation) async {
        try? await store.retry(storeOperation(.plain(operation)))
    }

    /// Skips the backoff of a fetch that waits to retry automatically: its next attempt starts now, and
    /// this returns once the fetch has settled. Otherwise does nothing.
    ///
    /// A state keeps an operation only while its fetch is in flight (so that an operation capturing
    /// its owner never keeps the owner alive): after a fetch has settled there is no operation left to
    /// re-run, so to retry a failure pass the operation to ``retry(_:)``.
    public nonisolated(nonsending) func retry() async {
        try? await store.retry(nil)
    }

    /// Keeps the value refreshed in the background until the calling task is cancelled: fetches now
    /// unless the data is fresh, then, `interval` after each fetch settles, refreshes it (joining a
    /// fetch in flight instead of starting another, whatever the freshness and failure expiry).
    ///
    /// Shaped like a swift-service-lifecycle `Service.run()`: it owns its work and returns only when
    /// its task is cancelled, so it cannot outlive — or keep alive — whoever runs it. Run it from a
    /// service's `run()` or a task group:
    ///
    /// ```swift
    /// actor RatesService {
    ///     @AsyncState(expiry: .seconds(90)) var rates: Rates = .empty
    ///     func run() async throws {
    ///         try await $rates.run(every: .seconds(60)) { try await self.client.rates() }
    ///     }
    /// }
    /// ```
    ///
    /// Failures do not stop it: they show in ``phase`` and the next refresh comes an interval later.
    /// When the calling task is cancelled, a fetch it is waiting for is cancelled too unless other
    /// callers wait for it.
    ///
    /// - Parameters:
    ///   - interval: The pause between the end of one fetch and the start of the next, clamped to
    ///     ``AsyncStateLimits/maximumDuration``.
    ///   - retry: The retry policy for the fetches it starts; `nil` for the state's.
    ///   - operation: Fetches the value; kept until this returns.
    /// - Throws: ``AsyncStateError/invalidInterval(_:)`` at once for a zero or negative interval; the
    ///   error of the clock's sleep if it throws without the task being cancelled (so that a broken
    ///   clock stops it loudly, not silently). Returns normally when cancelled.
    public nonisolated(nonsending) func run(
        every interval: Duration, retry: RetryPolicy? = nil, _ operation: @escaping Operation
    ) async throws {
        try await run(every: interval, retry: retry, operation: .plain(operation))
    }

    /// ``run(every:retry:_:)`` with the store's operation (a plain or a conditional one).
    nonisolated(nonsending) func run(
        every interval: Duration, retry: RetryPolicy?, operation: AsyncStateStore<Value>.Operation
    ) async throws {
        guard interval > .zero else { throw AsyncStateError.invalidInterval(interval) }
        let interval = interval.clampedToLimits
        let operation = storeOperation(operation)
        var first = true
        while !Task.isCancelled {
            _ = try? await store.fetch(.periodic(first: first), policy: retry, operation)
            first = false
            do {
                try await store.clock.sleep(store.clock.now().saturatingAdd(interval))
            } catch {
                if Task.isCancelled { return }
                throw error
            }
        }
    }

    // MARK: Warm restarts

    /// The state's data saved for a warm restart (value, phase, date of its success); `nil` while it
    /// has no value. A value kept through a later failure or during a fetch is saved too, with the
    /// phase it had when it arrived (``AsyncStateArchive/phase`` says what ``phase`` said then: empty
    /// or success, whatever the emptiness test would say of it now).
    public var archive: AsyncStateArchive<Value>? {
        store.archived.map {
            AsyncStateArchive(value: $0.value, phase: $0.isEmpty ? .empty : .success, lastSuccess: $0.lastSuccess)
        }
    }

    /// Loads data saved by ``archive`` (typically by the previous process), as stale data: every
    /// reader sees it expired (``snapshot``'s `isExpired`, ``hasExpired(in:)``), and only new data (a
    /// fetch that succeeds, ``set(_:)``) makes it fresh. It is served at once under
    /// stale-while-revalidate; under refresh ahead it is answered at once while one refetch runs, as
    /// fresh data due for its refresh would be, for `expiry − refreshAfter` after the restore or
    /// until ``invalidate()`` (a refetch that fails leaves it stale, and the next call tries again);
    /// it is refetched before it is served otherwise.
    ///
    /// Only a state with no value and no fetch in flight takes it — data the state fetched or was
    /// given since is newer — so restoring is safe at any moment.
    ///
    /// - Returns: Whether the archive was restored.
    /// - Throws: ``AsyncStateArchiveError`` for an archive of an unknown format version or phase;
    ///   the state is left as it was.
    @discardableResult
    public nonisolated(nonsending) func restore(_ archive: AsyncStateArchive<Value>)
        async throws(AsyncStateArchiveError)
        -> Bool
    {
        let archive = try archive.validated()
        return store.restore(archive.value, isEmpty: archive.phase == .empty, lastSuccess: archive.lastSuccess)
    }

    /// Marks the data expired: the next ``fetch(retry:_:)`` goes to the source. A fetch in flight still
    /// completes, but its result lands already expired.
    @inlinable
    public nonisolated(nonsending) func invalidate() async {
        store.invalidate()
    }

    /// Cancels the fetch in flight, if any: its callers get `CancellationError`, the phase goes back to
    /// what it was before the fetch, and the value is untouched.
    @inlinable
    public nonisolated(nonsending) func cancel() async {
        store.cancel()
    }

    /// Writes a value (a manual or optimistic update), fresh from now: the phase becomes
    /// ``AsyncPhase/success(_:)`` (or ``AsyncPhase/empty``). A fetch in flight is cancelled and its
    /// callers get this value; its result never overwrites it.
    ///
    /// This replica's memory only: to write the value into a second level too and announce it to the
    /// other replicas, use ``AsyncStateInvalidator/set(_:in:topic:)``.
    @inlinable
    public nonisolated(nonsending) func set(_ value: Value) async {
        store.set(value, version: 0)
    }

    /// Goes back to the initial value and ``AsyncPhase/initial``, forgetting the metadata. A
    /// fetch in flight is cancelled and its callers get `CancellationError`.
    @inlinable
    public nonisolated(nonsending) func reset() async {
        store.reset()
    }
}
