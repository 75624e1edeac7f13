import AsyncStateKit
import AsyncStateTesting
import Foundation
import Testing

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

/// Runs a seeded randomized test: `run` on `count` seeds from `seed` (`ASYNCSTATE_SEED` and
/// `ASYNCSTATE_SEQUENCES` override both, to replay one), stopping at the third failure. `run` returns
/// what went wrong with its seed, or `nil`. Records one issue listing the failures, with how to
/// replay them.
func expectEverySeedHolds(
    from seed: UInt64, count: Int, sourceLocation: SourceLocation = #_sourceLocation,
    _ run: (UInt64) async -> String?
) async {
    let environment = ProcessInfo.processInfo.environment
    let base = environment["ASYNCSTATE_SEED"].flatMap(UInt64.init) ?? seed
    let count = environment["ASYNCSTATE_SEQUENCES"].flatMap(Int.init) ?? count
    var failures: [String] = []
    for index in 0..<UInt64(count) {
        if let failure = await run(base &+ index) {
            failures.append(failure)
            if failures.count == 3 { break }
        }
    }
    #expect(
        failures.isEmpty,
        "replay with ASYNCSTATE_SEED=<seed> ASYNCSTATE_SEQUENCES=1:\n\(failures.joined(separator: "\n"))",
        sourceLocation: sourceLocation)
}

/// The policies of a randomized script, each on or off as its generator picks: what a service might
/// declare a state or a family with.
struct RandomPolicies: CustomStringConvertible {
    var retry: RetryPolicy
    var timeout: Duration?
    var softTimeout: Duration?
    var staleWhileRevalidate: Bool
    var refreshAfter: Duration?
    var failureExpiry: Duration
    var maxStaleAge: Duration?

    init(_ random: inout SplitMix64) {
        retry = random.next() % 2 == 0 ? .never : .exponential(maxAttempts: 3, initial: .milliseconds(500), seed: 1)
        timeout = random.next() % 3 == 0 ? .milliseconds(1_500) : nil
        staleWhileRevalidate = random.next() % 3 == 0
        refreshAfter = random.next() % 3 == 0 ? .seconds(1) : nil
        failureExpiry = random.next() % 3 == 0 ? .seconds(1) : .zero
        maxStaleAge = random.next() % 3 == 0 ? .seconds(3) : nil
        softTimeout = random.next() % 3 == 0 ? .milliseconds(750) : nil
    }

    var description: String {
        "retry \(retry.maxAttempts) timeout \(String(describing: timeout)) swr \(staleWhileRevalidate)"
            + " refreshAfter \(String(describing: refreshAfter)) failureExpiry \(failureExpiry)"
            + " maxStaleAge \(String(describing: maxStaleAge)) softTimeout \(String(describing: softTimeout))"
    }
}
