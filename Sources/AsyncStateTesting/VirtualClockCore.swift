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
        /// Callers of `settle` waiting for `jobs` to reach zero.
        var idleWaiters: [UInt64: CheckedContinuation<Bool, Never>] = [:]
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
        let waiters = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            state.jobThread = nil
            state.jobs -= 1
            guard state.jobs == 0, !state.idleWaiters.isEmpty else { return [] }
            defer { state.idleWaiters = [:] }
            return Array(state.idleWaiters.values)
        }
        for waiter in waiters { waiter.resume(returning: true) }
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

    /// Removes the soonest live sleeper due at or before `target`, moving `now` to its deadline; when
    /// there is none, moves `now` to `target` and returns `nil`. `now` never moves backwards.
    func takeNextDue(upTo target: Duration) -> CheckedContinuation<Void, any Error>? {
        state.withLock { state in
            while let top = state.heap.min {
                guard state.sleepers[top.id] != nil else {
                    state.heap.popMin()
                    continue
                }
                guard top.deadline <= target else { break }
                state.heap.popMin()
                state.now = max(state.now, top.deadline)
                return state.sleepers.removeValue(forKey: top.id)
            }
            state.now = max(state.now, target)
            return nil
        }
    }

    /// The deadline of the soonest live sleeper.
    var nextDeadline: Duration? {
        state.withLock { state in
            while let top = state.heap.min, state.sleepers[top.id] == nil { state.heap.popMin() }
            return state.heap.min?.deadline
        }
    }

    // MARK: Waiting, with a watchdog

    /// Waits until no job of the executor is queued or running. Returns `false` when that did not
    /// happen within ``stallTimeout`` of real time.
    func settle() async -> Bool {
        if state.withLock({ $0.jobs == 0 }) { return true }
        return await withCheckedContinuation { continuation in
            let id = state.withLock { state -> UInt64? in
                guard state.jobs > 0 else { return nil }
                let id = state.makeID()
                state.idleWaiters[id] = continuation
                return id
            }
            guard let id else { return continuation.resume(returning: true) }
            scheduleWatchdog { state in state.idleWaiters.removeValue(forKey: id) }
        }
    }

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

    /// After ``stallTimeout`` of real time, takes the waiter out with `take` (if it is still there) and
    /// resumes it with `false`.
    private func scheduleWatchdog(take: @escaping @Sendable (inout State) -> CheckedContinuation<Bool, Never>?) {
        let (seconds, attoseconds) = stallTimeout.components
        let nanoseconds = max(0, seconds) * 1_000_000_000 + max(0, attoseconds) / 1_000_000_000
        DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(Int(clamping: nanoseconds))) { [self] in
            state.withLock(take)?.resume(returning: false)
        }
    }

    /// What a stall report says about the clock right now.
    func snapshot() -> (now: Duration, deadlines: [Duration], jobs: Int) {
        state.withLock { ($0.now, $0.pendingDeadlines, $0.jobs) }
    }
}
