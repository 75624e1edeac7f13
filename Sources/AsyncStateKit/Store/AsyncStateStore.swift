import Foundation
import Synchronization

/// Default actors whose executors stores share when their clock does not settle.
///
/// A store needs a serial executor of its own only under a settling clock; otherwise any default
/// actor's will do. Owning one per state would cost ~140 bytes each, so states take one of a fixed
/// pool in turn: stores sharing a host serialize only their short actor turns (microseconds; never
/// their operations, which run in their own tasks), and there are many more hosts than cores.
private actor ExecutorHost {
    static let pool: [ExecutorHost] = (0..<64).map { _ in ExecutorHost() }
    private static let next = Atomic<Int>(0)

    /// The next host of the pool, in turn.
    static func take() -> ExecutorHost {
        pool[next.add(1, ordering: .relaxed).oldValue & (pool.count - 1)]
    }
}

/// The stores whose operations the current task is running (directly or through nested states), so
/// a call that would wait for its own result is refused instead of hanging.
enum OperationContext {
    @TaskLocal static var running: [ObjectIdentifier] = []
}

/// The actor shell of an ``AsyncState``: it feeds events to a ``FetchStateMachine`` and performs the
/// actions — starts and cancels the operation's task, sleeps between attempts, resumes waiters,
/// publishes snapshots, runs the periodic refresh.
///
/// Under a settling clock (`VirtualClock`) the actor runs on the clock's serial executor and its tasks
/// prefer the clock's task executor, so every job of the store is counted by the clock's settling.
/// Otherwise it shares the executor of a default actor from a small pool (see `ExecutorHost`).
@usableFromInline
actor AsyncStateStore<Value: Sendable> {
    typealias Operation = @Sendable () async throws -> Value
    typealias Machine = FetchStateMachine<Value>

    /// The actor's executor: the settling clock's serial executor (kept alive by the clock, which
    /// ``clock`` keeps alive), or a pooled default actor's (kept alive by the pool).
    @usableFromInline nonisolated let unownedExecutor: UnownedSerialExecutor

    /// What synchronous readers and `updates` see.
    @usableFromInline nonisolated let cell: SnapshotCell<Value>
    /// The injected clock.
    @usableFromInline nonisolated let clock: StoreClock
    /// The continuations of waiting callers, outside the actor (see ``WaiterTable``).
    nonisolated var waiters: WaiterTable<Value> { WaiterTable(cell: cell) }
    /// The longest an attempt may run; `nil` for no limit.
    private nonisolated let timeout: Duration?
    /// Whether `value` serves stale data at once and refreshes it in the background.
    @usableFromInline nonisolated let staleWhileRevalidate: Bool
    /// How long after a fetch settles the next background refresh starts; `nil` for none.
    private nonisolated let refreshInterval: Duration?

    private var machine: Machine
    private var operations: [Machine.FlightID: Task<Void, Never>] = [:]
    private var lastOperation: Operation?
    private var periodicRefresh: Task<Void, Never>?
    private var nextWaiter: UInt64 = 0

    /// Creates a store; `serialExecutor` is the settling clock's, if it has one.
    init(
        initialValue: Value, configuration: StoreConfiguration<Value>, clock: StoreClock,
        serialExecutor: (any SerialExecutor)?
    ) {
        self.clock = clock
        timeout = configuration.timeout
        staleWhileRevalidate = configuration.staleWhileRevalidate
        refreshInterval = configuration.refreshInterval
        unownedExecutor = serialExecutor?.asUnownedSerialExecutor() ?? ExecutorHost.take().unownedExecutor
        cell = SnapshotCell(value: initialValue, expiry: configuration.expiry)
        machine = Machine(
            initialValue: initialValue, expiry: configuration.expiry, isEmpty: configuration.isEmpty,
            retryPolicy: configuration.retry, seed: UInt64.random(in: .min ... .max))
    }

    deinit {
        periodicRefresh?.cancel()
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
        case wait(Machine.WaiterID)
    }

    /// Gets the value: fresh (or, with stale-while-revalidate, stale) data at once, else the outcome
    /// of the flight in flight or of a new one run with `policy`.
    nonisolated func fetch(
        _ operation: @escaping Operation, mode: Machine.FetchMode, policy: RetryPolicy? = nil
    ) async throws -> Value {
        switch try await enter({ try $0.requestFetch(operation, mode: mode, policy: policy) }) {
        case .value(let value): return value
        case .wait(let id): return try await wait(id)
        }
    }

    /// Re-runs the last operation if the phase is failure or empty and waits for it; otherwise
    /// returns at once.
    nonisolated func retry() async throws {
        if let id = try await enter({ try $0.requestRetry() }) { _ = try await wait(id) }
    }

    private func requestFetch(
        _ operation: @escaping Operation, mode: Machine.FetchMode, policy: RetryPolicy?
    ) throws -> Ticket {
        let now = clock.now()
        if mode != .always, machine.isFresh(at: now) { return .value(machine.value) }
        if isReentrant { throw AsyncStateError.reentrantCall }
        try Task.checkCancellation()
        let waiter = makeWaiter()
        switch machine.fetch(waiter: waiter, mode: mode, now: now, policy: policy) {
        case .returnFresh(let value):
            return .value(value)
        case .returnStale(let value, let refreshing):
            if let refreshing { start(refreshing, operation, at: now) }
            return .value(value)
        case .join:
            break
        case .start(let id, let cancelling):
            if let cancelling { operations.removeValue(forKey: cancelling)?.cancel() }
            start(id, operation, at: now)
        }
        waiters.add(waiter)
        return .wait(waiter)
    }

    /// Starts a retry flight and returns the caller's waiter, or `nil` when there is nothing to retry.
    private func requestRetry() throws -> Machine.WaiterID? {
        if isReentrant { throw AsyncStateError.reentrantCall }
        try Task.checkCancellation()
        return rerunLastOperation { $0.retry(waiter: $1, now: $2) }
    }

    /// Starts a periodic background refresh and returns its waiter, or `nil` when one is not due.
    private func requestPeriodicRefresh() -> Machine.WaiterID? {
        rerunLastOperation { $0.periodicRefresh(waiter: $1, now: $2) }
    }

    /// Re-runs the last operation as a new flight if `event` says so; returns the waiter to wait on.
    private func rerunLastOperation(
        _ event: (inout Machine, Machine.WaiterID, Duration) -> Machine.StartAction
    ) -> Machine.WaiterID? {
        guard let operation = lastOperation else { return nil }
        let waiter = makeWaiter()
        let now = clock.now()
        guard case .start(let id) = event(&machine, waiter, now) else { return nil }
        start(id, operation, at: now)
        waiters.add(waiter)
        return waiter
    }

    func invalidate() {
        machine.invalidate()
        publish(at: clock.now())
    }

    func cancel() {
        stopPeriodicRefresh()
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
        stopPeriodicRefresh()
        let ended = machine.reset()
        lastOperation = nil
        publish(at: clock.now())
        perform(ended, resumingWith: .failure(CancellationError()))
    }

    // MARK: Events from tasks

    /// An attempt of flight `id` ended. Returns when to start the next attempt, or `nil` when the
    /// flight is over (settled, or no longer current).
    private func attemptFinished(_ id: Machine.FlightID, _ outcome: Machine.Outcome) -> Duration? {
        let now = clock.now()
        switch machine.operationFinished(id, outcome: outcome, now: now, date: clock.date()) {
        case .drop:
            return nil
        case .retry(let at):
            publish(at: now)
            return at
        case .settle(let ids, let result):
            operations[id] = nil
            publish(at: now)
            for id in ids { resume(id, with: result) }
            armPeriodicRefresh()
            return nil
        }
    }

    /// A waiter's task was cancelled.
    private func waiterCancelled(_ waiter: Machine.WaiterID) {
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

    private func makeWaiter() -> Machine.WaiterID {
        nextWaiter &+= 1
        return nextWaiter
    }

    /// Suspends the caller (outside the actor) until its waiter is resumed. A cancelled caller leaves
    /// at once; the store then learns of it on the actor, and cancels the flight if it was the last.
    private nonisolated func wait(_ waiter: Machine.WaiterID) async throws -> Value {
        try await waiters.wait(waiter) { [clock] in
            Task(executorPreference: clock.executor) { await self.waiterCancelled(waiter) }
        }
    }

    private func resume(_ waiter: Machine.WaiterID, with result: Result<Value, any Error>) {
        waiters.resume(waiter, with: result)
    }

    /// Cancels the operation of a flight an event ended and resumes its waiters with `result`.
    /// Call after publishing, so that a resumed waiter sees the new snapshot.
    private func perform(_ ended: Machine.EndedFlight, resumingWith result: Result<Value, any Error>) {
        guard case .cancel(let id, let ids) = ended else { return }
        operations.removeValue(forKey: id)?.cancel()
        for waiter in ids { resume(waiter, with: result) }
    }

    private func publish(at now: Duration) {
        cell.publish(machine.snapshot(at: now), freshSince: machine.freshSince)
    }

    /// Starts flight `id` running `operation` and publishes `loading`.
    private func start(_ id: Machine.FlightID, _ operation: @escaping Operation, at now: Duration) {
        lastOperation = operation
        operations[id] = launch(id, operation)
        publish(at: now)
    }

    /// Starts the periodic refresh, if the state has one and it is not running: called when a fetch
    /// settles, so the first refresh comes one interval after it.
    private func armPeriodicRefresh() {
        guard periodicRefresh == nil, let interval = refreshInterval else { return }
        periodicRefresh = Self.refreshPeriodically(self, every: interval, clock: clock)
    }

    private func stopPeriodicRefresh() {
        periodicRefresh?.cancel()
        periodicRefresh = nil
    }

    /// The flight's task: runs attempts until the machine says the flight is over, sleeping on the
    /// clock between them. It holds the store until it ends, so a state dropped mid-flight is freed
    /// once its operation finishes; cancelling it (the store does, when the flight ends early) stops
    /// it at once, also during a backoff sleep.
    private nonisolated func launch(_ id: Machine.FlightID, _ operation: @escaping Operation) -> Task<Void, Never> {
        Task(executorPreference: clock.executor) { [self] in
            while !Task.isCancelled {
                let outcome = await attempt(operation)
                guard let next = await attemptFinished(id, outcome) else { return }
                do { try await clock.sleep(next) } catch { return }
            }
        }
    }

    /// Runs one attempt of `operation`, cancelling it after the configured timeout.
    private nonisolated func attempt(_ operation: @escaping Operation) async -> Machine.Outcome {
        let marked = OperationContext.running + [ObjectIdentifier(self)]
        let run: @Sendable () async -> Machine.Outcome = {
            do {
                return .success(try await OperationContext.$running.withValue(marked) { try await operation() })
            } catch is CancellationError {
                return .cancelled
            } catch {
                return .failure(error)
            }
        }
        guard let timeout else { return await run() }
        let deadline = clock.now() + timeout
        return await withTaskGroup(of: Machine.Outcome?.self) { [clock] group in
            group.addTask { await run() }
            group.addTask {
                do { try await clock.sleep(deadline) } catch { return nil }
                return .failure(AsyncStateError.timedOut(after: timeout))
            }
            var first: Machine.Outcome = .cancelled
            while let next = await group.next() {
                guard let outcome = next else { continue }  // the timer was cancelled
                first = outcome
                break
            }
            group.cancelAll()
            return first
        }
    }

    /// The periodic refresh: sleeps `interval`, re-runs the last operation in the background unless a
    /// fetch is in flight, waits for it, and again — while the store lives. Holds the store only
    /// while a refresh runs; the store cancels it on `cancel()`, `reset()` and deinit.
    private static func refreshPeriodically(
        _ store: AsyncStateStore<Value>, every interval: Duration, clock: StoreClock
    ) -> Task<Void, Never> {
        Task(executorPreference: clock.executor) { [weak store] in
            while !Task.isCancelled {
                do { try await clock.sleep(clock.now() + interval) } catch { return }
                guard let store else { return }
                guard let waiter = try? await store.enter({ $0.requestPeriodicRefresh() }) else { continue }
                _ = try? await store.wait(waiter)
            }
        }
    }
}
