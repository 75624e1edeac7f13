public import Foundation

/// Writes and invalidations of a shard's entries: a compact entry changes here by its data's own
/// methods (``StateData``), as a store's machine changes it; a live entry's store is handed back, to
/// be changed through the store.
extension FamilyShard {
    /// Writes `value` if `key` has no entry or a compact one that nobody uses: returns `done`,
    /// whether it made the entry, and the value it replaced. Otherwise returns `done == false` and
    /// changes nothing (the caller sets through the store). The write is the data's own
    /// (``StateData/set(_:isEmpty:shift:now:date:version:)``, as a store's; see ``settle(_:_:)``), at
    /// second-level `version` (0: not written there).
    @inlinable mutating func setIfCompact(
        _ value: Value, for key: Key, at now: Duration, date: Date, version: UInt64
    ) -> (done: Bool, inserted: Bool, replaced: Value?) {
        let hash = key.hashValue
        let isEmpty = configuration.isEmpty(value)
        let shift = configuration.freshnessShift(of: value)
        guard let slot = table.slot(of: key, hash: hash) else {
            let slot = Int(insert(key, hash: hash, at: now))
            var data = Data(initialValue: nil)
            data.set(value, isEmpty: isEmpty, shift: shift, now: now, date: date, version: version)
            makeCompact(slot, data)
            weigh(slot)
            return (true, true, nil)
        }
        let i = Int(slot)
        let position = table.at(i)
        guard users[i] == 0, table.records[position].store == nil else { return (false, false, nil) }
        let replaced = table.records[position].value
        settle(i) { $0.set(value, isEmpty: isEmpty, shift: shift, now: now, date: date, version: version) }
        weigh(i)
        touch(slot, at: now)
        return (true, false, replaced)
    }

    /// Marks `key`'s compact data expired (``StateData/invalidate(now:expiry:)``, as a store's), and
    /// returns `.compact`; returns a live entry's store instead (for the caller to invalidate); `nil`
    /// without an entry.
    /// With a second-level `version`, a compact entry that is that version or newer is left as it
    /// is (`nil`), and one that is older learns the version (see
    /// ``StateData/invalidate(now:expiry:version:)``).
    @inlinable mutating func invalidateIfCompact(_ key: Key, at now: Duration, version: UInt64? = nil) -> Entry? {
        guard let slot = table.slot(of: key) else { return nil }
        if let store = table.records[table.at(Int(slot))].store { return .live(store) }
        var data = compactData(at: table.at(Int(slot)))
        guard data.invalidate(now: now, expiry: configuration.expiry, version: version) != nil else { return nil }
        makeCompact(Int(slot), data)
        return entry(at: Int(slot))
    }

    /// Marks expired, as ``invalidateIfCompact(_:at:)`` does each, the entries that `isIncluded`
    /// accepts among at most `budget` slots from `start` (so that the caller can release the lock
    /// between calls): the compact ones here, their keys added to `compact`; the live ones' stores
    /// added to `live`, for the caller to invalidate. By slot, which does not move while an entry
    /// lives (its record may), so no entry is missed across calls. Returns the next slot, or `nil`
    /// when done.
    @inlinable mutating func invalidate(
        fromSlot start: Int, budget: Int, at now: Duration, where isIncluded: (Key) throws -> Bool,
        compact: inout [Key], live: inout [Store]
    ) rethrows -> Int? {
        let end = min(table.slotCount, start + budget)
        let expiry = configuration.expiry
        for slot in start..<end where table.holdsEntry(slot) {
            let position = table.at(slot)
            guard let key = table.records[position].key, try isIncluded(key) else { continue }
            if let store = table.records[position].store {
                live.append(store)
            } else {
                settle(slot) { _ = $0.invalidate(now: now, expiry: expiry) }
                compact.append(key)
            }
        }
        return end < table.slotCount ? end : nil
    }

    /// Applies `change` to the data of the compact entry at `slot` and packs the result: a compact
    /// entry changes by the data's own methods, as a store's machine does. The change must leave the
    /// data at rest (a write, an invalidation).
    @inlinable mutating func settle(_ slot: Int, _ change: (inout Data) -> Void) {
        var data = compactData(at: table.at(slot))
        change(&data)
        makeCompact(slot, data)
    }

    /// The entry of `key`, if any (no access is recorded).
    @inlinable func peek(_ key: Key) -> Entry? {
        table.slot(of: key).map { entry(at: Int($0)) }
    }
}
