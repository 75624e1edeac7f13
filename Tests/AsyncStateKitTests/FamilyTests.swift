import AsyncStateTesting
import Testing

@testable import AsyncStateKit

/// A keyed source: records each call (key, instant), takes `duration`, fails for `failing` keys and
/// answers `key * 10 + call number for that key`.
final class KeyedSource: Sendable {
    let clock: VirtualClock
    let duration: Duration
    let failing: Set<Int>
    private let log = LockedValue<[(key: Int, at: Duration)]>([])
    private let batches = LockedValue<[[Int]]>([])

    init(clock: VirtualClock, duration: Duration = .seconds(1), failing: Set<Int> = []) {
        self.clock = clock
        self.duration = duration
        self.failing = failing
    }

    /// The calls, in order.
    var calls: [(key: Int, at: Duration)] { log.withLock { $0 } }
    /// The keys called, in order.
    var keys: [Int] { calls.map(\.key) }
    /// The key lists of the batch operation's runs.
    var batchRuns: [[Int]] { batches.withLock { $0 } }

    func load(_ key: Int) async throws -> Int {
        let count = log.withLock { log in
            log.append((key, clock.now.offset))
            return log.count { $0.key == key }
        }
        try await clock.sleep(for: duration)
        if failing.contains(key) { throw SourceDown() }
        return key * 10 + count
    }

    var operation: @Sendable (Int) async throws -> Int { { [self] in try await load($0) } }

    /// A batch operation: one call for all keys (recorded once); leaves out `omitting`.
    func batch(omitting: Set<Int> = [], failing: Bool = false) -> @Sendable ([Int]) async throws -> [Int: Int] {
        { [self] keys in
            batches.withLock { $0.append(keys) }
            try await clock.sleep(for: duration)
            if failing { throw SourceDown() }
            var values: [Int: Int] = [:]
            for key in keys where !omitting.contains(key) { values[key] = key * 100 }
            return values
        }
    }
}

/// Records what a family's `onRemoval` is told.
final class RemovalLog: Sendable {
    private let log = LockedValue<[String]>([])
    var entries: [String] { log.withLock { $0 } }
    var callback: @Sendable (Int, Int?, AsyncStateFamilyRemovalReason) -> Void {
        { [self] key, value, reason in log.withLock { $0.append("\(key)=\(value.map(String.init) ?? "nil") \(reason)") }
        }
    }
}

@Suite struct FamilyTests {
    @Test func eachKeyHasOneFlightAndItsOwnValue() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock)
        let family = AsyncStateFamily<Int, Int>(clock: clock)
        let callers = (0..<20).map { index in clock.task { try await family.value(for: index % 2, source.operation) } }
        await clock.advance(by: .seconds(1))
        var answers: [Int] = []
        for caller in callers { answers.append(try await caller.value) }
        #expect(answers == (0..<20).map { $0 % 2 == 0 ? 1 : 11 })
        #expect(source.keys.sorted() == [0, 1])
        #expect(family.count == 2)
        #expect(family.wrappedValue == [0: 1, 1: 11])
        #expect(family[1] == 11)
        #expect(family[2] == nil)
    }

    @Test func eachKeyExpiresOnItsOwn() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock, duration: .zero)
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(60), clock: clock)
        #expect(try await family.value(for: 1, source.operation) == 11)
        await clock.advance(by: .seconds(30))
        #expect(try await family.value(for: 2, source.operation) == 21)
        await clock.advance(by: .seconds(30))  // 1 is 60 s old: expired; 2 is 30 s old
        #expect(family.snapshot(for: 1)?.isExpired == true)
        #expect(family.snapshot(for: 2)?.isExpired == false)
        #expect(try await family.value(for: 2, source.operation) == 21)
        let refetch = clock.task { try await family.value(for: 1, source.operation) }
        await clock.advance(by: .zero)
        #expect(try await refetch.value == 12)
        #expect(source.calls.map(\.at) == [.s(0), .s(30), .s(60)])
    }

    @Test func eachKeyHasItsOwnPhaseAndError() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock, failing: [2])
        let family = AsyncStateFamily<Int, Int>(clock: clock)
        let ok = clock.task { try await family.value(for: 1, source.operation) }
        let failing = clock.task { try await family.value(for: 2, source.operation) }
        await clock.advance(by: .seconds(1))
        #expect(try await ok.value == 11)
        await #expect(throws: SourceDown.self) { try await failing.value }
        #expect(family.snapshot(for: 1)?.phase.name == "success")
        #expect(family.snapshot(for: 2)?.phase.error is SourceDown)
        #expect(family.snapshot(for: 2)?.value == .some(nil))  // no value yet
        #expect(family.snapshot(for: 3) == nil)
        #expect(family.snapshots.count == 2)
    }

    /// Each key's store draws its flights' jitter seeds from a sequence of its own: no two keys'
    /// sequences share a draw. (Seeded one step of that sequence apart, as they once were, each key's
    /// sequence was the one before it, one draw later: one key's second flight backed off exactly as
    /// the next key's first.)
    @Test func eachKeysRetriesDrawFromASequenceOfItsOwn() async throws {
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(60), capacity: 100, clock: VirtualClock())
        let draws = LockedValue<[Int: [UInt64]]>([:])
        for key in 1...3 {
            _ = try await family.value(for: key) { key in
                if case .live(let store) = family.core.peek(key) {
                    var seeds = store.core.withLock { $0.machine.seeds }
                    draws.withLock { $0[key] = (0..<4).map { _ in seeds.next() } }
                }
                return key
            }
        }
        let sequences = draws.withLock { $0 }
        #expect(sequences.count == 3)
        #expect(Set(sequences.values.joined()).count == 12)
    }

    @Test func aNewKeyBeyondTheCapacityEvictsTheLessPopularEntry() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock, duration: .zero)
        let removals = RemovalLog()
        let family = AsyncStateFamily<Int, Int>(capacity: 3, clock: clock, onRemoval: removals.callback)
        for key in [1, 2, 3] { _ = try await family.value(for: key, source.operation) }
        for _ in 0..<3 { _ = try await family.value(for: 1, source.operation) }  // 1 is popular
        _ = family[2]  // a peek is not a use
        for key in [4, 5, 6] { _ = try await family.value(for: key, source.operation) }
        #expect(family.count == 3)
        #expect(removals.entries.count == 3)
        #expect(family[1] == 11)  // never the popular one
        #expect(removals.entries.allSatisfy { $0.hasSuffix("evicted") })
    }

    /// Also with the shard's lock spread (as contention spreads it): the hits then reach the policy
    /// through the stripes' buffers.
    @Test(arguments: [false, true])
    func aScanOfKeysUsedOnceDoesNotFlushTheKeysUsedAgain(spread: Bool) async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock, duration: .zero)
        let family = AsyncStateFamily<Int, Int>(capacity: 100, clock: clock)
        if spread { for shard in family.core.shards { shard.spreadNow() } }
        let hot = Array(0..<50)
        for _ in 0..<4 {
            for key in hot { _ = try await family.value(for: key, source.operation) }
        }
        for key in 1_000..<1_500 { _ = try await family.value(for: key, source.operation) }  // a scan
        #expect(family.count == 100)
        // An LRU would hold the last 100 scanned keys and none of the hot ones. The frequency sketch
        // is approximate (keys' hashes differ from run to run, and may collide), so a hot key or
        // two may lose a comparison.
        let kept = hot.filter { family[$0] != nil }.count
        #expect(kept >= 45, "\(kept) of 50 hot keys kept")
        let loadsBefore = source.keys.count
        for key in hot { _ = try await family.value(for: key, source.operation) }
        #expect(source.keys.count - loadsBefore <= 5)  // the hot set is served from memory
    }

    /// A one-time scan of ten times the capacity, after a hot set of half the capacity was used four
    /// times, costs at most a tenth of the hot set — in one shard, and across four.
    @Test(arguments: [100, 2_000])
    func aScanOfTenTimesTheCapacityCostsAtMostATenthOfTheHotSet(capacity: Int) async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock, duration: .zero)
        let family = AsyncStateFamily<Int, Int>(capacity: capacity, clock: clock)
        let hot = Array(0..<(capacity / 2))
        for _ in 0..<4 {
            for key in hot { _ = try await family.value(for: key, source.operation) }
        }
        let scan = 1_000_000..<(1_000_000 + 10 * capacity)
        for key in scan { _ = try await family.value(for: key, source.operation) }
        #expect(family.count == capacity)
        let lost = hot.filter { family[$0] == nil }.count
        #expect(lost * 10 <= hot.count, "the scan evicted \(lost) of \(hot.count) hot keys")
    }

    @Test func evictionNeverDropsAnEntryWithAFetchInFlight() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock, duration: .seconds(10))
        let removals = RemovalLog()
        let family = AsyncStateFamily<Int, Int>(capacity: 2, clock: clock, onRemoval: removals.callback)
        let slow = clock.task { try await family.value(for: 1, source.operation) }  // 0–10 s
        await clock.advance(by: .zero)
        family.set(20, for: 2)
        family.set(30, for: 3)  // over capacity: 1 is the oldest but busy, so 2 goes
        #expect(removals.entries == ["2=20 evicted"])
        #expect(family.count == 2)

        let others = [4, 5].map { key in clock.task { try await family.value(for: key, source.operation) } }
        await clock.advance(by: .zero)  // 4 evicts 3; 5 finds only busy entries: over capacity
        #expect(removals.entries == ["2=20 evicted", "3=30 evicted"])
        #expect(family.count == 3)
        await clock.advance(by: .seconds(10))  // all settle: back within capacity
        #expect(try await slow.value == 11)
        for other in others { _ = try await other.value }
        #expect(family.count == 2)
        #expect(removals.entries.count == 3)
    }

    @Test func anIdleEntryIsRemovedAtItsExactDeadline() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock, duration: .zero)
        let removals = RemovalLog()
        let family = AsyncStateFamily<Int, Int>(
            idleExpiry: .seconds(10), clock: clock, onRemoval: removals.callback)
        _ = try await family.value(for: 1, source.operation)  // used at 0
        await clock.advance(by: .seconds(5))
        _ = try await family.value(for: 2, source.operation)  // used at 5
        await clock.advance(to: .init(offset: .s(9.999)))
        #expect(family.count == 2)
        await clock.advance(to: .init(offset: .s(10)))
        #expect(removals.entries == ["1=11 idle"])
        await clock.advance(to: .init(offset: .s(12)))
        _ = try await family.value(for: 2, source.operation)  // used again at 12: idle at 22
        await clock.advance(to: .init(offset: .s(21.999)))
        #expect(family.count == 1)
        await clock.advance(to: .init(offset: .s(22)))
        #expect(removals.entries == ["1=11 idle", "2=21 idle"])
        #expect(family.count == 0)

        _ = try await family.value(for: 3, source.operation)  // the sweeper starts again
        await clock.advance(by: .seconds(10))
        #expect(removals.entries == ["1=11 idle", "2=21 idle", "3=31 idle"])
    }

    @Test func anIdleEntryWithAFetchInFlightStays() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock, duration: .seconds(15))
        let removals = RemovalLog()
        let family = AsyncStateFamily<Int, Int>(
            idleExpiry: .seconds(10), clock: clock, onRemoval: removals.callback)
        let slow = clock.task { try await family.value(for: 1, source.operation) }  // 0–15 s
        await clock.advance(by: .seconds(10))  // idle by its last use, but busy: counts as used at 10
        #expect(removals.entries == [])
        await clock.advance(by: .seconds(5))
        #expect(try await slow.value == 11)
        await clock.advance(by: .seconds(5))
        #expect(removals.entries == ["1=11 idle"])  // 10 s after 10
    }

    @Test func removeCancelsTheFetchAndFinishesTheUpdates() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock, duration: .seconds(10))
        let removals = RemovalLog()
        let family = AsyncStateFamily<Int, Int>(clock: clock, onRemoval: removals.callback)
        let updates = family.updates(for: 1)
        let phases = clock.task {
            var names: [String] = []
            for await snapshot in updates { names.append(snapshot.phase.name) }
            return names
        }
        let caller = clock.task { try await family.value(for: 1, source.operation) }
        await clock.advance(by: .seconds(1))
        #expect(family.remove(1))
        #expect(!family.remove(1))
        await clock.advance(by: .zero)
        await #expect(throws: CancellationError.self) { try await caller.value }
        #expect(try await phases.value == ["initial", "loading", "initial"])
        #expect(removals.entries == ["1=nil removed"])
        #expect(family.count == 0)
        // The next request starts from nothing.
        let again = clock.task { try await family.value(for: 1, source.operation) }
        await clock.advance(by: .seconds(10))
        #expect(try await again.value == 12)
    }

    @Test func invalidateWhereAndAllMarkDataExpired() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock, duration: .zero)
        let family = AsyncStateFamily<Int, Int>(clock: clock)
        for key in 1...4 { _ = try await family.value(for: key, source.operation) }
        family.invalidate(where: { $0.isMultiple(of: 2) })
        #expect(family.snapshots.filter { $0.value.isExpired }.keys.sorted() == [2, 4])
        family.invalidate(1)
        #expect(family.snapshot(for: 1)?.isExpired == true)
        #expect(family.snapshot(for: 3)?.isExpired == false)
        family.invalidateAll()
        #expect(family.snapshots.values.allSatisfy { $0.isExpired })
        let refetch = clock.task { try await family.value(for: 3, source.operation) }
        await clock.advance(by: .zero)
        #expect(try await refetch.value == 32)
        family.removeAll()
        #expect(family.count == 0)
    }

    @Test func setWritesAFreshValueAndReportsTheOneItReplaced() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock)
        let removals = RemovalLog()
        let family = AsyncStateFamily<Int, Int>(clock: clock, onRemoval: removals.callback)
        let caller = clock.task { try await family.value(for: 1, source.operation) }
        await clock.advance(by: .zero)
        family.set(7, for: 1)  // wins over the fetch in flight
        #expect(try await caller.value == 7)
        family.set(8, for: 1)
        #expect(removals.entries == ["1=7 replaced"])
        #expect(try await family.value(for: 1, source.operation) == 8)
        let seeded = AsyncStateFamily<Int, Int>(wrappedValue: [1: 10, 2: 20], clock: clock)
        #expect(seeded.wrappedValue == [1: 10, 2: 20])
        #expect(try await seeded.value(for: 2, source.operation) == 20)
    }

    @Test func aFamilyOfManyKeysNeverHoldsMoreThanItsCapacity() async throws {
        let clock = VirtualClock()
        let removals = LockedValue(0)
        let family = AsyncStateFamily<Int, Int>(
            capacity: 5_000, clock: clock, onRemoval: { _, _, _ in removals.withLock { $0 += 1 } })
        for key in 0..<12_000 { family.set(key, for: key) }
        #expect(family.count == 5_000)
        #expect(removals.withLock { $0 } == 7_000)
        for key in 0..<100 { family.set(key, for: key * 7 + 1) }
        #expect(family.count == 5_000)
    }

    @Test func aMaximumWeightEvictsUntilTheEntriesWeighNoMore() async throws {
        let clock = VirtualClock()
        let removals = RemovalLog()
        let family = AsyncStateFamily<Int, Int>(
            capacity: 100, maximumWeight: 10, weigher: { _, value in value }, clock: clock,
            onRemoval: removals.callback)
        family.set(4, for: 1)
        family.set(4, for: 2)
        #expect(family.weight == 8)
        family.set(5, for: 3)  // 13: one of the older entries goes
        #expect(family.weight <= 10)
        #expect(family.count == 2)
        #expect(removals.entries.count == 1 && removals.entries[0].hasSuffix("evicted"))
        #expect(family[3] == 5)

        // A value fetched is weighed when the fetch's use ends.
        let source = KeyedSource(clock: clock, duration: .zero)
        _ = try await family.value(for: 0, source.operation)  // 0 * 10 + 1 = 1
        #expect(family.weight <= 10)
        #expect(family.snapshots.values.compactMap { $0.value ?? nil }.reduce(0, +) == family.weight)
    }

    @Test func withoutAWeigherEachEntryWithAValueWeighsOne() async throws {
        let family = AsyncStateFamily<Int, Int>(capacity: 100, maximumWeight: 3, clock: VirtualClock())
        for key in 0..<10 { family.set(key, for: key) }
        #expect(family.count == 3)
        #expect(family.weight == 3)
        let unweighed = AsyncStateFamily<Int, Int>(capacity: 100, weigher: { _, _ in 1_000 }, clock: VirtualClock())
        for key in 0..<10 { unweighed.set(key, for: key) }
        #expect(unweighed.count == 10)  // a weigher without a maximum weight does nothing
        #expect(unweighed.weight == 0)
    }

    @Test func valueUsingAContextAndRetryForAKey() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock, duration: .zero, failing: [2])
        let family = AsyncStateFamily<Int, Int>(clock: clock, failureExpiry: .seconds(60))
        #expect(try await family.value(for: 1, using: source) { key, source in try await source.load(key) } == 11)
        #expect(try await family.value(for: 1, using: source) { _, _ in -1 } == 11)  // a hit: not run
        await family.fetch(for: 2, source.operation)
        #expect(family.snapshot(for: 2)?.phase.error is SourceDown)
        await family.fetch(for: 2, source.operation)  // within the failure expiry: not run
        #expect(source.keys == [1, 2])
        await family.retry(for: 2) { _ in 7 }  // bypasses it
        #expect(family[2] == 7)
        await family.retry(for: 2) { _ in 8 }  // a success: nothing to retry
        #expect(family[2] == 7)
    }

    @Test func snapshotUsingAContextForAKey() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock, duration: .zero, failing: [2])
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(10), clock: clock)
        let first = try await family.snapshot(for: 1, using: source) { key, source in try await source.load(key) }
        #expect(first.value == 11)
        #expect(first.phase.lastUpdated != nil)
        let hit = try await family.snapshot(for: 1, using: source) { _, _ in -1 }  // fresh: not run
        #expect(hit.value == 11)
        #expect(!hit.isExpired)
        let failed = try await family.snapshot(for: 2, using: source) { key, source in try await source.load(key) }
        #expect(failed.phase.error is SourceDown)  // in the phase, not thrown
        #expect(failed.value == nil)
        #expect(source.keys == [1, 2])
        await clock.advance(by: .seconds(10))
        let refetched = try await family.snapshot(for: 1, using: 5) { key, offset in key + offset }
        #expect(refetched.value == 6)
    }

    /// A snapshot hit on an entry nobody uses (its store made compact) carries what a single state's
    /// snapshot hit does after the same calls: the value, the phase and its date, the failures, the
    /// last error, the last success and the count of successes.
    @Test func aSnapshotHitOnACompactEntryIsASingleStatesSnapshotHit() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(10), clock: clock)
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(10), clock: clock)
        _ = try await family.value(for: 1) { _ in 5 }
        _ = try await state.value { 5 }
        await clock.advance(by: .seconds(1))
        family.invalidate(1)
        await state.invalidate()
        _ = try? await family.value(for: 1) { _ in throw SourceDown() }
        _ = try? await state.value { throw SourceDown() }
        await clock.advance(by: .seconds(1))
        _ = try await family.value(for: 1) { _ in 6 }
        _ = try await state.value { 6 }
        await clock.advance(by: .seconds(1))
        family.set(7, for: 1)
        await state.set(7)
        await clock.advance(by: .seconds(1))
        let ours = try await family.snapshot(for: 1, using: ()) { _, _ in -1 }  // fresh: not run
        let theirs = try await state.snapshot(using: ()) { _ in -1 }
        #expect(ours.value == theirs.value && ours.value == 7)
        #expect(ours.phase.name == theirs.phase.name)
        #expect(ours.phase.lastUpdated == theirs.phase.lastUpdated)
        #expect(ours.isExpired == theirs.isExpired && !ours.isExpired)
        #expect(ours.failureCount == theirs.failureCount)
        #expect(ours.lastError is SourceDown && theirs.lastError is SourceDown)
        #expect(ours.lastSuccess == theirs.lastSuccess && ours.lastSuccess != nil)
        #expect(ours.successCount == theirs.successCount && ours.successCount == 2)
        #expect(ours.hasValue == theirs.hasValue && ours.hasValue)
    }

    @Test(arguments: [0, -5])
    func aCapacityBelowOneMeansOne(_ capacity: Int) async throws {
        let family = AsyncStateFamily<Int, Int>(capacity: capacity, clock: VirtualClock())
        family.set(1, for: 1)
        family.set(2, for: 2)
        #expect(family.wrappedValue == [2: 2])
    }

    @Test func aPropertyWrapperWithAnOperationCapturingItsOwner() async throws {
        actor ProfileService {
            @AsyncStateFamily(capacity: 10, clock: VirtualClock()) var profiles: [Int: String]
            func profile(_ id: Int) async throws -> String {
                try await $profiles.value(for: id) { id in try await self.load(id) }
            }
            func load(_ id: Int) async throws -> String { "user \(id)" }
        }
        var service: ProfileService? = ProfileService()
        weak let weakService = service
        #expect(try await service?.profile(3) == "user 3")
        #expect(await service?.profiles == [3: "user 3"])
        service = nil
        #expect(weakService == nil)  // the family keeps no operation after its flight
    }
}

/// Entries nobody uses are kept compact; they must behave exactly as their stores would.
@Suite struct FamilyCompactEntryTests {
    func isCompact(_ family: AsyncStateFamily<Int, Int>, _ key: Int) -> Bool {
        if case .compact = family.core.peek(key) { return true } else { return false }
    }

    @Test func aSettledEntryIsCompactAndKeepsItsSnapshot() async throws {
        let clock = VirtualClock()
        let attempts = LockedValue(0)
        let family = AsyncStateFamily<Int, Int>(
            clock: clock, retry: .exponential(maxAttempts: 2, initial: .seconds(1)))
        let caller = clock.task {
            try await family.value(for: 1) { key in
                let attempt = attempts.withLock {
                    $0 += 1
                    return $0
                }
                if attempt == 1 { throw SourceDown() }  // the retry succeeds: lastError stays
                return key
            }
        }
        await clock.advance(by: .zero)
        #expect(!isCompact(family, 1))  // in flight
        let live = family.core.snapshot(of: 1, at: clock.now.offset)
        #expect(live?.phase.isLoading == true)
        await clock.advance(by: .seconds(1))
        #expect(try await caller.value == 1)
        #expect(isCompact(family, 1))
        let snapshot = try #require(family.snapshot(for: 1))
        #expect(snapshot.value == 1)
        #expect(snapshot.phase.name == "success")
        #expect(snapshot.lastError is SourceDown)
        #expect(snapshot.successCount == 1)
        #expect(snapshot.lastSuccess == clock.date)
        #expect(!snapshot.isExpired)

        // Used again, it is restored with the same state: a refresh counts a second success.
        await family.refresh(for: 1) { $0 * 10 }
        #expect(family.snapshot(for: 1)?.successCount == 2)
        #expect(family[1] == 10)
        #expect(isCompact(family, 1))
    }

    @Test func aFailedEntryAndOneWithASubscriberStayLive() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock, duration: .zero, failing: [2])
        let family = AsyncStateFamily<Int, Int>(clock: clock)
        await family.fetch(for: 2, source.operation)
        #expect(!isCompact(family, 2))  // a failure: its error and negative cache live in the store
        let updates = family.updates(for: 3)
        family.set(30, for: 3)
        #expect(!isCompact(family, 3))  // someone listens
        family.set(40, for: 4)
        #expect(isCompact(family, 4))  // set on a new key: compact at once
        withExtendedLifetime(updates) {}
    }

    @Test func aCompactEntryServesHitsExpiresAndRefreshesAhead() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock, duration: .seconds(1))
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(10), clock: clock, refreshAfter: .seconds(6))
        family.set(5, for: 1)  // fresh from 0
        await clock.advance(to: .init(offset: .s(5.9)))
        #expect(try await family.value(for: 1, source.operation) == 5)
        #expect(source.keys == [])
        await clock.advance(to: .init(offset: .s(6)))
        let answer = LockedValue<Int?>(nil)
        clock.task {
            let value = try await family.value(for: 1, source.operation)
            answer.withLock { $0 = value }
        }
        await clock.advance(by: .zero)
        #expect(answer.withLock { $0 } == 5)  // at once, and one refresh starts
        #expect(source.calls.map(\.at) == [.s(6)])
        await clock.advance(by: .seconds(1))
        #expect(family[1] == 11)
        family.invalidate(1)
        #expect(family.snapshot(for: 1)?.isExpired == true)
        let refetch = clock.task { try await family.value(for: 1, source.operation) }
        await clock.advance(by: .seconds(1))
        #expect(try await refetch.value == 12)
    }
}

@Suite struct FamilyBatchTests {
    @Test func oneRunLoadsEveryKeyNeitherFreshNorInFlight() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock)
        let family = AsyncStateFamily<Int, Int>(clock: clock)
        family.set(30, for: 3)  // fresh
        let inFlight = clock.task { try await family.value(for: 4, source.operation) }  // 0–1 s
        await clock.advance(by: .zero)
        let batch = clock.task { await family.values(for: [1, 2, 3, 4, 5, 2], source.batch()) }
        await clock.advance(by: .seconds(1))
        let results = try await batch.value
        #expect(source.batchRuns == [[1, 2, 5]])
        #expect(try results.mapValues { try $0.get() } == [1: 100, 2: 200, 3: 30, 4: 41, 5: 500])
        #expect(try await inFlight.value == 41)
        #expect(family.snapshot(for: 5)?.phase.name == "success")
        // Now all fresh: nothing runs.
        let again = await family.values(for: [1, 2, 3], source.batch())
        await clock.advance(by: .zero)
        #expect(again.count == 3)
        #expect(source.batchRuns.count == 1)
    }

    @Test func eachKeyGetsItsOwnErrorAndPhase() async throws {
        let clock = VirtualClock()
        let source = KeyedSource(clock: clock)
        let family = AsyncStateFamily<Int, Int>(clock: clock)
        let batch = clock.task { await family.values(for: [1, 2], source.batch(omitting: [2])) }
        await clock.advance(by: .seconds(1))
        let results = try await batch.value
        #expect(try results[1]?.get() == 100)
        #expect(throws: AsyncStateError.missingFromBatch) { try results[2]?.get() }
        #expect(family.snapshot(for: 2)?.phase.error as? AsyncStateError == .missingFromBatch)

        let failing = clock.task { await family.values(for: [3, 4], source.batch(failing: true)) }
        await clock.advance(by: .seconds(1))
        for result in try await failing.value.values { #expect(throws: SourceDown.self) { try result.get() } }
        #expect(source.batchRuns == [[1, 2], [3, 4]])
    }

    @Test func aRetryLoadsItsKeyAlone() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<Int, Int>(
            clock: clock, retry: .exponential(maxAttempts: 2, initial: .seconds(1)))
        let runs = LockedValue<[[Int]]>([])
        let batch = clock.task {
            await family.values(for: [1, 2]) { keys in
                let run = runs.withLock {
                    $0.append(keys)
                    return $0.count
                }
                try await clock.sleep(for: .seconds(1))
                // The first run has no value for 2.
                return Dictionary(uniqueKeysWithValues: keys.filter { run > 1 || $0 != 2 }.map { ($0, $0 * 100) })
            }
        }
        await clock.advance(by: .seconds(3))  // batch 0–1 s; key 2's retry 2–3 s, alone
        let results = try await batch.value
        #expect(runs.withLock { $0 } == [[1, 2], [2]])
        #expect(try results[1]?.get() == 100)
        #expect(try results[2]?.get() == 200)
    }

    @Test func cancellingTheCallerCancelsTheBatch() async throws {
        let clock = VirtualClock()
        let cancelled = LockedValue(false)
        let family = AsyncStateFamily<Int, Int>(clock: clock)
        let batch = clock.task {
            await family.values(for: [1, 2, 3]) { keys in
                do {
                    try await clock.sleep(for: .seconds(10))
                } catch {
                    cancelled.withLock { $0 = true }
                    throw error
                }
                return [:]
            }
        }
        await clock.advance(by: .seconds(1))
        batch.cancel()
        await clock.advance(by: .zero)
        let results = try await batch.value
        #expect(results.count == 3)
        for result in results.values { #expect(throws: CancellationError.self) { try result.get() } }
        #expect(cancelled.withLock { $0 })
        #expect(family.snapshots.values.allSatisfy { $0.phase.name == "initial" })
    }
}
