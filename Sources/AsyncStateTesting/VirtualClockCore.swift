import AsyncStateKit
import Dispatch

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The shared, lock-protected heart of a ``VirtualClock``: virtual time, the sleepers, and the count of
/// jobs its executor has not finished. Every method takes the lock once and resumes continuations only
/// after releasing it.
final class VirtualClockCore: Sendable {
    /// One call that waits for virtual time to be driven to `target`.
    struct Wait {
        /// Identifies the wait (for its watchdog).
        var id: UInt64
        /// Where `now` should be when it is done.
        var target: Duration
        /// How many sleepers it may wake; when reached, it ends without moving `now` further.
        var wakeLimit: Int
        /// How many it has woken.
        var woken = 0
        /// When it last made progress (a wake, or its start), in `DispatchTime` nanoseconds.
        var lastProgress: UInt64
        /// Resumed when it is done, or stalled.
        var continuation: CheckedContinuation<WaitOutcome, Never>
    }

    /// How a wait ended.
    enum WaitOutcome {
        /// Done, after waking this many sleepers.
        case done(woken: Int)
        /// No progress within the stall timeout.
        case stalled
    }

    /// Everything the lock guards.
    struct State {
        /// Virtual time, as an offset from the clock's start.
        var now: Duration = .zero
        /// Keys of registered sleepers, live and cancelled, ordered by (deadline, registration).
        var heap = SleeperHeap()
        /// Live sleepers: registered, neither woken nor cancelled.
        var sleepers: [UInt64: CheckedContinuation<Void, any Error>] = [:]
        /// Sleeps that have an id but have not registered their continuation yet; the flag records a
        /// cancellation that arrived first, so that the registration throws at once.
        var unregistered: [UInt64: Bool] = [:]
        /// The next id for a sleeper or a waiter.
        var nextID: UInt64 = 0
        /// Jobs enqueued on the executor and not yet finished.
        var jobs = 0
        /// The thread running a job on the executor's queue, if any.
        var jobThread: pthread_t?
        /// Calls of `advance`, `settle` and `runUntilIdle` in arrival order; the first is being driven.
        var waits: [Wait] = []
        /// Callers of `waitForSleepers` waiting for `sleepers.count` to reach their count.
        var sleeperWaiters: [UInt64: (count: Int, continuation: CheckedContinuation<Bool, Never>)] = [:]

        mutating func makeID() -> UInt64 {
            nextID &+= 1
            return nextID
        }

        /// The live sleepers' deadlines, soonest first.
        var pendingDeadlines: [Duration] {
            heap.keys.filter { sleepers[$0.id] != nil }.sorted().map(\.deadline)
        }

        /// Drops cancelled keys once they outnumber live ones, so cancelled sleeps cost O(1) memory
        /// each for only a while.
        mutating func compactIfNeeded() {
            if heap.count > 64 && heap.count > 2 * sleepers.count {
                heap.removeAll { sleepers[$0.id] == nil }
            }
        }

        /// Removes the soonest live sleeper due at or before `target` and moves `now` to its deadline
        /// (never backwards); `nil` when none is due.
        mutating func popDue(upTo target: Duration) -> CheckedContinuation<Void, any Error>? {
            guard let top = liveTop(), top.deadline <= target else { return nil }
            heap.popMin()
            now = max(now, top.deadline)
            return sleepers.removeValue(forKey: top.id)
        }

        /// The soonest live sleeper's key, after dropping the cancelled ones above it.
        mutating func liveTop() -> SleeperHeap.Key? {
            while let top = heap.min, sleepers[top.id] == nil { heap.popMin() }
            return heap.min
        }

        /// Takes the waiters of `waitForSleepers` whose count is now reached.
        mutating func takeSatisfiedSleeperWaiters() -> [CheckedContinuation<Bool, Never>] {
            guard !sleeperWaiters.isEmpty else { return [] }
            let live = sleepers.count
            let ready = sleeperWaiters.filter { $0.value.count <= live }
            for id in ready.keys { sleeperWaiters[id] = nil }
            return ready.values.map(\.continuation)
        }
    }

    let state = LockedValue(State())
    /// The serial queue on which the executor runs jobs.
    let queue = DispatchQueue(label: "AsyncStateTesting.VirtualClock")
    /// How long a wait for settling may take in real time before it counts as a stall.
    let stallTimeout: Duration

    init(stallTimeout: Duration) {
        self.stallTimeout = stallTimeout
    }

    // MARK: Executor bookkeeping

    /// Counts a job, then runs it on the serial queue and counts it finished. Both executors of the
    /// clock schedule through here.
    func schedule(_ run: @escaping @Sendable () -> Void) {
        state.withLock { $0.jobs += 1 }
        queue.async { [self] in
            let thread = pthread_self()
            state.withLock { $0.jobThread = thread }
            run()
            jobFinished()
        }
    }

    private func jobFinished() {
        let idle = state.withLock { state in
            state.jobThread = nil
            state.jobs -= 1
            return state.jobs == 0
        }
        if idle { drive() }
    }

    // MARK: Driving time

    /// Makes progress on the first wait while no job is queued or running: wakes the next due
    /// sleeper, or finishes the wait. Called whenever the job count may have reached zero — usually
    /// on the executor's own thread right after a job, so a whole advance runs without handing
    /// control back and forth between threads.
    ///
    /// A woken sleeper is counted busy (a token in `jobs`) before it is resumed, and the token is
    /// released only after `resume()` has returned — by which time the woken task's next job, if it
    /// runs on this clock's executor, is counted too. So no other driver can see "idle" in between,
    /// and sleepers are woken strictly one at a time, each after the previous one's work settled.
    private func drive() {
        enum Step {
            case idle
            case wake(CheckedContinuation<Void, any Error>)
            case finish(CheckedContinuation<WaitOutcome, Never>, WaitOutcome)
        }
        while true {
            let step = state.withLock { state -> Step in
                guard state.jobs == 0, var wait = state.waits.first else { return .idle }
                if wait.woken < wait.wakeLimit {
                    if let sleeper = state.popDue(upTo: wait.target) {
                        wait.woken += 1
                        wait.lastProgress = DispatchTime.now().uptimeNanoseconds
                        state.waits[0] = wait
                        state.jobs += 1  // the wake token
                        return .wake(sleeper)
                    }
                    state.now = max(state.now, wait.target)
                }
                state.waits.removeFirst()
                return .finish(wait.continuation, .done(woken: wait.woken))
            }
            switch step {
            case .idle:
                return
            case .wake(let sleeper):
                sleeper.resume()
                let idle = state.withLock { state in
                    state.jobs -= 1  // release the token
                    return state.jobs == 0
                }
                if !idle { return }  // the woken work is queued: the executor drives on when it settles
            case .finish(let continuation, let outcome):
                continuation.resume(returning: outcome)
            }
        }
    }

    /// Waits until virtual time has been driven to `target`: due sleepers woken one at a time (at
    /// most `wakeLimit`), each after the work before it settled, and the work of the last one settled.
    func wait(until target: Duration, wakeLimit: Int) async -> WaitOutcome {
        let outcome = await withCheckedContinuation { continuation in
            let id = state.withLock { state in
                let id = state.makeID()
                state.waits.append(
                    Wait(
                        id: id, target: target, wakeLimit: max(0, wakeLimit),
                        lastProgress: DispatchTime.now().uptimeNanoseconds, continuation: continuation))
                return id
            }
            scheduleWaitWatchdog(id, after: stallTimeout)
            drive()
        }
        return outcome
    }

    /// Checks wait `id` after `delay`: if it made no progress for ``stallTimeout`` it is removed and
    /// resumed as stalled; if it did, the check is scheduled again for when it could next stall.
    private func scheduleWaitWatchdog(_ id: UInt64, after delay: Duration) {
        DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(Int(clamping: delay.wholeNanoseconds))) {
            [self] in
            enum Check {
                case gone
                case recheck(Duration)
                case stalled(CheckedContinuation<WaitOutcome, Never>, Bool)
            }
            let check = state.withLock { state -> Check in
                guard let index = state.waits.firstIndex(where: { $0.id == id }) else { return .gone }
                let idle = DispatchTime.now().uptimeNanoseconds - state.waits[index].lastProgress
                let timeout = UInt64(clamping: stallTimeout.wholeNanoseconds)
                if idle < timeout { return .recheck(.nanoseconds(Int64(clamping: timeout - idle))) }
                let wait = state.waits.remove(at: index)
                return .stalled(wait.continuation, index == 0)
            }
            switch check {
            case .gone: return
            case .recheck(let delay): scheduleWaitWatchdog(id, after: delay)
            case .stalled(let continuation, let wasFirst):
                continuation.resume(returning: .stalled)
                if wasFirst { drive() }
            }
        }
    }

    /// Whether the calling thread is running a job of this clock's executor.
    var isOnExecutor: Bool {
        let thread = pthread_self()
        return state.withLock { state in state.jobThread.map { pthread_equal($0, thread) != 0 } ?? false }
    }

    // MARK: Sleeping

    /// Gives a sleep its id, or returns `nil` when `deadline` is already due.
    func reserveSleep(until deadline: Duration) -> UInt64? {
        state.withLock { state in
            guard deadline > state.now else { return nil }
            let id = state.makeID()
            state.unregistered[id] = false
            return id
        }
    }

    /// Registers the continuation of the sleep `id`, or resumes it at once when it was cancelled
    /// first or its deadline has passed meanwhile.
    func register(_ id: UInt64, deadline: Duration, _ continuation: CheckedContinuation<Void, any Error>) {
        enum Outcome {
            case cancelled, due
            case registered([CheckedContinuation<Bool, Never>])
        }
        let outcome = state.withLock { state -> Outcome in
            let cancelled = state.unregistered.removeValue(forKey: id) ?? false
            if cancelled { return .cancelled }
            if deadline <= state.now { return .due }
            state.heap.push(.init(deadline: deadline, id: id))
            state.sleepers[id] = continuation
            return .registered(state.takeSatisfiedSleeperWaiters())
        }
        switch outcome {
        case .cancelled: continuation.resume(throwing: CancellationError())
        case .due: continuation.resume()
        case .registered(let waiters): for waiter in waiters { waiter.resume(returning: true) }
        }
    }

    /// Cancels the sleep `id`: throws `CancellationError` from it now if it is registered, or as soon
    /// as it registers; a no-op once it has been woken.
    func cancelSleep(_ id: UInt64) {
        let continuation = state.withLock { state -> CheckedContinuation<Void, any Error>? in
            if let continuation = state.sleepers.removeValue(forKey: id) {
                state.compactIfNeeded()
                return continuation
            }
            if state.unregistered[id] != nil { state.unregistered[id] = true }
            return nil
        }
        continuation?.resume(throwing: CancellationError())
    }

    /// The deadline of the soonest live sleeper.
    var nextDeadline: Duration? {
        state.withLock { $0.liveTop()?.deadline }
    }

    // MARK: Waiting for sleepers, with a watchdog

    /// Waits until at least `count` sleepers are registered. Returns `false` on a stall.
    func waitForSleepers(_ count: Int) async -> Bool {
        if state.withLock({ $0.sleepers.count >= count }) { return true }
        return await withCheckedContinuation { continuation in
            let id = state.withLock { state -> UInt64? in
                guard state.sleepers.count < count else { return nil }
                let id = state.makeID()
                state.sleeperWaiters[id] = (count, continuation)
                return id
            }
            guard let id else { return continuation.resume(returning: true) }
            scheduleWatchdog { state in state.sleeperWaiters.removeValue(forKey: id)?.continuation }
        }
    }

    /// After ``stallTimeout`` of real time, takes the `waitForSleepers` waiter out with `take` (if it is
    /// still there) and resumes it with `false`.
    private func scheduleWatchdog(take: @escaping @Sendable (inout State) -> CheckedContinuation<Bool, Never>?) {
        let delay = DispatchTimeInterval.nanoseconds(Int(clamping: stallTimeout.wholeNanoseconds))
        DispatchQueue.global().asyncAfter(deadline: .now() + delay) { [self] in
            state.withLock(take)?.resume(returning: false)
        }
    }

    /// What a stall report says about the clock right now.
    func snapshot() -> (now: Duration, deadlines: [Duration], jobs: Int) {
        state.withLock { ($0.now, $0.pendingDeadlines, $0.jobs) }
    }
}
