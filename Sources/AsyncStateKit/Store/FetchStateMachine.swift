// Over 500 lines on purpose: the machine's events and the helpers they share are one unit, whose
// invariants (the flight's stage, the abandoned attempts, the ids) only this file's functions change.
// They are `@usableFromInline` rather than `private` because the machine is inlinable: a miss runs it
// specialized in the caller's module (see Architecture.md, "Specialized in the caller's module").
public import Foundation
public import Synchronization

/// The pure heart of an ``AsyncState``: every event is a `mutating func` that takes the current
/// instant as an argument, changes the state, and returns what the shell must do.
///
/// No clock reads, no awaits, no continuations: ``AsyncStateStore`` owns one, feeds it events and
/// performs the actions. Time is a `Duration` since the store's clock origin. Every decision is made
/// here — freshness, negative caching, reentrancy, retries, timeouts, the bound on abandoned
/// operations — so the shell only performs. The machine's state is its ``StateData`` and, while one
/// runs, its ``Flight``, which holds everything alive: the operation, the waiters' ids, the stage
/// (an attempt running, or a backoff until an instant), the attempt count, and the shell's handles
/// (`Handle`: the attempt's task and the timer) that the actions hand back to be cancelled. The shell
/// never reads the machine's fields to decide: each action carries what it needs.
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

    /// The latest value: kept during loading and after a failure.
    @inlinable var value: Value { data.value }
    /// The current phase: `loading` exactly while a flight runs, else the phase the data settled in.
    @inlinable var phase: AsyncPhase { flightBox == nil ? data.phase : .loading }
    /// The flight in flight, if any.
    @inlinable var flight: Flight? { flightBox?.flight }
    /// Whether a flight is in flight.
    @inlinable var isFlying: Bool { flightBox != nil }
    /// Why the flight in flight started and whether the state had a value then; `nil` without one.
    @inlinable var flightStart: (reason: Reason, hadValue: Bool)? {
        flightBox.map { ($0.flight.reason, $0.flight.startedWithValue) }
    }

    /// The data, if this machine may rest: no flight, no abandoned operation, and data at rest. A
    /// machine restored from it behaves as this one would.
    @inlinable var restingData: StateData<Value>? {
        flightBox == nil && abandoned.isEmpty && data.isAtRest ? data : nil
    }

    // MARK: Queries

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

    /// Why a flight that `request` starts started.
    @inlinable
    func reason(of request: FetchRequest) -> Reason {
        switch request {
        case .value, .fetch: return .fetch
        case .refresh: return .refresh
        case .periodic: return .periodic
        case .loadMore: return data.hasValue ? .loadMore : .fetch
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
            waiter: waiter, mode: mode(of: request), reason: reason(of: request), now: now, policy: policy,
            operation: operation, callerAttempts: callerAttempts)
    }

    /// ``fetch(waiter:request:now:policy:operation:callerAttempts:)`` once the request is resolved
    /// into its `mode` and the `reason` of a flight it starts (tests drive it directly, to apply
    /// every mode to every state).
    @inlinable
    mutating func fetch(
        waiter: WaiterID, mode: FetchMode, reason: Reason = .fetch, now: Duration, policy: RetryPolicy? = nil,
        operation: Operation, callerAttempts: [AttemptID] = []
    ) -> FetchAction {
        if mode == .ifExpired || mode == .staleWhileRevalidate {
            if isFresh(at: now) {
                // Refresh ahead: fresh data old enough starts one background refresh, unless one runs,
                // a failed one is within the failure expiry, or the caller is that refresh itself.
                guard isRefreshDue(at: now), flightBox == nil, cachedFailure(at: now) == nil,
                    !isReentrant(callerAttempts),
                    let attempt = begin(
                        waiter: nil, operation: operation, now: now, policy: policy, kind: .refreshAhead,
                        reason: .background)
                else { return .returnValue(data.value, stale: false) }
                return .returnValueAndStart(data.value, attempt, stale: false)
            }
            if let restoredUntil = data.restoredUntil, now.attoseconds < restoredUntil.attoseconds {
                // Restored data under refresh ahead: expired for every reader, yet answered at once
                // while one refetch runs, as fresh data due for its refresh would be.
                guard flightBox == nil, cachedFailure(at: now) == nil, !isReentrant(callerAttempts),
                    let attempt = begin(
                        waiter: nil, operation: operation, now: now, policy: policy, kind: .background,
                        reason: .background)
                else { return .returnValue(data.value, stale: true) }
                return .returnValueAndStart(data.value, attempt, stale: true)
            }
            if let error = cachedFailure(at: now) {
                if mode == .staleWhileRevalidate && data.hasValue { return .returnValue(data.value, stale: true) }
                if let value = failSafeValue(at: now) { return .failSafe(value, error: error) }
                return .fail(error)
            }
        }
        if isReentrant(callerAttempts) { return .fail(AsyncStateError.reentrantCall) }
        if mode == .staleWhileRevalidate, data.hasValue {
            guard flightBox == nil,
                let attempt = begin(
                    waiter: nil, operation: operation, now: now, policy: policy, kind: .background, reason: .background)
            else { return .returnValue(data.value, stale: true) }
            return .returnValueAndStart(data.value, attempt, stale: true)
        }
        // Expired data is not answered by an append in flight (it would extend the expired data): a
        // fetch replaces it, as `refresh` would.
        if flightBox != nil, mode != .always, !(mode == .ifExpired && flightBox?.flight.kind == .append) {
            // Past its soft timeout the flight is known to be slow: a usable value is answered at once.
            if mode == .ifExpired || mode == .staleWhileRevalidate, flightBox?.flight.isPastSoftTimeout == true,
                let value = softTimeoutValue(at: now)
            {
                return .returnValue(value, stale: true)
            }
            // In place, and with no local reference to the box or copy of the flight: either would
            // make this insert copy the box or every waiter (copy-on-write), which is quadratic for
            // many joiners.
            mutateFlight { $0.waiters.insert(waiter) }
            waitsPastSoftTimeout(waiter, mode)
            return .join
        }
        // A new flight; `refresh` takes over the old one's waiters, whose result will be dropped.
        let replaced = flightBox?.flight.handles
        guard
            let attempt = begin(
                waiter: waiter, operation: operation, now: now, policy: policy,
                kind: mode == .append && data.hasValue ? .append : .foreground, reason: reason)
        else { return .fail(AsyncStateError.tooManyAbandonedOperations(limit: AsyncStateLimits.abandonedOperations)) }
        waitsPastSoftTimeout(waiter, mode)
        return .start(attempt, replaced: replaced)
    }

    /// Marks `waiter`, waiting in `mode`, as one the soft timeout does not release, unless it is a
    /// reader (`value`, `fetch`, `snapshot`): `refresh`, a periodic run and an append ask for new data,
    /// and wait for it.
    @inlinable mutating func waitsPastSoftTimeout(_ waiter: WaiterID, _ mode: FetchMode) {
        guard configuration.softTimeout != nil, mode != .ifExpired, mode != .staleWhileRevalidate else { return }
        mutateFlight { $0.patientWaiters.insert(waiter) }
    }

    /// A caller asks to retry: while a flight waits out a backoff, its next attempt starts now;
    /// otherwise, when the phase is failure or empty, a new flight runs `operation` (if given),
    /// bypassing the failure expiry.
    @inlinable mutating func retry(
        waiter: WaiterID, operation: Operation?, now: Duration, callerAttempts: [AttemptID] = []
    )
        -> RetryAction
    {
        if flightBox != nil {
            guard flightBox?.flight.retryAt != nil, !isReentrant(callerAttempts) else { return .ignore }
            mutateFlight { $0.waiters.insert(waiter) }
            waitsPastSoftTimeout(waiter, .always)
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
                waiter: waiter, operation: operation, now: now, policy: nil, kind: .foreground, reason: .retry)
        else { return .ignore }
        waitsPastSoftTimeout(waiter, .always)
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
        return lastWaiterLeft()
    }

    /// The flight's last waiter left: a flight that is not a background one ends.
    @inlinable
    mutating func lastWaiterLeft() -> WaiterCancelledAction {
        guard case .end(_, let handles) = endFlight() else { return .none }
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

    /// `set(_:)`: a manual (or optimistic) write, fresh from `now`. It wins over the flight in flight:
    /// that flight ends and its waiters get `newValue`. Publish.
    @inlinable mutating func set(_ newValue: Value, now: Duration, date: Date) -> EndedFlight {
        let ended = endFlight()
        data.set(
            newValue, isEmpty: isEmpty(newValue), shift: configuration.freshnessShift(of: newValue), now: now,
            date: date)
        return ended
    }

    /// A warm restart: `newValue`, saved by an earlier process, as expired data: every reader sees it
    /// expired, and nothing but newer data makes it fresh. Under stale-while-revalidate it is served
    /// as any stale data is; under refresh ahead it is answered at once while one refetch runs, for
    /// as long as fresh data would be before its refresh (`expiry − refreshAfter`, see
    /// ``StateData/restoredUntil``); otherwise it is refetched before it is served. Only into a state
    /// with no data and no flight (anything newer wins); returns whether it was restored. Publish if so.
    @inlinable mutating func restore(_ newValue: Value, isEmpty: Bool, lastSuccess: Date?, now: Duration, date: Date)
        -> Bool
    {
        guard !data.hasValue, flightBox == nil, abandoned.isEmpty else { return false }
        data.restore(
            newValue, isEmpty: isEmpty, lastSuccess: lastSuccess, now: now, date: date,
            restoredUntil: configuration.refreshAfter.map { now.saturatingAdd(configuration.expiry - $0) })
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

    // MARK: Events from the flight's tasks

    /// Attempt `attempt` of flight `id` ended with `outcome` at `now` (wall date `date`). Its task is
    /// ending by itself: it is not handed back to be cancelled.
    @inlinable mutating func attemptFinished(
        _ id: FlightID, attempt: AttemptID, outcome: Outcome, now: Duration, date: Date
    ) -> FlightAction {
        abandoned.remove(attempt)
        guard flightBox?.flight.id == id, case .running(attempt)? = flightBox?.flight.stage else { return .drop }
        mutateFlight { $0.handles.attempt = nil }
        switch outcome {
        case .success(let newValue):
            return settleSucceeded(with: newValue, now: now, date: date, answer: .result)
        case .notModified:
            // The value it was given is current: a success that keeps it, renewed as a new one would
            // be. With no value to keep, a failure.
            guard data.hasValue else { return attemptFailed(AsyncStateError.notModifiedWithoutValue, now: now) }
            return settleSucceeded(with: data.value, now: now, date: date, answer: .notModified)
        case .arrived(let newValue, let arrival):
            return settleSucceeded(with: newValue, now: now, date: arrival.date, answer: .result, arrival: arrival)
        case .failure(let error):
            return attemptFailed(error, now: now)
        case .cancelled:
            return settleCancelled(now: now)
        }
    }

    /// The current attempt of flight `id` ran past its timeout: it is abandoned (its task is cancelled,
    /// its late result dropped) and counts as a failure with ``AsyncStateError/timedOut(after:)``. The
    /// timer is ending by itself: it is not handed back to be cancelled.
    @inlinable mutating func attemptTimedOut(_ id: FlightID, attempt: AttemptID, now: Duration) -> FlightAction {
        guard flightBox?.flight.id == id, case .running(attempt)? = flightBox?.flight.stage,
            let timeout = configuration.timeout
        else { return .drop }
        abandoned.insert(attempt)
        mutateFlight { $0.handles.timer = nil }
        return attemptFailed(AsyncStateError.timedOut(after: timeout), now: now)
    }

    /// The soft timeout of flight `id` passed at `now`: if the flight still runs and a usable value
    /// exists (``softTimeoutValue(at:)``), its waiters get that value now and it goes on in the
    /// background, its result landing when it arrives; callers that come while it runs get the value
    /// at once too. The timer is ending by itself.
    @inlinable mutating func softTimeoutPassed(_ id: FlightID, now: Duration) -> SoftTimeoutAction {
        guard flightBox?.flight.id == id else { return .none }
        mutateFlight {
            $0.handles.softTimer = nil
            $0.isPastSoftTimeout = true
            // It goes on whoever leaves now: its result is to land.
            if $0.kind == .foreground { $0.kind = .background }
        }
        guard let value = softTimeoutValue(at: now), let flight = flightBox?.flight,
            flight.waiters.count > flight.patientWaiters.count
        else { return .none }
        var readers = WaiterIDs()
        mutateFlight {
            if $0.patientWaiters.isEmpty {
                swap(&readers, &$0.waiters)
            } else {
                readers = $0.waiters.subtracting($0.patientWaiters)
                $0.waiters = $0.patientWaiters
            }
        }
        return .answer(waiters: readers, value: value)
    }

    /// The value a soft timeout answers at `now`: the one fail-safe would (with a maximum stale age),
    /// else whatever value the state holds.
    @inlinable func softTimeoutValue(at now: Duration) -> Value? {
        configuration.maxStaleAge == nil ? (data.hasValue ? data.value : nil) : failSafeValue(at: now)
    }

    /// The backoff before attempt `attempt` of flight `id` ended: the attempt starts now. If the
    /// clock's sleep threw instead (`error`), the flight settles: cancelled for a `CancellationError`,
    /// failed with `error` otherwise — never left `loading`. The timer is ending by itself.
    @inlinable mutating func backoffEnded(_ id: FlightID, attempt: AttemptID, error: (any Error)?, now: Duration)
        -> FlightAction
    {
        guard flightBox?.flight.id == id, case .backingOff(attempt, _)? = flightBox?.flight.stage else { return .drop }
        mutateFlight { $0.handles.timer = nil }
        switch error {
        case nil:
            guard abandoned.count < AsyncStateLimits.abandonedOperations else {
                return settleFailed(
                    data.lastError ?? AsyncStateError.timedOut(after: configuration.timeout ?? .zero), now: now)
            }
            return .start(startAttempt(now: now), cancel: Handles())
        case is CancellationError:
            return settleCancelled(now: now)
        case let error?:
            data.lastError = error
            return settleFailed(error, now: now)
        }
    }

    // MARK: Helpers

    /// The emptiness test of a successful value.
    @inlinable func isEmpty(_ value: Value) -> Bool { configuration.isEmpty(value) }

    /// Starts a flight of `kind` running `operation`, started for `reason`, with `waiter` waiting for
    /// it (none for a background flight). A flight in flight is replaced in place — the new one takes
    /// over its waiters (without copying them); its handles must have been taken first. Returns
    /// `nil`, starting nothing, while too many abandoned operations still run.
    @inlinable
    mutating func begin(
        waiter: WaiterID?, operation: Operation, now: Duration, policy: RetryPolicy?, kind: FlightKind,
        reason: Reason
    ) -> Attempt? {
        guard abandoned.count < AsyncStateLimits.abandonedOperations else { return nil }
        let policy = policy ?? configuration.retry
        let (id, attempt) = (nextID(), nextID())
        let random = SplitMix64(seed: policy.seed ?? seeds.next())
        let hadValue = data.hasValue
        if flightBox == nil {
            var waiters = WaiterIDs()
            if let waiter { waiters.insert(waiter) }
            flightBox = FlightBox(
                Flight(
                    id: id, operation: operation, stage: .running(attempt), waiters: waiters, kind: kind,
                    reason: reason, startedWithValue: hadValue, expiresOnArrival: false, policy: policy,
                    startedAt: now, attempts: 1, random: random, handles: Handles()))
        } else {
            mutateFlight { flight in
                (flight.id, flight.operation, flight.stage, flight.kind) = (id, operation, .running(attempt), kind)
                (flight.reason, flight.startedWithValue, flight.expiresOnArrival) = (reason, hadValue, false)
                flight.isPastSoftTimeout = false
                (flight.policy, flight.startedAt, flight.attempts, flight.random) = (policy, now, 1, random)
                flight.handles = Handles()
                if let waiter { flight.waiters.insert(waiter) }
            }
        }
        data.failureCount = 0
        return self.attempt(now: now, starts: reason)
    }

    /// Starts the flight's next attempt now (after a backoff, or on `retry()` during one).
    @inlinable mutating func startAttempt(now: Duration) -> Attempt {
        let id = nextID()
        mutateFlight {
            $0.stage = .running(id)
            $0.attempts += 1
        }
        return attempt(now: now, starts: nil)
    }

    /// The flight's current attempt, starting at `now`. The first attempt of a flight carries the
    /// flight's soft timeout (not an append's, which no reader joins).
    @inlinable func attempt(now: Duration, starts: Reason?) -> Attempt {
        let box = flightBox!
        let softTimeout = starts != nil && box.flight.kind != .append ? configuration.softTimeout : nil
        return Attempt(
            flight: box.flight.id, id: box.flight.attempt, operation: box.flight.operation,
            timeoutAt: configuration.timeout.map { now.saturatingAdd($0) },
            softTimeoutAt: softTimeout.map { now.saturatingAdd($0) }, starts: starts)
    }

    /// The current attempt failed with `error`: retry as the policy says, or settle.
    @inlinable mutating func attemptFailed(_ error: any Error, now: Duration) -> FlightAction {
        data.failureCount += 1
        data.lastError = error
        var random = flightBox!.flight.random
        guard let at = retryInstant(after: error, now: now, random: &random) else {
            return settleFailed(error, now: now)
        }
        let next = nextID()
        let handles = takeHandles()
        mutateFlight {
            $0.random = random
            $0.stage = .backingOff(next, until: at)
        }
        return .retry(
            flight: flightBox!.flight.id, attempt: next, at: at, error: error, attempts: flightBox!.flight.attempts,
            cancel: handles)
    }

    /// The flight succeeded with `value` (new, or kept as `answer` says) at `now`, on `date`; for a
    /// value that came from a second level, as old and as fresh as `arrival` says.
    @inlinable mutating func settleSucceeded(
        with value: Value, now: Duration, date: Date, answer: SettleAnswer, arrival: RemoteArrival? = nil
    ) -> FlightAction {
        let freshness: StateData<Value>.Freshness
        if flightBox!.flight.expiresOnArrival {
            freshness = .expired
        } else if flightBox!.flight.kind == .append {
            freshness = .unchanged
        } else if let arrival {
            // Fresh until `now + lifetime`: `now − (now + shift) < expiry` exactly until then.
            freshness = .from(now, shift: arrival.lifetime - configuration.expiry)
        } else {
            freshness = .from(now, shift: configuration.freshnessShift(of: value))
        }
        let report = self.report(at: now)
        let (waiters, handles) = takeFlight()
        data.succeed(
            value, isEmpty: isEmpty(value), now: now, date: date, freshness: freshness, age: arrival?.age ?? .zero,
            version: arrival?.version ?? 0)
        return .settle(waiters: waiters, result: .success(value), report: report, cancel: handles, answer: answer)
    }

    @inlinable mutating func settleFailed(_ error: any Error, now: Duration) -> FlightAction {
        let kind = flightBox!.flight.kind
        let report = self.report(at: now)
        let (waiters, handles) = takeFlight()
        // A failed refresh ahead leaves the data fresh until its own expiry (unless invalidated); so
        // does a failed append, which is not cached either: the list it would have extended stands.
        data.fail(
            error, at: now, keepsFreshness: kind == .refreshAhead || kind == .append,
            cached: configuration.failureExpiry > .zero && kind != .append)
        // Fail-safe: the waiters get the last good value instead — not those of an append, whose
        // caller asked for more than that value.
        let failSafe = kind == .append ? nil : failSafeValue(at: now)
        return .settle(
            waiters: waiters, result: .failure(error), report: report, cancel: handles,
            answer: failSafe.map(SettleAnswer.failSafe) ?? .result)
    }

    @inlinable mutating func settleCancelled(now: Duration) -> FlightAction {
        let report = self.report(at: now)
        let (waiters, handles) = takeFlight()
        return .settle(
            waiters: waiters, result: .failure(CancellationError()), report: report, cancel: handles, answer: .result)
    }

    /// The flight's duration so far and its attempts.
    @inlinable func report(at now: Duration) -> FlightReport {
        let box = flightBox!
        return FlightReport(duration: now - box.flight.startedAt, attempts: box.flight.attempts)
    }

    /// When the flight's next attempt starts, drawing its jitter from `random`, or `nil` when its
    /// policy gives up after this failure.
    @inlinable func retryInstant(after error: any Error, now: Duration, random: inout SplitMix64) -> Duration? {
        let box = flightBox!
        let policy = box.flight.policy
        let failures = data.failureCount
        guard failures < policy.maxAttempts, policy.shouldRetry(error),
            abandoned.count < AsyncStateLimits.abandonedOperations
        else { return nil }
        let at = now.saturatingAdd(policy.delay(beforeRetry: failures, using: &random))
        if let budget = policy.budget, budget <= .zero || at - box.flight.startedAt > budget { return nil }
        return at
    }

    /// Ends the flight in flight, if any, forgetting it.
    @inlinable mutating func endFlight() -> EndedFlight {
        guard flightBox != nil else { return .none }
        let (waiters, handles) = takeFlight()
        return .end(waiters: waiters, cancel: handles)
    }

    /// Forgets the flight; returns its waiters and handles.
    @inlinable mutating func takeFlight() -> (WaiterIDs, Handles) {
        let box = flightBox!
        flightBox = nil
        return (box.flight.waiters, box.flight.handles)
    }

    /// Takes the handles of the flight's current step out of it (to be cancelled): its attempt's task
    /// and its timer, not its soft timeout's timer, which only the flight's end takes.
    @inlinable mutating func takeHandles() -> Handles {
        var handles = Handles()
        mutateFlight {
            handles = Handles(attempt: $0.handles.attempt, timer: $0.handles.timer)
            $0.handles.attempt = nil
            $0.handles.timer = nil
        }
        return handles
    }

    /// Mutates the flight in place (copying its box first if another machine shares it).
    @inlinable
    mutating func mutateFlight(_ body: (inout Flight) -> Void) {
        guard flightBox != nil else { return }
        if !isKnownUniquelyReferenced(&flightBox!) { flightBox = FlightBox(flightBox!.flight) }
        body(&flightBox!.flight)
    }

    /// A new flight or attempt id, unique in the process rather than in this machine: a task marked
    /// as running an attempt (``OperationContext``) may outlive the attempt's store, and the store
    /// made next for another key may take the freed store's address. With per-machine ids that
    /// store's first flight had the same attempt id, and a call from the task was refused as
    /// reentrant instead of joining it. Being unique, an attempt id alone marks a task, without its
    /// store.
    @inlinable func nextID() -> UInt64 {
        MachineIDs.last.add(1, ordering: .relaxed).newValue
    }
}

/// The ids of every machine's flights and attempts (see ``FetchStateMachine/nextID()``).
@usableFromInline
enum MachineIDs {
    /// The last id handed out. 2⁶⁴ ids do not run out.
    @usableFromInline static let last = Atomic<UInt64>(0)
}

extension FetchStateMachine {
    /// The snapshot to publish at `now`.
    @inlinable func snapshot(at now: Duration) -> AsyncSnapshot<Value> {
        data.snapshot(at: now, expiry: configuration.expiry, isLoading: flightBox != nil)
    }
}
