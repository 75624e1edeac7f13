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
        _ id: UInt64, settlingWith outcome: WaiterOutcome, in slots: inout [UInt64: WaiterSlot]
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
        _ ids: Set<UInt64>, settlingWith outcome: WaiterOutcome, in slots: inout [UInt64: WaiterSlot]
    ) -> [(id: UInt64, continuation: UnsafeContinuation<WaiterOutcome, Never>)] {
        var continuations: [(id: UInt64, continuation: UnsafeContinuation<WaiterOutcome, Never>)] = []
        continuations.reserveCapacity(ids.count)
        for id in ids {
            if let continuation = take(id, settlingWith: outcome, in: &slots) {
                continuations.append((id, continuation))
            }
        }
        return continuations
    }
}

/// What a waiter is resumed with: one object for all the waiters of a settled flight (a
/// ``WaiterResult``), or ``cancelled`` for a waiter whose task was cancelled. A waiter's continuation
/// carries this reference rather than the value, so that neither the slots nor the settling loop
/// depend on the value's type.
@usableFromInline
class WaiterOutcome: @unchecked Sendable {
    // @unchecked: this base class has no state, and its one subclass holds only a `let` of a
    // `Sendable` type (`Result<Value, any Error>` with `Value: Sendable`); nothing is ever mutated.

    /// A waiter whose task was cancelled: it throws `CancellationError`. The only instance that is
    /// not a ``WaiterResult`` (the initializer is private to this file), which ``result(as:)`` relies on.
    @usableFromInline static let cancelled = WaiterOutcome()

    @inlinable init() {}

    /// The value, or the error to throw. `Value` is the waiting state's type, which a settled
    /// flight's ``WaiterResult`` always has.
    @inlinable
    func result<Value: Sendable>(as _: Value.Type) throws -> Value {
        if self === WaiterOutcome.cancelled { throw CancellationError() }
        return try unsafeDowncast(self, to: WaiterResult<Value>.self).result.get()
    }
}

/// The outcome of a settled flight, shared by all its waiters.
@usableFromInline
final class WaiterResult<Value: Sendable>: WaiterOutcome, @unchecked Sendable {
    // @unchecked: see ``WaiterOutcome``; `result` is a `let` of a `Sendable` type.
    @usableFromInline let result: Result<Value, any Error>

    @inlinable
    init(_ result: Result<Value, any Error>) {
        self.result = result
    }
}
