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
///   ``refresh(retry:_:)`` and ``retry()`` return at once without doing anything.
/// - **Lifetime.** The operation's task keeps the state alive until it ends; once the last copy of the
///   wrapper is gone and no operation runs, everything is freed and ``updates`` streams finish.
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
    ///     never fresh.
    ///   - clock: The clock expiry, retries, timeouts and periodic refreshes run on. Defaults to
    ///     `ContinuousClock()`; pass a `VirtualClock` in tests.
    ///   - retry: How failed fetches are retried (each call may override it). Defaults to
    ///     ``RetryPolicy/never``.
    ///   - timeout: The longest one attempt may run before it is cancelled and fails with
    ///     ``AsyncStateError/timedOut(after:)``. `nil` (the default), zero or negative: no timeout.
    ///   - staleWhileRevalidate: When `true`, ``value(retry:_:)`` on expired data returns the stale value
    ///     at once and refreshes it in the background. Defaults to `false`.
    ///   - refreshInterval: When set, the last operation is re-run in the background every
    ///     `refreshInterval`, counted from the end of the previous refresh (the first from the end of
    ///     the first fetch), while the state lives and until ``cancel()`` or ``reset()`` (the next fetch
    ///     to settle starts it again). A refresh due while a fetch is in flight is skipped, so
    ///     refreshes never overlap. `nil` (the default), zero or negative: no periodic refresh.
    ///   - isEmpty: Decides whether a fetched value is ``AsyncPhase/empty``. Without it, a value is
    ///     never empty (collections and optionals have their own initializers).
    public init(
        wrappedValue: Value,
        expiry: Duration = .seconds(120),
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        staleWhileRevalidate: Bool = false,
        refreshInterval: Duration? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil
    ) {
        self.init(
            wrappedValue, expiry, clock, retry, timeout, staleWhileRevalidate, refreshInterval,
            isEmpty: isEmpty ?? { _ in false })
    }

    /// Creates a state holding a collection; an empty collection is ``AsyncPhase/empty``.
    ///
    /// The parameters are those of ``init(wrappedValue:expiry:clock:retry:timeout:staleWhileRevalidate:refreshInterval:isEmpty:)-31ovu``;
    /// `isEmpty` overrides `Collection.isEmpty` as the emptiness test.
    public init(
        wrappedValue: Value,
        expiry: Duration = .seconds(120),
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        staleWhileRevalidate: Bool = false,
        refreshInterval: Duration? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil
    ) where Value: Collection {
        self.init(
            wrappedValue, expiry, clock, retry, timeout, staleWhileRevalidate, refreshInterval,
            isEmpty: isEmpty ?? { $0.isEmpty })
    }

    /// Creates a state holding an optional; `nil` is ``AsyncPhase/empty``.
    ///
    /// The parameters are those of ``init(wrappedValue:expiry:clock:retry:timeout:staleWhileRevalidate:refreshInterval:isEmpty:)-31ovu``;
    /// `isEmpty` overrides `== nil` as the emptiness test.
    public init<Wrapped: Sendable>(
        wrappedValue: Value,
        expiry: Duration = .seconds(120),
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        staleWhileRevalidate: Bool = false,
        refreshInterval: Duration? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil
    ) where Value == Wrapped? {
        self.init(
            wrappedValue, expiry, clock, retry, timeout, staleWhileRevalidate, refreshInterval,
            isEmpty: isEmpty ?? { $0 == nil })
    }

    /// What the three public initializers share; they differ only in the default emptiness test.
    private init(
        _ initialValue: Value, _ expiry: Duration, _ clock: some Clock<Duration>, _ retry: RetryPolicy,
        _ timeout: Duration?, _ staleWhileRevalidate: Bool, _ refreshInterval: Duration?,
        isEmpty: @escaping @Sendable (Value) -> Bool
    ) {
        let configuration = StoreConfiguration(
            expiry: expiry, isEmpty: isEmpty, retry: retry, timeout: timeout,
            staleWhileRevalidate: staleWhileRevalidate, refreshInterval: refreshInterval)
        store = AsyncStateStore(
            initialValue: initialValue, configuration: configuration, clock: StoreClock(clock),
            serialExecutor: clock.settlingSerialExecutor)
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
    /// (a failure is ``AsyncPhase/failure(_:)``). Returns at once when the caller's task is cancelled.
    ///
    /// - Parameters:
    ///   - retry: The retry policy for a fetch this call starts; `nil` for the state's.
    ///   - operation: Fetches the value.
    @inlinable
    public nonisolated(nonsending) func fetch(retry: RetryPolicy? = nil, _ operation: @escaping Operation) async {
        if store.cell.freshValue(at: store.clock.now()) != nil { return }
        _ = try? await fetchFromStore(operation, retry: retry)
    }

    /// Fetches even if the data is fresh, replacing a fetch in flight (whose result is discarded), and
    /// returns once the fetch has settled.
    ///
    /// - Parameters:
    ///   - retry: The retry policy for this fetch; `nil` for the state's.
    ///   - operation: Fetches the value.
    public nonisolated(nonsending) func refresh(retry: RetryPolicy? = nil, _ operation: @escaping Operation) async {
        _ = try? await store.fetch(operation, mode: .always, policy: retry)
    }

    /// Returns the value: at once when fresh, else from the fetch in flight or a new one.
    ///
    /// ```swift
    /// let config = try await $config.value { try await loadConfig() }
    /// ```
    ///
    /// With `staleWhileRevalidate`, expired data that was fetched before is returned at once too,
    /// while a background fetch (one at a time) refreshes it.
    ///
    /// - Parameters:
    ///   - retry: The retry policy for a fetch this call starts; `nil` for the state's.
    ///   - operation: Fetches the value.
    /// - Throws: The operation's error when the fetch fails (after its retries);
    ///   ``AsyncStateError/timedOut(after:)`` when it timed out; `CancellationError` when the caller's
    ///   task is cancelled or the fetch is cancelled (``cancel()``, ``reset()``);
    ///   ``AsyncStateError/reentrantCall`` when called from inside this state's own operation.
    @inlinable
    public nonisolated(nonsending) func value(retry: RetryPolicy? = nil, _ operation: @escaping Operation)
        async throws -> Value
    {
        // The hit path is inlined into the caller (and specialized there): a lock and a clock read.
        if let fresh = store.cell.freshValue(at: store.clock.now()) { return fresh }
        return try await fetchFromStore(operation, retry: retry)
    }

    /// The miss path of ``value(retry:_:)`` and ``fetch(retry:_:)``: asks the store, on its actor.
    @usableFromInline
    nonisolated(nonsending) func fetchFromStore(_ operation: @escaping Operation, retry: RetryPolicy?)
        async throws -> Value
    {
        let mode: FetchStateMachine<Value>.FetchMode =
            store.staleWhileRevalidate ? .staleWhileRevalidate : .ifExpired
        return try await store.fetch(operation, mode: mode, policy: retry)
    }

    /// Re-runs the last operation when the phase is ``AsyncPhase/failure(_:)`` or
    /// ``AsyncPhase/empty``, and returns once it has settled. Otherwise — no operation yet, a fetch in
    /// flight, or any other phase — does nothing.
    public nonisolated(nonsending) func retry() async {
        try? await store.retry()
    }

    /// Marks the data expired: the next ``fetch(retry:_:)`` goes to the source. A fetch in flight still
    /// completes, but its result lands already expired.
    public nonisolated(nonsending) func invalidate() async {
        _ = try? await store.enter { $0.invalidate() }
    }

    /// Cancels the fetch in flight, if any: its callers get `CancellationError`, the phase goes back to
    /// what it was before the fetch, and the value is untouched.
    public nonisolated(nonsending) func cancel() async {
        _ = try? await store.enter { $0.cancel() }
    }

    /// Writes a value (a manual or optimistic update), fresh from now: the phase becomes
    /// ``AsyncPhase/success(_:)`` (or ``AsyncPhase/empty``). A fetch in flight is cancelled and its
    /// callers get this value; its result never overwrites it.
    public nonisolated(nonsending) func set(_ value: Value) async {
        _ = try? await store.enter { $0.set(value) }
    }

    /// Goes back to the initial value and ``AsyncPhase/initial``, forgetting the last operation. A
    /// fetch in flight is cancelled and its callers get `CancellationError`.
    public nonisolated(nonsending) func reset() async {
        _ = try? await store.enter { $0.reset() }
    }
}
