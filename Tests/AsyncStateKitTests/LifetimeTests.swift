import AsyncStateTesting
import Testing

@testable import AsyncStateKit

@Suite struct LifetimeTests {
    @Test func anIdleStateIsFreedWithItsLastCopy() async throws {
        let clock = VirtualClock()
        weak var store: AsyncStateStore<Int>?
        do {
            let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
            let copy = state
            store = copy.store
            await state.fetch { 1 }
            _ = state.updates  // a subscriber nobody reads does not keep it alive either
        }
        #expect(store == nil)
    }

    @Test func aStateDroppedMidFlightIsFreedWhenItsOperationEnds() async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        weak var store: AsyncStateStore<Int>?
        var caller: Task<Int, any Error>?
        do {
            let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
            store = state.store
            let load = source.operation(on: clock, value: 4)
            caller = clock.task { try await state.value(load) }
            await clock.advance(by: .milliseconds(500))
        }
        #expect(store != nil)  // the operation's task still holds it
        await clock.advance(by: .milliseconds(500))
        #expect(try await caller?.value == 4)
        caller = nil
        await clock.settle()
        #expect(store == nil)
        #expect(clock.pendingSleepers == 0)
    }

    @Test func aCancelledFlightLeavesNoTaskOrSleeperBehind() async throws {
        let clock = VirtualClock()
        weak var store: AsyncStateStore<Int>?
        do {
            let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
            store = state.store
            let source = Source<Int>()
            let caller = clock.task {
                try await state.value(source.operation(on: clock, delay: .seconds(3_600), value: 1))
            }
            await clock.advance(by: .seconds(1))
            caller.cancel()
            _ = await caller.result
        }
        await clock.settle()
        #expect(clock.pendingSleepers == 0)
        #expect(store == nil)
    }
}
