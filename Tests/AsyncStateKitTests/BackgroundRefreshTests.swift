import AsyncStateTesting
import Testing

@testable import AsyncStateKit

@Suite struct RunEveryTests {
    @Test func fetchesThenRefreshesEveryIntervalAfterEachFetchSettles() async throws {
        let clock = VirtualClock()
        let source = ScriptedSource(clock: clock, failures: 0, duration: .seconds(1))
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let runner = clock.task { try await state.run(every: .seconds(10), source.operation) }
        await clock.advance(by: .seconds(35))
        // Each refresh starts 10 s after the previous fetch settled (each takes 1 s), fresh or not.
        #expect(source.instants == [.s(0), .s(11), .s(22), .s(33)])
        #expect(state.wrappedValue == 4)  // the source answers with its attempt number
        #expect(state.snapshot.successCount == 4)
        runner.cancel()
        try await runner.value  // returns normally when cancelled
        await clock.checkSuspension()
    }

    @Test func freshDataIsNotRefetchedAtTheStart() async throws {
        let clock = VirtualClock()
        let source = ScriptedSource(clock: clock, failures: 0)
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(60), clock: clock)
        await state.set(7)
        let runner = clock.task { try await state.run(every: .seconds(10), source.operation) }
        await clock.advance(by: .seconds(5))
        #expect(source.instants == [])
        await clock.advance(by: .seconds(5))
        #expect(source.instants == [.s(10)])
        runner.cancel()
        try await runner.value
    }

    @Test func aRefreshDueWhileAFetchIsInFlightJoinsIt() async throws {
        let clock = VirtualClock()
        let starts = LockedValue<[Duration]>([])
        let durations = LockedValue([Duration.zero, .seconds(10), .zero])
        let load: @Sendable () async throws -> Int = {
            starts.withLock { $0.append(clock.now.offset) }
            try await clock.sleep(for: durations.withLock { $0.removeFirst() })
            return 1
        }
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let runner = clock.task { try await state.run(every: .seconds(10), load) }  // fetches at 0, next at 10
        await clock.advance(by: .seconds(5))
        clock.task { await state.refresh(load) }  // 5–15 s
        await clock.advance(by: .seconds(10))  // due at 10 while the refresh runs: joins it
        #expect(starts.withLock { $0 } == [.s(0), .s(5)])
        await clock.advance(by: .seconds(10))  // due again 10 s after it settled, at 25
        #expect(starts.withLock { $0 } == [.s(0), .s(5), .s(25)])
        runner.cancel()
        try await runner.value
        await clock.checkSuspension()
    }

    @Test func failuresDoNotStopIt() async throws {
        let clock = VirtualClock()
        let source = ScriptedSource(clock: clock, failures: 2)
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, failureExpiry: .seconds(60))
        let runner = clock.task { try await state.run(every: .seconds(10), source.operation) }
        await clock.advance(by: .seconds(15))
        #expect(state.phase.name == "failure")
        await clock.advance(by: .seconds(10))  // it bypasses the failure expiry
        #expect(source.instants == [.s(0), .s(10), .s(20)])
        #expect(state.wrappedValue == 3)
        runner.cancel()
        try await runner.value
    }

    @Test func cancellingItCancelsTheFetchItWaitsFor() async throws {
        let clock = VirtualClock()
        let source = ScriptedSource(clock: clock, failures: 0, duration: .seconds(30))
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let runner = clock.task { try await state.run(every: .seconds(10), source.operation) }
        await clock.advance(by: .seconds(1))
        #expect(state.phase.isLoading)
        runner.cancel()
        try await runner.value
        await clock.settle()
        #expect(state.phase.name == "initial")
        #expect(clock.pendingSleepers == 0)
    }

    @Test(arguments: [Duration.zero, .seconds(-10)])
    func aZeroOrNegativeIntervalIsAnError(_ interval: Duration) async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        await #expect(throws: AsyncStateError.invalidInterval(interval)) {
            try await state.run(every: interval) { 1 }
        }
        #expect(state.phase.name == "initial")
    }

    @Test func aClockWhoseSleepThrowsStopsItLoudly() async throws {
        let state = AsyncState<Int>(wrappedValue: 0, clock: ThrowingClock())
        await #expect(throws: ThrowingClock.Broken.self) {
            try await state.run(every: .seconds(1)) { 1 }
        }
        #expect(state.wrappedValue == 1)
    }
}

/// A clock whose sleeps throw at once, without the task being cancelled (a custom clock, a test clock
/// that ends its pending sleeps).
struct ThrowingClock: Clock {
    struct Broken: Error {}

    /// What every sleep throws.
    var error: any Error & Sendable = Broken()

    var now: ContinuousClock.Instant { .now }
    var minimumResolution: Duration { .zero }
    func sleep(until deadline: ContinuousClock.Instant, tolerance: Duration?) async throws { throw error }
}

@Suite struct StaleWhileRevalidateTests {
    @Test func staleDataIsReturnedAtOnceAndRefreshedInTheBackground() async throws {
        let clock = VirtualClock()
        let answers = LockedValue(["first", "second"])
        let runs = LockedValue(0)
        let load: @Sendable () async throws -> String = {
            runs.withLock { $0 += 1 }
            try await clock.sleep(for: .seconds(2))
            return answers.withLock { $0.removeFirst() }
        }
        let state = AsyncState<String>(wrappedValue: "", expiry: .seconds(10), clock: clock, staleWhileRevalidate: true)
        let first = clock.task { try await state.value(load) }  // no data yet: waits
        await clock.advance(by: .seconds(2))
        #expect(try await first.value == "first")

        await clock.advance(by: .seconds(10))  // expired
        #expect(try await state.value(load) == "first")  // at once, stale
        #expect(state.phase.isLoading)
        #expect(clock.now.offset == .seconds(12))
        let callers = (0..<5).map { _ in clock.task { try await state.value(load) } }
        for caller in callers { #expect(try await caller.value == "first") }
        #expect(runs.withLock { $0 } == 2)  // one background refresh, however many callers

        await clock.advance(by: .seconds(2))
        #expect(state.wrappedValue == "second")
        #expect(state.phase.lastUpdated == virtualDate(14))
        #expect(try await state.value(load) == "second")
    }

    @Test func aBackgroundRefreshOutlivesTheCallerThatStartedIt() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(1), clock: clock, staleWhileRevalidate: true)
        await state.set(1)
        await clock.advance(by: .seconds(1))
        let caller = clock.task {
            try await state.value {
                try await clock.sleep(for: .seconds(5))
                return 2
            }
        }
        #expect(try await caller.value == 1)
        caller.cancel()  // it has its answer; the refresh is not its to cancel
        await clock.advance(by: .seconds(5))
        #expect(state.wrappedValue == 2)
    }

    @Test func withoutDataItWaitsLikeAnyFetch() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: -1, clock: clock, staleWhileRevalidate: true)
        let caller = clock.task {
            try await state.value {
                try await clock.sleep(for: .seconds(1))
                return 5
            }
        }
        await clock.advance(by: .seconds(1))
        #expect(try await caller.value == 5)
    }

    @Test func aFailedBackgroundRefreshKeepsTheStaleValue() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(1), clock: clock, staleWhileRevalidate: true)
        await state.set(1)
        await clock.advance(by: .seconds(1))
        #expect(try await state.value { throw SourceDown() } == 1)
        await clock.settle()
        #expect(state.phase.name == "failure")
        #expect(state.wrappedValue == 1)
        #expect(try await state.value { 3 } == 1)  // still stale-while-revalidate, now refreshing again
        await clock.settle()
        #expect(state.wrappedValue == 3)
    }
}

@Suite struct ReadmePolicyExampleTests {
    @Test func theQuoteServiceServesQuotes() async throws {
        let service = QuoteService()
        #expect(try await service.current().map(\.symbol) == ["ACME"])
        #expect(try await service.currentOrFailFast().map(\.price) == [12.5])
        let runner = Task { try await service.run() }
        runner.cancel()
        try await runner.value  // returns when cancelled
    }
}
