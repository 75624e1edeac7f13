public import AsyncStateKit
public import Foundation

/// A clock whose time moves only when a test moves it, and which waits, after every wake, until the
/// work it woke has settled.
///
/// Code under test takes a clock (`some Clock<Duration>`); production passes `ContinuousClock()`, the
/// test passes a `VirtualClock` and drives it. A two-minute expiry or a backoff schedule then runs in
/// microseconds, and an assertion made right after ``advance(by:fileID:filePath:line:column:)`` sees
/// the state the woken work left — every time, on a loaded machine too:
///
/// ```swift
/// actor Heartbeat {
///     var beats = 0
///     func run(on clock: some Clock<Duration>) async throws {
///         while true {
///             try await clock.sleep(for: .seconds(30))
///             beats += 1
///         }
///     }
/// }
///
/// @Test func beatsEveryThirtySeconds() async throws {
///     let clock = VirtualClock()
///     let heartbeat = Heartbeat()
///     let task = clock.task { try await heartbeat.run(on: clock) }
///
///     await clock.advance(by: .seconds(29))
///     #expect(await heartbeat.beats == 0)
///     await clock.advance(by: .seconds(1))
///     #expect(await heartbeat.beats == 1)
///     await clock.advance(by: .seconds(300))
///     #expect(await heartbeat.beats == 11)
///
///     task.cancel()
///     await clock.checkSuspension()   // no sleeper left behind
/// }
/// ```
///
/// ## How settling works
///
/// The clock owns a ``taskExecutor`` (an SE-0417 `TaskExecutor`) that runs jobs one at a time on a
/// serial queue and **counts every job from the moment it is enqueued until it has run**. Tasks started
/// with ``task(_:)`` prefer that executor, and so do their child tasks (`async let`, task groups) and
/// the tasks `@AsyncState` starts for a state that uses this clock. Waking a sleeper resumes its
/// continuation, which enqueues the woken task's next job synchronously: the count is already one
/// before `resume()` returns, so there is no moment at which the clock could see "idle" while woken
/// work has yet to run. ``advance(to:fileID:filePath:line:column:)`` wakes the due sleepers one at a
/// time, in (deadline, registration) order, sets ``now`` to each one's deadline, and before taking the
/// next one waits until the count is zero — that is, until all the work it can see has run to its next
/// suspension (a sleep on this clock, an await on something else) or finished. No `Task.yield` loops,
/// no process-wide hooks: tests that run in parallel, each with its own clock, do not disturb each other.
///
/// The count sees only work on the executor. Work that hops elsewhere — to the main actor, to an
/// actor with a custom executor, to an unstructured `Task {}` (which does not inherit the preference;
/// use ``task(_:)`` instead), or to real I/O — is not waited for.
///
/// ## Semantics
///
/// - ``Instant`` is an offset from the start; ``minimumResolution`` is zero and sleep tolerances are
///   ignored.
/// - A sleep whose deadline is at or before ``now`` returns at once, without suspending (as Kotlin's
///   and tokio's test clocks do). pointfreeco/swift-clocks' `TestClock` suspends such a sleep until
///   the next advance instead.
/// - Sleepers live in a min-heap: O(log N) to sleep and to wake, first-in first-out among equal
///   deadlines. A sleeping task that is cancelled throws `CancellationError` at once; so does a sleep
///   whose task was cancelled before the sleep had registered.
/// - A wait that cannot make progress — woken work that never settles, ``waitForSleepers(_:fileID:filePath:line:column:)``
///   for sleepers that never come, ``runUntilIdle(maxWakes:fileID:filePath:line:column:)`` on a timer
///   that reschedules itself forever — does not hang the test run: after ``stallTimeout`` of real time
///   it reports an issue that lists the pending sleepers (see ``Stall``) and returns.
public final class VirtualClock: Clock, SettlingClock, DatedClock, Sendable {
    /// A point in virtual time: an offset from the clock's start.
    public struct Instant: InstantProtocol, Hashable, Sendable, CustomStringConvertible {
        /// The time since the clock started.
        public var offset: Duration

        /// Creates the instant `offset` after the clock's start.
        public init(offset: Duration) {
            self.offset = offset
        }

        /// This instant moved by `duration`.
        public func advanced(by duration: Duration) -> Instant {
            Instant(offset: offset + duration)
        }

        /// The duration from this instant to `other`.
        public func duration(to other: Instant) -> Duration {
            other.offset - offset
        }

        /// Whether `lhs` comes before `rhs`.
        public static func < (lhs: Instant, rhs: Instant) -> Bool {
            lhs.offset < rhs.offset
        }

        /// The offset, e.g. `"+120.0 seconds"`.
        public var description: String {
            "+\(offset)"
        }
    }

    /// The wall date at which the clock starts; ``date`` is this plus the time advanced since.
    public let startDate: Date

    /// How long, in real time, a wait for work to settle or for sleepers to arrive may take before the
    /// clock reports a ``Stall`` instead of hanging.
    public var stallTimeout: Duration { core.stallTimeout }

    private let core: VirtualClockCore
    private let executor: SettlingTaskExecutor
    private let actorExecutor: SettlingSerialExecutor
    private let onStall: @Sendable (Stall) -> Void

    /// Creates a clock at virtual time zero, whose wall ``date`` starts at 2001-01-01 00:00:00 UTC.
    public convenience init() {
        self.init(startDate: Date(timeIntervalSinceReferenceDate: 0))
    }

    /// Creates a clock at virtual time zero.
    ///
    /// - Parameters:
    ///   - startDate: The wall ``date`` at virtual time zero. Defaults to 2001-01-01 00:00:00 UTC.
    ///   - stallTimeout: How long in real time a wait may fail to make progress before it is reported
    ///     as a ``Stall``. Defaults to 10 seconds; a zero or negative value reports at once.
    ///   - onStall: Called, on the waiting task, when a wait stalls. By default the stall is recorded
    ///     as a Swift Testing issue (when a test is running) and written to standard error.
    public init(
        startDate: Date = Date(timeIntervalSinceReferenceDate: 0),
        stallTimeout: Duration = .seconds(10),
        onStall: (@Sendable (Stall) -> Void)? = nil
    ) {
        self.startDate = startDate
        let core = VirtualClockCore(stallTimeout: stallTimeout)
        self.core = core
        self.executor = SettlingTaskExecutor(core: core)
        self.actorExecutor = SettlingSerialExecutor(core: core)
        self.onStall = onStall ?? { stall in reportIssue(stall.description, at: stall.location) }
    }

    // MARK: Clock

    /// The current virtual time.
    public var now: Instant {
        Instant(offset: core.state.withLock { $0.now })
    }

    /// Zero: virtual time has no granularity.
    public var minimumResolution: Duration { .zero }

    /// The virtual wall date: ``startDate`` plus the time advanced so far.
    ///
    /// `@AsyncState` stamps `success(Date)` with this date, so a test can assert it exactly.
    public var date: Date {
        startDate.addingTimeInterval(now.offset.timeInterval)
    }

    /// The executor that makes tasks take part in settling (see `SettlingClock` in AsyncStateKit).
    public var taskExecutor: any TaskExecutor { executor }

    /// The serial executor that makes an actor's jobs take part in settling (see `SettlingClock` in AsyncStateKit).
    public var serialExecutor: any SerialExecutor { actorExecutor }

    /// Suspends until virtual time reaches `deadline`.
    ///
    /// Returns at once when `deadline` is at or before ``now``. Throws `CancellationError` at once when
    /// the task is cancelled, before or during the sleep.
    ///
    /// - Parameters:
    ///   - deadline: The instant to wake at.
    ///   - tolerance: Ignored: virtual time is exact.
    public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
        try Task.checkCancellation()
        guard let id = core.reserveSleep(until: deadline.offset) else { return }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                core.register(id, deadline: deadline.offset, continuation)
            }
        } onCancel: {
            core.cancelSleep(id)
        }
    }

    // MARK: Driving time

    /// The number of sleeps registered and not yet woken or cancelled.
    public var pendingSleepers: Int {
        core.state.withLock { $0.sleepers.count }
    }

    /// Starts a task that takes part in settling: it runs on ``taskExecutor``, so ``advance(by:fileID:filePath:line:column:)``
    /// waits for it (and for its child tasks) to reach a suspension before going on.
    ///
    /// ```swift
    /// let refresh = clock.task { try await service.refresh() }
    /// await clock.advance(by: .seconds(1))   // refresh has run up to its next sleep
    /// ```
    @discardableResult
    public func task<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) -> Task<T, any Error> {
        Task(executorPreference: executor, operation: body)
    }

    /// Moves virtual time forward by `duration`, waking and settling every sleeper due on the way.
    ///
    /// Equivalent to `advance(to: now.advanced(by: duration))`. A zero or negative `duration` moves
    /// nothing but still settles pending work.
    public func advance(
        by duration: Duration,
        fileID: String = #fileID, filePath: String = #filePath, line: Int = #line, column: Int = #column
    ) async {
        let location = SourceLocation(fileID: fileID, filePath: filePath, line: line, column: column)
        _ = await advance(to: now.offset + duration, wakeLimit: .max, operation: "advance(by: \(duration))", location)
    }

    /// Moves virtual time forward to `deadline`, waking the due sleepers one at a time in
    /// (deadline, registration) order and settling after each.
    ///
    /// First waits for pending work to settle (so a task started just before has reached its first
    /// sleep). Then, for each due sleeper: sets ``now`` to its deadline, resumes it, and waits until the
    /// work it woke has run to its next suspension or finished. Sleeps registered during the advance
    /// with a deadline at or before `deadline` are woken too. On return ``now`` is `deadline` and
    /// everything due by then has run. A `deadline` in the past moves nothing (time never goes back)
    /// but still settles.
    ///
    /// Call it from the test, not from a task started with ``task(_:)``: such a task would wait for
    /// itself, so the clock reports a ``Stall`` instead.
    public func advance(
        to deadline: Instant,
        fileID: String = #fileID, filePath: String = #filePath, line: Int = #line, column: Int = #column
    ) async {
        let location = SourceLocation(fileID: fileID, filePath: filePath, line: line, column: column)
        _ = await advance(to: deadline.offset, wakeLimit: .max, operation: "advance(to: \(deadline))", location)
    }

    /// Waits for pending work to settle, without moving time.
    public func settle(
        fileID: String = #fileID, filePath: String = #filePath, line: Int = #line, column: Int = #column
    ) async {
        let location = SourceLocation(fileID: fileID, filePath: filePath, line: line, column: column)
        _ = await settle(operation: "settle()", location)
    }

    /// Advances to each next deadline until no sleeper is left.
    ///
    /// Bounded: a timer that reschedules itself forever would keep this going, so after `maxWakes`
    /// wakes with sleepers still pending it reports a ``Stall`` and returns.
    ///
    /// - Parameters:
    ///   - maxWakes: How many sleepers it may wake before giving up. Defaults to 100,000.
    ///   - fileID: Where a ``Stall`` is reported; leave the default (the caller's location).
    ///   - filePath: Where a ``Stall`` is reported; leave the default.
    ///   - line: Where a ``Stall`` is reported; leave the default.
    ///   - column: Where a ``Stall`` is reported; leave the default.
    public func runUntilIdle(
        maxWakes: Int = 100_000,
        fileID: String = #fileID, filePath: String = #filePath, line: Int = #line, column: Int = #column
    ) async {
        let location = SourceLocation(fileID: fileID, filePath: filePath, line: line, column: column)
        var remaining = max(0, maxWakes)
        while true {
            guard await settle(operation: "runUntilIdle()", location) else { return }
            guard let next = core.nextDeadline else { return }
            guard remaining > 0 else {
                report(
                    "runUntilIdle()",
                    "sleepers remain after \(maxWakes) wakes; a timer that reschedules itself never lets the clock go idle (advance by a fixed duration instead)",
                    location)
                return
            }
            guard let woken = await advance(to: next, wakeLimit: remaining, operation: "runUntilIdle()", location)
            else { return }
            remaining -= woken
        }
    }

    /// Waits until at least `count` sleeps are pending on this clock.
    ///
    /// Useful when the code under test runs in a task the clock does not watch (one not started with
    /// ``task(_:)``): it tells the test that the code has reached its sleep. Reports a ``Stall`` and
    /// returns if that does not happen within ``stallTimeout``.
    public func waitForSleepers(
        _ count: Int,
        fileID: String = #fileID, filePath: String = #filePath, line: Int = #line, column: Int = #column
    ) async {
        guard await core.waitForSleepers(count) else {
            let location = SourceLocation(fileID: fileID, filePath: filePath, line: line, column: column)
            return report(
                "waitForSleepers(\(count))",
                "fewer than \(count) sleepers had arrived after \(stallTimeout) (\(pendingSleepers) pending now)",
                location)
        }
    }

    /// Settles, then reports an issue if any sleeper is still pending: call it at the end of a test so
    /// no task is left asleep behind it.
    ///
    /// - Returns: `true` when no sleeper is pending.
    @discardableResult
    public func checkSuspension(
        fileID: String = #fileID, filePath: String = #filePath, line: Int = #line, column: Int = #column
    ) async -> Bool {
        let location = SourceLocation(fileID: fileID, filePath: filePath, line: line, column: column)
        guard await settle(operation: "checkSuspension()", location) else { return false }
        let pending = pendingSleepers
        guard pending == 0 else {
            report("checkSuspension()", "\(pending) sleeper(s) still pending at the end of the test", location)
            return false
        }
        return true
    }

    // MARK: Internals

    /// Drives time to `target` (see ``advance(to:fileID:filePath:line:column:)``), waking at most
    /// `wakeLimit` sleepers. Returns how many it woke, or `nil` after a stall was reported.
    private func advance(
        to target: Duration, wakeLimit: Int, operation: String, _ location: SourceLocation
    ) async -> Int? {
        if core.isOnExecutor && prefersThisClock {
            report(
                operation,
                "called from a task that runs on this clock's executor (one started with task(_:)); it would wait for itself. Drive the clock from the test",
                location)
            return nil
        }
        switch await core.wait(until: target, wakeLimit: wakeLimit) {
        case .done(let woken):
            return woken
        case .stalled:
            report(operation, "woken work did not settle within \(stallTimeout) of real time", location)
            return nil
        }
    }

    /// Whether the current task was started with ``task(_:)`` (it prefers this clock's executor).
    ///
    /// Only such a task would wait for itself by driving the clock. Any other task may find itself
    /// running on the clock's thread without having asked to: when a task of the clock enters a default
    /// actor (an operation's `self.load()` in an actor), the runtime runs that actor inline and drains
    /// the jobs queued on it — the test's own task among them. It leaves the clock's job as soon as it
    /// suspends, so it may drive the clock.
    private var prefersThisClock: Bool {
        withUnsafeCurrentTask { $0?.unownedTaskExecutor == executor.asUnownedTaskExecutor() }
    }

    /// Waits for pending work to settle without moving time; `false` after a stall was reported.
    private func settle(operation: String, _ location: SourceLocation) async -> Bool {
        await advance(to: .zero, wakeLimit: 0, operation: operation, location) != nil
    }

    private func report(_ operation: String, _ reason: String, _ location: SourceLocation) {
        let (now, deadlines, jobs) = core.snapshot()
        onStall(
            Stall(
                operation: operation, reason: reason, now: Instant(offset: now),
                pendingSleepers: deadlines.map(Instant.init(offset:)), runningJobs: jobs, location: location))
    }
}

extension Clock where Self == VirtualClock {
    /// A new ``VirtualClock`` at 2001-01-01 00:00:00 UTC: `AsyncState(wrappedValue: [], clock: .virtual)`.
    public static var virtual: VirtualClock { VirtualClock() }
}
