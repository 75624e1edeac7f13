import Foundation
public import Synchronization

/// Writes, invalidations, cancellations and removals of a family's entries: a compact entry changes in
/// its shard, a live one through its store.
extension FamilyCore {
    /// Writes `value` for `key` as a store's `set` would: in the shard for a new or compact entry,
    /// through the store otherwise. Returns the value it replaced. The family is then trimmed to
    /// its bounds, `key`'s entry last (see ``trim(after:)``). `version`: the second-level version the
    /// value was written at (0: not written there).
    @inlinable func set(_ value: Value, for key: Key, version: UInt64) -> Value? {
        let now = clock.now()
        let (done, inserted, replaced) = shard(for: key).withLock { shard in
            shard.setIfCompact(value, for: key, at: now, date: clock.date(), version: version)
        }
        if done {
            if inserted { entered(key) } else { trim(after: key) }
            return replaced
        }
        return usingNow(key) { store in
            let previous = store.cell.value
            store.set(value, version: version)
            return previous
        }
    }

    /// The entry of `key`, if any (no access recorded, nothing made).
    @inlinable func peek(_ key: Key) -> Shard.Entry? {
        shard(for: key).withLock { $0.peek(key) }
    }

    /// Marks `key`'s data expired.
    @inlinable func invalidate(_ key: Key, version: UInt64? = nil) {
        let now = clock.now()
        guard let entry = shard(for: key).withLock({ $0.invalidateIfCompact(key, at: now, version: version) }) else {
            return
        }
        switch entry {
        case .live(let store):
            store.invalidate(version: version)
        case .compact:
            reportInvalidated(key)
        }
    }

    /// Marks expired the data of every key that `isIncluded` accepts: shard by shard, at most 1,024
    /// entries per hold of a shard's lock (so hits on it wait for no more), with no copy of the
    /// entries. Live entries' stores are invalidated after the lock is released.
    @inlinable func invalidate(where isIncluded: (Key) throws -> Bool) rethrows {
        let now = clock.now()
        for shard in shards {
            var next: Int? = 0
            while let start = next {
                var (compact, live): ([Key], [Store]) = ([], [])
                next = try shard.withLock { shard in
                    try shard.invalidate(
                        fromSlot: start, budget: 1_024, at: now, where: isIncluded, compact: &compact, live: &live)
                }
                for store in live { store.invalidate() }
                for key in compact { reportInvalidated(key) }
            }
        }
    }

    /// Marks expired the data of every entry carrying `tag` (see
    /// ``FamilyShard/invalidate(tag:at:compact:live:)``), shard by shard; live entries' stores are
    /// invalidated after the lock is released. Returns how many entries were.
    @discardableResult
    @inlinable func invalidate(tag: String) -> Int {
        let now = clock.now()
        var count = 0
        for shard in shards {
            var (compact, live): ([Key], [Store]) = ([], [])
            shard.withLock { $0.invalidate(tag: tag, at: now, compact: &compact, live: &live) }
            for store in live { store.invalidate() }
            for key in compact { reportInvalidated(key) }
            count += compact.count + live.count
        }
        observer?.deliverByCaller(.invalidatedTag(tag, entries: count))
        return count
    }

    /// Reports to the observer that a compact entry's data was invalidated (a live entry's store
    /// reports its own).
    @inlinable func reportInvalidated(_ key: Key) {
        observer?.deliver(.invalidated, describing: key, byCaller: true)
    }

    /// Cancels `key`'s fetch in flight, if it has one (only a live entry may).
    @inlinable func cancel(_ key: Key) {
        if case .live(let store) = peek(key) { store.cancel() }
    }

    /// Removes `key`'s entry: its fetch in flight is cancelled and its `updates` streams finish.
    /// Returns whether there was one.
    @discardableResult
    @inlinable func remove(_ key: Key) -> Bool {
        guard
            let node = shard(for: key).withLock({ shard -> Shard.Leaving? in
                let node = shard.remove(key)
                if node != nil { population.subtract(1, ordering: .relaxed) }
                return node
            })
        else { return false }
        if case .live(let store) = node.entry { store.cancel() }
        report(CollectionOfOne(.init(key: key, value: node.value, reason: .removed)))
        return true
    }

    /// Removes every entry (as ``remove(_:)`` does each).
    @inlinable func removeAll() {
        for shard in shards {
            let all = shard.withLock { shard in
                let all = shard.removeAll()
                population.subtract(all.count, ordering: .relaxed)
                return all
            }
            for node in all { if case .live(let store) = node.entry { store.cancel() } }
            report(all.map { .init(key: $0.key, value: $0.value, reason: .removed) })
        }
    }
}
