public import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The few things a store needs from its clock, with the clock's type erased behind closures that
/// were specialized when they were made (so a read costs one indirect call, not a generic lookup).
///
/// `now`, read on every hit, is kept inline; the rest lives in a ``Reading``, one reference that
/// every state on a standard clock shares (the clock's reading is per process). So a store holds
/// 24 bytes of clock rather than the four closures' 64, and a hit reads its clock as before: through
/// the reference, the call would retain and release the closure's context, a tenth of a hit.
@usableFromInline
struct StoreClock: Sendable {
    /// The time since the clock's origin (its `now` when the store was made).
    @usableFromInline let now: @Sendable () -> Duration
    /// The rest of the closures, shared by every store on the same reading.
    @usableFromInline let reading: Reading

    /// The wall date for a success stamp.
    @inlinable var date: @Sendable () -> Date { reading.date }
    /// Suspends until `offset` since the origin (cancellable).
    @inlinable var sleep: @Sendable (_ until: Duration) async throws -> Void { reading.sleep }
    /// The executor preference for the store's tasks (see `SettlingClock`).
    @inlinable var executor: (any TaskExecutor)? { reading.executor }

    /// What a store reads of its clock off the hit path.
    @usableFromInline
    final class Reading: Sendable {
        @usableFromInline let date: @Sendable () -> Date
        @usableFromInline let sleep: @Sendable (_ until: Duration) async throws -> Void
        @usableFromInline let executor: (any TaskExecutor)?

        init(
            date: @escaping @Sendable () -> Date, sleep: @escaping @Sendable (_ until: Duration) async throws -> Void,
            executor: (any TaskExecutor)?
        ) {
            (self.date, self.sleep, self.executor) = (date, sleep, executor)
        }
    }

    init<C: Clock<Duration>>(_ clock: C) {
        // A `ContinuousClock` or `SuspendingClock` has no state of its own: every store shares one
        // reading of it (an origin per process rather than per state), which saves each state an
        // allocation.
        if clock is ContinuousClock {
            self = Self.continuous
            return
        }
        if clock is SuspendingClock {
            self = Self.suspending
            return
        }
        self.init(reading: clock)
    }

    /// The shared reading of `ContinuousClock`.
    private static let continuous = StoreClock(reading: ContinuousClock())
    /// The shared reading of `SuspendingClock`.
    private static let suspending = StoreClock(reading: SuspendingClock())

    /// A reading of `clock` with its own origin.
    private init<C: Clock<Duration>>(reading clock: C) {
        #if os(Linux)
        // On Linux the standard clocks are one `clock_gettime` each (the Swift runtime reads
        // CLOCK_BOOTTIME for `ContinuousClock` and CLOCK_MONOTONIC for `SuspendingClock`). Reading it
        // here directly skips the runtime's conversions through `Instant` and 128-bit arithmetic:
        // about a quarter of a hit's cost.
        if let continuous = clock as? ContinuousClock {
            self.init(direct: continuous, id: CLOCK_BOOTTIME)
            return
        }
        if let suspending = clock as? SuspendingClock {
            self.init(direct: suspending, id: CLOCK_MONOTONIC)
            return
        }
        #endif
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
        // its own: two allocations for all three (the context and the reading).
        let context = Context(clock)
        now = { context.origin.duration(to: context.clock.now) }
        reading = Reading(
            date: Self.date(of: clock),
            sleep: { offset in
                try await context.clock.sleep(until: context.origin.advanced(by: offset), tolerance: nil)
            },
            executor: clock.settlingExecutor)
    }

    /// The wall date for a success stamp (read once per success): the clock's own if it is a
    /// ``DatedClock``, else `Date()`. Whether it is one is decided here, once: a dynamic cast on each
    /// read was about 3 % of a family miss.
    private static func date<C: Clock<Duration>>(of clock: C) -> @Sendable () -> Date {
        guard let dated = clock as? any DatedClock else { return { Date() } }
        return { dated.date }
    }

    #if os(Linux)
    /// Reads `id`, the same kernel clock `clock` reads, directly.
    private init<C: Clock<Duration>>(direct clock: C, id: clockid_t) {
        // The raw origin is read before the instant: the instant is then the same or a little later,
        // so a sleep until `origin + offset` never wakes before `now()` reads `offset`.
        let rawOrigin = Self.nanoseconds(of: id)
        let context = Context(clock, rawOrigin: rawOrigin, clockID: id)
        now = { .nanoseconds(Self.nanoseconds(of: context.clockID) &- context.rawOrigin) }
        reading = Reading(
            date: Self.date(of: clock),
            sleep: { offset in
                try await context.clock.sleep(until: context.origin.advanced(by: offset), tolerance: nil)
            },
            executor: clock.settlingExecutor)
    }

    /// Nanoseconds on kernel clock `id` (since boot, for the clocks used here: an `Int64` lasts 292
    /// years).
    private static func nanoseconds(of id: clockid_t) -> Int64 {
        var time = timespec()
        clock_gettime(id, &time)
        return Int64(time.tv_sec) &* 1_000_000_000 &+ Int64(time.tv_nsec)
    }
    #endif

    /// What the closures share.
    private final class Context<C: Clock<Duration>>: Sendable {
        let clock: C
        let origin: C.Instant
        #if os(Linux)
        /// For a clock read directly: `origin` in nanoseconds on kernel clock `clockID`.
        let rawOrigin: Int64
        let clockID: clockid_t

        init(_ clock: C, rawOrigin: Int64 = 0, clockID: clockid_t = 0) {
            self.clock = clock
            origin = clock.now
            self.rawOrigin = rawOrigin
            self.clockID = clockID
        }
        #else
        init(_ clock: C) {
            self.clock = clock
            origin = clock.now
        }
        #endif
    }
}
