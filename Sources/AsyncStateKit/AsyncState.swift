/// A property that owns one value fetched from somewhere slow or unreliable, and its ``AsyncPhase``,
/// with expiry, single flight, retry, invalidation and cancellation.
///
/// ```swift
/// struct ConfigService {
///     @AsyncState var config: Config = .default
///
///     func current() async throws -> Config {
///         // Fifty concurrent callers: one load. The next two minutes: served from memory.
///         try await $config.value { try await loadConfig() }
///     }
/// }
/// ```
///
/// `config` reads the latest value synchronously (kept while a fetch is in flight and after a
/// failure); `$config` is the wrapper itself, with the async API.
///
/// ## Where it can live
///
/// The wrapper holds a reference to its store, so copies share one state (like SwiftUI's `@State`).
/// Swift rejects a wrapped `var` in a `Sendable` final class and wrappers cannot be applied to `let`,
/// so use it in a `struct`, an `actor`, or a global-actor-isolated class — or, in a `Sendable` final
/// class, hold it as a plain `let`:
///
/// ```swift
/// final class Forecasts: Sendable {
///     let today = AsyncState<[Forecast]>(wrappedValue: [])
/// }
/// ```
///
/// ## Semantics
///
/// - **Value and phase are separate.** During ``AsyncPhase/loading`` and after
///   ``AsyncPhase/failure(_:)`` the previous value stays readable; only success or empty replace it.
/// - **Empty** is decided by a predicate: `isEmpty` for collections, `nil` for optionals, never for
///   other types; an `isEmpty:` argument overrides all. Empty is a successful answer and stays fresh
///   for the expiry like success.
/// - **Expiry** is measured on the injected clock's monotonic instants, lazily (nothing runs when data
///   expires): data is fresh for less than `expiry` after it arrived. Initial and failure are always
///   expired. An `expiry` of zero or less means data is never fresh: every ``fetch(retry:_:)`` runs the
///   operation (still one at a time).
/// - **Single flight.** Concurrent ``fetch(retry:_:)`` and ``value(retry:_:)`` calls join the flight in flight:
///   one operation runs and every caller gets its outcome. A joining caller's operation is not run.
///   ``refresh(retry:_:)`` replaces the flight in flight; the older result is discarded.
/// - **Newest write wins.** A result of a flight that was replaced, cancelled, or overtaken by
///   ``set(_:)`` or ``reset()`` never lands.
/// - **Cancellation is never a failure.** A caller whose task is cancelled stops waiting at once; the
///   operation goes on while other callers wait, and is cancelled when the last one leaves.
///   ``cancel()`` cancels it outright. Either way the phase goes back to what it was, the value
///   untouched. An operation that throws `CancellationError` by itself counts as cancelled too.
/// - **Reentrancy.** An operation that calls ``value(retry:_:)`` on its own state (directly or through other
///   states) would wait for itself: the call throws ``AsyncStateError/reentrantCall``; ``fetch(retry:_:)``,
///   ``refresh(retry:_:)`` and ``retry(_:)`` return at once without doing anything. A task the operation
///   starts inherits that mark only while the operation runs: once it has returned, the task may use
///   the state freely.
/// - **Lifetime.** A state keeps an operation only while that operation's fetch is in flight (its
///   attempts and retries); once the fetch settles, is cancelled or is replaced, the state forgets it.
///   So an operation that captures its owner (`{ try await self.load() }`) never keeps the owner alive:
///   when the owner's last reference goes and no fetch is in flight, the owner, the state, every task
///   and timer are freed and ``updates`` streams finish. Work that re-runs an operation later takes it
///   explicitly: ``retry(_:)``, and ``run(every:retry:_:)``, which a service's task group or
///   `ServiceGroup` owns and ends by cancelling it.
/// - **Timeouts bound the wait.** With `timeout:`, every caller is released at the deadline with
///   ``AsyncStateError/timedOut(after:)`` even if the operation ignores cancellation; the operation is
///   cancelled and its late result dropped. A retry may start while an abandoned operation still runs;
///   at most ``AsyncStateLimits/abandonedOperations`` of them may pile up.
/// - **Durations never trap.** Every duration is clamped to ``AsyncStateLimits/maximumDuration`` (100
///   years) before it reaches a clock.
///
/// ## Testing
///
/// Pass a `VirtualClock` (from `AsyncStateTesting`) as `clock:`. The store's tasks take part in the
/// clock's settling: when `advance(by:)` returns, a fetch whose operation was woken has settled.
@propertyWrapper
public struct AsyncState<Value: Sendable>: Sendable {
    /// The operation that fetches the value.
    public typealias Operation = @Sendable () async throws -> Value

    @usableFromInline let store: AsyncStateStore<Value>

    /// Creates a state holding `wrappedValue` until the first fetch.
    ///
    /// ```swift
    /// @AsyncState(expiry: .seconds(30), retry: .tanStack, timeout: .seconds(5))
    /// var rates: ExchangeRates = .empty
    /// ```
    ///
    /// - Parameters:
    ///   - wrappedValue: The initial value (also what ``reset()`` goes back to).
    ///   - expiry: How long fetched data stays fresh. Defaults to 120 seconds; zero or less means
    ///     never fresh. Like every duration, clamped to ``AsyncStateLimits/maximumDuration``.
    ///   - clock: The clock expiry, retries, timeouts and ``run(every:retry:_:)`` run on. Defaults to
    ///     `ContinuousClock()`; pass a `VirtualClock` in tests.
    ///   - retry: How failed fetches are retried (each call may override it). Defaults to
    ///     ``RetryPolicy/never``.
    ///   - timeout: The longest one attempt may run. At the deadline its callers are released with
    ///     ``AsyncStateError/timedOut(after:)`` (a failure, which the retry policy may retry), even if the
    ///     operation ignores cancellation; the operation is cancelled and its late result dropped.
    ///     `nil` (the default), zero or negative: no timeout.
    ///   - failureExpiry: How long a failure is answered from memory (a negative cache): within it,
    ///     ``value(retry:_:)`` throws the cached error and ``fetch(retry:_:)`` returns at once, without
    ///     calling the source again. ``refresh(retry:_:)``, ``retry(_:)``, ``run(every:retry:_:)`` and
    ///     ``invalidate()`` bypass or end it. Counted from when the failed fetch settled (after its
    ///     retries). Defaults to zero: off, every request after a failure goes to the source.
    ///   - staleWhileRevalidate: When `true`, ``value(retry:_:)`` on expired data returns the stale value
    ///     at once and refreshes it in the background (not while a failure is within `failureExpiry`).
    ///     ``fetch(retry:_:)`` still waits for the fetch to settle. Defaults to `false`.
    ///   - refreshAfter: Refresh ahead: a ``value(retry:_:)`` or ``fetch(retry:_:)`` that finds data at
    ///     least this old, but still fresh, returns it at once and starts one background refresh with
    ///     its operation. Callers then never wait at the expiry while the source keeps up, yet no data is
    ///     served past its expiry: a caller that comes after the expiry waits for the refresh in
    ///     flight. A refresh that fails leaves the data fresh until its own expiry, and the next hit
    ///     tries again (not within `failureExpiry`). `nil` (the default), zero or less, or not shorter
    ///     than `expiry`: off.
    ///   - isEmpty: Decides whether a fetched value is ``AsyncPhase/empty``. Without it, a value is
    ///     never empty (collections and optionals have their own initializers).
    ///   - name: What the state reports as to `observer` (a log's metadata, a metric's label).
    ///   - observer: Receives what the state does (see ``AsyncStateObserver``); `nil` (the default):
    ///     nothing is recorded.
    public init(
        wrappedValue: Value,
        expiry: Duration = .seconds(120),
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        failureExpiry: Duration = .zero,
        staleWhileRevalidate: Bool = false,
        refreshAfter: Duration? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil,
        name: String = "",
        observer: (any AsyncStateObserver)? = nil
    ) {
        self.init(
            wrappedValue, expiry, clock, retry, timeout, failureExpiry, staleWhileRevalidate, refreshAfter,
            name: name, observer: observer, isEmpty: isEmpty ?? { _ in false })
    }

    /// Creates a state holding a collection; an empty collection is ``AsyncPhase/empty``.
    ///
    /// The parameters are those of ``init(wrappedValue:expiry:clock:retry:timeout:failureExpiry:staleWhileRevalidate:refreshAfter:isEmpty:name:observer:)-8otjj``;
    /// `isEmpty` overrides `Collection.isEmpty` as the emptiness test.
    public init(
        wrappedValue: Value,
        expiry: Duration = .seconds(120),
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        failureExpiry: Duration = .zero,
        staleWhileRevalidate: Bool = false,
        refreshAfter: Duration? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil,
        name: String = "",
        observer: (any AsyncStateObserver)? = nil
    ) where Value: Collection {
        self.init(
            wrappedValue, expiry, clock, retry, timeout, failureExpiry, staleWhileRevalidate, refreshAfter,
            name: name, observer: observer, isEmpty: isEmpty ?? { $0.isEmpty })
    }

    /// Creates a state holding an optional; `nil` is ``AsyncPhase/empty``.
    ///
    /// The parameters are those of ``init(wrappedValue:expiry:clock:retry:timeout:failureExpiry:staleWhileRevalidate:refreshAfter:isEmpty:name:observer:)-8otjj``;
    /// `isEmpty` overrides `== nil` as the emptiness test.
    public init<Wrapped: Sendable>(
        wrappedValue: Value,
        expiry: Duration = .seconds(120),
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        failureExpiry: Duration = .zero,
        staleWhileRevalidate: Bool = false,
        refreshAfter: Duration? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil,
        name: String = "",
        observer: (any AsyncStateObserver)? = nil
    ) where Value == Wrapped? {
        self.init(
            wrappedValue, expiry, clock, retry, timeout, failureExpiry, staleWhileRevalidate, refreshAfter,
            name: name, observer: observer, isEmpty: isEmpty ?? { $0 == nil })
    }

    /// What the three public initializers share; they differ only in the default emptiness test.
    private init(
        _ initialValue: Value, _ expiry: Duration, _ clock: some Clock<Duration>, _ retry: RetryPolicy,
        _ timeout: Duration?, _ failureExpiry: Duration, _ staleWhileRevalidate: Bool, _ refreshAfter: Duration?,
        name: String, observer: (any AsyncStateObserver)?, isEmpty: @escaping @Sendable (Value) -> Bool
    ) {
        let configuration = StoreConfiguration(
            expiry: expiry, failureExpiry: failureExpiry, isEmpty: isEmpty, retry: retry, timeout: timeout,
            staleWhileRevalidate: staleWhileRevalidate, refreshAfter: refreshAfter)
        store = AsyncStateStore(
            initialValue: initialValue, configuration: configuration, clock: StoreClock(clock),
            observation: observer.map { Observation(name: name, key: nil, observer: $0) })
    }

    // MARK: Reading

    /// The latest value: a synchronous snapshot, kept while loading and after a failure.
    @inlinable public var wrappedValue: Value { store.cell.value }

    /// The wrapper itself: `$name.value { … }`, `$name.phase`, and the rest of the API.
    public var projectedValue: AsyncState<Value> { self }

    /// The current phase: a synchronous snapshot.
    @inlinable public var phase: AsyncPhase { store.cell.phase }

    /// The current value, phase, expiry and metadata (failure count, last error, last success,
    /// success count): a synchronous snapshot.
    public var snapshot: AsyncSnapshot<Value> { store.cell.snapshot(at: store.clock.now()) }

    /// Whether the data is older than `interval`, or there is no fresh data (never fetched, failed,
    /// or invalidated). Measured on the state's clock.
    public func hasExpired(in interval: Duration) -> Bool {
        store.cell.hasExpired(in: interval, at: store.clock.now())
    }

    /// The current snapshot first, then one per transition, in order; finishes when the state is freed.
    ///
    /// Each subscriber has its own stream. One that does not keep up loses the oldest snapshots it has
    /// not read (it keeps the newest 64), so memory stays bounded.
    public var updates: AsyncStream<AsyncSnapshot<Value>> {
        store.cell.subscribe(at: store.clock.now())
    }

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
        _ = try? await fetchFromStore(.fetch, operation, retry: retry)
    }

    /// Fetches even if the data is fresh, replacing a fetch in flight (whose result is discarded), and
    /// returns once the fetch has settled.
    ///
    /// - Parameters:
    ///   - retry: The retry policy for this fetch; `nil` for the state's.
    ///   - operation: Fetches the value.
    public nonisolated(nonsending) func refresh(retry: RetryPolicy? = nil, _ operation: @escaping Operation) async {
        _ = try? await store.fetch(.refresh, policy: retry, operation)
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
        return try await fetchFromStore(.value, operation, retry: retry)
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
        return try await snapshotFromStore(operation, retry: retry)
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
        return try await snapshotFromStore({ try await operation(context) }, retry: retry)
    }

    /// The miss path of ``snapshot(retry:_:)``: the latest snapshot once the store has answered.
    /// Specialized in the caller's module, never inlined into it (as ``fetchFromStore(_:_:retry:)``).
    @inlinable @inline(never)
    nonisolated(nonsending) func snapshotFromStore(_ operation: @escaping Operation, retry: RetryPolicy?)
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
        return try await fetchFromStore(.value, { try await operation(context) }, retry: retry)
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
        _ = try? await fetchFromStore(.fetch, { try await operation(context) }, retry: retry)
    }

    /// The miss path of ``value(retry:_:)`` and ``fetch(retry:_:)``: asks the store for `request`.
    /// Inlinable, so that it is specialized for the caller's `Value` (a cold caller then looks up no
    /// generic metadata), but never inlined: the hit path it follows stays small.
    @inlinable @inline(never)
    nonisolated(nonsending) func fetchFromStore(
        _ request: FetchRequest, _ operation: @escaping Operation, retry: RetryPolicy?
    ) async throws -> Value {
        try await store.fetch(request, policy: retry, operation)
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
    public nonisolated(nonsending) func retry(_ operation: @escaping Operation) async {
        try? await store.retry(operation)
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
        guard interval > .zero else { throw AsyncStateError.invalidInterval(interval) }
        let interval = interval.clampedToLimits
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
    public nonisolated(nonsending) func invalidate() async {
        store.invalidate()
    }

    /// Cancels the fetch in flight, if any: its callers get `CancellationError`, the phase goes back to
    /// what it was before the fetch, and the value is untouched.
    public nonisolated(nonsending) func cancel() async {
        store.cancel()
    }

    /// Writes a value (a manual or optimistic update), fresh from now: the phase becomes
    /// ``AsyncPhase/success(_:)`` (or ``AsyncPhase/empty``). A fetch in flight is cancelled and its
    /// callers get this value; its result never overwrites it.
    public nonisolated(nonsending) func set(_ value: Value) async {
        store.set(value)
    }

    /// Goes back to the initial value and ``AsyncPhase/initial``, forgetting the metadata. A
    /// fetch in flight is cancelled and its callers get `CancellationError`.
    public nonisolated(nonsending) func reset() async {
        store.reset()
    }
}
