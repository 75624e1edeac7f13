extension FamilyShard {
    // MARK: Hits

    /// What a hit found: a live entry's answer (`nil` if its data is not fresh), or the position of a
    /// compact entry whose data is fresh.
    @usableFromInline
    enum Hit<Result> {
        case live(Result?)
        case compact(position: Int)
    }

    /// The hit path of every read of a family that answers fresh data at once: if `key` has an entry,
    /// records the access at `now`; then, if its data is fresh and was not fresh for `hitWindow` or
    /// longer (see ``StoreConfiguration/hitWindow``), answers with `live` of a live entry's published
    /// contents, or with a compact entry's position, for the caller to read. A live entry is read
    /// without being retained. `nil` without an entry.
    @inlinable @inline(__always)
    mutating func hit<Result>(
        _ key: Key, hash: Int, at now: Duration, hitWindow: Duration, live: (SnapshotCell<Value?>.Contents) -> Result
    ) -> Hit<Result>? {
        guard let position = table.position(of: key, hash: hash) else { return nil }
        hit(table.records[position].slot, hash: hash, at: now)
        let answer = table.records.withUnsafeBufferPointer { records in
            records[position].store.map { $0.cell.read(ifFreshAt: now, live) }
        }
        if let answer { return .live(answer) }
        guard isWithinExpiry(since: table.records[position].freshness, at: now, expiry: hitWindow) else {
            return .live(nil)
        }
        return .compact(position: position)
    }

    /// `key`'s value if its data is fresh at `now` and within `hitWindow` (see ``hit(_:hash:at:hitWindow:live:)``).
    @inlinable
    mutating func freshValue(of key: Key, hash: Int, at now: Duration, hitWindow: Duration) -> Value? {
        switch hit(key, hash: hash, at: now, hitWindow: hitWindow, live: \.value) {
        case nil: return nil
        case .live(let value): return value ?? nil
        case .compact(let position): return table.records[position].value
        }
    }

    /// `key`'s snapshot if its data is fresh at `now` and within `hitWindow`, for data that stays fresh
    /// for `expiry` (see ``hit(_:hash:at:hitWindow:live:)``).
    @inlinable
    mutating func freshSnapshot(of key: Key, hash: Int, at now: Duration, hitWindow: Duration, expiry: Duration)
        -> AsyncSnapshot<Value?>?
    {
        switch hit(key, hash: hash, at: now, hitWindow: hitWindow, live: \.freshSnapshot) {
        case nil: return nil
        case .live(let snapshot): return snapshot
        case .compact(let position): return compactSnapshot(at: position, now: now, expiry: expiry)
        }
    }

    /// The snapshot at `now` of the compact entry whose record is at `position`, whose data stays fresh
    /// for `expiry`: its data's snapshot (``StateData/snapshot(atRest:phase:freshSince:lastError:lastSuccess:successCount:at:expiry:)``),
    /// from the packed fields.
    @inlinable @inline(__always)
    func compactSnapshot(at position: Int, now: Duration, expiry: Duration) -> AsyncSnapshot<Value?> {
        let metadata = metadata[Int(table.records[position].slot)]!
        return Data.snapshot(
            atRest: table.records[position].value, phase: metadata.phase, freshSince: table.records[position].freshness,
            lastError: metadata.lastError, lastSuccess: metadata.lastSuccess, successCount: metadata.successCount,
            at: now, expiry: expiry)
    }

    /// A hit on the entry at `slot`, whose key's hash is `hash`, at `now`: its last access is written
    /// (with an idle expiry), and the policy notes it.
    @inlinable
    mutating func hit(_ slot: Int32, hash: Int, at now: Duration) {
        recordAccess(slot, at: now)
        policy.noteHit(slot, hash: hash)
    }

    /// The data of the compact entry whose record is at `position`: the one place a compact entry is
    /// unpacked (for a hit's snapshot, a read's, every entry's, a write's, a pin's). Read field by
    /// field, not through a copy of the record.
    @inlinable @inline(__always)
    func compactData(at position: Int) -> Data {
        let metadata = metadata[Int(table.records[position].slot)]!
        return Data(
            atRest: table.records[position].value, phase: metadata.phase, freshSince: table.records[position].freshness,
            receivedAt: metadata.receivedAt, lastError: metadata.lastError, lastSuccess: metadata.lastSuccess,
            successCount: metadata.successCount, restoredUntil: metadata.restoredUntil)
    }

    // MARK: Reads that are not uses

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
