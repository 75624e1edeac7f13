import AsyncStateTesting
import Testing

@testable import AsyncStateKit

@Suite struct NoOpEventsPublishNothingTests {
    /// Subscribes, applies `noOps`, then a real change: the subscriber's next snapshot after the
    /// current one must be that change, with no duplicate in between.
    func expectNoSnapshot(from state: AsyncState<Int>, during noOps: () async -> Void) async throws {
        var updates = state.updates.makeAsyncIterator()
        let current = try #require(await updates.next())
        await noOps()
        await state.set(42)
        let next = try #require(await updates.next())
        #expect(next.value == 42, "a no-op published \(next) after \(current)")
    }

    @Test func invalidateAndResetOfAnInitialState() async throws {
        let state = AsyncState<Int>(wrappedValue: 0, clock: VirtualClock())
        try await expectNoSnapshot(from: state) {
            await state.invalidate()
            await state.reset()
            await state.cancel()
        }
    }

    @Test func invalidateOfExpiredData() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(1), clock: clock)
        await state.fetch { 1 }
        await clock.advance(by: .seconds(2))
        try await expectNoSnapshot(from: state) { await state.invalidate() }
    }

    @Test func invalidateOfInvalidatedData() async throws {
        let state = AsyncState<Int>(wrappedValue: 0, clock: VirtualClock())
        await state.fetch { 1 }
        await state.invalidate()
        try await expectNoSnapshot(from: state) { await state.invalidate() }
    }

    @Test func invalidateOfAFailure() async throws {
        let state = AsyncState<Int>(wrappedValue: 0, clock: VirtualClock(), failureExpiry: .seconds(5))
        await state.fetch { throw SourceDown() }
        try await expectNoSnapshot(from: state) { await state.invalidate() }
        // It did forget the cached failure: the next value goes to the source.
        await state.invalidate()
        await state.fetch { throw SourceDown() }  // fails again, cached again
        await state.invalidate()
        #expect(try await state.value { 3 } == 3)
    }

    @Test func invalidateDuringAFetchWithNoData() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let caller = clock.task {
            try await state.value {
                try await clock.sleep(for: .seconds(1))
                return 1
            }
        }
        await clock.settle()
        try await expectNoSnapshot(from: state) { await state.invalidate() }
        #expect(try await caller.value == 42)  // the write won; the fetch's result never lands
    }

    @Test func aRealInvalidatePublishesOnce() async throws {
        let state = AsyncState<Int>(wrappedValue: 0, clock: VirtualClock())
        await state.fetch { 1 }
        var updates = state.updates.makeAsyncIterator()
        #expect(await updates.next()?.isExpired == false)
        await state.invalidate()
        #expect(await updates.next()?.isExpired == true)
    }
}

@Suite struct EveryFlightEndIsSeenTests {
    @Test func aBackoffSleepThatThrowsSettlesTheFetchAsAFailure() async throws {
        let state = AsyncState<Int>(
            wrappedValue: 0, clock: ThrowingClock(), retry: .exponential(maxAttempts: 3, initial: .seconds(1)))
        await #expect(throws: ThrowingClock.Broken.self) { try await state.value { throw SourceDown() } }
        #expect(state.phase.error is ThrowingClock.Broken)
        #expect(!state.phase.isLoading)
        #expect(try await state.value { 5 } == 5)  // and it fetches again
    }

    @Test func aBackoffSleepThatThrowsCancellationWithoutCancellingIsACancelledFetch() async throws {
        let state = AsyncState<Int>(
            wrappedValue: 0, clock: ThrowingClock(error: CancellationError()),
            retry: .exponential(maxAttempts: 3, initial: .seconds(1)))
        await #expect(throws: CancellationError.self) { try await state.value { throw SourceDown() } }
        #expect(state.phase.name == "initial")  // back to what it was
    }

    @Test func aTimeoutWhoseSleepThrowsEndsTheWaitAtOnce() async throws {
        let state = AsyncState<Int>(wrappedValue: 0, clock: ThrowingClock(), timeout: .seconds(5))
        let parked = ParkedOperations()
        await #expect(throws: AsyncStateError.timedOut(after: .seconds(5))) {
            try await state.value {
                await parked.park()
            }
        }
        #expect(state.phase.name == "failure")
        parked.resumeAll(returning: 1)
    }

    @Test func anOperationThatThrowsAnythingSettles() async throws {
        struct Odd: Error {}
        let state = AsyncState<Int>(wrappedValue: 0, clock: VirtualClock())
        await #expect(throws: Odd.self) { try await state.value { throw Odd() } }
        #expect(!state.phase.isLoading)
    }
}

@Suite struct AbandonedOperationsTests {
    @Test func atMostTheLimitOfTimedOutOperationsPileUp() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .zero, clock: clock, timeout: .seconds(1))
        let parked = ParkedOperations()
        let starts = LockedValue(0)
        let hanging: @Sendable () async throws -> Int = {
            starts.withLock { $0 += 1 }
            return await parked.park()
        }
        for _ in 0..<AsyncStateLimits.abandonedOperations {
            let caller = clock.task { try await state.value(hanging) }
            await clock.advance(by: .seconds(1))
            await #expect(throws: AsyncStateError.timedOut(after: .seconds(1))) { try await caller.value }
        }
        #expect(starts.withLock { $0 } == AsyncStateLimits.abandonedOperations)
        await #expect(throws: AsyncStateError.tooManyAbandonedOperations(limit: AsyncStateLimits.abandonedOperations)) {
            try await state.value(hanging)
        }
        #expect(starts.withLock { $0 } == AsyncStateLimits.abandonedOperations)  // not started

        // One returns (late, dropped): operations start again.
        parked.resumeFirst(returning: 9)
        await clock.settle()
        #expect(state.wrappedValue == 0)
        #expect(try await state.value { 2 } == 2)
        parked.resumeAll(returning: 1)
        await clock.settle()
    }
}

@Suite struct ReentrancyOfStartedTasksTests {
    @Test func aTaskTheOperationStartedMayUseTheStateOnceTheOperationReturned() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .zero, clock: clock)  // every value fetches
        let later = LockedValue<Task<Int, any Error>?>(nil)
        #expect(
            try await state.value {
                later.withLock {
                    // Started like any `Task {}` (it inherits the operation's task-locals), on the
                    // clock so that the advance below waits for it.
                    $0 = clock.task {
                        try await clock.sleep(for: .seconds(1))  // after this operation has returned
                        return try await state.value { 2 }
                    }
                }
                return 1
            } == 1)
        await clock.advance(by: .seconds(1))
        #expect(try await later.withLock({ $0 })!.value == 2)
    }

    @Test func aTaskTheOperationAwaitsIsStillRefused() async throws {
        let state = AsyncState<Int>(wrappedValue: 0, clock: VirtualClock())
        let inner = LockedValue<(any Error)?>(nil)
        await state.fetch {
            async let nested = state.value { 3 }  // a child task waiting for its parent: refused
            do { _ = try await nested } catch { inner.withLock { $0 = error } }
            return 1
        }
        #expect(inner.withLock { $0 } as? AsyncStateError == .reentrantCall)
    }
}

@Suite struct NegativeCachingTests {
    @Test func aFailureIsAnsweredFromMemoryUntilTheFailureExpiry() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, failureExpiry: .seconds(5))
        let calls = LockedValue(0)
        let load: @Sendable () async throws -> Int = {
            calls.withLock { $0 += 1 }
            throw SourceDown()
        }
        await #expect(throws: SourceDown.self) { try await state.value(load) }
        for _ in 0..<10 { await #expect(throws: SourceDown.self) { try await state.value(load) } }
        await state.fetch(load)  // returns at once too
        #expect(calls.withLock { $0 } == 1)
        await clock.advance(by: .seconds(5))
        await #expect(throws: SourceDown.self) { try await state.value(load) }
        #expect(calls.withLock { $0 } == 2)
    }

    @Test func refreshRetryAndInvalidateBypassIt() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, failureExpiry: .seconds(60))
        await state.fetch { throw SourceDown() }
        await state.refresh { throw SourceDown() }
        #expect(state.snapshot.failureCount == 1)
        await state.retry { 7 }
        #expect(state.wrappedValue == 7)
        await state.refresh { throw SourceDown() }
        await state.invalidate()
        #expect(try await state.value { 8 } == 8)
    }

    @Test func withStaleWhileRevalidateTheStaleValueIsServedWithoutARefresh() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(1), clock: clock, failureExpiry: .seconds(10),
            staleWhileRevalidate: true)
        await state.set(1)
        await clock.advance(by: .seconds(1))
        let calls = LockedValue(0)
        let load: @Sendable () async throws -> Int = {
            calls.withLock { $0 += 1 }
            throw SourceDown()
        }
        #expect(try await state.value(load) == 1)  // stale; the background refresh fails
        await clock.settle()
        #expect(state.phase.name == "failure")
        #expect(try await state.value(load) == 1)  // stale, and no new refresh within the failure expiry
        await clock.settle()
        #expect(calls.withLock { $0 } == 1)
        await clock.advance(by: .seconds(10))
        #expect(try await state.value(load) == 1)
        await clock.settle()
        #expect(calls.withLock { $0 } == 2)
    }
}

@Suite struct FetchWithStaleWhileRevalidateTests {
    @Test func fetchWaitsForTheFetchToSettle() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(1), clock: clock, staleWhileRevalidate: true)
        await state.set(1)
        await clock.advance(by: .seconds(1))
        let fetcher = clock.task {
            await state.fetch {
                try await clock.sleep(for: .seconds(2))
                return 2
            }
            return state.wrappedValue
        }
        await clock.advance(by: .seconds(1))
        #expect(state.phase.isLoading)
        await clock.advance(by: .seconds(1))
        #expect(try await fetcher.value == 2)  // it returned once settled, with the new value
    }
}
