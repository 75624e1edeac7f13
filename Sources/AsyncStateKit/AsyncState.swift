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
    /// What a miss does with the second level, if the state has one (see
    /// ``AsyncStateSecondLevelOptions``); hits never read it.
    @usableFromInline let secondLevel: SecondLevelLoader<Value>?

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
    ///   - softTimeout: How long readers (``value(retry:_:)``, ``fetch(retry:_:)``, ``snapshot(retry:_:)``)
    ///     wait for a fetch in flight — theirs, a refresh, a periodic run — before they get the value
    ///     the state holds instead (with `maxStaleAge`, only one fail-safe would answer): the fetch
    ///     goes on in the background and its result lands when it arrives, so a slow source never
    ///     makes a reader wait past this, yet its answer is not lost. Counted from the fetch's start.
    ///     Readers with no such value keep waiting; ``refresh(retry:_:)``, ``retry(_:)`` and
    ///     ``run(every:retry:_:)`` wait for the new data. `nil` (the default), zero or less, or not
    ///     shorter than `timeout`: off. See <doc:WhenTheSourceIsDown>.
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
    ///   - maxStaleAge: Fail-safe: when a fetch fails (after its retries, or timed out), its callers
    ///     get the last good value instead of the error if that value arrived (fetched or ``set(_:)``)
    ///     less than this long ago; so do the callers answered from `failureExpiry` meanwhile. The
    ///     phase is the failure, the value stale; past this age the error is thrown. Pair it with a
    ///     short `failureExpiry`, which keeps a dead source from being called by every request. See
    ///     <doc:WhenTheSourceIsDown>. `nil` (the default), zero or less: off.
    ///   - isEmpty: Decides whether a fetched value is ``AsyncPhase/empty``. Without it, a value is
    ///     never empty (collections and optionals have their own initializers).
    ///   - name: What the state reports as to `observer` (a log's metadata, a metric's label).
    ///   - observer: Receives what the state does (see ``AsyncStateObserver``); `nil` (the default):
    ///     nothing is recorded.
    ///   - secondLevel: A cache the service's replicas share behind their memory, read on a miss
    ///     before the source, with one load for the fleet (see ``AsyncStateSecondLevelOptions``; the
    ///     state's entry there is its namespace's); `nil` (the default): none.
    public init(
        wrappedValue: Value,
        expiry: Duration = .seconds(120),
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        softTimeout: Duration? = nil,
        failureExpiry: Duration = .zero,
        staleWhileRevalidate: Bool = false,
        refreshAfter: Duration? = nil,
        maxStaleAge: Duration? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil,
        name: String = "",
        observer: (any AsyncStateObserver)? = nil,
        secondLevel: AsyncStateSecondLevelOptions<Value>? = nil
    ) {
        self.init(
            wrappedValue, expiry, clock, retry, timeout, softTimeout, failureExpiry, staleWhileRevalidate, refreshAfter,
            maxStaleAge,
            name: name, observer: observer, secondLevel: secondLevel, isEmpty: isEmpty)
    }

    /// Creates a state holding a collection; an empty collection is ``AsyncPhase/empty``.
    ///
    /// The parameters are those of ``init(wrappedValue:expiry:clock:retry:timeout:softTimeout:failureExpiry:staleWhileRevalidate:refreshAfter:maxStaleAge:isEmpty:name:observer:secondLevel:)-28ffu``;
    /// `isEmpty` overrides `Collection.isEmpty` as the emptiness test.
    public init(
        wrappedValue: Value,
        expiry: Duration = .seconds(120),
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        softTimeout: Duration? = nil,
        failureExpiry: Duration = .zero,
        staleWhileRevalidate: Bool = false,
        refreshAfter: Duration? = nil,
        maxStaleAge: Duration? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil,
        name: String = "",
        observer: (any AsyncStateObserver)? = nil,
        secondLevel: AsyncStateSecondLevelOptions<Value>? = nil
    ) where Value: Collection {
        self.init(
            wrappedValue, expiry, clock, retry, timeout, softTimeout, failureExpiry, staleWhileRevalidate, refreshAfter,
            maxStaleAge,
            name: name, observer: observer, secondLevel: secondLevel,
            isEmpty: Self.emptinessTest(isEmpty, else: { $0.isEmpty }))
    }

    /// Creates a state holding an optional; `nil` is ``AsyncPhase/empty``.
    ///
    /// The parameters are those of ``init(wrappedValue:expiry:clock:retry:timeout:softTimeout:failureExpiry:staleWhileRevalidate:refreshAfter:maxStaleAge:isEmpty:name:observer:secondLevel:)-28ffu``;
    /// `isEmpty` overrides `== nil` as the emptiness test.
    public init<Wrapped: Sendable>(
        wrappedValue: Value,
        expiry: Duration = .seconds(120),
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        softTimeout: Duration? = nil,
        failureExpiry: Duration = .zero,
        staleWhileRevalidate: Bool = false,
        refreshAfter: Duration? = nil,
        maxStaleAge: Duration? = nil,
        isEmpty: (@Sendable (Value) -> Bool)? = nil,
        name: String = "",
        observer: (any AsyncStateObserver)? = nil,
        secondLevel: AsyncStateSecondLevelOptions<Value>? = nil
    ) where Value == Wrapped? {
        self.init(
            wrappedValue, expiry, clock, retry, timeout, softTimeout, failureExpiry, staleWhileRevalidate, refreshAfter,
            maxStaleAge,
            name: name, observer: observer, secondLevel: secondLevel,
            isEmpty: Self.emptinessTest(isEmpty, else: { $0 == nil }))
    }

    /// `given`, or else `fallback`: the emptiness test of a collection's or an optional's state.
    /// Not `given ?? fallback`: through the generic `??`, each closure would be wrapped in a thunk of
    /// its own, an allocation more for every state.
    private static func emptinessTest(
        _ given: (@Sendable (Value) -> Bool)?, else fallback: @escaping @Sendable (Value) -> Bool
    ) -> (@Sendable (Value) -> Bool)? {
        if let given { return given }
        return fallback
    }

    /// What the three public initializers share; they differ only in the default emptiness test.
    private init(
        _ initialValue: Value, _ expiry: Duration, _ clock: some Clock<Duration>, _ retry: RetryPolicy,
        _ timeout: Duration?, _ softTimeout: Duration?, _ failureExpiry: Duration, _ staleWhileRevalidate: Bool,
        _ refreshAfter: Duration?,
        _ maxStaleAge: Duration?, name: String, observer: (any AsyncStateObserver)?,
        secondLevel: AsyncStateSecondLevelOptions<Value>?, isEmpty: (@Sendable (Value) -> Bool)?
    ) {
        let configuration = StoreConfiguration(
            expiry: expiry, failureExpiry: failureExpiry, isEmpty: isEmpty, retry: retry, timeout: timeout,
            softTimeout: softTimeout,
            staleWhileRevalidate: staleWhileRevalidate, refreshAfter: refreshAfter, maxStaleAge: maxStaleAge)
        let storeClock = StoreClock(clock)
        store = AsyncStateStore(
            initialValue: initialValue, configuration: configuration, clock: storeClock,
            observation: observer.map { Observation(name: name, key: nil, observer: $0) })
        self.secondLevel = secondLevel.map { options in
            SecondLevelLoader(options: options, clock: storeClock) { configuration.lifetime(of: $0) }
        }
    }

    /// What the state's second level has done (see ``AsyncStateSecondLevelOptions``), or `nil`
    /// without one.
    public var secondLevelStatistics: AsyncStateSecondLevelStatistics? { secondLevel?.statistics }

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
}
