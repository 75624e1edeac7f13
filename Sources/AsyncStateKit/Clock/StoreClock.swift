import Foundation

/// The few things a store needs from its clock, with the clock's type erased behind closures that
/// were specialized when they were made (so a read costs one indirect call, not a generic lookup).
@usableFromInline
struct StoreClock: Sendable {
    /// The time since the clock's origin (its `now` when the store was made).
    @usableFromInline let now: @Sendable () -> Duration
    /// The wall date for a success stamp.
    let date: @Sendable () -> Date
    /// Suspends until `offset` since the origin (cancellable).
    let sleep: @Sendable (_ until: Duration) async throws -> Void
    /// The executor preference for the store's tasks (see `SettlingClock`).
    let executor: (any TaskExecutor)?
    /// The serial executor for the store's actor, when the clock settles (see `SettlingClock`).
    let serialExecutor: (any SerialExecutor)?

    init<C: Clock<Duration>>(_ clock: C) {
        // The common clocks get closures specialized for their concrete type (the read is on every
        // hit); any other clock works through its generic witnesses.
        if let continuous = clock as? ContinuousClock {
            self.init(specialized: continuous)
        } else if let suspending = clock as? SuspendingClock {
            self.init(specialized: suspending)
        } else {
            self.init(specialized: clock)
        }
    }

    private init<C: Clock<Duration>>(specialized clock: C) {
        let origin = clock.now
        now = { origin.duration(to: clock.now) }
        if let dated = clock as? any DatedClock {
            date = { dated.date }
        } else {
            date = { Date() }
        }
        sleep = { offset in try await clock.sleep(until: origin.advanced(by: offset), tolerance: nil) }
        executor = clock.settlingExecutor
        serialExecutor = clock.settlingSerialExecutor
    }
}
