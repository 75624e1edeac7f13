import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// Sealed second-level entries (``AsyncStateEntryAuthenticator``): what replicas of the fleet write
/// is shared as before (a write through the invalidator too: see
/// `InvalidationRecoveryTests/aWriteThroughOneReplicaCostsTheOthersNoSourceCall`); what anyone else
/// writes — unsealed, sealed with another secret, a real seal moved to another key, version or
/// date — is never served, is counted, and is replaced by the next load.
@Suite struct SecondLevelSealTests {
    /// A keyed checksum standing in for HMAC in these tests (the library has no cryptography; the
    /// example service uses HMAC-SHA256): it seals with the first secret and accepts any.
    struct Sealer: AsyncStateEntryAuthenticator {
        var secrets: [UInt64]

        static func checksum(_ content: [UInt8], secret: UInt64) -> [UInt8] {
            var hash: UInt64 = 0xcbf2_9ce4_8422_2325 ^ secret
            for byte in content { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
            hash ^= secret &* 0x9e37_79b9_7f4a_7c15
            return (0..<8).map { UInt8(truncatingIfNeeded: hash >> ($0 * 8)) }
        }

        func seal(_ content: [UInt8]) -> [UInt8] { Self.checksum(content, secret: secrets[0]) }

        func isValid(_ seal: [UInt8], for content: [UInt8]) -> Bool {
            secrets.contains { Self.checksum(content, secret: $0) == seal }
        }
    }

    static let fleet = Sealer(secrets: [0x5EC2E7])

    /// A replica's family on `level`, sealing with `sealer` (none: `nil`).
    static func replica(
        on level: InMemorySecondLevel, clock: VirtualClock, sealer: Sealer? = fleet, maxStaleAge: Duration? = nil
    ) -> AsyncStateFamily<Int, Int> {
        AsyncStateFamily<Int, Int>(
            expiry: .seconds(120), clock: clock, maxStaleAge: maxStaleAge,
            secondLevel: AsyncStateSecondLevelOptions(
                level: level.replica(), namespace: "numbers", codec: .json, authenticator: sealer))
    }

    /// Whether `entry` is sealed by `sealer` for `key`, and holds `value`.
    static func holds(_ entry: AsyncStateStoredEntry?, _ value: Int, key: String, sealer: Sealer = fleet) -> Bool {
        guard let entry, let envelope = try? EntrySeal.envelope(of: entry, key: key, authenticator: sealer) else {
            return false
        }
        return (try? AsyncStateCodec<Int>.json.decode(envelope)) == value
    }

    /// One replica's load is sealed, and another takes it without a source call; the seal is in the
    /// payload, after the codec's envelope.
    @Test func aSealedEntryIsSharedAsBefore() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock)
        let (first, second) = (Self.replica(on: level, clock: clock), Self.replica(on: level, clock: clock))
        let loading = clock.task { try await first.value(for: 6, source.operation) }
        await clock.advance(by: .seconds(1))
        #expect(try await loading.value == 61)
        let entry = try #require(level.entry(for: "numbers:6"))
        #expect(Self.holds(entry, 61, key: "numbers:6"))
        #expect(entry.payload.count == (try AsyncStateCodec<Int>.json.encode(61)).count + 9)
        #expect((try? AsyncStateCodec<Int>.json.decode(entry.payload)) == nil)
        #expect(try await second.value(for: 6, source.operation) == 61)
        #expect(source.calls.count == 1)
        #expect(second.secondLevelStatistics?.hits == 1)
    }

    /// Every way to plant an entry without the secret: no seal, another secret's, a real seal of
    /// another key, a real entry with its version or its freshness raised, a seal altered, a seal
    /// that is only its length. Each is not served (the source is called, once), is counted, and is
    /// replaced by the load's sealed entry — its version above the planted one's.
    @Test func aPlantedEntryIsNeverServedAndIsReplaced() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let writer = Self.replica(on: level, clock: clock)
        // Real sealed entries of keys 6 and 7, to alter; key 8's is the one another key takes.
        for key in [6, 7, 8] { #expect(try await writer.value(for: key) { $0 * 10 } == key * 10) }
        let (six, seven, eight) = (
            try #require(level.entry(for: "numbers:6")), try #require(level.entry(for: "numbers:7")),
            try #require(level.entry(for: "numbers:8"))
        )
        #expect(Self.holds(seven, 70, key: "numbers:7"))
        let envelope = try AsyncStateCodec<Int>.json.encode(99)
        let later = clock.startDate + 3_600
        let other = try #require(
            EntrySeal.entry(
                envelope, key: "numbers:7", version: 40, succeededAt: clock.startDate, freshUntil: later,
                authenticator: Sealer(secrets: [1])))
        // Each a real entry of its own key with one thing changed: the seal must cover it.
        var raised = seven
        raised.version = 1_000
        var extended = six
        extended.freshUntil = later
        var backdated = six
        backdated.succeededAt -= 1
        var flipped = seven
        flipped.payload[flipped.payload.count - 2] ^= 1
        let forgeries: [(String, Int, AsyncStateStoredEntry)] = [
            (
                "unsealed", 7,
                AsyncStateStoredEntry(payload: envelope, succeededAt: clock.startDate, freshUntil: later, version: 40)
            ),
            ("another secret", 7, other), ("another key's", 7, eight), ("version raised", 7, raised),
            ("freshness raised", 6, extended), ("success date changed", 6, backdated), ("seal altered", 7, flipped),
            (
                "length only", 7,
                AsyncStateStoredEntry(
                    payload: envelope + [0], succeededAt: clock.startDate, freshUntil: later, version: 40)
            ),
        ]
        for (name, key, forgery) in forgeries {
            let source = KeyedSource(clock: clock)
            level.overwrite(forgery, for: "numbers:\(key)")
            let log = EventLog()
            let reader = AsyncStateFamily<Int, Int>(
                expiry: .seconds(120), clock: clock, observer: log,
                secondLevel: AsyncStateSecondLevelOptions(
                    level: level.replica(), namespace: "numbers", codec: .json, authenticator: Self.fleet))
            let caller = clock.task { try await reader.value(for: key, source.operation) }
            await clock.advance(by: .seconds(1))
            #expect(try await caller.value == key * 10 + 1, "\(name)")
            #expect(source.calls.count == 1, "\(name)")
            #expect(reader.secondLevelStatistics?.undecodable == 1, "\(name)")
            #expect(
                log.all.contains { $0.contains("undecodable") && $0.contains("has no valid seal") },
                "\(name)")
            let replaced = try #require(level.entry(for: "numbers:\(key)"))
            #expect(Self.holds(replaced, key * 10 + 1, key: "numbers:\(key)"), "\(name)")
            #expect(replaced.version > forgery.version, "\(name)")
        }
    }

    /// A sealed entry's dates are down to the millisecond, and the replica that loaded it holds its
    /// value with that date: after an invalidation that names no version (a bus that reconnected),
    /// it does not take its own entry back — whichever way the millisecond would round.
    @Test(arguments: [0.000_3, 0.000_7])
    func aReplicaDoesNotTakeItsOwnSealedEntryBack(fraction: Double) async throws {
        let clock = VirtualClock(startDate: Date(timeIntervalSinceReferenceDate: 1_000 + fraction))
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock, duration: .zero)
        let replica = Self.replica(on: level, clock: clock)
        #expect(try await replica.value(for: 3, source.operation) == 31)
        let entry = try #require(level.entry(for: "numbers:3"))
        #expect(entry.succeededAt <= clock.startDate && entry.succeededAt > clock.startDate - 0.001)
        #expect(replica.snapshot(for: 3)?.lastSuccess == entry.succeededAt)
        replica.invalidate(3)
        #expect(try await replica.value(for: 3, source.operation) == 32)
        #expect(source.calls.count == 2)
    }

    /// Fail-safe from the second level takes a sealed entry and never a planted one: a replica with
    /// nothing whose source is down answers the failure rather than the forgery.
    @Test func aPlantedEntryIsNeverAFallback() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source: @Sendable (Int) async throws -> Int = { _ in throw SourceDown() }
        let stale = clock.startDate - 30
        level.overwrite(
            try #require(
                EntrySeal.entry(
                    try AsyncStateCodec<Int>.json.encode(50), key: "numbers:5", version: 3, succeededAt: stale,
                    freshUntil: stale + 1, authenticator: Self.fleet)),
            for: "numbers:5")
        level.overwrite(
            AsyncStateStoredEntry(
                payload: try AsyncStateCodec<Int>.json.encode(66), succeededAt: stale, freshUntil: stale + 1, version: 3
            ),
            for: "numbers:6")
        let replica = Self.replica(on: level, clock: clock, maxStaleAge: .seconds(600))
        #expect(try await replica.value(for: 5, source) == 50)
        await #expect(throws: SourceDown.self) { try await replica.value(for: 6, source) }
        #expect(replica.snapshot(for: 6)?.hasValue != true)
        #expect(replica.secondLevelStatistics?.undecodable == 1)
    }

    /// A rolling change of the secret: a replica that accepts [new, old] takes what the old secret
    /// sealed; one still on [old] refuses what the new one sealed — a source call, never a wrong
    /// value — and one without a secret is refused by both (and refuses theirs, which do not
    /// decode without one).
    @Test func aRollingChangeOfTheSecretCostsCallsNeverWrongValues() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let source = KeyedSource(clock: clock, duration: .zero)
        let old = Sealer(secrets: [1])
        let both = Sealer(secrets: [2, 1])
        let (onOld, onBoth, unsealed) = (
            Self.replica(on: level, clock: clock, sealer: old), Self.replica(on: level, clock: clock, sealer: both),
            Self.replica(on: level, clock: clock, sealer: nil)
        )
        #expect(try await onOld.value(for: 1, source.operation) == 11)
        #expect(try await onBoth.value(for: 1, source.operation) == 11)  // the old seal, accepted
        #expect(source.calls.count == 1)
        #expect(try await onBoth.value(for: 2, source.operation) == 21)
        #expect(Self.holds(level.entry(for: "numbers:2"), 21, key: "numbers:2", sealer: Sealer(secrets: [2])))
        #expect(try await onOld.value(for: 2, source.operation) == 22)  // the new seal, refused
        #expect(onOld.secondLevelStatistics?.undecodable == 1)
        #expect(try await unsealed.value(for: 2, source.operation) == 23)  // a sealed payload does not decode
        #expect(unsealed.secondLevelStatistics?.undecodable == 1)
        #expect(try await unsealed.value(for: 3, source.operation) == 31)
        #expect(try await onBoth.value(for: 3, source.operation) == 32)  // an unsealed entry, refused
        #expect(onBoth.secondLevelStatistics?.undecodable == 1)
    }

    /// The seal covers dates to the millisecond, and a sealed entry's dates are written on whole
    /// milliseconds (down, never later): a store that keeps them to the microsecond (a `timestamptz`
    /// column; the example's table keeps the exact seconds) keeps the seal valid.
    @Test func aStoreThatRoundsDatesToTheMicrosecondKeepsTheSeal() throws {
        let envelope = try AsyncStateCodec<Int>.json.encode(1)
        for offset in [0.0, 0.000_4999, 0.000_5, 0.123_456_789, 1e9 + 0.987_654_321] {
            let date = Date(timeIntervalSince1970: 1.7e9 + offset)
            var entry = try #require(
                EntrySeal.entry(
                    envelope, key: "k", version: 9, succeededAt: date, freshUntil: date + 60,
                    authenticator: Self.fleet))
            let micro: (Date) -> Date = {
                Date(timeIntervalSince1970: ($0.timeIntervalSince1970 * 1e6).rounded() / 1e6)
            }
            (entry.succeededAt, entry.freshUntil) = (micro(entry.succeededAt), micro(entry.freshUntil))
            #expect(Self.holds(entry, 1, key: "k"), "offset \(offset)")
            let shift = date.timeIntervalSince(entry.succeededAt)
            #expect(shift >= -1e-6 && shift < 0.001 + 1e-6, "offset \(offset)")
        }
    }
}
