import Foundation

/// The attempts the current task is running (directly, through nested states, or because it
/// inherited the context of a task that does), so that the machine can refuse a call that would wait
/// for its own result. Only an attempt that is still current counts, so a task an operation started
/// may call the state once that attempt is over. An attempt is known by its id alone: ids are unique
/// in the process (``MachineIDs``), whichever store's machine handed them out.
@usableFromInline
enum OperationContext {
    /// The ids of the attempts the current task runs. An array (one word): the mark is kept in the
    /// attempt's task frames, and a wider one made them outgrow the memory a new task starts with (a
    /// second slab: the allocation an inline first id would have saved).
    @TaskLocal static var running: [UInt64] = []

    /// ``running``'s task-local (its projection), for inlinable code.
    @usableFromInline static var runningLocal: TaskLocal<[UInt64]> { $running }

    /// The mark of a task that runs `attempt`: the current task's marks, and the attempt's id. With
    /// ``marks(adding:)-([UInt64])``, for a batch's task, the one place a mark is made.
    @inlinable static func marks(adding attempt: UInt64) -> [UInt64] {
        var running = runningLocal.get()
        running.append(attempt)
        return running
    }

    /// The mark of a task that runs `attempts` (a batch's, which runs its keys' first attempts).
    @inlinable static func marks(adding attempts: [UInt64]) -> [UInt64] {
        var running = runningLocal.get()
        running.append(contentsOf: attempts)
        return running
    }
}

/// How an ``AsyncStateStore``'s callers wait, and the tasks it runs: the attempts' operations and the
/// timers of timeouts and backoffs. Each task reports its end to the store as an event.
extension AsyncStateStore {
    /// Suspends the caller until its waiter is resumed. A cancelled caller leaves at once and tells the
    /// machine, which ends the flight if it was the last waiter.
    /// Always inlined, so that its frame is part of its caller's: a waiting task's frames then fit in
    /// the memory the runtime gives a new task (984 bytes), and a joiner mallocs no second slab.
    ///
    /// `started`: the caller's call started the flight, which may then have settled already (its
    /// operation answered without suspending, on this thread: see ``launchAndAttach(_:)``); such a
    /// caller looks for its outcome first. A joiner does not: its outcome, if it came meanwhile, is
    /// found as it registers — one lock fewer for each joiner of a stampede.
    @inlinable @inline(__always)
    func wait(_ waiter: Machine.WaiterID, started: Bool) async throws -> Value {
        // A flight that settled before its caller waits needs no cancellation handler and no
        // continuation.
        if started, let settled = settledOutcome(of: waiter) { return try settled.result(as: Value.self) }
        let outcome = await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<WaiterOutcome, Never>) in
                let early = core.withLock { core -> WaiterOutcome? in
                    // Settled since ``settledOutcome(of:)`` looked.
                    if let outcome = core.waiterSlots.takeOutcome(of: waiter) { return outcome }
                    switch core.waiterSlots[waiter] {
                    case .pending: break
                    case .waiting, .resolved, nil:
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

    /// The outcome of `waiter`, taken out of the table, if its flight has already answered it; else
    /// `nil` (it then waits). Never inlined: its locals stay out of the waiting caller's frame.
    @inlinable @inline(never)
    func settledOutcome(of waiter: Machine.WaiterID) -> WaiterOutcome? {
        core.withLock { $0.waiterSlots.takeOutcome(of: waiter) }
    }

    /// The number of waiters whose slots are still in the table (for tests).
    @inlinable var waiterCount: Int { core.withLock { $0.waiterSlots.count } }

    /// Starts the task of an attempt without a timeout, after the event that started the attempt has
    /// released the lock (the operation is the user's code), and gives the task to the attempt's
    /// flight — or cancels it, if the attempt is no longer running by then (its flight ended
    /// meanwhile, when every waiter left; or the task has already run to its end, and cancelling it
    /// does nothing).
    ///
    /// The task starts immediately (`Task.immediate`): the operation runs on the caller's thread until
    /// it first suspends, so that a caller that starts a flight hands nothing to another thread to
    /// begin it, and an operation that answers without suspending (a value at hand, a local cache)
    /// settles the flight before its caller waits. It is still a task of its own: the caller's
    /// cancellation does not reach it, and once it suspends a cancelled caller leaves at once, as a
    /// joiner does. (An attempt with a timeout starts on a thread of its own instead: see
    /// ``start(_:at:in:_:)``.)
    @inlinable
    func launchAndAttach(_ attempt: Machine.Attempt) {
        let task = task(for: attempt, immediate: true)
        let attached = core.withLock { $0.machine.attach(task: task, toAttempt: attempt.id) }
        if !attached { task.cancel() }
    }

    /// The task that runs `attempt`: started at once on the caller's thread if `immediate` (see
    /// ``launchAndAttach(_:)``), else enqueued as any task is. Its body is a literal here, not a
    /// closure made elsewhere and passed: passed, it is wrapped again to become the task's operation
    /// (two more allocations per attempt). A plain operation's task captures no input: its context
    /// stays within the 128 bytes it took before attempts carried one (past them, a miss's frees moved
    /// to a larger size class, and the heap trimmed and faulted pages back in five times as often:
    /// `HitLoop miss-fresh`, 2,000–3,000 page faults against 11,000–12,000).
    @inlinable @inline(__always)
    func task(for attempt: Machine.Attempt, immediate: Bool) -> Task<Void, Never> {
        let (flight, id, executor) = (attempt.flight, attempt.id, clock.executor)
        let marked = OperationContext.marks(adding: id)
        switch attempt.operation {
        case .plain(let operation):
            if immediate {
                return Task.immediate(executorPreference: executor) { [self] in
                    await run(marked: marked, flight: flight, id: id) { .success(try await operation()) }
                }
            }
            return Task(executorPreference: executor) { [self] in
                await run(marked: marked, flight: flight, id: id) { .success(try await operation()) }
            }
        case .reading(let operation):
            var input = attempt.input
            input.offerFallback = { [weak self] value, arrival in self?.fallbackOffered(flight, id, value, arrival) }
            if immediate {
                return Task.immediate(executorPreference: executor) { [self] in
                    await run(marked: marked, flight: flight, id: id) { Machine.Outcome(try await operation(input)) }
                }
            }
            return Task(executorPreference: executor) { [self] in
                await run(marked: marked, flight: flight, id: id) { Machine.Outcome(try await operation(input)) }
            }
        }
    }

    /// The body of an attempt's task: runs `operation`, marked (``OperationContext/marks(adding:)-(UInt64)``)
    /// as this attempt for the reentrancy check, and reports how it ended as the machine's typed
    /// outcome — always, whatever it threw, so the machine sees every end. Always inlined into the
    /// task's closure, so that it adds no frame to the task.
    @inlinable @inline(__always)
    func run(
        marked: [UInt64], flight: Machine.FlightID, id: Machine.AttemptID,
        _ operation: () async throws -> Machine.Outcome
    ) async {
        let outcome: Machine.Outcome
        do {
            outcome = try await OperationContext.runningLocal.withValue(marked) { try await operation() }
        } catch is CancellationError {
            outcome = .cancelled
        } catch {
            outcome = .failure(error)
        }
        attemptFinished(flight, id, outcome)
    }

    /// A timer: sleeps until `deadline` on the clock, then runs `fired` with the error the sleep threw,
    /// if any. A cancelled timer does nothing (whoever cancelled it has moved on).
    @inlinable func schedule(
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
