import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// Fail-safe (`maxStaleAge:`): a failure is answered with the last good value while that value is
/// younger than the maximum stale age, at the exact instants of virtual time.
@Suite struct FailSafeTests {
    /// An operation that fails at once, counting its runs.
    static func failing(_ calls: LockedValue<Int>) -> @Sendable () async throws -> Int {
        {
            calls.withLock { $0 += 1 }
            throw SourceDown()
        }
    }

    @Test func aFailedFetchAnswersTheLastGoodValueUntilTheMaximumStaleAgeExactly() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(1), clock: clock, maxStaleAge: .seconds(10), name: "s", observer: log)
        #expect(try await state.value { 1 } == 1)  // arrives at 0 s
        let calls = LockedValue(0)
        await clock.advance(by: .seconds(10) - .nanoseconds(1))
        log.clear()
        #expect(try await state.value(Self.failing(calls)) == 1)
        // The phase is the failure and the value stale: fail-safe answered, the state did not succeed.
        #expect(state.phase.name == "failure")
        #expect(state.snapshot.isExpired && state.snapshot.hasValue && state.wrappedValue == 1)
        #expect(state.snapshot.lastError is SourceDown)
        #expect(
            log.all == ["s started(fetch)", "s failed(SourceDown, 0.0 seconds, 1 attempts)", "s failSafe(SourceDown)"])
        // At exactly the maximum the value is as old as allowed, no younger: the error is thrown.
        await clock.advance(by: .nanoseconds(1))
        await #expect(throws: SourceDown.self) { try await state.value(Self.failing(calls)) }
        #expect(calls.withLock { $0 } == 2)
    }

    @Test func everyWaiterOfTheFailedFlightGetsTheValueAndEachIsReported() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(1), clock: clock, maxStaleAge: .seconds(60), name: "s", observer: log)
        await state.set(7)
        await clock.advance(by: .seconds(5))
        let slow = Source<Int>().operation(on: clock, delay: .seconds(2), value: 0, error: SourceDown())
        let callers = (0..<3).map { _ in clock.task { try await state.value(slow) } }
        await clock.advance(by: .seconds(2))
        for caller in callers { #expect(try await caller.value == 7) }
        #expect(log.all.filter { $0.hasPrefix("s failSafe") }.count == 3)
        #expect(state.phase.name == "failure")
    }

    @Test func theFailureExpiryThrottlesTheSourceWhileTheValueIsAnsweredAndThenTheErrorIsThrown() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(1), clock: clock, failureExpiry: .seconds(5), maxStaleAge: .seconds(8),
            name: "s", observer: log)
        #expect(try await state.value { 1 } == 1)
        await clock.advance(by: .seconds(2))
        let calls = LockedValue(0)
        #expect(try await state.value(Self.failing(calls)) == 1)  // fails at 2 s, cached until 7 s
        log.clear()
        for _ in 0..<5 { #expect(try await state.value(Self.failing(calls)) == 1) }
        #expect(calls.withLock { $0 } == 1)
        #expect(log.all == Array(repeating: "s failSafe(SourceDown)", count: 5))
        // At 7 s the cached failure has expired: the source is called again, and fails; the value (7 s
        // old) is still answered. At 8 s it is as old as the maximum: the cached error is thrown.
        await clock.advance(by: .seconds(5))
        #expect(try await state.value(Self.failing(calls)) == 1)
        #expect(calls.withLock { $0 } == 2)
        await clock.advance(by: .seconds(1))
        await #expect(throws: SourceDown.self) { try await state.value(Self.failing(calls)) }
        #expect(calls.withLock { $0 } == 2)
    }

    @Test func aTimedOutFetchIsAnsweredAtItsTimeout() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(1), clock: clock, timeout: .seconds(3), maxStaleAge: .seconds(60))
        await state.set(4)
        await clock.advance(by: .seconds(1))
        let hung = Source<Int>().operation(on: clock, delay: .seconds(100), value: 5)
        let caller = clock.task { try await state.value(hung) }
        await clock.advance(by: .seconds(3) - .nanoseconds(1))
        #expect(state.phase.isLoading)
        await clock.advance(by: .nanoseconds(1))
        #expect(try await caller.value == 4)
        guard case .failure(AsyncStateError.timedOut) = state.phase else {
            Issue.record("expected a timed-out failure, got \(state.phase)")
            return
        }
    }

    @Test func retriesRunFirstAndOnlyTheFinalFailureIsAnswered() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(1), clock: clock,
            retry: .exponential(maxAttempts: 3, initial: .seconds(1), jitter: .none), maxStaleAge: .seconds(60))
        await state.set(4)
        await clock.advance(by: .seconds(1))
        let calls = LockedValue(0)
        let caller = clock.task { try await state.value(Self.failing(calls)) }
        await clock.settle()
        #expect(state.phase.isLoading && calls.withLock { $0 } == 1)
        await clock.advance(by: .seconds(1))  // second attempt
        await clock.advance(by: .seconds(2))  // third, the last
        #expect(try await caller.value == 4)
        #expect(calls.withLock { $0 } == 3)
    }

    @Test func withoutAGoodValueTheErrorIsThrown() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, maxStaleAge: .seconds(60))
        let calls = LockedValue(0)
        await #expect(throws: SourceDown.self) { try await state.value(Self.failing(calls)) }
        #expect(try await state.value { 3 } == 3)
        await state.reset()  // forgets the value: nothing to answer with
        await #expect(throws: SourceDown.self) { try await state.value(Self.failing(calls)) }
        // A cancelled fetch is not a failure: the caller is cancelled, not answered.
        let parked = ParkedOperations()
        #expect(try await state.value { 5 } == 5)
        await state.invalidate()
        let caller = clock.task { try await state.value { await parked.park() } }
        await clock.settle()
        caller.cancel()
        await #expect(throws: CancellationError.self) { try await caller.value }
        parked.resumeAll(returning: 0)
    }

    @Test func offForAZeroOrNegativeAgeAndClampedWhenHuge() async throws {
        for age in [Duration.zero, .seconds(-5)] {
            let state = AsyncState<Int>(wrappedValue: 0, clock: VirtualClock(), maxStaleAge: age)
            await state.set(1)
            await state.invalidate()
            await #expect(throws: SourceDown.self) { try await state.value { throw SourceDown() } }
        }
        // On a real clock, an age past every limit neither traps nor expires.
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .zero, maxStaleAge: .seconds(Int64.max))
        await state.set(1)
        #expect(try await state.value { throw SourceDown() } == 1)
    }

    @Test func anInvalidatedValueKeepsItsAge() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(60), clock: clock, maxStaleAge: .seconds(5))
        await state.set(2)
        await clock.advance(by: .seconds(4))
        await state.invalidate()  // expired now, still 4 s old
        #expect(try await state.value { throw SourceDown() } == 2)
        await clock.advance(by: .seconds(1))
        await #expect(throws: SourceDown.self) { try await state.value { throw SourceDown() } }
    }

    @Test func aRestoredValueIsAsOldAsItsLastSuccess() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, maxStaleAge: .seconds(10))
        let archive = AsyncStateArchive(value: 9, phase: .success, lastSuccess: clock.date.addingTimeInterval(-6))
        #expect(try await state.restore(archive))
        await clock.advance(by: .seconds(4) - .nanoseconds(1))
        #expect(try await state.value { throw SourceDown() } == 9)
        await clock.advance(by: .nanoseconds(1))
        await #expect(throws: SourceDown.self) { try await state.value { throw SourceDown() } }
        // An archive with no date gives the value no age: fail-safe does not answer with it.
        let undated = AsyncState<Int>(wrappedValue: 0, clock: clock, maxStaleAge: .seconds(10))
        #expect(try await undated.restore(AsyncStateArchive(value: 9, phase: .success, lastSuccess: nil)))
        await #expect(throws: SourceDown.self) { try await undated.value { throw SourceDown() } }
    }

    @Test func aFamilyEntryAnswersFromRestAndWhileLive() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let family = AsyncStateFamily<String, Int>(
            expiry: .seconds(1), clock: clock, failureExpiry: .seconds(2), maxStaleAge: .seconds(10), name: "f",
            observer: log)
        #expect(try await family.value(for: "a") { _ in 1 } == 1)
        #expect(try await family.value(for: "b") { _ in 2 } == 2)
        await clock.advance(by: .seconds(3))
        family.invalidate("b")  // a compact entry, invalidated: its age is kept at rest
        log.clear()
        // Both entries rest compact between uses; each fetch restores a store from the compact data.
        #expect(try await family.value(for: "a") { _ in throw SourceDown() } == 1)
        #expect(try await family.value(for: "b") { _ in throw SourceDown() } == 2)
        #expect(try await family.value(for: "a") { _ in 5 } == 1)  // the cached failure, answered
        #expect(family.snapshot(for: "a")?.phase.name == "failure")
        #expect(
            log.all.filter { $0.contains("failSafe") } == [
                "f a failSafe(SourceDown)", "f b failSafe(SourceDown)", "f a failSafe(SourceDown)",
            ])
        await clock.advance(by: .seconds(7))
        await #expect(throws: SourceDown.self) { try await family.value(for: "b") { _ in throw SourceDown() } }
        // A key never loaded has nothing to answer with.
        await #expect(throws: SourceDown.self) { try await family.value(for: "c") { _ in throw SourceDown() } }
    }

    @Test func aPagedStateAnswersItsListWhenTheFirstPageFailsButNotWhenLoadMoreFails() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 30)
        let pages = AsyncPagedState<Int, Int>(expiry: .seconds(1), clock: clock, maxStaleAge: .seconds(60))
        let operation = listing.operation(on: clock, delay: .zero)
        #expect(try await pages.items(operation) == Array(0..<10))
        await clock.advance(by: .seconds(2))
        listing.fail(at: nil)
        #expect(try await pages.items(operation) == Array(0..<10))
        listing.heal()
        listing.fail(at: 10)
        await #expect(throws: SourceDown.self) { try await pages.loadMore(operation) }
    }

    @Test func theArticlesExampleAnswers() async throws {
        #expect(try await RatesService().current().euro == 1.08)
    }

    @Test func instantsAndDurationsAreKeptInWholeNanosecondsRoundedDown() {
        #expect(WholeNanoseconds.nanoseconds(nil) == .min && WholeNanoseconds(nil).duration == nil)
        #expect(WholeNanoseconds.nanoseconds(.seconds(3) + .nanoseconds(7)) == 3_000_000_007)
        #expect(WholeNanoseconds.nanoseconds(.nanoseconds(-1)) == -1)
        #expect(WholeNanoseconds.nanoseconds(.zero - .milliseconds(1_500)) == -1_500_000_000)
        // A fraction of a nanosecond rounds down, below zero too: the instant is never later.
        #expect(
            WholeNanoseconds.nanoseconds(.nanoseconds(5) + .init(secondsComponent: 0, attosecondsComponent: 1)) == 5)
        #expect(WholeNanoseconds.nanoseconds(.zero - .init(secondsComponent: 0, attosecondsComponent: 1)) == -1)
        // Past Int64's range: clamped, never the sentinel.
        #expect(WholeNanoseconds.nanoseconds(.seconds(Int64.max)) == .max)
        #expect(WholeNanoseconds.nanoseconds(.zero - .seconds(Int64.max)) == .min + 1)
        #expect(WholeNanoseconds(.seconds(3) + .nanoseconds(7)).duration == .seconds(3) + .nanoseconds(7))
    }
}
