// The machine is split by what brings its events: this file holds its state, what the shell may
// read of it, and the events callers bring; `FetchStateMachine+Flight.swift` the events its flight's
// tasks and timers bring, and the helpers both share. Their members are `@usableFromInline` rather
// than `private` because the machine is inlinable: a miss runs it specialized in the caller's module
// (see Architecture.md, "Specialized in the caller's module"). So the rule that only these files
// change or read its fields by name is kept by `.ci/machine-boundary`, not by the compiler.
public import Foundation
import Synchronization

/// The pure heart of an ``AsyncState``: every event is a `mutating func` that takes the current
/// instant as an argument, changes the state, and returns what the shell must do.
///
/// No clock reads, no awaits, no continuations: ``AsyncStateStore`` owns one, feeds it events and
/// performs the actions. Time is a `Duration` since the store's clock origin. Every decision is made
/// here — freshness, negative caching, reentrancy, retries, timeouts, the bound on abandoned
/// operations, not-modified answers, which second-level entries are taken, fail-safe and the soft
/// timeout — so the shell only performs. The machine's state is its ``StateData`` and, while one
/// runs, its ``Flight``, which holds everything alive: the operation, the waiters' ids, the stage
/// (an attempt running, or a backoff until an instant), the attempt count, and the shell's handles
/// (`Handle`: the attempt's task and the timer) that the actions hand back to be cancelled.
///
/// The shell never reads the machine's fields to decide, and never writes them: each action carries
/// what it needs, an attempt carries what its operation may read (``AttemptInput``) and its result
/// comes back as a typed outcome (``Outcome``), and what the shell must show or keep it reads through
/// the accessors below ("Accessors").
///
/// Rules it enforces:
/// - One flight at a time (single flight); joiners wait on it, `refresh` replaces it.
/// - Only the current attempt's result lands: a result from an attempt that timed out, or from a
///   flight that was replaced, cancelled or overtaken by ``set(_:now:date:)`` / ``reset()``, is dropped.
/// - Cancellation is never a failure: the phase is what it was before the flight.
/// - A failed attempt is retried as the flight's ``RetryPolicy`` says; the phase stays `loading`
///   until the last attempt.
/// - The operation lives in the flight and nowhere else: when the flight ends, the machine forgets
///   it, so an operation that captures the state's owner never keeps the owner alive.
/// - Freshness is lazy: the data records when it arrived fresh, and readers compare on request.
@usableFromInline
struct FetchStateMachine<Value: Sendable, Operation, Handle> {
    /// Identifies one caller waiting for a flight.
    @usableFromInline typealias WaiterID = UInt64
    /// Identifies one flight (all its attempts).
    @usableFromInline typealias FlightID = UInt64
    /// Identifies one attempt of a flight.
    @usableFromInline typealias AttemptID = UInt64
    /// Why a flight started, for the observer.
    @usableFromInline typealias Reason = AsyncStateEvent.Reason

    /// The value, the settled phase, the freshness and the metadata.
    @usableFromInline var data: StateData<Value>
    /// Where the flight lives: boxed, so that an idle state does not carry it inline. Copied on write
    /// (``mutateFlight(_:)``), so the machine keeps value semantics.
    @usableFromInline var flightBox: FlightBox?
    /// Attempts that timed out and whose operation has not returned yet (it was cancelled, but may
    /// ignore cancellation).
    @usableFromInline var abandoned: Set<AttemptID> = []

    /// The value ``reset()`` goes back to.
    @usableFromInline let initialValue: Value
    /// The policies, normalized.
    @usableFromInline let configuration: StoreConfiguration<Value>
    /// Seeds the jitter of flights whose policy has no seed of its own.
    @usableFromInline var seeds: SplitMix64

    @inlinable init(initialValue: Value, configuration: StoreConfiguration<Value>, seed: UInt64 = 0) {
        data = StateData(initialValue: initialValue)
        self.initialValue = initialValue
        self.configuration = configuration
        self.seeds = SplitMix64(seed: seed)
    }

    // MARK: Accessors

    // What the shell reads of the machine: each documented, each a value it shows or keeps, never one
    // it decides with. `.ci/machine-boundary` allows code outside the machine's files these and the
    // events, nothing else.

    /// The latest value: kept during loading and after a failure.
    @inlinable var value: Value { data.value }
    /// The current phase: `loading` exactly while a flight runs, else the phase the data settled in.
    @inlinable var phase: AsyncPhase { flightBox == nil ? data.phase : .loading }
    /// Whether a flight is in flight: the one definition the shell and a family use (a live entry with
    /// one is busy, and its result may carry what an invalidation names).
    @inlinable var hasFlight: Bool { flightBox != nil }
    /// Why the flight in flight started and whether the state had a value then; `nil` without one.
    @inlinable var flightStart: (reason: Reason, hadValue: Bool)? {
        flightBox.map { ($0.flight.reason, $0.flight.startedWithValue) }
    }

    /// The data, if this machine may rest: no flight, no abandoned operation, and data at rest. A
    /// machine restored from it (``wake(restoring:)``) behaves as this one would.
    @inlinable var restingData: StateData<Value>? {
        flightBox == nil && abandoned.isEmpty && data.isAtRest ? data : nil
    }

    /// Whether this machine is what a new one on its configuration is, but for its jitter seed:
    /// initial data, no flight, no abandoned operation (see ``park()``).
    @inlinable var isParked: Bool { flightBox == nil && abandoned.isEmpty && !data.differsFromInitial }

    /// What a warm restart saves (see ``StateData/archived``).
    @inlinable var archived: (value: Value, isEmpty: Bool, lastSuccess: Date?)? { data.archived }

    /// What the shell publishes at `now`: the snapshot and what readers test without the machine.
    @inlinable func publication(at now: Duration) -> Publication<Value> {
        Publication(
            snapshot: data.snapshot(at: now, expiry: configuration.expiry, isLoading: flightBox != nil),
            freshSince: data.freshSince, receivedAt: data.receivedAt, flightStart: flightStart)
    }

    // MARK: Rules

    /// The flight in flight, if any: for the machine's tests, which assert on it (the shell reads
    /// only the accessors above).
    @inlinable var flight: Flight? { flightBox?.flight }

    /// Whether the data is fresh at `now`.
    @inlinable
    func isFresh(at now: Duration) -> Bool { data.isFresh(at: now, expiry: configuration.expiry) }

    /// Whether fresh data at `now` is past the hit window (``StoreConfiguration/hitWindow``): old
    /// enough for a refresh ahead. Never without `refreshAfter` (the window is then the expiry), nor
    /// for a value whose own lifetime is not longer than the refresh's lead (`expiry − refreshAfter`,
    /// see ``AsyncStateExpiring``): its hit window ends before it arrives, and refreshing it ahead
    /// would refetch it on every read; it expires instead.
    @inlinable
    func isRefreshDue(at now: Duration) -> Bool {
        guard !data.isFresh(at: now, expiry: configuration.hitWindow) else { return false }
        guard let refreshAfter = configuration.refreshAfter, let shift = data.freshnessShift else { return true }
        // lifetime = expiry + shift; lead = expiry − refreshAfter; lifetime > lead ⇔ shift > −refreshAfter.
        return shift > .zero - refreshAfter
    }

    /// Whether restored data is still answered at once at `now`, stale, while one refetch runs (see
    /// ``restore(_:isEmpty:lastSuccess:now:date:)``).
    @inlinable
    func isWithinRestoredWindow(at now: Duration) -> Bool {
        isWithinExpiry(since: data.restoredAt, at: now, expiry: configuration.restoredWindow)
    }

    /// The cached failure, while the failure expiry says to answer with it instead of refetching.
    @inlinable
    func cachedFailure(at now: Duration) -> (any Error)? {
        guard case .failure(let error) = data.phase, flightBox == nil,
            isWithinExpiry(since: data.failedAt, at: now, expiry: configuration.failureExpiry)
        else { return nil }
        return error
    }

    /// The last good value, while fail-safe answers it instead of a failure at `now` (see
    /// ``StateData/failSafeValue(at:maxStaleAge:)``).
    @inlinable
    func failSafeValue(at now: Duration) -> Value? {
        data.failSafeValue(at: now, maxStaleAge: configuration.maxStaleAge)
    }

    /// Whether a caller running one of `callerAttempts` is the current attempt's operation (or a task
    /// that inherited its context while it still runs): waiting for the flight would wait for itself.
    @inlinable
    func isReentrant(_ callerAttempts: [AttemptID]) -> Bool {
        // Through the box, not a copy of the flight (whose waiters a later insert would then copy).
        guard case .running(let attempt)? = flightBox?.flight.stage else { return false }
        return callerAttempts.contains(attempt)
    }

    /// Whether a paged state's list has nothing more to load (see ``AsyncStateListing``); never for
    /// any other value.
    @inlinable
    static func isAtEnd(_ value: Value) -> Bool {
        (value as? any AsyncStateListing)?.isAtEnd ?? false
    }

    /// How `request` treats fresh, failed and stale data.
    @inlinable
    func mode(of request: FetchRequest) -> FetchMode {
        switch request {
        case .value: return configuration.staleWhileRevalidate ? .staleWhileRevalidate : .ifExpired
        case .fetch, .periodic(first: true): return .ifExpired
        case .refresh: return .always
        case .periodic(first: false): return .joinOrStart
        case .loadMore: return .append
        }
    }

    /// Why a flight that `request` starts started (an append is reported as ``Reason/loadMore``
    /// instead: see ``start(waiter:mode:reason:readsTheSource:now:policy:operation:)``).
    @inlinable
    static func reason(of request: FetchRequest) -> Reason {
        switch request {
        case .value, .fetch, .loadMore: return .fetch
        case .refresh: return .refresh
        case .periodic: return .periodic
        }
    }

    // MARK: Events from callers

    /// A caller asks for the value, with `policy` for a new flight (the state's policy when `nil`) and
    /// `operation` to run if one starts. `callerAttempts` are the attempts of this state that the
    /// calling task is running (reentrancy).
    @inlinable
    mutating func fetch(
        waiter: WaiterID, request: FetchRequest, now: Duration, policy: RetryPolicy? = nil, operation: Operation,
        callerAttempts: [AttemptID] = []
    ) -> FetchAction {
        fetch(
            waiter: waiter, mode: mode(of: request), reason: Self.reason(of: request),
            readsTheSource: request.readsTheSource, now: now, policy: policy, operation: operation,
            callerAttempts: callerAttempts)
    }

    /// ``fetch(waiter:request:now:policy:operation:callerAttempts:)`` once the request is resolved
    /// into its `mode`, the `reason` of a flight it starts and whether its attempts read the source
    /// (tests drive it directly, to apply every mode to every state).
    @inlinable
    mutating func fetch(
        waiter: WaiterID, mode: FetchMode, reason: Reason = .fetch, readsTheSource: Bool = false, now: Duration,
        policy: RetryPolicy? = nil, operation: Operation, callerAttempts: [AttemptID] = []
    ) -> FetchAction {
        if mode.isReader {
            if isFresh(at: now) {
                // Refresh ahead: fresh data old enough starts one background refresh.
                guard isRefreshDue(at: now) else { return .answer(data.value, .fresh, refresh: nil) }
                return answer(
                    data.value, .fresh, refreshing: .refreshAhead, now: now, policy: policy, operation: operation,
                    callerAttempts: callerAttempts)
            }
            if isWithinRestoredWindow(at: now) {
                // Restored data under refresh ahead: expired for every reader, yet answered at once
                // while one refetch runs, as fresh data due for its refresh would be.
                return answer(
                    data.value, .stale, refreshing: .background, now: now, policy: policy, operation: operation,
                    callerAttempts: callerAttempts)
            }
            if let error = cachedFailure(at: now) {
                if mode == .staleWhileRevalidate && data.hasValue { return .answer(data.value, .stale, refresh: nil) }
                if let value = failSafeValue(at: now) { return .answer(value, .failSafe(error), refresh: nil) }
                return .fail(error)
            }
        }
        if isReentrant(callerAttempts) { return .fail(AsyncStateError.reentrantCall) }
        if mode == .staleWhileRevalidate, data.hasValue {
            return answer(
                data.value, .stale, refreshing: .background, now: now, policy: policy, operation: operation,
                callerAttempts: callerAttempts)
        }
        if flightBox != nil {
            // Expired data is not answered by an append in flight (it would extend the expired data):
            // a reader replaces it, as `refresh` would (`.always`).
            if mode != .always, mode != .ifExpired || flightBox?.flight.kind != .append {
                // Past its soft timeout the flight is known to be slow: a usable value is answered at
                // once to a reader.
                if mode.isReader, flightBox?.flight.isPastSoftTimeout == true, let value = softTimeoutValue(at: now) {
                    return .answer(value, .stale, refresh: nil)
                }
                // In place, and with no local reference to the box or copy of the flight: either would
                // make this insert copy the box or every waiter (copy-on-write), which is quadratic for
                // many joiners.
                mutateFlight { $0.waiters.insert(waiter) }
                waits(waiter, patiently: !mode.isReader)
                return .join
            }
        } else if mode == .append, data.hasValue, Self.isAtEnd(data.value) {
            return .answer(data.value, .atEnd, refresh: nil)
        }
        return start(
            waiter: waiter, mode: mode, reason: reason, readsTheSource: readsTheSource, now: now, policy: policy,
            operation: operation)
    }

    /// A caller asks to retry: while a flight waits out a backoff, its next attempt starts now;
    /// otherwise, when the phase is failure or empty, a new flight runs `operation` (if given),
    /// bypassing the failure expiry. A retry asks for new data: it waits past a soft timeout.
    @inlinable mutating func retry(
        waiter: WaiterID, operation: Operation?, now: Duration, callerAttempts: [AttemptID] = []
    )
        -> RetryAction
    {
        if flightBox != nil {
            guard flightBox?.flight.retryAt != nil, !isReentrant(callerAttempts) else { return .ignore }
            mutateFlight { $0.waiters.insert(waiter) }
            waits(waiter, patiently: true)
            let backoff = takeHandles()
            return .start(startAttempt(now: now), cancel: backoff)
        }
        guard let operation else { return .ignore }
        switch data.phase {
        case .failure, .empty: break
        case .initial, .loading, .success: return .ignore
        }
        guard
            let attempt = begin(
                waiter: waiter, operation: operation, now: now, policy: nil, kind: .foreground, reason: .retry,
                readsTheSource: false)
        else { return .ignore }
        waits(waiter, patiently: true)
        return .start(attempt, cancel: Handles())
    }

    /// Gives the flight the shell's handles for its current step: the task running the attempt just
    /// started (if one did) and the timer that fires next (if any). An action that ends the step hands
    /// them back to be cancelled. Call it in the same event (under the same lock) as the action that
    /// asked for them, so that the flight they are given to is the one they run for.
    @inlinable
    mutating func attach(task: Handle?, timer: Handle?) {
        mutateFlight {
            if let task { $0.handles.attempt = task }
            $0.handles.timer = timer
        }
    }

    /// Gives the flight the timer of its soft timeout (see ``Attempt/softTimeoutAt``).
    @inlinable
    mutating func attach(softTimer: Handle) {
        mutateFlight { $0.handles.softTimer = softTimer }
    }

    /// Gives the task running attempt `attempt` to its flight, if that attempt is the flight's running
    /// one; returns whether it did (if not, the attempt is over and its task is the caller's to
    /// cancel). The task starts after the event that started the attempt, so its flight may have
    /// ended, or the attempt settled, by the time it is given.
    @inlinable
    mutating func attach(task: Handle, toAttempt attempt: AttemptID) -> Bool {
        guard case .running(attempt) = flightBox?.flight.stage else { return false }
        mutateFlight { $0.handles.attempt = task }
        return true
    }

    /// The task of waiter `waiter` was cancelled: it stops waiting; the flight is cancelled if it was
    /// the last waiter of a flight that is not a background one.
    @inlinable
    mutating func waiterCancelled(_ waiter: WaiterID) -> WaiterCancelledAction {
        guard flightBox?.flight.waiters.contains(waiter) == true else { return .none }
        mutateFlight {  // in place, as in fetch
            $0.waiters.remove(waiter)
            $0.patientWaiters.remove(waiter)
        }
        guard let box = flightBox, box.flight.waiters.isEmpty, !box.flight.kind.keepsAlive else { return .left }
        guard case .end(_, let handles) = endFlight() else { return .left }
        return .leftAndEndedFlight(cancel: handles)
    }

    /// `cancel()`: cancels the flight outright; its waiters get `CancellationError`. Publish when a
    /// flight was cancelled.
    @inlinable mutating func cancel() -> EndedFlight { endFlight() }

    /// `invalidate()`: the data is expired now, for every interval, and so will be the result of the
    /// flight in flight (see ``StateData/invalidate(now:expiry:)``). Returns whether a snapshot
    /// changed (publish it then); either way the freshness readers test must be the machine's again.
    /// An invalidation that names a second-level version the data already has (or a newer one) is
    /// ignored: `nil` (see ``StateData/invalidate(now:expiry:version:)``); one without is never.
    @inlinable mutating func invalidate(now: Duration, version: UInt64? = nil) -> Bool? {
        guard let visible = data.invalidate(now: now, expiry: configuration.expiry, version: version) else {
            return nil
        }
        mutateFlight { $0.expiresOnArrival = true }
        return visible
    }

    /// `set(_:)`: a manual (or optimistic) write, fresh from `now`, at second-level `version` if it was
    /// written there too (0: not). It wins over the flight in flight: that flight ends and its
    /// waiters get `newValue`. Publish.
    @inlinable mutating func set(_ newValue: Value, now: Duration, date: Date, version: UInt64) -> EndedFlight {
        let ended = endFlight()
        data.set(
            newValue, isEmpty: isEmpty(newValue), shift: configuration.freshnessShift(of: newValue), now: now,
            date: date, version: version)
        return ended
    }

    /// A warm restart: `newValue`, saved by an earlier process, as expired data: every reader sees it
    /// expired, and nothing but newer data makes it fresh. Under stale-while-revalidate it is served
    /// as any stale data is; under refresh ahead it is answered at once while one refetch runs, for
    /// as long as fresh data would be before its refresh (``StoreConfiguration/restoredWindow``);
    /// otherwise it is refetched before it is served. Only into a state with no data and no flight
    /// (anything newer wins); returns whether it was restored. Publish if so.
    @inlinable mutating func restore(_ newValue: Value, isEmpty: Bool, lastSuccess: Date?, now: Duration, date: Date)
        -> Bool
    {
        guard !data.hasValue, flightBox == nil, abandoned.isEmpty else { return false }
        data.restore(
            newValue, isEmpty: isEmpty, lastSuccess: lastSuccess, now: now, date: date,
            restoredAt: configuration.refreshAfter == nil ? nil : now)
        return true
    }

    /// `reset()`: back to the initial value and phase, forgetting the metadata. The flight in flight
    /// ends and its waiters get `CancellationError`. Returns whether anything a reader can see changed
    /// (publish then): a reset of a state that is already initial changes nothing.
    @inlinable mutating func reset() -> (ended: EndedFlight, changed: Bool) {
        let changed = flightBox != nil || data.differsFromInitial
        let ended = endFlight()
        data = StateData(initialValue: initialValue)
        return (ended, changed)
    }

    // MARK: Events from a family

    /// A family keeps this machine's store as a spare (see ``FamilyShard/spareStores``): the machine
    /// becomes initial, and returns the data it held, for the caller to release once its locks are
    /// released (a value's deinit is user code). Only at rest: no flight, no abandoned operation.
    @inlinable mutating func park() -> StateData<Value> {
        precondition(flightBox == nil && abandoned.isEmpty, "a store parked with a flight or an abandoned operation")
        var parked = StateData(initialValue: initialValue)
        swap(&parked, &data)
        return parked
    }

    /// A parked machine (``isParked``) made anew for another key, as a new machine would be: a new
    /// jitter seed.
    @inlinable mutating func reseed(_ seed: UInt64) {
        precondition(isParked, "a spare store that was not parked")
        seeds = SplitMix64(seed: seed)
    }

    /// A new or parked machine takes a compact entry's data, at rest (``restingData``): it is then the
    /// machine that entry's store had when it rested, which was its data and nothing else.
    @inlinable mutating func wake(restoring resting: StateData<Value>) {
        precondition(isParked && resting.isAtRest, "a compact entry's data put back into a busy store")
        data = resting
    }
}

/// What a store publishes after a transition (see ``FetchStateMachine/publication(at:)``): the
/// snapshot, and what readers test without the machine — when the data arrived fresh and when its
/// value arrived (``StateData/freshSince``, ``StateData/receivedAt``), and why the flight in flight
/// started (a paged state's activity).
@usableFromInline
struct Publication<Value: Sendable> {
    @usableFromInline var snapshot: AsyncSnapshot<Value>
    @usableFromInline var freshSince: Duration?
    @usableFromInline var receivedAt: Duration?
    @usableFromInline var flightStart: (reason: AsyncStateEvent.Reason, hadValue: Bool)?

    @inlinable
    init(
        snapshot: AsyncSnapshot<Value>, freshSince: Duration?, receivedAt: Duration?,
        flightStart: (reason: AsyncStateEvent.Reason, hadValue: Bool)?
    ) {
        (self.snapshot, self.freshSince, self.receivedAt, self.flightStart) = (
            snapshot, freshSince, receivedAt, flightStart
        )
    }
}
