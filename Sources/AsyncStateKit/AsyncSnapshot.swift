/// What an ``AsyncState`` holds at one moment: its value, its phase, and whether the data was expired.
///
/// ``AsyncState/updates`` delivers one of these for the current state and then one per transition.
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

    /// Creates a snapshot.
    public init(value: Value, phase: AsyncPhase, isExpired: Bool) {
        self.value = value
        self.phase = phase
        self.isExpired = isExpired
    }
}
