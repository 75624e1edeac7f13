/// A clock that can tell when the work it woke has settled, because that work runs on an executor
/// the clock watches.
///
/// A test clock such as `VirtualClock` (in `AsyncStateTesting`) moves time forward only when told to,
/// and after each wake waits until the woken work has run to its next suspension. It can only see
/// work that runs on its ``taskExecutor``: a library that starts tasks on behalf of a clock-driven
/// caller should start them with that executor as their preference, and should run calls into its own
/// actors under it, so that the clock counts them:
///
/// ```swift
/// func startRefresh<C: Clock<Duration>>(on clock: C, _ work: @escaping @Sendable () async -> Void) -> Task<Void, Never> {
///     Task(executorPreference: (clock as? any SettlingClock)?.taskExecutor) { await work() }
/// }
/// ```
///
/// Real clocks (`ContinuousClock`, `SuspendingClock`) do not conform; for them there is nothing to
/// settle and tasks run on the global concurrent executor as usual. `@AsyncState` does this for its
/// own tasks, which is why a test can assert on a state right after advancing a virtual clock.
public protocol SettlingClock: Clock {
    /// The executor that tasks started on behalf of this clock should prefer, so that the clock can
    /// count their work and wait for it to settle.
    var taskExecutor: any TaskExecutor { get }
}

extension Clock {
    /// The executor preference for tasks started on behalf of this clock: the clock's
    /// ``SettlingClock/taskExecutor`` when it has one, otherwise `nil` (no preference).
    package var settlingExecutor: (any TaskExecutor)? {
        (self as? any SettlingClock)?.taskExecutor
    }
}
