import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// A second level shared by replicas in one process (`InMemorySecondLevel`), in virtual time: one
/// source call for a fleet's miss, a dead holder replaced at its lease's expiry, faults that never
/// fail a hit or hang a miss, versions that never go backwards, garbage that is never served.
@Suite struct SecondLevelTests {
    /// `count` replicas' families on one second level (each through its own connection).
    static func replicas(
        _ count: Int, on level: InMemorySecondLevel, clock: VirtualClock, expiry: Duration = .seconds(120),
        leaseDuration: Duration = .seconds(10), timeout: Duration = .milliseconds(250)
    ) -> [(family: AsyncStateFamily<Int, Int>, connection: InMemorySecondLevel.Replica)] {
        (0..<count).map { _ in
            let connection = level.replica()
            let family = AsyncStateFamily<Int, Int>(
                expiry: expiry, clock: clock,
                secondLevel: AsyncStateSecondLevelOptions(
                    level: connection, namespace: "numbers", codec: .json, timeout: timeout,
                    leaseDuration: leaseDuration))
            return (family, connection)
        }
    }

    /// The observer hears what the second level did, inside each fetch (between its start and its
    /// outcome): the holder's load with its version, another replica's wait and hit, a fault.
    @Test func theObserverHearsTheSecondLevelInsideEachFetch() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock)
        let log = EventLog()
        let ledgers = [FlightLedger(), FlightLedger()]  // one per replica: a ledger follows keys
        let families = (0..<2).map { index in
            AsyncStateFamily<Int, Int>(
                clock: clock, name: "r\(index)", observer: Both(first: log, second: ledgers[index]),
                secondLevel: AsyncStateSecondLevelOptions(level: level.replica(), namespace: "n", codec: .json))
        }
        let callers = families.map { family in clock.task { try await family.value(for: 1, source.operation) } }
        await clock.advance(by: .seconds(1))
        await clock.advance(by: .milliseconds(25))
        for caller in callers { #expect(try await caller.value == 11) }
        level.isDown = true
        let down = clock.task { try await families[0].value(for: 2, source.operation) }
        await clock.advance(by: .seconds(1))
        #expect(try await down.value == 21)
        let lines = log.all.filter { $0.contains("secondLevel") || $0.contains("started") || $0.contains("succeeded") }
        #expect(
            lines == [
                "r0 1 started(fetch)", "r1 1 started(fetch)", "r1 1 secondLevel(waiting)",
                "r0 1 secondLevel(loaded(version: Optional(1)))", "r0 1 succeeded(1.0 seconds, 1 attempts)",
                "r1 1 secondLevel(hit(version: 1))", "r1 1 succeeded(1.0 seconds, 1 attempts)",
                "r0 2 started(fetch)",
                "r0 2 secondLevel(fault(error: AsyncStateTesting.InMemorySecondLevel.Unavailable()))",
                "r0 2 succeeded(1.0 seconds, 1 attempts)",
            ])
        #expect(ledgers.allSatisfy { $0.problems.isEmpty && $0.open.isEmpty })
    }

    /// 5 replicas × 1,000 concurrent cold callers on one key: exactly one source call. The lease's
    /// holder loads it (1 s); the other four find the lease held, read the entry every 25 ms, and
    /// answer from it once it is written — each caller with the one value.
    @Test func fiveReplicasOfAThousandCallersCostOneSourceCall() async throws {
        // 5,000 callers settle before the first wake: under ThreadSanitizer that takes longer than
        // the default stall timeout (10 s of real time without a wake).
        let clock = VirtualClock(stallTimeout: .seconds(120))
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock)
        let replicas = Self.replicas(5, on: level, clock: clock)
        let callers = replicas.flatMap { replica in
            (0..<1_000).map { _ in clock.task { try await replica.family.value(for: 7, source.operation) } }
        }
        await clock.advance(by: .zero)
        #expect(source.calls.count == 1)
        await clock.advance(by: .seconds(1))
        await clock.advance(by: .milliseconds(25))
        for caller in callers { #expect(try await caller.value == 71) }
        #expect(source.calls.count == 1)
        let statistics = replicas.compactMap(\.family.secondLevelStatistics)
        #expect(statistics.map(\.loads).reduce(0, +) == 1)
        #expect(statistics.map(\.hits).reduce(0, +) == 4)
        #expect(statistics.map(\.waits).reduce(0, +) == 4)
        #expect(level.counts.leasesAcquired == 1)
        #expect(level.entry(for: "numbers:7")?.version == 1)
        // Each replica keeps it fresh as long as the holder's answer is: 120 s from t = 1 s.
        await clock.advance(to: .init(offset: .seconds(121) - .nanoseconds(1)))
        for replica in replicas { #expect(try await replica.family.value(for: 7, source.operation) == 71) }
        #expect(source.calls.count == 1)
        #expect(replicas.allSatisfy { $0.family.snapshot(for: 7)?.lastSuccess == clock.startDate + 1 })
    }

    /// A replica that finds a fresh entry answers from it without the source, fresh for what the
    /// entry has left; an L1 hit never reads the second level.
    @Test func aFreshEntryIsAnsweredWithTheFreshnessItHasLeft() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock)
        let replicas = Self.replicas(2, on: level, clock: clock, expiry: .seconds(60))
        let first = clock.task { try await replicas[0].family.value(for: 1, source.operation) }
        await clock.advance(by: .seconds(1))
        #expect(try await first.value == 11)
        await clock.advance(by: .seconds(20))
        let second = clock.task { try await replicas[1].family.value(for: 1, source.operation) }
        await clock.advance(by: .zero)
        #expect(try await second.value == 11)
        #expect(source.calls.count == 1)
        let reads = level.counts.reads
        #expect(try await replicas[1].family.value(for: 1, source.operation) == 11)
        #expect(level.counts.reads == reads)
        // Written at 1 s for 60 s: fresh on the second replica until 61 s, not 81 s.
        await clock.advance(to: .init(offset: .seconds(61) - .nanoseconds(1)))
        #expect(replicas[1].family.snapshot(for: 1)?.isExpired == false)
        await clock.advance(by: .nanoseconds(1))
        #expect(replicas[1].family.snapshot(for: 1)?.isExpired == true)
    }

    /// An entry dated in the future beyond the clocks' skew (written by hand, to stay fresh from a
    /// date not yet come) is garbage: never served nor a fallback, counted, and replaced by the load's
    /// write. One within the skew is a replica whose clock runs ahead: taken.
    @Test func anEntryFromTheFutureBeyondTheSkewIsGarbage() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock)
        let replica = Self.replicas(1, on: level, clock: clock, expiry: .seconds(3_600))[0]
        let payload = try AsyncStateCodec<Int>.json.encode(666)
        let skew = AsyncStateSecondLevelOptions<Int>.maximumClockSkew.timeInterval
        level.overwrite(
            .init(
                payload: payload, succeededAt: clock.startDate + skew + 1, freshUntil: clock.startDate + 7_200,
                version: 3),
            for: "numbers:5")
        let caller = clock.task { try await replica.family.value(for: 5, source.operation) }
        await clock.advance(by: .seconds(1))
        #expect(try await caller.value == 51)
        #expect(source.calls.map(\.key) == [5])
        #expect(replica.family.secondLevelStatistics?.undecodable == 1)
        let stored = try #require(try await replica.connection.read("numbers:5"))
        #expect(try AsyncStateCodec<Int>.json.decode(stored.payload) == 51 && stored.version > 3)

        // Within the skew: a replica whose clock runs ahead wrote it.
        level.overwrite(
            .init(
                payload: payload, succeededAt: clock.date + skew - 1, freshUntil: clock.date + 7_200,
                version: stored.version + 1),
            for: "numbers:6")
        let ahead = clock.task { try await replica.family.value(for: 6, source.operation) }
        await clock.advance(by: .zero)
        #expect(try await ahead.value == 666)
        #expect(source.calls.map(\.key) == [5])
    }

    /// An entry that claims more freshness than this replica's expiry allows (a replica with a longer
    /// expiry wrote it, or a forged one) is cut to the expiry, counted from its source's answer.
    @Test func anEntryIsNeverFresherThanTheExpiryAllows() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock)
        let replica = Self.replicas(1, on: level, clock: clock, expiry: .seconds(30))[0]
        let payload = try AsyncStateCodec<Int>.json.encode(42)
        level.overwrite(
            .init(
                payload: payload, succeededAt: clock.startDate, freshUntil: clock.startDate + 3_600, version: 3),
            for: "numbers:5")
        await clock.advance(by: .seconds(10))
        let caller = clock.task { try await replica.family.value(for: 5, source.operation) }
        await clock.advance(by: .zero)
        #expect(try await caller.value == 42)
        #expect(source.calls.isEmpty)
        await clock.advance(to: .init(offset: .seconds(30) - .nanoseconds(1)))
        #expect(replica.family.snapshot(for: 5)?.isExpired == false)
        await clock.advance(by: .nanoseconds(1))
        #expect(replica.family.snapshot(for: 5)?.isExpired == true)
    }

    /// A holder that dies mid-load (its operation never returns) holds the lease until it expires;
    /// another replica then takes it and calls the source at that instant exactly, not before.
    @Test func aDeadHoldersLeaseExpiresAndAnotherReplicaLoadsThenExactly() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock, duration: .seconds(1))
        let replicas = Self.replicas(2, on: level, clock: clock, leaseDuration: .seconds(10))
        let dead = clock.task {
            try await replicas[0].family.value(for: 3) { _ in
                try await clock.sleep(for: .seconds(1_000_000))
                return -1
            }
        }
        await clock.advance(by: .milliseconds(500))
        let waiter = clock.task { try await replicas[1].family.value(for: 3, source.operation) }
        await clock.advance(to: .init(offset: .seconds(10) - .nanoseconds(1)))
        #expect(source.calls.isEmpty)
        await clock.advance(by: .nanoseconds(1))
        #expect(source.calls.map(\.at) == [.seconds(10)])
        await clock.advance(by: .seconds(1))
        #expect(try await waiter.value == 31)
        #expect(level.entry(for: "numbers:3")?.version == 2)
        dead.cancel()
        await clock.advance(by: .zero)
        _ = try? await dead.value
    }

    /// A waiting replica reads the entry, finds none, and asks for the lease again; if the holder
    /// wrote its entry and gave the lease back in between, the waiter gets the lease. It must read
    /// once more and take the entry rather than load the key again (a CI run of the example's
    /// three PostgreSQL replicas read the source twice for one cold key this way).
    @Test func aWaiterThatGetsTheLeaseAfterTheHolderWroteTakesTheEntry() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let polled = Gate()
        let released = Gate()
        // The waiter's second read (its first poll) lets the holder's operation answer; its second
        // lease request waits until the holder has given the lease back.
        let holder = GatedConnection(level.replica(), afterRelease: { released.open() })
        let waiter = GatedConnection(
            level.replica(),
            afterRead: { if $0 == 2 { polled.open() } },
            beforeAcquire: { if $0 == 2 { await released.wait() } })
        func family(_ connection: GatedConnection) -> AsyncStateFamily<Int, Int> {
            AsyncStateFamily<Int, Int>(
                expiry: .seconds(120), clock: clock,
                secondLevel: AsyncStateSecondLevelOptions(
                    level: connection, namespace: "numbers", codec: .json, pollInterval: .milliseconds(25)))
        }
        let (first, second) = (family(holder), family(waiter))
        let calls = LockedValue(0)
        let loading = clock.task {
            try await first.value(for: 3) { key in
                calls.withLock { $0 += 1 }
                await polled.wait()
                return key * 10
            }
        }
        await clock.advance(by: .zero)
        let waiting = clock.task {
            try await second.value(for: 3) { key in
                calls.withLock { $0 += 1 }
                return key * 10
            }
        }
        await clock.advance(by: .milliseconds(25))
        await clock.advance(by: .zero)
        #expect(try await loading.value == 30)
        #expect(try await waiting.value == 30)
        #expect(waiter.counts == (reads: 3, acquires: 2))
        #expect(calls.withLock { $0 } == 1)
        #expect(level.counts.writes == 1)
    }

    /// A holder whose callers all leave (its flight cancelled) gives the lease back at once: another
    /// replica then loads without waiting for the lease to expire.
    @Test func aCancelledHolderGivesTheLeaseBack() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock, duration: .seconds(5))
        let replicas = Self.replicas(2, on: level, clock: clock, leaseDuration: .seconds(10))
        // Each call takes a millisecond: one made by a cancelled task would fail (its sleep throws).
        level.latency = .milliseconds(1)
        let first = clock.task { try await replicas[0].family.value(for: 5, source.operation) }
        await clock.advance(by: .seconds(1))
        first.cancel()
        await clock.advance(by: .milliseconds(500))
        let second = clock.task { try await replicas[1].family.value(for: 5, source.operation) }
        await clock.advance(by: .milliseconds(2))
        // Read, lease: two calls of a millisecond, then the source.
        #expect(source.calls.map(\.at) == [.milliseconds(2), .milliseconds(1_502)])
        await clock.advance(by: .seconds(5) + .milliseconds(10))
        guard source.calls.count == 2 else {
            second.cancel()  // the lease was not given back: do not wait 10 s of virtual time for it
            return
        }
        #expect(try await second.value == 52)
        await #expect(throws: CancellationError.self) { try await first.value }
    }

    /// A holder whose callers all leave after its source answered still writes the value: the
    /// other replicas take it without a call of their own.
    @Test func aHolderCancelledAfterItsSourceAnsweredStillWrites() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock, duration: .seconds(1))
        let replicas = Self.replicas(2, on: level, clock: clock)
        level.latency = .milliseconds(1)  // a call made by a cancelled task would fail
        let first = clock.task { try await replicas[0].family.value(for: 6, source.operation) }
        // Read and lease (2 ms), the source (1 s): the write is in flight at 1.0025 s.
        await clock.advance(by: .seconds(1) + .microseconds(2_500))
        first.cancel()
        await clock.advance(by: .milliseconds(5))
        #expect(level.entry(for: "numbers:6")?.version == 1)
        let second = clock.task { try await replicas[1].family.value(for: 6, source.operation) }
        await clock.advance(by: .milliseconds(5))
        #expect(source.calls.count == 1)
        guard source.calls.count == 1 else {
            second.cancel()  // it called the source itself: do not wait for that call
            return
        }
        #expect(try await second.value == 61)
    }

    /// The second level down: a hit is answered from memory (it never reads it), a miss goes
    /// straight to the source, and the next misses skip it for the backoff; after the backoff a miss
    /// tries it again.
    @Test func aSecondLevelThatIsDownNeverFailsAHitNorHangsAMiss() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock)
        let replica = Self.replicas(1, on: level, clock: clock)[0]
        let warm = clock.task { try await replica.family.value(for: 1, source.operation) }
        await clock.advance(by: .seconds(1))
        #expect(try await warm.value == 11)
        level.isDown = true
        #expect(try await replica.family.value(for: 1, source.operation) == 11)
        let miss = clock.task { try await replica.family.value(for: 2, source.operation) }
        await clock.advance(by: .zero)
        #expect(source.calls.map(\.key) == [1, 2])
        #expect(replica.family.secondLevelStatistics?.faults == 1)
        // Within the backoff (1 s from the fault at 1 s), a miss does not try it.
        await clock.advance(by: .milliseconds(500))
        let skipped = clock.task { try await replica.family.value(for: 4, source.operation) }
        await clock.advance(by: .zero)
        #expect(source.calls.last?.key == 4)
        await clock.advance(by: .seconds(1))
        #expect(try await miss.value == 21)
        #expect(try await skipped.value == 41)
        #expect(replica.family.secondLevelStatistics?.skipped == 1)
        #expect(replica.family.secondLevelStatistics?.faults == 1)
        // Up again, after the backoff: the next miss uses it.
        level.isDown = false
        let reads = level.counts.reads
        let again = clock.task { try await replica.family.value(for: 5, source.operation) }
        await clock.advance(by: .seconds(1))
        #expect(try await again.value == 51)
        #expect(level.counts.reads == reads + 1)
        #expect(level.entry(for: "numbers:5") != nil)
    }

    /// A second level slower than its timeout, and one cut off by a partition whose calls hang even
    /// when cancelled: a miss waits one timeout (250 ms), then calls the source.
    @Test(arguments: [false, true])
    func aSlowOrPartitionedSecondLevelCostsAMissOneTimeout(partitioned: Bool) async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock)
        let replica = Self.replicas(1, on: level, clock: clock)[0]
        if partitioned {
            replica.connection.isPartitioned = true
        } else {
            level.latency = .seconds(5)
        }
        let miss = clock.task { try await replica.family.value(for: 9, source.operation) }
        await clock.advance(to: .init(offset: .milliseconds(250) - .nanoseconds(1)))
        #expect(source.calls.isEmpty)
        await clock.advance(by: .nanoseconds(1))
        #expect(source.calls.map(\.at) == [.milliseconds(250)])
        await clock.advance(by: .seconds(1))
        #expect(try await miss.value == 91)
        #expect(replica.family.secondLevelStatistics?.faults == 1)
        replica.connection.isPartitioned = false
        await clock.advance(by: .seconds(5))
    }

    /// Calls that fail together (a blip) are one fault for the backoff: the second level is tried
    /// again after one backoff (1 s), not after one doubled per failed call.
    @Test func callsThatFailTogetherAreOneFault() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock)
        let replica = Self.replicas(1, on: level, clock: clock)[0]
        replica.connection.isPartitioned = true
        let misses = (1...4).map { key in clock.task { try await replica.family.value(for: key, source.operation) } }
        await clock.advance(by: .seconds(2))
        for (index, miss) in misses.enumerated() { #expect(try await miss.value == (index + 1) * 10 + 1) }
        #expect(replica.family.secondLevelStatistics?.faults == 4)
        replica.connection.isPartitioned = false  // the four held reads end now, unseen
        let later = clock.task { try await replica.family.value(for: 9, source.operation) }
        await clock.advance(by: .seconds(1))
        #expect(try await later.value == 91)
        #expect(level.counts.leasesAcquired == 1)  // the later miss used the second level
        #expect(replica.family.secondLevelStatistics?.skipped == 0)
    }

    /// What is in the second level is never trusted: a foreign payload, a truncated one, one under
    /// another tag or another envelope format, is dropped and the key loaded from the source — no
    /// caller sees an error — and the new entry replaces it.
    @Test func anUndecodableEntryIsDroppedAndRefetched() async throws {
        let good = try AsyncStateCodec<Int>.json.encode(99)
        let garbage: [[UInt8]] = [
            Array("not an envelope".utf8), Array(good.prefix(5)), try AsyncStateCodec<Int>.json(tag: "v2").encode(99),
            [0x41, 0x53, 0x4C, 0x32, 9, 4] + Array("json99".utf8), Array(good.dropLast()) + [0x7B],
        ]
        for (index, payload) in garbage.enumerated() {
            let clock = VirtualClock()
            let level = InMemorySecondLevel(clock: clock)
            let source = KeyedSource(clock: clock)
            let replica = Self.replicas(1, on: level, clock: clock)[0]
            level.overwrite(
                .init(payload: payload, succeededAt: clock.startDate, freshUntil: clock.startDate + 3_600, version: 40),
                for: "numbers:6")
            let caller = clock.task { try await replica.family.value(for: 6, source.operation) }
            await clock.advance(by: .seconds(1))
            #expect(try await caller.value == 61, "garbage \(index)")
            #expect(source.calls.count == 1, "garbage \(index)")
            #expect(replica.family.secondLevelStatistics?.undecodable == 1, "garbage \(index)")
            let entry = level.entry(for: "numbers:6")
            #expect(entry?.version == 41, "garbage \(index)")
            #expect(entry.map { try? AsyncStateCodec<Int>.json.decode($0.payload) } == 61, "garbage \(index)")
        }
    }

    /// A holder that outlives its lease (lost, or expired while its source was slow) loses to the
    /// holder after it: its older write is refused, and it answers with the newer entry instead of
    /// its own, so neither level goes back.
    @Test func aHolderThatLostItsLeaseCannotOverwriteANewerEntry() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let replicas = Self.replicas(2, on: level, clock: clock)
        let slow = clock.task {
            try await replicas[0].family.value(for: 8) { _ in
                try await clock.sleep(for: .seconds(5))
                return 1
            }
        }
        await clock.advance(by: .seconds(1))
        level.loseLease(on: "numbers:8")
        let fast = clock.task {
            try await replicas[1].family.value(for: 8) { _ in
                try await clock.sleep(for: .seconds(1))
                return 2
            }
        }
        await clock.advance(by: .seconds(1))
        #expect(try await fast.value == 2)
        #expect(level.entry(for: "numbers:8")?.version == 2)
        await clock.advance(by: .seconds(3))
        #expect(try await slow.value == 2)
        #expect(level.entry(for: "numbers:8")?.version == 2)
        #expect(replicas[0].family.secondLevelStatistics?.refusedWrites == 1)
    }

    /// Seeded random schedules over 4 replicas: misses at random instants, sources of random
    /// duration (some past the lease, so that a wait runs out and a replica calls its source without
    /// the lease), leases lost and outages of the second level at random (a replica then calls its
    /// source directly, and later finds older entries there), invalidations of a replica's entry,
    /// and changes whose versioned messages reach the replicas late and out of order. The versions in the second level only grow and each keeps
    /// one value; each replica's data only gets newer (its success dates, and the source's counter,
    /// read when the source answers, never go back).
    @Test(arguments: Array(1...16) as [UInt64])
    func versionsNeverGoBackwardsUnderRandomSchedules(seed: UInt64) async throws {
        var random = SplitMix64(seed: seed)
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let counter = LockedValue(0)
        let replicas = Self.replicas(4, on: level, clock: clock, expiry: .seconds(2), leaseDuration: .seconds(3))
        var tasks: [(replica: Int, task: Task<Int, any Error>)] = []
        var payloads: [UInt64: [UInt8]] = [:]
        var lastVersion: UInt64 = 0
        var lastDates = [Date?](repeating: nil, count: 4)
        var pending: [(replica: Int, version: UInt64)] = []
        for _ in 0..<200 {
            let replica = Int.random(in: 0..<4, using: &random)
            let duration = Duration.milliseconds(Int.random(in: 1...4_000, using: &random))
            tasks.append(
                (
                    replica,
                    clock.task {
                        try await replicas[replica].family.value(for: 1) { _ in
                            try await clock.sleep(for: duration)
                            return counter.withLock { value -> Int in
                                value += 1
                                return value
                            }
                        }
                    }
                ))
            if Int.random(in: 0..<10, using: &random) == 0 { level.loseLease(on: "numbers:1") }
            if Int.random(in: 0..<12, using: &random) == 0 { level.isDown.toggle() }
            if Int.random(in: 0..<6, using: &random) == 0 {
                replicas[Int.random(in: 0..<4, using: &random)].family.invalidate(1)
            }
            // A change: the key marked stale in the second level with a new version, announced to
            // every replica by a message that arrives later, in any order with the others.
            if Int.random(in: 0..<8, using: &random) == 0, let version = try? await level.invalidate("numbers:1") {
                for replica in 0..<4 { pending.append((replica, version)) }
            }
            pending.shuffle(using: &random)
            while let delivery = pending.last, Int.random(in: 0..<3, using: &random) == 0 {
                pending.removeLast()
                replicas[delivery.replica].family.core.invalidate(1, version: delivery.version)
            }
            await clock.advance(by: .milliseconds(Int.random(in: 0...700, using: &random)))
            if let entry = level.entry(for: "numbers:1") {
                #expect(entry.version >= lastVersion)
                if let earlier = payloads[entry.version] { #expect(earlier == entry.payload) }
                payloads[entry.version] = entry.payload
                lastVersion = entry.version
            }
            for (index, replica) in replicas.enumerated() {
                guard let date = replica.family.snapshot(for: 1)?.lastSuccess else { continue }
                if let last = lastDates[index] { #expect(date >= last, "replica \(index)'s data got older") }
                lastDates[index] = date
            }
        }
        await clock.advance(by: .seconds(30))
        var lastSeen = [Int](repeating: 0, count: 4)
        for (replica, task) in tasks {
            let value = try await task.value
            #expect(value >= lastSeen[replica], "replica \(replica) went back from \(lastSeen[replica]) to \(value)")
            lastSeen[replica] = max(lastSeen[replica], value)
        }
        #expect(lastVersion > 1)
    }
}

/// Invalidations across replicas with a second level: the change is loaded once for the fleet, and
/// messages carry versions.
@Suite struct SecondLevelInvalidationTests {
    /// One replica of a service with a second level: its family, its invalidator on the network.
    struct Node {
        let family: AsyncStateFamily<Int, Int>
        let invalidator: AsyncStateInvalidator
        let bus: InMemoryInvalidationNetwork.Bus
        let runner: Task<Void, Never>

        init(
            level: InMemorySecondLevel, network: InMemoryInvalidationNetwork, clock: VirtualClock,
            recovery: AsyncStateInvalidator.Recovery? = .init()
        ) async {
            family = AsyncStateFamily<Int, Int>(
                expiry: .seconds(120), clock: clock,
                secondLevel: AsyncStateSecondLevelOptions(level: level.replica(), namespace: "numbers", codec: .json))
            bus = network.bus()
            invalidator = AsyncStateInvalidator(
                bus: bus, invalidateAllInterval: .zero, clock: clock, recovery: recovery)
            invalidator.subscribe(family, to: "numbers")
            let invalidator = invalidator
            runner = Task { await invalidator.run() }
            let bus = bus
            _ = await soon { bus.listenerCount == 1 && invalidator.deliveriesApplied == 1 }
        }
    }

    /// Three replicas on one second level and one network that have each read key 7 (value 1) from a
    /// source that counts its calls (one so far) and answers `source.value`.
    func threeReplicasHoldingKey7(recovery: AsyncStateInvalidator.Recovery? = .init()) async throws -> (
        VirtualClock, InMemorySecondLevel, LockedValue<(calls: Int, value: Int)>,
        @Sendable (Int) async throws -> Int, [Node]
    ) {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let network = InMemoryInvalidationNetwork()
        let source = LockedValue((calls: 0, value: 1))
        let operation: @Sendable (Int) async throws -> Int = { _ in
            source.withLock { source in
                source.calls += 1
                return source.value
            }
        }
        var nodes: [Node] = []
        for _ in 0..<3 { nodes.append(await Node(level: level, network: network, clock: clock, recovery: recovery)) }
        for node in nodes { #expect(try await node.family.value(for: 7, operation) == 1) }
        #expect(source.withLock { $0.calls } == 1)
        return (clock, level, source, operation, nodes)
    }

    /// Three replicas hold a key; a change made through one of them (its invalidator marks the key
    /// stale in the second level, with a new version, and tells the others): every replica then
    /// serves the new value, for one more source call in all, not three.
    @Test func aChangeThroughOneReplicaIsLoadedOnceForTheFleet() async throws {
        let (_, level, source, operation, nodes) = try await threeReplicasHoldingKey7()

        source.withLock { $0.value = 2 }
        try await nodes[0].invalidator.invalidate("numbers", key: "7")
        #expect(level.entry(for: "numbers:7")?.version == 2)
        #expect(await soon { nodes.allSatisfy { $0.family.snapshot(for: 7)?.isExpired == true } })
        for node in nodes { #expect(try await node.family.value(for: 7, operation) == 2) }
        #expect(source.withLock { $0.calls } == 2)
        #expect(level.entry(for: "numbers:7")?.version == 3)
        for node in nodes { node.runner.cancel() }
    }

    /// A change the invalidator cannot mark in the second level (it is down for that moment): the
    /// message carries no version, and no replica takes the old entry back from the second level,
    /// where it is still fresh; the first to miss loads the new value, once, and the others take it.
    /// Without recovery, so that the mark is never made later (with it, the owed mark is made once
    /// the second level is back: `InvalidationRecoveryTests`).
    @Test func aChangeTheSecondLevelMissedIsNotUndoneByItsOldEntry() async throws {
        let (clock, level, source, operation, nodes) = try await threeReplicasHoldingKey7(recovery: nil)

        source.withLock { $0.value = 2 }
        level.isDown = true
        try await nodes[0].invalidator.invalidate("numbers", key: "7")
        level.isDown = false
        #expect(level.entry(for: "numbers:7")?.version == 1)  // unmarked: the old entry, still fresh
        #expect(await soon { nodes.allSatisfy { $0.family.snapshot(for: 7)?.isExpired == true } })
        // The writer's failed mark was a fault: it skips the second level for the backoff.
        await clock.advance(by: .seconds(1))
        for node in nodes { #expect(try await node.family.value(for: 7, operation) == 2) }
        #expect(source.withLock { $0.calls } == 2)
        #expect(nodes.map { $0.family.secondLevelStatistics?.hits } == [0, 2, 2])
        #expect(level.entry(for: "numbers:7")?.version == 2)
        for node in nodes { node.runner.cancel() }
    }

    /// A replica whose data is already the message's version (or newer) ignores it: a duplicate, a
    /// replay or a late message costs nothing; one with an older version invalidates and takes no
    /// entry older than the version it names.
    @Test func aReplicaThatHoldsTheVersionIgnoresTheMessage() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let network = InMemoryInvalidationNetwork()
        let node = await Node(level: level, network: network, clock: clock)
        let calls = LockedValue(0)
        let operation: @Sendable (Int) async throws -> Int = { key in
            calls.withLock { calls in
                calls += 1
                return key * 100 + calls
            }
        }
        #expect(try await node.family.value(for: 4, operation) == 401)  // version 1
        let applied = node.invalidator.deliveriesApplied
        for _ in 0..<1_000 {
            node.invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "numbers", key: "4", version: 1)))
        }
        #expect(node.invalidator.deliveriesApplied == applied + 1_000)
        #expect(node.family.snapshot(for: 4)?.isExpired == false)
        #expect(try await node.family.value(for: 4, operation) == 401)
        #expect(calls.withLock { $0 } == 1)

        // Version 5 is newer: the entry (version 1) is not taken; the key is loaded, once, for
        // however many copies of the message arrive.
        for _ in 0..<1_000 {
            node.invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "numbers", key: "4", version: 5)))
        }
        #expect(node.family.snapshot(for: 4)?.isExpired == true)
        #expect(try await node.family.value(for: 4, operation) == 402)
        #expect(calls.withLock { $0 } == 2)
        #expect(level.entry(for: "numbers:4")?.version == 2)
        node.runner.cancel()
    }

    /// A message without a version still invalidates a family with a second level (a sender whose
    /// second level failed, or without one), and a family or a state without a second level ignores
    /// the version.
    @Test func aMessageWithoutAVersionStillInvalidates() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let network = InMemoryInvalidationNetwork()
        let node = await Node(level: level, network: network, clock: clock)
        let plain = AsyncStateFamily<Int, Int>(expiry: .seconds(120), clock: clock)
        node.invalidator.subscribe(plain, to: "numbers")
        _ = try await node.family.value(for: 1) { $0 }
        _ = try await plain.value(for: 1) { $0 }
        node.invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "numbers", key: "1")))
        #expect(node.family.snapshot(for: 1)?.isExpired == true)
        #expect(plain.snapshot(for: 1)?.isExpired == true)
        // A subscriber without a second level ignores versions: the same version again, or an
        // older one, invalidates it each time (a family's key and a whole state alike).
        let state = AsyncState(wrappedValue: 0, expiry: .seconds(120), clock: clock)
        node.invalidator.subscribe(state, to: "numbers")
        for version: UInt64 in [9, 9, 3] {
            _ = try await plain.value(for: 1) { $0 }
            _ = try await state.value { 1 }
            node.invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "numbers", key: "1", version: version)))
            #expect(plain.snapshot(for: 1)?.isExpired == true, "version \(version)")
            #expect(state.snapshot.isExpired, "version \(version)")
        }
        node.runner.cancel()
    }

    /// A refresh goes to the source even when the second level holds a fresh entry, and writes a
    /// newer version.
    @Test func aRefreshLoadsFromTheSource() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let network = InMemoryInvalidationNetwork()
        let (a, b) = (
            await Node(level: level, network: network, clock: clock),
            await Node(level: level, network: network, clock: clock)
        )
        let calls = LockedValue(0)
        let operation: @Sendable (Int) async throws -> Int = { _ in
            calls.withLock {
                $0 += 1
                return $0
            }
        }
        #expect(try await a.family.value(for: 2, operation) == 1)
        #expect(try await b.family.value(for: 2, operation) == 1)
        await b.family.refresh(for: 2, operation)
        #expect(b.family[2] == 2)
        #expect(calls.withLock { $0 } == 2)
        #expect(level.entry(for: "numbers:2")?.version == 2)
        a.runner.cancel()
        b.runner.cancel()
    }

    /// A message's key is marked in the second level as the family's loads name it: `"007"` parses
    /// to key 7, whose entry is `numbers:7`.
    @Test func theSecondLevelKeyIsTheParsedKeys() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let node = await Node(level: level, network: InMemoryInvalidationNetwork(), clock: clock)
        _ = try await node.family.value(for: 7) { $0 }
        try await node.invalidator.invalidate("numbers", key: "007")
        #expect(level.entry(for: "numbers:7")?.version == 2)
        #expect(level.entry(for: "numbers:007") == nil)
        #expect(node.family.snapshot(for: 7)?.isExpired == true)
        node.runner.cancel()
    }

    /// A whole-topic change fences every key: a holder that loaded before it cannot write its value
    /// over it, and its own value lands expired.
    @Test func aWholeTopicChangeFencesHoldersLoadingMeanwhile() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let node = await Node(level: level, network: InMemoryInvalidationNetwork(), clock: clock)
        let loading = clock.task {
            try await node.family.value(for: 3) { _ in
                try await clock.sleep(for: .seconds(1))
                return 30
            }
        }
        await clock.advance(by: .milliseconds(500))
        try await node.invalidator.invalidate("numbers")
        await clock.advance(by: .seconds(1))
        #expect(try await loading.value == 30)
        #expect(level.entry(for: "numbers:3")?.version == 2)
        #expect(level.entry(for: "numbers:3")?.payload.isEmpty == true)
        #expect(node.family.snapshot(for: 3)?.isExpired == true)
        #expect(node.family.secondLevelStatistics?.refusedWrites == 1)
        node.runner.cancel()
    }

    /// The version is signed: a message whose version was changed on the way is rejected.
    @Test func theVersionIsSigned() {
        let signed = AsyncStateInvalidation(topic: "numbers", key: "4", version: 5)
        var changed = signed
        changed.version = 6
        #expect(signed.signedContent == "7:numbers1:4@5")
        #expect(signed.signedContent != changed.signedContent)
        #expect(AsyncStateInvalidation(topic: "numbers", key: "4").signedContent == "7:numbers1:4")
        #expect(signed.description == "numbers/4@5")
    }
}

/// A single state with a second level: its entry is its namespace's.
@Suite struct SecondLevelStateTests {
    /// Three replicas' states, 100 concurrent callers each, cold: one source call. A change through
    /// one replica's invalidator: one more, for all three.
    @Test func threeReplicasOfAStateShareOneLoadAndOneReloadPerChange() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let network = InMemoryInvalidationNetwork()
        let source = LockedValue((calls: 0, value: 1))
        let operation: @Sendable () async throws -> Int = {
            let value = source.withLock { source in
                source.calls += 1
                return source.value
            }
            try await clock.sleep(for: .seconds(1))
            return value
        }
        var states: [AsyncState<Int>] = []
        var invalidators: [AsyncStateInvalidator] = []
        var runners: [Task<Void, Never>] = []
        for _ in 0..<3 {
            let state = AsyncState<Int>(
                wrappedValue: 0, expiry: .seconds(60), clock: clock,
                secondLevel: AsyncStateSecondLevelOptions(level: level.replica(), namespace: "config", codec: .json))
            let bus = network.bus()
            let invalidator = AsyncStateInvalidator(bus: bus, invalidateAllInterval: .zero, clock: clock)
            invalidator.subscribe(state, to: "config")
            runners.append(Task { await invalidator.run() })
            _ = await soon { bus.listenerCount == 1 && invalidator.deliveriesApplied == 1 }
            (states, invalidators) = (states + [state], invalidators + [invalidator])
        }
        let callers = states.flatMap { state in (0..<100).map { _ in clock.task { try await state.value(operation) } } }
        await clock.advance(by: .seconds(1))
        await clock.advance(by: .milliseconds(25))
        for caller in callers { #expect(try await caller.value == 1) }
        #expect(source.withLock { $0.calls } == 1)
        #expect(level.entry(for: "config:")?.version == 1)

        source.withLock { $0.value = 2 }
        try await invalidators[1].invalidate("config")
        #expect(await soon { states.allSatisfy { $0.snapshot.isExpired } })
        let again = states.map { state in clock.task { try await state.value(operation) } }
        await clock.advance(by: .seconds(1))
        await clock.advance(by: .milliseconds(25))
        for caller in again { #expect(try await caller.value == 2) }
        #expect(source.withLock { $0.calls } == 2)
        #expect(level.entry(for: "config:")?.version == 3)
        #expect(states.map { $0.secondLevelStatistics?.hits ?? 0 }.reduce(0, +) == 4)

        // A write through one replica: stored in the second level, taken there by the others.
        await clock.advance(by: .seconds(1))
        try await invalidators[2].set(3, in: states[2], topic: "config")
        #expect(states[2].snapshot.value == 3 && !states[2].snapshot.isExpired)
        #expect(await soon { states.dropLast().allSatisfy { $0.snapshot.isExpired } })
        for state in states { #expect(try await state.value(operation) == 3) }
        #expect(source.withLock { $0.calls } == 2)
        for runner in runners { runner.cancel() }
    }

    /// A hit never reads the second level; a refresh calls the source.
    @Test func aHitNeverReadsItAndARefreshCallsTheSource() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let calls = LockedValue(0)
        let state = AsyncState<Int>(
            wrappedValue: 0, clock: clock,
            secondLevel: AsyncStateSecondLevelOptions(level: level, namespace: "s", codec: .json))
        let operation: @Sendable () async throws -> Int = {
            calls.withLock {
                $0 += 1
                return $0
            }
        }
        #expect(try await state.value(operation) == 1)
        let reads = level.counts.reads
        #expect(try await state.value(operation) == 1)
        #expect(level.counts.reads == reads)
        await state.refresh(operation)
        #expect(state.wrappedValue == 2)
        #expect(level.entry(for: "s:")?.version == 2)
    }
}

/// An owner whose family's operations capture it, with a second level.
final class SecondLevelOwner: Sendable {
    let family: AsyncStateFamily<Int, Int>
    let freed: DeinitFlag
    let gate = LockedValue<[CheckedContinuation<Void, Never>]>([])

    init(level: InMemorySecondLevel, freed: DeinitFlag) {
        family = AsyncStateFamily<Int, Int>(
            expiry: .seconds(3_600),
            secondLevel: AsyncStateSecondLevelOptions(level: level.replica(), namespace: "owned", codec: .json))
        self.freed = freed
    }
    deinit { freed.set() }

    func load(_ key: Int) async throws -> Int {
        switch key {
        case 1: return 10
        case 2: throw SourceDown()
        default:
            // Never answers until cancelled: it ignores cancellation until released.
            await withCheckedContinuation { continuation in gate.withLock { $0.append(continuation) } }
            throw CancellationError()
        }
    }

    func release() {
        for continuation in gate.withLock({ gate in
            defer { gate = [] }
            return gate
        }) { continuation.resume() }
    }

    func current(_ key: Int) async throws -> Int { try await family.value(for: key) { try await self.load($0) } }
}

/// On the real clock: an owner captured by its family's operations is freed after a load through the
/// second level that succeeded, failed, or was cancelled (its operation ignoring the cancellation),
/// and after a hit from the second level; and extreme durations neither trap nor hang.
@Suite struct SecondLevelLifetimeTests {
    @Test func anOwnerCapturedThroughTheSecondLevelIsFreed() async throws {
        let level = InMemorySecondLevel(clock: ContinuousClock())
        for scenario in ["success", "failure", "cancel", "hit"] {
            let freed = DeinitFlag()
            var owner: SecondLevelOwner? = SecondLevelOwner(level: level, freed: freed)
            switch scenario {
            case "success": #expect(try await owner!.current(1) == 10)
            case "failure": await #expect(throws: SourceDown.self) { try await owner!.current(2) }
            case "cancel":
                let caller = Task { [owner] in try await owner!.current(3) }
                while level.counts.leasesAcquired < 1 { try await Task.sleep(for: .milliseconds(1)) }
                caller.cancel()
                _ = try? await caller.value
                owner!.release()
            default:
                // Another replica wrote key 1 (the "success" scenario): this one reads it.
                #expect(try await owner!.current(1) == 10)
                #expect(owner!.family.secondLevelStatistics?.hits == 1)
            }
            owner = nil
            let deadline = ContinuousClock.now + .seconds(5)
            while !freed.isSet, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(2)) }
            #expect(freed.isSet, "\(scenario)")
        }
    }

    /// The largest durations on `ContinuousClock` (which converts deadlines, and traps on overflow):
    /// a load, a hit, a fault with its backoff. A zero timeout is a millisecond, not "never".
    @Test func extremeDurationsOnTheRealClockNeitherTrapNorHang() async throws {
        let level = InMemorySecondLevel(clock: ContinuousClock())
        let huge = Duration.seconds(Int64.max)
        let family = AsyncStateFamily<Int, Int>(
            expiry: huge, refreshAfter: huge,
            secondLevel: AsyncStateSecondLevelOptions(
                level: level, namespace: "huge", codec: .json, timeout: huge, leaseDuration: huge, pollInterval: huge,
                maximumWait: huge, faultBackoff: huge, maximumFaultBackoff: huge))
        #expect(try await family.value(for: 1) { $0 } == 1)
        let other = AsyncStateFamily<Int, Int>(
            expiry: huge, secondLevel: AsyncStateSecondLevelOptions(level: level, namespace: "huge", codec: .json))
        #expect(try await other.value(for: 1) { _ in -1 } == 1)
        level.isDown = true
        #expect(try await family.value(for: 2) { $0 } == 2)
        #expect(try await family.value(for: 3) { $0 } == 3)
        #expect(family.secondLevelStatistics?.faults == 1)
        #expect(family.secondLevelStatistics?.skipped == 1)
        let options = AsyncStateSecondLevelOptions<Int>(
            level: level, namespace: "zero", codec: .json, timeout: .zero, pollInterval: .seconds(-5),
            faultBackoff: .seconds(-1))
        #expect(options.timeout == .milliseconds(1))
        #expect(options.pollInterval == .milliseconds(1))
        #expect(options.faultBackoff == .zero)
    }
}

/// Two observers as one.
private struct Both: AsyncStateObserver {
    let first: any AsyncStateObserver
    let second: any AsyncStateObserver

    func observe(_ event: AsyncStateEvent) {
        first.observe(event)
        second.observe(event)
    }
}

/// The envelope around every payload.
@Suite struct SecondLevelCodecTests {
    @Test func aValueRoundTripsInItsEnvelope() throws {
        struct Profile: Codable, Equatable, Sendable {
            var name: String
            var age: Int
        }
        let codec = AsyncStateCodec<Profile>.json(tag: "profile-v1")
        let payload = try codec.encode(Profile(name: "Ada", age: 36))
        #expect(Array(payload.prefix(6)) == [0x41, 0x53, 0x4C, 0x32, 1, 10])
        #expect(try codec.decode(payload) == Profile(name: "Ada", age: 36))
    }

    @Test func aForeignTruncatedOrOtherTagPayloadThrows() throws {
        let codec = AsyncStateCodec<Int>.json
        let payload = try codec.encode(5)
        #expect(throws: AsyncStateCodecError.notAnEnvelope) { try codec.decode([]) }
        #expect(throws: AsyncStateCodecError.notAnEnvelope) { try codec.decode(Array("{\"a\":1}".utf8)) }
        #expect(throws: AsyncStateCodecError.notAnEnvelope) { try codec.decode(Array(payload.prefix(7))) }
        #expect(throws: AsyncStateCodecError.unknownFormat(2)) {
            try codec.decode([0x41, 0x53, 0x4C, 0x32, 2] + payload.dropFirst(5))
        }
        #expect(throws: AsyncStateCodecError.otherTag("json")) {
            try AsyncStateCodec<Int>.json(tag: "jsov").decode(payload)
        }
        #expect(throws: AsyncStateCodecError.self) { try AsyncStateCodec<String>.json.decode(payload) }
    }

    /// A payload past ``AsyncStateCodec/maximumPayloadBytes`` is neither written nor read (before it
    /// is parsed); a family serves such a value from memory and stores nothing in the second level.
    @Test func aPayloadPastTheCapIsNeitherWrittenNorRead() async throws {
        let codec = AsyncStateCodec<String>.json
        let cap = AsyncStateCodec<String>.maximumPayloadBytes
        let fits = String(repeating: "a", count: cap - 6 - 4 - 2)  // envelope, tag, quotes
        #expect(try codec.encode(fits).count == cap)
        #expect(throws: AsyncStateCodecError.tooLarge(bytes: cap + 1)) { try codec.encode(fits + "a") }
        let planted = try codec.encode(fits) + [0x20]
        #expect(throws: AsyncStateCodecError.tooLarge(bytes: cap + 1)) { try codec.decode(planted) }

        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let family = AsyncStateFamily<Int, String>(
            expiry: .seconds(60), clock: clock,
            secondLevel: AsyncStateSecondLevelOptions(
                level: level.replica(), namespace: "big", codec: .json, timeout: .seconds(1)))
        #expect(try await family.value(for: 1) { _ in fits + "a" } == fits + "a")
        #expect(try await level.replica().read("big:1") == nil)
    }

    @Test func aLongTagKeepsItsFirst255Bytes() throws {
        let codec = AsyncStateCodec<Int>.json(tag: String(repeating: "t", count: 300))
        #expect(codec.tag.utf8.count == 255)
        #expect(try codec.decode(codec.encode(3)) == 3)
    }
}

/// Opens once; whoever waits before that waits until it does.
final class Gate: Sendable {
    private let stream: AsyncStream<Void>
    private let continuation: AsyncStream<Void>.Continuation

    init() { (stream, continuation) = AsyncStream.makeStream() }

    func open() { continuation.finish() }

    func wait() async { for await _ in stream {} }
}

/// A replica's connection to an `InMemorySecondLevel` that tells a test of its reads and releases,
/// and can hold a lease request back: to put another replica's steps between two of this one's.
final class GatedConnection: AsyncStateSecondLevel {
    let connection: InMemorySecondLevel.Replica
    private let calls = LockedValue((reads: 0, acquires: 0))
    private let afterRead: @Sendable (Int) -> Void
    private let beforeAcquire: @Sendable (Int) async -> Void
    private let afterRelease: @Sendable () -> Void

    init(
        _ connection: InMemorySecondLevel.Replica, afterRead: @escaping @Sendable (Int) -> Void = { _ in },
        beforeAcquire: @escaping @Sendable (Int) async -> Void = { _ in },
        afterRelease: @escaping @Sendable () -> Void = {}
    ) {
        self.connection = connection
        (self.afterRead, self.beforeAcquire, self.afterRelease) = (afterRead, beforeAcquire, afterRelease)
    }

    /// How many reads and lease requests it was asked for.
    var counts: (reads: Int, acquires: Int) { calls.withLock { $0 } }

    func read(_ key: String) async throws -> AsyncStateStoredEntry? {
        let entry = try await connection.read(key)
        afterRead(
            calls.withLock { calls in
                calls.reads += 1
                return calls.reads
            })
        return entry
    }

    func write(_ entry: AsyncStateStoredEntry, for key: String) async throws -> Bool {
        try await connection.write(entry, for: key)
    }

    func acquireLease(on key: String, for duration: Duration) async throws -> AsyncStateLease {
        let number = calls.withLock { calls in
            calls.acquires += 1
            return calls.acquires
        }
        await beforeAcquire(number)
        return try await connection.acquireLease(on: key, for: duration)
    }

    func releaseLease(on key: String, token: UInt64) async throws {
        try await connection.releaseLease(on: key, token: token)
        afterRelease()
    }

    func invalidate(_ key: String) async throws -> UInt64 { try await connection.invalidate(key) }

    func invalidateAll(withPrefix prefix: String) async throws {
        try await connection.invalidateAll(withPrefix: prefix)
    }
}
