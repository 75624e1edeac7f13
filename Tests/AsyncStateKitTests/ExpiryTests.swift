import AsyncStateKit
import AsyncStateTesting
import Testing

@Suite struct ExpiryTests {
    @Test func freshAtOneHundredNineteenPointNineNineNineSecondsRefetchedAtOneHundredTwenty() async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let load = source.operation(on: clock, delay: .zero, value: 1)
        await state.fetch(load)
        #expect(source.runs == 1)
        await clock.advance(by: .milliseconds(119_999))
        await state.fetch(load)
        #expect(try await state.value(load) == 1)
        #expect(source.runs == 1)
        #expect(!state.hasExpired(in: .seconds(120)))
        await clock.advance(by: .milliseconds(1))
        #expect(state.hasExpired(in: .seconds(120)))
        await state.fetch(load)
        #expect(source.runs == 2)
    }

    @Test func aCustomExpiryIsMeasuredFromArrivalNotFromTheRequest() async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(10), clock: clock)
        let slow = source.operation(on: clock, delay: .seconds(4), value: 1)
        clock.task { await state.fetch(slow) }
        await clock.advance(by: .seconds(4))  // arrived at t = 4
        await clock.advance(by: .seconds(9))  // t = 13: 9 s old
        await state.fetch(slow)
        #expect(source.runs == 1)
        await clock.advance(by: .seconds(1))  // t = 14: 10 s old
        clock.task { await state.fetch(slow) }
        await clock.settle()
        #expect(source.runs == 2)
        await clock.advance(by: .seconds(4))
    }

    @Test func emptyStaysFreshForTheExpiryLikeSuccess() async throws {
        let clock = VirtualClock()
        let source = Source<[Int]>()
        let state = AsyncState<[Int]>(wrappedValue: [], clock: clock)
        let nothing = source.operation(on: clock, delay: .zero, value: [])
        await state.fetch(nothing)
        await clock.advance(by: .seconds(60))
        await state.fetch(nothing)
        #expect(source.runs == 1)
        #expect(state.phase.name == "empty")
    }

    @Test func aFailureIsAlwaysExpired() async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let failing = source.operation(on: clock, delay: .zero, value: 0, error: SourceDown())
        await state.fetch(failing)
        await state.fetch(failing)
        #expect(source.runs == 2)
        #expect(state.hasExpired(in: .seconds(1_000)))
    }

    @Test(arguments: [Duration.zero, .seconds(-1)])
    func zeroOrNegativeExpiryFetchesEveryTimeButStillOneAtATime(_ expiry: Duration) async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: expiry, clock: clock)
        let load = source.operation(on: clock, value: 1)
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<5 { group.addTask { _ = clock.task { await state.fetch(load) } } }
        }
        await clock.advance(by: .seconds(1))
        #expect(source.runs == 1)
        #expect(source.maxInFlight == 1)
        clock.task { await state.fetch(load) }
        await clock.advance(by: .seconds(1))
        #expect(source.runs == 2)
    }

    @Test func invalidateExpiresTheDataAtOnce() async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let load = source.operation(on: clock, delay: .zero, value: 1)
        await state.fetch(load)
        await state.invalidate()
        #expect(state.hasExpired(in: .seconds(120)))
        #expect(state.phase.name == "success")  // the data is still there, just expired
        await state.fetch(load)
        #expect(source.runs == 2)
    }

    @Test func invalidateDuringLoadingMakesTheResultLandExpired() async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let load = source.operation(on: clock, value: 1)
        let caller = clock.task { try await state.value(load) }
        await clock.advance(by: .milliseconds(500))
        await state.invalidate()
        await clock.advance(by: .milliseconds(500))
        #expect(try await caller.value == 1)  // the waiter still gets the answer it asked for
        #expect(state.wrappedValue == 1)
        #expect(state.phase.name == "success")
        #expect(state.hasExpired(in: .seconds(120)))
        clock.task { await state.fetch(load) }
        await clock.advance(by: .seconds(1))
        #expect(source.runs == 2)
    }
}
