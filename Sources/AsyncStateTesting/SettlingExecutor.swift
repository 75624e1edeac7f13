import Dispatch

/// The executors behind ``VirtualClock/taskExecutor`` and ``VirtualClock/serialExecutor``: both run
/// jobs one at a time on the clock's serial queue and count every job from the moment it is enqueued
/// until it has run, so the clock knows exactly when the work it can see has settled.
///
/// A job is enqueued synchronously inside `resume()` of the continuation that wakes a task, so a
/// woken sleeper is counted before the clock's `resume()` call returns: there is no gap in which the
/// count reads zero while woken work is still to run. An actor whose executor is the serial one has
/// every one of its jobs enqueued here too — including jobs queued while it was busy, which for a
/// default actor the runtime may drain on the global executor, out of the clock's sight.
final class SettlingTaskExecutor: TaskExecutor {
    private let core: VirtualClockCore

    init(core: VirtualClockCore) {
        self.core = core
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        core.schedule { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}

/// The serial executor of actors that take part in a ``VirtualClock``'s settling (see
/// ``SettlingTaskExecutor``).
final class SettlingSerialExecutor: SerialExecutor {
    private let core: VirtualClockCore

    init(core: VirtualClockCore) {
        self.core = core
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        core.schedule { job.runSynchronously(on: self.asUnownedSerialExecutor()) }
    }

    func checkIsolated() {
        dispatchPrecondition(condition: .onQueue(core.queue))
    }
}
