/// The bounds ``AsyncState`` puts on what it is given, so that no input can trap or pile up work.
///
/// Real clocks convert a deadline before they sleep, and `ContinuousClock` traps when the deadline
/// does not fit (`.seconds(Int64.max)` does not). So every duration a state is given — expiry,
/// failure expiry, timeout, `run(every:)` interval, backoff delays and caps, retry budgets — is clamped
/// to `0...maximumDuration` before it is used, and every sum of an instant and a duration saturates.
/// A hundred years is longer than any process lives, so the clamp changes no real schedule.
///
/// A state's and a family's expiry, failure expiry, timeout, soft timeout, refresh-ahead age and
/// `maxStaleAge` are kept in whole nanoseconds (what clocks read): a fraction of a nanosecond is
/// dropped, and a positive duration shorter than one nanosecond counts as one.
public enum AsyncStateLimits {
    /// The longest duration a state uses: 100 years (3,155,760,000 seconds). Longer durations given
    /// to a state or a ``RetryPolicy`` are treated as this.
    public static var maximumDuration: Duration { .seconds(3_155_760_000) }

    /// How many timed-out operations of one state may still be running (they were cancelled but
    /// ignore cancellation) before the state stops starting new ones: 4.
    ///
    /// While that many are running, a fetch that would start an operation fails at once with
    /// ``AsyncStateError/tooManyAbandonedOperations(limit:)`` and a flight that would retry settles
    /// with its last error instead. As soon as one of them returns, operations start again.
    public static var abandonedOperations: Int { 4 }
}

extension Duration {
    /// This duration clamped to `0...AsyncStateLimits.maximumDuration`.
    @usableFromInline package var clampedToLimits: Duration {
        min(max(self, .zero), AsyncStateLimits.maximumDuration)
    }

    /// `self + other`, saturating instead of overflowing (for an instant plus a clamped,
    /// non-negative duration).
    @usableFromInline package func saturatingAdd(_ other: Duration) -> Duration {
        let ceiling = Duration.seconds(Int64.max)
        guard other > .zero else { return self + max(other, .zero - ceiling) }
        return self > ceiling - other ? ceiling : self + other
    }
}
