/// A family's open batch of coalesced misses (``AsyncStateFamily/value(for:batchWindow:maxBatchSize:retry:_:)``):
/// DataLoader's batching, under the family's expiry and eviction.
///
/// A miss that starts its key's flight adds the key to the open batch, opening one if there is none;
/// the flight's operation asks the batch's ``BatchLoad`` for its key's value. The batch closes — its
/// operation runs once for all its keys — when it holds `maxBatchSize` keys, or when its window has
/// passed on the family's clock since it opened, whichever is first. A miss that joins a flight
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

    /// The batch keys are added to.
    private struct Open {
        let load: BatchLoad<Key, Value>
        let maxSize: Int
        var keys: [Key] = []
        var attempts: [OperationContext.Entry] = []
        /// Closes the batch at the end of its window; `nil` until it is scheduled.
        var timer: Task<Void, Never>?
    }

    private let open = LockedValue<Open?>(nil)
    private let clock: StoreClock

    init(clock: StoreClock) {
        self.clock = clock
    }

    /// A call for `key` on its pinned `store`: enters the store (as ``AsyncStateStore/enter(_:policy:_:)``
    /// does with `.value`) with an operation that asks the open batch, and adds the key to that batch
    /// if the call started its flight. `operation`, `window` and `maxSize` open a batch if there is
    /// none (a batch already open keeps its own).
    @usableFromInline
    func enter(
        _ key: Key, in store: Store, window: Duration, maxSize: Int, retry: RetryPolicy?,
        _ operation: @escaping BatchLoad<Key, Value>.Operation
    ) throws -> Store.Ticket {
        var opened: BatchLoad<Key, Value>?
        var full: Open?
        // The store is entered under this lock, so that the batch the flight asks is the batch the key
        // is added to (the batch cannot close in between). Lock order: this lock, then the store's.
        let ticket = try open.withLock { open -> Store.Ticket in
            // A batch opens only with a key: a call that joins a flight, is answered at once or
            // throws leaves no batch open (one left open without a key would have no timer).
            let load = open?.load ?? BatchLoad(operation: operation)
            let ticket = try store.enter(.value, policy: retry, { try await load.value(for: key) })
            guard let started = ticket.started else { return ticket }
            if open == nil {
                open = Open(load: load, maxSize: max(1, maxSize))
                opened = load
            }
            open!.keys.append(key)
            open!.attempts.append(store.mark(started))
            if open!.keys.count >= open!.maxSize {
                full = open
                open = nil
            }
            return ticket
        }
        if let full {
            full.timer?.cancel()
            start(full)
        }
        if let opened, full?.load !== opened { schedule(opened, after: window) }
        return ticket
    }

    /// Closes `load`'s batch once `window` has passed, unless it has closed by then.
    private func schedule(_ load: BatchLoad<Key, Value>, after window: Duration) {
        let deadline = clock.now().saturatingAdd(window.clampedToLimits)
        let timer = Task(executorPreference: clock.executor) { [self, clock] in
            do { try await clock.sleep(deadline) } catch { return }  // cancelled: it closed when full
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
    private func close(_ load: BatchLoad<Key, Value>) {
        let closing = open.withLock { open -> Open? in
            guard open?.load === load else { return nil }
            defer { open = nil }
            return open
        }
        if let closing { start(closing) }
    }

    /// Runs a closed batch's operation for its keys (none: a batch whose calls all joined flights
    /// already in flight, or failed to enter, runs nothing).
    private func start(_ batch: Open) {
        guard !batch.keys.isEmpty else { return }
        batch.load.start(batch.keys, attempts: batch.attempts, executor: clock.executor)
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
