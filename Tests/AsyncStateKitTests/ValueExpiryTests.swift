import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// Expiry from the value (``AsyncStateExpiring``): a value that says how long it stays fresh is fresh
/// for exactly that long, at the exact instants of virtual time, for states, families and paged
/// states alike.
@Suite struct ValueExpiryTests {
    /// A value that carries its own lifetime, as a response carries its `Cache-Control: max-age`.
    struct Quote: Sendable, Equatable, AsyncStateExpiring {
        var price: Int
        var lifetime: Duration?
        var timeToLive: Duration? { lifetime }
    }

    /// An operation that answers `quote` with `price` set to its run count.
    static func counting(_ calls: LockedValue<Int>, lifetime: Duration?) -> @Sendable () async throws -> Quote {
        {
            let call = calls.withLock {
                $0 += 1
                return $0
            }
            return Quote(price: call, lifetime: lifetime)
        }
    }

    @Test(arguments: [Duration.seconds(5), .seconds(300)])
    func aValueIsFreshForItsOwnLifetimeExactly(_ lifetime: Duration) async throws {
        let clock = VirtualClock()
        let state = AsyncState<Quote>(wrappedValue: Quote(price: 0), expiry: .seconds(60), clock: clock)
        let calls = LockedValue(0)
        let operation = Self.counting(calls, lifetime: lifetime)
        #expect(try await state.value(operation).price == 1)
        await clock.advance(by: lifetime - .nanoseconds(1))
        #expect(try await state.value(operation).price == 1)
        #expect(state.snapshot.isExpired == false)
        await clock.advance(by: .nanoseconds(1))
        #expect(state.snapshot.isExpired)
        #expect(try await state.value(operation).price == 2)
        #expect(calls.withLock { $0 } == 2)
    }

    @Test func aValueWithoutALifetimeUsesTheDeclaredExpiry() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Quote>(wrappedValue: Quote(price: 0), expiry: .seconds(60), clock: clock)
        let calls = LockedValue(0)
        let operation = Self.counting(calls, lifetime: nil)
        _ = try await state.value(operation)
        await clock.advance(by: .seconds(60) - .nanoseconds(1))
        #expect(try await state.value(operation).price == 1)
        await clock.advance(by: .nanoseconds(1))
        #expect(try await state.value(operation).price == 2)
    }

    @Test(arguments: [Duration.zero, .seconds(-5), .seconds(Int64.min)])
    func aLifetimeOfZeroOrLessIsNeverFresh(_ lifetime: Duration) async throws {
        let clock = VirtualClock()
        let state = AsyncState<Quote>(wrappedValue: Quote(price: 0), expiry: .seconds(60), clock: clock)
        let calls = LockedValue(0)
        let operation = Self.counting(calls, lifetime: lifetime)
        for call in 1...3 { #expect(try await state.value(operation).price == call) }
        #expect(state.snapshot.isExpired)
    }

    @Test func aHugeLifetimeIsTheMaximumDurationAndNeverTraps() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Quote>(wrappedValue: Quote(price: 0), expiry: .seconds(60), clock: clock)
        let calls = LockedValue(0)
        let operation = Self.counting(calls, lifetime: .seconds(Int64.max))
        _ = try await state.value(operation)
        await clock.advance(by: AsyncStateLimits.maximumDuration - .nanoseconds(1))
        #expect(try await state.value(operation).price == 1)
        await clock.advance(by: .nanoseconds(1))
        #expect(try await state.value(operation).price == 2)
    }

    @Test func aHugeLifetimeOnTheContinuousClockIsAnsweredAsAHit() async throws {
        let state = AsyncState<Quote>(wrappedValue: Quote(price: 0), expiry: .seconds(60), refreshAfter: .seconds(30))
        let calls = LockedValue(0)
        let operation = Self.counting(calls, lifetime: .seconds(Int64.max))
        _ = try await state.value(operation)
        for _ in 0..<3 { #expect(try await state.value(operation).price == 1) }
        #expect(state.snapshot.isExpired == false)
        #expect(state.hasExpired(in: .seconds(3600)) == false)
        #expect(calls.withLock { $0 } == 1)
    }

    @Test func aDeclaredExpiryOfZeroStillLetsAValueBeFreshForItsOwnLifetime() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Quote>(wrappedValue: Quote(price: 0), expiry: .zero, clock: clock)
        let calls = LockedValue(0)
        _ = try await state.value(Self.counting(calls, lifetime: .seconds(5)))
        await clock.advance(by: .seconds(5) - .nanoseconds(1))
        #expect(try await state.value(Self.counting(calls, lifetime: .seconds(5))).price == 1)
        await clock.advance(by: .nanoseconds(1))
        #expect(try await state.value(Self.counting(calls, lifetime: nil)).price == 2)
        // Without a lifetime of its own, the value is as fresh as the declared expiry says: never.
        #expect(try await state.value(Self.counting(calls, lifetime: nil)).price == 3)
    }

    @Test func aSetValueIsFreshForItsOwnLifetimeAsAFetchedOneIs() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Quote>(wrappedValue: Quote(price: 0), expiry: .seconds(60), clock: clock)
        await state.set(Quote(price: 7, lifetime: .seconds(2)))
        await clock.advance(by: .seconds(2) - .nanoseconds(1))
        #expect(state.snapshot.isExpired == false)
        await clock.advance(by: .nanoseconds(1))
        #expect(state.snapshot.isExpired)
    }

    @Test func hasExpiredInMeasuresTheAgeNotTheLifetime() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Quote>(wrappedValue: Quote(price: 0), expiry: .seconds(60), clock: clock)
        await clock.advance(by: .seconds(1))
        await state.set(Quote(price: 1, lifetime: .seconds(300)))
        await clock.advance(by: .seconds(10) - .nanoseconds(1))
        #expect(state.hasExpired(in: .seconds(10)) == false)
        await clock.advance(by: .nanoseconds(1))
        #expect(state.hasExpired(in: .seconds(10)))
        #expect(state.snapshot.isExpired == false)
        // A short-lived value: expired by its lifetime, though younger than the interval asked about.
        await state.set(Quote(price: 2, lifetime: .seconds(1)))
        await clock.advance(by: .seconds(1))
        #expect(state.snapshot.isExpired)
        #expect(state.hasExpired(in: .seconds(10)) == false)
        await state.invalidate()
        #expect(state.hasExpired(in: .seconds(10)))
    }

    /// Calls `value` and lets the clock settle without moving time: the answer if the call returned
    /// at once, `nil` if it waits.
    func immediatePrice(
        _ state: AsyncState<Quote>, _ clock: VirtualClock, _ operation: @escaping @Sendable () async throws -> Quote
    ) async -> Int? {
        let answer = LockedValue<Int?>(nil)
        clock.task {
            let value = try await state.value(operation)
            answer.withLock { $0 = value.price }
        }
        await clock.advance(by: .zero)
        return answer.withLock { $0 }
    }

    @Test func refreshAheadStartsTheSameLeadBeforeAValuesOwnExpiry() async throws {
        let clock = VirtualClock()
        // A lead of 10 s: the declared data would be refreshed ahead from 50 s of its 60 s.
        let state = AsyncState<Quote>(
            wrappedValue: Quote(price: 0), expiry: .seconds(60), clock: clock, refreshAfter: .seconds(50))
        let calls = LockedValue(0)
        let operation = Self.counting(calls, lifetime: .seconds(100))
        _ = try await state.value(operation)
        await clock.advance(by: .seconds(90) - .nanoseconds(1))
        #expect(await immediatePrice(state, clock, operation) == 1)
        #expect(calls.withLock { $0 } == 1)
        await clock.advance(by: .nanoseconds(1))
        #expect(await immediatePrice(state, clock, operation) == 1)  // answered at once, refreshed behind
        #expect(calls.withLock { $0 } == 2)
        #expect(state.wrappedValue.price == 2)
    }

    @Test(arguments: [Duration.seconds(8), .seconds(10)])
    func aValueThatLivesNoLongerThanTheLeadIsNotRefreshedAheadButExpires(_ lifetime: Duration) async throws {
        let clock = VirtualClock()
        let state = AsyncState<Quote>(
            wrappedValue: Quote(price: 0), expiry: .seconds(60), clock: clock, refreshAfter: .seconds(50))
        let calls = LockedValue(0)
        let operation = Self.counting(calls, lifetime: lifetime)
        _ = try await state.value(operation)
        for _ in 0..<3 { #expect(await immediatePrice(state, clock, operation) == 1) }
        await clock.advance(by: lifetime - .nanoseconds(1))
        #expect(await immediatePrice(state, clock, operation) == 1)
        #expect(calls.withLock { $0 } == 1)
        await clock.advance(by: .nanoseconds(1))
        #expect(try await state.value(operation).price == 2)
    }

    @Test func notModifiedRenewsTheKeptValuesOwnLifetime() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Quote>(wrappedValue: Quote(price: 0), expiry: .seconds(60), clock: clock)
        _ = try await state.value { Quote(price: 1, lifetime: .seconds(5)) }
        await clock.advance(by: .seconds(5))
        #expect(try await state.value(revalidating: { _ in .notModified }).price == 1)
        await clock.advance(by: .seconds(5) - .nanoseconds(1))
        #expect(state.snapshot.isExpired == false)
        await clock.advance(by: .nanoseconds(1))
        #expect(state.snapshot.isExpired)
    }

    @Test func anOptionalStateUsesTheWrappedValuesLifetime() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Quote?>(wrappedValue: nil, expiry: .seconds(60), clock: clock)
        _ = try await state.value { Quote(price: 1, lifetime: .seconds(3)) }
        await clock.advance(by: .seconds(3))
        #expect(state.snapshot.isExpired)
        _ = try await state.value { Quote?.none }  // `nil` has no lifetime: the declared expiry
        await clock.advance(by: .seconds(59))
        #expect(state.snapshot.isExpired == false)
    }

    @Test func familyEntriesKeepTheirOwnLifetimesLiveAndAtRest() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<String, Quote>(expiry: .seconds(60), clock: clock)
        let calls = LockedValue(0)
        let lifetimes: [String: Duration] = ["short": .seconds(5), "long": .seconds(300)]
        let operation: @Sendable (String) async throws -> Quote = { key in
            calls.withLock { $0 += 1 }
            return Quote(price: calls.withLock { $0 }, lifetime: lifetimes[key])
        }
        _ = try await family.value(for: "short", operation)
        _ = try await family.value(for: "long", operation)
        _ = try await family.value(for: "declared", operation)
        family.set(Quote(price: 9, lifetime: .seconds(2)), for: "set")
        // Each entry rests compact between the calls: its lifetime is read from its packed record.
        await clock.advance(by: .seconds(2))
        #expect(family.snapshot(for: "set")?.isExpired == true)
        await clock.advance(by: .seconds(3) - .nanoseconds(1))
        #expect(try await family.value(for: "short", operation).price == 1)
        await clock.advance(by: .nanoseconds(1))
        #expect(family.snapshot(for: "short")?.isExpired == true)
        #expect(try await family.value(for: "short", operation).price == 4)
        await clock.advance(by: .seconds(55))  // 60 s
        #expect(family.snapshot(for: "declared")?.isExpired == true)
        #expect(family.snapshot(for: "long")?.isExpired == false)
        #expect(try await family.value(for: "long", operation).price == 2)
        await clock.advance(by: .seconds(240))  // 300 s
        #expect(try await family.value(for: "long", operation).price == 5)
    }

    @Test func aFamilyHitOnALiveEntryUsesItsLifetime() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<String, Quote>(expiry: .seconds(60), clock: clock)
        let updates = family.updates(for: "k")  // a subscriber keeps the entry live
        defer { withExtendedLifetime(updates) {} }
        _ = try await family.value(for: "k") { _ in Quote(price: 1, lifetime: .seconds(4)) }
        await clock.advance(by: .seconds(4) - .nanoseconds(1))
        #expect(try await family.value(for: "k") { _ in Quote(price: 2) }.price == 1)
        await clock.advance(by: .nanoseconds(1))
        #expect(try await family.value(for: "k") { _ in Quote(price: 2) }.price == 2)
    }

    @Test func aPagedListingIsFreshForItsFirstPagesLifetimeAndAnAppendKeepsIt() async throws {
        let clock = VirtualClock()
        let pages = AsyncPagedState<Int, Int>(expiry: .seconds(60), clock: clock)
        let loads = LockedValue(0)
        let operation: @Sendable (Int?) async throws -> AsyncPage<Int, Int> = { cursor in
            loads.withLock { $0 += 1 }
            let start = cursor ?? 0
            // Only the first page's lifetime counts: a later page's is ignored.
            return AsyncPage(items: [start], next: start + 1, timeToLive: cursor == nil ? .seconds(5) : .seconds(1))
        }
        #expect(try await pages.items(operation) == [0])
        await clock.advance(by: .seconds(3))
        try await pages.loadMore(operation)
        #expect(pages.wrappedValue == [0, 1])
        await clock.advance(by: .seconds(2) - .nanoseconds(1))
        #expect(try await pages.items(operation) == [0, 1])
        #expect(loads.withLock { $0 } == 2)
        await clock.advance(by: .nanoseconds(1))
        #expect(try await pages.items(operation) == [0])
        #expect(loads.withLock { $0 } == 3)
    }
}

@Suite struct ValueExpiryArticleTests {
    @Test func theArticlesExampleAnswers() async throws {
        #expect(try await NewsService().current().titles == ["Rain at noon"])
    }
}
