import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// Data that is not fresh never reads as fresh: invalidated data has expired for every interval, and
/// restored data is stale everywhere until new data arrives.
@Suite struct StalenessTests {
    @Test func invalidatedDataHasExpiredForEveryIntervalEvenIfItHadExpiredBefore() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(10), clock: clock)
        let updates = state.updates
        _ = try await state.value { 1 }
        await clock.advance(by: .seconds(15))
        #expect(state.hasExpired(in: .seconds(10)) && !state.hasExpired(in: .seconds(60)))
        await state.invalidate()
        #expect(state.hasExpired(in: .seconds(60)))
        #expect(state.hasExpired(in: .seconds(3_600)))
        #expect(state.snapshot.isExpired)
        // Nothing a subscriber sees changed: no second copy of the same snapshot.
        var iterator = updates.makeAsyncIterator()
        var phases: [String] = []
        for _ in 0..<3 { phases.append(await iterator.next()!.phase.name) }  // initial, loading, success
        await state.set(2)
        #expect(await iterator.next()?.value == 2)
        #expect(phases == ["initial", "loading", "success"])
    }

    /// Restores `value` into a state with refresh ahead whose refetch (its operation: `refetch`) is
    /// answered `expiry` − `refreshAfter` after the restore at the latest.
    @Test func restoredDataReadsExpiredUnderRefreshAheadAndAFailedRefetchNeverMakesItFresh() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(60), clock: clock, refreshAfter: .seconds(10))
        let saved = AsyncStateArchive(value: 5, phase: .success, lastSuccess: virtualDate(-86_400))  // a day old
        #expect(try await state.restore(saved))
        #expect(state.snapshot.isExpired)
        #expect(state.hasExpired(in: .seconds(3_600)))
        // Answered at once, while one refetch runs; the refetch fails.
        #expect(try await state.value { throw SourceDown() } == 5)
        await clock.advance(by: .zero)
        #expect(state.phase.name == "failure")
        #expect(state.snapshot.isExpired)
        #expect(state.hasExpired(in: .seconds(3_600)))
        // The next caller is answered at once again (the data is still the restored data), and tries
        // once more; a success makes it fresh.
        #expect(try await state.value { 6 } == 5)
        await clock.advance(by: .zero)
        #expect(!state.snapshot.isExpired)
        #expect(try await state.value { 7 } == 6)
    }

    @Test func restoredDataIsAnsweredAtOnceForAsLongAsFreshDataWouldBeBeforeItsRefresh() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(60), clock: clock, refreshAfter: .seconds(10))
        try await state.restore(AsyncStateArchive(value: 5, phase: .success, lastSuccess: nil))
        await clock.advance(by: .seconds(49))
        #expect(try await state.value { throw SourceDown() } == 5)  // within 60 − 10 s: at once
        await clock.advance(by: .zero)
        // An invalidation ends it: the next caller waits for the source.
        await state.invalidate()
        let caller = clock.task { try await state.value { 8 } }
        await clock.advance(by: .zero)
        #expect(try await caller.value == 8)
        // So does the end of the window, 50 s after the restore.
        let late = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(60), clock: clock, refreshAfter: .seconds(10))
        try await late.restore(AsyncStateArchive(value: 5, phase: .success, lastSuccess: nil))
        await clock.advance(by: .seconds(50))
        #expect(try await late.value { 9 } == 9)
    }

    @Test func aFamilysRestoredEntryIsStaleWhetherItIsCompactOrLive() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(60), clock: clock, refreshAfter: .seconds(10))
        #expect(try family.restore([1: AsyncStateArchive(value: 5, phase: .success, lastSuccess: nil)]) == 1)
        #expect(family.snapshot(for: 1)?.isExpired == true)  // compact
        let subscriber = family.updates(for: 1)  // live while it listens
        #expect(family.snapshot(for: 1)?.isExpired == true)
        #expect(try await family.snapshot(for: 1) { _ in throw SourceDown() }.isExpired)
        await clock.advance(by: .zero)
        #expect(family.snapshot(for: 1)?.isExpired == true)
        #expect(family.snapshot(for: 1)?.phase.name == "failure")
        withExtendedLifetime(subscriber) {}

        // A compact restored entry keeps its window: answered at once, then refetched.
        let other = AsyncStateFamily<Int, Int>(expiry: .seconds(60), clock: clock, refreshAfter: .seconds(10))
        try other.restore([1: AsyncStateArchive(value: 5, phase: .success, lastSuccess: nil)])
        #expect(try await other.value(for: 1) { _ in 6 } == 5)
        await clock.advance(by: .zero)
        #expect(other.snapshot(for: 1)?.isExpired == false)
        #expect(try await other.value(for: 1) { _ in 7 } == 6)
    }
}
