public import Foundation

/// A cache that several replicas share behind their own memory: the second level (L2) of a family
/// whose first level (L1) is each replica's memory.
///
/// A family given a second level (see ``AsyncStateSecondLevelOptions``) reads it on a miss before it
/// calls the source, and takes the key's lease there before it does, so that replicas that miss the
/// same key at once cost the source one call: the lease's holder loads the value and writes it, the
/// others wait for that write and read it. The protocol is all the family needs; an implementation
/// stores entries by string key (a shared database table, a key-value store). `AsyncStateTesting`
/// has one in memory, with fault injection.
///
/// The family never trusts what it reads: an entry that fails to decode is dropped and the key is
/// loaded again; a freshness that outlasts the family's own expiry is cut to it. Every call has its
/// own timeout, and a second level that fails or times out is skipped (the family goes to its
/// source, as without one) until a backoff has passed: a fault never fails a hit and never hangs a
/// miss.
///
/// Implementations must keep these rules:
/// - **Versions never go backwards.** ``write(_:for:)`` stores an entry only if its version is
///   greater than the stored one's.
/// - **Lease tokens grow.** The token ``acquireLease(on:for:)`` returns is greater than every token
///   it returned before for that key and than the version stored for it: a holder writes its entry
///   with its token as the version, so a holder that lost its lease (it ran past the lease's
///   expiry, and another took it) cannot overwrite a newer holder's write.
/// - **An invalidation is a version too.** ``invalidate(_:)`` stores a version greater than every
///   earlier one and makes the entry stale, so that a holder that loaded before the change cannot
///   write its older value over it.
/// - **Versions never reset.** A key's versions grow for as long as any replica may remember one:
///   keep them (and the markers of invalidations) when entries expire, and across a restart or a
///   failover of the store. A replica ignores an invalidation whose version it already holds, and
///   takes no entry below a version it has heard of: versions that start again from 1 would leave
///   it on old data until its own expiry.
public protocol AsyncStateSecondLevel: Sendable {
    /// The entry stored for `key`, or `nil`.
    func read(_ key: String) async throws -> AsyncStateStoredEntry?

    /// Stores `entry` for `key` unless the stored entry's version is the same or greater; returns
    /// whether it stored it.
    func write(_ entry: AsyncStateStoredEntry, for key: String) async throws -> Bool

    /// Takes `key`'s lease for `duration` if nobody holds it (or its holder's lease has expired), or
    /// says how long the current holder's lease still runs. A grant should say which version was
    /// stored for the key as it was given (``AsyncStateLease/acquired(token:storedVersion:)``): the
    /// holder then calls its source at once when that is the version its last read found, and reads
    /// the entry once more only when another replica wrote (or invalidated) since — without it, the
    /// holder always reads once more, one round trip more a miss.
    func acquireLease(on key: String, for duration: Duration) async throws -> AsyncStateLease

    /// Gives back the lease `token` holds on `key`; does nothing if the lease has expired or another
    /// holder has taken it since.
    func releaseLease(on key: String, token: UInt64) async throws

    /// Marks `key`'s entry stale (its source changed) and returns a new version for it: greater than
    /// every version stored and every token given for it, and stored with the entry (or with no
    /// entry, as a marker), so that no write of an older version lands afterwards. Later tokens are
    /// greater still.
    func invalidate(_ key: String) async throws -> UInt64

    /// Marks stale every entry whose key starts with `prefix` (a family's namespace and its colon),
    /// as ``invalidate(_:)`` does each: with a new version for each, so that no write of an earlier
    /// version lands afterwards.
    func invalidateAll(withPrefix prefix: String) async throws

    /// Stores a value written through a replica rather than loaded under a lease (see
    /// ``AsyncStateInvalidator/set(_:for:in:topic:)``): takes a new version for `key` — greater than
    /// every version stored and every token given for it, as an invalidation's is — and stores the
    /// entry `entry` makes for that version (its payload may seal the version: see
    /// ``AsyncStateEntryAuthenticator``) whatever is stored, unless an entry of a greater version
    /// landed in between (versions decide); it drops the key's lease, so that a holder that loaded
    /// before the write cannot overwrite it. Call `entry` once, before storing; if it throws, store
    /// nothing and throw its error. The entry's `version` must be the one given; returns it.
    ///
    /// The default implementation throws ``AsyncStateSecondLevelPutUnsupported``: a write then marks
    /// the key stale instead (``invalidate(_:)``), and the other replicas load it from the source.
    func put(for key: String, entry: @Sendable (_ version: UInt64) throws -> AsyncStateStoredEntry) async throws
        -> UInt64
}

extension AsyncStateSecondLevel {
    /// Throws ``AsyncStateSecondLevelPutUnsupported``: a second level that does not implement
    /// ``put(for:entry:)`` has a write through a replica mark the key stale instead.
    public func put(for key: String, entry: @Sendable (_ version: UInt64) throws -> AsyncStateStoredEntry)
        async throws -> UInt64
    {
        throw AsyncStateSecondLevelPutUnsupported()
    }
}

/// What ``AsyncStateSecondLevel/put(for:entry:)`` throws in a second level that does not implement it.
public struct AsyncStateSecondLevelPutUnsupported: Error, Sendable, Hashable, CustomStringConvertible {
    /// The error.
    public init() {}

    /// A readable explanation.
    public var description: String { "this second level does not store written values (put(for:entry:))" }
}

/// An entry as a second level stores it: the encoded value, when its source answered, until when it
/// is fresh, and its version.
public struct AsyncStateStoredEntry: Sendable, Hashable {
    /// The value, encoded by the family's codec in its envelope (see ``AsyncStateCodec``).
    public var payload: [UInt8]
    /// When the source answered with this value (the replica's wall clock).
    public var succeededAt: Date
    /// Until when the value is fresh.
    public var freshUntil: Date
    /// The entry's version: the lease token of the replica that wrote it.
    public var version: UInt64

    /// The largest payload a replica writes: a codec's largest envelope
    /// (``AsyncStateCodec/maximumPayloadBytes``) and the longest seal with its length
    /// (``AsyncStateEntryAuthenticator``). A store may refuse larger ones.
    public static var maximumPayloadBytes: Int { AsyncStateCodec<Never>.maximumPayloadBytes + 256 }

    /// Creates an entry.
    public init(payload: [UInt8], succeededAt: Date, freshUntil: Date, version: UInt64) {
        (self.payload, self.succeededAt, self.freshUntil, self.version) = (payload, succeededAt, freshUntil, version)
    }
}

/// What a replica gets when it asks for a key's lease.
public enum AsyncStateLease: Sendable, Hashable {
    /// It holds the lease, until its duration passes or it gives it back. Its write carries `token`
    /// as its version. `storedVersion` is the version stored for the key when the lease was given
    /// (an entry's or an invalidation's; 0 when there is none), or `nil` when the second level does
    /// not say.
    ///
    /// A replica that read the entry before it asked for the lease compares the two: if another
    /// replica wrote between its read and the grant (its write and its lease's release both fell in
    /// that gap, which a replica far from the second level sees often), the stored version differs,
    /// and the holder reads the entry again instead of calling its source — so two replicas that
    /// miss a key together cost the source one call whatever the order of their calls.
    case acquired(token: UInt64, storedVersion: UInt64? = nil)
    /// Another replica holds it, for `expiresIn` more (on the second level's clock).
    case held(expiresIn: Duration)
}

/// What a family's second level did for one key's load, as its observer hears it
/// (``AsyncStateEvent/Kind/secondLevel(_:)``, with the key).
public enum AsyncStateSecondLevelEvent: Sendable {
    /// The load was answered from the second level: another replica's value, at this version.
    case hit(version: UInt64)
    /// This replica held the key's lease and called its source; its write stored this version
    /// (`nil`: it could not write it, the value was not to be kept, or the source failed).
    case loaded(version: UInt64?)
    /// Another replica holds the key's lease: this one waits for its write.
    case waiting
    /// The wait ran out (``AsyncStateSecondLevelOptions/maximumWait``, or half of what the attempt's
    /// timeout left): this replica calls its source without the lease.
    case waitRanOut
    /// A call to the second level failed with `error` (``AsyncStateSecondLevelTimeout`` when it ran
    /// past its timeout): the load goes to the source, and the second level is skipped for a backoff.
    case fault(error: any Error)
    /// The second level was skipped (a backoff after a fault): the load goes to the source.
    case skipped
    /// The entry there did not decode (``AsyncStateCodecError``), or is implausible
    /// (``AsyncStateSecondLevelImplausibleEntry``): it is not taken, and the key is loaded again.
    case undecodable(error: any Error)
    /// This replica loaded from its source as the lease's holder, but the second level refused its
    /// write of this version: a newer one is there (its lease had run out, or the key was
    /// invalidated since). It takes the newer entry if it is fresh.
    case writeRefused(version: UInt64)
}

/// A second-level entry that decodes but cannot be true: its source answered, it says, later than
/// ``AsyncStateSecondLevelOptions/maximumClockSkew`` from now. Treated as garbage.
public struct AsyncStateSecondLevelImplausibleEntry: Error, Sendable, Hashable, CustomStringConvertible {
    /// The success date it claims.
    public var succeededAt: Date
    /// When it was read, on this replica's wall clock.
    public var readAt: Date

    public var description: String {
        "a second-level entry dated \(succeededAt.timeIntervalSince(readAt)) s in the future, beyond the "
            + "\(AsyncStateSecondLevelOptions<Never>.maximumClockSkew) the replicas' clocks may disagree by"
    }
}

/// A call to a second level that ran past its timeout (``AsyncStateSecondLevelOptions/timeout``).
public struct AsyncStateSecondLevelTimeout: Error, Sendable, Hashable, CustomStringConvertible {
    /// The timeout.
    public var timeout: Duration

    /// A timeout after `timeout`.
    public init(after timeout: Duration) { self.timeout = timeout }

    /// A readable explanation.
    public var description: String { "the second level did not answer within \(timeout)" }
}
