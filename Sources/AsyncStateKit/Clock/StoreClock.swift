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
        // Every closure captures only `context`, a single reference, so none needs a context box of
        // its own: one allocation for all three.
        let context = Context(clock)
        now = { context.origin.duration(to: context.clock.now) }
        date = { (context.clock as? any DatedClock)?.date ?? Date() }  // once per success
        sleep = { offset in try await context.clock.sleep(until: context.origin.advanced(by: offset), tolerance: nil) }
        executor = clock.settlingExecutor
    }

    /// What the closures share.
    private final class Context<C: Clock<Duration>>: Sendable {
        let clock: C
        let origin: C.Instant

        init(_ clock: C) {
            self.clock = clock
            origin = clock.now
        }
    }
}
