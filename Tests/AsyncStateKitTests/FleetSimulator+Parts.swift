import AsyncStateTesting
import Foundation

@testable import AsyncStateKit

// The simulation's parts: its replicas, its source, and the second levels and observer it gives
// them (see ``FleetSimulation``).

extension FleetSimulation {
    /// One replica: its family, its invalidator and bus, its connection to the second level, and the
    /// newest version it served of each key.
    final class Replica: Sendable {
        let family: AsyncStateFamily<Int, Int>
        let invalidator: AsyncStateInvalidator
        let bus: InMemoryInvalidationNetwork.Bus
        let connection: InMemorySecondLevel.Replica
        let runner: Task<Void, any Error>
        /// Announcements (changes, writes) it has started and not finished: a crash loses them.
        let announcing = LockedValue(0)
        private let newest: LockedValue<[Int: Int]>

        init(
            family: AsyncStateFamily<Int, Int>, invalidator: AsyncStateInvalidator,
            bus: InMemoryInvalidationNetwork.Bus, connection: InMemorySecondLevel.Replica,
            runner: Task<Void, any Error>,
            newest: LockedValue<[Int: Int]>
        ) {
            self.newest = newest
            (self.family, self.invalidator, self.bus, self.connection, self.runner) = (
                family, invalidator, bus, connection, runner
            )
        }

        /// Records that it served `value` for `key`; calls `older` with the newest it served before
        /// if `value` is older.
        func served(_ value: Int, for key: Int, older: (Int) -> Void) {
            let before = newest.withLock { newest -> Int? in
                defer { newest[key] = max(newest[key] ?? 0, value) }
                return newest[key]
            }
            if let before, value < before { older(before) }
        }

        func stop() async {
            runner.cancel()
            bus.shutDown()
            connection.isPartitioned = false
        }
    }

    /// The source: a version per key, which every change raises; a call answers the current one
    /// after a latency fixed by the seed, the key and the version.
    final class Source: Sendable {
        private let state: LockedValue<(versions: [Int], calls: Int, isDown: Bool)>
        private let clock: VirtualClock
        private let seed: UInt64
        private let hangs: Bool

        init(keys: Int, clock: VirtualClock, seed: UInt64, hangs: Bool) {
            state = LockedValue((Array(repeating: 1, count: keys), 0, false))
            (self.clock, self.seed, self.hangs) = (clock, seed, hangs)
        }

        var calls: Int { state.withLock { $0.calls } }
        var isDown: Bool {
            get { state.withLock { $0.isDown } }
            set { state.withLock { $0.isDown = newValue } }
        }
        func version(_ key: Int) -> Int { state.withLock { $0.versions[key] } }
        func change(_ key: Int) -> Int {
            state.withLock { state in
                state.versions[key] += 1
                return state.versions[key]
            }
        }

        var operation: @Sendable (Int) async throws -> Int {
            { [self] key in
                let (version, isDown) = state.withLock { state in
                    state.calls += 1
                    return (state.versions[key], state.isDown)
                }
                var mix = SplitMix64(seed: seed ^ UInt64(key) << 32 ^ UInt64(version))
                try await clock.sleep(for: .milliseconds(Int64(mix.next() % 100)))
                if isDown {
                    if hangs { try await clock.sleep(for: .seconds(10)) }
                    throw SourceDown()
                }
                return version
            }
        }
    }
}

/// Tells the simulation what a replica's second level did (its calls of the source), and — if it
/// `writes` — writes every event of the family into its schedule.
struct EventTrace: AsyncStateObserver {
    /// Weak: the simulation holds the families that hold this observer (a run would otherwise never
    /// be freed, and a long run of seeds would grow by every one).
    weak var simulation: FleetSimulation?
    let writes: Bool
    func observe(_ event: AsyncStateEvent) {
        guard let simulation else { return }
        if case .hit = event.kind { return }
        if case .secondLevel(let secondLevel) = event.kind {
            simulation.secondLevelReported(secondLevel, key: event.key)
        }
        if writes { simulation.noteEvent("  \(event.name) k\(event.key ?? "-") \(event.kind)") }
    }
}

/// A second level whose reads sometimes answer an older entry it saw, dated now (sabotage).
final class StaleReads: ForwardingSecondLevel {
    let connection: InMemorySecondLevel.Replica
    let clock: VirtualClock
    private let seen = LockedValue<[String: AsyncStateStoredEntry]>([:])
    private let count = LockedValue(0)

    init(connection: InMemorySecondLevel.Replica, clock: VirtualClock) {
        (self.connection, self.clock) = (connection, clock)
    }

    func read(_ key: String) async throws -> AsyncStateStoredEntry? {
        let entry = try await connection.read(key)
        let n = count.withLock {
            $0 += 1
            return $0
        }
        if n % 3 == 0, var old = seen.withLock({ $0[key] }) {
            let now = clock.startDate.addingTimeInterval(clock.now.offset.timeInterval)
            (old.succeededAt, old.freshUntil) = (now, now.addingTimeInterval(60))
            old.version = entry?.version ?? old.version
            return old
        }
        if let entry, !entry.payload.isEmpty { seen.withLock { $0[key] = $0[key] ?? entry } }
        return entry
    }
}

/// A second level that grants every lease request (sabotage): no fleet-wide single flight.
struct AlwaysGranted: ForwardingSecondLevel {
    let connection: InMemorySecondLevel.Replica

    func acquireLease(on key: String, for duration: Duration) async throws -> AsyncStateLease {
        switch try await connection.acquireLease(on: key, for: duration) {
        case .acquired(let token, let stored): return .acquired(token: token, storedVersion: stored)
        case .held: return .acquired(token: 0, storedVersion: nil)
        }
    }
}

/// A second level that passes every call to a replica's connection to an `InMemorySecondLevel`,
/// for a test to change one of them.
protocol ForwardingSecondLevel: AsyncStateSecondLevel {
    var connection: InMemorySecondLevel.Replica { get }
}

extension ForwardingSecondLevel {
    func read(_ key: String) async throws -> AsyncStateStoredEntry? { try await connection.read(key) }
    func write(_ entry: AsyncStateStoredEntry, for key: String) async throws -> Bool {
        try await connection.write(entry, for: key)
    }
    func acquireLease(on key: String, for duration: Duration) async throws -> AsyncStateLease {
        try await connection.acquireLease(on: key, for: duration)
    }
    func releaseLease(on key: String, token: UInt64) async throws {
        try await connection.releaseLease(on: key, token: token)
    }
    func invalidate(_ key: String) async throws -> UInt64 { try await connection.invalidate(key) }
    func invalidateAll(withPrefix prefix: String) async throws {
        try await connection.invalidateAll(withPrefix: prefix)
    }
    func put(for key: String, entry: @Sendable (_ version: UInt64) throws -> AsyncStateStoredEntry) async throws
        -> UInt64
    {
        try await connection.put(for: key, entry: entry)
    }
}
