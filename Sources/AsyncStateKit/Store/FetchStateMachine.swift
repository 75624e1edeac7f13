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
/// - Freshness is lazy: the machine records when fresh data arrived and compares on request.
struct FetchStateMachine<Value: Sendable> {
    /// Identifies one caller waiting for a flight.
    typealias WaiterID = UInt64
    /// Identifies one run of the operation.
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
    }

    /// How a fetch treats fresh data.
    enum FetchMode {
        /// `fetch` / `value`: fresh data is returned without running the operation.
        case ifExpired
        /// `refresh`: always runs the operation, replacing any flight in flight.
        case always
    }

    /// What an operation's run ended with.
    enum Outcome {
        /// It returned a value.
        case success(Value)
        /// It threw an error other than `CancellationError`.
        case failure(any Error)
        /// It threw `CancellationError` (by itself or because it was cancelled).
        case cancelled
    }

    /// What to do after ``fetch(waiter:mode:now:)``.
    enum FetchAction {
        /// The data is fresh: give the caller this value; nothing starts and the caller does not wait.
        case returnFresh(Value)
        /// The caller joined the flight in flight and waits for it.
        case join
        /// Start the operation for flight `id` (after cancelling flight `cancelling`'s operation, if
        /// any); the caller waits for it. Publish: the phase is `loading`.
        case start(id: FlightID, cancelling: FlightID?)
    }

    /// What to do after ``retry(waiter:)``.
    enum RetryAction {
        /// Re-run the last operation as flight `id`; the caller waits for it. Publish.
        case start(id: FlightID)
        /// Nothing to retry (no failure or empty answer, a flight in flight, or no operation yet).
        case ignore
    }

    /// What to do after ``operationFinished(_:outcome:now:date:)``.
    enum FinishAction {
        /// The flight is not the current one: drop the result, change nothing.
        case drop
        /// The flight settled: publish, then resume `waiters` with `result`.
        case settle(waiters: [WaiterID], result: Result<Value, any Error>)
    }

    /// What to do after ``waiterCancelled(_:)``.
    enum WaiterCancelledAction {
        /// The waiter was no longer waiting (already resumed): nothing to do.
        case none
        /// Resume the waiter with `CancellationError`; the flight goes on for the others.
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
    /// The flight in flight, if any.
    private(set) var flight: Flight?
    /// Whether an operation has been run, so ``retry(waiter:)`` has something to re-run.
    private(set) var hasOperation = false
    /// Bumped by every event that changes the state; flight ids are drawn from it.
    private(set) var generation: UInt64 = 0

    /// The value ``reset()`` goes back to.
    let initialValue: Value
    /// How long data stays fresh; zero or less means never fresh.
    let expiry: Duration
    /// Decides whether a successful value is ``AsyncPhase/empty``.
    let isEmpty: @Sendable (Value) -> Bool

    init(initialValue: Value, expiry: Duration, isEmpty: @escaping @Sendable (Value) -> Bool) {
        self.value = initialValue
        self.initialValue = initialValue
        self.expiry = expiry
        self.isEmpty = isEmpty
    }

    // MARK: Queries

    /// Whether the data is fresh at `now`: it arrived less than ``expiry`` ago and was not invalidated.
    /// `initial` and `failure` are never fresh.
    func isFresh(at now: Duration) -> Bool {
        guard let freshSince else { return false }
        return now - freshSince < expiry
    }

    // MARK: Events

    /// A caller asks for the value (`fetch`, `value`, `refresh`).
    mutating func fetch(waiter: WaiterID, mode: FetchMode, now: Duration) -> FetchAction {
        if mode == .ifExpired, isFresh(at: now) { return .returnFresh(value) }
        if var current = flight {
            current.waiters.append(waiter)
            guard mode == .always else {
                flight = current
                return .join
            }
            // refresh: a new flight takes over the old one's waiters; the old result will be dropped.
            let id = bump()
            flight = Flight(id: id, waiters: current.waiters, phaseBefore: current.phaseBefore, expiresOnArrival: false)
            hasOperation = true
            return .start(id: id, cancelling: current.id)
        }
        let id = bump()
        flight = Flight(id: id, waiters: [waiter], phaseBefore: phase, expiresOnArrival: false)
        phase = .loading
        hasOperation = true
        return .start(id: id, cancelling: nil)
    }

    /// A caller asks to re-run the last operation (`retry`).
    mutating func retry(waiter: WaiterID) -> RetryAction {
        guard hasOperation, flight == nil else { return .ignore }
        switch phase {
        case .failure, .empty: break
        case .initial, .loading, .success: return .ignore
        }
        let id = bump()
        flight = Flight(id: id, waiters: [waiter], phaseBefore: phase, expiresOnArrival: false)
        phase = .loading
        return .start(id: id)
    }

    /// The operation of flight `id` ended with `outcome` at `now` (wall date `date`).
    mutating func operationFinished(_ id: FlightID, outcome: Outcome, now: Duration, date: Date) -> FinishAction {
        guard let current = flight, current.id == id else { return .drop }
        flight = nil
        bump()
        switch outcome {
        case .success(let newValue):
            value = newValue
            phase = isEmpty(newValue) ? .empty : .success(date)
            freshSince = current.expiresOnArrival ? nil : now
            return .settle(waiters: current.waiters, result: .success(newValue))
        case .failure(let error):
            phase = .failure(error)
            freshSince = nil
            return .settle(waiters: current.waiters, result: .failure(error))
        case .cancelled:
            phase = current.phaseBefore
            return .settle(waiters: current.waiters, result: .failure(CancellationError()))
        }
    }

    /// The task of waiter `waiter` was cancelled: it stops waiting; the flight is cancelled if it was
    /// the last waiter.
    mutating func waiterCancelled(_ waiter: WaiterID) -> WaiterCancelledAction {
        guard var current = flight, let index = current.waiters.firstIndex(of: waiter) else { return .none }
        current.waiters.remove(at: index)
        guard current.waiters.isEmpty else {
            flight = current
            return .resume(waiter)
        }
        flight = nil
        phase = current.phaseBefore
        bump()
        return .resumeAndCancelFlight(waiter, flight: current.id)
    }

    /// `cancel()`: cancels the flight outright; its waiters get `CancellationError` and the phase goes
    /// back to what it was before the flight. Publish when a flight was cancelled.
    mutating func cancel() -> EndedFlight {
        guard let current = flight else { return .none }
        flight = nil
        phase = current.phaseBefore
        bump()
        return .cancel(id: current.id, waiters: current.waiters)
    }

    /// `invalidate()`: the data is expired now, and so will be the result of the flight in flight.
    /// Publish.
    mutating func invalidate() {
        freshSince = nil
        flight?.expiresOnArrival = true
        bump()
    }

    /// `set(_:)`: a manual (or optimistic) write, fresh from `now`. It wins over the flight in flight:
    /// that flight is cancelled and its waiters get `newValue`. Publish.
    mutating func set(_ newValue: Value, now: Duration, date: Date) -> EndedFlight {
        let ended = endFlight()
        value = newValue
        phase = isEmpty(newValue) ? .empty : .success(date)
        freshSince = now
        return ended
    }

    /// `reset()`: back to the initial value and phase, forgetting the last operation. The flight in
    /// flight is cancelled and its waiters get `CancellationError`. Publish.
    mutating func reset() -> EndedFlight {
        let ended = endFlight()
        value = initialValue
        phase = .initial
        freshSince = nil
        hasOperation = false
        return ended
    }

    // MARK: Helpers

    private mutating func endFlight() -> EndedFlight {
        bump()
        guard let current = flight else { return .none }
        flight = nil
        return .cancel(id: current.id, waiters: current.waiters)
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
        AsyncSnapshot(value: value, phase: phase, isExpired: !isFresh(at: now))
    }
}
