// These tests run on ContinuousClock and the global concurrent executor on purpose: a serial, virtual
// test world hides races. They use short real sleeps and assert nothing about timing beyond order.
import AsyncStateKit
import Testing

@Suite struct ContinuousClockTests {
    @Test func aThousandConcurrentCallersOnTheGlobalExecutorRunOneOperation() async throws {
        let state = AsyncState<Int>(wrappedValue: 0)
        let runs = LockedValue(0)
        let load: @Sendable () async throws -> Int = {
            runs.withLock { $0 += 1 }
            try await ContinuousClock().sleep(for: .milliseconds(20))
            return 7
        }
        let total = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<1_000 { group.addTask { try await state.value(load) } }
            return try await group.reduce(0, +)
        }
        #expect(total == 7_000)
        #expect(runs.withLock { $0 } == 1)
        #expect(state.phase.lastUpdated != nil)
    }

    @Test func cancelledCallersRacingTheResultNeverHangAndNeverFail() async throws {
        for _ in 0..<50 {
            let state = AsyncState<Int>(wrappedValue: 0)
            let load: @Sendable () async throws -> Int = {
                try await ContinuousClock().sleep(for: .milliseconds(2))
                return 1
            }
            let callers = (0..<20).map { _ in Task { try await state.value(load) } }
            try await ContinuousClock().sleep(for: .milliseconds(1))
            for caller in callers.prefix(10) { caller.cancel() }
            for caller in callers {
                switch await caller.result {
                case .success(let value): #expect(value == 1)
                case .failure(let error): #expect(error is CancellationError)
                }
            }
            #expect(!state.phase.isLoading)
            #expect(state.phase.error == nil)
        }
    }

    @Test func expiryOnTheContinuousClock() async throws {
        let expiry = Duration.milliseconds(50)
        let state = AsyncState<Int>(wrappedValue: 0, expiry: expiry)
        let runs = LockedValue(0)
        let load: @Sendable () async throws -> Int = {
            runs.withLock {
                $0 += 1
                return $0
            }
        }
        let clock = ContinuousClock()
        let arrived = clock.now
        #expect(try await state.value(load) == 1)
        let second = try await state.value(load)
        // Real time on a loaded machine: the second call is a hit only if it came within the expiry.
        if arrived.duration(to: clock.now) < expiry { #expect(second == 1) }
        try await clock.sleep(for: expiry + .milliseconds(10))
        #expect(state.hasExpired(in: expiry))
        let third = try await state.value(load)
        #expect(third == runs.withLock { $0 })  // fetched anew
        #expect(third > 1)
    }

    @Test func setRacingAFetchAlwaysEndsWithTheWrite() async throws {
        for _ in 0..<50 {
            let state = AsyncState<String>(wrappedValue: "")
            let fetcher = Task {
                try await state.value {
                    try await ContinuousClock().sleep(for: .milliseconds(1))
                    return "fetched"
                }
            }
            await state.set("written")
            _ = await fetcher.result
            #expect(state.wrappedValue == "written")
        }
    }
}
