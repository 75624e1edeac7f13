import Foundation
public import Synchronization

/// A family's bounds — its capacity and maximum weight, across its shards — and what leaves when it
/// is over them, reported to the removal callback and the observer after every lock is released.
extension FamilyCore {
    /// Whether the family holds more entries than its capacity, or weighs more than its maximum.
    @inlinable var isOver: Bool {
        population.load(ordering: .relaxed) > capacity || ledger?.isOver == true
    }

    /// Brings the family back within its capacity and maximum weight after a write to `key`'s entry,
    /// its making, or the end of a use of it (an entry that was busy may go now). Called after
    /// every such change, so that after any write the family holds and weighs no more than its
    /// bounds — except for busy entries, which are never evicted (it then evicts when a use ends).
    ///
    /// `key`'s entry goes first if it alone weighs more than the maximum (reported as evicted): no
    /// other entry is evicted for it. Otherwise it is the entry just written or used — the most
    /// recently used — and goes last: `key`'s shard evicts as its policy chooses, sparing it; if the
    /// family is still over (that shard had nothing else to evict, or holds little of the weight),
    /// the other shards evict in turn, one entry each per round, each as its own policy chooses;
    /// only then, if the family is still over, `key`'s entry goes.
    @inlinable func trim(after key: Key) {
        guard ledger != nil || population.load(ordering: .relaxed) > capacity else { return }
        var removed = Shard.Removals()
        let home = shardIndex(for: key)
        func evicted(_ done: Bool) -> Bool {
            if done { population.subtract(1, ordering: .relaxed) }
            return done
        }
        let keyWent = shards[home].withLock { shard in
            if let ledger, evicted(shard.evict(key, ifHeavierThan: ledger.maximum, into: &removed)) { return true }
            while isOver, evicted(shard.evictOne(sparing: key, into: &removed)) {}
            return false
        }
        var evicting = !keyWent && isOver && shards.count > 1
        while evicting {
            evicting = false
            for offset in 1..<shards.count where isOver {
                shards[(home + offset) & shardMask].withLock { shard in
                    if isOver, evicted(shard.evictOne(into: &removed)) { evicting = true }
                }
            }
        }
        if !keyWent, isOver {
            shards[home].withLock { shard in _ = isOver && evicted(shard.evict(key, into: &removed)) }
        }
        report(removed)
    }

    /// Reports a replaced value to the removal callback.
    @inlinable func reportReplaced(_ key: Key, _ value: Value?) {
        report(CollectionOfOne(.init(key: key, value: value, reason: .replaced)))
    }

    @inlinable func report(_ removed: some Sequence<Shard.Removed>) {
        for entry in removed {
            onRemoval?(entry.key, entry.value, entry.reason)
            observer?.deliver(.removed(entry.reason), describing: entry.key)
        }
    }
}
