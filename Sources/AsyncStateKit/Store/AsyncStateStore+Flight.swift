import Foundation

/// The events a store's tasks and timers bring, and how the shell performs the machine's actions:
/// under the store's lock, with what must not run under it (cancelling tasks, resuming waiters,
/// delivering the observer's events, releasing replaced snapshots) left in ``Effects``.
extension AsyncStateStore {
    // MARK: Events from waiters and from the flight's tasks

    /// A waiter's task was cancelled (called from its cancellation handler, on any thread).
    @inlinable
    func waiterCancelled(_ waiter: Machine.WaiterID) {
        withCore { core, effects in
            // It stops waiting at once (after the lock), whatever the machine does with its flight.
            recordWaitsEnded(CollectionOfOne(waiter), error: CancellationError(), in: core, &effects)
            effects.cancelledWaiter = WaiterSlot.take(
                waiter, settlingWith: WaiterOutcome.cancelled, in: &core.waiterSlots)
            switch core.machine.waiterCancelled(waiter) {
            case .none, .left:
                break  // the waiter is resumed with `CancellationError` above, the flight goes on
            case .leftAndEndedFlight(let handles):
                flightLostItsWaiters(handles, in: &core, &effects)
            }
        }
    }

    /// The last waiter of a flight left (by cancellation): the flight ended.
    @inlinable
    func flightLostItsWaiters(_ handles: Machine.Handles, in core: inout Core, _ effects: inout Effects) {
        ended(handles, in: &effects)
        publish(core.machine.publication(at: clock.now()), in: &effects)
    }

    /// An attempt's operation returned or threw.
    @inlinable func attemptFinished(
        _ flight: Machine.FlightID, _ attempt: Machine.AttemptID, _ outcome: Machine.Outcome
    ) {
        withCore { core, effects in
            let now = clock.now()
            perform(
                core.machine.attemptFinished(flight, attempt: attempt, outcome: outcome, now: now, date: clock.date()),
                at: now, in: &core, &effects)
        }
    }

    /// An attempt's operation read a value from a second level that is not fresh: the flight keeps
    /// it as its fail-safe fallback.
    @inlinable func fallbackOffered(
        _ flight: Machine.FlightID, _ attempt: Machine.AttemptID, _ value: Value, _ arrival: RemoteArrival
    ) {
        core.withLock { core in
            core.machine.fallbackOffered(flight, attempt: attempt, value: value, arrival: arrival, now: clock.now())
        }
    }

    /// An attempt's timeout fired: the attempt is abandoned (cancelled, its late result dropped).
    @inlinable func attemptTimedOut(_ flight: Machine.FlightID, _ attempt: Machine.AttemptID) {
        withCore { core, effects in
            let now = clock.now()
            perform(core.machine.attemptTimedOut(flight, attempt: attempt, now: now), at: now, in: &core, &effects)
        }
    }

    /// The soft timeout of flight `flight` passed (or its sleep threw: it ends the wait now, as the
    /// other timers do).
    @inlinable func softTimeoutPassed(_ flight: Machine.FlightID) {
        withCore { core, effects in
            guard case .answer(let ids, let value) = core.machine.softTimeoutPassed(flight, now: clock.now()) else {
                return
            }
            recordEach(ids, .softTimeout, in: &effects)
            resume(ids, with: .success(value), in: &core, &effects)
        }
    }

    /// A backoff ended, or its sleep threw `error`.
    @inlinable func backoffEnded(_ flight: Machine.FlightID, _ attempt: Machine.AttemptID, error: (any Error)?) {
        withCore { core, effects in
            let now = clock.now()
            perform(
                core.machine.backoffEnded(flight, attempt: attempt, error: error, now: now), at: now, in: &core,
                &effects)
        }
    }

    // MARK: Performing actions (under the lock; effects after it)

    @inlinable func perform(
        _ action: consuming Machine.FlightAction, at now: Duration, in core: inout Core, _ effects: inout Effects
    ) {
        switch consume action {
        case .drop:
            break
        case .retry(let flight, let attempt, let at, let error, let attempts, let cancel):
            record(.attemptFailed(error: error, attempt: attempts, retryIn: at - now), aboutFetch: true, in: &effects)
            effects.cancel(cancel)
            let timer = schedule(at: at) { store, error in store.backoffEnded(flight, attempt, error: error) }
            core.machine.attach(task: nil, timer: timer)
            publish(core.machine.publication(at: now), in: &effects)
        case .start(let attempt, let cancel):
            effects.cancel(cancel)
            start(attempt, waiter: nil, at: now, in: &core, &effects)
        case .settle(let ids, let outcome, let answer, let report, let cancel):
            effects.cancel(cancel)
            record(settled: outcome, report: report, waiters: ids, in: &effects)
            publish(core.machine.publication(at: now), in: &effects)
            resume(ids, with: answer, in: &core, &effects)
        }
    }

    /// Ends a flight that an event (`set`, `cancel`, `reset`) ended and resumes its waiters with
    /// `result`, after publishing (so that a resumed waiter sees the new snapshot).
    @inlinable func end(
        _ ended: Machine.EndedFlight, resumingWith result: Result<Value, any Error>, in core: inout Core,
        _ effects: inout Effects
    ) {
        guard case .end(let ids, let handles) = ended else { return }
        self.ended(handles, in: &effects)
        resume(ids, with: result, in: &core, &effects)
    }

    /// A flight that an event ended before it settled (replaced, cancelled, overtaken, or left by its
    /// last waiter): its outcome is `cancelled` — its result will never land — and its tasks are
    /// cancelled. With the settles in ``perform(_:at:in:_:)``, every end of a flight reports exactly
    /// one outcome after its `started`.
    @inlinable
    func ended(_ handles: Machine.Handles, in effects: inout Effects) {
        record(.cancelled, aboutFetch: true, in: &effects)
        effects.cancel(handles)
    }

    /// Takes waiters `ids` out of the table, to be resumed with `result` once the lock is released:
    /// one shared ``WaiterOutcome``, in arrival order (ids grow; see ``Effects/perform()``). Callers
    /// that are children of one task group then finish in the order they were added, which the
    /// runtime's group handles in O(1) each (in hash order, its child list makes them quadratic).
    @inlinable func resume(
        _ ids: WaiterIDs, with result: Result<Value, any Error>, in core: inout Core,
        _ effects: inout Effects
    ) {
        guard !ids.isEmpty else { return }
        recordWaitsEnded(ids, error: result.error, in: core, &effects)
        let outcome = WaiterOutcome.settled(result)
        effects.resumed = (WaiterSlot.take(ids, settlingWith: outcome, in: &core.waiterSlots), outcome)
    }

    /// Publishes `publication` (``FetchStateMachine/publication(at:)``) to the cell (see
    /// ``SnapshotCell/publish(_:notifying:)``). The snapshot it replaces goes into `effects`, to be
    /// released after the store's lock: it may hold the last reference to a value or an error, and
    /// their deinits are user code, which may call the state — a family's `invalidate`, `set` or
    /// `remove` of the same key takes this lock.
    @inlinable func publish(
        _ publication: consuming Publication<Value>, notifying: Bool = true, in effects: inout Effects
    ) {
        effects.replaced.append(cell.publish(publication, notifying: notifying))
    }

    /// Starts `attempt`'s task and its timeout's timer, gives them to the flight, and publishes. The
    /// first attempt of a flight is reported as its start (`waiter`: the caller that started it and
    /// waits for it, if any).
    @inlinable
    func start(
        _ attempt: Machine.Attempt, waiter: Machine.WaiterID?, at now: Duration, in core: inout Core,
        _ effects: inout Effects
    ) {
        record(starting: attempt.starts, waiter: waiter, in: &effects)
        let (flight, id) = (attempt.flight, attempt.id)
        if let softDeadline = attempt.softTimeoutAt {
            core.machine.attach(softTimer: schedule(at: softDeadline) { store, _ in store.softTimeoutPassed(flight) })
        }
        if let deadline = attempt.timeoutAt {
            // With a timeout the attempt starts on a thread of its own, as any task does (it is
            // enqueued here and runs once a thread takes it, before its timer), so that the timeout
            // bounds the wait even for an operation that blocks its thread and never suspends.
            let task = task(for: attempt, immediate: false)
            // A timer whose sleep throws without being cancelled cannot keep its promise to end the
            // wait at the deadline, so it ends it now.
            let timer = schedule(at: deadline) { store, _ in store.attemptTimedOut(flight, id) }
            core.machine.attach(task: task, timer: timer)
        } else {
            // Without one it starts on the caller's thread once the lock is released (see
            // ``launchAndAttach(_:)``).
            precondition(effects.launch == nil, "an event started two attempts")
            effects.launch = attempt
            core.machine.attach(task: nil, timer: nil)
        }
        publish(core.machine.publication(at: now), in: &effects)
    }
}

extension Result {
    /// The error, if it is a failure.
    @inlinable var error: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}
