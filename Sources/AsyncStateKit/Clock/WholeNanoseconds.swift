/// An optional duration or instant kept in whole nanoseconds: 8 bytes, where a `Duration?` takes 17
/// (24 beside other fields, by alignment). What a compact family entry keeps of its instants and a
/// store's configuration of its durations: clocks give nanoseconds, so nothing a clock reads is lost.
///
/// Rounded down (toward the past for an instant below zero, so it is never later than it was), and
/// clamped to `Int64`'s range above `Int64.min`, which stands for `nil`.
@usableFromInline
struct WholeNanoseconds: Sendable, Equatable {
    /// The nanoseconds, or `Int64.min` for none.
    @usableFromInline let rawValue: Int64

    /// `duration` in whole nanoseconds; none for `nil`.
    @inlinable
    init(_ duration: Duration?) {
        rawValue = Self.nanoseconds(duration)
    }

    /// The kept nanoseconds as a duration; `nil` for none.
    @inlinable var duration: Duration? { rawValue == .min ? nil : .nanoseconds(rawValue) }

    /// `duration` in whole nanoseconds, rounded down and clamped to `Int64`'s range above the
    /// sentinel; `Int64.min` for `nil`.
    @inlinable
    static func nanoseconds(_ duration: Duration?) -> Int64 {
        guard let duration else { return .min }
        // Seconds and attoseconds share the duration's sign (both truncated toward zero).
        let (seconds, attoseconds) = duration.components
        let limit = Int64.max / 1_000_000_000 - 1
        guard seconds < limit else { return .max }
        guard seconds > -limit else { return .min + 1 }
        let (whole, rest) = attoseconds.quotientAndRemainder(dividingBy: 1_000_000_000)
        return seconds * 1_000_000_000 + whole - (rest < 0 ? 1 : 0)
    }
}
