import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// The soft timeout (`softTimeout:`): callers of a slow fetch get the value the state holds at the
/// soft timeout's exact instant, and the fetch's late result still lands.
@Suite struct SoftTimeoutTests {
    /// A caller whose answer is recorded when it comes, so that a test checks it at an instant without
    /// awaiting it: a soft timeout that did not fire would otherwise leave the test waiting forever.
    final class Caller: Sendable {
        private let answer = LockedValue<Result<Int, any Error>?>(nil)

        init(on clock: VirtualClock, _ body: @escaping @Sendable () async throws -> Int) {
            clock.task { [answer] in
                do {
                    let value = try await body()
                    answer.withLock { $0 = .success(value) }
                } catch {
                    answer.withLock { $0 = .failure(error) }
                }
            }
        }

        /// The value it got, once the clock has settled; `nil` while it waits (or if it threw).
        func value(settling clock: VirtualClock) async -> Int? {
            await clock.settle()
            return try? answer.withLock { $0 }?.get()
        }

        /// A reader of `state` whose fetch takes `delay` and returns `value`.
        static func reading(
            _ state: AsyncState<Int>, on clock: VirtualClock, delay: Duration, value: Int
        ) -> Caller {
            Caller(on: clock) { try await state.value(Source<Int>().operation(on: clock, delay: delay, value: value)) }
        }

        /// Whether it has an answer, once the clock has settled.
        func isAnswered(settling clock: VirtualClock) async -> Bool {
            await clock.settle()
            return answer.withLock { $0 != nil }
        }
    }

    /// A state that holds 1, expired (set at 0 s, now 1 s, its expiry 1 s), with these options.
    static func holdingExpiredOne(
        on clock: VirtualClock, timeout: Duration? = nil, softTimeout: Duration?, maxStaleAge: Duration? = nil,
        observer: EventLog? = nil
    ) async -> AsyncState<Int> {
        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(1), clock: clock, timeout: timeout, softTimeout: softTimeout,
            maxStaleAge: maxStaleAge, name: "s", observer: observer)
        await state.set(1)
        await clock.advance(by: .seconds(1))
        return state
    }

    @Test func callersGetTheValueAtTheSoftTimeoutAndTheLateResultLands() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let state = await Self.holdingExpiredOne(on: clock, softTimeout: .seconds(2), observer: log)
        log.clear()
        let slow = Source<Int>()
        let operation = slow.operation(on: clock, delay: .seconds(10), value: 5)
        let callers = (0..<3).map { _ in Caller(on: clock) { try await state.value(operation) } }
        await clock.advance(by: .seconds(2) - .nanoseconds(1))
        #expect(state.phase.isLoading)
        for caller in callers { #expect(await !caller.isAnswered(settling: clock)) }
        await clock.advance(by: .nanoseconds(1))
        for caller in callers { #expect(await caller.value(settling: clock) == 1) }
        #expect(state.phase.isLoading && slow.inFlight == 1)  // the fetch goes on
        // A caller that comes while it runs gets the value at once, as a stale serve; nothing starts.
        #expect(try await state.value(operation) == 1)
        #expect(slow.runs == 1)
        await clock.advance(by: .seconds(8))  // the late result lands, fresh
        #expect(state.wrappedValue == 5 && state.phase.name == "success" && !state.snapshot.isExpired)
        #expect(try await state.value(operation) == 5)
        #expect(
            log.all == [
                "s started(fetch)", "s joined", "s joined", "s softTimeout", "s softTimeout", "s softTimeout",
                "s servedStale", "s succeeded(10.0 seconds, 1 attempts)", "s hit",
            ])
    }

    @Test func withoutAValueCallersWaitForTheResult() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, softTimeout: .seconds(1))
        let caller = clock.task {
            try await state.value(Source<Int>().operation(on: clock, delay: .seconds(5), value: 3))
        }
        await clock.advance(by: .seconds(4))
        #expect(state.phase.isLoading)
        await clock.advance(by: .seconds(1))
        #expect(try await caller.value == 3)
    }

    @Test func withAMaximumStaleAgeOnlyAYoungEnoughValueIsAnswered() async throws {
        let clock = VirtualClock()
        let state = await Self.holdingExpiredOne(on: clock, softTimeout: .seconds(1), maxStaleAge: .seconds(3))
        let young = Caller.reading(state, on: clock, delay: .seconds(5), value: 2)
        await clock.advance(by: .seconds(1))  // the value is 2 s old at the soft timeout
        #expect(await young.value(settling: clock) == 1)
        await clock.advance(by: .seconds(4))  // the late 2 lands at 6 s
        #expect(state.wrappedValue == 2)
        await clock.advance(by: .seconds(2))
        let old = clock.task { try await state.value(Source<Int>().operation(on: clock, delay: .seconds(5), value: 3)) }
        await clock.advance(by: .seconds(1))  // 3 s old at 9 s, as old as the maximum: the caller waits
        #expect(state.phase.isLoading)
        await clock.advance(by: .seconds(4))
        #expect(try await old.value == 3)
    }

    @Test func aSoftTimeoutNotShorterThanTheTimeoutIsOff() async throws {
        for soft in [Duration.seconds(2), .seconds(3), .zero, .seconds(-1)] {
            let clock = VirtualClock()
            let state = await Self.holdingExpiredOne(on: clock, timeout: .seconds(2), softTimeout: soft)
            let caller = Caller.reading(state, on: clock, delay: .seconds(9), value: 2)
            await clock.advance(by: .seconds(2) - .nanoseconds(1))
            #expect(await !caller.isAnswered(settling: clock), "soft timeout \(soft)")
            await clock.advance(by: .nanoseconds(1))  // the hard timeout, first
            #expect(await caller.isAnswered(settling: clock))
            #expect(await caller.value(settling: clock) == nil)  // answered with the timeout's error
        }
    }

    @Test func aShorterSoftTimeoutAnswersAndTheHardTimeoutStillEndsTheAttempt() async throws {
        let clock = VirtualClock()
        let state = await Self.holdingExpiredOne(on: clock, timeout: .seconds(3), softTimeout: .seconds(1))
        let caller = Caller.reading(state, on: clock, delay: .seconds(9), value: 2)
        await clock.advance(by: .seconds(1))
        #expect(await caller.value(settling: clock) == 1)
        await clock.advance(by: .seconds(2))  // the attempt times out in the background
        guard case .failure(AsyncStateError.timedOut) = state.phase else {
            Issue.record("expected a timed-out failure, got \(state.phase)")
            return
        }
        #expect(state.wrappedValue == 1)
    }

    @Test func refreshAndAFamilyKey() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(1), clock: clock, softTimeout: .seconds(1))
        await state.set(1)
        // `refresh` asks for new data: it waits for it.
        let refresher = clock.task {
            await state.refresh(Source<Int>().operation(on: clock, delay: .seconds(4), value: 2))
        }
        await clock.advance(by: .seconds(3))
        #expect(state.phase.isLoading)
        await clock.advance(by: .seconds(1))
        try await refresher.value
        #expect(state.wrappedValue == 2)

        let family = AsyncStateFamily<String, Int>(expiry: .seconds(1), clock: clock, softTimeout: .seconds(1))
        family.set(7, for: "k")
        await clock.advance(by: .seconds(1))
        let caller = Caller(on: clock) {
            try await family.value(for: "k") { _ in
                try await clock.sleep(for: .seconds(5))
                return 8
            }
        }
        await clock.advance(by: .seconds(1))
        #expect(await caller.value(settling: clock) == 7)
        await clock.advance(by: .seconds(4))
        #expect(family["k"] == 8)
    }

    @Test func aHugeSoftTimeoutOnARealClockNeitherTrapsNorWaits() async throws {
        let state = AsyncState<Int>(wrappedValue: 0, softTimeout: .seconds(Int64.max))
        #expect(try await state.value { 1 } == 1)
        await state.invalidate()
        #expect(try await state.value { 2 } == 2)
    }

    @Test func theFlightEndingCancelsTheSoftTimer() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, softTimeout: .seconds(5))
        let caller = clock.task {
            try await state.value(Source<Int>().operation(on: clock, delay: .seconds(1), value: 2))
        }
        await clock.advance(by: .seconds(1))
        #expect(try await caller.value == 2)
        await clock.settle()
        #expect(clock.pendingSleepers == 0)
    }

    @Test func aReaderThatJoinsARefreshIsReleasedAtItsSoftTimeoutAndTheRefresherWaits() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let state = await Self.holdingExpiredOne(on: clock, softTimeout: .seconds(2), observer: log)
        let refresher = Caller(on: clock) {
            await state.refresh(Source<Int>().operation(on: clock, delay: .seconds(5), value: 2))
            return -1
        }
        await clock.advance(by: .seconds(1))
        let reader = Caller(on: clock) { try await state.value { 9 } }  // joins the refresh at 1 s
        await clock.advance(by: .seconds(1) - .nanoseconds(1))
        #expect(await !reader.isAnswered(settling: clock))
        await clock.advance(by: .nanoseconds(1))  // the refresh's soft timeout, 2 s after its start
        #expect(await reader.value(settling: clock) == 1)
        #expect(await !refresher.isAnswered(settling: clock))
        await clock.advance(by: .seconds(3))
        #expect(await refresher.value(settling: clock) == -1)
        #expect(state.wrappedValue == 2)
        #expect(log.all.filter { $0 == "s softTimeout" }.count == 1)
    }

    @Test func aPeriodicRunsReadersAreReleasedToo() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(1), clock: clock, softTimeout: .seconds(1))
        await state.set(1)
        let runs = Source<Int>()
        let loop = clock.task {
            try await state.run(every: .seconds(10), runs.operation(on: clock, delay: .seconds(4), value: 3))
        }
        await clock.advance(by: .seconds(10))  // the second run starts, whatever the freshness
        let reader = Caller(on: clock) { try await state.value { 9 } }
        await clock.advance(by: .seconds(1))
        #expect(await reader.value(settling: clock) == 1)
        loop.cancel()
        _ = try? await loop.value
    }

    /// An owner whose operation captures it, with a soft timeout: a reader is answered at the soft
    /// timeout while the fetch, holding the owner, goes on; the owner is freed once it lands.
    actor SlowOwner {
        @AsyncState var number: Int
        let clock: any Clock<Duration>
        let delay: Duration
        let freed: DeinitFlag

        init(world: World, freed: DeinitFlag) {
            _number = AsyncState(
                wrappedValue: 0, expiry: world.unit, clock: world.clock, softTimeout: world.unit,
                maxStaleAge: world.unit * 100)
            // Long past the soft timeout, so that on a real clock a loaded machine still answers first.
            (clock, delay, self.freed) = (world.clock, world.unit * 25, freed)
        }
        deinit { freed.set() }

        func prime() async { await $number.set(1) }
        func load() async throws -> Int {
            try await clock.sleep(for: delay)
            return 2
        }
        func current() async throws -> Int { try await $number.value { try await self.load() } }
    }

    @Test(arguments: World.Kind.allCases)
    func anOwnerIsFreedOnceTheFetchGoingOnPastTheSoftTimeoutLands(_ kind: World.Kind) async throws {
        let world = World(kind: kind)
        let freed = DeinitFlag()
        var owner: SlowOwner? = SlowOwner(world: world, freed: freed)
        await owner!.prime()
        await world.pass(1)  // expired
        let caller = world.task { [owner] in try await owner!.current() }
        await world.pass(1)  // the soft timeout: answered with 1, the fetch goes on
        let answer = try await caller.value
        owner = nil
        if kind == .virtual {
            #expect(answer == 1)
            #expect(!freed.isSet)  // the fetch in flight holds it
        } else {
            // On a real clock the soft timeout's timer is a task: on a saturated pool (the whole
            // suite on two cores) it may run only after the fetch has landed. Either way, no leak.
            #expect(answer == 1 || answer == 2)
        }
        await world.pass(25)
        #expect(await world.eventually { freed.isSet }, "\(kind)")
    }
}
