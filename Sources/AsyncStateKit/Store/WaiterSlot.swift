/// Where one waiting caller stands, in the store's table of waiters (``AsyncStateStore/Core``,
/// behind the store's lock).
///
/// A continuation created in nonisolated code resumes on the waiting task's own executor, and a
/// cancelled caller leaves at once: its cancellation handler takes its continuation out of the table
/// under the same lock that tells the machine, and resumes it right after.
///
/// Each waiter goes `pending` (the store handed out its id) → `waiting` (its continuation is
/// registered) → gone (resumed). A continuation leaves the table, under the lock, before it is
/// resumed, and only a `waiting` slot holds one: so each is resumed exactly once, which is why an
/// `UnsafeContinuation` (no allocation, no canary) is sound here. A result or a cancellation that
/// arrives while it is still `pending` is kept as `resolved` and delivered on registration, so
/// nothing is lost to the order of events.
///
/// The slots do not depend on the state's value type, so a settling flight's loop over its waiters
/// runs specialized in the library, whatever the caller's type.
@usableFromInline
enum WaiterSlot: Sendable {
    /// Its id was handed out; its continuation is not registered yet.
    case pending
    /// It is suspended on this continuation.
    case waiting(UnsafeContinuation<WaiterOutcome, Never>)
    /// Its outcome arrived before it registered.
    case resolved(WaiterOutcome)

    /// Under the lock: takes waiter `id`'s continuation out of `slots` to be resumed, or keeps
    /// `outcome` for a waiter that has not registered yet; `nil` when it is gone or already resolved.
    @inlinable
    static func take(
        _ id: UInt64, settlingWith outcome: WaiterOutcome, in slots: inout WaiterSlots
    ) -> UnsafeContinuation<WaiterOutcome, Never>? {
        switch slots[id] {
        case .pending:
            slots[id] = .resolved(outcome)
            return nil
        case .waiting(let continuation):
            slots[id] = nil
            return continuation
        case .resolved, nil:
            return nil
        }
    }

    /// Under the lock: ``take(_:settlingWith:in:)`` for each of `ids`; the continuations to resume
    /// (after the lock), with their ids.
    @inlinable
    static func take(
        _ ids: WaiterIDs, settlingWith outcome: WaiterOutcome, in slots: inout WaiterSlots
    ) -> ResumedWaiters {
        var resumed = ResumedWaiters()
        for id in ids {
            if let continuation = take(id, settlingWith: outcome, in: &slots) {
                resumed.append((id, continuation))
            }
        }
        return resumed
    }
}

/// The continuations a settled flight resumes once the lock is released, with their waiters' ids.
@usableFromInline
struct ResumedWaiters {
    @usableFromInline typealias Waiter = (id: UInt64, continuation: UnsafeContinuation<WaiterOutcome, Never>)

    @usableFromInline var waiters = InlineOneArray<Waiter>()

    @inlinable init() {}

    @inlinable mutating func append(_ waiter: Waiter) { waiters.append(waiter) }

    /// Resumes every waiter with `outcome`, in arrival order (ids grow): sorted here, after the lock.
    @inlinable func resume(with outcome: WaiterOutcome) {
        guard let first = waiters.first else { return }
        guard !waiters.more.isEmpty else { return first.continuation.resume(returning: outcome) }
        for waiter in waiters.sorted(by: { $0.id < $1.id }) {
            waiter.continuation.resume(returning: outcome)
        }
    }
}

/// A store's table of waiters, by id: one slot inline, so that a flight with one caller allocates
/// no dictionary for it.
@usableFromInline
typealias WaiterSlots = InlineOneTable<WaiterSlot>

extension InlineOneTable where Entry == WaiterSlot {
    /// Waiter `id`'s outcome, taken out of the table, if it arrived before the waiter registered
    /// (its slot is `resolved`); else `nil`, and the table is unchanged.
    @inlinable mutating func takeOutcome(of id: UInt64) -> WaiterOutcome? {
        guard case .resolved(let outcome) = self[id] else { return nil }
        self[id] = nil
        return outcome
    }
}
