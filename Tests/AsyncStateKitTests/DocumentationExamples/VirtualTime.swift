// swift-format-ignore-file
// Verbatim from README.md and Sources/AsyncStateTesting/AsyncStateTesting.docc/TestingInVirtualTime.md;
// .ci/doc-snippets checks that their blocks still match this file.
import AsyncStateKit
import AsyncStateTesting
import Testing

@Test func refetchesAfterTwoMinutes() async throws {
    let clock = VirtualClock()
    let prices = AsyncState<[Int]>(wrappedValue: [], clock: clock)
    let loads = LoadCounter()
    let load: @Sendable () async throws -> [Int] = {
        await loads.increment()
        try await clock.sleep(for: .seconds(1))  // a slow source, in virtual time
        return [42]
    }

    let caller = clock.task { try await prices.value(load) }
    await clock.advance(by: .seconds(1))
    #expect(try await caller.value == [42])
    #expect(prices.phase.lastUpdated == clock.date)

    await clock.advance(by: .seconds(119))
    #expect(try await prices.value(load) == [42])  // still fresh: no second load
    #expect(await loads.count == 1)

    await clock.advance(by: .seconds(1))  // 120 s old: expired
    clock.task { try await prices.value(load) }
    await clock.advance(by: .seconds(1))
    #expect(await loads.count == 2)
}

actor LoadCounter {
    var count = 0
    func increment() { count += 1 }
}
