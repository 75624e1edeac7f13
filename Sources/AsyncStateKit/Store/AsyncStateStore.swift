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

/// The attempts the current task is running (directly, through nested states, or because it
/// inherited the context of a task that does), so that the machine can refuse a call that would wait
/// for its own result. Only an attempt that is still current counts, so a task an operation started
/// may call the state once that attempt is over.
enum OperationContext {
    /// One running attempt: which store, which attempt.
    struct Entry: Sendable {
        var store: ObjectIdentifier
        var attempt: UInt64
    }

    @TaskLocal static var running: [Entry] = []
}

/// The actor shell of an ``AsyncState``: it feeds events to a ``FetchStateMachine`` and performs the
/// actions — starts and cancels the attempts' tasks, sleeps out backoffs and timeouts, resumes
/// waiters, publishes snapshots. It decides nothing itself.
///
/// Under a settling clock (`VirtualClock`) the actor runs on the clock's serial executor and its tasks
/// prefer the clock's task executor, so every job of the store is counted by the clock's settling.
/// Otherwise it shares the executor of a default actor from a small pool (see `ExecutorHost`).
///
/// Lifetime: the store keeps an operation only inside the machine's flight, and its tasks only while
/// that flight runs. Each task holds the store until it ends (so a state dropped mid-flight settles
/// and is then freed); nothing outlives the flight except an attempt abandoned by its timeout, which
/// holds the store until its operation returns.
@usableFromInline
actor AsyncStateStore<Value: Sendable> {
    typealias Operation = @Sendable () async throws -> Value
    typealias Machine = FetchStateMachine<Value, Operation>

    /// The actor's executor: the settling clock's serial executor (kept alive by the clock, which
    /// ``clock`` keeps alive), or a pooled default actor's (kept alive by the pool).
    @usableFromInline nonisolated let unownedExecutor: UnownedSerialExecutor

    /// What synchronous readers and `updates` see.
    @usableFromInline nonisolated let cell: SnapshotCell<Value>
    /// The injected clock.
    @usableFromInline nonisolated let clock: StoreClock
    /// The continuations of waiting callers, outside the actor (see ``WaiterTable``).
    nonisolated var waiters: WaiterTable<Value> { WaiterTable(cell: cell) }
    /// Whether `value` serves stale data at once and refreshes it in the background.
    @usableFromInline nonisolated let staleWhileRevalidate: Bool

    private var machine: Machine
    /// The tasks of the flight in flight: its running attempt, and the timer of its timeout or backoff.
    private var attemptTask: Task<Void, Never>?
    private var timerTask: Task<Void, Never>?
    private var nextWaiter: UInt64 = 0

    /// Creates a store; `serialExecutor` is the settling clock's, if it has one.
    init(
        initialValue: Value, configuration: StoreConfiguration<Value>, clock: StoreClock,
        serialExecutor: (any SerialExecutor)?
    ) {
        self.clock = clock
        staleWhileRevalidate = configuration.staleWhileRevalidate
        unownedExecutor = serialExecutor?.asUnownedSerialExecutor() ?? ExecutorHost.take().unownedExecutor
        cell = SnapshotCell(value: initialValue, expiry: configuration.expiry)
        machine = Machine(
            initialValue: initialValue, configuration: configuration, seed: UInt64.random(in: .min ... .max))
    }

    // MARK: Entering

    /// Runs `body` on this store.
    nonisolated func enter<Result: Sendable>(
        _ body: @Sendable (isolated AsyncStateStore<Value>) throws -> Result
    ) async throws -> Result {
        try await body(self)
    }

    /// The attempts of this store that the current task runs (for the machine's reentrancy check).
    private nonisolated var callerAttempts: [Machine.AttemptID] {
        let me = ObjectIdentifier(self)
        return OperationContext.running.compactMap { $0.store == me ? $0.attempt : nil }
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

    /// Gets the value as `mode` says: an answer at once, or the outcome of the flight in flight or of
    /// a new one running `operation` with `policy`.
    nonisolated func fetch(
        _ operation: @escaping Operation, mode: Machine.FetchMode, policy: RetryPolicy? = nil
    ) async throws -> Value {
        let attempts = callerAttempts
        switch try await enter({ try $0.requestFetch(operation, mode: mode, policy: policy, callerAttempts: attempts) })
        {
        case .value(let value): return value
        case .wait(let id): return try await wait(id)
        }
    }

    /// Retries (see ``FetchStateMachine/retry(waiter:operation:now:callerAttempts:)``) and waits for the
    /// flight; returns at once when there is nothing to retry.
    nonisolated func retry(_ operation: Operation?) async throws {
        let attempts = callerAttempts
        if let id = try await enter({ try $0.requestRetry(operation, callerAttempts: attempts) }) {
            _ = try await wait(id)
        }
    }

    private func requestFetch(
        _ operation: @escaping Operation, mode: Machine.FetchMode, policy: RetryPolicy?,
        callerAttempts: [Machine.AttemptID]
    ) throws -> Ticket {
        try Task.checkCancellation()
        let now = clock.now()
        nextWaiter &+= 1
        let waiter = nextWaiter
        switch machine.fetch(
            waiter: waiter, mode: mode, now: now, policy: policy, operation: operation,
            callerAttempts: callerAttempts)
        {
        case .returnValue(let value):
            return .value(value)
        case .returnStaleAndStart(let value, let attempt):
            start(attempt, at: now)
            return .value(value)
        case .fail(let error):
            throw error
        case .join:
            break
        case .start(let attempt, let replacing):
            if replacing { endFlightTasks() }
            start(attempt, at: now)
        }
        waiters.add(waiter)
        return .wait(waiter)
    }

    private func requestRetry(_ operation: Operation?, callerAttempts: [Machine.AttemptID]) throws
        -> Machine.WaiterID?
    {
        try Task.checkCancellation()
        let now = clock.now()
        nextWaiter &+= 1
        let waiter = nextWaiter
        guard
            case .start(let attempt) = machine.retry(
                waiter: waiter, operation: operation, now: now, callerAttempts: callerAttempts)
        else { return nil }
        start(attempt, at: now)
        waiters.add(waiter)
        return waiter
    }

    func invalidate() {
        let now = clock.now()
        if machine.invalidate(now: now) { publish(at: now) }
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
        let (ended, changed) = machine.reset()
        guard changed else { return }
        publish(at: clock.now())
        perform(ended, resumingWith: .failure(CancellationError()))
    }

    // MARK: Events from the flight's tasks

    /// An attempt's operation returned or threw.
    private func attemptFinished(
        _ flight: Machine.FlightID, _ attempt: Machine.AttemptID, _ outcome: Machine.Outcome
    ) {
        let now = clock.now()
        let action = machine.attemptFinished(flight, attempt: attempt, outcome: outcome, now: now, date: clock.date())
        if case .drop = action { return }
        attemptTask = nil  // it is ending by itself
        perform(action, at: now)
    }

    /// An attempt's timeout fired: the attempt is abandoned (cancelled, its late result dropped).
    private func attemptTimedOut(_ flight: Machine.FlightID, _ attempt: Machine.AttemptID) {
        let now = clock.now()
        let action = machine.attemptTimedOut(flight, attempt: attempt, now: now)
        if case .drop = action { return }
        attemptTask?.cancel()
        attemptTask = nil
        timerTask = nil  // it is ending by itself
        perform(action, at: now)
    }

    /// A backoff ended, or its sleep threw `error`.
    private func backoffEnded(_ flight: Machine.FlightID, _ attempt: Machine.AttemptID, error: (any Error)?) {
        let now = clock.now()
        let action = machine.backoffEnded(flight, attempt: attempt, error: error, now: now)
        if case .drop = action { return }
        timerTask = nil  // it is ending by itself
        perform(action, at: now)
    }

    /// A waiter's task was cancelled.
    private func waiterCancelled(_ waiter: Machine.WaiterID) {
        switch machine.waiterCancelled(waiter) {
        case .none:
            break
        case .resume(let id):
            resume(id, with: .failure(CancellationError()))
        case .resumeAndEndFlight(let id):
            endFlightTasks()
            publish(at: clock.now())
            resume(id, with: .failure(CancellationError()))
        }
    }

    // MARK: Performing actions

    private func perform(_ action: Machine.FlightAction, at now: Duration) {
        switch action {
        case .drop:
            break
        case .retry(let flight, let attempt, let at):
            timerTask?.cancel()
            timerTask = schedule(at: at) { store, error in store.backoffEnded(flight, attempt, error: error) }
            publish(at: now)
        case .start(let attempt):
            start(attempt, at: now)
        case .settle(let ids, let result):
            endFlightTasks()
            publish(at: now)
            for id in ids { resume(id, with: result) }
        }
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

    /// Ends the tasks of a flight an event ended and resumes its waiters with `result`.
    /// Call after publishing, so that a resumed waiter sees the new snapshot.
    private func perform(_ ended: Machine.EndedFlight, resumingWith result: Result<Value, any Error>) {
        guard case .end(let ids) = ended else { return }
        endFlightTasks()
        for waiter in ids { resume(waiter, with: result) }
    }

    /// Cancels the flight's attempt (its operation) and its timer.
    private func endFlightTasks() {
        attemptTask?.cancel()
        timerTask?.cancel()
        attemptTask = nil
        timerTask = nil
    }

    private func publish(at now: Duration) {
        cell.publish(machine.snapshot(at: now), freshSince: machine.freshSince)
    }

    /// Starts `attempt`'s task (and its timeout's timer) and publishes.
    private func start(_ attempt: Machine.Attempt, at now: Duration) {
        timerTask?.cancel()
        attemptTask = launch(attempt)
        let (flight, id) = (attempt.flight, attempt.id)
        timerTask = attempt.timeoutAt.map { deadline in
            // A timer whose sleep throws without being cancelled cannot keep its promise to end the
            // wait at the deadline, so it ends it now.
            schedule(at: deadline) { store, _ in store.attemptTimedOut(flight, id) }
        }
        publish(at: now)
    }

    /// The attempt's task: runs the operation, marked as this attempt for the reentrancy check, and
    /// reports how it ended — always, whatever it threw, so the machine sees every end.
    private nonisolated func launch(_ attempt: Machine.Attempt) -> Task<Void, Never> {
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
            await attemptFinished(flight, id, outcome)
        }
    }

    /// A timer: sleeps until `deadline` on the clock, then runs `fired` on the store with the error the
    /// sleep threw, if any. A cancelled timer does nothing (whoever cancelled it has moved on).
    private nonisolated func schedule(
        at deadline: Duration,
        _ fired: @escaping @Sendable (isolated AsyncStateStore<Value>, (any Error)?) -> Void
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
            _ = try? await enter { fired($0, failure) }
        }
    }
}
