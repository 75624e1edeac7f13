import Foundation

/// The pure heart of an ``AsyncState``: every event is a `mutating func` that takes the current
/// virtual instant as an argument, changes the state, and returns what the shell must do.
///
/// No clock reads, no tasks, no awaits, no continuations: ``AsyncStateStore`` owns one, feeds it
/// events and performs the actions. Time is a `Duration` since the store's clock origin.
///
/// Rules it enforces:
/// - One flight at a time (single flight); joiners wait on it, `refresh` replaces it.
/// - Only the current flight's result lands: a result from a flight that was replaced, cancelled or
///   overtaken by ``set(_:now:date:)`` / ``reset()`` is dropped (generations by flight id).
/// - Cancellation is never a failure: it puts the phase back to what it was before the flight.
/// - A failed attempt is retried as the flight's ``RetryPolicy`` says; the phase stays `loading`
///   until the last attempt.
/// - Freshness is lazy: the machine records when fresh data arrived and compares on request.
struct FetchStateMachine<Value: Sendable> {
    /// Identifies one caller waiting for a flight.
    typealias WaiterID = UInt64
    /// Identifies one run of the operation (all its attempts).
    typealias FlightID = UInt64

    /// The operation run in flight and who waits for it.
    struct Flight {
        /// This flight's id; results carrying another id are stale.
        var id: FlightID
        /// The callers waiting for its outcome, in arrival order.
        var waiters: [WaiterID]
        /// The phase before the flight began, restored if it is cancelled.
        var phaseBefore: AsyncPhase
        /// Set by ``invalidate()`` during the flight: its result lands already expired.
        var expiresOnArrival: Bool
        /// How failed attempts are retried.
        var policy: RetryPolicy
        /// When the flight started (for the retry budget).
        var startedAt: Duration
        /// Failed attempts so far.
        var failures: Int
        /// A background flight (stale-while-revalidate, periodic refresh): it goes on when its
        /// waiters leave.
        var keepAlive: Bool
        /// The jitter generator for this flight's retries.
        var random: SplitMix64
    }

    /// How a fetch treats fresh and stale data.
    enum FetchMode {
        /// `fetch` / `value`: fresh data is returned without running the operation.
        case ifExpired
        /// `refresh`: always runs the operation, replacing any flight in flight.
        case always
        /// `value` with stale-while-revalidate: fresh data as `ifExpired`; stale data is returned at
        /// once while a background flight refreshes it; no data at all as `ifExpired`.
        case staleWhileRevalidate
    }

    /// What an operation's attempt ended with.
    enum Outcome {
        /// It returned a value.
        case success(Value)
        /// It threw an error other than `CancellationError` (or timed out).
        case failure(any Error)
        /// It threw `CancellationError` (by itself or because it was cancelled).
        case cancelled
    }

    /// What to do after ``fetch(waiter:mode:now:policy:)``.
    enum FetchAction {
        /// The data is fresh: give the caller this value; nothing starts and the caller does not wait.
        case returnFresh(Value)
        /// The data is stale: give the caller this value now; if `refreshing` is set, start that
        /// background flight (no waiters). Publish when starting.
        case returnStale(Value, refreshing: FlightID?)
        /// The caller joined the flight in flight and waits for it.
        case join
        /// Start the operation for flight `id` (after cancelling flight `cancelling`'s operation, if
        /// any); the caller waits for it. Publish: the phase is `loading`.
        case start(id: FlightID, cancelling: FlightID?)
    }

    /// What to do after ``retry(waiter:)`` or ``periodicRefresh(waiter:now:)``.
    enum StartAction {
        /// Run the last operation as flight `id`; the caller waits for it. Publish.
        case start(id: FlightID)
        /// Nothing to do (no operation yet, a flight in flight, or a phase that does not call for it).
        case ignore
    }

    /// What to do after ``operationFinished(_:outcome:now:date:)``.
    enum FinishAction {
        /// The flight is not the current one: drop the result, change nothing.
        case drop
        /// The attempt failed and will be retried: publish, sleep until `at`, then run the next attempt.
        case retry(at: Duration)
        /// The flight settled: publish, then resume `waiters` with `result`.
        case settle(waiters: [WaiterID], result: Result<Value, any Error>)
    }

    /// What to do after ``waiterCancelled(_:)``.
    enum WaiterCancelledAction {
        /// The waiter was no longer waiting (already resumed): nothing to do.
        case none
        /// Resume the waiter with `CancellationError`; the flight goes on for the others (or in the
        /// background).
        case resume(WaiterID)
        /// Resume the waiter with `CancellationError` and cancel flight `flight`, whose last waiter it
        /// was. Publish: the phase is back to what it was before the flight.
        case resumeAndCancelFlight(WaiterID, flight: FlightID)
    }

    /// What to do with a flight that an event ended early.
    enum EndedFlight {
        /// There was no flight.
        case none
        /// Cancel flight `id`'s operation and resume `waiters` (with what the event says).
        case cancel(id: FlightID, waiters: [WaiterID])
    }

    /// The latest value: kept during loading and after a failure.
    private(set) var value: Value
    /// The current phase.
    private(set) var phase: AsyncPhase = .initial
    /// When the current data arrived fresh; `nil` when there is none or it was invalidated or failed.
    private(set) var freshSince: Duration?
    /// Whether `value` came from a success or a write (not the initial value): stale-while-revalidate
    /// serves it.
    private(set) var hasData = false
    /// The flight in flight, if any.
    var flight: Flight? { flightBox?.flight }
    /// Where the flight lives: boxed, so that an idle state does not carry its ~120 bytes inline.
    /// Copied on write (``mutateFlight(_:)``), so the machine keeps value semantics.
    private var flightBox: FlightBox?
    /// Whether an operation has been run, so ``retry(waiter:)`` has something to re-run.
    private(set) var hasOperation = false
    /// Bumped by every event that changes the state; flight ids are drawn from it.
    private(set) var generation: UInt64 = 0
    /// Failed attempts of the current (or last) fetch; back to zero when a fetch starts or succeeds.
    private(set) var failureCount = 0
    /// The error of the most recent failed attempt, even if a later fetch succeeded.
    private(set) var lastError: (any Error)?
    /// The wall date of the most recent success.
    private(set) var lastSuccess: Date?
    /// How many fetches have succeeded.
    private(set) var successCount = 0

    /// The value ``reset()`` goes back to.
    let initialValue: Value
    /// How long data stays fresh; zero or less means never fresh.
    let expiry: Duration
    /// Decides whether a successful value is ``AsyncPhase/empty``.
    let isEmpty: @Sendable (Value) -> Bool
    /// The retry policy of flights whose caller gave none.
    let retryPolicy: RetryPolicy
    /// Seeds the jitter of flights whose policy has no seed of its own.
    private var seeds: SplitMix64

    init(
        initialValue: Value, expiry: Duration, isEmpty: @escaping @Sendable (Value) -> Bool,
        retryPolicy: RetryPolicy = .never, seed: UInt64 = 0
    ) {
        self.value = initialValue
        self.initialValue = initialValue
        self.expiry = expiry
        self.isEmpty = isEmpty
        self.retryPolicy = retryPolicy
        self.seeds = SplitMix64(seed: seed)
    }

    // MARK: Queries

    /// Whether the data is fresh at `now`: it arrived less than ``expiry`` ago and was not invalidated.
    /// `initial` and `failure` are never fresh.
    func isFresh(at now: Duration) -> Bool {
        isWithinExpiry(since: freshSince, at: now, expiry: expiry)
    }

    // MARK: Events

    /// A caller asks for the value (`fetch`, `value`, `refresh`), with `policy` for a new flight
    /// (the state's policy when `nil`).
    mutating func fetch(
        waiter: WaiterID, mode: FetchMode, now: Duration, policy: RetryPolicy? = nil
    ) -> FetchAction {
        if mode != .always, isFresh(at: now) { return .returnFresh(value) }
        if mode == .staleWhileRevalidate, hasData {
            guard flight == nil else { return .returnStale(value, refreshing: nil) }
            let id = begin(waiters: [], now: now, policy: policy, keepAlive: true)
            return .returnStale(value, refreshing: id)
        }
        if flight != nil {
            guard mode == .always else {
                // In place: binding the flight to a local first would make this append copy every
                // waiter (copy-on-write), which is quadratic for many joiners.
                mutateFlight { $0.waiters.append(waiter) }
                return .join
            }
            // refresh: a new flight takes over the old one's waiters; the old result will be dropped.
            let replaced = flight!.id
            let id = begin(waiters: flight!.waiters + [waiter], now: now, policy: policy, keepAlive: false)
            return .start(id: id, cancelling: replaced)
        }
        let id = begin(waiters: [waiter], now: now, policy: policy, keepAlive: false)
        return .start(id: id, cancelling: nil)
    }

    /// A caller asks to re-run the last operation (`retry`).
    mutating func retry(waiter: WaiterID, now: Duration = .zero) -> StartAction {
        guard hasOperation, flight == nil else { return .ignore }
        switch phase {
        case .failure, .empty: break
        case .initial, .loading, .success: return .ignore
        }
        return .start(id: begin(waiters: [waiter], now: now, policy: nil, keepAlive: false))
    }

    /// The periodic refresh is due: re-run the last operation in the background, unless a flight is
    /// already in flight (no overlapping refreshes) or there is no operation yet.
    mutating func periodicRefresh(waiter: WaiterID, now: Duration) -> StartAction {
        guard hasOperation, flight == nil else { return .ignore }
        return .start(id: begin(waiters: [waiter], now: now, policy: nil, keepAlive: true))
    }

    /// An attempt of flight `id` ended with `outcome` at `now` (wall date `date`).
    mutating func operationFinished(_ id: FlightID, outcome: Outcome, now: Duration, date: Date) -> FinishAction {
        guard var current = flight, current.id == id else { return .drop }
        bump()
        switch outcome {
        case .success(let newValue):
            setFlight(nil)
            value = newValue
            hasData = true
            phase = isEmpty(newValue) ? .empty : .success(date)
            freshSince = current.expiresOnArrival ? nil : now
            failureCount = 0
            lastSuccess = date
            successCount += 1
            return .settle(waiters: current.waiters, result: .success(newValue))
        case .failure(let error):
            current.failures += 1
            failureCount = current.failures
            lastError = error
            if let at = retryInstant(for: &current, after: error, now: now) {
                setFlight(current)
                return .retry(at: at)
            }
            setFlight(nil)
            phase = .failure(error)
            freshSince = nil
            return .settle(waiters: current.waiters, result: .failure(error))
        case .cancelled:
            setFlight(nil)
            phase = current.phaseBefore
            return .settle(waiters: current.waiters, result: .failure(CancellationError()))
        }
    }

    /// The task of waiter `waiter` was cancelled: it stops waiting; the flight is cancelled if it was
    /// the last waiter of a flight that is not a background one.
    mutating func waiterCancelled(_ waiter: WaiterID) -> WaiterCancelledAction {
        guard let index = flight?.waiters.firstIndex(of: waiter) else { return .none }
        mutateFlight { $0.waiters.remove(at: index) }  // in place, as in fetch
        guard let current = flight, current.waiters.isEmpty, !current.keepAlive else { return .resume(waiter) }
        setFlight(nil)
        phase = current.phaseBefore
        bump()
        return .resumeAndCancelFlight(waiter, flight: current.id)
    }

    /// `cancel()`: cancels the flight outright; its waiters get `CancellationError` and the phase goes
    /// back to what it was before the flight. Publish when a flight was cancelled.
    mutating func cancel() -> EndedFlight {
        guard let current = flight else { return .none }
        setFlight(nil)
        phase = current.phaseBefore
        bump()
        return .cancel(id: current.id, waiters: current.waiters)
    }

    /// `invalidate()`: the data is expired now, and so will be the result of the flight in flight.
    /// Publish.
    mutating func invalidate() {
        freshSince = nil
        mutateFlight { $0.expiresOnArrival = true }
        bump()
    }

    /// `set(_:)`: a manual (or optimistic) write, fresh from `now`. It wins over the flight in flight:
    /// that flight is cancelled and its waiters get `newValue`. Publish.
    mutating func set(_ newValue: Value, now: Duration, date: Date) -> EndedFlight {
        let ended = endFlight()
        value = newValue
        hasData = true
        phase = isEmpty(newValue) ? .empty : .success(date)
        freshSince = now
        return ended
    }

    /// `reset()`: back to the initial value and phase, forgetting the last operation and the metadata.
    /// The flight in flight is cancelled and its waiters get `CancellationError`. Publish.
    mutating func reset() -> EndedFlight {
        let ended = endFlight()
        value = initialValue
        hasData = false
        phase = .initial
        freshSince = nil
        hasOperation = false
        failureCount = 0
        lastError = nil
        lastSuccess = nil
        successCount = 0
        return ended
    }

    // MARK: Helpers

    /// Starts a flight: the phase becomes `loading` (kept `loading` when it replaces a flight).
    private mutating func begin(
        waiters: [WaiterID], now: Duration, policy: RetryPolicy?, keepAlive: Bool
    ) -> FlightID {
        let id = bump()
        let policy = policy ?? retryPolicy
        let phaseBefore = flight?.phaseBefore ?? phase
        setFlight(
            Flight(
                id: id, waiters: waiters, phaseBefore: phaseBefore, expiresOnArrival: false, policy: policy,
                startedAt: now, failures: 0, keepAlive: keepAlive,
                random: SplitMix64(seed: policy.seed ?? seeds.next())))
        phase = .loading
        hasOperation = true
        failureCount = 0
        return id
    }

    /// When the flight's next attempt starts, or `nil` when its policy gives up after this failure.
    private func retryInstant(for flight: inout Flight, after error: any Error, now: Duration) -> Duration? {
        let policy = flight.policy
        guard flight.failures < policy.maxAttempts, policy.shouldRetry(error) else { return nil }
        let at = now + policy.delay(beforeRetry: flight.failures, using: &flight.random)
        if let budget = policy.budget, budget <= .zero || at - flight.startedAt > budget { return nil }
        return at
    }

    private mutating func endFlight() -> EndedFlight {
        bump()
        guard let current = flight else { return .none }
        setFlight(nil)
        return .cancel(id: current.id, waiters: current.waiters)
    }

    private mutating func setFlight(_ newFlight: Flight?) {
        flightBox = newFlight.map(FlightBox.init)
    }

    /// Mutates the flight in place (copying its box first if another machine shares it).
    private mutating func mutateFlight(_ body: (inout Flight) -> Void) {
        guard flightBox != nil else { return }
        if !isKnownUniquelyReferenced(&flightBox!) { flightBox = FlightBox(flightBox!.flight) }
        body(&flightBox!.flight)
    }

    /// The box of ``flightBox``.
    private final class FlightBox {
        var flight: Flight
        init(_ flight: Flight) { self.flight = flight }
    }

    @discardableResult
    private mutating func bump() -> UInt64 {
        generation &+= 1
        return generation
    }
}

extension FetchStateMachine {
    /// The snapshot to publish at `now`.
    func snapshot(at now: Duration) -> AsyncSnapshot<Value> {
        AsyncSnapshot(
            value: value, phase: phase, isExpired: !isFresh(at: now), failureCount: failureCount,
            lastError: lastError, lastSuccess: lastSuccess, successCount: successCount)
    }
}
