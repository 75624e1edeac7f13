import AsyncStateKit
import AsyncStateTesting
import Foundation
import Testing

@Suite struct PhaseTests {
    @Test func goesFromInitialThroughLoadingToSuccessAtTheClocksDate() async throws {
        let clock = VirtualClock()
        let state = AsyncState<[Int]>(wrappedValue: [0], clock: clock)
        let load = Source<[Int]>().operation(on: clock, delay: .seconds(2), value: [1, 2])
        #expect(state.phase.name == "initial")
        #expect(state.phase.lastUpdated == nil)
        await clock.advance(by: .seconds(5))
        let caller = clock.task { await state.fetch(load) }
        await clock.settle()
        #expect(state.phase.isLoading)
        #expect(state.wrappedValue == [0])  // the previous value stays readable while loading
        await clock.advance(by: .seconds(2))
        #expect(state.phase.lastUpdated == virtualDate(7))
        #expect(state.phase.lastUpdated == clock.date)
        #expect(state.wrappedValue == [1, 2])
        try await caller.value
    }

    @Test func aFailureKeepsThePreviousValueAndReportsTheError() async throws {
        let clock = VirtualClock()
        let state = AsyncState<[Int]>(wrappedValue: [], clock: clock)
        await state.set([1])
        let failing = Source<[Int]>().operation(on: clock, value: [9], error: SourceDown(code: 500))
        await clock.advance(by: .seconds(120))  // the set value has expired
        let caller = clock.task { try await state.value(failing) }
        await clock.advance(by: .seconds(1))
        #expect(state.phase.error as? SourceDown == SourceDown(code: 500))
        #expect(state.phase.lastUpdated == nil)
        #expect(state.wrappedValue == [1])
        await #expect(throws: SourceDown(code: 500)) { try await caller.value }
    }

    @Test func anEmptyCollectionIsEmptyNotLoading() async throws {
        let clock = VirtualClock()
        let state = AsyncState<[String]>(wrappedValue: ["seed"], clock: clock)
        let empty = Source<[String]>().operation(on: clock, delay: .zero, value: [])
        #expect(try await state.value(empty) == [])
        #expect(state.phase.name == "empty")
        #expect(state.phase.hasSucceeded)
        #expect(state.wrappedValue == [])
    }

    @Test func nilIsEmptyForAnOptional() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int?>(wrappedValue: 3, clock: clock)
        await state.fetch { nil }
        #expect(state.phase.name == "empty")
        await state.refresh { 4 }
        #expect(state.phase.name == "success")
        #expect(state.wrappedValue == 4)
    }

    @Test func aValueThatIsNeitherCollectionNorOptionalIsNeverEmpty() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        await state.fetch { 0 }
        #expect(state.phase.name == "success")
    }

    @Test func aCustomPredicateOverridesTheDefault() async throws {
        let clock = VirtualClock()
        let zeroIsEmpty = AsyncState<Int>(wrappedValue: 1, clock: clock, isEmpty: { $0 == 0 })
        await zeroIsEmpty.fetch { 0 }
        #expect(zeroIsEmpty.phase.name == "empty")
        let shortIsEmpty = AsyncState<[Int]>(wrappedValue: [], clock: clock, isEmpty: { $0.count < 2 })
        await shortIsEmpty.fetch { [1] }
        #expect(shortIsEmpty.phase.name == "empty")
        let neverEmpty = AsyncState<[Int]>(wrappedValue: [], clock: clock, isEmpty: { _ in false })
        await neverEmpty.fetch { [] }
        #expect(neverEmpty.phase.name == "success")
    }

    @Test func retryReRunsTheLastOperationAfterAFailure() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let attempts = LockedValue(0)
        let flaky: @Sendable () async throws -> Int = {
            let attempt = attempts.withLock {
                $0 += 1
                return $0
            }
            if attempt == 1 { throw SourceDown() }
            return attempt
        }
        await state.fetch(flaky)
        #expect(state.phase.name == "failure")
        await state.retry()  // the state kept no operation: nothing to re-run
        #expect(state.phase.name == "failure")
        await state.retry(flaky)
        #expect(state.phase.name == "success")
        #expect(state.wrappedValue == 2)
        await state.retry(flaky)  // success: nothing to retry
        #expect(attempts.withLock { $0 } == 2)
    }

    @Test func retryReRunsTheOperationAfterAnEmptyAnswer() async throws {
        let clock = VirtualClock()
        let state = AsyncState<[Int]>(wrappedValue: [], clock: clock)
        let answers = LockedValue([[], [4]] as [[Int]])
        let load: @Sendable () async throws -> [Int] = { answers.withLock { $0.removeFirst() } }
        await state.fetch(load)
        #expect(state.phase.name == "empty")
        await state.retry(load)
        #expect(state.wrappedValue == [4])
        #expect(state.phase.name == "success")
    }

    @Test func retryWithNothingToRetryIsANoOp() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 7, clock: clock)
        await state.retry { 1 }
        await state.retry()
        #expect(state.phase.name == "initial")
        #expect(state.wrappedValue == 7)
        await state.set(8)
        await state.retry { 1 }
        #expect(state.phase.name == "success")
        #expect(state.wrappedValue == 8)
    }

    @Test func setWritesAFreshSuccessAndResetGoesBackToTheStart() async throws {
        let clock = VirtualClock()
        let state = AsyncState<[Int]>(wrappedValue: [0], clock: clock)
        await clock.advance(by: .seconds(3))
        await state.set([5])
        #expect(state.wrappedValue == [5])
        #expect(state.phase.lastUpdated == virtualDate(3))
        #expect(!state.hasExpired(in: .seconds(1)))
        await state.fetch { [99] }  // fresh: not run
        #expect(state.wrappedValue == [5])
        await state.reset()
        #expect(state.wrappedValue == [0])
        #expect(state.phase.name == "initial")
        #expect(state.hasExpired(in: .seconds(1_000)))
    }
}
