import AsyncStateTesting
import Testing

@testable import AsyncStateKit

/// `refreshAfter:`: a hit on data old enough, but still fresh, returns at once and starts one
/// background refresh; nothing is served past its expiry.
@Suite struct RefreshAheadTests {
    /// A source whose attempts take `duration`, fail when their number is in `failing`, and answer their
    /// number otherwise.
    final class Source: Sendable {
        let clock: VirtualClock
        let duration: Duration
        let failing: Set<Int>
        private let starts = LockedValue<[Duration]>([])

        init(clock: VirtualClock, duration: Duration = .seconds(1), failing: Set<Int> = []) {
            self.clock = clock
            self.duration = duration
            self.failing = failing
        }

        var instants: [Duration] { starts.withLock { $0 } }

        var operation: @Sendable () async throws -> Int {
            { [self] in
                let attempt = starts.withLock {
                    $0.append(clock.now.offset)
                    return $0.count
                }
                try await clock.sleep(for: duration)
                if failing.contains(attempt) { throw SourceDown() }
                return attempt
            }
        }
    }

    /// A state with a 10 s expiry refreshed ahead at 6 s, whose first fetch (0–1 s) has landed.
    func loaded(_ source: Source, failureExpiry: Duration = .zero) async throws -> AsyncState<Int> {
        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(10), clock: source.clock, failureExpiry: failureExpiry,
            refreshAfter: .seconds(6))
        let first = source.clock.task { try await state.value(source.operation) }
        await source.clock.advance(by: source.duration)
        #expect(try await first.value == 1)
        return state
    }

    /// Calls `value` and lets the clock settle without moving time: the answer if the call returned
    /// at once, `nil` if it waits (it then finishes when time moves on).
    func immediateValue(_ state: AsyncState<Int>, _ source: Source) async -> Int? {
        let answer = LockedValue<Int?>(nil)
        source.clock.task {
            let value = try await state.value(source.operation)
            answer.withLock { $0 = value }
        }
        await source.clock.advance(by: .zero)
        return answer.withLock { $0 }
    }

    @Test func aHitPastTheRefreshAgeReturnsAtOnceAndStartsOneRefresh() async throws {
        let clock = VirtualClock()
        let source = Source(clock: clock)
        let state = try await loaded(source)  // fresh since 1 s
        await clock.advance(to: .init(offset: .seconds(6.9)))
        #expect(await immediateValue(state, source) == 1)  // 5.9 s old: a plain hit
        #expect(source.instants == [.s(0)])

        await clock.advance(to: .init(offset: .seconds(7)))  // 6 s old: due
        for _ in 0..<3 { #expect(await immediateValue(state, source) == 1) }
        await state.fetch(source.operation)  // returns at once too
        #expect(source.instants == [.s(0), .s(7)])  // one refresh for all four
        #expect(state.phase.isLoading)
        #expect(state.snapshot.isExpired == false)

        await clock.advance(by: .seconds(1))  // the refresh lands at 8 s: fresh from then
        #expect(state.wrappedValue == 2)
        #expect(state.phase.name == "success")
        await clock.advance(to: .init(offset: .seconds(13.9)))
        #expect(await immediateValue(state, source) == 2)
        #expect(source.instants == [.s(0), .s(7)])
        await clock.advance(to: .init(offset: .seconds(14)))
        #expect(await immediateValue(state, source) == 2)
        #expect(source.instants == [.s(0), .s(7), .s(14)])
        await clock.advance(by: .seconds(1))
        await clock.checkSuspension()
    }

    @Test func noDataIsServedPastItsExpiry() async throws {
        let clock = VirtualClock()
        let source = Source(clock: clock, duration: .seconds(5))
        let state = try await loaded(source)  // 0–5 s: fresh since 5 s, until 15 s
        await clock.advance(to: .init(offset: .seconds(11)))
        #expect(await immediateValue(state, source) == 1)  // starts a refresh, 11–16 s
        await clock.advance(to: .init(offset: .seconds(15)))  // the data expires; the refresh still runs
        let late = clock.task { () -> (Int, Duration) in
            let value = try await state.value(source.operation)
            return (value, clock.now.offset)
        }
        await clock.advance(by: .zero)
        #expect(state.snapshot.isExpired)
        await clock.advance(by: .seconds(1))
        let (value, at) = try await late.value
        #expect(value == 2 && at == .s(16))  // it waited for the refresh: never the expired 1
        #expect(source.instants == [.s(0), .s(11)])
    }

    @Test func aFailedRefreshKeepsTheDataFreshUntilItsExpiryAndTheNextHitTriesAgain() async throws {
        let clock = VirtualClock()
        let source = Source(clock: clock, failing: [2])
        let state = try await loaded(source)  // fresh since 1 s, until 11 s
        await clock.advance(to: .init(offset: .seconds(7)))
        #expect(await immediateValue(state, source) == 1)  // refresh 7–8 s, which fails
        await clock.advance(by: .seconds(1))
        #expect(state.phase.name == "failure")
        #expect(state.snapshot.isExpired == false)
        #expect(state.wrappedValue == 1)

        await clock.advance(to: .init(offset: .seconds(9)))
        #expect(await immediateValue(state, source) == 1)  // still fresh: served, and retried
        #expect(source.instants == [.s(0), .s(7), .s(9)])
        await clock.advance(by: .seconds(1))
        #expect(state.wrappedValue == 3)
        #expect(state.phase.name == "success")
    }

    @Test func theFailureExpiryThrottlesRetriesOfAFailedRefresh() async throws {
        let clock = VirtualClock()
        let source = Source(clock: clock, failing: [2])
        let state = try await loaded(source, failureExpiry: .seconds(2))
        await clock.advance(to: .init(offset: .seconds(7)))
        #expect(await immediateValue(state, source) == 1)  // refresh 7–8 s, which fails
        await clock.advance(to: .init(offset: .seconds(9.9)))  // within 2 s of the failure
        #expect(await immediateValue(state, source) == 1)
        #expect(source.instants == [.s(0), .s(7)])
        await clock.advance(to: .init(offset: .seconds(10)))
        #expect(await immediateValue(state, source) == 1)
        #expect(source.instants == [.s(0), .s(7), .s(10)])
        await clock.advance(by: .seconds(1))
    }

    @Test func anInvalidationDuringTheRefreshIsNotLostAndTheNextCallerFetches() async throws {
        let clock = VirtualClock()
        let source = Source(clock: clock)
        let state = try await loaded(source)
        await clock.advance(to: .init(offset: .seconds(7)))
        #expect(await immediateValue(state, source) == 1)  // refresh 7–8 s
        await state.invalidate()
        await clock.advance(by: .seconds(1))
        #expect(state.wrappedValue == 2)
        #expect(state.snapshot.isExpired)  // it landed already expired
        let next = clock.task { try await state.value(source.operation) }
        await clock.advance(by: .seconds(1))
        #expect(try await next.value == 3)
        #expect(source.instants == [.s(0), .s(7), .s(8)])
    }

    @Test func anExplicitRefreshTakesOverTheRefreshAhead() async throws {
        let clock = VirtualClock()
        let source = Source(clock: clock, duration: .seconds(2))
        let state = try await loaded(source)  // 0–2 s, fresh since 2 s
        await clock.advance(to: .init(offset: .seconds(8)))
        #expect(await immediateValue(state, source) == 1)  // refresh ahead 8–10 s
        let refresh = clock.task { await state.refresh(source.operation) }  // replaces it, 8–10 s
        await clock.advance(by: .seconds(2))
        try await refresh.value
        #expect(source.instants == [.s(0), .s(8), .s(8)])
        #expect(state.wrappedValue == 3)  // the replaced attempt's result was dropped
    }

    @Test(arguments: [Duration.zero, .seconds(-1), .seconds(10), .seconds(11)])
    func aRefreshAgeOfZeroOrAtLeastTheExpiryIsOff(_ refreshAfter: Duration) async throws {
        let clock = VirtualClock()
        let source = Source(clock: clock)
        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(10), clock: clock, refreshAfter: refreshAfter)
        let first = clock.task { try await state.value(source.operation) }
        await clock.advance(by: .seconds(1))
        _ = try await first.value
        for second in [1.5, 5, 10.9] {
            await clock.advance(to: .init(offset: .s(second)))
            #expect(await immediateValue(state, source) == 1)
        }
        #expect(source.instants == [.s(0)])
    }
}
