import Foundation

/// The stores whose operations the current task is running (directly or through nested states), so
/// a call that would wait for its own result is refused instead of hanging.
enum OperationContext {
    @TaskLocal static var running: [ObjectIdentifier] = []
}

/// The actor shell of an ``AsyncState``: it feeds events to a ``FetchStateMachine`` and performs the
/// actions — starts and cancels the operation's task, resumes waiters, publishes snapshots.
///
/// Callers enter it under the clock's executor preference (see ``enter(_:)``), and its operation tasks
/// prefer that executor too, so under a `VirtualClock` all of its work is counted by the clock's
/// settling and never contends for the actor with work the clock cannot see.
actor AsyncStateStore<Value: Sendable> {
    typealias Operation = @Sendable () async throws -> Value

    /// What synchronous readers and `updates` see.
    nonisolated let cell: SnapshotCell<Value>
    /// The injected clock.
    nonisolated let clock: StoreClock

    private var machine: FetchStateMachine<Value>
    private var waiters: [FetchStateMachine<Value>.WaiterID: CheckedContinuation<Value, any Error>] = [:]
    private var operations: [FetchStateMachine<Value>.FlightID: Task<Void, Never>] = [:]
    private var lastOperation: Operation?
    private var nextWaiter: UInt64 = 0

    init(
        initialValue: Value, expiry: Duration, clock: StoreClock,
        isEmpty: @escaping @Sendable (Value) -> Bool
    ) {
        self.clock = clock
        self.cell = SnapshotCell(value: initialValue, expiry: expiry)
        self.machine = FetchStateMachine(initialValue: initialValue, expiry: expiry, isEmpty: isEmpty)
    }

    // MARK: Entering

    /// Runs `body` on this store under the clock's executor preference (none for real clocks).
    nonisolated func enter<Result: Sendable>(
        _ body: @Sendable (isolated AsyncStateStore<Value>) async throws -> Result
    ) async throws -> Result {
        guard let executor = clock.executor else { return try await body(self) }
        return try await withTaskExecutorPreference(executor) { try await body(self) }
    }

    /// Whether the current task is running an operation of this store.
    nonisolated var isReentrant: Bool {
        OperationContext.running.contains(ObjectIdentifier(self))
    }

    // MARK: Events from callers

    /// Gets the value: fresh data at once, else the outcome of the flight in flight or of a new one.
    func fetch(_ operation: @escaping Operation, mode: FetchStateMachine<Value>.FetchMode) async throws -> Value {
        let now = clock.now()
        if mode == .ifExpired, machine.isFresh(at: now) { return machine.value }
        if isReentrant { throw AsyncStateError.reentrantCall }
        try Task.checkCancellation()
        let waiter = makeWaiter()
        switch machine.fetch(waiter: waiter, mode: mode, now: now) {
        case .returnFresh(let value):
            return value
        case .join:
            break
        case .start(let id, let cancelling):
            lastOperation = operation
            if let cancelling { operations.removeValue(forKey: cancelling)?.cancel() }
            start(id, operation)
            publish(at: now)
        }
        return try await wait(waiter)
    }

    /// Re-runs the last operation if the phase is failure or empty; otherwise returns at once.
    func retry() async throws {
        if isReentrant { throw AsyncStateError.reentrantCall }
        try Task.checkCancellation()
        guard let operation = lastOperation else { return }
        let waiter = makeWaiter()
        guard case .start(let id) = machine.retry(waiter: waiter) else { return }
        start(id, operation)
        publish(at: clock.now())
        _ = try await wait(waiter)
    }

    func invalidate() {
        machine.invalidate()
        publish(at: clock.now())
    }

    func cancel() {
        let ended = machine.cancel()
        if case .none = ended { return }
        publish(at: clock.now())
        perform(ended, resumingWith: .failure(CancellationError()))
    }

    func set(_ value: Value) {
        let now = clock.now()
        let ended = machine.set(value, now: now, date: clock.date())
        publish(at: now)
        perform(ended, resumingWith: .success(value))
    }

    func reset() {
        let ended = machine.reset()
        lastOperation = nil
        publish(at: clock.now())
        perform(ended, resumingWith: .failure(CancellationError()))
    }

    // MARK: Events from tasks

    /// The operation of flight `id` ended.
    private func operationFinished(_ id: FetchStateMachine<Value>.FlightID, _ outcome: FetchStateMachine<Value>.Outcome)
    {
        operations[id] = nil
        let now = clock.now()
        switch machine.operationFinished(id, outcome: outcome, now: now, date: clock.date()) {
        case .drop:
            break
        case .settle(let ids, let result):
            publish(at: now)
            for id in ids { resume(id, with: result) }
        }
    }

    /// A waiter's task was cancelled.
    private func waiterCancelled(_ waiter: FetchStateMachine<Value>.WaiterID) {
        switch machine.waiterCancelled(waiter) {
        case .none:
            break
        case .resume(let id):
            resume(id, with: .failure(CancellationError()))
        case .resumeAndCancelFlight(let id, let flight):
            operations.removeValue(forKey: flight)?.cancel()
            publish(at: clock.now())
            resume(id, with: .failure(CancellationError()))
        }
    }

    // MARK: Performing actions

    private func makeWaiter() -> FetchStateMachine<Value>.WaiterID {
        nextWaiter &+= 1
        return nextWaiter
    }

    /// Suspends the caller until its waiter is resumed; a cancelled caller leaves at once.
    private func wait(_ waiter: FetchStateMachine<Value>.WaiterID) async throws -> Value {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                waiters[waiter] = continuation
            }
        } onCancel: {
            // Runs on the cancelling thread; the store handles it on the actor, after the
            // continuation above is registered (the actor is held until this task suspends).
            let executor = clock.executor
            Task(executorPreference: executor) { await self.waiterCancelled(waiter) }
        }
    }

    private func resume(_ waiter: FetchStateMachine<Value>.WaiterID, with result: Result<Value, any Error>) {
        waiters.removeValue(forKey: waiter)?.resume(with: result)
    }

    /// Cancels the operation of a flight an event ended and resumes its waiters with `result`.
    /// Call after publishing, so that a resumed waiter sees the new snapshot.
    private func perform(_ ended: FetchStateMachine<Value>.EndedFlight, resumingWith result: Result<Value, any Error>) {
        guard case .cancel(let id, let ids) = ended else { return }
        operations.removeValue(forKey: id)?.cancel()
        for waiter in ids { resume(waiter, with: result) }
    }

    private func publish(at now: Duration) {
        cell.publish(machine.snapshot(at: now), freshSince: machine.freshSince)
    }

    /// Starts the operation's task for flight `id`. The task holds the store until it ends, so a
    /// state dropped mid-flight is freed once its operation finishes.
    private func start(_ id: FetchStateMachine<Value>.FlightID, _ operation: @escaping Operation) {
        operations[id] = launch(id, operation)
    }

    private nonisolated func launch(
        _ id: FetchStateMachine<Value>.FlightID, _ operation: @escaping Operation
    ) -> Task<Void, Never> {
        Task(executorPreference: clock.executor) {
            let outcome: FetchStateMachine<Value>.Outcome
            do {
                let running = OperationContext.running + [ObjectIdentifier(self)]
                outcome = .success(try await OperationContext.$running.withValue(running) { try await operation() })
            } catch is CancellationError {
                outcome = .cancelled
            } catch {
                outcome = .failure(error)
            }
            await self.operationFinished(id, outcome)
        }
    }
}
