/// The policies a state is declared with, normalized: durations clamped to
/// ``AsyncStateLimits/maximumDuration``, meaningless values switched off.
@usableFromInline
struct StoreConfiguration<Value: Sendable>: Sendable {
    /// How long data stays fresh; zero means never fresh.
    @usableFromInline var expiry: Duration
    /// How long a failure is answered from the negative cache; zero means never.
    @usableFromInline var failureExpiry: Duration
    /// Decides whether a successful value is empty.
    @usableFromInline var isEmpty: @Sendable (Value) -> Bool
    /// The retry policy of fetches whose caller gives none.
    @usableFromInline var retry: RetryPolicy
    /// The longest an attempt may run; `nil` for no limit.
    @usableFromInline var timeout: Duration?
    /// How long readers wait for a flight before a usable value is answered instead, while the
    /// flight goes on in the background; `nil` for ever.
    @usableFromInline var softTimeout: Duration?
    /// Whether `value` serves stale data at once and refreshes it in the background.
    @usableFromInline var staleWhileRevalidate: Bool
    /// The age at which a hit on fresh data starts a background refresh; `nil` for never.
    @usableFromInline var refreshAfter: Duration?
    /// Fail-safe: how old the last good value may be and still be answered instead of a failure;
    /// `nil` for never.
    @usableFromInline var maxStaleAge: Duration?
    /// A value's own lifetime (``AsyncStateExpiring/timeToLive``) when `Value` conforms to
    /// ``AsyncStateExpiring``; `nil` otherwise, so that other values pay nothing.
    @usableFromInline var timeToLive: (@Sendable (Value) -> Duration?)?

    /// How long data is answered as a hit, without asking the machine: the refresh-ahead age when
    /// there is one (older data goes to the machine, which may start the refresh), else the expiry.
    /// The one definition of the hit window, for the machine, the states' cells and the families.
    @inlinable var hitWindow: Duration { refreshAfter ?? expiry }

    /// How a `Value` tells its own lifetime: through ``AsyncStateExpiring`` if it conforms, else `nil`
    /// (the conformance is tested once, here, not on every arrival).
    @inlinable static var ownLifetime: (@Sendable (Value) -> Duration?)? {
        guard Value.self is any AsyncStateExpiring.Type else { return nil }
        return { value in
            let expiring: (any AsyncStateExpiring)? = value as? any AsyncStateExpiring
            return expiring?.timeToLive
        }
    }

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
        expiry: Duration, failureExpiry: Duration = .zero, isEmpty: @escaping @Sendable (Value) -> Bool,
        retry: RetryPolicy = .never, timeout: Duration? = nil, softTimeout: Duration? = nil,
        staleWhileRevalidate: Bool = false, refreshAfter: Duration? = nil, maxStaleAge: Duration? = nil
    ) {
        self.expiry = expiry.clampedToLimits
        self.failureExpiry = failureExpiry.clampedToLimits
        self.isEmpty = isEmpty
        self.retry = retry
        self.timeout = timeout.flatMap { $0 > .zero ? $0.clampedToLimits : nil }
        let hardTimeout = self.timeout
        self.softTimeout = softTimeout.flatMap { $0 > .zero && $0 < (hardTimeout ?? .seconds(Int64.max)) ? $0 : nil }
            .map(\.clampedToLimits)
        self.staleWhileRevalidate = staleWhileRevalidate
        self.refreshAfter = refreshAfter.flatMap { $0 > .zero && $0 < self.expiry ? $0 : nil }
        self.maxStaleAge = maxStaleAge.flatMap { $0 > .zero ? $0.clampedToLimits : nil }
        timeToLive = Self.ownLifetime
    }
}
