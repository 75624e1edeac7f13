import Foundation

/// The pure heart of an ``AsyncState``: every event is a `mutating func` that takes the current
/// instant as an argument, changes the state, and returns what the shell must do.
///
/// No clock reads, no tasks, no awaits, no continuations: ``AsyncStateStore`` owns one, feeds it
/// events and performs the actions. Time is a `Duration` since the store's clock origin. Every
/// decision is made here — freshness, negative caching, reentrancy, retries, timeouts, the bound on
/// abandoned operations — so the shell only performs.
///
/// Rules it enforces:
/// - One flight at a time (single flight); joiners wait on it, `refresh` replaces it.
/// - Only the current attempt's result lands: a result from an attempt that timed out, or from a
///   flight that was replaced, cancelled or overtaken by ``set(_:now:date:)`` / ``reset()``, is dropped.
/// - Cancellation is never a failure: it puts the phase back to what it was before the flight.
/// - A failed attempt is retried as the flight's ``RetryPolicy`` says; the phase stays `loading`
///   until the last attempt.
/// - The operation lives in the flight and nowhere else: when the flight ends, the machine forgets
///   it, so an operation that captures the state's owner never keeps the owner alive.
/// - Freshness is lazy: the machine records when fresh data arrived and compares on request.
@usableFromInline
struct FetchStateMachine<Value: Sendable, Operation> {
    /// Identifies one caller waiting for a flight.
    @usableFromInline typealias WaiterID = UInt64
    /// Identifies one flight (all its attempts).
    @usableFromInline typealias FlightID = UInt64
    /// Identifies one attempt of a flight.
    @usableFromInline typealias AttemptID = UInt64

    /// The operation run in flight and who waits for it.
    @usableFromInline
    struct Flight {
        /// This flight's id; events carrying another id are stale.
        var id: FlightID
        /// The operation: kept for the flight's attempts only.
        var operation: Operation
        /// The current attempt's id: running, or due after a backoff (``retryAt``).
        @usableFromInline var attempt: AttemptID
        /// When the current attempt starts, while the flight waits out a backoff; `nil` while it runs.
        @usableFromInline var retryAt: Duration?
        /// The callers waiting for its outcome: a set, so that one leaves in O(1).
        @usableFromInline var waiters: Set<WaiterID>
        /// The phase before the flight began, restored if it is cancelled.
        var phaseBefore: AsyncPhase
        /// Set by ``invalidate(now:)`` during the flight: its result lands already expired.
        var expiresOnArrival: Bool
        /// How failed attempts are retried.
        var policy: RetryPolicy
        /// When the flight started (for the retry budget).
        var startedAt: Duration
        /// Failed attempts so far.
        var failures: Int
        /// A background flight (stale-while-revalidate, refresh ahead): it goes on when its waiters
        /// leave.
        @usableFromInline var keepAlive: Bool
        /// A refresh ahead, started while the data was still fresh: if it fails, the data stays fresh
        /// until its own expiry.
        var refreshesAhead: Bool
        /// Its success leaves the data's freshness as it was (``FetchMode/append``).
        @usableFromInline var keepsFreshness: Bool
        /// The jitter generator for this flight's retries.
        var random: SplitMix64
    }

    /// How a fetch treats fresh, failed and stale data.
    @usableFromInline
    enum FetchMode: Sendable {
        /// `fetch` / `value`: fresh data (or a failure within the failure expiry) is answered without
        /// running the operation; otherwise the caller joins the flight in flight or starts one.
        case ifExpired
        /// `refresh`: always runs the operation, replacing any flight in flight.
        case always
        /// `run(every:)`: joins the flight in flight, otherwise starts one whatever the freshness.
        case joinOrStart
        /// A paged state's `loadMore`: as ``joinOrStart``, but a flight it starts on data it extends
        /// leaves the data's freshness as it was, succeeding or failing (the list is as old as its
        /// first page); an `ifExpired` fetch replaces such a flight instead of joining it.
        case append
        /// `value` with stale-while-revalidate: as ``ifExpired``, except that stale data is returned at
        /// once while a background flight refreshes it.
        case staleWhileRevalidate
    }

    /// What an operation's attempt ended with.
    enum Outcome {
        /// It returned a value.
        case success(Value)
        /// It threw an error other than `CancellationError`.
        case failure(any Error)
        /// It threw `CancellationError` (by itself or because it was cancelled).
        case cancelled
    }

    /// An attempt for the shell to run now: run `operation` in a task, report its end with
    /// ``attemptFinished(_:attempt:outcome:now:date:)``, and, if `timeoutAt` is set, report
    /// ``attemptTimedOut(_:attempt:now:date:)`` at that instant unless it ended first.
    @usableFromInline
    struct Attempt {
        /// The flight it belongs to.
        var flight: FlightID
        /// Its id.
        @usableFromInline var id: AttemptID
        /// What it runs.
        var operation: Operation
        /// When it times out; `nil` for never.
        var timeoutAt: Duration?
    }

    /// What to do after ``fetch(waiter:mode:now:policy:operation:callerAttempts:)``.
    @usableFromInline
    enum FetchAction {
        /// Give the caller this value now; it does not wait. Nothing starts. `stale`: the data is not
        /// fresh (stale-while-revalidate, restored data under refresh ahead): a stale serve, not a hit.
        case returnValue(Value, stale: Bool)
        /// Give the caller this value now — stale (stale-while-revalidate, restored data) or fresh but
        /// due for a refresh ahead — and start this background attempt (a new flight with no waiters).
        /// Publish.
        case returnValueAndStart(Value, Attempt, stale: Bool)
        /// Throw this error to the caller now (a cached failure, a reentrant call, too many abandoned
        /// operations). Nothing changes.
        case fail(any Error)
        /// The caller joined the flight in flight and waits for it.
        case join
        /// End the tasks of the flight in flight if `replacing`, then start `attempt` (a new flight);
        /// the caller waits for it. Publish: the phase is `loading`.
        case start(Attempt, replacing: Bool)
    }

    /// What to do after ``retry(waiter:operation:now:)``.
    enum RetryAction {
        /// Start this attempt now (ending the flight's backoff timer, if any); the caller waits.
        /// Publish.
        case start(Attempt)
        /// Nothing to re-run: return at once.
        case ignore
    }

    /// What to do after an attempt ended, timed out, or its backoff ended.
    enum FlightAction {
        /// The event is stale (another attempt or flight is current): change nothing.
        case drop
        /// The attempt failed and will be retried: publish, then at `at` report
        /// ``backoffEnded(_:attempt:error:now:date:)`` for `attempt`.
        case retry(flight: FlightID, attempt: AttemptID, at: Duration)
        /// Start this attempt now.
        case start(Attempt)
        /// The flight settled: end its tasks, publish, then resume `waiters` with `result`.
        case settle(waiters: Set<WaiterID>, result: Result<Value, any Error>)
    }

    /// What to do after ``waiterCancelled(_:)``: what becomes of the flight. A waiter that was still in
    /// it gets `CancellationError` (the store takes it out of its table of waiters); one that was not
    /// keeps the outcome it already got (see `WaiterSlot`).
    @usableFromInline
    enum WaiterCancelledAction {
        /// The waiter was no longer waiting (already resumed): nothing to do.
        case none
        /// It left; the flight goes on for the others (or in the background).
        case left
        /// It was the flight's last waiter: end the flight's tasks. Publish: the phase is back to what
        /// it was before the flight.
        case leftAndEndedFlight
    }

    /// What to do with a flight that an event ended early.
    enum EndedFlight {
        /// There was no flight.
        case none
        /// End the flight's tasks and resume `waiters` (with what the event says).
        case end(waiters: Set<WaiterID>)
    }

    /// The latest value: kept during loading and after a failure.
    @usableFromInline private(set) var value: Value
    /// The current phase.
    @usableFromInline private(set) var phase: AsyncPhase = .initial
    /// When the current data arrived fresh; `nil` when there is none or it was invalidated or failed.
    @usableFromInline private(set) var freshSince: Duration?
    /// When the current failure settled, while it may still be answered from the negative cache.
    @usableFromInline private(set) var failedAt: Duration?
    /// Whether `value` came from a success or a write (not the initial value): stale-while-revalidate
    /// serves it.
    @usableFromInline private(set) var hasData = false
    /// Whether `value` was empty when it arrived (by the emptiness test then, or as an archive said):
    /// what ``phase`` said of it, kept while a later flight loads or fails. Archives save it.
    private(set) var valueIsEmpty = false
    /// Until when restored data (see ``restore(_:isEmpty:lastSuccess:now:date:)``) is answered at once
    /// under refresh ahead, stale, while one refetch runs; `nil` when the data was not restored or
    /// newer data, an invalidation or a reset has come since.
    @usableFromInline private(set) var restoredUntil: Duration?
    /// The flight in flight, if any.
    @inlinable var flight: Flight? { flightBox?.flight }
    /// Whether the flight in flight keeps the data's freshness: read through the box, so that no copy
    /// of the flight (and of its waiter set) is made on the join path.
    @inlinable var flightKeepsFreshness: Bool { flightBox?.flight.keepsFreshness ?? false }
    /// Where the flight lives: boxed, so that an idle state does not carry it inline. Copied on write
    /// (``mutateFlight(_:)``), so the machine keeps value semantics.
    @usableFromInline var flightBox: FlightBox?
    /// The last id handed out to a flight or an attempt.
    private(set) var lastID: UInt64 = 0
    /// Attempts that timed out and whose operation has not returned yet (it was cancelled, but may
    /// ignore cancellation).
    private(set) var abandoned: Set<AttemptID> = []
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
    /// The policies, normalized.
    @usableFromInline let configuration: StoreConfiguration<Value>
    /// Seeds the jitter of flights whose policy has no seed of its own.
    private var seeds: SplitMix64

    init(initialValue: Value, configuration: StoreConfiguration<Value>, seed: UInt64 = 0) {
        self.value = initialValue
        self.initialValue = initialValue
        self.configuration = configuration
        self.seeds = SplitMix64(seed: seed)
    }

    /// Restores `settled` (see ``settled``): the state a machine had when it was last idle.
    init(
        restoring settled: Settled, initialValue: Value, configuration: StoreConfiguration<Value>, seed: UInt64 = 0
    ) {
        self.init(initialValue: initialValue, configuration: configuration, seed: seed)
        value = settled.value
        hasData = true
        phase = settled.phase
        valueIsEmpty = settled.phase.kind == .empty
        freshSince = settled.freshSince
        restoredUntil = settled.restoredUntil
        lastError = settled.lastError
        lastSuccess = settled.lastSuccess
        successCount = settled.successCount
    }

    /// How long data stays fresh.
    var expiry: Duration { configuration.expiry }

    /// What an idle machine with data is, all a family keeps for an entry nobody uses: data that
    /// succeeded (or was set, or is empty), no flight, no abandoned operation, no cached failure.
    /// Restored with ``init(restoring:initialValue:configuration:seed:)``, it behaves as this machine
    /// would (a machine keeps nothing else between flights but its ids and jitter seeds).
    @usableFromInline
    struct Settled {
        @usableFromInline var value: Value
        @usableFromInline var phase: AsyncPhase
        @usableFromInline var freshSince: Duration?
        @usableFromInline var lastError: (any Error)?
        var lastSuccess: Date?
        @usableFromInline var successCount: Int
        /// See ``FetchStateMachine/restoredUntil``.
        var restoredUntil: Duration?

        init(
            value: Value, phase: AsyncPhase, freshSince: Duration?, lastError: (any Error)?, lastSuccess: Date?,
            successCount: Int, restoredUntil: Duration? = nil
        ) {
            (self.value, self.phase, self.freshSince) = (value, phase, freshSince)
            (self.lastError, self.lastSuccess, self.successCount) = (lastError, lastSuccess, successCount)
            self.restoredUntil = restoredUntil
        }
    }

    /// This machine's state if it is settled (see ``Settled``), else `nil`.
    var settled: Settled? {
        guard flight == nil, abandoned.isEmpty, hasData, failedAt == nil, failureCount == 0 else { return nil }
        switch phase {
        case .success, .empty:
            return Settled(
                value: value, phase: phase, freshSince: freshSince, lastError: lastError, lastSuccess: lastSuccess,
                successCount: successCount, restoredUntil: restoredUntil)
        case .initial, .loading, .failure:
            return nil
        }
    }

    // MARK: Queries

    /// Whether the data is fresh at `now`: it arrived less than the expiry ago and was not
    /// invalidated. `initial` and `failure` are never fresh.
    @inlinable
    func isFresh(at now: Duration) -> Bool {
        isWithinExpiry(since: freshSince, at: now, expiry: configuration.expiry)
    }

    /// Whether fresh data is old enough at `now` for a refresh ahead (never without `refreshAfter`).
    @inlinable
    func isRefreshDue(at now: Duration) -> Bool {
        guard let refreshAfter = configuration.refreshAfter, let freshSince else { return false }
        return now - freshSince >= refreshAfter
    }

    /// The cached failure, while the failure expiry says to answer with it instead of refetching.
    @inlinable
    func cachedFailure(at now: Duration) -> (any Error)? {
        guard case .failure(let error) = phase, flight == nil,
            isWithinExpiry(since: failedAt, at: now, expiry: configuration.failureExpiry)
        else { return nil }
        return error
    }

    /// Whether a caller running one of `callerAttempts` is the current attempt's operation (or a task
    /// that inherited its context while it still runs): waiting for the flight would wait for itself.
    @inlinable
    func isReentrant(_ callerAttempts: [AttemptID]) -> Bool {
        guard let flight, flight.retryAt == nil else { return false }
        return callerAttempts.contains(flight.attempt)
    }

    // MARK: Events from callers

    /// A caller asks for the value (`fetch`, `value`, `refresh`, `run(every:)`), with `policy` for a
    /// new flight (the state's policy when `nil`) and `operation` to run if one starts.
    /// `callerAttempts` are the attempts of this state that the calling task is running (reentrancy).
    @inlinable
    mutating func fetch(
        waiter: WaiterID, mode: FetchMode, now: Duration, policy: RetryPolicy? = nil, operation: Operation,
        callerAttempts: [AttemptID] = []
    ) -> FetchAction {
        if mode == .ifExpired || mode == .staleWhileRevalidate {
            if isFresh(at: now) {
                // Refresh ahead: fresh data old enough starts one background refresh, unless one runs,
                // a failed one is within the failure expiry, or the caller is that refresh itself.
                guard isRefreshDue(at: now), flight == nil, cachedFailure(at: now) == nil,
                    !isReentrant(callerAttempts),
                    let attempt = begin(
                        waiter: nil, operation: operation, now: now, policy: policy, keepAlive: true,
                        refreshesAhead: true)
                else { return .returnValue(value, stale: false) }
                return .returnValueAndStart(value, attempt, stale: false)
            }
            if let restoredUntil, now.attoseconds < restoredUntil.attoseconds {
                // Restored data under refresh ahead: expired for every reader, yet answered at once
                // while one refetch runs, as fresh data due for its refresh would be.
                guard flight == nil, cachedFailure(at: now) == nil, !isReentrant(callerAttempts),
                    let attempt = begin(waiter: nil, operation: operation, now: now, policy: policy, keepAlive: true)
                else { return .returnValue(value, stale: true) }
                return .returnValueAndStart(value, attempt, stale: true)
            }
            if let error = cachedFailure(at: now) {
                return mode == .staleWhileRevalidate && hasData ? .returnValue(value, stale: true) : .fail(error)
            }
        }
        if isReentrant(callerAttempts) { return .fail(AsyncStateError.reentrantCall) }
        if mode == .staleWhileRevalidate, hasData {
            guard flight == nil else { return .returnValue(value, stale: true) }
            guard let attempt = begin(waiter: nil, operation: operation, now: now, policy: policy, keepAlive: true)
            else { return .returnValue(value, stale: true) }
            return .returnValueAndStart(value, attempt, stale: true)
        }
        // Expired data is not answered by an append in flight (it would extend the expired data): a
        // fetch replaces it, as `refresh` would.
        if flight != nil, mode != .always, !(mode == .ifExpired && flightKeepsFreshness) {
            // In place: binding the flight to a local first would make this insert copy every
            // waiter (copy-on-write), which is quadratic for many joiners.
            mutateFlight { $0.waiters.insert(waiter) }
            return .join
        }
        // A new flight; `refresh` takes over the old one's waiters, whose result will be dropped.
        let replacing = flight != nil
        guard
            let attempt = begin(
                waiter: waiter, operation: operation, now: now, policy: policy, keepAlive: false,
                keepsFreshness: mode == .append && hasData)
        else { return .fail(AsyncStateError.tooManyAbandonedOperations(limit: AsyncStateLimits.abandonedOperations)) }
        return .start(attempt, replacing: replacing)
    }

    /// A caller asks to retry: while a flight waits out a backoff, its next attempt starts now;
    /// otherwise, when the phase is failure or empty, a new flight runs `operation` (if given),
    /// bypassing the failure expiry.
    mutating func retry(waiter: WaiterID, operation: Operation?, now: Duration, callerAttempts: [AttemptID] = [])
        -> RetryAction
    {
        if let current = flight {
            guard current.retryAt != nil, !isReentrant(callerAttempts) else { return .ignore }
            mutateFlight { $0.waiters.insert(waiter) }
            return .start(startAttempt(now: now))
        }
        guard let operation else { return .ignore }
        switch phase {
        case .failure, .empty: break
        case .initial, .loading, .success: return .ignore
        }
        guard let attempt = begin(waiter: waiter, operation: operation, now: now, policy: nil, keepAlive: false)
        else { return .ignore }
        return .start(attempt)
    }

    /// The task of waiter `waiter` was cancelled: it stops waiting; the flight is cancelled if it was
    /// the last waiter of a flight that is not a background one.
    @inlinable
    mutating func waiterCancelled(_ waiter: WaiterID) -> WaiterCancelledAction {
        guard flightBox?.flight.waiters.contains(waiter) == true else { return .none }
        mutateFlight { $0.waiters.remove(waiter) }  // in place, as in fetch
        guard let box = flightBox, box.flight.waiters.isEmpty, !box.flight.keepAlive else { return .left }
        return lastWaiterLeft()
    }

    /// The flight's last waiter left: a flight that is not a background one ends, and the phase goes
    /// back to what it was before it.
    @usableFromInline
    mutating func lastWaiterLeft() -> WaiterCancelledAction {
        guard let current = flight else { return .none }
        setFlight(nil)
        phase = current.phaseBefore
        return .leftAndEndedFlight
    }

    /// `cancel()`: cancels the flight outright; its waiters get `CancellationError` and the phase goes
    /// back to what it was before the flight. Publish when a flight was cancelled.
    mutating func cancel() -> EndedFlight {
        guard let current = flight else { return .none }
        setFlight(nil)
        phase = current.phaseBefore
        return .end(waiters: current.waiters)
    }

    /// `invalidate()`: the data is expired now, for every interval, and so will be the result of the
    /// flight in flight; a cached failure is forgotten, and restored data is no longer answered at
    /// once. Returns whether a snapshot changed (publish it then): only data fresh at `now` becoming
    /// expired changes one. Either way the freshness readers test must be the machine's again.
    mutating func invalidate(now: Duration) -> Bool {
        let visible = isFresh(at: now)
        freshSince = nil
        failedAt = nil
        restoredUntil = nil
        mutateFlight { $0.expiresOnArrival = true }
        return visible
    }

    /// `set(_:)`: a manual (or optimistic) write, fresh from `now`. It wins over the flight in flight:
    /// that flight ends and its waiters get `newValue`. Publish.
    mutating func set(_ newValue: Value, now: Duration, date: Date) -> EndedFlight {
        let ended = endFlight()
        value = newValue
        hasData = true
        valueIsEmpty = isEmpty(newValue)
        phase = valueIsEmpty ? .empty : .success(date)
        freshSince = now
        failedAt = nil
        restoredUntil = nil
        return ended
    }

    /// A warm restart: `newValue`, saved by an earlier process, as expired data: every reader sees it
    /// expired, and nothing but newer data makes it fresh. Under stale-while-revalidate it is served
    /// as any stale data is; under refresh ahead it is answered at once while one refetch runs, for
    /// as long as fresh data would be before its refresh (`expiry − refreshAfter`, see
    /// ``restoredUntil``); otherwise it is refetched before it is served. Only into a state with no
    /// data and no flight (anything newer wins); returns whether it was restored. Publish if so.
    mutating func restore(_ newValue: Value, isEmpty: Bool, lastSuccess: Date?, now: Duration, date: Date) -> Bool {
        guard !hasData, flight == nil, abandoned.isEmpty else { return false }
        value = newValue
        hasData = true
        valueIsEmpty = isEmpty
        phase = isEmpty ? .empty : .success(lastSuccess ?? date)
        self.lastSuccess = lastSuccess
        freshSince = nil
        restoredUntil = configuration.refreshAfter.map { now.saturatingAdd(configuration.expiry - $0) }
        failedAt = nil
        failureCount = 0
        return true
    }

    /// What a warm restart saves: the data, whether it is empty — as the phase said when it
    /// arrived, not as the emptiness test says now — and when it last succeeded; `nil` without data.
    var archived: (value: Value, isEmpty: Bool, lastSuccess: Date?)? {
        hasData ? (value, valueIsEmpty, lastSuccess) : nil
    }

    /// `reset()`: back to the initial value and phase, forgetting the metadata. The flight in flight
    /// ends and its waiters get `CancellationError`. Returns whether anything a reader can see changed
    /// (publish then): a reset of a state that is already initial changes nothing.
    mutating func reset() -> (ended: EndedFlight, changed: Bool) {
        var isInitial: Bool {
            if case .initial = phase { return true } else { return false }
        }
        let changed =
            flight != nil || hasData || !isInitial || failureCount != 0 || lastError != nil || lastSuccess != nil
            || successCount != 0
        let ended = endFlight()
        value = initialValue
        hasData = false
        valueIsEmpty = false
        restoredUntil = nil
        phase = .initial
        freshSince = nil
        failedAt = nil
        failureCount = 0
        lastError = nil
        lastSuccess = nil
        successCount = 0
        return (ended, changed)
    }

    // MARK: Events from the flight's tasks

    /// Attempt `attempt` of flight `id` ended with `outcome` at `now` (wall date `date`).
    mutating func attemptFinished(
        _ id: FlightID, attempt: AttemptID, outcome: Outcome, now: Duration, date: Date
    ) -> FlightAction {
        abandoned.remove(attempt)
        guard let current = flight, current.id == id, current.attempt == attempt, current.retryAt == nil else {
            return .drop
        }
        switch outcome {
        case .success(let newValue):
            setFlight(nil)
            value = newValue
            hasData = true
            valueIsEmpty = isEmpty(newValue)
            phase = valueIsEmpty ? .empty : .success(date)
            restoredUntil = nil
            if current.expiresOnArrival {
                freshSince = nil
            } else if !current.keepsFreshness {
                freshSince = now
            }
            failedAt = nil
            failureCount = 0
            lastSuccess = date
            successCount += 1
            return .settle(waiters: current.waiters, result: .success(newValue))
        case .failure(let error):
            return attemptFailed(error, now: now)
        case .cancelled:
            return settleCancelled()
        }
    }

    /// The current attempt of flight `id` ran past its timeout: it is abandoned (its task is cancelled,
    /// its late result dropped) and counts as a failure with ``AsyncStateError/timedOut(after:)``.
    mutating func attemptTimedOut(_ id: FlightID, attempt: AttemptID, now: Duration) -> FlightAction {
        guard let current = flight, current.id == id, current.attempt == attempt, current.retryAt == nil,
            let timeout = configuration.timeout
        else { return .drop }
        abandoned.insert(attempt)
        return attemptFailed(AsyncStateError.timedOut(after: timeout), now: now)
    }

    /// The backoff before attempt `attempt` of flight `id` ended: the attempt starts now. If the
    /// clock's sleep threw instead (`error`), the flight settles: cancelled for a `CancellationError`,
    /// failed with `error` otherwise — never left `loading`.
    mutating func backoffEnded(_ id: FlightID, attempt: AttemptID, error: (any Error)?, now: Duration)
        -> FlightAction
    {
        guard let current = flight, current.id == id, current.attempt == attempt, current.retryAt != nil else {
            return .drop
        }
        switch error {
        case nil:
            guard abandoned.count < AsyncStateLimits.abandonedOperations else {
                return settleFailed(
                    lastError ?? AsyncStateError.timedOut(after: configuration.timeout ?? .zero), now: now)
            }
            return .start(startAttempt(now: now))
        case is CancellationError:
            return settleCancelled()
        case let error?:
            lastError = error
            return settleFailed(error, now: now)
        }
    }

    // MARK: Helpers

    /// The emptiness test of a successful value.
    private func isEmpty(_ value: Value) -> Bool { configuration.isEmpty(value) }

    /// Starts a flight running `operation`, with `waiter` waiting for it (none for a background
    /// flight): the phase becomes `loading`. A flight in flight is replaced in place — the new one takes
    /// over its waiters (without copying them) and the phase it restores if cancelled. Returns `nil`,
    /// starting nothing, while too many abandoned operations still run.
    @usableFromInline
    mutating func begin(
        waiter: WaiterID?, operation: Operation, now: Duration, policy: RetryPolicy?, keepAlive: Bool,
        refreshesAhead: Bool = false, keepsFreshness: Bool = false
    ) -> Attempt? {
        guard abandoned.count < AsyncStateLimits.abandonedOperations else { return nil }
        let policy = policy ?? configuration.retry
        let (id, attempt) = (nextID(), nextID())
        let random = SplitMix64(seed: policy.seed ?? seeds.next())
        if flight == nil {
            // Not `[waiter]`: an array literal would allocate an array on the way to the set.
            var waiters = Set<WaiterID>()
            if let waiter { waiters.insert(waiter) }
            setFlight(
                Flight(
                    id: id, operation: operation, attempt: attempt, retryAt: nil, waiters: waiters,
                    phaseBefore: phase, expiresOnArrival: false, policy: policy, startedAt: now, failures: 0,
                    keepAlive: keepAlive, refreshesAhead: refreshesAhead, keepsFreshness: keepsFreshness,
                    random: random))
        } else {
            mutateFlight { flight in
                (flight.id, flight.operation, flight.attempt, flight.retryAt) = (id, operation, attempt, nil)
                (flight.expiresOnArrival, flight.policy, flight.startedAt, flight.failures) = (false, policy, now, 0)
                (flight.keepAlive, flight.refreshesAhead, flight.random) = (keepAlive, refreshesAhead, random)
                flight.keepsFreshness = keepsFreshness
                if let waiter { flight.waiters.insert(waiter) }
            }
        }
        phase = .loading
        failureCount = 0
        return self.attempt(of: flight!, now: now)
    }

    /// Starts the flight's next attempt now (after a backoff, or on `retry()` during one).
    private mutating func startAttempt(now: Duration) -> Attempt {
        let id = nextID()
        mutateFlight {
            $0.attempt = id
            $0.retryAt = nil
        }
        return attempt(of: flight!, now: now)
    }

    /// The current attempt of `flight`, starting at `now`.
    private func attempt(of flight: Flight, now: Duration) -> Attempt {
        Attempt(
            flight: flight.id, id: flight.attempt, operation: flight.operation,
            timeoutAt: configuration.timeout.map { now.saturatingAdd($0) })
    }

    /// The current attempt failed with `error`: retry as the policy says, or settle.
    private mutating func attemptFailed(_ error: any Error, now: Duration) -> FlightAction {
        var current = flight!
        current.failures += 1
        failureCount = current.failures
        lastError = error
        guard let at = retryInstant(for: &current, after: error, now: now) else {
            return settleFailed(error, now: now)
        }
        current.attempt = nextID()
        current.retryAt = at
        setFlight(current)
        return .retry(flight: current.id, attempt: current.attempt, at: at)
    }

    private mutating func settleFailed(_ error: any Error, now: Duration) -> FlightAction {
        let current = flight!
        setFlight(nil)
        phase = .failure(error)
        // A failed refresh ahead leaves the data fresh until its own expiry (unless invalidated); so
        // does a failed append, which is not cached either: the list it would have extended stands.
        if !current.refreshesAhead && !current.keepsFreshness { freshSince = nil }
        failedAt = configuration.failureExpiry > .zero && !current.keepsFreshness ? now : nil
        return .settle(waiters: current.waiters, result: .failure(error))
    }

    private mutating func settleCancelled() -> FlightAction {
        let current = flight!
        setFlight(nil)
        phase = current.phaseBefore
        return .settle(waiters: current.waiters, result: .failure(CancellationError()))
    }

    /// When the flight's next attempt starts, or `nil` when its policy gives up after this failure.
    private func retryInstant(for flight: inout Flight, after error: any Error, now: Duration) -> Duration? {
        let policy = flight.policy
        guard flight.failures < policy.maxAttempts, policy.shouldRetry(error),
            abandoned.count < AsyncStateLimits.abandonedOperations
        else { return nil }
        let at = now.saturatingAdd(policy.delay(beforeRetry: flight.failures, using: &flight.random))
        if let budget = policy.budget, budget <= .zero || at - flight.startedAt > budget { return nil }
        return at
    }

    private mutating func endFlight() -> EndedFlight {
        guard let current = flight else { return .none }
        setFlight(nil)
        return .end(waiters: current.waiters)
    }

    private mutating func setFlight(_ newFlight: Flight?) {
        flightBox = newFlight.map(FlightBox.init)
    }

    /// Mutates the flight in place (copying its box first if another machine shares it).
    @inlinable
    mutating func mutateFlight(_ body: (inout Flight) -> Void) {
        guard flightBox != nil else { return }
        if !isKnownUniquelyReferenced(&flightBox!) { flightBox = FlightBox(flightBox!.flight) }
        body(&flightBox!.flight)
    }

    /// The box of ``flightBox``.
    @usableFromInline
    final class FlightBox {
        @usableFromInline var flight: Flight
        @usableFromInline init(_ flight: Flight) { self.flight = flight }
    }

    private mutating func nextID() -> UInt64 {
        lastID &+= 1
        return lastID
    }
}

extension FetchStateMachine {
    /// The snapshot to publish at `now`.
    func snapshot(at now: Duration) -> AsyncSnapshot<Value> {
        AsyncSnapshot(
            value: value, phase: phase, isExpired: !isFresh(at: now), failureCount: failureCount,
            lastError: lastError, lastSuccess: lastSuccess, successCount: successCount, hasValue: hasData)
    }
}
