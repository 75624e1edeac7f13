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

/// How an ``AsyncStateStore``'s callers wait, and the tasks it runs: the attempts' operations and the
/// timers of timeouts and backoffs. Each task reports its end to the store as an event.
extension AsyncStateStore {
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
    func launch(_ attempt: Machine.Attempt) -> Task<Void, Never> {
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
    func schedule(
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
