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
    /// Failed attempts of the current fetch (or of the last one, if none is in flight); zero after a
    /// success and when a fetch starts.
    public var failureCount: Int
    /// The error of the most recent failed attempt, kept after later successes (until ``AsyncState/reset()``).
    public var lastError: (any Error)?
    /// The wall date of the most recent success, kept while later fetches load or fail.
    public var lastSuccess: Date?
    /// How many fetches have succeeded since the state was created (or reset).
    public var successCount: Int

    /// Creates a snapshot.
    public init(
        value: Value, phase: AsyncPhase, isExpired: Bool, failureCount: Int = 0, lastError: (any Error)? = nil,
        lastSuccess: Date? = nil, successCount: Int = 0
    ) {
        self.value = value
        self.phase = phase
        self.isExpired = isExpired
        self.failureCount = failureCount
        self.lastError = lastError
        self.lastSuccess = lastSuccess
        self.successCount = successCount
    }
}
