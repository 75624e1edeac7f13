import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// The fleet when a part of it fails: a holder that died, a source that is down.
@Suite struct FleetOutageTests {
    /// A holder that died keeps its lease (10 s) far past the family's timeout (2 s). A replica that
    /// finds the lease held waits half of its attempt's budget (1 s), then calls its source itself and
    /// answers within the timeout: a slower answer, not a timeout.
    @Test func aLeaseWaitLeavesHalfTheAttemptsBudgetForTheSource() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock, duration: .milliseconds(500))
        let families = (0..<2).map { _ in
            AsyncStateFamily<Int, Int>(
                clock: clock, timeout: .seconds(2),
                secondLevel: AsyncStateSecondLevelOptions(
                    level: level.replica(), namespace: "budget", codec: .json, leaseDuration: .seconds(10)))
        }
        // Its operation never answers: the timeout ends it at 2 s, its lease stays until 10 s.
        let dead = clock.task {
            try await families[0].value(for: 4) { _ in
                try await clock.sleep(for: .seconds(1_000_000))
                return -1
            }
        }
        await clock.advance(by: .milliseconds(100))
        let waiter = clock.task { try await families[1].value(for: 4, source.operation) }
        await clock.advance(to: .init(offset: .milliseconds(1_100) - .nanoseconds(1)))
        #expect(source.calls.isEmpty)
        await clock.advance(by: .nanoseconds(1))
        #expect(source.calls.map(\.at) == [.milliseconds(1_100)])
        await clock.advance(by: .milliseconds(500))
        #expect(try await waiter.value == 41)
        #expect(families[1].secondLevelStatistics?.waitsRunOut == 1)
        await clock.advance(by: .seconds(1))
        await #expect(throws: AsyncStateError.self) { try await dead.value }
    }

    /// Without a timeout the wait is the options' `maximumWait`, as before.
    @Test func withoutATimeoutTheWaitIsTheMaximumWait() {
        let input = AttemptInput<Int>(
            previous: nil, lastSuccess: nil, version: 0, readsTheSource: false, timeoutAt: nil)
        #expect(input.waitEnds(from: .seconds(5), maximumWait: .seconds(3)) == .seconds(8))
        var bounded = input
        bounded.timeoutAt = .seconds(7)
        #expect(bounded.waitEnds(from: .seconds(5), maximumWait: .seconds(3)) == .seconds(6))
        #expect(bounded.waitEnds(from: .seconds(5), maximumWait: .milliseconds(500)) == .milliseconds(5_500))
        bounded.timeoutAt = .seconds(4)  // already past: no wait at all
        #expect(bounded.waitEnds(from: .seconds(5), maximumWait: .seconds(3)) == .seconds(5))
        #expect(input.waitEnds(from: .seconds(5), maximumWait: AsyncStateLimits.maximumDuration) > .seconds(5))
    }
}
