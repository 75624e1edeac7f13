/// A clock that can tell when the work it woke has settled, because that work runs on executors
/// the clock watches.
///
/// A test clock such as `VirtualClock` (in `AsyncStateTesting`) moves time forward only when told to,
/// and after each wake waits until the woken work has run to its next suspension. It can only see
/// work that runs on its executors, so a library that does work on behalf of a clock-driven caller
/// takes part like this:
///
/// - tasks it starts prefer ``taskExecutor``:
///   `Task(executorPreference: clock.taskExecutor) { … }`;
/// - actors that hold state driven by the clock run on ``serialExecutor``, by returning
///   `clock.serialExecutor.asUnownedSerialExecutor()` from `unownedExecutor`. (A default actor does
///   not do: jobs queued on it while it is busy may be drained on the global executor, out of sight.)
///
/// ```swift
/// actor Poller {
///     nonisolated let unownedExecutor: UnownedSerialExecutor
///     init(clock: some SettlingClock) {
///         unownedExecutor = clock.serialExecutor.asUnownedSerialExecutor()
///     }
/// }
/// ```
///
/// Real clocks (`ContinuousClock`, `SuspendingClock`) do not conform; for them there is nothing to
/// settle. `@AsyncState` starts all its tasks with the clock's task executor (its store has no actor:
/// every event runs under a lock inside a job the clock already counts), which is why a test can assert
/// on a state right after advancing a virtual clock.
public protocol SettlingClock: Clock {
    /// The executor that tasks started on behalf of this clock should prefer, so that the clock can
    /// count their work and wait for it to settle.
    var taskExecutor: any TaskExecutor { get }

    /// A serial executor, watched like ``taskExecutor``, for actors whose work this clock drives.
    /// The clock must keep it alive as long as the clock lives.
    var serialExecutor: any SerialExecutor { get }
}

extension Clock {
    /// The executor preference for tasks started on behalf of this clock: the clock's
    /// ``SettlingClock/taskExecutor`` when it has one, otherwise `nil` (no preference).
    package var settlingExecutor: (any TaskExecutor)? {
        (self as? any SettlingClock)?.taskExecutor
    }

}
