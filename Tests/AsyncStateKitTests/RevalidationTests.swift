import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// Conditional refresh: an operation given the value it would replace answers "not modified", which
/// renews the value's freshness without replacing it.
@Suite struct RevalidationTests {
    /// A value with the entity tag its source sent.
    struct Tagged: Sendable, Equatable {
        var body: Int
        var etag: String
    }

    /// A source that answers `304` to a request carrying its current tag, and counts what it sent.
    final class Origin: Sendable {
        private let state = LockedValue(
            (current: Tagged(body: 1, etag: "v1"), full: 0, notModified: 0, seen: [String?]()))

        var full: Int { state.withLock { $0.full } }
        var notModified: Int { state.withLock { $0.notModified } }
        /// The tags the operation was given, in order (`nil`: no value).
        var seen: [String?] { state.withLock { $0.seen } }

        func change(to tagged: Tagged) { state.withLock { $0.current = tagged } }

        func get(ifNoneMatch previous: Tagged?) -> AsyncStateRevalidation<Tagged> {
            state.withLock { state in
                state.seen.append(previous?.etag)
                if previous?.etag == state.current.etag {
                    state.notModified += 1
                    return .notModified
                }
                state.full += 1
                return .modified(state.current)
            }
        }
    }

    @Test func notModifiedKeepsTheValueAndRenewsItsFreshness() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let origin = Origin()
        let state = AsyncState<Tagged>(
            wrappedValue: Tagged(body: 0, etag: ""), expiry: .seconds(10), clock: clock, name: "s", observer: log)
        #expect(
            try await state.value(revalidating: { origin.get(ifNoneMatch: $0) }) == Tagged(body: 1, etag: "v1"))
        let firstSuccess = state.snapshot.lastSuccess
        await clock.advance(by: .seconds(10))
        #expect(state.snapshot.isExpired)
        log.clear()
        #expect(
            try await state.value(revalidating: { origin.get(ifNoneMatch: $0) }) == Tagged(body: 1, etag: "v1"))
        #expect(origin.full == 1 && origin.notModified == 1)
        #expect(origin.seen == [nil, "v1"])
        // Fresh again for a whole expiry, from now; a success dated now; the same value.
        #expect(!state.snapshot.isExpired && state.snapshot.successCount == 2)
        #expect(state.snapshot.lastSuccess != firstSuccess)
        #expect(log.all == ["s started(fetch)", "s succeeded(0.0 seconds, 1 attempts)", "s notModified"])
        await clock.advance(by: .seconds(10) - .nanoseconds(1))
        #expect(!state.snapshot.isExpired)
        await clock.advance(by: .nanoseconds(1))
        #expect(state.snapshot.isExpired)
        // A change at the source: the next revalidation replaces the value.
        origin.change(to: Tagged(body: 2, etag: "v2"))
        #expect(
            try await state.value(revalidating: { origin.get(ifNoneMatch: $0) }) == Tagged(body: 2, etag: "v2"))
    }

    @Test func notModifiedWithNoValueIsAFailure() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        await #expect(throws: AsyncStateError.notModifiedWithoutValue) {
            try await state.value(revalidating: { _ in .notModified })
        }
        guard case .failure(AsyncStateError.notModifiedWithoutValue) = state.phase else {
            Issue.record("expected the failure in the phase, got \(state.phase)")
            return
        }
        // The initial value is not a value to keep: the operation is given nil.
        let given = LockedValue<[Int?]>([])
        _ = try await state.value(revalidating: { previous in
            given.withLock { $0.append(previous) }
            return .modified(4)
        })
        #expect(given.withLock { $0 } == [nil])
    }

    @Test func notModifiedAfterAFailureIsASuccessAgainAndRenewsTheFailSafeAge() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(1), clock: clock, maxStaleAge: .seconds(5))
        await state.set(3)
        await clock.advance(by: .seconds(4))
        #expect(try await state.value { throw SourceDown() } == 3)  // fail-safe, 4 s old
        #expect(state.phase.name == "failure")
        #expect(try await state.value(revalidating: { _ in .notModified }) == 3)
        #expect(state.phase.name == "success" && state.snapshot.lastError is SourceDown)
        await clock.advance(by: .seconds(4))  // 4 s after the revalidation: young enough again
        #expect(try await state.value { throw SourceDown() } == 3)
    }

    @Test func aValueInvalidatedDuringTheRevalidationLandsExpired() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(10), clock: clock)
        await state.set(5)
        await state.invalidate()
        let caller = clock.task {
            try await state.value(revalidating: { _ in
                try await clock.sleep(for: .seconds(1))
                return .notModified
            })
        }
        await clock.settle()
        await state.invalidate()
        await clock.advance(by: .seconds(1))
        #expect(try await caller.value == 5)
        #expect(state.snapshot.isExpired)
    }

    @Test func refreshAndRunRevalidateToo() async throws {
        let clock = VirtualClock()
        let origin = Origin()
        let state = AsyncState<Tagged>(wrappedValue: Tagged(body: 0, etag: ""), expiry: .seconds(100), clock: clock)
        await state.refresh(revalidating: { origin.get(ifNoneMatch: $0) })
        await state.refresh(revalidating: { origin.get(ifNoneMatch: $0) })
        #expect(origin.full == 1 && origin.notModified == 1)
        let poll = clock.task {
            try await state.run(every: .seconds(5), revalidating: { origin.get(ifNoneMatch: $0) })
        }
        await clock.advance(by: .seconds(5))
        await clock.advance(by: .seconds(5))
        poll.cancel()
        try await poll.value
        // The first periodic run found the data fresh; each later one cost the source a 304.
        #expect(origin.full == 1 && origin.notModified == 3)
    }

    @Test func aFamilyKeyIsGivenItsOwnValueAtRestOrLive() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<String, Int>(expiry: .seconds(1), clock: clock)
        let given = LockedValue<[String]>([])
        let operation: AsyncStateFamily<String, Int>.ConditionalOperation = { key, previous in
            given.withLock { $0.append("\(key):\(previous.map(String.init) ?? "nil")") }
            return previous == nil ? .modified(key.count) : .notModified
        }
        #expect(try await family.value(for: "ab", revalidating: operation) == 2)
        await clock.advance(by: .seconds(1))
        #expect(try await family.value(for: "ab", revalidating: operation) == 2)  // compact, then restored
        #expect(family.snapshot(for: "ab")?.isExpired == false)
        await family.refresh(for: "ab", revalidating: operation)
        await #expect(throws: AsyncStateError.notModifiedWithoutValue) {
            try await family.value(for: "c", revalidating: { _, _ in .notModified })
        }
        #expect(given.withLock { $0 } == ["ab:nil", "ab:2", "ab:2"])
    }
}
