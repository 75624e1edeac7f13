import Foundation

/// A default actor whose executor a store shares when its clock does not settle: the store then
/// behaves exactly like a default actor.
private actor ExecutorHost {}

/// The stores whose operations the current task is running (directly or through nested states), so
/// a call that would wait for its own result is refused instead of hanging.
enum OperationContext {
    @TaskLocal static var running: [ObjectIdentifier] = []
}

/// The actor shell of an ``AsyncState``: it feeds events to a ``FetchStateMachine`` and performs the
/// actions — starts and cancels the operation's task, resumes waiters, publishes snapshots.
///
/// Under a settling clock (`VirtualClock`) the actor runs on the clock's serial executor and its
/// operation tasks prefer the clock's task executor, so every job of the store is counted by the
/// clock's settling. Otherwise it shares the executor of a plain default actor it owns.
actor AsyncStateStore<Value: Sendable> {
    typealias Operation = @Sendable () async throws -> Value

    /// The actor's executor: the clock's serial executor, or a private default actor's.
    nonisolated let unownedExecutor: UnownedSerialExecutor
    /// Keeps the object behind ``unownedExecutor`` alive.
    private nonisolated let executorOwner: any Sendable

    /// What synchronous readers and `updates` see.
    nonisolated let cell: SnapshotCell<Value>
    /// The injected clock.
    nonisolated let clock: StoreClock

    private var machine: FetchStateMachine<Value>
    /// The continuations of waiting callers (outside the actor; see ``WaiterTable``).
    nonisolated let waiters = WaiterTable<Value>()
    private var operations: [FetchStateMachine<Value>.FlightID: Task<Void, Never>] = [:]
    private var lastOperation: Operation?
    private var nextWaiter: UInt64 = 0

    init(
        initialValue: Value, expiry: Duration, clock: StoreClock,
        isEmpty: @escaping @Sendable (Value) -> Bool
    ) {
        self.clock = clock
        if let serial = clock.serialExecutor {
            executorOwner = serial
            unownedExecutor = serial.asUnownedSerialExecutor()
        } else {
            let host = ExecutorHost()
            executorOwner = host
            unownedExecutor = host.unownedExecutor
        }
        self.cell = SnapshotCell(value: initialValue, expiry: expiry)
        self.machine = FetchStateMachine(initialValue: initialValue, expiry: expiry, isEmpty: isEmpty)
    }

    // MARK: Entering

    /// Runs `body` on this store.
    nonisolated func enter<Result: Sendable>(
        _ body: @Sendable (isolated AsyncStateStore<Value>) throws -> Result
    ) async throws -> Result {
        try await body(self)
    }

    /// Whether the current task is running an operation of this store.
    nonisolated var isReentrant: Bool {
        OperationContext.running.contains(ObjectIdentifier(self))
    }

    // MARK: Events from callers

    /// What a caller gets from the actor: an answer now, or a waiter id to wait on (outside the
    /// actor, in ``waiters``).
    enum Ticket: Sendable {
        /// The answer, at once.
        case value(Value)
        /// Wait for waiter `id`.
        case wait(FetchStateMachine<Value>.WaiterID)
    }

    /// Gets the value: fresh data at once, else the outcome of the flight in flight or of a new one.
    nonisolated func fetch(_ operation: @escaping Operation, mode: FetchStateMachine<Value>.FetchMode) async throws
        -> Value
    {
        switch try await enter({ try $0.requestFetch(operation, mode: mode) }) {
        case .value(let value): return value
        case .wait(let id): return try await wait(id)
        }
    }

    /// Re-runs the last operation if the phase is failure or empty and waits for it; otherwise
    /// returns at once.
    nonisolated func retry() async throws {
        if let id = try await enter({ try $0.requestRetry() }) { _ = try await wait(id) }
    }

    private func requestFetch(_ operation: @escaping Operation, mode: FetchStateMachine<Value>.FetchMode) throws
        -> Ticket
    {
        let now = clock.now()
        if mode == .ifExpired, machine.isFresh(at: now) { return .value(machine.value) }
        if isReentrant { throw AsyncStateError.reentrantCall }
        try Task.checkCancellation()
        let waiter = makeWaiter()
        switch machine.fetch(waiter: waiter, mode: mode, now: now) {
        case .returnFresh(let value):
            return .value(value)
        case .join:
            break
        case .start(let id, let cancelling):
            lastOperation = operation
            if let cancelling { operations.removeValue(forKey: cancelling)?.cancel() }
            start(id, operation)
            publish(at: now)
        }
        waiters.add(waiter)
        return .wait(waiter)
    }

    /// Starts a retry flight and returns the caller's waiter, or `nil` when there is nothing to retry.
    private func requestRetry() throws -> FetchStateMachine<Value>.WaiterID? {
        if isReentrant { throw AsyncStateError.reentrantCall }
        try Task.checkCancellation()
        guard let operation = lastOperation else { return nil }
        let waiter = makeWaiter()
        guard case .start(let id) = machine.retry(waiter: waiter) else { return nil }
        start(id, operation)
        publish(at: clock.now())
        waiters.add(waiter)
        return waiter
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

    /// Suspends the caller (outside the actor) until its waiter is resumed. A cancelled caller leaves
    /// at once; the store then learns of it on the actor, and cancels the flight if it was the last.
    private nonisolated func wait(_ waiter: FetchStateMachine<Value>.WaiterID) async throws -> Value {
        try await waiters.wait(waiter) { [clock] in
            Task(executorPreference: clock.executor) { await self.waiterCancelled(waiter) }
        }
    }

    private func resume(_ waiter: FetchStateMachine<Value>.WaiterID, with result: Result<Value, any Error>) {
        waiters.resume(waiter, with: result)
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
