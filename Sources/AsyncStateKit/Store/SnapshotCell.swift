/// The published state of a store, behind a ``ReadMostlyLock`` (readers on different processors of
/// a contended state take different stripes of it): what synchronous readers
/// (`wrappedValue`, `phase`, `hasExpired(in:)`, the fresh-hit path of `value`) and the `updates`
/// subscribers see. Only the store writes it, once per transition.
@usableFromInline
final class SnapshotCell<Value: Sendable>: Sendable {
    /// The guarded contents.
    @usableFromInline
    struct Contents {
        /// The latest snapshot (its `isExpired` as of publication).
        @usableFromInline var snapshot: AsyncSnapshot<Value>
        /// When the current data arrived fresh, or `nil` (see ``StateData/freshSince``).
        @usableFromInline var freshSince: Duration?
        /// When the current value arrived (see ``StateData/receivedAt``): the age that
        /// ``SnapshotCell/hasExpired(in:at:)`` measures.
        @usableFromInline var receivedAt: Duration?
        /// Why the flight in flight started and whether the state had a value then; `nil` without a
        /// flight (see ``FetchStateMachine/flightStart``). What a paged state's `activity` reads.
        @usableFromInline var flightStart: (reason: AsyncStateEvent.Reason, hadValue: Bool)?
        /// The `updates` subscribers, by id.
        @usableFromInline var subscribers: [UInt64: AsyncStream<AsyncSnapshot<Value>>.Continuation] = [:]
        /// The next subscriber id.
        @usableFromInline var nextSubscriber: UInt64 = 0

        @inlinable
        init(snapshot: AsyncSnapshot<Value>, freshSince: Duration?) {
            (self.snapshot, self.freshSince, self.flightStart) = (snapshot, freshSince, nil)
        }

        /// A new cell's contents: `value`, in the initial phase, never fresh.
        @inlinable
        init(initialValue value: Value) {
            self.init(snapshot: AsyncSnapshot(value: value, phase: .initial, isExpired: true), freshSince: nil)
        }
    }

    /// How long data stays fresh (zero or less: never).
    @usableFromInline let expiry: Duration
    /// How long a hit is answered here, without the store (see ``StoreConfiguration/hitWindow``).
    @usableFromInline let hitWindow: Duration
    /// How many snapshots a subscriber that does not keep up may have queued; older ones are dropped.
    @inlinable static var subscriberBuffer: Int { 64 }

    @usableFromInline let contents: ReadMostlyLock<Contents>

    @inlinable init(value: Value, expiry: Duration, hitWindow: Duration) {
        self.expiry = expiry
        self.hitWindow = hitWindow
        contents = ReadMostlyLock(Contents(initialValue: value))
    }

    /// Makes the contents those of a new cell holding `value`, for a store a family keeps as a spare
    /// (``AsyncStateStore/park()``), which has no subscriber. Subscriber ids go on counting, so that
    /// an id handed out before is never handed out again. Returns the contents it replaced, for the
    /// caller to release once its own lock is released.
    @inlinable func renew(value: Value) -> Contents {
        contents.withLock { contents in
            var old = Contents(initialValue: value)
            swap(&old, &contents)
            contents.nextSubscriber = old.nextSubscriber
            return old
        }
    }

    deinit {
        // The store is gone: nothing will change again, so every stream ends. Finishing runs the
        // streams' termination handlers, which find `self` gone and do nothing; the lock is not held.
        let subscribers = contents.withLock { $0.subscribers }
        for continuation in subscribers.values { continuation.finish() }
    }

    @inlinable var value: Value { contents.read { $0.pointee.snapshot.value } }

    @inlinable var phase: AsyncPhase { contents.read { $0.pointee.snapshot.phase } }

    /// The value, if it came from a fetch or a write (``AsyncSnapshot/previousValue``).
    @inlinable var previousValue: Value? { contents.read { $0.pointee.snapshot.previousValue } }

    /// The current snapshot, expired or not at `now`.
    @inlinable
    func snapshot(at now: Duration) -> AsyncSnapshot<Value> {
        contents.read { $0.pointee.snapshot(at: now, expiry: expiry) }
    }

    /// `read` of the contents if the data is fresh at `now` and within the hit window, else `nil`,
    /// under the lock: the test of every hit path (see ``AsyncStateStore/hit(_:)``; a family's live
    /// entry is read through it too).
    @inlinable @inline(__always)
    func read<Result>(ifFreshAt now: Duration, _ read: (Contents) -> Result) -> Result? {
        contents.read { contents in
            isWithinExpiry(since: contents.pointee.freshSince, at: now, expiry: hitWindow)
                ? read(contents.pointee) : nil
        }
    }

    /// Whether the data is older than `interval` at `now`, or was never fresh, or was invalidated.
    /// Its age is its arrival's, whatever lifetime the value gave itself: `freshSince` is moved by
    /// that lifetime, `receivedAt` is not, and is the arrival while there is fresh data.
    @inlinable func hasExpired(in interval: Duration, at now: Duration) -> Bool {
        contents.read {
            $0.pointee.freshSince == nil || !isWithinExpiry(since: $0.pointee.receivedAt, at: now, expiry: interval)
        }
    }

    /// Publishes a transition: stores it and, if `notifying`, sends it to every subscriber (a change
    /// that leaves the snapshot as it was, such as invalidating data already expired, updates what
    /// readers test without a second copy of the same snapshot).
    ///
    /// Only the store publishes, one transition at a time (under its lock), so every subscriber gets
    /// the transitions in order. The lock that readers take is held only to store the snapshot and
    /// copy the subscriber list (a reference count); the snapshots are sent after it is released. A
    /// subscriber that arrives in between starts with the new snapshot and is not in the copy, so it
    /// gets it exactly once.
    ///
    /// The snapshot is moved in, not copied, and the one it replaces is returned, so that it is
    /// released after this lock and the store's: its value's deinit is user code, which may read
    /// the state (under this lock, that read would wait for it forever) or call it.
    @inlinable func publish(_ publication: consuming Publication<Value>, notifying: Bool = true)
        -> AsyncSnapshot<Value>
    {
        let subscribers = contents.withLock { contents -> [UInt64: AsyncStream<AsyncSnapshot<Value>>.Continuation] in
            swap(&contents.snapshot, &publication.snapshot)
            contents.freshSince = publication.freshSince
            contents.receivedAt = publication.receivedAt
            contents.flightStart = publication.flightStart
            return notifying ? contents.subscribers : [:]
        }
        guard !subscribers.isEmpty else { return publication.snapshot }
        // Read again rather than copied out under the lock: only the store publishes, one transition
        // at a time, so this is still the snapshot just published.
        let published = contents.read { $0.pointee.snapshot }
        // `yield` never blocks and runs none of our code: a waiting consumer is resumed by enqueueing it.
        for continuation in subscribers.values { continuation.yield(published) }
        return publication.snapshot
    }

    /// A new stream that starts with the current snapshot (expired or not at `now`). It leaves the
    /// subscriber list as soon as it ends (its consumer stopped or was cancelled).
    @inlinable func subscribe(at now: Duration) -> AsyncStream<AsyncSnapshot<Value>> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: AsyncSnapshot<Value>.self, bufferingPolicy: .bufferingNewest(Self.subscriberBuffer))
        let id = contents.withLock { contents in
            contents.nextSubscriber &+= 1
            return contents.nextSubscriber
        }
        // Runs outside this lock: when the consumer ends, on its own thread; on `finish()`, which the
        // deinit calls after releasing the lock (and then `self` is already gone).
        continuation.onTermination = { [weak self] _ in
            _ = self?.contents.withLock { $0.subscribers.removeValue(forKey: id) }
        }
        contents.withLock { contents in
            // Under the lock, so that no publication falls between the first snapshot and the
            // registration.
            continuation.yield(contents.snapshot(at: now, expiry: expiry))
            contents.subscribers[id] = continuation
        }
        return stream
    }

    /// The number of subscribers whose streams have not ended (for tests).
    @inlinable var subscriberCount: Int { contents.read { $0.pointee.subscribers.count } }
}

extension SnapshotCell.Contents: StripeReadable {
    /// Readers of a snapshot leave nothing for writers.
    @usableFromInline typealias StripeLocal = NoStripeLocal

    @inlinable static func absorb(_ local: inout NoStripeLocal, into value: UnsafeMutablePointer<Self>) {}

    /// The latest value (for ``SnapshotCell/read(ifFreshAt:_:)``).
    @inlinable var value: Value { snapshot.value }

    /// The latest snapshot, as fresh (for ``SnapshotCell/read(ifFreshAt:_:)``).
    @inlinable
    var freshSnapshot: AsyncSnapshot<Value> {
        var fresh = snapshot
        fresh.isExpired = false
        return fresh
    }

    /// The latest snapshot, its `isExpired` as of `now`.
    @inlinable
    func snapshot(at now: Duration, expiry: Duration) -> AsyncSnapshot<Value> {
        var current = snapshot
        current.isExpired = !isWithinExpiry(since: freshSince, at: now, expiry: expiry)
        return current
    }
}
