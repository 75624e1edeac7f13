public import Foundation

/// The shell of an ``AsyncState``: it feeds events to a ``FetchStateMachine`` under its lock and
/// performs the actions — starts and cancels the attempts' tasks, sleeps out backoffs and timeouts,
/// resumes waiters, records the observer's events, publishes snapshots. It decides nothing itself,
/// and touches the machine only through its events and its documented accessors.
///
/// The shell is split by concern: this file holds the store, its event loop (``withCore(byCaller:_:)``)
/// and the events callers bring; `+Flight` the events its tasks and timers bring and how actions are
/// performed; `+Tasks` how callers wait and the tasks it runs; `+Events` what the observer hears;
/// `+Spare` how a family keeps a store for its next entry.
///
/// No actor and no task per event (the shape of swift-async-algorithms' channel): every event — a
/// caller's request, a waiter's cancellation, an attempt's end, a timer — runs the machine under one
/// lock on the thread that brings it, and what must not happen under a lock (cancelling a task, which
/// runs its cancellation handlers; resuming a waiter) happens right after the lock is released. So a
/// cancelled waiter leaves in O(1) without a hop, and under a `VirtualClock` every event runs inside a
/// job the clock already counts (the store's own tasks prefer the clock's executor).
///
/// Lock order: this store's lock, then its ``SnapshotCell``'s (to publish), never the reverse. The
/// table of waiters is under this store's lock, beside the machine.
///
/// Lifetime: the store keeps an operation only inside the machine's flight, and its tasks (as the
/// flight's handles) only while that flight runs. Each task holds the store until it ends (so a state dropped mid-flight settles
/// and is then freed); nothing outlives the flight except an attempt abandoned by its timeout, which
/// holds the store until its operation returns.
@usableFromInline
final class AsyncStateStore<Value: Sendable>: Sendable {
    @usableFromInline typealias Operation = FetchOperation<Value>
    @usableFromInline typealias Machine = FetchStateMachine<Value, Operation, Task<Void, Never>>

    /// What synchronous readers and `updates` see.
    @usableFromInline let cell: SnapshotCell<Value>
    /// The injected clock.
    @usableFromInline let clock: StoreClock
    /// The observer and what the state reports as; `nil` without an observer. Kept in ``events``
    /// only: a state without an observer pays one reference for the feature, not the observation.
    @inlinable var observation: Observation? { events?.observation }
    /// Whether there is an observer: all the hit path reads without one.
    @usableFromInline let isObserved: Bool
    /// Delivers the observer's events in order (`nil` without an observer).
    @usableFromInline let events: EventQueue?

    /// The machine and the table of waiters, behind the store's lock.
    @usableFromInline
    struct Core {
        @usableFromInline var machine: Machine
        /// The last waiter id handed out.
        @usableFromInline var lastWaiter: UInt64 = 0
        /// The callers waiting for a flight, by waiter id (see ``WaiterSlot``). Beside the machine, not
        /// in its flight: an outcome may reach a waiter before it registers, and is kept here for it
        /// after the flight has ended.
        @usableFromInline var waiterSlots = WaiterSlots()

        @inlinable
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
        /// Tasks to cancel (their cancellation handlers run user code). An event ends at most a
        /// flight's attempt, its timer and its soft timeout's timer, and the timer that replaces one.
        @usableFromInline var cancelled:
            (Task<Void, Never>?, Task<Void, Never>?, Task<Void, Never>?, Task<Void, Never>?) = (nil, nil, nil, nil)
        /// Waiters to resume (taken out of the table under the lock, by id), and with what.
        @usableFromInline var resumed: (waiters: ResumedWaiters, outcome: WaiterOutcome)?
        /// A waiter whose task was cancelled, to resume with ``WaiterOutcome/cancelled``.
        @usableFromInline var cancelledWaiter: UnsafeContinuation<WaiterOutcome, Never>?
        /// Events for the observer, in order (only with an observer).
        @usableFromInline var events: [AsyncStateEvent] = []
        /// What the observer's ``AsyncStateObserver/callerContext()`` returned for the caller whose
        /// call this is (`nil` for an event no caller brought, and without an observer).
        @usableFromInline var callerContext: (any Sendable)?
        /// The invalidation message this call applies (see ``InvalidationCause``).
        @usableFromInline var invalidation: AsyncStateInvalidation?
        /// The attempt to launch once the lock is released (an event starts at most one).
        @usableFromInline var launch: Machine.Attempt?
        /// The snapshots this event's publications replaced, released with the effects, after the
        /// lock: one may hold the last reference to a value or an error, whose deinit is user code
        /// that may call the state (see ``publish(_:at:notifying:in:)``).
        @usableFromInline var replaced = InlineOneArray<AsyncSnapshot<Value>>()

        @inlinable init() {}

        /// Cancels the tasks of `handles` once the lock is released.
        @inlinable
        mutating func cancel(_ handles: Machine.Handles) {
            cancel(handles.attempt)
            cancel(handles.timer)
            cancel(handles.softTimer)
        }

        /// Cancels `task`, if any, once the lock is released.
        @inlinable
        mutating func cancel(_ task: Task<Void, Never>?) {
            guard let task else { return }
            if cancelled.0 == nil {
                cancelled.0 = task
            } else if cancelled.1 == nil {
                cancelled.1 = task
            } else if cancelled.2 == nil {
                cancelled.2 = task
            } else {
                precondition(cancelled.3 == nil, "an event ended more than four tasks")
                cancelled.3 = task
            }
        }

        @inlinable
        func perform() {
            cancelled.0?.cancel()
            cancelled.1?.cancel()
            cancelled.2?.cancel()
            cancelled.3?.cancel()
            cancelledWaiter?.resume(returning: WaiterOutcome.cancelled)
            if let resumed { resumed.waiters.resume(with: resumed.outcome) }
        }
    }

    @usableFromInline let core: LockedValue<Core>

    /// Creates a store; `seed` seeds the jitter of its retries (random if `nil`).
    @inlinable convenience init(
        initialValue: Value, configuration: StoreConfiguration<Value>, clock: StoreClock, seed: UInt64? = nil,
        observation: Observation? = nil
    ) {
        self.init(
            Machine(
                initialValue: initialValue, configuration: configuration, seed: seed ?? UInt64.random(in: .min ... .max)
            ),
            clock: clock, observation: observation)
    }

    /// Creates a store around `machine` (its cell starts at the machine's initial value).
    @inlinable init(_ machine: Machine, clock: StoreClock, observation: Observation?) {
        isObserved = observation != nil
        events = observation.map(EventQueue.init)
        self.clock = clock
        let configuration = machine.configuration
        cell = SnapshotCell(
            value: machine.initialValue, expiry: configuration.expiry, hitWindow: configuration.hitWindow)
        core = LockedValue(Core(machine: machine))
    }

    /// Runs an event under the lock, then performs what it left to do. `byCaller`: a caller's call
    /// brings it, whose events carry the observer's ``AsyncStateObserver/callerContext()`` (asked
    /// before the lock is taken, only with an observer).
    @inlinable
    func withCore<Result>(byCaller: Bool = false, _ event: (inout Core, inout Effects) throws -> Result) rethrows
        -> Result
    {
        var effects = Effects()
        if byCaller, let observation { effects.callerContext = observation.observer.callerContext() }
        defer {
            // The observer hears of a settle before its waiters resume.
            if !effects.events.isEmpty { events?.drain() }
            effects.perform()
            if let attempt = effects.launch { launchAndAttach(attempt) }
        }
        return try core.withLock { core in
            defer { if !effects.events.isEmpty { events?.enqueue(effects.events) } }
            return try event(&core, &effects)
        }
    }

    // MARK: Hits

    /// The hit path of every read that answers fresh data at once (`value`, `fetch`, `snapshot`, a
    /// paged state's `items`): `read` of the published contents if the data is fresh and within the
    /// hit window, else `nil`; a hit is reported to the observer. One clock read and the cell's lock.
    @inlinable @inline(__always)
    func hit<Result>(_ read: (SnapshotCell<Value>.Contents) -> Result) -> Result? {
        let fresh = cell.read(ifFreshAt: clock.now(), read)
        if isObserved, fresh != nil { observeHit() }
        return fresh
    }

    /// The attempts the current task runs, for the machine's reentrancy check: any store's, since
    /// ids are unique in the process and only this store's can be its flight's.
    @inlinable var callerAttempts: [Machine.AttemptID] { OperationContext.runningLocal.get() }

    // MARK: Events from callers

    /// Gets the value as `request` says: an answer at once, or the outcome of the flight in flight or
    /// of a new one running `operation` with `policy`.
    @inlinable
    func fetch(_ request: FetchRequest, policy: RetryPolicy? = nil, _ operation: Operation)
        async throws -> Value
    {
        try Task.checkCancellation()
        switch try enter(request, policy: policy, operation) {
        case .value(let value, _): return value
        case .wait(let waiter, let started): return try await wait(waiter, started: started != nil)
        }
    }

    /// The synchronous half of ``fetch(_:policy:_:)``: the machine decides, under the lock, whether
    /// the caller gets an answer now or waits for a flight (which this call may have started). A
    /// ticket to wait on must be waited on (``wait(_:)``), or the flight keeps a waiter that never
    /// leaves, and the table its slot.
    ///
    /// Specialized in the caller's module but never inlined: inlined, its locals (the machine's
    /// action) become part of the waiting caller's async frame, which then outgrows the memory the
    /// runtime gives a new task, and every joiner of a cold stampede mallocs a second slab.
    @inlinable @inline(never)
    func enter(_ request: FetchRequest, policy: RetryPolicy? = nil, _ operation: Operation) throws -> Ticket {
        let attempts = callerAttempts
        return try withCore(byCaller: true) { core, effects -> Ticket in
            let now = clock.now()
            let waiter = core.makeWaiter()
            var started: Machine.AttemptID?
            switch core.machine.fetch(
                waiter: waiter, request: request, now: now, policy: policy, operation: operation,
                callerAttempts: attempts)
            {
            case .answer(let value, let answer, let refresh):
                record(answered: answer, in: &effects)
                guard let refresh else { return .value(value, started: nil) }
                start(refresh, waiter: nil, at: now, in: &core, &effects)
                return .value(value, started: refresh.id)
            case .fail(let error):
                throw error
            case .join:
                record(.joined, aboutFetch: true, waiter: waiter, in: &effects)
            case .start(let attempt, let replaced):
                // The flight it replaced ended here: its outcome comes before the new one's start.
                if let replaced { ended(replaced, in: &effects) }
                start(attempt, waiter: waiter, at: now, in: &core, &effects)
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

    /// Whether a flight is in flight (``FetchStateMachine/hasFlight``): a family never evicts such an
    /// entry, and its result may carry what a tag names.
    @inlinable var hasFlight: Bool { core.withLock { $0.machine.hasFlight } }

    /// Retries (see ``FetchStateMachine/retry(waiter:operation:now:callerAttempts:)``) and waits for the
    /// flight; returns at once when there is nothing to retry.
    @inlinable func retry(_ operation: Operation?) async throws {
        try Task.checkCancellation()
        let attempts = callerAttempts
        let waiter = withCore(byCaller: true) { core, effects -> Machine.WaiterID? in
            let now = clock.now()
            let waiter = core.makeWaiter()
            guard
                case .start(let attempt, let cancel) = core.machine.retry(
                    waiter: waiter, operation: operation, now: now, callerAttempts: attempts)
            else { return nil }
            effects.cancel(cancel)
            start(attempt, waiter: waiter, at: now, in: &core, &effects)
            core.waiterSlots[waiter] = .pending
            return waiter
        }
        if let waiter { _ = try await wait(waiter, started: true) }
    }

    /// Invalidates the data; with a second-level `version`, only data older than that version (see
    /// ``FetchStateMachine/invalidate(now:version:)``).
    @inlinable func invalidate(version: UInt64? = nil) {
        withCore(byCaller: true) { core, effects in
            let now = clock.now()
            guard let visible = core.machine.invalidate(now: now, version: version) else { return }
            if events != nil { effects.invalidation = InvalidationCause.current }
            // Data already expired changes no snapshot, but its freshness must go for every reader
            // (`hasExpired(in:)` with a longer interval): published without notifying subscribers.
            publish(core.machine.publication(at: now), notifying: visible, in: &effects)
            record(.invalidated, in: &effects)
        }
    }

    @inlinable func cancel() {
        withCore(byCaller: true) { core, effects in
            let ended = core.machine.cancel()
            if case .none = ended { return }
            publish(core.machine.publication(at: clock.now()), in: &effects)
            end(ended, resumingWith: .failure(CancellationError()), in: &core, &effects)
        }
    }

    @inlinable func set(_ value: Value, version: UInt64) {
        withCore(byCaller: true) { core, effects in
            let now = clock.now()
            let ended = core.machine.set(value, now: now, date: clock.date(), version: version)
            publish(core.machine.publication(at: now), in: &effects)
            end(ended, resumingWith: .success(value), in: &core, &effects)
        }
    }

    /// Restores saved data (see ``FetchStateMachine/restore(_:isEmpty:lastSuccess:now:date:)``).
    @inlinable func restore(_ value: Value, isEmpty: Bool, lastSuccess: Date?) -> Bool {
        withCore { core, effects in
            let now = clock.now()
            guard core.machine.restore(value, isEmpty: isEmpty, lastSuccess: lastSuccess, now: now, date: clock.date())
            else { return false }
            publish(core.machine.publication(at: now), in: &effects)
            return true
        }
    }

    /// What a warm restart saves (see ``StateData/archived``).
    @inlinable var archived: (value: Value, isEmpty: Bool, lastSuccess: Date?)? {
        core.withLock { $0.machine.archived }
    }

    @inlinable func reset() {
        withCore(byCaller: true) { core, effects in
            let (ended, changed) = core.machine.reset()
            guard changed else { return }
            publish(core.machine.publication(at: clock.now()), in: &effects)
            end(ended, resumingWith: .failure(CancellationError()), in: &core, &effects)
        }
    }
}
