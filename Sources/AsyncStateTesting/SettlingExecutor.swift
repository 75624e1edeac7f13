import Dispatch

/// The executor behind ``VirtualClock/taskExecutor``: it runs jobs one at a time on a serial queue
/// and counts every job from the moment it is enqueued until it has run, so the clock knows exactly
/// when the work it can see has settled.
///
/// A job is enqueued synchronously inside `resume()` of the continuation that wakes a task, so a
/// woken sleeper is counted before the clock's `resume()` call returns: there is no gap in which the
/// count reads zero while woken work is still to run. Jobs are run serially, so two tasks that prefer
/// this executor never contend for a default actor; if they did, the runtime could run the queued
/// one on the global executor, out of sight.
final class SettlingExecutor: TaskExecutor {
    private let core: VirtualClockCore

    init(core: VirtualClockCore) {
        self.core = core
    }

    func enqueue(_ job: consuming ExecutorJob) {
        core.jobEnqueued()
        let job = UnownedJob(job)
        core.queue.async { [self] in
            core.jobStarted()
            job.runSynchronously(on: asUnownedTaskExecutor())
            core.jobFinished()
        }
    }
}
