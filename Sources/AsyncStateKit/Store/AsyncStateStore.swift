public import Foundation

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
/// table of waiters is under this store's lock, beside the machine.
///
/// Lifetime: the store keeps an operation only inside the machine's flight, and its tasks (as the
/// flight's handles) only while that flight runs. Each task holds the store until it ends (so a state dropped mid-flight settles
/// and is then freed); nothing outlives the flight except an attempt abandoned by its timeout, which
/// holds the store until its operation returns.
@usableFromInline
final class AsyncStateStore<Value: Sendable>: Sendable {
    @usableFromInline typealias Operation = @Sendable () async throws -> Value
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

    /// A family's store for an entry made live: `spare` made anew if there is one (see
    /// ``renew(seed:observation:)``), else a new store. Its data is `data`, at rest (see
    /// ``FetchStateMachine/restingData``: a compact entry's), if given; else the initial data. A spare
    /// must be a store that nobody else references, on the same clock and configuration, observed if
    /// `observation` is not `nil`, and emptied by ``park()`` (a family keeps the stores of its
    /// entries that became compact: see ``FamilyShard/spareStores``).
    @inlinable static func make(
        restoring data: StateData<Value>?, initialValue: Value, configuration: StoreConfiguration<Value>,
        clock: StoreClock, seed: UInt64, observation: Observation?, reusing spare: AsyncStateStore?
    ) -> AsyncStateStore {
        let store: AsyncStateStore
        if let spare {
            spare.renew(seed: seed, observation: observation)
            store = spare
        } else {
            store = AsyncStateStore(
                Machine(initialValue: initialValue, configuration: configuration, seed: seed), clock: clock,
                observation: observation)
        }
        guard let data else { return store }
        // A machine at rest is its data and nothing else (no flight, no abandoned operation): given
        // a compact entry's data, it is the machine that entry's store had when it rested. What the
        // data and the snapshot replace are a new or parked store's initial ones, which hold no value
        // of the user's (a family's initial value is `nil`), so they may go here, under the shard's
        // lock.
        var effects = Effects()
        store.core.withLock { core in
            core.machine.data = data
            store.publish(core.machine, at: clock.now(), in: &effects)
        }
        return store
    }

    /// What a store held when its family kept it as a spare (``park()``): the last key's data and
    /// published contents, released by whoever holds this once its lock is released.
    @usableFromInline
    struct Leftovers {
        @usableFromInline var data: StateData<Value>
        @usableFromInline var contents: SnapshotCell<Value>.Contents

        @inlinable init(data: StateData<Value>, contents: SnapshotCell<Value>.Contents) {
            (self.data, self.contents) = (data, contents)
        }
    }

    /// Empties this store as its family keeps it as a spare (``FamilyShard/spareStores``): the cell's
    /// contents become initial and the machine's data the initial data, and its event queue forgets
    /// the key and its last fetch, so that a spare keeps no key's value, error, metadata or fetch
    /// alive (a key removed or evicted while its old store waits to be reused is freed with its
    /// entry). Only for a store that nobody else references, at rest. Returns what it held: a value's
    /// deinit is user code, so the caller releases it after its lock.
    @inlinable func park() -> Leftovers {
        events?.park()
        let (data, initialValue) = core.withLock { core in
            var data = StateData(initialValue: core.machine.initialValue)
            swap(&data, &core.machine.data)
            return (data, core.machine.initialValue)
        }
        return Leftovers(data: data, contents: cell.renew(value: initialValue))
    }

    /// Makes this store, emptied by ``park()``, what ``init(_:clock:observation:)`` makes around a
    /// new machine on the same configuration, seeded with `seed`: its events reported as
    /// `observation` (the new key's). Parked, its machine already is such a machine but for the seed
    /// — initial data, no flight, no abandoned operation — and its table of waiters is empty, so only
    /// the seed changes. What the store keeps — its clock, its cell's expiry and hit window, whether
    /// it is observed — is the same for every store of a family. Only for a store that nobody else
    /// references: no task, timer, waiter or reader can reach it, so nothing sees the change. Waiter
    /// ids go on counting, so that an observer never sees two callers of this object with the same
    /// ``AsyncStateEvent/Waiter``.
    @inlinable func renew(seed: UInt64, observation: Observation?) {
        precondition((events == nil) == (observation == nil), "a spare store is observed as its family is")
        if let events, let observation { events.renew(observation) }
        core.withLock { core in
            precondition(
                core.waiterSlots.isEmpty && !core.machine.isFlying && core.machine.abandoned.isEmpty
                    && !core.machine.data.differsFromInitial,
                "a spare store that was not parked")
            core.machine.seeds = SplitMix64(seed: seed)
        }
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

    /// The store's data if its family entry may rest (become compact), else `nil`: the one place that
    /// decides it. It may when no caller uses the entry (`users`, the family's count of callers
    /// between a pin and its unpin), nobody listens (no `updates` subscriber), and the machine may
    /// (``FetchStateMachine/restingData``: no flight, no abandoned operation, data at rest).
    @inlinable func restingData(users: Int32) -> StateData<Value>? {
        guard users == 0 else { return nil }
        return core.withLock { core in cell.subscriberCount == 0 ? core.machine.restingData : nil }
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

    /// Records an event for the observer, if there is one (under the lock; delivered after it):
    /// about the state's current fetch if `aboutFetch`, and about `waiter` if any.
    @inlinable
    func record(
        _ kind: @autoclosure () -> AsyncStateEvent.Kind, aboutFetch: Bool = false, waiter: Machine.WaiterID? = nil,
        in effects: inout Effects
    ) {
        guard let events else { return }
        // Named and keyed when delivered (``Observation/deliver(recorded:)``).
        effects.events.append(
            AsyncStateEvent(
                name: "", kind: kind(), fetch: aboutFetch ? events.currentFetch : nil,
                waiter: waiter.map { AsyncStateEvent.Waiter(state: ObjectIdentifier(self), number: $0) },
                callerContext: effects.callerContext, invalidation: effects.invalidation))
    }

    /// Records that waiters `ids` stop waiting, answered with `error` (`nil`: a value), in the order
    /// they arrived: those still waiting, each once (see ``AsyncStateEvent/Kind/waitEnded(error:)``).
    @inlinable
    func recordWaitsEnded(
        _ ids: some Sequence<Machine.WaiterID>, error: @autoclosure () -> (any Error)?, in core: Core,
        _ effects: inout Effects
    ) {
        // `error` only with an observer: an error made into `any Error` is boxed, an allocation.
        guard events != nil else { return }
        let error = error()
        for id in ids.sorted() {
            switch core.waiterSlots[id] {
            case .pending, .waiting: record(.waitEnded(error: error), aboutFetch: true, waiter: id, in: &effects)
            case .resolved, nil: break
            }
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

    /// A hit, for the observer (called by ``hit(_:)``, outside any lock). Never inlined: the event
    /// it builds would otherwise be part of every caller's async frame, with or without an observer.
    @inlinable @inline(never)
    func observeHit() {
        observation?.deliver(.hit)
    }

    /// The attempts the current task runs, for the machine's reentrancy check: any store's, since
    /// ids are unique in the process and only this store's can be its flight's.
    @inlinable var callerAttempts: [Machine.AttemptID] { OperationContext.runningLocal.get() }

    // MARK: Events from callers

    /// Gets the value as `request` says: an answer at once, or the outcome of the flight in flight or
    /// of a new one running `operation` with `policy`.
    @inlinable
    func fetch(_ request: FetchRequest, policy: RetryPolicy? = nil, _ operation: @escaping Operation)
        async throws -> Value
    {
        try Task.checkCancellation()
        switch try enter(request, policy: policy, operation) {
        case .value(let value, _): return value
        case .wait(let waiter, _): return try await wait(waiter)
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
    func enter(_ request: FetchRequest, policy: RetryPolicy? = nil, _ operation: @escaping Operation) throws -> Ticket {
        let attempts = callerAttempts
        return try withCore(byCaller: true) { core, effects -> Ticket in
            let now = clock.now()
            let waiter = core.makeWaiter()
            var started: Machine.AttemptID?
            switch core.machine.fetch(
                waiter: waiter, request: request, now: now, policy: policy, operation: operation,
                callerAttempts: attempts)
            {
            case .returnValue(let value, let stale):
                record(stale ? .servedStale : .hit, in: &effects)
                return .value(value, started: nil)
            case .returnValueAndStart(let value, let attempt, let stale):
                record(stale ? .servedStale : .hit, in: &effects)
                start(attempt, waiter: nil, at: now, in: &core, &effects)
                return .value(value, started: attempt.id)
            case .fail(let error):
                throw error
            case .failSafe(let value, let error):
                record(.failSafe(error: error), in: &effects)
                return .value(value, started: nil)
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

    /// The fetch the store started last, for the observer (`nil` without one): read just after a
    /// call started it, it is that call's (a flight that waits for a batch does not end before the
    /// batch answers, or is cancelled).
    @inlinable var observedFetch: AsyncStateFetch? {
        guard let events else { return nil }
        return core.withLock { _ in events.currentFetch }
    }

    /// Whether a flight is in flight (and so may have waiters): a family never evicts such an entry.
    @inlinable var isBusy: Bool { core.withLock { $0.machine.isFlying } }

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
        if let waiter { _ = try await wait(waiter) }
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
            publish(core.machine, at: now, notifying: visible, in: &effects)
            record(.invalidated, in: &effects)
        }
    }

    /// Reports what the second level did in the fetch in flight (see ``SecondLevelLoader``).
    func reportSecondLevel(_ event: AsyncStateSecondLevelEvent) {
        withCore { _, effects in record(.secondLevel(event), aboutFetch: true, in: &effects) }
    }

    @inlinable func cancel() {
        withCore(byCaller: true) { core, effects in
            let ended = core.machine.cancel()
            if case .none = ended { return }
            publish(core.machine, at: clock.now(), in: &effects)
            end(ended, resumingWith: .failure(CancellationError()), in: &core, &effects)
        }
    }

    @inlinable func set(_ value: Value) {
        withCore(byCaller: true) { core, effects in
            let now = clock.now()
            let ended = core.machine.set(value, now: now, date: clock.date())
            publish(core.machine, at: now, in: &effects)
            end(ended, resumingWith: .success(value), in: &core, &effects)
        }
    }

    /// Restores saved data (see ``FetchStateMachine/restore(_:isEmpty:lastSuccess:now:date:)``).
    @inlinable func restore(_ value: Value, isEmpty: Bool, lastSuccess: Date?) -> Bool {
        withCore { core, effects in
            let now = clock.now()
            guard core.machine.restore(value, isEmpty: isEmpty, lastSuccess: lastSuccess, now: now, date: clock.date())
            else { return false }
            publish(core.machine, at: now, in: &effects)
            return true
        }
    }

    /// What a warm restart saves (see ``StateData/archived``).
    @inlinable var archived: (value: Value, isEmpty: Bool, lastSuccess: Date?)? {
        core.withLock { $0.machine.data.archived }
    }

    @inlinable func reset() {
        withCore(byCaller: true) { core, effects in
            let (ended, changed) = core.machine.reset()
            guard changed else { return }
            publish(core.machine, at: clock.now(), in: &effects)
            end(ended, resumingWith: .failure(CancellationError()), in: &core, &effects)
        }
    }

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
        publish(core.machine, at: clock.now(), in: &effects)
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
            if events != nil {
                for id in ids.sorted() { record(.softTimeout, aboutFetch: true, waiter: id, in: &effects) }
            }
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
            publish(core.machine, at: now, in: &effects)
        case .start(let attempt, let cancel):
            effects.cancel(cancel)
            start(attempt, waiter: nil, at: now, in: &core, &effects)
        case .settle(let ids, let result, let report, let cancel, let answer):
            effects.cancel(cancel)
            switch result {
            case .success:
                record(
                    .succeeded(duration: report.duration, attempts: report.attempts), aboutFetch: true, in: &effects)
                if case .notModified = answer { record(.notModified, aboutFetch: true, in: &effects) }
            case .failure(is CancellationError):
                record(.cancelled, aboutFetch: true, in: &effects)
            case .failure(let error):
                record(
                    .failed(error: error, duration: report.duration, attempts: report.attempts), aboutFetch: true,
                    in: &effects)
                // Each waiter answered by fail-safe is reported, as each caller that joins is.
                if case .failSafe = answer, events != nil {
                    for id in ids.sorted() {
                        record(.failSafe(error: error), aboutFetch: true, waiter: id, in: &effects)
                    }
                }
            }
            publish(core.machine, at: now, in: &effects)
            if case .failSafe(let value) = answer {
                resume(ids, with: .success(value), in: &core, &effects)
            } else {
                resume(ids, with: result, in: &core, &effects)
            }
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

    /// Publishes `machine`'s snapshot at `now` to the cell (see ``SnapshotCell/publish(_:freshSince:receivedAt:flightStart:notifying:)``).
    /// The snapshot it replaces goes into `effects`, to be released after the store's lock: it may
    /// hold the last reference to a value or an error, and their deinits are user code, which may
    /// call the state — a family's `invalidate`, `set` or `remove` of the same key takes this lock.
    @inlinable func publish(_ machine: Machine, at now: Duration, notifying: Bool = true, in effects: inout Effects) {
        effects.replaced.append(
            cell.publish(
                machine.snapshot(at: now), freshSince: machine.data.freshSince, receivedAt: machine.data.receivedAt,
                flightStart: machine.flightStart,
                notifying: notifying))
    }

    /// Starts `attempt`'s task and its timeout's timer, gives them to the flight, and publishes. The
    /// first attempt of a flight is reported as its start (`waiter`: the caller that started it and
    /// waits for it, if any).
    @inlinable
    func start(
        _ attempt: Machine.Attempt, waiter: Machine.WaiterID?, at now: Duration, in core: inout Core,
        _ effects: inout Effects
    ) {
        if let events {
            if let reason = attempt.starts {
                events.currentFetch = AsyncStateFetch(reason: reason)
                record(.started(reason), aboutFetch: true, waiter: waiter, in: &effects)
            } else if let waiter {
                // A retry that starts a pending attempt of the fetch in flight now: its caller joins it.
                record(.joined, aboutFetch: true, waiter: waiter, in: &effects)
            }
        }
        let (flight, id) = (attempt.flight, attempt.id)
        if let softDeadline = attempt.softTimeoutAt {
            core.machine.attach(softTimer: schedule(at: softDeadline) { store, _ in store.softTimeoutPassed(flight) })
        }
        if let deadline = attempt.timeoutAt {
            // With a timeout the attempt starts on a thread of its own, as any task does (it is
            // enqueued here and runs once a thread takes it, before its timer), so that the timeout
            // bounds the wait even for an operation that blocks its thread and never suspends.
            let (marked, operation) = (marks(attempt), attempt.operation)
            let task = Task(executorPreference: clock.executor) { [self] in
                await run(operation, marked: marked, flight: flight, id: id)
            }
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
        publish(core.machine, at: now, in: &effects)
    }
}

extension Result {
    /// The error, if it is a failure.
    @inlinable var error: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}
