import AsyncStateKit
import AsyncStateTesting
import Dispatch

/// A thread-safe append-only log that tests read after advancing the clock.
final class EventLog: Sendable {
    private let events = LockedValue<[String]>([])

    func append(_ event: String) {
        events.withLock { $0.append(event) }
    }

    var all: [String] { events.withLock { $0 } }
}

/// Collects the stalls a clock reports, instead of failing the test.
final class StallRecorder: Sendable {
    private let stalls = LockedValue<[VirtualClock.Stall]>([])

    var handler: @Sendable (VirtualClock.Stall) -> Void {
        { stall in self.stalls.withLock { $0.append(stall) } }
    }

    var all: [VirtualClock.Stall] { stalls.withLock { $0 } }
}

/// A clock whose stalls go to `recorder`, with a short real-time timeout.
func clockRecordingStalls(_ recorder: StallRecorder, timeout: Duration = .milliseconds(200)) -> VirtualClock {
    VirtualClock(startDate: .init(timeIntervalSinceReferenceDate: 0), stallTimeout: timeout, onStall: recorder.handler)
}

/// A task executor on a dispatch queue of its own, for the tests' tasks that a clock does not watch.
///
/// A plain `Task` waits for a thread of the cooperative pool, which, on two cores and under
/// ThreadSanitizer, the suite's other tests can hold for longer than any stall timeout: a test whose
/// task must start within one gives the task this executor instead. Its queue's threads come from
/// dispatch's overcommitting pool, not the cooperative one; the clock still cannot see its jobs.
final class OwnQueueExecutor: TaskExecutor {
    private let queue = DispatchQueue(label: "OwnQueueExecutor")

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        queue.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}
