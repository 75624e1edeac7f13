import AsyncStateKit
import AsyncStateTesting
import Testing

/// An operation that records the virtual instant of every attempt and fails its first `failures`
/// attempts (or all, when `failures` is nil), each after `duration`.
final class ScriptedSource: Sendable {
    private let attempts = LockedValue<[Duration]>([])
    let clock: VirtualClock
    let failures: Int?
    let duration: Duration
    let error: any Error & Sendable

    init(clock: VirtualClock, failures: Int?, duration: Duration = .zero, error: any Error & Sendable = SourceDown()) {
        self.clock = clock
        self.failures = failures
        self.duration = duration
        self.error = error
    }

    /// The instants (offsets from the clock's start) at which attempts started.
    var instants: [Duration] { attempts.withLock { $0 } }

    var operation: @Sendable () async throws -> Int {
        { [self] in
            let attempt = attempts.withLock {
                $0.append(clock.now.offset)
                return $0.count
            }
            try await clock.sleep(for: duration)
            if let failures, attempt > failures { return attempt }
            throw error
        }
    }
}

extension Duration {
    static func s(_ seconds: Double) -> Duration { .milliseconds(Int64((seconds * 1_000).rounded())) }
}

@Suite struct RetryPolicyTests {
    /// Runs a fetch that always fails under `policy` to the end; returns the attempt instants.
    static func instants(of policy: RetryPolicy, duration: Duration = .zero) async -> [Duration] {
        let clock = VirtualClock()
        let source = ScriptedSource(clock: clock, failures: nil, duration: duration)
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, retry: policy)
        clock.task { await state.fetch(source.operation) }
        await clock.runUntilIdle()
        #expect(state.phase.name == "failure")
        return source.instants
    }

    @Test func noRetryByDefault() async {
        #expect(await Self.instants(of: .never) == [.zero])
    }

    @Test func constantBackoffWaitsTheSameBeforeEveryRetry() async {
        let policy = RetryPolicy(maxAttempts: 4, backoff: .constant(.seconds(2)))
        #expect(await Self.instants(of: policy) == [.s(0), .s(2), .s(4), .s(6)])
    }

    @Test func backoffCountsFromTheEndOfTheFailedAttempt() async {
        let policy = RetryPolicy(maxAttempts: 3, backoff: .constant(.seconds(2)))
        #expect(await Self.instants(of: policy, duration: .seconds(1)) == [.s(0), .s(3), .s(6)])
    }

    @Test func linearBackoffGrowsByTheIncrementUpToTheCap() async {
        let policy = RetryPolicy(
            maxAttempts: 5, backoff: .linear(initial: .seconds(1), increment: .seconds(2), cap: .seconds(4)))
        // Delays 1, 3, 4 (capped from 5), 4 (capped from 7).
        #expect(await Self.instants(of: policy) == [.s(0), .s(1), .s(4), .s(8), .s(12)])
    }

    @Test func exponentialBackoffDoublesUpToTheCap() async {
        let policy = RetryPolicy.exponential(
            maxAttempts: 6, initial: .milliseconds(500), multiplier: 2, cap: .seconds(3))
        // Delays 0.5, 1, 2, 3 (capped from 4), 3 (capped from 8).
        #expect(await Self.instants(of: policy) == [.s(0), .s(0.5), .s(1.5), .s(3.5), .s(6.5), .s(9.5)])
    }

    @Test func theTanStackPresetIsThreeRetriesAtOneTwoAndFourSeconds() async {
        #expect(await Self.instants(of: .tanStack) == [.s(0), .s(1), .s(3), .s(7)])
        #expect(RetryPolicy.tanStack.backoff.delay(beforeRetry: 5) == .seconds(16))
        #expect(RetryPolicy.tanStack.backoff.delay(beforeRetry: 6) == .seconds(30))
        #expect(RetryPolicy.tanStack.backoff.delay(beforeRetry: 60) == .seconds(30))
    }

    @Test func seededJitterReplaysExactlyAndDifferentSeedsDiffer() async {
        func policy(_ jitter: RetryPolicy.Jitter, seed: UInt64) -> RetryPolicy {
            .exponential(maxAttempts: 6, initial: .seconds(1), cap: .seconds(60), jitter: jitter, seed: seed)
        }
        for jitter in [RetryPolicy.Jitter.full, .equal] {
            let first = await Self.instants(of: policy(jitter, seed: 42))
            let again = await Self.instants(of: policy(jitter, seed: 42))
            let other = await Self.instants(of: policy(jitter, seed: 43))
            #expect(first == again, "\(jitter): the same seed replays the same schedule")
            #expect(first != other, "\(jitter): another seed gives another schedule")
            // Every jittered delay stays within its bounds: full in 0...d, equal in d/2...d.
            let delays = zip(first.dropFirst(), first).map { $0 - $1 }
            for (index, delay) in delays.enumerated() {
                let full = Duration.seconds(1 << index)
                let lower = jitter == .full ? Duration.zero : full / 2
                #expect(delay >= lower && delay <= full, "\(jitter) retry \(index + 1): \(delay)")
            }
        }
    }

    @Test func withoutASeedEveryFetchDrawsItsOwnJitter() async {
        let policy = RetryPolicy.exponential(maxAttempts: 5, initial: .seconds(10), jitter: .full)
        let schedules = await [Self.instants(of: policy), Self.instants(of: policy), Self.instants(of: policy)]
        #expect(Set(schedules).count > 1)
    }

    @Test func aNonRetryableErrorFailsAtOnce() async throws {
        struct NotFound: Error {}
        let clock = VirtualClock()
        let source = ScriptedSource(clock: clock, failures: nil, error: NotFound())
        let policy = RetryPolicy.exponential(maxAttempts: 5).retrying { !($0 is NotFound) }
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, retry: policy)
        await state.fetch(source.operation)
        #expect(source.instants == [.zero])
        #expect(state.phase.error is NotFound)
    }

    @Test func theBudgetStopsRetriesThatWouldStartTooLate() async {
        // Attempts at 0, 1, 3, 7 would follow; a 5 s budget allows those starting by 5 s.
        let policy = RetryPolicy.exponential(maxAttempts: 10, initial: .seconds(1), budget: .seconds(5))
        #expect(await Self.instants(of: policy) == [.s(0), .s(1), .s(3)])
    }

    @Test func retriesKeepThePhaseLoadingAndCountFailuresUntilTheLast() async throws {
        let clock = VirtualClock()
        let source = ScriptedSource(clock: clock, failures: 2)
        let state = AsyncState<Int>(
            wrappedValue: 0, clock: clock, retry: RetryPolicy(maxAttempts: 3, backoff: .constant(.seconds(1))))
        let caller = clock.task { try await state.value(source.operation) }
        await clock.settle()
        #expect(state.phase.isLoading)
        #expect(state.snapshot.failureCount == 1)
        #expect(state.snapshot.lastError is SourceDown)
        await clock.advance(by: .seconds(1))
        #expect(state.phase.isLoading)
        #expect(state.snapshot.failureCount == 2)
        await clock.advance(by: .seconds(1))
        #expect(try await caller.value == 3)
        #expect(state.phase.name == "success")
        let snapshot = state.snapshot
        #expect(snapshot.failureCount == 0)
        #expect(snapshot.lastError is SourceDown)  // kept after the success
        #expect(snapshot.lastSuccess == virtualDate(2))
        #expect(snapshot.successCount == 1)
        #expect(source.instants == [.s(0), .s(1), .s(2)])
    }

    @Test func aCallCanOverrideTheDeclaredPolicy() async throws {
        let clock = VirtualClock()
        let source = ScriptedSource(clock: clock, failures: 1)
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)  // declared: no retry
        let caller = clock.task {
            try await state.value(retry: RetryPolicy(maxAttempts: 2, backoff: .constant(.seconds(5)))) {
                try await source.operation()
            }
        }
        await clock.advance(by: .seconds(5))
        #expect(try await caller.value == 2)
        #expect(source.instants == [.s(0), .s(5)])
    }

    @Test func aCallCanTurnRetryOffForItself() async throws {
        let clock = VirtualClock()
        let source = ScriptedSource(clock: clock, failures: nil)
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, retry: .tanStack)  // declared: 3 retries
        await #expect(throws: SourceDown.self) { try await state.value(retry: .never, source.operation) }
        #expect(source.instants == [.zero])
    }

    @Test func aCancelledCallerStopsTheBackoffAtOnce() async throws {
        let clock = VirtualClock()
        let source = ScriptedSource(clock: clock, failures: nil)
        let state = AsyncState<Int>(
            wrappedValue: 0, clock: clock, retry: RetryPolicy(maxAttempts: 5, backoff: .constant(.seconds(60))))
        let caller = clock.task { try await state.value(source.operation) }
        await clock.settle()
        #expect(clock.pendingSleepers == 1)  // the backoff sleep
        caller.cancel()
        await #expect(throws: CancellationError.self) { try await caller.value }
        await clock.settle()
        #expect(clock.pendingSleepers == 0)
        #expect(state.phase.name == "initial")  // cancellation is not a failure
        await clock.advance(by: .seconds(600))
        #expect(source.instants == [.zero])
    }

    @Test func cancelStopsTheBackoffAtOnce() async throws {
        let clock = VirtualClock()
        let source = ScriptedSource(clock: clock, failures: nil)
        let state = AsyncState<Int>(
            wrappedValue: 0, clock: clock, retry: RetryPolicy(maxAttempts: 5, backoff: .constant(.seconds(60))))
        clock.task { await state.fetch(source.operation) }
        await clock.advance(by: .seconds(30))
        await state.cancel()
        await clock.settle()
        #expect(clock.pendingSleepers == 0)
        await clock.advance(by: .seconds(600))
        #expect(source.instants == [.zero])
    }
}

@Suite struct TimeoutTests {
    @Test func anAttemptThatOverrunsIsCancelledAndFailsWithATimeout() async throws {
        let clock = VirtualClock()
        let source = ScriptedSource(clock: clock, failures: 0, duration: .seconds(10))
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, timeout: .seconds(3))
        let caller = clock.task { try await state.value(source.operation) }
        await clock.advance(by: .seconds(3))
        await #expect(throws: AsyncStateError.timedOut(after: .seconds(3))) { try await caller.value }
        #expect(state.phase.error as? AsyncStateError == .timedOut(after: .seconds(3)))
        #expect(clock.pendingSleepers == 0)  // the operation was cancelled
    }

    @Test func aTimeoutIsRetriedLikeAnyFailure() async throws {
        let clock = VirtualClock()
        let slowThenFast = LockedValue([Duration.seconds(10), .seconds(1)])
        let state = AsyncState<Int>(
            wrappedValue: 0, clock: clock, retry: RetryPolicy(maxAttempts: 2, backoff: .constant(.seconds(1))),
            timeout: .seconds(3))
        let caller = clock.task {
            try await state.value {
                try await clock.sleep(for: slowThenFast.withLock { $0.removeFirst() })
                return 7
            }
        }
        await clock.advance(by: .seconds(3))  // first attempt times out at 3 s
        #expect(state.phase.isLoading)
        #expect(state.snapshot.lastError as? AsyncStateError == .timedOut(after: .seconds(3)))
        await clock.advance(by: .seconds(2))  // retry at 4 s, done at 5 s
        #expect(try await caller.value == 7)
        #expect(state.phase.lastUpdated == virtualDate(5))
    }

    @Test func anAttemptWithinTheTimeoutIsNotDisturbed() async throws {
        let clock = VirtualClock()
        let source = ScriptedSource(clock: clock, failures: 0, duration: .seconds(2))
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, timeout: .seconds(3))
        let caller = clock.task { try await state.value(source.operation) }
        await clock.advance(by: .seconds(2))
        #expect(try await caller.value == 1)
        #expect(clock.pendingSleepers == 0)  // the timer was cancelled
    }

    @Test(arguments: [Duration.zero, .seconds(-1)])
    func aZeroOrNegativeTimeoutMeansNone(_ timeout: Duration) async throws {
        let clock = VirtualClock()
        let source = ScriptedSource(clock: clock, failures: 0, duration: .seconds(100))
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, timeout: timeout)
        let caller = clock.task { try await state.value(source.operation) }
        await clock.advance(by: .seconds(100))
        #expect(try await caller.value == 1)
    }
}

@Suite struct BadPolicyInputTests {
    @Test func fewerThanOneAttemptMeansOne() async {
        #expect(RetryPolicy(maxAttempts: 0).maxAttempts == 1)
        #expect(RetryPolicy(maxAttempts: -5).maxAttempts == 1)
        #expect(await RetryPolicyTests.instants(of: RetryPolicy(maxAttempts: 0)) == [.zero])
    }

    @Test func negativeDurationsAreZeroAndAMultiplierBelowOneIsOne() {
        #expect(RetryPolicy.Backoff.constant(.seconds(-3)).delay(beforeRetry: 1) == .zero)
        let linear = RetryPolicy.Backoff.linear(initial: .seconds(-1), increment: .seconds(-2), cap: .seconds(10))
        #expect(linear.delay(beforeRetry: 4) == .zero)
        let shrinking = RetryPolicy.Backoff.exponential(initial: .seconds(4), multiplier: 0.5, cap: .seconds(60))
        #expect(shrinking.delay(beforeRetry: 3) == .seconds(4))
        let negativeCap = RetryPolicy.Backoff.exponential(initial: .seconds(4), multiplier: 2, cap: .seconds(-1))
        #expect(negativeCap.delay(beforeRetry: 3) == .zero)
        #expect(RetryPolicy.Backoff.constant(.seconds(2)).delay(beforeRetry: -7) == .seconds(2))
        let huge = RetryPolicy.Backoff.exponential(initial: .seconds(1), multiplier: 1e300, cap: .seconds(30))
        #expect(huge.delay(beforeRetry: 50) == .seconds(30))
    }

    @Test func jitterOnAZeroDelayIsZeroNotATrap() async {
        let policy = RetryPolicy(maxAttempts: 3, backoff: .constant(.zero), jitter: .full, seed: 1)
        #expect(await RetryPolicyTests.instants(of: policy) == [.zero, .zero, .zero])
        let equal = RetryPolicy(maxAttempts: 2, backoff: .constant(.zero), jitter: .equal, seed: 1)
        #expect(await RetryPolicyTests.instants(of: equal) == [.zero, .zero])
    }

    @Test(arguments: [Duration.zero, .seconds(-1)])
    func aZeroOrNegativeBudgetAllowsNoRetry(_ budget: Duration) async {
        let policy = RetryPolicy(maxAttempts: 5, backoff: .constant(.zero), budget: budget)
        #expect(await RetryPolicyTests.instants(of: policy) == [.zero])
    }
}
