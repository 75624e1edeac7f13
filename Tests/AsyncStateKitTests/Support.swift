import AsyncStateKit
import AsyncStateTesting
import Foundation

/// Counts operation runs and lets tests script what each run does, in virtual time.
final class Source<Value: Sendable>: Sendable {
    private let state = LockedValue((runs: 0, inFlight: 0, maxInFlight: 0))

    /// How many times an operation made by this source started.
    var runs: Int { state.withLock { $0.runs } }
    /// How many runs have started and not ended.
    var inFlight: Int { state.withLock { $0.inFlight } }
    /// The most runs in flight at once.
    var maxInFlight: Int { state.withLock { $0.maxInFlight } }

    /// An operation that sleeps `delay` on `clock`, then returns `value` or throws `error`.
    func operation(
        on clock: VirtualClock, delay: Duration = .seconds(1), value: Value, error: (any Error)? = nil
    ) -> @Sendable () async throws -> Value {
        { [self] in
            state.withLock {
                $0.runs += 1
                $0.inFlight += 1
                $0.maxInFlight = max($0.maxInFlight, $0.inFlight)
            }
            defer { state.withLock { $0.inFlight -= 1 } }
            try await clock.sleep(for: delay)
            if let error { throw error }
            return value
        }
    }
}

/// Operations that ignore cancellation: each suspends on a continuation with no cancellation handler
/// until the test resumes it (a stand-in for a blocking call or a hung upstream).
final class ParkedOperations: Sendable {
    private let parked = LockedValue<[CheckedContinuation<Int, Never>]>([])

    /// Suspends until resumed, whatever happens to the calling task.
    func park() async -> Int {
        await withCheckedContinuation { continuation in parked.withLock { $0.append(continuation) } }
    }

    /// Resumes the operation that parked first with `value`.
    func resumeFirst(returning value: Int) {
        parked.withLock { $0.removeFirst() }.resume(returning: value)
    }

    /// Resumes every parked operation with `value`.
    func resumeAll(returning value: Int) {
        for continuation in parked.withLock({ parked in
            defer { parked = [] }
            return parked
        }) {
            continuation.resume(returning: value)
        }
    }
}

/// An error operations throw in tests.
struct SourceDown: Error, Equatable {
    var code = 503
}

/// The phase's case name, for assertions.
extension AsyncPhase {
    var name: String {
        switch self {
        case .initial: "initial"
        case .loading: "loading"
        case .empty: "empty"
        case .success: "success"
        case .failure: "failure"
        }
    }
}

/// The virtual clock's reference date plus `seconds`.
func virtualDate(_ seconds: Double) -> Date {
    Date(timeIntervalSinceReferenceDate: seconds)
}
