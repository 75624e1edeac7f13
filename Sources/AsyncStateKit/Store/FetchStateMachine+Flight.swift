// The events a flight's tasks and timers bring to the machine, and the helpers that start, retry and
// settle a flight, which the events callers bring (`FetchStateMachine.swift`) share. See that file's
// note on why these members are `@usableFromInline`.
public import Foundation
public import Synchronization

extension FetchStateMachine {
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
            return settleSucceeded(with: newValue, now: now, date: date, outcome: .succeeded, arrival: nil)
        case .notModified:
            // The value it was given is current: a success that keeps it, renewed as a new one would
            // be. With no value to keep, a failure.
            guard data.hasValue else { return attemptFailed(AsyncStateError.notModifiedWithoutValue, now: now) }
            return settleSucceeded(with: data.value, now: now, date: date, outcome: .notModified, arrival: nil)
        case .arrived(let newValue, let arrival):
            return settleSucceeded(with: newValue, now: now, date: arrival.date, outcome: .succeeded, arrival: arrival)
        case .failure(let error):
            return attemptFailed(error, now: now)
        case .cancelled:
            return settleCancelled(now: now)
        }
    }

    /// Attempt `attempt` of flight `id` read `value` from a second level, not fresh, as old as
    /// `arrival` says: the flight keeps it as its fallback, which fail-safe may answer if the flight
    /// fails for good — by its source's failure or by its attempt's timeout alike
    /// (``settleFailed(_:now:)``, ``takesFallback(_:at:)``). An offer from an attempt that is not the
    /// flight's current one changes nothing.
    @inlinable mutating func fallbackOffered(
        _ id: FlightID, attempt: AttemptID, value: Value, arrival: RemoteArrival, now: Duration
    ) {
        guard flightBox?.flight.id == id, case .running(attempt)? = flightBox?.flight.stage else { return }
        mutateFlight { $0.fallback = Fallback(value, arrival: arrival, now: now) }
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

    /// Answers `value` now, reported as `answer`, and starts a background flight of `kind` to refresh
    /// it — unless a flight runs, a failed one is within the failure expiry, the caller is that
    /// refresh's own operation, or too many abandoned operations still run: the one rule of "answer
    /// now, refresh behind it" (a refresh ahead, restored data, stale-while-revalidate).
    @inlinable
    mutating func answer(
        _ value: Value, _ answer: Answer, refreshing kind: FlightKind, now: Duration, policy: RetryPolicy?,
        operation: Operation, callerAttempts: [AttemptID]
    ) -> FetchAction {
        guard flightBox == nil, cachedFailure(at: now) == nil, !isReentrant(callerAttempts),
            let attempt = begin(
                waiter: nil, operation: operation, now: now, policy: policy, kind: kind, reason: .background,
                readsTheSource: false)
        else { return .answer(value, answer, refresh: nil) }
        return .answer(value, answer, refresh: attempt)
    }

    /// Starts a new flight that the caller waits for; `refresh` (`.always`) takes over the old one's
    /// waiters, whose result will be dropped. An append to data the state has (`loadMore`) is the one
    /// place a flight is decided to be an append: it keeps the data's freshness and is reported as
    /// ``Reason/loadMore``; before the first page it is a first read like any other.
    @inlinable
    mutating func start(
        waiter: WaiterID, mode: FetchMode, reason: Reason, readsTheSource: Bool, now: Duration, policy: RetryPolicy?,
        operation: Operation
    ) -> FetchAction {
        let appends = mode == .append && data.hasValue
        let replaced = flightBox?.flight.handles
        guard
            let attempt = begin(
                waiter: waiter, operation: operation, now: now, policy: policy,
                kind: appends ? .append : .foreground, reason: appends ? .loadMore : reason,
                readsTheSource: readsTheSource)
        else { return .fail(AsyncStateError.tooManyAbandonedOperations(limit: AsyncStateLimits.abandonedOperations)) }
        waits(waiter, patiently: !mode.isReader)
        return .start(attempt, replaced: replaced)
    }

    /// Marks `waiter` as one the soft timeout does not release if it waits `patiently` (see
    /// ``FetchMode/isReader``).
    @inlinable mutating func waits(_ waiter: WaiterID, patiently: Bool) {
        guard patiently, configuration.softTimeout != nil else { return }
        mutateFlight { $0.patientWaiters.insert(waiter) }
    }

    /// The emptiness test of a successful value.
    @inlinable func isEmpty(_ value: Value) -> Bool { configuration.isEmpty(value) }

    /// Starts a flight of `kind` running `operation`, started for `reason`, with `waiter` waiting for
    /// it (none for a background flight); its attempts read the source if `readsTheSource`. A flight
    /// in flight is replaced in place — the new one takes over its waiters (without copying them); its
    /// handles must have been taken first. Returns `nil`, starting nothing, while too many abandoned
    /// operations still run.
    @inlinable
    mutating func begin(
        waiter: WaiterID?, operation: Operation, now: Duration, policy: RetryPolicy?, kind: FlightKind,
        reason: Reason, readsTheSource: Bool
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
                    reason: reason, readsTheSource: readsTheSource, startedWithValue: hadValue,
                    expiresOnArrival: false, policy: policy, startedAt: now, attempts: 1, random: random,
                    handles: Handles()))
        } else {
            mutateFlight { flight in
                (flight.id, flight.operation, flight.stage, flight.kind) = (id, operation, .running(attempt), kind)
                (flight.reason, flight.readsTheSource) = (reason, readsTheSource)
                (flight.startedWithValue, flight.expiresOnArrival) = (hadValue, false)
                flight.isPastSoftTimeout = false
                (flight.policy, flight.startedAt, flight.attempts, flight.random) = (policy, now, 1, random)
                (flight.handles, flight.fallback) = (Handles(), nil)
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

    /// The flight's current attempt, starting at `now`, with what its operation may read of the state
    /// now. The first attempt of a flight carries the flight's soft timeout (not an append's, which no
    /// reader joins).
    @inlinable func attempt(now: Duration, starts: Reason?) -> Attempt {
        let box = flightBox!
        let softTimeout = starts != nil && box.flight.kind != .append ? configuration.softTimeout : nil
        let timeoutAt = configuration.timeout.map { now.saturatingAdd($0) }
        let input = AttemptInput(
            previous: data.hasValue ? data.value : nil, lastSuccess: data.lastSuccess, version: data.version,
            readsTheSource: box.flight.readsTheSource, timeoutAt: timeoutAt)
        return Attempt(
            flight: box.flight.id, id: box.flight.attempt, operation: box.flight.operation, input: input,
            timeoutAt: timeoutAt,
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

    /// The flight succeeded with `value` (new, or kept: `outcome` says) at `now`, on `date`; for a
    /// value that came from a second level, as old and as fresh as `arrival` says.
    @inlinable mutating func settleSucceeded(
        with value: Value, now: Duration, date: Date, outcome: FlightOutcome, arrival: RemoteArrival?
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
        return .settle(waiters: waiters, outcome: outcome, answer: .success(value), report: report, cancel: handles)
    }

    /// The flight failed for good with `error` at `now`. Fail-safe: its waiters get the last good value
    /// instead while it is young enough — not those of an append, whose caller asked for more than
    /// that value. A value a second level held, not fresh, when an attempt read it (the flight's
    /// fallback) is that last good value if the state holds none as young (``takesFallback(_:at:)``).
    @inlinable mutating func settleFailed(_ error: any Error, now: Duration) -> FlightAction {
        let kind = flightBox!.flight.kind
        if kind != .append, let fallback = flightBox!.flight.fallback, takesFallback(fallback, at: now) {
            data.receiveFallback(
                fallback.value, isEmpty: isEmpty(fallback.value), receivedAt: fallback.receivedAt, date: fallback.date,
                version: fallback.version)
        }
        let report = self.report(at: now)
        let (waiters, handles) = takeFlight()
        // A failed refresh ahead leaves the data fresh until its own expiry (unless invalidated); so
        // does a failed append, which is not cached either: the list it would have extended stands.
        data.fail(
            error, at: now, keepsFreshness: kind == .refreshAhead || kind == .append,
            cached: configuration.failureExpiry > .zero && kind != .append)
        if kind != .append, let value = failSafeValue(at: now) {
            return .settle(
                waiters: waiters, outcome: .failedSafe(error), answer: .success(value), report: report, cancel: handles)
        }
        return .settle(
            waiters: waiters, outcome: .failed(error), answer: .failure(error), report: report, cancel: handles)
    }

    /// Whether a flight that failed for good at `now` takes `fallback` as its last good value: fail-safe
    /// is on and would answer it (it is younger than the maximum stale age, counted from its
    /// source's answer, by the one freshness test), the state's own value is older (by its success
    /// date), and its version is current (an invalidation since is not undone). The one rule of
    /// fail-safe from a second level.
    @inlinable func takesFallback(_ fallback: Fallback, at now: Duration) -> Bool {
        guard let maxStaleAge = configuration.maxStaleAge,
            isWithinExpiry(since: fallback.receivedAt, at: now, expiry: maxStaleAge)
        else { return false }
        return SecondLevelVersion.takes(
            fallback.version, succeededAt: fallback.date, over: data.hasValue ? data.lastSuccess : nil,
            known: data.version)
    }

    @inlinable mutating func settleCancelled(now: Duration) -> FlightAction {
        let report = self.report(at: now)
        let (waiters, handles) = takeFlight()
        return .settle(
            waiters: waiters, outcome: .cancelled, answer: .failure(CancellationError()), report: report,
            cancel: handles)
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
