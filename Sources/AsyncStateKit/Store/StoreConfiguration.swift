/// The policies a state is declared with, normalized: durations clamped to
/// ``AsyncStateLimits/maximumDuration``, meaningless values switched off.
///
/// Every state holds one, so its durations are kept as ``WholeNanoseconds`` (8 bytes each, not a
/// `Duration?`'s 24): rounded down, except that a positive duration keeps at least one nanosecond
/// (so that it stays on), before the rules of ``init(expiry:failureExpiry:isEmpty:retry:timeout:softTimeout:staleWhileRevalidate:refreshAfter:maxStaleAge:)``
/// judge them. The members read them back as `Duration`s.
@usableFromInline
struct StoreConfiguration<Value: Sendable>: Sendable {
    @usableFromInline let storedExpiry: WholeNanoseconds
    @usableFromInline let storedFailureExpiry: WholeNanoseconds
    @usableFromInline let storedTimeout: WholeNanoseconds
    @usableFromInline let storedSoftTimeout: WholeNanoseconds
    @usableFromInline let storedRefreshAfter: WholeNanoseconds
    @usableFromInline let storedMaxStaleAge: WholeNanoseconds
    /// Decides whether a successful value is empty; `nil` for never (no closure to keep: a closure
    /// made in a generic context keeps its type's metadata in an allocation of its own).
    @usableFromInline let emptinessTest: (@Sendable (Value) -> Bool)?
    /// The retry policy of fetches whose caller gives none.
    @usableFromInline let retry: RetryPolicy
    /// A value's own lifetime (``AsyncStateExpiring/timeToLive``) when `Value` conforms to
    /// ``AsyncStateExpiring``; `nil` otherwise, so that other values pay nothing.
    @usableFromInline let timeToLive: (@Sendable (Value) -> Duration?)?
    /// Whether `value` serves stale data at once and refreshes it in the background.
    @usableFromInline let staleWhileRevalidate: Bool

    /// Whether a successful `value` is empty.
    @inlinable func isEmpty(_ value: Value) -> Bool { emptinessTest?(value) ?? false }

    /// How long data stays fresh; zero means never fresh.
    @inlinable var expiry: Duration { storedExpiry.duration ?? .zero }
    /// How long a failure is answered from the negative cache; zero means never.
    @inlinable var failureExpiry: Duration { storedFailureExpiry.duration ?? .zero }
    /// The longest an attempt may run; `nil` for no limit.
    @inlinable var timeout: Duration? { storedTimeout.duration }
    /// How long readers wait for a flight before a usable value is answered instead, while the
    /// flight goes on in the background; `nil` for ever.
    @inlinable var softTimeout: Duration? { storedSoftTimeout.duration }
    /// The age at which a hit on fresh data starts a background refresh; `nil` for never.
    @inlinable var refreshAfter: Duration? { storedRefreshAfter.duration }
    /// Fail-safe: how old the last good value may be and still be answered instead of a failure;
    /// `nil` for never.
    @inlinable var maxStaleAge: Duration? { storedMaxStaleAge.duration }

    /// How long data is answered as a hit, without asking the machine: the refresh-ahead age when
    /// there is one (older data goes to the machine, which may start the refresh), else the expiry.
    /// The one definition of the hit window, for the machine, the states' cells and the families.
    @inlinable var hitWindow: Duration { refreshAfter ?? expiry }

    /// How long restored data is answered at once under refresh ahead, stale, while one refetch runs:
    /// as long as fresh data would be before its refresh (`expiry − refreshAfter`); zero without
    /// refresh ahead (restored data is then refetched before it is served).
    @inlinable var restoredWindow: Duration { refreshAfter.map { expiry - $0 } ?? .zero }

    /// How a `Value` tells its own lifetime: through ``AsyncStateExpiring`` if it conforms, else `nil`
    /// (the conformance is tested once, here, not on every arrival).
    @inlinable static var ownLifetime: (@Sendable (Value) -> Duration?)? {
        guard Value.self is any AsyncStateExpiring.Type else { return nil }
        return { value in
            let expiring: (any AsyncStateExpiring)? = value as? any AsyncStateExpiring
            return expiring?.timeToLive
        }
    }

    /// How long `value` stays fresh from its arrival: its own lifetime, or the declared expiry.
    @inlinable func lifetime(of value: Value) -> Duration { expiry.saturatingAdd(freshnessShift(of: value)) }

    /// How far `value`'s own lifetime (see ``AsyncStateExpiring``) moves its data's freshness: its
    /// lifetime, clamped like every duration, minus the declared expiry; zero without one. Data that
    /// arrives at `t` is recorded as fresh since `t + shift` (``StateData/freshSince``), so that every
    /// test against the declared expiry and the hit window — the machine's, a state's cell, a family's
    /// compact record — answers for the value's own lifetime without knowing it: `now − (t + shift)
    /// < expiry` exactly when `now − t < lifetime`.
    @inlinable func freshnessShift(of value: Value) -> Duration {
        guard let timeToLive, let lifetime = timeToLive(value) else { return .zero }
        return lifetime.clampedToLimits - expiry
    }

    /// Normalizes: every duration is clamped to `0...AsyncStateLimits.maximumDuration`; a zero or
    /// negative `timeout` means none (documented on ``AsyncState``), so it cannot fail every attempt at
    /// once; a `refreshAfter` of zero or less, or not shorter than the expiry, means none (it could
    /// only refresh on every hit, or never); a `maxStaleAge` of zero or less means none (no value is
    /// younger than that); a `softTimeout` of zero or less, or not shorter than `timeout`, means none
    /// (the hard timeout ends each attempt first).
    @inlinable init(
        expiry: Duration, failureExpiry: Duration = .zero, isEmpty: (@Sendable (Value) -> Bool)?,
        retry: RetryPolicy = .never, timeout: Duration? = nil, softTimeout: Duration? = nil,
        staleWhileRevalidate: Bool = false, refreshAfter: Duration? = nil, maxStaleAge: Duration? = nil
    ) {
        // Rounded first, so that the rules below judge what is kept.
        let expiry = Self.kept(expiry.clampedToLimits)
        let timeout = timeout.map(Self.kept).flatMap { $0 > .zero ? $0.clampedToLimits : nil }
        let softTimeout = softTimeout.map(Self.kept)
            .flatMap { $0 > .zero && $0 < (timeout ?? .seconds(Int64.max)) ? $0 : nil }.map(\.clampedToLimits)
        let refreshAfter = refreshAfter.map(Self.kept).flatMap { $0 > .zero && $0 < expiry ? $0 : nil }
        let maxStaleAge = maxStaleAge.map(Self.kept).flatMap { $0 > .zero ? $0.clampedToLimits : nil }
        storedExpiry = WholeNanoseconds(expiry)
        storedFailureExpiry = WholeNanoseconds(Self.kept(failureExpiry.clampedToLimits))
        storedTimeout = WholeNanoseconds(timeout)
        storedSoftTimeout = WholeNanoseconds(softTimeout)
        storedRefreshAfter = WholeNanoseconds(refreshAfter)
        storedMaxStaleAge = WholeNanoseconds(maxStaleAge)
        emptinessTest = isEmpty
        self.retry = retry
        self.staleWhileRevalidate = staleWhileRevalidate
        timeToLive = Self.ownLifetime
    }

    /// `duration` as it is kept: whole nanoseconds, rounded down, but at least one if it is positive.
    @inlinable
    static func kept(_ duration: Duration) -> Duration {
        guard duration > .zero else { return WholeNanoseconds(duration).duration ?? .zero }
        return WholeNanoseconds(max(duration, .nanoseconds(1))).duration ?? .zero
    }
}
