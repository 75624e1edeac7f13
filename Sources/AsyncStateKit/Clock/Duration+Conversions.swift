extension Duration {
    /// The duration in seconds, as a `Double` (a `TimeInterval`).
    package var timeInterval: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) * 1e-18
    }

    /// The duration in whole nanoseconds, clamped to `0...Int64.max` (negative durations are zero).
    package var wholeNanoseconds: Int64 {
        let (seconds, attoseconds) = components
        guard seconds >= 0 else { return 0 }
        let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        guard !overflow else { return .max }
        let (total, overflow2) = scaled.addingReportingOverflow(attoseconds / 1_000_000_000)
        return overflow2 ? .max : total
    }

    /// `interval` seconds, within `±AsyncStateLimits.maximumDuration` (a wall-clock difference read
    /// from a second level may be anything); zero for NaN.
    @usableFromInline
    static func clamped(seconds interval: Double) -> Duration {
        let bound = AsyncStateLimits.maximumDuration.timeInterval
        guard !interval.isNaN else { return .zero }
        return .nanoseconds(Int64(max(-bound, min(bound, interval)) * 1e9))
    }
}
