import AsyncStateKit
import AsyncStateTesting

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
