import Foundation

/// The attempts the current task is running (directly, through nested states, or because it
/// inherited the context of a task that does), so that the machine can refuse a call that would wait
/// for its own result. Only an attempt that is still current counts, so a task an operation started
/// may call the state once that attempt is over.
@usableFromInline
enum OperationContext {
    /// One running attempt: which store, which attempt.
    @usableFromInline
    struct Entry: Sendable {
        var store: ObjectIdentifier
        var attempt: UInt64
    }

    @TaskLocal static var running: [Entry] = []
}

/// The shell of an ``AsyncState``: it feeds events to a ``FetchStateMachine`` under its lock and
/// performs the actions — starts and cancels the attempts' tasks, sleeps out backoffs and timeouts,
/// resumes waiters, publishes snapshots. It decides nothing itself.
///
/// No actor and no task per event (the shape of swift-async-algorithms' channel): every event — a
/// caller's request, a waiter's cancellation, an attempt's end, a timer — runs the machine under one
/// lock on the thread that brings it, and what must not happen under a lock (cancelling a task, which
/// runs its cancellation handlers; resuming a waiter) happens right after the lock is released. So a
/// cancelled waiter leaves in O(1) without a hop, and under a `VirtualClock` every event runs inside a
/// job the clock already counts (the store's own tasks prefer the clock's executor).
///
/// Lock order: this store's lock, then its ``SnapshotCell``'s (to publish), never the reverse. The
/// table of waiters is under this store's lock, beside the machine. A paged state's activity lock comes between them: its `onStart` hook takes it
/// under this lock, and its `activity` getter reads the cell under it.
///
/// Lifetime: the store keeps an operation only inside the machine's flight, and its tasks only while
/// that flight runs. Each task holds the store until it ends (so a state dropped mid-flight settles
/// and is then freed); nothing outlives the flight except an attempt abandoned by its timeout, which
/// holds the store until its operation returns.
@usableFromInline
final class AsyncStateStore<Value: Sendable>: Sendable {
    @usableFromInline typealias Operation = @Sendable () async throws -> Value
    @usableFromInline typealias Machine = FetchStateMachine<Value, Operation>

    /// What synchronous readers and `updates` see.
    @usableFromInline let cell: SnapshotCell<Value>
    /// The injected clock.
    @usableFromInline let clock: StoreClock
    /// Whether `value` serves stale data at once and refreshes it in the background.
    @usableFromInline let staleWhileRevalidate: Bool
    /// How `value` (and `snapshot(retry:_:)`) fetch: serving stale data at once under
    /// stale-while-revalidate, else only fresh data.
    @inlinable var servingMode: Machine.FetchMode { staleWhileRevalidate ? .staleWhileRevalidate : .ifExpired }
    /// The observer and what the state reports as; `nil` without an observer. Kept in ``events``
    /// only: a state without an observer pays one reference for the feature, not the observation.
    var observation: Observation? { events?.observation }
    /// Whether there is an observer: all the hit path reads without one.
    @usableFromInline let isObserved: Bool
    /// Delivers the observer's events in order (`nil` without an observer).
    @usableFromInline let events: EventQueue?

    /// The machine and the tasks of its flight, behind the store's lock.
    @usableFromInline
    struct Core {
        @usableFromInline var machine: Machine
        /// The flight's running attempt.
        @usableFromInline var attemptTask: Task<Void, Never>?
        /// The timer of the flight's timeout or backoff.
        @usableFromInline var timerTask: Task<Void, Never>?
        /// The last waiter id handed out.
        @usableFromInline var lastWaiter: UInt64 = 0
        /// When the flight in flight started, and how many attempts it has started (for observers).
        @usableFromInline var flightStartedAt: Duration = .zero
        @usableFromInline var attempts = 0
        /// The callers waiting for a flight, by waiter id (see ``WaiterSlot``).
        @usableFromInline var waiterSlots: [UInt64: WaiterSlot] = [:]

        @usableFromInline
        init(machine: Machine) {
            self.machine = machine
        }

        /// A new waiter id (they grow, so their order is the order of arrival).
        @inlinable
        mutating func makeWaiter() -> Machine.WaiterID {
            lastWaiter &+= 1
            return lastWaiter
        }
    }

    /// What an event leaves to do once the lock is released.
    @usableFromInline
    struct Effects {
        /// Tasks to cancel (their cancellation handlers run user code). An event ends at most an
        /// attempt, a timer and the timer that replaces it.
        @usableFromInline var cancelled: (Task<Void, Never>?, Task<Void, Never>?, Task<Void, Never>?) = (
            nil, nil, nil
        )
        /// Waiters to resume (taken out of the table under the lock, by id), and with what.
        @usableFromInline var resumed:
            (
                continuations: [(id: UInt64, continuation: UnsafeContinuation<WaiterOutcome, Never>)],
                outcome: WaiterOutcome
            )?
        /// A waiter whose task was cancelled, to resume with ``WaiterOutcome/cancelled``.
        @usableFromInline var cancelledWaiter: UnsafeContinuation<WaiterOutcome, Never>?
        /// Events for the observer, in order (only with an observer).
        @usableFromInline var events: [AsyncStateEvent.Kind] = []

        @inlinable init() {}

        /// Cancels `task`, if any, once the lock is released.
        @inlinable
        mutating func cancel(_ task: Task<Void, Never>?) {
            guard let task else { return }
            if cancelled.0 == nil {
                cancelled.0 = task
            } else if cancelled.1 == nil {
                cancelled.1 = task
            } else {
                precondition(cancelled.2 == nil, "an event ended more than three tasks")
                cancelled.2 = task
            }
        }

        @inlinable
        func perform() {
            cancelled.0?.cancel()
            cancelled.1?.cancel()
            cancelled.2?.cancel()
            cancelledWaiter?.resume(returning: WaiterOutcome.cancelled)
            if let resumed {
                // In arrival order (ids grow), sorted here rather than under the lock.
                for waiter in resumed.continuations.sorted(by: { $0.id < $1.id }) {
                    waiter.continuation.resume(returning: resumed.outcome)
                }
            }
        }
    }

    @usableFromInline let core: LockedValue<Core>

    /// Creates a store; `seed` seeds the jitter of its retries (random if `nil`).
    convenience init(
        initialValue: Value, configuration: StoreConfiguration<Value>, clock: StoreClock, seed: UInt64? = nil,
        observation: Observation? = nil
    ) {
        self.init(
            Machine(
                initialValue: initialValue, configuration: configuration, seed: seed ?? UInt64.random(in: .min ... .max)
            ),
            clock: clock, observation: observation)
    }

    /// Creates a store in the settled state `settled` (see ``FetchStateMachine/settled``).
    convenience init(
        restoring settled: Machine.Settled, initialValue: Value, configuration: StoreConfiguration<Value>,
        clock: StoreClock, seed: UInt64, observation: Observation? = nil
    ) {
        let machine = Machine(
            restoring: settled, initialValue: initialValue, configuration: configuration, seed: seed)
        self.init(machine, clock: clock, observation: observation)
        cell.publish(machine.snapshot(at: clock.now()), freshSince: machine.freshSince)
    }

    /// Creates a store around `machine` (its cell starts at the machine's initial value).
    private init(_ machine: Machine, clock: StoreClock, observation: Observation?) {
        isObserved = observation != nil
        events = observation.map(EventQueue.init)
        self.clock = clock
        let configuration = machine.configuration
        staleWhileRevalidate = configuration.staleWhileRevalidate
        cell = SnapshotCell(
            value: machine.initialValue, expiry: configuration.expiry, refreshAfter: configuration.refreshAfter)
        core = LockedValue(Core(machine: machine))
    }

    /// The store's state if it is settled and nobody listens (no `updates` subscriber): what a family
    /// keeps instead of the store for an entry nobody uses.
    var settledState: Machine.Settled? {
        core.withLock { core in cell.subscriberCount == 0 ? core.machine.settled : nil }
    }

    /// Runs an event under the lock, then performs what it left to do.
    @inlinable
    func withCore<Result>(_ event: (inout Core, inout Effects) throws -> Result) rethrows -> Result {
        var effects = Effects()
        defer {
            // The observer hears of a settle before its waiters resume.
            if !effects.events.isEmpty { events?.drain() }
            effects.perform()
        }
        return try core.withLock { core in
            defer { if !effects.events.isEmpty { events?.enqueue(effects.events) } }
            return try event(&core, &effects)
        }
    }

    /// Records an event for the observer, if there is one (under the lock; delivered after it).
    @inlinable
    func record(_ kind: @autoclosure () -> AsyncStateEvent.Kind, in effects: inout Effects) {
        if events != nil { effects.events.append(kind()) }
    }

    /// A hit, for the observer (called by the hit paths, outside any lock, when ``isObserved``).
    @usableFromInline
    func observeHit() {
        observation?.deliver(.hit)
    }

    /// The attempts of this store that the current task runs (for the machine's reentrancy check).
    @usableFromInline var callerAttempts: [Machine.AttemptID] {
        let me = ObjectIdentifier(self)
        return OperationContext.running.compactMap { $0.store == me ? $0.attempt : nil }
    }

    // MARK: Events from callers

    /// Gets the value as `mode` says: an answer at once, or the outcome of the flight in flight or of
    /// a new one running `operation` with `policy`.
    @inlinable
    func fetch(
        _ operation: @escaping Operation, mode: Machine.FetchMode, policy: RetryPolicy? = nil,
        reason: AsyncStateEvent.Reason? = nil
    ) async throws -> Value {
        try Task.checkCancellation()
        switch try enter(operation, mode: mode, policy: policy, reason: reason) {
        case .value(let value, _): return value
        case .wait(let waiter, _): return try await wait(waiter)
        }
    }

    /// The synchronous half of ``fetch(_:mode:policy:)``: the machine decides, under the lock, whether
    /// the caller gets an answer now or waits for a flight (which this call may have started). A
    /// ticket to wait on must be waited on (``wait(_:)``), or the flight keeps a waiter that never
    /// leaves, and the table its slot.
    /// `reason`: why a flight this call starts started, for the observer (by default from `mode`).
    /// `onStart`: called under the lock when this call starts a flight (not a background one), before
    /// the flight's `loading` phase is published.
    @inlinable
    func enter(
        _ operation: @escaping Operation, mode: Machine.FetchMode, policy: RetryPolicy? = nil,
        reason: AsyncStateEvent.Reason? = nil, onStart: (() -> Void)? = nil
    ) throws -> Ticket {
        let attempts = callerAttempts
        return try withCore { core, effects -> Ticket in
            let now = clock.now()
            let waiter = core.makeWaiter()
            var started: Machine.AttemptID?
            switch core.machine.fetch(
                waiter: waiter, mode: mode, now: now, policy: policy, operation: operation,
                callerAttempts: attempts)
            {
            case .returnValue(let value, let stale):
                record(stale ? .servedStale : .hit, in: &effects)
                return .value(value, started: nil)
            case .returnValueAndStart(let value, let attempt, let stale):
                record(stale ? .servedStale : .hit, in: &effects)
                begin(attempt, reason: .background, at: now, in: &core, &effects)
                return .value(value, started: attempt.id)
            case .fail(let error):
                throw error
            case .join:
                record(.joined, in: &effects)
            case .start(let attempt, let replacing):
                onStart?()
                // The flight it replaces ends here: its outcome comes before the new one's start.
                if replacing { endFlight(reporting: .cancelled, in: &core, &effects) }
                begin(attempt, reason: reason ?? (mode == .always ? .refresh : .fetch), at: now, in: &core, &effects)
                started = attempt.id
            }
            // Announced under the lock, so that an outcome arriving before the caller suspends is kept.
            core.waiterSlots[waiter] = .pending
            return .wait(waiter, started: started)
        }
    }

    /// What a caller gets from the machine: an answer now, or a waiter id to wait on. `started`: the
    /// attempt of the flight this call started, if it started one (a background one, with an answer
    /// now).
    @usableFromInline
    enum Ticket {
        /// The answer, at once.
        case value(Value, started: Machine.AttemptID?)
        /// Wait for this waiter.
        case wait(Machine.WaiterID, started: Machine.AttemptID?)
    }

    /// What marks a task as running `attempt` of this store (see ``OperationContext``): a task that
    /// runs an attempt's work elsewhere (a batch) carries it, so that a call back into this store from
    /// that work is refused as reentrant instead of waiting for itself.
    @usableFromInline
    func mark(_ attempt: Machine.AttemptID) -> OperationContext.Entry {
        OperationContext.Entry(store: ObjectIdentifier(self), attempt: attempt)
    }

    /// Whether a flight is in flight (and so may have waiters): a family never evicts such an entry.
    var isBusy: Bool { core.withLock { $0.machine.flight != nil } }

    /// Retries (see ``FetchStateMachine/retry(waiter:operation:now:callerAttempts:)``) and waits for the
    /// flight; returns at once when there is nothing to retry.
    func retry(_ operation: Operation?) async throws {
        try Task.checkCancellation()
        let attempts = callerAttempts
        let waiter = withCore { core, effects -> Machine.WaiterID? in
            let now = clock.now()
            let waiter = core.makeWaiter()
            let inBackoff = core.machine.flight != nil
            guard
                case .start(let attempt) = core.machine.retry(
                    waiter: waiter, operation: operation, now: now, callerAttempts: attempts)
            else { return nil }
            if inBackoff {
                start(attempt, at: now, in: &core, &effects)  // the flight's pending attempt, now
            } else {
                begin(attempt, reason: .retry, at: now, in: &core, &effects)
            }
            core.waiterSlots[waiter] = .pending
            return waiter
        }
        if let waiter { _ = try await wait(waiter) }
    }

    func invalidate() {
        withCore { core, effects in
            let now = clock.now()
            // Data already expired changes no snapshot, but its freshness must go for every reader
            // (`hasExpired(in:)` with a longer interval): published without notifying subscribers.
            let visible = core.machine.invalidate(now: now)
            publish(core.machine, at: now, notifying: visible)
            record(.invalidated, in: &effects)
        }
    }

    func cancel() {
        withCore { core, effects in
            let ended = core.machine.cancel()
            if case .none = ended { return }
            publish(core.machine, at: clock.now())
            end(ended, resumingWith: .failure(CancellationError()), in: &core, &effects)
        }
    }

    func set(_ value: Value) {
        withCore { core, effects in
            let now = clock.now()
            let ended = core.machine.set(value, now: now, date: clock.date())
            publish(core.machine, at: now)
            end(ended, resumingWith: .success(value), in: &core, &effects)
        }
    }

    /// Restores saved data (see ``FetchStateMachine/restore(_:isEmpty:lastSuccess:now:date:)``).
    func restore(_ value: Value, isEmpty: Bool, lastSuccess: Date?) -> Bool {
        withCore { core, _ in
            let now = clock.now()
            guard core.machine.restore(value, isEmpty: isEmpty, lastSuccess: lastSuccess, now: now, date: clock.date())
            else { return false }
            publish(core.machine, at: now)
            return true
        }
    }

    /// What a warm restart saves (see ``FetchStateMachine/archived``).
    var archived: (value: Value, isEmpty: Bool, lastSuccess: Date?)? {
        core.withLock { $0.machine.archived }
    }

    func reset() {
        withCore { core, effects in
            let (ended, changed) = core.machine.reset()
            guard changed else { return }
            publish(core.machine, at: clock.now())
            end(ended, resumingWith: .failure(CancellationError()), in: &core, &effects)
        }
    }

    // MARK: Events from waiters and from the flight's tasks

    /// A waiter's task was cancelled (called from its cancellation handler, on any thread).
    @inlinable
    func waiterCancelled(_ waiter: Machine.WaiterID) {
        withCore { core, effects in
            // It stops waiting at once (after the lock), whatever the machine does with its flight.
            effects.cancelledWaiter = WaiterSlot.take(
                waiter, settlingWith: WaiterOutcome.cancelled, in: &core.waiterSlots)
            switch core.machine.waiterCancelled(waiter) {
            case .none, .left:
                break  // the waiter is resumed with `CancellationError` above, the flight goes on
            case .leftAndEndedFlight:
                flightLostItsWaiters(in: &core, &effects)
            }
        }
    }

    /// The last waiter of a flight left (by cancellation): the flight ends.
    @usableFromInline
    func flightLostItsWaiters(in core: inout Core, _ effects: inout Effects) {
        endFlight(reporting: .cancelled, in: &core, &effects)
        publish(core.machine, at: clock.now())
    }

    /// An attempt's operation returned or threw.
    private func attemptFinished(
        _ flight: Machine.FlightID, _ attempt: Machine.AttemptID, _ outcome: Machine.Outcome
    ) {
        withCore { core, effects in
            let now = clock.now()
            let action = core.machine.attemptFinished(
                flight, attempt: attempt, outcome: outcome, now: now, date: clock.date())
            if case .drop = action { return }
            core.attemptTask = nil  // it is ending by itself
            perform(action, at: now, in: &core, &effects)
        }
    }

    /// An attempt's timeout fired: the attempt is abandoned (cancelled, its late result dropped).
    private func attemptTimedOut(_ flight: Machine.FlightID, _ attempt: Machine.AttemptID) {
        withCore { core, effects in
            let now = clock.now()
            let action = core.machine.attemptTimedOut(flight, attempt: attempt, now: now)
            if case .drop = action { return }
            effects.cancel(core.attemptTask)
            core.attemptTask = nil
            core.timerTask = nil  // it is ending by itself
            perform(action, at: now, in: &core, &effects)
        }
    }

    /// A backoff ended, or its sleep threw `error`.
    private func backoffEnded(_ flight: Machine.FlightID, _ attempt: Machine.AttemptID, error: (any Error)?) {
        withCore { core, effects in
            let now = clock.now()
            let action = core.machine.backoffEnded(flight, attempt: attempt, error: error, now: now)
            if case .drop = action { return }
            core.timerTask = nil  // it is ending by itself
            perform(action, at: now, in: &core, &effects)
        }
    }

    // MARK: Performing actions (under the lock; effects after it)

    private func perform(
        _ action: Machine.FlightAction, at now: Duration, in core: inout Core, _ effects: inout Effects
    ) {
        switch action {
        case .drop:
            break
        case .retry(let flight, let attempt, let at):
            if events != nil, let error = core.machine.lastError {
                record(.attemptFailed(error: error, attempt: core.attempts, retryIn: at - now), in: &effects)
            }
            effects.cancel(core.timerTask)
            core.timerTask = schedule(at: at) { store, error in store.backoffEnded(flight, attempt, error: error) }
            publish(core.machine, at: now)
        case .start(let attempt):
            start(attempt, at: now, in: &core, &effects)
        case .settle(let ids, let result):
            let (duration, attempts) = (now - core.flightStartedAt, core.attempts)
            endFlight(
                reporting: {
                    switch result {
                    case .success: return .succeeded(duration: duration, attempts: attempts)
                    case .failure(is CancellationError): return .cancelled
                    case .failure(let error): return .failed(error: error, duration: duration, attempts: attempts)
                    }
                }(), in: &core, &effects)
            publish(core.machine, at: now)
            resume(ids, with: result, in: &core, &effects)
        }
    }

    /// Ends a flight that an event (`set`, `cancel`, `reset`) ended — its outcome is `cancelled`: its
    /// result will never land — and resumes its waiters with `result`, after publishing (so that a
    /// resumed waiter sees the new snapshot).
    private func end(
        _ ended: Machine.EndedFlight, resumingWith result: Result<Value, any Error>, in core: inout Core,
        _ effects: inout Effects
    ) {
        guard case .end(let ids) = ended else { return }
        endFlight(reporting: .cancelled, in: &core, &effects)
        resume(ids, with: result, in: &core, &effects)
    }

    /// Takes waiters `ids` out of the table, to be resumed with `result` once the lock is released:
    /// one shared ``WaiterResult``, in arrival order (ids grow; see ``Effects/perform()``). Callers
    /// that are children of one task group then finish in the order they were added, which the
    /// runtime's group handles in O(1) each (in hash order, its child list makes them quadratic).
    private func resume(
        _ ids: Set<Machine.WaiterID>, with result: Result<Value, any Error>, in core: inout Core,
        _ effects: inout Effects
    ) {
        guard !ids.isEmpty else { return }
        let outcome = WaiterResult(result)
        effects.resumed = (WaiterSlot.take(ids, settlingWith: outcome, in: &core.waiterSlots), outcome)
    }

    /// Reports the outcome of the flight that ends (for the observer), and cancels (after the lock)
    /// its attempt — its operation — and its timer. Every end of a flight goes through here, whatever
    /// ended it, so every `started` is followed by exactly one outcome.
    @usableFromInline
    func endFlight(
        reporting outcome: @autoclosure () -> AsyncStateEvent.Kind, in core: inout Core, _ effects: inout Effects
    ) {
        record(outcome(), in: &effects)
        effects.cancel(core.attemptTask)
        effects.cancel(core.timerTask)
        core.attemptTask = nil
        core.timerTask = nil
    }

    private func publish(_ machine: Machine, at now: Duration, notifying: Bool = true) {
        cell.publish(machine.snapshot(at: now), freshSince: machine.freshSince, notifying: notifying)
    }

    /// Starts `attempt`'s task (and its timeout's timer) and publishes.
    /// Starts the first attempt of a new flight, started for `reason`.
    @usableFromInline
    func begin(
        _ attempt: Machine.Attempt, reason: AsyncStateEvent.Reason, at now: Duration, in core: inout Core,
        _ effects: inout Effects
    ) {
        core.flightStartedAt = now
        core.attempts = 0
        record(.started(reason), in: &effects)
        start(attempt, at: now, in: &core, &effects)
    }

    private func start(_ attempt: Machine.Attempt, at now: Duration, in core: inout Core, _ effects: inout Effects) {
        core.attempts += 1
        effects.cancel(core.timerTask)
        core.attemptTask = launch(attempt)
        let (flight, id) = (attempt.flight, attempt.id)
        core.timerTask = attempt.timeoutAt.map { deadline in
            // A timer whose sleep throws without being cancelled cannot keep its promise to end the
            // wait at the deadline, so it ends it now.
            schedule(at: deadline) { store, _ in store.attemptTimedOut(flight, id) }
        }
        publish(core.machine, at: now)
    }

    /// Suspends the caller until its waiter is resumed. A cancelled caller leaves at once and tells the
    /// machine, which ends the flight if it was the last waiter.
    /// Always inlined, so that its frame is part of its caller's: a waiting task's frames then fit in
    /// the memory the runtime gives a new task (984 bytes), and a joiner mallocs no second slab.
    @inlinable @inline(__always)
    func wait(_ waiter: Machine.WaiterID) async throws -> Value {
        let outcome = await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<WaiterOutcome, Never>) in
                let early = core.withLock { core -> WaiterOutcome? in
                    switch core.waiterSlots[waiter] {
                    case .resolved(let outcome):
                        core.waiterSlots[waiter] = nil
                        return outcome
                    case .pending:
                        break
                    case .waiting, nil:
                        assertionFailure("waiter \(waiter) waited for twice, or without a ticket")
                    }
                    core.waiterSlots[waiter] = .waiting(continuation)
                    return nil
                }
                if let early { continuation.resume(returning: early) }
            }
        } onCancel: {
            waiterCancelled(waiter)
        }
        return try outcome.result(as: Value.self)
    }

    /// The number of waiters whose slots are still in the table (for tests).
    var waiterCount: Int { core.withLock { $0.waiterSlots.count } }

    /// The attempt's task: runs the operation, marked as this attempt for the reentrancy check, and
    /// reports how it ended — always, whatever it threw, so the machine sees every end.
    private func launch(_ attempt: Machine.Attempt) -> Task<Void, Never> {
        let marked = OperationContext.running + [.init(store: ObjectIdentifier(self), attempt: attempt.id)]
        let (operation, flight, id) = (attempt.operation, attempt.flight, attempt.id)
        return Task(executorPreference: clock.executor) { [self] in
            let outcome: Machine.Outcome
            do {
                outcome = .success(try await OperationContext.$running.withValue(marked) { try await operation() })
            } catch is CancellationError {
                outcome = .cancelled
            } catch {
                outcome = .failure(error)
            }
            attemptFinished(flight, id, outcome)
        }
    }

    /// A timer: sleeps until `deadline` on the clock, then runs `fired` with the error the sleep threw,
    /// if any. A cancelled timer does nothing (whoever cancelled it has moved on).
    private func schedule(
        at deadline: Duration, _ fired: @escaping @Sendable (AsyncStateStore<Value>, (any Error)?) -> Void
    ) -> Task<Void, Never> {
        Task(executorPreference: clock.executor) { [self, clock] in
            let failure: (any Error)?
            do {
                try await clock.sleep(deadline)
                failure = nil
            } catch {
                failure = error
            }
            if Task.isCancelled { return }
            fired(self, failure)
        }
    }
}
