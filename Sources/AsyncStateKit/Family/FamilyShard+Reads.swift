extension FamilyShard {
    /// The latest value of `key`, whose hash is `hash`, if it has an entry with a value; no access
    /// is recorded. Inlinable, as the hit paths are, so that it is specialized in the caller's module.
    @inlinable
    func latestValue(of key: Key, hash: Int) -> Value? {
        guard let position = table.position(of: key, hash: hash) else { return nil }
        return table.records.withUnsafeBufferPointer { records in
            if let store = records[position].store { return store.cell.value }
            return records[position].value
        }
    }

    /// The snapshot of `key`'s entry at `now`, whose data stays fresh for `expiry`; `nil` without an
    /// entry. No access is recorded. Inlinable, as ``latestValue(of:hash:)``.
    @inlinable
    func snapshot(of key: Key, hash: Int, at now: Duration, expiry: Duration) -> AsyncSnapshot<Value?>? {
        guard let position = table.position(of: key, hash: hash) else { return nil }
        return snapshot(at: position, now: now, expiry: expiry)
    }

    /// The snapshot at `now` of the entry whose record is at `position`.
    @inlinable
    func snapshot(at position: Int, now: Duration, expiry: Duration) -> AsyncSnapshot<Value?> {
        if let store = table.records[position].store { return store.cell.snapshot(at: now) }
        return compactSnapshot(at: position, now: now, expiry: expiry)
    }

    /// Calls `body` with every entry's key and snapshot at `now` (see ``snapshot(at:now:expiry:)``).
    @inlinable
    func forEachSnapshot(at now: Duration, expiry: Duration, _ body: (Key, AsyncSnapshot<Value?>) -> Void) {
        for position in table.records.indices {
            if let key = table.records[position].key { body(key, snapshot(at: position, now: now, expiry: expiry)) }
        }
    }

    /// Calls `body` with every entry's key and latest value, for the entries that have one.
    @inlinable
    func forEachValue(_ body: (Key, Value) -> Void) {
        for record in table.records {
            guard let key = record.key else { continue }
            if let value = record.store.map({ $0.cell.value }) ?? record.value { body(key, value) }
        }
    }
}
