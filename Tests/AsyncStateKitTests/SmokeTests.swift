import AsyncStateKit
import AsyncStateTesting
import Testing

@Suite struct SmokeTests {
    @Test func fetchesOnceThenServesFromMemory() async throws {
        let clock = VirtualClock()
        let source = Source<[Int]>()
        let state = AsyncState<[Int]>(wrappedValue: [], clock: clock)
        let load = source.operation(on: clock, value: [1, 2])
        let caller = clock.task { try await state.value(load) }
        await clock.advance(by: .seconds(1))
        #expect(state.phase.lastUpdated == virtualDate(1))
        #expect(state.wrappedValue == [1, 2])
        #expect(try await caller.value == [1, 2])
        #expect(try await state.value(load) == [1, 2])
        #expect(source.runs == 1)
    }
}
