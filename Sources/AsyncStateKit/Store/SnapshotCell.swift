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
        contents.withLock { $0.snapshot(at: now, expiry: expiry) }
    }

    /// The value if the data is fresh at `now`, else `nil`: the hit path of `value` and `fetch`.
    @inlinable func freshValue(at now: Duration) -> Value? {
        contents.withLock { contents in
            isWithinExpiry(since: contents.freshSince, at: now, expiry: expiry) ? contents.snapshot.value : nil
        }
    }

    /// Whether the data is older than `interval` at `now`, or was never fresh, or was invalidated.
    func hasExpired(in interval: Duration, at now: Duration) -> Bool {
        contents.withLock { !isWithinExpiry(since: $0.freshSince, at: now, expiry: interval) }
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
            continuation.yield(contents.snapshot(at: now, expiry: expiry))
            contents.nextSubscriber &+= 1
            contents.subscribers[contents.nextSubscriber] = continuation
        }
        return stream
    }

    /// Runs `body` on the waiter slots, under the lock (for ``WaiterTable``).
    func withWaiterSlots<Result>(_ body: (inout [UInt64: WaiterSlot<Value>]) -> Result) -> Result {
        contents.withLock { body(&$0.waiterSlots) }
    }
}

extension SnapshotCell.Contents {
    /// The latest snapshot, its `isExpired` as of `now`.
    func snapshot(at now: Duration, expiry: Duration) -> AsyncSnapshot<Value> {
        var current = snapshot
        current.isExpired = !isWithinExpiry(since: freshSince, at: now, expiry: expiry)
        return current
    }
}

/// Whether data that arrived fresh at `freshSince` is still fresh at `now`: less than `expiry` old.
/// `nil` (never fetched, failed, invalidated) is never fresh; an `expiry` of zero or less, never
/// either. The one freshness test of the package: the machine, the hit path and `hasExpired(in:)`.
@inlinable
func isWithinExpiry(since freshSince: Duration?, at now: Duration, expiry: Duration) -> Bool {
    guard let freshSince else { return false }
    return now - freshSince < expiry
}
