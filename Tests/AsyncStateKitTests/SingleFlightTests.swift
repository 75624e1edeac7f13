import AsyncStateKit
import AsyncStateTesting
import Testing

@Suite struct SingleFlightTests {
    @Test func tenThousandConcurrentCallersRunOneOperation() async throws {
        // 10,000 callers settle before the first wake: under ThreadSanitizer, beside the suite's
        // other tests and a busy core, that took longer than the default stall timeout (10 s of
        // real time without a wake) once in CI.
        let clock = VirtualClock(stallTimeout: .seconds(120))
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let load = source.operation(on: clock, value: 42)
        let callers = (0..<10_000).map { _ in clock.task { try await state.value(load) } }
        await clock.advance(by: .seconds(1))
        #expect(source.runs == 1)
        var answers = 0
        for caller in callers where try await caller.value == 42 { answers += 1 }
        #expect(answers == 10_000)
        #expect(state.wrappedValue == 42)
    }

    @Test func joinersGetTheOutcomeOfTheFlightInFlightNotOfTheirOwnOperation() async throws {
        let clock = VirtualClock()
        let first = Source<String>()
        let second = Source<String>()
        let state = AsyncState<String>(wrappedValue: "", clock: clock)
        let a = clock.task { try await state.value(first.operation(on: clock, value: "first")) }
        await clock.settle()
        let b = clock.task { try await state.value(second.operation(on: clock, value: "second")) }
        await clock.advance(by: .seconds(1))
        #expect(try await a.value == "first")
        #expect(try await b.value == "first")
        #expect(second.runs == 0)
    }

    @Test func joinersShareAFailure() async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let failing = source.operation(on: clock, value: 0, error: SourceDown(code: 404))
        let callers = (0..<3).map { _ in clock.task { try await state.value(failing) } }
        await clock.advance(by: .seconds(1))
        for caller in callers {
            await #expect(throws: SourceDown(code: 404)) { try await caller.value }
        }
        #expect(source.runs == 1)
    }

    @Test func refreshStartsANewFlightAndEveryWaiterGetsItsResult() async throws {
        let clock = VirtualClock()
        let old = Source<String>()
        let new = Source<String>()
        let state = AsyncState<String>(wrappedValue: "", clock: clock)
        let early = clock.task { try await state.value(old.operation(on: clock, delay: .seconds(2), value: "old")) }
        await clock.advance(by: .seconds(1))
        let refresher = clock.task { await state.refresh(new.operation(on: clock, delay: .seconds(5), value: "new")) }
        await clock.advance(by: .seconds(1))  // the old operation would have finished now: it was cancelled
        #expect(state.phase.isLoading)
        #expect(state.wrappedValue == "")
        #expect(old.inFlight == 0)
        await clock.advance(by: .seconds(4))
        #expect(try await early.value == "new")  // TanStack/query#471: not the stale promise
        try await refresher.value
        #expect(state.wrappedValue == "new")
        #expect(old.runs == 1)
        #expect(new.runs == 1)
    }

    @Test func refreshRunsEvenWhenFresh() async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        await state.fetch(source.operation(on: clock, delay: .zero, value: 1))
        await state.refresh(source.operation(on: clock, delay: .zero, value: 2))
        #expect(source.runs == 2)
        #expect(state.wrappedValue == 2)
    }
}

@Suite struct GenerationTests {
    @Test func aResultStillInFlightNeverOverwritesAManualSet() async throws {
        // TanStack/query#3579.
        let clock = VirtualClock()
        let source = Source<String>()
        let state = AsyncState<String>(wrappedValue: "", clock: clock)
        let caller = clock.task { try await state.value(source.operation(on: clock, value: "from source")) }
        await clock.advance(by: .milliseconds(500))
        await state.set("written")
        #expect(try await caller.value == "written")  // the waiter gets the newest value at once
        await clock.advance(by: .seconds(5))
        #expect(state.wrappedValue == "written")
        #expect(state.phase.name == "success")
        #expect(source.inFlight == 0)  // its operation was cancelled
        await clock.checkSuspension()
    }

    @Test func anOlderResponseNeverOverwritesANewerOne() async throws {
        // vercel/swr#173: a slow first response arriving after a fast refresh.
        let clock = VirtualClock()
        let slow = Source<String>()
        let fast = Source<String>()
        let state = AsyncState<String>(wrappedValue: "", clock: clock)
        // The slow operation ignores cancellation (it waits on a task that cancelling it does not
        // cancel), so its result really does arrive, late.
        let stubborn: @Sendable () async throws -> String = {
            let late = slow.operation(on: clock, delay: .seconds(10), value: "slow and old")
            return try await clock.task { try await late() }.value
        }
        clock.task { await state.fetch(stubborn) }
        await clock.advance(by: .seconds(1))
        clock.task { await state.refresh(fast.operation(on: clock, delay: .seconds(1), value: "fast and new")) }
        await clock.advance(by: .seconds(1))
        #expect(state.wrappedValue == "fast and new")
        await clock.advance(by: .seconds(20))
        #expect(state.wrappedValue == "fast and new")
        #expect(state.phase.name == "success")
        #expect(slow.runs == 1)
        #expect(slow.inFlight == 0)  // it did run to the end
    }

    @Test func resetDuringAFlightDropsItsResultAndCancelsItsCallers() async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: -1, clock: clock)
        let caller = clock.task { try await state.value(source.operation(on: clock, value: 5)) }
        await clock.advance(by: .milliseconds(500))
        await state.reset()
        await #expect(throws: CancellationError.self) { try await caller.value }
        await clock.advance(by: .seconds(1))
        #expect(state.wrappedValue == -1)
        #expect(state.phase.name == "initial")
    }
}

@Suite struct CancellationTests {
    @Test func aCancelledCallerLeavesAtOnceWhileOthersStillGetTheValue() async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let load = source.operation(on: clock, value: 8)
        let leaver = clock.task { try await state.value(load) }
        let stayer = clock.task { try await state.value(load) }
        await clock.advance(by: .milliseconds(500))
        leaver.cancel()
        await #expect(throws: CancellationError.self) { try await leaver.value }
        #expect(clock.now.offset == .milliseconds(500))  // it left before the operation ended
        #expect(state.phase.isLoading)
        await clock.advance(by: .milliseconds(500))
        #expect(try await stayer.value == 8)
        #expect(source.runs == 1)
    }

    @Test func theOperationIsCancelledWhenItsLastCallerLeaves() async throws {
        // TanStack/query#3045.
        let clock = VirtualClock()
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        await state.set(3)
        await clock.advance(by: .seconds(200))
        let phaseBefore = state.phase
        let caller = clock.task { try await state.value(source.operation(on: clock, value: 8)) }
        await clock.advance(by: .milliseconds(500))
        caller.cancel()
        await #expect(throws: CancellationError.self) { try await caller.value }
        await clock.settle()
        #expect(source.inFlight == 0)
        #expect(clock.pendingSleepers == 0)
        #expect(state.phase.lastUpdated == phaseBefore.lastUpdated)  // back to what it was: not a failure
        #expect(state.wrappedValue == 3)
    }

    @Test func cancelCancelsTheFlightOutrightAndRestoresThePhase() async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let callers = (0..<3).map { _ in clock.task { try await state.value(source.operation(on: clock, value: 8)) } }
        await clock.advance(by: .milliseconds(500))
        await state.cancel()
        for caller in callers {
            await #expect(throws: CancellationError.self) { try await caller.value }
        }
        #expect(state.phase.name == "initial")  // TanStack/query#1126: never stuck, never a failure
        await clock.settle()
        #expect(source.inFlight == 0)
        await clock.checkSuspension()
    }

    @Test func cancelWithNothingInFlightIsANoOp() async {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 1, clock: clock)
        await state.cancel()
        #expect(state.phase.name == "initial")
        #expect(state.wrappedValue == 1)
    }

    @Test func fetchReturnsAtOnceWhenItsCallerIsCancelled() async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let caller = clock.task { await state.fetch(source.operation(on: clock, value: 8)) }
        await clock.advance(by: .milliseconds(100))
        caller.cancel()
        try await caller.value
        #expect(clock.now.offset == .milliseconds(100))
        #expect(state.phase.name == "initial")
    }

    @Test func aCallerCancelledBeforeItCallsStartsNothing() async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let (gate, open) = AsyncStream.makeStream(of: Void.self)
        let caller = clock.task {
            for await _ in gate { break }
            return try await state.value(source.operation(on: clock, value: 8))
        }
        caller.cancel()
        open.yield()
        await #expect(throws: CancellationError.self) { try await caller.value }
        await clock.settle()
        #expect(source.runs == 0)
        #expect(state.phase.name == "initial")
    }

    @Test func anOperationThatThrowsCancellationErrorByItselfIsNotAFailure() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        await state.set(1)
        await state.refresh { throw CancellationError() }
        #expect(state.phase.name == "success")  // restored, not failure, not stuck at loading
        #expect(state.wrappedValue == 1)
        await state.invalidate()
        await #expect(throws: CancellationError.self) {
            try await state.value { throw CancellationError() }
        }
        #expect(state.phase.name == "success")
    }
}

@Suite struct ValueUsingContextTests {
    /// A client the operation needs, with a count of its calls.
    final class Client: Sendable {
        let calls = LockedValue(0)
        func number(_ key: Int) async throws -> Int {
            calls.withLock { $0 += 1 }
            return key * 10
        }
    }

    @Test func theOperationGetsTheContextOnAMissAndDoesNotRunOnAHit() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(10), clock: clock)
        let client = Client()
        #expect(try await state.value(using: (client, 4)) { try await $0.0.number($0.1) } == 40)
        #expect(try await state.value(using: (client, 5)) { try await $0.0.number($0.1) } == 40)  // fresh
        #expect(client.calls.withLock { $0 } == 1)
        await clock.advance(by: .seconds(10))
        #expect(try await state.value(using: (client, 6)) { try await $0.0.number($0.1) } == 60)
        #expect(client.calls.withLock { $0 } == 2)
    }

    @Test func fetchUsingAContextRunsOnlyOnAMiss() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(10), clock: clock)
        let client = Client()
        await state.fetch(using: (client, 2)) { try await $0.0.number($0.1) }
        await state.fetch(using: (client, 3)) { try await $0.0.number($0.1) }  // fresh: nothing runs
        #expect(state.wrappedValue == 20)
        #expect(client.calls.withLock { $0 } == 1)
        await state.fetch(using: client) { _ in throw SourceDown() }  // still fresh: not even called
        await clock.advance(by: .seconds(10))
        await state.fetch(using: client) { _ in throw SourceDown() }
        #expect(state.phase.error is SourceDown)
    }

    @Test func valueAndSnapshotUsingAContextShareSingleFlightAndCancellation() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let source = Source<Int>()
        let load = source.operation(on: clock, value: 3)
        let first = clock.task { try await state.value(load) }
        let second = clock.task { try await state.value(using: 99) { _ in 99 } }  // joins: its operation never runs
        let third = clock.task { try await state.snapshot(using: 98) { _ in 98 } }  // joins too
        let cancelled = clock.task { try await state.snapshot(using: 97) { _ in 97 } }
        await clock.settle()
        cancelled.cancel()
        await #expect(throws: CancellationError.self) { try await cancelled.value }
        await clock.advance(by: .seconds(1))
        #expect(try await first.value == 3)
        #expect(try await second.value == 3)
        #expect(try await third.value.value == 3)
        #expect(source.runs == 1)
        await state.invalidate()
        await #expect(throws: SourceDown.self) { try await state.value(using: SourceDown()) { throw $0 } }
    }

    @Test func snapshotUsingAContextRunsOnlyOnAMissAndPutsAFailureInThePhase() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(10), clock: clock)
        let client = Client()
        let first = try await state.snapshot(using: (client, 4)) { try await $0.0.number($0.1) }
        #expect(first.value == 40)
        #expect(first.phase.lastUpdated != nil)
        let hit = try await state.snapshot(using: (client, 5)) { try await $0.0.number($0.1) }  // fresh: not run
        #expect(hit.value == 40)
        #expect(!hit.isExpired)
        #expect(client.calls.withLock { $0 } == 1)
        await clock.advance(by: .seconds(10))
        let failed = try await state.snapshot(using: client) { _ in throw SourceDown() }  // not thrown
        #expect(failed.phase.error is SourceDown)
        #expect(failed.value == 40)
        #expect(client.calls.withLock { $0 } == 1)
    }
}
