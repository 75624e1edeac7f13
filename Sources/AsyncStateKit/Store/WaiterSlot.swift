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

/// An array that holds its first element inline, so that the usual case — one element — allocates
/// nothing: a settled flight's one waiter (``ResumedWaiters``), a write's one eviction.
@usableFromInline
struct InlineOneArray<Element>: Sequence {
    @usableFromInline var first: Element?
    @usableFromInline var more: [Element] = []

    @inlinable init() {}

    @inlinable var isEmpty: Bool { first == nil }

    @inlinable mutating func append(_ element: Element) {
        if first == nil { first = element } else { more.append(element) }
    }

    @inlinable func makeIterator() -> Iterator { Iterator(first: first, more: more.makeIterator()) }

    @usableFromInline
    struct Iterator: IteratorProtocol {
        @usableFromInline var first: Element?
        @usableFromInline var more: IndexingIterator<[Element]>

        @inlinable init(first: Element?, more: IndexingIterator<[Element]>) {
            (self.first, self.more) = (first, more)
        }

        @inlinable mutating func next() -> Element? {
            if let element = first {
                first = nil
                return element
            }
            return more.next()
        }
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

/// What a waiter is resumed with: one object for all the waiters of a settled flight, or
/// ``cancelled`` for a waiter whose task was cancelled. A waiter's continuation carries this
/// reference rather than the value, so that neither the slots nor the settling loop depend on the
/// value's type.
///
/// A failure (and ``cancelled``) is an instance of this class itself, with the error to throw; a
/// success is a ``WaiterValue``, which adds the value. No stored type of either depends on the
/// value's type except the value itself: a generic class whose stored type did (a
/// `Result<Value, any Error>`) had its deinitializer look the type's metadata up at run time, for
/// every flight.
@usableFromInline
class WaiterOutcome: @unchecked Sendable {
    // @unchecked: `failure` is a `let` of a `Sendable` type, and the one subclass, ``WaiterValue``,
    // adds only a `let` of a `Sendable` type; nothing is ever mutated.

    /// The error a waiter throws; `nil` for a ``WaiterValue``.
    @usableFromInline let failure: (any Error)?

    /// A waiter whose task was cancelled: it throws `CancellationError`.
    @usableFromInline static let cancelled = WaiterOutcome(failure: CancellationError())

    /// An outcome that throws `failure`.
    @inlinable init(failure: any Error) { self.failure = failure }

    /// For ``WaiterValue`` only: an instance of this class itself always has a failure, which
    /// ``result(as:)`` relies on.
    @inlinable init() { self.failure = nil }

    /// The outcome of a settled flight: a ``WaiterValue`` for a success.
    @inlinable
    static func settled<Value: Sendable>(_ result: Result<Value, any Error>) -> WaiterOutcome {
        switch result {
        case .success(let value): return WaiterValue(value)
        case .failure(let error): return WaiterOutcome(failure: error)
        }
    }

    /// The value, or the error to throw. `Value` is the waiting state's type, which a settled
    /// flight's ``WaiterValue`` always has.
    @inlinable
    final func result<Value: Sendable>(as _: Value.Type) throws -> Value {
        if let failure { throw failure }
        return unsafeDowncast(self, to: WaiterValue<Value>.self).value
    }
}

/// The outcome of a flight that succeeded, shared by all its waiters.
@usableFromInline
final class WaiterValue<Value: Sendable>: WaiterOutcome, @unchecked Sendable {
    // @unchecked: see ``WaiterOutcome``; `value` is a `let` of a `Sendable` type.
    @usableFromInline let value: Value

    @inlinable
    init(_ value: Value) {
        self.value = value
        super.init()
    }
}

/// A table keyed by waiter id that holds one entry inline, so that the usual flight — one caller —
/// allocates no storage for it: the shape of both ``WaiterIDs`` (a set: `Void` entries) and
/// ``WaiterSlots``. Iterated in no particular order (sort where order matters).
@usableFromInline
struct InlineOneTable<Entry: Sendable>: Sendable {
    @usableFromInline
    enum Storage: Sendable {
        case empty
        case one(UInt64, Entry)
        /// Two entries or more (never fewer: a removal that leaves one goes back to ``one(_:_:)``).
        case many([UInt64: Entry])
    }

    @usableFromInline var storage: Storage = .empty

    @inlinable init() {}

    @inlinable var isEmpty: Bool {
        if case .empty = storage { return true }
        return false
    }

    @inlinable var count: Int {
        switch storage {
        case .empty: return 0
        case .one: return 1
        case .many(let entries): return entries.count
        }
    }

    /// The entry of `id`; setting `nil` removes it.
    @inlinable subscript(id: UInt64) -> Entry? {
        get {
            switch storage {
            case .empty: return nil
            case .one(let only, let entry): return only == id ? entry : nil
            case .many(let entries): return entries[id]
            }
        }
        set {
            switch storage {
            case .empty:
                if let newValue { storage = .one(id, newValue) }
            case .one(let only, let entry):
                if only == id {
                    storage = newValue.map { .one(id, $0) } ?? .empty
                } else if let newValue {
                    storage = .many([only: entry, id: newValue])
                }
            case .many(var entries):
                storage = .empty  // `entries` is then the dictionary's only reference: changed in place
                entries[id] = newValue
                if entries.count == 1, let (only, entry) = entries.first {
                    storage = .one(only, entry)
                } else {
                    storage = .many(entries)
                }
            }
        }
    }

    /// The ids, in no particular order.
    @usableFromInline
    struct IDs: IteratorProtocol {
        @usableFromInline var one: UInt64?
        @usableFromInline var many: Dictionary<UInt64, Entry>.Keys.Iterator?

        @inlinable init(_ storage: Storage) {
            switch storage {
            case .empty: break
            case .one(let only, _): one = only
            case .many(let entries): many = entries.keys.makeIterator()
            }
        }

        @inlinable mutating func next() -> UInt64? {
            if let only = one {
                one = nil
                return only
            }
            return many?.next()
        }
    }

    @inlinable var ids: IDs { IDs(storage) }
}

/// The ids of a flight's waiters: a set that holds one id inline (an ``InlineOneTable`` of `Void`),
/// so that the usual flight — one caller — allocates no storage. Iterated in no particular order
/// (sort where order matters).
@usableFromInline
struct WaiterIDs: Sequence, Sendable, Equatable, ExpressibleByArrayLiteral {
    @usableFromInline var table = InlineOneTable<Void>()

    @inlinable init() {}

    @inlinable init(arrayLiteral ids: UInt64...) {
        for id in ids { insert(id) }
    }

    /// The same ids, whatever the storage.
    @inlinable static func == (lhs: WaiterIDs, rhs: WaiterIDs) -> Bool {
        lhs.count == rhs.count && lhs.allSatisfy(rhs.contains)
    }

    /// One of the ids (no particular one), or `nil` when there is none.
    @inlinable var first: UInt64? {
        var iterator = makeIterator()
        return iterator.next()
    }

    @inlinable var isEmpty: Bool { table.isEmpty }

    @inlinable var count: Int { table.count }

    @inlinable func contains(_ id: UInt64) -> Bool { table[id] != nil }

    @inlinable mutating func insert(_ id: UInt64) { table[id] = () }

    @inlinable mutating func remove(_ id: UInt64) { table[id] = nil }

    /// The ids that are not in `other`.
    @inlinable func subtracting(_ other: WaiterIDs) -> WaiterIDs {
        var remaining = WaiterIDs()
        for id in self where !other.contains(id) { remaining.insert(id) }
        return remaining
    }

    @inlinable func makeIterator() -> InlineOneTable<Void>.IDs { table.ids }
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
