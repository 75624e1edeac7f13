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

    /// A replica with nothing of its own whose source is down answers the second level's entry while
    /// it is younger than `maxStaleAge`, counted from its source's answer on the replica that fetched
    /// it: fail-safe from the second level. Past that age, or without fail-safe, the failure.
    @Test func aReplicaWithNothingFallsBackOnTheSecondLevelWithinTheMaximumStaleAge() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let isDown = LockedValue(false)
        let calls = LockedValue(0)
        let source: @Sendable (Int) async throws -> Int = { key in
            calls.withLock { $0 += 1 }
            try await clock.sleep(for: .milliseconds(100))
            if isDown.withLock({ $0 }) { throw SourceDown() }
            return key * 10
        }
        func replica(maxStaleAge: Duration?) -> AsyncStateFamily<Int, Int> {
            AsyncStateFamily<Int, Int>(
                expiry: .seconds(60), clock: clock, maxStaleAge: maxStaleAge,
                secondLevel: AsyncStateSecondLevelOptions(level: level.replica(), namespace: "safe", codec: .json))
        }
        let first = replica(maxStaleAge: .seconds(600))
        let loaded = clock.task { try await first.value(for: 5, source) }
        await clock.advance(by: .milliseconds(100))
        #expect(try await loaded.value == 50)
        isDown.withLock { $0 = true }

        // Five minutes later a new replica misses key 5 and its source fails: the entry, expired
        // for four minutes but five minutes old, is the answer; the phase says the failure.
        await clock.advance(to: .init(offset: .seconds(300)))
        let late = replica(maxStaleAge: .seconds(600))
        let outage = clock.task { try await late.value(for: 5, source) }
        await clock.advance(by: .milliseconds(100))
        #expect(try await outage.value == 50)
        let snapshot = try #require(late.snapshot(for: 5))
        #expect(snapshot.value == 50 && snapshot.isExpired)
        #expect(snapshot.lastSuccess == clock.startDate + 0.1)
        guard case .failure = snapshot.phase else {
            Issue.record("the phase is \(snapshot.phase), not the failure")
            return
        }
        // It keeps that value as its own last good one: the next caller is answered from it too,
        // until it is ten minutes old (counted from 0.1 s).
        let again = clock.task { try await late.value(for: 5, source) }
        await clock.advance(by: .milliseconds(100))
        #expect(try await again.value == 50)
        await clock.advance(to: .init(offset: .milliseconds(600_100)))
        let tooOld = clock.task { try await late.value(for: 5, source) }
        await clock.advance(by: .milliseconds(100))
        await #expect(throws: SourceDown.self) { try await tooOld.value }

        // A replica without fail-safe gets the failure; so does one whose entry is too old already.
        let strict = replica(maxStaleAge: nil)
        let refused = clock.task { try await strict.value(for: 5, source) }
        await clock.advance(by: .milliseconds(100))
        await #expect(throws: SourceDown.self) { try await refused.value }
        #expect(strict.snapshot(for: 5)?.hasValue != true)
        let tooLate = replica(maxStaleAge: .seconds(600))
        let stale = clock.task { try await tooLate.value(for: 5, source) }
        await clock.advance(by: .milliseconds(100))
        await #expect(throws: SourceDown.self) { try await stale.value }
    }

    /// A source that hangs until the attempt's own timeout ends it (the source is down, its calls
    /// never answer): a replica with nothing of its own answers the second level's entry, as it
    /// does when the source fails — the entry it read before the call is the flight's fallback
    /// however the flight ends. So does a single state. Past the maximum stale age, the timeout.
    @Test func aSourceThatTimesOutFallsBackOnTheSecondLevelToo() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let hangs = LockedValue(false)
        let source: @Sendable (Int) async throws -> Int = { key in
            if hangs.withLock({ $0 }) { try await clock.sleep(for: .seconds(3_600)) }
            return key * 10
        }
        func replica() -> AsyncStateFamily<Int, Int> {
            AsyncStateFamily<Int, Int>(
                expiry: .seconds(60), clock: clock, retry: .exponential(maxAttempts: 2, initial: .seconds(1)),
                timeout: .seconds(2), maxStaleAge: .seconds(600),
                secondLevel: AsyncStateSecondLevelOptions(level: level.replica(), namespace: "hangs", codec: .json))
        }
        #expect(try await replica().value(for: 5, source) == 50)
        hangs.withLock { $0 = true }
        await clock.advance(to: .init(offset: .seconds(300)))
        let late = replica()
        let outage = clock.task { try await late.value(for: 5, source) }
        // Two attempts of 2 s each, a second apart: the flight fails for good at 5 s.
        await clock.advance(by: .seconds(5))
        #expect(try await outage.value == 50)
        let snapshot = try #require(late.snapshot(for: 5))
        #expect(snapshot.value == 50 && snapshot.isExpired)
        guard case .failure(let error) = snapshot.phase, case .timedOut? = error as? AsyncStateError else {
            Issue.record("the phase is \(snapshot.phase), not the timeout")
            return
        }

        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(60), clock: clock, timeout: .seconds(2), maxStaleAge: .seconds(600),
            secondLevel: AsyncStateSecondLevelOptions(level: level.replica(), namespace: "hangs-state", codec: .json))
        level.overwrite(
            AsyncStateStoredEntry(
                payload: try AsyncStateCodec<Int>.json.encode(7), succeededAt: clock.startDate + 200,
                freshUntil: clock.startDate + 260, version: 1),
            for: "hangs-state:")
        let single = clock.task { try await state.value { try await source(0) } }
        await clock.advance(by: .seconds(2))
        #expect(try await single.value == 7)

        // Ten minutes after the entry's source answered, it is too old: the timeout.
        await clock.advance(to: .init(offset: .seconds(601)))
        let tooLate = replica()
        let stale = clock.task { try await tooLate.value(for: 5, source) }
        await clock.advance(by: .seconds(5))
        await #expect(throws: AsyncStateError.self) { try await stale.value }
    }

    /// A replica whose own value is younger than the second level's keeps its own; one that heard of
    /// an invalidation newer than the entry does not take the entry back (versions decide).
    @Test func theFallbackNeverReplacesAYoungerValueNorUndoesAnInvalidation() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let isDown = LockedValue(false)
        let source: @Sendable (Int) async throws -> Int = { key in
            if isDown.withLock({ $0 }) { throw SourceDown() }
            return key * 10 + Int(clock.now.offset.components.seconds)
        }
        let families = (0..<2).map { _ in
            AsyncStateFamily<Int, Int>(
                expiry: .seconds(60), clock: clock, maxStaleAge: .seconds(600),
                secondLevel: AsyncStateSecondLevelOptions(level: level.replica(), namespace: "own", codec: .json))
        }
        #expect(try await families[0].value(for: 1, source) == 10)
        await clock.advance(to: .init(offset: .seconds(100)))
        // Replica 1 loads after the entry expired: the second level now holds its value (100 s).
        #expect(try await families[1].value(for: 1, source) == 110)
        // Replica 0's source fails at 200 s: it answers the second level's value, younger than its own.
        isDown.withLock { $0 = true }
        await clock.advance(to: .init(offset: .seconds(200)))
        #expect(try await families[0].value(for: 1, source) == 110)
        // An entry older than what a replica holds: its own value.
        isDown.withLock { $0 = false }
        await clock.advance(to: .init(offset: .seconds(300)))
        #expect(try await families[1].value(for: 1, source) == 310)
        level.overwrite(
            AsyncStateStoredEntry(
                payload: try AsyncStateCodec<Int>.json.encode(99), succeededAt: clock.startDate + 250,
                freshUntil: .distantPast, version: 1_000),
            for: "own:1")
        isDown.withLock { $0 = true }
        await clock.advance(to: .init(offset: .seconds(400)))
        #expect(try await families[1].value(for: 1, source) == 310)
        // An invalidation newer than the entry, heard while the source is being called: the entry
        // was read before it, and is not answered after it — the replica's own value is, by its own
        // fail-safe.
        level.overwrite(
            AsyncStateStoredEntry(
                payload: try AsyncStateCodec<Int>.json.encode(77), succeededAt: clock.startDate + 390,
                freshUntil: .distantPast, version: 1_500),
            for: "own:1")
        families[1].invalidate(1)
        let slow: @Sendable (Int) async throws -> Int = { _ in
            try await clock.sleep(for: .seconds(1))
            throw SourceDown()
        }
        let during = clock.task { try await families[1].value(for: 1, slow) }
        await clock.advance(by: .milliseconds(500))
        families[1].core.invalidate(1, version: 2_000)
        await clock.advance(by: .milliseconds(500))
        #expect(try await during.value == 310)
    }

    /// With writes in the background the holder answers when its source does (10 ms a call to the
    /// second level: a read, a lease, the source's second), not one write later; the entry lands and
    /// the lease is given back after it, and a replica that waited takes the entry: one source call.
    @Test(arguments: [false, true])
    func aHolderThatWritesInTheBackgroundAnswersWhenItsSourceDoes(background: Bool) async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        level.latency = .milliseconds(10)
        let source = KeyedSource(clock: clock, duration: .seconds(1))
        let families = (0..<2).map { _ in
            AsyncStateFamily<Int, Int>(
                clock: clock,
                secondLevel: AsyncStateSecondLevelOptions(
                    level: level.replica(), namespace: "behind", codec: .json, writesInBackground: background))
        }
        let answeredAt = LockedValue<Duration?>(nil)
        let holder = clock.task {
            let value = try await families[0].value(for: 2, source.operation)
            answeredAt.withLock { $0 = clock.now.offset }
            return value
        }
        await clock.advance(by: .milliseconds(5))
        let waiter = clock.task { try await families[1].value(for: 2, source.operation) }
        await clock.advance(by: .seconds(2))
        #expect(try await holder.value == 21)
        #expect(try await waiter.value == 21)
        #expect(answeredAt.withLock { $0 } == (background ? .milliseconds(1_020) : .milliseconds(1_030)))
        #expect(source.calls.count == 1)
        #expect(level.entry(for: "behind:2")?.version == 1)
        #expect(families[0].snapshot(for: 2)?.isExpired == false)
        #expect(families[0].secondLevelStatistics?.loads == 1 && families[1].secondLevelStatistics?.hits == 1)
    }

    /// A write in the background that the second level refuses (the key was invalidated there while
    /// the holder loaded) is counted; the holder's callers have their value, and the invalidation's
    /// message is what makes it stale.
    @Test func aRefusedWriteInTheBackgroundIsCounted() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock, duration: .seconds(1))
        let family = AsyncStateFamily<Int, Int>(
            clock: clock,
            secondLevel: AsyncStateSecondLevelOptions(
                level: level.replica(), namespace: "behind", codec: .json, writesInBackground: true))
        let holder = clock.task { try await family.value(for: 3, source.operation) }
        await clock.advance(by: .milliseconds(500))
        _ = try await level.invalidate("behind:3")
        await clock.advance(by: .seconds(1))
        #expect(try await holder.value == 31)
        #expect(family.secondLevelStatistics?.refusedWrites == 1)
        #expect(level.entry(for: "behind:3")?.version == 2)
        #expect(level.entry(for: "behind:3")?.payload.isEmpty == true)
    }

    /// Twenty keys loaded together through the second level with a jitter of 10 s on a 60 s expiry
    /// expire at spread instants between 50 and 60 s — on the loading replica and on another that
    /// takes them from the second level — and the same ones on every run.
    @Test func keysLoadedTogetherExpireApartAndTheSameEveryRun() async throws {
        func expiries() async throws -> (loader: [Duration], taker: [Duration]) {
            let clock = VirtualClock()
            let level = InMemorySecondLevel(clock: clock)
            let families = (0..<2).map { _ in
                AsyncStateFamily<Int, Int>(
                    expiry: .seconds(60), clock: clock,
                    secondLevel: AsyncStateSecondLevelOptions(
                        level: level.replica(), namespace: "spread", codec: .json, expiryJitter: .seconds(10)))
            }
            for family in families {
                let loads = (0..<20).map { key in clock.task { try await family.value(for: key) { $0 } } }
                await clock.advance(by: .zero)
                for load in loads { _ = try await load.value }
            }
            // The instant each key expires: the first second at which its snapshot says so.
            var found: [[Duration]] = [Array(repeating: .zero, count: 20), Array(repeating: .zero, count: 20)]
            for second in 1...61 {
                await clock.advance(to: .init(offset: .seconds(second)))
                for (index, family) in families.enumerated() {
                    for key in 0..<20 where found[index][key] == .zero && family.snapshot(for: key)?.isExpired == true {
                        found[index][key] = .seconds(second)
                    }
                }
            }
            return (found[0], found[1])
        }
        let first = try await expiries()
        #expect(first.loader == first.taker)
        #expect(first.loader.allSatisfy { $0 >= .seconds(51) && $0 <= .seconds(60) })
        #expect(Set(first.loader).count >= 5)  // spread over the ten seconds, not one instant
        let second = try await expiries()
        #expect(second.loader == first.loader)
    }

    /// The jitter never makes a value expire at once, nor lengthens a lifetime.
    @Test func theJitterStaysWithinTheLifetime() {
        for version in UInt64(1)...1_000 {
            let short = SecondLevelLoader<Int>.jittered(.seconds(1), by: .seconds(10), key: "k", version: version)
            #expect(short > .zero && short <= .seconds(1))
            let long = SecondLevelLoader<Int>.jittered(.seconds(60), by: .seconds(10), key: "k", version: version)
            #expect(long >= .seconds(50) && long <= .seconds(60))
        }
        #expect(SecondLevelLoader<Int>.jittered(.seconds(60), by: .zero, key: "k", version: 1) == .seconds(60))
    }
}
