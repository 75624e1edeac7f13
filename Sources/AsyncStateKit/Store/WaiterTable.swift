/// The continuations of callers waiting for a flight, behind the ``SnapshotCell``'s lock.
///
/// A continuation created here, in nonisolated code, resumes on the waiting task's own executor, and
/// a cancelled caller leaves at once: its cancellation handler resumes it here and then tells the
/// store.
///
/// Each waiter goes `pending` (the store handed out its id) → `waiting` (its continuation is
/// registered) → gone (resumed). A continuation leaves the table, under the lock, before it is
/// resumed, and only a `waiting` slot holds one: so each is resumed exactly once, which is why an
/// `UnsafeContinuation` (no allocation, no canary) is sound here. A result or a cancellation that arrives while it is still `pending`
/// is kept as `resolved` and delivered on registration, so nothing is lost to the order of events.
///
/// The slots live under the ``SnapshotCell``'s lock (one lock and allocation per state instead of
/// two); this type is the view that manages them.
@usableFromInline
struct WaiterTable<Value: Sendable>: Sendable {
    @usableFromInline typealias ID = UInt64
    @usableFromInline typealias Slot = WaiterSlot<Value>

    /// Where the slots are kept.
    @usableFromInline let cell: SnapshotCell<Value>

    @inlinable
    init(cell: SnapshotCell<Value>) {
        self.cell = cell
    }

    /// Announces waiter `id`; called by the store, under its lock, when it hands the id out.
    @inlinable
    func add(_ id: ID) {
        cell.withWaiterSlots { $0[id] = .pending }
    }

    /// Suspends until waiter `id` is resumed. If the task is cancelled, it stops waiting at once with
    /// `CancellationError` and `onCancel` tells the store (which may cancel the flight).
    /// Always inlined, for the store's ``AsyncStateStore/wait(_:)`` (one frame instead of two).
    @inlinable @inline(__always)
    func wait(_ id: ID, onCancel: @Sendable () -> Void) async throws -> Value {
        try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { continuation in
                let early = cell.withWaiterSlots { slots -> Result<Value, any Error>? in
                    if case .resolved(let result) = slots[id] {
                        slots[id] = nil
                        return result
                    }
                    slots[id] = .waiting(continuation)
                    return nil
                }
                if let early { continuation.resume(with: early) }
            }
        } onCancel: {
            resume(id, with: .failure(CancellationError()))
            onCancel()
        }
    }

    /// Resumes waiter `id` with `result` (outside the lock), or keeps the result for it if it has not
    /// registered yet. A waiter that was already resumed is left alone: its first outcome stands.
    @inlinable
    func resume(_ id: ID, with result: Result<Value, any Error>) {
        cell.withWaiterSlots { Self.take(id, settlingWith: result, in: &$0) }?.resume(with: result)
    }

    /// Resumes waiters `ids`, in their order, with `result` (as ``resume(_:with:)`` does each), taking
    /// the lock once for all of them: a flight that settles resumes every waiter this way.
    @inlinable
    func resume(_ ids: [ID], with result: Result<Value, any Error>) {
        var continuations: [UnsafeContinuation<Value, any Error>] = []
        continuations.reserveCapacity(ids.count)
        cell.withWaiterSlots { slots in
            for id in ids {
                if let continuation = Self.take(id, settlingWith: result, in: &slots) {
                    continuations.append(continuation)
                }
            }
        }
        for continuation in continuations { continuation.resume(with: result) }
    }

    /// Under the lock: takes waiter `id`'s continuation out of `slots` to be resumed, or keeps
    /// `result` for a waiter that has not registered yet; `nil` when it is gone or already resolved.
    @inlinable
    static func take(
        _ id: ID, settlingWith result: Result<Value, any Error>, in slots: inout [UInt64: Slot]
    ) -> UnsafeContinuation<Value, any Error>? {
        switch slots[id] {
        case .pending:
            slots[id] = .resolved(result)
            return nil
        case .waiting(let continuation):
            slots[id] = nil
            return continuation
        case .resolved, nil:
            return nil
        }
    }

    /// The number of waiters not yet resumed-and-gone (for tests).
    var count: Int { cell.withWaiterSlots { $0.count } }
}

/// Where one waiting caller stands (see ``WaiterTable``).
@usableFromInline
enum WaiterSlot<Value: Sendable> {
    /// Its id was handed out; its continuation is not registered yet.
    case pending
    /// It is suspended on this continuation.
    case waiting(UnsafeContinuation<Value, any Error>)
    /// Its outcome arrived before it registered.
    case resolved(Result<Value, any Error>)
}
