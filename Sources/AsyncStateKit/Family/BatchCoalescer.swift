/// A family's open batch of coalesced misses (``AsyncStateFamily/value(for:batchWindow:maxBatchSize:retry:_:)``):
/// DataLoader's batching, under the family's expiry and eviction.
///
/// A miss that starts its key's flight adds the key to the open batch, opening one if there is none;
/// the flight's operation asks the batch's ``BatchLoad`` for its key's value (finding the batch
/// through the call's ``Seat``). The batch closes — its operation runs once for all its keys — when
/// it holds `maxBatchSize` keys, or when its window has passed on the family's clock since it opened,
/// whichever is first. A miss that joins a flight
/// already in flight adds nothing: each key is loaded once. So `N` concurrent misses of distinct keys
/// within a window make `⌈N / maxBatchSize⌉` operation calls.
///
/// Everything else is a ``BatchLoad``'s: a key missing from the operation's answer fails with
/// ``AsyncStateError/missingFromBatch``, a retry of one key runs the operation for that key alone,
/// and the batch is cancelled once every one of its keys' flights has been (an operation already
/// running sees the cancellation; one not yet started still starts, and answers nobody).
@usableFromInline
final class BatchCoalescer<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    @usableFromInline typealias Store = AsyncStateStore<Value?>
    @usableFromInline typealias Load = BatchLoad<Key, Value>

    /// The batch keys are added to.
    private struct Open {
        let load: Load
        let maxSize: Int
        var keys: [Key] = []
        var attempts: [UInt64] = []
        /// The keys' fetches, for the observer (empty without one).
        var fetches: [AsyncStateFetch] = []
        /// Closes the batch at the end of its window; `nil` until it is scheduled.
        var timer: Task<Void, Never>?
    }

    /// Where a flight's operation finds the batch its key was added to. The store is entered without
    /// this coalescer's lock (entering may call the observer, which must run with no lock held), so
    /// the key is added to a batch just after; an operation that runs before then waits for it.
    final class Seat: Sendable {
        struct State {
            var load: Load?
            var waiting: UnsafeContinuation<Load, Never>?
        }
        let state = LockedValue(State())
    }

    private let open = LockedValue<Open?>(nil)
    private let clock: StoreClock
    /// The family's observer, with its name (`nil` without one).
    private let observer: Observation?

    @usableFromInline
    init(clock: StoreClock, observer: Observation?) {
        self.clock = clock
        self.observer = observer
    }

    /// A call for `key` on its pinned `store`: enters the store (as ``AsyncStateStore/enter(_:policy:_:)``
    /// does with `.value`) with an operation that asks the batch its key joins, and adds the key to
    /// the open batch if the call started its flight. `operation`, `window` and `maxSize` open a batch
    /// if there is none (a batch already open keeps its own).
    @usableFromInline
    func enter(
        _ key: Key, in store: Store, window: Duration, maxSize: Int, retry: RetryPolicy?,
        _ operation: @escaping Load.Operation
    ) throws -> Store.Ticket {
        let seat = Seat()
        let ticket = try store.enter(.value, policy: retry, .plain { try await Self.value(for: key, at: seat) })
        // A call that joins a flight, is answered at once or throws adds no key, and opens no batch.
        guard let started = ticket.started else { return ticket }
        let fetch = store.observedFetch
        var opened: Load?
        let (load, full) = open.withLock { open -> (Load, Open?) in
            if open == nil {
                open = Open(load: Load(operation: operation, observer: observer), maxSize: max(1, maxSize))
                opened = open!.load
            }
            open!.keys.append(key)
            open!.attempts.append(started)
            if let fetch { open!.fetches.append(fetch) }
            let load = open!.load
            guard open!.keys.count >= open!.maxSize else { return (load, nil) }
            defer { open = nil }
            return (load, open)
        }
        let waiting = seat.state.withLock { state in
            state.load = load
            defer { state.waiting = nil }
            return state.waiting
        }
        waiting?.resume(returning: load)
        if let full {
            full.timer?.cancel()
            start(full)
        }
        if let opened, full?.load !== opened { schedule(opened, after: window) }
        return ticket
    }

    /// A flight's operation: `key`'s value from the batch its key joined (see ``Seat``).
    static func value(for key: Key, at seat: Seat) async throws -> Value {
        if let load = seat.state.withLock({ $0.load }) { return try await load.value(for: key) }
        let load = await withUnsafeContinuation { continuation in
            let load = seat.state.withLock { state -> Load? in
                if state.load == nil { state.waiting = continuation }
                return state.load
            }
            if let load { continuation.resume(returning: load) }
        }
        return try await load.value(for: key)
    }

    /// Closes `load`'s batch once `window` has passed, unless it has closed by then.
    private func schedule(_ load: Load, after window: Duration) {
        let deadline = clock.now().saturatingAdd(window.clampedToLimits)
        let timer = Task(executorPreference: clock.executor) { [self, clock] in
            do {
                try await clock.sleep(deadline)
            } catch {
                // Cancelled: the batch closed when full. A sleep that throws otherwise cannot wait
                // for the deadline, so the batch closes now (as a store's timers end their waits).
                if Task.isCancelled { return }
            }
            close(load)
        }
        let closed = open.withLock { open -> Bool in
            guard open?.load === load else { return true }
            open!.timer = timer
            return false
        }
        if closed { timer.cancel() }
    }

    /// Closes `load`'s batch if it is still the open one.
    private func close(_ load: Load) {
        let closing = open.withLock { open -> Open? in
            guard open?.load === load else { return nil }
            defer { open = nil }
            return open
        }
        if let closing { start(closing) }
    }

    /// Runs a closed batch's operation for its keys (a batch opens with its first key, so it has one).
    private func start(_ batch: Open) {
        batch.load.start(batch.keys, attempts: batch.attempts, fetches: batch.fetches, executor: clock.executor)
    }
}

extension AsyncStateStore.Ticket {
    /// The attempt of the flight the call started, if it started one.
    @usableFromInline
    var started: AsyncStateStore.Machine.AttemptID? {
        switch self {
        case .value(_, let started), .wait(_, let started): return started
        }
    }
}
