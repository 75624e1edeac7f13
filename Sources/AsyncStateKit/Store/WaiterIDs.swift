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
