public import Foundation

/// What a store's attempt runs: the caller's operation, in the shape it was given. The machine
/// carries it opaquely in its flight and hands it back in each ``FetchStateMachine/Attempt``; the
/// shell runs it with the attempt's ``AttemptInput`` and reports a typed ``AttemptResult`` (or the
/// error it threw) back to the machine. Nothing reaches the machine as a thrown sentinel.
@usableFromInline
enum FetchOperation<Value: Sendable>: Sendable {
    /// An operation that answers a value and reads nothing of the state: most operations.
    case plain(@Sendable () async throws -> Value)
    /// An operation that reads what the attempt carries and may answer more than a value: a
    /// conditional operation (the value it replaces; "not modified"), a paged state's next page (the
    /// list it extends), a load through a second level (the data's date and version; an entry
    /// another replica fetched).
    case reading(@Sendable (AttemptInput<Value>) async throws -> AttemptResult<Value>)

    /// Runs the operation for an attempt that carries `input`.
    @inlinable
    func run(with input: AttemptInput<Value>) async throws -> AttemptResult<Value> {
        switch self {
        case .plain(let operation): return .value(try await operation())
        case .reading(let operation): return try await operation(input)
        }
    }
}

/// Everything an attempt's operation may read of its state, taken by the machine when the attempt
/// starts (``FetchStateMachine/attempt(now:starts:)``): an operation reads the state only through
/// this, never through the state's cell or machine.
@usableFromInline
struct AttemptInput<Value: Sendable>: Sendable {
    /// The value the attempt replaces, or extends (a paged state's append): the state's value if it
    /// came from a fetch or a write; `nil` before the first one (a paged state's first page).
    @usableFromInline var previous: Value?
    /// The wall date of the state's last success, if any (``StateData/lastSuccess``).
    @usableFromInline var lastSuccess: Date?
    /// The newest second-level version the state's data is known to be (``StateData/version``).
    @usableFromInline var version: UInt64
    /// Whether the attempt must ask the source itself, whatever a second level holds: a refresh
    /// does (it was asked for because the value may have changed at the source).
    @usableFromInline var readsTheSource: Bool
    /// When the attempt's timeout ends it (on the store's clock); `nil` for never. What it waits for
    /// on the way to its source must leave it time (``waitEnds(from:maximumWait:)``).
    @usableFromInline var timeoutAt: Duration?
    /// Gives the attempt's flight a value a second level holds that is not fresh, as old as the
    /// arrival says: what fail-safe may answer if the flight fails for good — however it fails,
    /// also by the attempt's own timeout, which ends the operation before it could answer
    /// (``FetchStateMachine/fallbackOffered(_:attempt:value:arrival:now:)``). Set by the shell for
    /// an operation that reads (`nil` in the machine's own copy).
    @usableFromInline var offerFallback: (@Sendable (Value, RemoteArrival) -> Void)?

    @inlinable
    init(previous: Value?, lastSuccess: Date?, version: UInt64, readsTheSource: Bool, timeoutAt: Duration?) {
        (self.previous, self.lastSuccess, self.version, self.readsTheSource) = (
            previous, lastSuccess, version, readsTheSource
        )
        self.timeoutAt = timeoutAt
        offerFallback = nil
    }

    /// When a wait for another's load that starts at `now` gives up (a second-level lease that
    /// another replica holds): after `maximumWait`, and never later than halfway to the attempt's
    /// timeout — the other half is left for its own call to the source, so that a holder that died
    /// costs the callers a slower answer, not a timeout. The one rule for the wait's budget.
    @inlinable
    func waitEnds(from now: Duration, maximumWait: Duration) -> Duration {
        let limit = now.saturatingAdd(maximumWait)
        guard let timeoutAt, timeoutAt < limit else { return limit }
        return timeoutAt > now ? now.saturatingAdd((timeoutAt - now) / 2) : now
    }
}

/// What an attempt's operation answered, besides a failure (which it throws).
@usableFromInline
enum AttemptResult<Value: Sendable>: Sendable {
    /// A value from the source.
    case value(Value)
    /// The value the attempt was given (``AttemptInput/previous``) is still current (conditional
    /// refresh).
    case notModified
    /// A value another replica fetched, taken from a second level, as old, as fresh and at the version
    /// that `arrival` says (see ``AttemptInput/arrival(of:lifetime:at:)``).
    case arrived(Value, RemoteArrival)
}

/// How old a value from a second level is, how long it stays fresh, and its version (see
/// ``AttemptResult/arrived(_:_:)``).
@usableFromInline
struct RemoteArrival: Sendable {
    /// How long ago its source answered (not negative).
    @usableFromInline var age: Duration
    /// How much longer it is fresh (zero: it lands expired).
    @usableFromInline var lifetime: Duration
    /// The wall date its source answered on.
    @usableFromInline var date: Date
    /// Its version in the second level.
    @usableFromInline var version: UInt64

    @inlinable init(age: Duration, lifetime: Duration, date: Date, version: UInt64) {
        (self.age, self.lifetime, self.date, self.version) = (age, lifetime, date, version)
    }
}

// MARK: Second-level versions and acceptance

extension AttemptInput {
    /// Whether a second-level entry at `version`, whose source answered on `succeededAt`, may answer
    /// this attempt — the one rule for which entries a state takes (before decoding it): not below
    /// the version the data is known to be, and neither older than the value the state holds (by its
    /// success date) nor that value itself (its date, at the version the data has). The attempt runs
    /// because that value is expired or was invalidated: taking it back would undo an invalidation
    /// that the second level missed. (A refresh, ``readsTheSource``, reads no entry in the first
    /// place.)
    @inlinable
    func mayTake(version: UInt64, succeededAt: Date) -> Bool {
        SecondLevelVersion.takes(version, succeededAt: succeededAt, over: lastSuccess, known: self.version)
    }

    /// The arrival of a second-level entry whose source answered on `succeededAt` and that is fresh
    /// until `freshUntil` (wall dates), for a value that stays fresh for `lifetime` from its source's
    /// answer on this replica, read at `date`; `nil` when it is not fresh. Never fresher than this
    /// replica would keep it from the source's answer: its life, counted from its success, is the
    /// shorter of the entry's and `lifetime`, and it is fresh — by the package's one freshness test
    /// (``isWithinExpiry(since:at:expiry:)``) — while its age is within that life.
    @inlinable
    static func arrival(
        succeededAt: Date, freshUntil: Date, version: UInt64, lifetime: Duration, at date: Date
    ) -> RemoteArrival? {
        let age = max(Duration.clamped(seconds: date.timeIntervalSince(succeededAt)), .zero)
        let life = min(Duration.clamped(seconds: freshUntil.timeIntervalSince(date)).saturatingAdd(age), lifetime)
        guard isWithinExpiry(since: .zero, at: age, expiry: life) else { return nil }
        return RemoteArrival(age: age, lifetime: life - age, date: succeededAt, version: version)
    }

    /// Whether a second-level entry whose source answered on `succeededAt` is plausible, read at
    /// `date`: not from further in the future than ``AsyncStateSecondLevelOptions/maximumClockSkew``
    /// (the replicas' clocks may disagree by that much). An entry from later was written by hand — it
    /// would be fresh for its whole life, counted from a date not yet come — and is treated as
    /// garbage: never taken, never a fallback, and replaced by the next load's write.
    static func isPlausible(succeededAt: Date, at date: Date) -> Bool {
        succeededAt.timeIntervalSince(date) <= AsyncStateSecondLevelOptions<Never>.maximumClockSkew.timeInterval
    }

    /// The input of a load that learned, from a refused write at `version`, that a newer version
    /// exists: it takes an entry of that version or newer, whatever its held value's date — a
    /// refresh too, whose own value that newer one replaces.
    @inlinable
    func requiring(version: UInt64) -> AttemptInput {
        var input = self
        (input.lastSuccess, input.version) = (nil, SecondLevelVersion.merged(version, known: self.version))
        input.readsTheSource = false
        return input
    }
}

/// The one rule for second-level versions: a state's data knows the newest version it has seen
/// (``StateData/version``), which only grows; an entry or an invalidation below it is older than
/// the data.
@usableFromInline
enum SecondLevelVersion {
    /// Whether a second-level entry at `version` is at least the version `known` to exist.
    @inlinable static func isCurrent(_ version: UInt64, known: UInt64) -> Bool { version >= known }

    /// Whether data that knows version `known`, and whose value succeeded on `held` (`nil`: it has
    /// none), takes an entry at `version` whose source answered on `succeededAt` (see
    /// ``AttemptInput/mayTake(version:succeededAt:)``, and fail-safe's fallback).
    @inlinable static func takes(_ version: UInt64, succeededAt: Date, over held: Date?, known: UInt64) -> Bool {
        guard isCurrent(version, known: known) else { return false }
        guard let held else { return true }
        return succeededAt > held || (succeededAt == held && version != known)
    }

    /// Whether an invalidation naming `version` makes data that knows version `known` older: only a
    /// newer version does.
    @inlinable static func invalidates(_ version: UInt64, known: UInt64) -> Bool { version > known }

    /// The version a state's data knows once it receives data at `version` or learns of it.
    @inlinable static func merged(_ version: UInt64, known: UInt64) -> UInt64 { max(version, known) }

    /// The one version a message names when several second levels answered an invalidation:
    /// versions of different second levels are not comparable, so only one that alone answered.
    @inlinable static func single(of versions: [UInt64?]) -> UInt64? {
        versions.count == 1 ? versions[0] : nil
    }
}
