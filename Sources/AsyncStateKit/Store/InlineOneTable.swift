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
