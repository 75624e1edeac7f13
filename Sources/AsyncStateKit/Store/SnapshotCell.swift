/// The published state of a store, behind the package's lock: what synchronous readers
/// (`wrappedValue`, `phase`, `hasExpired(in:)`, the fresh-hit path of `value`) and the `updates`
/// subscribers see. Only the store writes it, once per transition.
@usableFromInline
final class SnapshotCell<Value: Sendable>: Sendable {
    /// The guarded contents.
    @usableFromInline
    struct Contents {
        /// The latest snapshot (its `isExpired` as of publication).
        @usableFromInline var snapshot: AsyncSnapshot<Value>
        /// When the current data arrived fresh, or `nil` (see `FetchStateMachine.freshSince`).
        @usableFromInline var freshSince: Duration?
        /// The `updates` subscribers, by id.
        var subscribers: [UInt64: AsyncStream<AsyncSnapshot<Value>>.Continuation] = [:]
        /// The next subscriber id.
        var nextSubscriber: UInt64 = 0
        /// The callers waiting for a flight (managed by ``WaiterTable``).
        var waiterSlots: [UInt64: WaiterSlot<Value>] = [:]
    }

    /// How long data stays fresh (zero or less: never).
    @usableFromInline let expiry: Duration
    /// How many snapshots a subscriber that does not keep up may have queued; older ones are dropped.
    static var subscriberBuffer: Int { 64 }

    @usableFromInline let contents: LockedValue<Contents>

    init(value: Value, expiry: Duration) {
        self.expiry = expiry
        contents = LockedValue(
            Contents(snapshot: AsyncSnapshot(value: value, phase: .initial, isExpired: true), freshSince: nil))
    }

    deinit {
        // The store is gone: nothing will change again, so every stream ends. Finishing runs no code
        // of ours (no onTermination handlers are installed).
        let subscribers = contents.withLock { $0.subscribers }
        for continuation in subscribers.values { continuation.finish() }
    }

    @inlinable var value: Value { contents.withLock { $0.snapshot.value } }

    @inlinable var phase: AsyncPhase { contents.withLock { $0.snapshot.phase } }

    /// The current snapshot, expired or not at `now`.
    func snapshot(at now: Duration) -> AsyncSnapshot<Value> {
        contents.withLock { contents in
            var snapshot = contents.snapshot
            snapshot.isExpired = !isFresh(contents.freshSince, at: now)
            return snapshot
        }
    }

    /// The value if the data is fresh at `now`, else `nil`: the hit path of `value` and `fetch`.
    @inlinable func freshValue(at now: Duration) -> Value? {
        contents.withLock { contents in
            isFresh(contents.freshSince, at: now) ? contents.snapshot.value : nil
        }
    }

    @inlinable func isFresh(_ freshSince: Duration?, at now: Duration) -> Bool {
        guard let freshSince else { return false }
        return now - freshSince < expiry
    }

    /// Whether the data is older than `interval` at `now`, or was never fresh, or was invalidated.
    func hasExpired(in interval: Duration, at now: Duration) -> Bool {
        contents.withLock { contents in
            guard let since = contents.freshSince else { return true }
            return now - since >= interval
        }
    }

    /// Publishes a transition: stores it and sends it to every subscriber.
    func publish(_ snapshot: AsyncSnapshot<Value>, freshSince: Duration?) {
        contents.withLock { contents in
            contents.snapshot = snapshot
            contents.freshSince = freshSince
            // Yielding under the lock keeps every subscriber's order equal to the publication order,
            // also against a subscription made concurrently. `yield` never blocks and runs none of our
            // code (a consumer is resumed by enqueueing it); subscribers that ended are dropped here
            // rather than from an `onTermination` handler, which would take this lock from inside the
            // stream's own machinery.
            for (id, continuation) in contents.subscribers {
                if case .terminated = continuation.yield(snapshot) { contents.subscribers[id] = nil }
            }
        }
    }

    /// A new stream that starts with the current snapshot (expired or not at `now`).
    func subscribe(at now: Duration) -> AsyncStream<AsyncSnapshot<Value>> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: AsyncSnapshot<Value>.self, bufferingPolicy: .bufferingNewest(Self.subscriberBuffer))
        contents.withLock { contents in
            var current = contents.snapshot
            current.isExpired = !isFresh(contents.freshSince, at: now)
            continuation.yield(current)
            contents.nextSubscriber &+= 1
            contents.subscribers[contents.nextSubscriber] = continuation
        }
        return stream
    }

    /// Runs `body` on the waiter slots, under the lock (for ``WaiterTable``).
    func withWaiterSlots<Result>(_ body: (inout [UInt64: WaiterSlot<Value>]) -> Result) -> Result {
        contents.withLock { body(&$0.waiterSlots) }
    }

    /// The number of live subscribers (ended ones are counted until the next publication).
    var subscriberCount: Int { contents.withLock { $0.subscribers.count } }
}
