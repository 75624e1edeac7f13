public import Foundation

/// What an ``AsyncState`` holds at one moment: its value, its phase, whether the data was expired,
/// and a little history for logs and dashboards.
///
/// ``AsyncState/updates`` delivers one of these for the current state and then one per transition
/// (a failed attempt that will be retried is a transition too: ``failureCount`` goes up while the
/// phase stays `loading`). ``AsyncState/snapshot`` reads the current one synchronously.
public struct AsyncSnapshot<Value: Sendable>: Sendable {
    /// The latest value (kept while loading and after a failure).
    public var value: Value
    /// The phase at that moment.
    public var phase: AsyncPhase
    /// Whether the data was expired at that moment: a `fetch` then would have gone to the source.
    ///
    /// Expiry is lazy — nothing runs when data goes stale — so a snapshot is not re-sent when its data
    /// merely ages past the expiry; ``AsyncState/hasExpired(in:)`` answers for now.
    public var isExpired: Bool
    /// Whether ``value`` came from a fetch or a `set` (it may have expired since), rather than being the
    /// state's initial value: `false` when the state was never fetched or was reset. (Declared here,
    /// beside ``isExpired``, so that it fits in the padding after it: a state holds a snapshot.)
    public var hasValue: Bool
    /// Failed attempts of the current fetch (or of the last one, if none is in flight); zero after a
    /// success and when a fetch starts.
    public var failureCount: Int
    /// The error of the most recent failed attempt, kept after later successes (until ``AsyncState/reset()``).
    public var lastError: (any Error)?
    /// The wall date of the most recent success or write (``AsyncState/set(_:)``): the date of the
    /// value held, kept while later fetches load or fail.
    public var lastSuccess: Date?
    /// How many fetches have succeeded since the state was created (or reset).
    public var successCount: Int

    /// Creates a snapshot; each argument sets the property of the same name. A `hasValue` of `nil`
    /// (the default) is derived: `true` if the phase is a success (or `empty`) or there was a success
    /// before — a value that was only `set` cannot be told from these, so pass `hasValue` for it
    /// (the states' own snapshots always carry it).
    @inlinable
    public init(
        value: Value, phase: AsyncPhase, isExpired: Bool, failureCount: Int = 0, lastError: (any Error)? = nil,
        lastSuccess: Date? = nil, successCount: Int = 0, hasValue: Bool? = nil
    ) {
        self.value = value
        self.phase = phase
        self.isExpired = isExpired
        self.failureCount = failureCount
        self.lastError = lastError
        self.lastSuccess = lastSuccess
        self.successCount = successCount
        self.hasValue = hasValue ?? (phase.hasSucceeded || lastSuccess != nil)
    }
}

extension AsyncSnapshot {
    /// The value, if it came from a fetch or a `set` (``hasValue``), else `nil`: what a presentation
    /// can still show while a new fetch loads or after it failed.
    public var previousValue: Value? { hasValue ? value : nil }

    /// Maps this snapshot to what it presents — a response, a log line, a label — in one exhaustive
    /// place, one closure per phase.
    ///
    /// The value is handed only where it means something: to `success` with its date, and as the
    /// optional `previous` (``previousValue``) to `loading` and `failure`, so that a stale value stays
    /// presentable while a fetch loads or after it failed. The compiler checks that every phase is
    /// handled: a new kind of presentation is one call, not a `switch` per call site.
    ///
    /// ```swift
    /// let status = $forecast.snapshot.fold(
    ///     initial: { 503 },
    ///     loading: { previous in previous == nil ? 503 : 200 },
    ///     empty: { 204 },
    ///     success: { _, _ in 200 },
    ///     failure: { _, previous in previous == nil ? 503 : 200 })
    /// ```
    ///
    /// `empty` receives no value: it is an answer ("nothing today"), and ``value`` still holds the empty
    /// value for callers that want it.
    public func fold<Result>(
        initial: () throws -> Result,
        loading: (_ previous: Value?) throws -> Result,
        empty: () throws -> Result,
        success: (_ value: Value, _ date: Date) throws -> Result,
        failure: (_ error: any Error, _ previous: Value?) throws -> Result
    ) rethrows -> Result {
        switch phase {
        case .initial: return try initial()
        case .loading: return try loading(previousValue)
        case .empty: return try empty()
        case .success(let date): return try success(value, date)
        case .failure(let error): return try failure(error, previousValue)
        }
    }
}
