public import AsyncStateKit
import Foundation

/// A second level (see `AsyncStateSecondLevel`) in memory, shared by the replicas of a test in one
/// process, with the faults of a real one: latency, an outage, a partition of one replica, a lost
/// lease, garbage in an entry.
///
/// ```swift
/// let clock = VirtualClock()
/// let level = InMemorySecondLevel(clock: clock)
/// let replicas = (0..<5).map { _ in
///     AsyncStateFamily<Int, Profile>(
///         clock: clock,
///         secondLevel: AsyncStateSecondLevelOptions(level: level.replica(), namespace: "profiles", codec: .json))
/// }
/// ```
///
/// Leases expire, and latency passes, on the clock it is given: under a `VirtualClock` every fault
/// happens at an exact instant. It keeps the protocol's rules: a write stores only a newer version,
/// and a lease's token is greater than every earlier token and than the stored version.
public final class InMemorySecondLevel: AsyncStateSecondLevel, Sendable {
    private let now: @Sendable () -> Duration
    private let sleep: @Sendable (Duration) async throws -> Void
    fileprivate let state = LockedValue(State())

    fileprivate struct State {
        var entries: [String: AsyncStateStoredEntry] = [:]
        var leases: [String: (token: UInt64, expiresAt: Duration)] = [:]
        var lastTokens: [String: UInt64] = [:]
        var latency: Duration = .zero
        /// Each replica's own latency, added to ``latency`` for its calls.
        var replicaLatency: [Int: Duration] = [:]
        var isDown = false
        var partitioned: Set<Int> = []
        /// Calls of partitioned replicas, held until the partition heals.
        var held: [Int: [UnsafeContinuation<Void, Never>]] = [:]
        var nextReplica = 0
        var counts = Counts()
    }

    /// The calls it has answered, by kind (a call that failed is not counted).
    public struct Counts: Sendable, Hashable {
        /// Reads answered.
        public var reads = 0
        /// Writes answered (stored or refused).
        public var writes = 0
        /// Leases given.
        public var leasesAcquired = 0
        /// Lease requests answered with another holder's lease.
        public var leasesHeld = 0
        /// Invalidations (of a key or of a prefix).
        public var invalidations = 0
    }

    /// What a call throws while the second level is down (``isDown``).
    public struct Unavailable: Error, Sendable {}

    /// Creates an empty second level on `clock`.
    public init<C: Clock<Duration>>(clock: C) {
        let origin = clock.now
        now = { origin.duration(to: clock.now) }
        sleep = { try await clock.sleep(for: $0) }
    }

    /// How long each call takes before it answers (on the clock). Defaults to none.
    public var latency: Duration {
        get { state.withLock { $0.latency } }
        set { state.withLock { $0.latency = newValue } }
    }

    /// Whether it is down: every call throws ``Unavailable`` at once.
    public var isDown: Bool {
        get { state.withLock { $0.isDown } }
        set { state.withLock { $0.isDown = newValue } }
    }

    /// The calls answered so far.
    public var counts: Counts { state.withLock { $0.counts } }

    /// A replica's connection: the same entries and leases, and a partition of its own
    /// (``Replica/isPartitioned``).
    public func replica() -> Replica {
        Replica(
            level: self,
            id: state.withLock { state in
                state.nextReplica += 1
                return state.nextReplica
            })
    }

    /// The entry stored for `key`, as it is.
    public func entry(for key: String) -> AsyncStateStoredEntry? { state.withLock { $0.entries[key] } }

    /// Stores `entry` for `key` whatever the stored version (to put garbage in, or an old entry back).
    public func overwrite(_ entry: AsyncStateStoredEntry, for key: String) {
        state.withLock { $0.entries[key] = entry }
    }

    /// Drops the lease on `key`, as if it had expired: its holder still loads, and another replica
    /// may take the lease at once.
    public func loseLease(on key: String) {
        _ = state.withLock { $0.leases.removeValue(forKey: key) }
    }

    // MARK: AsyncStateSecondLevel

    public func read(_ key: String) async throws -> AsyncStateStoredEntry? { try await read(key, from: nil) }

    public func write(_ entry: AsyncStateStoredEntry, for key: String) async throws -> Bool {
        try await write(entry, for: key, from: nil)
    }

    public func acquireLease(on key: String, for duration: Duration) async throws -> AsyncStateLease {
        try await acquireLease(on: key, for: duration, from: nil)
    }

    public func releaseLease(on key: String, token: UInt64) async throws {
        try await releaseLease(on: key, token: token, from: nil)
    }

    public func invalidate(_ key: String) async throws -> UInt64 {
        try await invalidate(key, from: nil)
    }

    public func invalidateAll(withPrefix prefix: String) async throws {
        try await invalidateAll(withPrefix: prefix, from: nil)
    }

    public func put(for key: String, entry: @Sendable (_ version: UInt64) throws -> AsyncStateStoredEntry)
        async throws -> UInt64
    {
        try await put(for: key, entry: entry, from: nil)
    }

    /// Marks the entry stale with a new version (a marker with no payload if there is none), and
    /// drops the key's lease: a load that starts now is not held up by one that started before the
    /// change, whose write the new version refuses.
    fileprivate func invalidate(_ key: String, from replica: Int?) async throws -> UInt64 {
        try await call(from: replica) { state, _ in
            state.counts.invalidations += 1
            return try Self.invalidate(key, in: &state)
        }
    }

    /// The version `key`'s next invalidation takes: greater than every one stored and every token
    /// given.
    private static func nextVersion(of key: String, in state: State) throws -> UInt64 {
        let floor = max(state.lastTokens[key] ?? 0, state.entries[key]?.version ?? 0)
        guard floor < .max else { throw Unavailable() }
        return floor + 1
    }

    /// Marks `key` stale with a new version; the version.
    private static func invalidate(_ key: String, in state: inout State) throws -> UInt64 {
        let version = try nextVersion(of: key, in: state)
        state.lastTokens[key] = version
        state.leases[key] = nil
        var entry =
            state.entries[key]
            ?? AsyncStateStoredEntry(payload: [], succeededAt: .distantPast, freshUntil: .distantPast, version: 0)
        entry.freshUntil = .distantPast
        entry.version = version
        state.entries[key] = entry
        return version
    }

    /// Stores the entry `entry` makes for a new version (``invalidate(_:)``'s: greater than every
    /// one before), and drops the key's lease. An entry that names another version is stored under
    /// the new one (as a store that writes its version column would).
    fileprivate func put(
        for key: String, entry: @Sendable (_ version: UInt64) throws -> AsyncStateStoredEntry, from replica: Int?
    ) async throws -> UInt64 {
        try await call(from: replica) { state, _ in
            state.counts.writes += 1
            var made = try entry(try Self.nextVersion(of: key, in: state))
            made.version = try Self.invalidate(key, in: &state)
            state.entries[key] = made
            return made.version
        }
    }

    /// As ``invalidate(_:)`` for every key under `prefix` that has an entry, a lease or a token.
    fileprivate func invalidateAll(withPrefix prefix: String, from replica: Int?) async throws {
        try await call(from: replica) { state, _ in
            state.counts.invalidations += 1
            let keys = Set(state.entries.keys).union(state.leases.keys).union(state.lastTokens.keys)
            for key in keys where key.hasPrefix(prefix) { _ = try Self.invalidate(key, in: &state) }
        }
    }

    fileprivate func read(_ key: String, from replica: Int?) async throws -> AsyncStateStoredEntry? {
        try await call(from: replica) { state, _ in
            state.counts.reads += 1
            return state.entries[key]
        }
    }

    fileprivate func write(_ entry: AsyncStateStoredEntry, for key: String, from replica: Int?) async throws -> Bool {
        try await call(from: replica) { state, _ in
            state.counts.writes += 1
            if let stored = state.entries[key], stored.version >= entry.version { return false }
            state.entries[key] = entry
            return true
        }
    }

    fileprivate func acquireLease(on key: String, for duration: Duration, from replica: Int?) async throws
        -> AsyncStateLease
    {
        try await call(from: replica) { state, now in
            if let lease = state.leases[key], lease.expiresAt > now {
                state.counts.leasesHeld += 1
                return .held(expiresIn: lease.expiresAt - now)
            }
            let floor = max(state.lastTokens[key] ?? 0, state.entries[key]?.version ?? 0)
            guard floor < .max else { throw Unavailable() }
            let token = floor + 1
            state.lastTokens[key] = token
            state.leases[key] = (token, now + max(duration, .zero))
            state.counts.leasesAcquired += 1
            return .acquired(token: token, storedVersion: state.entries[key]?.version ?? 0)
        }
    }

    fileprivate func releaseLease(on key: String, token: UInt64, from replica: Int?) async throws {
        try await call(from: replica) { state, _ in
            if state.leases[key]?.token == token { state.leases[key] = nil }
        }
    }

    /// One call: waits out the latency (and a partition of `replica`), then answers under the lock,
    /// or throws while down.
    fileprivate func call<T: Sendable>(
        from replica: Int?, _ body: @Sendable (inout State, Duration) throws -> T
    ) async throws -> T {
        if let replica {
            // A partitioned replica's call hangs, cancelled or not, until the partition heals.
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
                let hold = state.withLock { state -> Bool in
                    guard state.partitioned.contains(replica) else { return false }
                    state.held[replica, default: []].append(continuation)
                    return true
                }
                if !hold { continuation.resume() }
            }
        }
        let latency = state.withLock { state in
            state.latency + (replica.flatMap { state.replicaLatency[$0] } ?? .zero)
        }
        if latency > .zero { try await sleep(latency) }
        return try state.withLock { state in
            if state.isDown { throw Unavailable() }
            return try body(&state, now())
        }
    }

    fileprivate func partition(_ replica: Int, _ partitioned: Bool) {
        let released = state.withLock { state -> [UnsafeContinuation<Void, Never>] in
            if partitioned {
                state.partitioned.insert(replica)
                return []
            }
            state.partitioned.remove(replica)
            return state.held.removeValue(forKey: replica) ?? []
        }
        for continuation in released { continuation.resume() }
    }

    fileprivate func isPartitioned(_ replica: Int) -> Bool { state.withLock { $0.partitioned.contains(replica) } }

    fileprivate func latency(of replica: Int) -> Duration {
        state.withLock { $0.replicaLatency[replica] ?? .zero }
    }

    fileprivate func setLatency(_ latency: Duration, of replica: Int) {
        state.withLock { $0.replicaLatency[replica] = latency > .zero ? latency : nil }
    }

    /// One replica's connection to an ``InMemorySecondLevel``.
    public struct Replica: AsyncStateSecondLevel {
        /// The second level it connects to.
        public let level: InMemorySecondLevel
        fileprivate let id: Int

        /// How much longer this replica's calls take than the level's ``InMemorySecondLevel/latency``
        /// (its distance from the second level): each call waits out both before the second level
        /// answers it, so that replicas at different distances reach it in the order a network would
        /// bring them. Zero by default; a negative latency is zero.
        public var latency: Duration {
            get { level.latency(of: id) }
            nonmutating set { level.setLatency(newValue, of: id) }
        }

        /// Whether this replica is cut off: its calls hang (even when cancelled) until it is not.
        public var isPartitioned: Bool {
            get { level.isPartitioned(id) }
            nonmutating set { level.partition(id, newValue) }
        }

        public func read(_ key: String) async throws -> AsyncStateStoredEntry? {
            try await level.read(key, from: id)
        }

        public func write(_ entry: AsyncStateStoredEntry, for key: String) async throws -> Bool {
            try await level.write(entry, for: key, from: id)
        }

        public func acquireLease(on key: String, for duration: Duration) async throws -> AsyncStateLease {
            try await level.acquireLease(on: key, for: duration, from: id)
        }

        public func releaseLease(on key: String, token: UInt64) async throws {
            try await level.releaseLease(on: key, token: token, from: id)
        }

        public func invalidate(_ key: String) async throws -> UInt64 {
            try await level.invalidate(key, from: id)
        }

        public func invalidateAll(withPrefix prefix: String) async throws {
            try await level.invalidateAll(withPrefix: prefix, from: id)
        }

        public func put(for key: String, entry: @Sendable (_ version: UInt64) throws -> AsyncStateStoredEntry)
            async throws -> UInt64
        {
            try await level.put(for: key, entry: entry, from: id)
        }
    }
}
