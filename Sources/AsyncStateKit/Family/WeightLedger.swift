/// What a family's entries weigh together, across its shards, and the most they may weigh.
///
/// The bound is the family's, as Caffeine's is, not a share per shard: an entry of any weight up to
/// ``maximum`` can be held however the keys fall into shards. Each shard adds its changes here under
/// its own lock (this lock is taken inside a shard's, never around it), so the total always equals
/// the sum of the shards' totals once their locks are released.
///
/// The total is an `Int128`: each entry weighs at most `Int.max`, and no number of entries can make
/// the sum overflow (2^63 entries of 2^63 each stay below 2^127), so no weigher output traps.
@usableFromInline final class WeightLedger: Sendable {
    /// The most the entries may weigh together (never negative).
    @usableFromInline let maximum: Int
    private let total = LockedValue<Int128>(0)

    @usableFromInline init(maximum: Int) {
        self.maximum = max(0, maximum)
    }

    /// Adds `change` (negative for less weight) to the total.
    @usableFromInline func add(_ change: Int128) {
        total.withLock { $0 += change }
    }

    /// Whether the entries weigh more than ``maximum``.
    @usableFromInline var isOver: Bool { total.withLock { $0 > Int128(maximum) } }

    /// The total, at most `Int.max`.
    @usableFromInline var weight: Int { total.withLock { Int(clamping: $0) } }
}
