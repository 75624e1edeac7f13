import Foundation

/// How a family uses a second level (see ``AsyncStateSecondLevel``): which one, under which
/// namespace, with which codec, and the bounds of every wait.
///
/// ```swift
/// let profiles = AsyncStateFamily<Int, Profile>(
///     expiry: .seconds(120),
///     secondLevel: AsyncStateSecondLevelOptions(level: postgres, namespace: "profiles", codec: .json))
/// ```
///
/// On a miss (after the family's own single flight, so one call per replica and key at most), the
/// family reads the key's entry: a fresh one is the answer, with the freshness it has left, and the
/// source is not called. Otherwise it takes the key's lease. The holder calls the source, writes the
/// entry (its lease token is the version) and gives the lease back; a replica that finds the lease
/// held reads the entry every `pollInterval` until the holder's write is there, and takes the lease
/// itself once the holder's lease expires (a holder that died). A waiter never waits longer than
/// `maximumWait`, nor past half of what its attempt's `timeout` leaves (the family's `timeout`: the
/// other half is for its own source call): it then calls the source itself. So a holder that died,
/// or a lease held by anyone, costs callers a slower answer, never a timeout.
///
/// Every call to the second level is bounded by `timeout`. A call that fails or times out makes the
/// family skip the second level — straight to its source, as without one — for `faultBackoff`,
/// doubled after each further fault up to `maximumFaultBackoff` (calls that fail together count as
/// one), and the next miss after that tries it again. So a second level that is down or slow never
/// fails a hit (hits never reach it), and holds a miss at most one timeout per call it makes before
/// the source: a read, then a lease request (a replica that waits for another's load waits as the
/// lease says, at most `maximumWait`).
public struct AsyncStateSecondLevelOptions<Value: Sendable>: Sendable {
    /// How far in the future an entry's success date may be before it is treated as garbage: the
    /// replicas' wall clocks may disagree by this much (five minutes). An entry dated later was
    /// written by hand, to stay fresh for its whole life from a date not yet come: it is never
    /// served nor a fallback, is counted as ``AsyncStateSecondLevelEvent/undecodable(error:)`` (with
    /// ``AsyncStateSecondLevelImplausibleEntry``), and is replaced by the next load's write.
    public static var maximumClockSkew: Duration { .seconds(300) }

    /// The second level.
    public var level: any AsyncStateSecondLevel
    /// Prefixes every key (`namespace:key`, the key as `String(describing:)` writes it): one per
    /// family that shares the second level, and its key descriptions must be unique.
    public var namespace: String
    /// Encodes and decodes the values.
    public var codec: AsyncStateCodec<Value>
    /// The longest one call to the second level may take. Defaults to 250 ms.
    public var timeout: Duration
    /// How long a lease lasts unless given back: longer than the source's slowest answer, or a
    /// second replica calls it too. Defaults to 10 seconds.
    public var leaseDuration: Duration
    /// How often a replica that waits for another's load reads the entry. Defaults to 25 ms.
    public var pollInterval: Duration
    /// The longest a replica waits for another's load before it calls the source itself. Defaults
    /// to the lease's duration plus one poll, so that a waiter outlasts a dead holder's lease. A
    /// family with a `timeout` waits at most half of what the attempt has left, whatever this says.
    public var maximumWait: Duration
    /// How long the second level is skipped after a fault. Defaults to 1 second.
    public var faultBackoff: Duration
    /// The longest it is skipped after repeated faults. Defaults to 30 seconds.
    public var maximumFaultBackoff: Duration
    /// Whether the lease's holder answers its callers as soon as its source answers, writing the
    /// entry and giving the lease back afterwards (each within `timeout`), rather than after the
    /// write. A miss then costs its callers the source's time alone; the other replicas still take
    /// the value from the second level once the write lands (they wait for the lease as before).
    ///
    /// Off by default. With it on, a write the second level refuses — the key was invalidated while
    /// the holder loaded, or its lease ran out and a newer holder wrote — cannot change what the
    /// holder's callers were already answered: the holder keeps its value until the invalidation's
    /// message reaches it (an ``AsyncStateInvalidator`` subscribed on every replica), where the write
    /// in the foreground takes the newer entry at once, or lands its value expired. Turn it on where
    /// every replica hears invalidations; the refusals are counted
    /// (``AsyncStateSecondLevelStatistics/refusedWrites``) and reported after the fetch.
    public var writesInBackground: Bool
    /// The most by which a value loaded through the second level is made fresh for less than its
    /// lifetime: each load's value is fresh for its lifetime less an amount between zero and this,
    /// here and in the second level's entry (which the other replicas take with it), so that keys
    /// loaded together do not expire — and reload from the source — together. The amount is drawn
    /// from the key and the load's version: the same schedule, the same expiries, under a
    /// `VirtualClock` as on the real clock. Zero (the default): no jitter. Never more than the
    /// lifetime: a value is never stored already expired. Values the source answers while the second
    /// level is skipped (after a fault), and writes through the invalidator, are not jittered.
    public var expiryJitter: Duration
    /// Seals every entry this family writes and checks the seal of every entry it reads, so that
    /// an entry written by anyone without the fleet's secret is never served (see
    /// ``AsyncStateEntryAuthenticator``). `nil` (the default): entries are neither sealed nor
    /// checked, and anyone who can write the store can plant one. Every replica of a family must
    /// have the same setting: a sealed entry does not decode without one, an unsealed one is refused
    /// with one (either costs a source call, never a wrong value).
    public var authenticator: (any AsyncStateEntryAuthenticator)?

    /// Creates the options.
    ///
    /// - Parameters:
    ///   - level: The second level.
    ///   - namespace: Prefixes every key: one per family sharing `level`.
    ///   - codec: Encodes and decodes the values (``AsyncStateCodec/json`` for `Codable` ones).
    ///   - timeout: The longest one call to `level` may take.
    ///   - leaseDuration: How long a lease lasts unless given back.
    ///   - pollInterval: How often a waiting replica reads the entry.
    ///   - maximumWait: The longest a replica waits for another's load; `nil`: the lease's duration
    ///     plus one poll.
    ///   - faultBackoff: How long `level` is skipped after a fault.
    ///   - maximumFaultBackoff: The longest it is skipped after repeated faults.
    ///   - writesInBackground: Whether the holder answers before its write (see
    ///     ``writesInBackground``).
    ///   - expiryJitter: The most by which a loaded value's freshness is shortened (see
    ///     ``expiryJitter``).
    ///   - authenticator: Seals the entries written and checks those read (see ``authenticator``).
    ///
    /// Durations are clamped to `0...AsyncStateLimits.maximumDuration`; a `timeout` or a
    /// `pollInterval` below a millisecond is a millisecond (a call is never unbounded, and a
    /// waiter never spins).
    public init(
        level: any AsyncStateSecondLevel, namespace: String, codec: AsyncStateCodec<Value>,
        timeout: Duration = .milliseconds(250), leaseDuration: Duration = .seconds(10),
        pollInterval: Duration = .milliseconds(25), maximumWait: Duration? = nil,
        faultBackoff: Duration = .seconds(1), maximumFaultBackoff: Duration = .seconds(30),
        writesInBackground: Bool = false, expiryJitter: Duration = .zero,
        authenticator: (any AsyncStateEntryAuthenticator)? = nil
    ) {
        self.level = level
        self.namespace = namespace
        self.codec = codec
        self.timeout = max(timeout.clampedToLimits, .milliseconds(1))
        self.leaseDuration = leaseDuration.clampedToLimits
        self.pollInterval = max(pollInterval.clampedToLimits, .milliseconds(1))
        self.maximumWait =
            (maximumWait ?? leaseDuration.clampedToLimits.saturatingAdd(self.pollInterval))
            .clampedToLimits
        self.faultBackoff = faultBackoff.clampedToLimits
        self.maximumFaultBackoff = max(maximumFaultBackoff.clampedToLimits, self.faultBackoff)
        self.writesInBackground = writesInBackground
        self.expiryJitter = expiryJitter.clampedToLimits
        self.authenticator = authenticator
    }
}

/// What a family's second level has done, counted since the family was made (see
/// ``AsyncStateFamily/secondLevelStatistics``).
public struct AsyncStateSecondLevelStatistics: Sendable, Hashable {
    /// Misses answered from the second level, without a call to the source.
    public var hits = 0
    /// Misses this replica loaded from its source as the lease's holder.
    public var loads = 0
    /// Times this replica waited for another's load (each ends in a hit, a lease, or a load of its
    /// own after `maximumWait`).
    public var waits = 0
    /// Waits that ran out (``AsyncStateSecondLevelOptions/maximumWait``): the replica called the
    /// source without the lease.
    public var waitsRunOut = 0
    /// Calls that failed or timed out.
    public var faults = 0
    /// Misses that skipped the second level because it had failed (they went to the source).
    public var skipped = 0
    /// Entries that did not decode (dropped, and loaded again).
    public var undecodable = 0
    /// Writes the second level refused because it held a newer version.
    public var refusedWrites = 0

    /// No counts.
    public init() {}
}
