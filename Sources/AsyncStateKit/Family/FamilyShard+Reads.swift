extension FamilyShard {
    // MARK: Hits

    /// What a hit found: a live entry's answer (`nil` if its data is not fresh), or the position of a
    /// compact entry whose data is fresh.
    @usableFromInline
    enum Hit<Result> {
        case live(Result?)
        case compact(position: Int)
    }

    /// The look-up of every hit on a family (see ``FamilyCore/hit(_:at:_:)``), which changes nothing:
    /// if `key` has an entry in `shard`, its slot (whose access the caller notes), and, if its data is
    /// fresh at `now` and was not fresh for `hitWindow` or longer (see
    /// ``StoreConfiguration/hitWindow``), `live` of a live entry's published contents, or a compact
    /// entry's position, for the caller to read. `nil` without an entry. A compact entry is read
    /// without a retain; a live entry's store (and the records, around the call into its cell) is
    /// retained and released, since the optimizer cannot prove the records unchanged across that
    /// call through a pointer: a reference-count write that live hits share.
    ///
    /// Static, on a pointer to the shard, as every read a hit makes: readers on the stripes of a
    /// spread shard read it at the same time as one of them notes hits in its policy
    /// (``absorb(_:into:)``), so a read must touch the fields it needs (`shard.pointee.table`), never
    /// the shard as a whole, which a method's `self` may copy.
    @inlinable @inline(__always)
    static func lookUp<Result>(
        in shard: UnsafePointer<Self>, _ key: Key, hash: Int, at now: Duration, hitWindow: Duration,
        live: (SnapshotCell<Value?>.Contents) -> Result
    ) -> (slot: Int32, position: Int, hit: Hit<Result>)? {
        guard let position = shard.pointee.table.position(of: key, hash: hash) else { return nil }
        // Each field is read on its own, straight from the records: a read through a closure that
        // calls out of line (the freshness test, say) retains the records' storage around the call,
        // a write to its reference count that every reader of the shard would share.
        let slot = shard.pointee.table.records[position].slot
        if let store = shard.pointee.table.records[position].store,
            let answer = store.cell.read(ifFreshAt: now, live)
        {
            return (slot, position, .live(answer))
        }
        let freshness = shard.pointee.table.records[position].freshness
        guard isWithinExpiry(since: freshness, at: now, expiry: hitWindow) else { return (slot, position, .live(nil)) }
        return (slot, position, .compact(position: position))
    }

    /// `key`'s slot, and its value if its data is fresh at `now` and within `hitWindow` (see
    /// ``lookUp(in:_:hash:at:hitWindow:live:)``).
    @inlinable @inline(__always)
    static func freshValue(in shard: UnsafePointer<Self>, of key: Key, hash: Int, at now: Duration, hitWindow: Duration)
        -> (position: Int32, result: Value?)?
    {
        guard let found = lookUp(in: shard, key, hash: hash, at: now, hitWindow: hitWindow, live: \.value) else {
            return nil
        }
        switch found.hit {
        case .live(let value): return (Int32(truncatingIfNeeded: found.position), value ?? nil)
        case .compact(let position):
            return (Int32(truncatingIfNeeded: position), shard.pointee.table.records[position].value)
        }
    }

    /// `key`'s slot, and its snapshot if its data is fresh at `now` and within `hitWindow`, for data
    /// that stays fresh for `expiry` (see ``lookUp(in:_:hash:at:hitWindow:live:)``).
    @inlinable @inline(__always)
    static func freshSnapshot(
        in shard: UnsafePointer<Self>, of key: Key, hash: Int, at now: Duration, hitWindow: Duration,
        expiry: Duration
    ) -> (position: Int32, result: AsyncSnapshot<Value?>?)? {
        guard let found = lookUp(in: shard, key, hash: hash, at: now, hitWindow: hitWindow, live: \.freshSnapshot)
        else { return nil }
        switch found.hit {
        case .live(let snapshot): return (Int32(truncatingIfNeeded: found.position), snapshot)
        case .compact(let position):
            return (
                Int32(truncatingIfNeeded: position), compactSnapshot(in: shard, at: position, now: now, expiry: expiry)
            )
        }
    }

    /// The snapshot at `now` of the compact entry whose record is at `position` in `shard`, whose data
    /// stays fresh for `expiry`: its packed data's snapshot (``StateData/Packed/snapshot(value:freshSince:at:expiry:)``),
    /// without unpacking it.
    @inlinable @inline(__always)
    static func compactSnapshot(in shard: UnsafePointer<Self>, at position: Int, now: Duration, expiry: Duration)
        -> AsyncSnapshot<Value?>
    {
        shard.pointee.table.records.withUnsafeBufferPointer { records in
            shard.pointee.metadata[Int(records[position].slot)]!.snapshot(
                value: records[position].value, freshSince: records[position].freshness, at: now, expiry: expiry)
        }
    }

    /// A hit on the entry at `slot` of `shard`, whose record is at `position` (`nil`: find it), and
    /// whose key's hash is `hash`, at `now`: its last access is written (with an idle expiry), and the
    /// policy notes it. At once by a reader that holds the shard alone, or when the hits that readers
    /// on the shard's stripes noted are folded in (see ``AccessBuffer``). A hit the policy's read
    /// buffer has no room for marks its record instead (``RecordTable/Record/referenced``): the
    /// policy then gives the entry the second chance the hit would have given it (see
    /// ``evictOne(sparing:into:)``). It changes the last accesses, the policy and that one field of
    /// the record, each through the pointer: fields the hit's look-up reads are not written.
    @inlinable
    static func noteHit(
        _ slot: Int32, position: Int?, hash: Int, at now: Duration, in shard: UnsafeMutablePointer<Self>
    ) {
        recordAccess(slot, at: now, tracksIdle: shard.pointee.tracksIdle, in: &shard.pointee.lastAccess)
        guard !shard.pointee.policy.noteHit(slot, hash: hash) else { return }
        let position = position ?? shard.pointee.table.at(Int(slot))
        if !shard.pointee.table.records[position].referenced { shard.pointee.table.records[position].referenced = true }
    }

    /// The data of the compact entry whose record is at `position`, unpacked
    /// (``StateData/init(value:freshSince:packed:)``): for a read's snapshot, every entry's, a write's,
    /// a pin's. Read field by field, not through a copy of the record.
    @inlinable @inline(__always)
    func compactData(at position: Int) -> Data {
        Data(
            value: table.records[position].value, freshSince: table.records[position].freshness,
            packed: metadata[Int(table.records[position].slot)]!)
    }

    // MARK: Reads that are not uses

    /// The latest value of `key`, whose hash is `hash`, if it has an entry in `shard` with a value;
    /// no access is recorded. Static, on a pointer, as the hits' look-up (see
    /// ``lookUp(in:_:hash:at:hitWindow:live:)``); inlinable, so that it is specialized in the caller's
    /// module.
    @inlinable
    static func latestValue(in shard: UnsafePointer<Self>, of key: Key, hash: Int) -> Value? {
        guard let position = shard.pointee.table.position(of: key, hash: hash) else { return nil }
        return shard.pointee.table.records.withUnsafeBufferPointer { records in
            if let store = records[position].store { return store.cell.value }
            return records[position].value
        }
    }

    /// The snapshot of `key`'s entry in `shard` at `now`, whose data stays fresh for `expiry`; `nil`
    /// without an entry. No access is recorded. Static and inlinable, as ``latestValue(in:of:hash:)``.
    @inlinable
    static func snapshot(in shard: UnsafePointer<Self>, of key: Key, hash: Int, at now: Duration, expiry: Duration)
        -> AsyncSnapshot<Value?>?
    {
        guard let position = shard.pointee.table.position(of: key, hash: hash) else { return nil }
        return snapshot(in: shard, at: position, now: now, expiry: expiry)
    }

    /// The snapshot at `now` of the entry whose record is at `position` in `shard`.
    @inlinable
    static func snapshot(in shard: UnsafePointer<Self>, at position: Int, now: Duration, expiry: Duration)
        -> AsyncSnapshot<Value?>
    {
        if let store = shard.pointee.table.records[position].store { return store.cell.snapshot(at: now) }
        return compactSnapshot(in: shard, at: position, now: now, expiry: expiry)
    }

    /// Calls `body` with every entry's key and snapshot at `now` (see ``snapshot(at:now:expiry:)``).
    @inlinable
    func forEachSnapshot(at now: Duration, expiry: Duration, _ body: (Key, AsyncSnapshot<Value?>) -> Void) {
        withUnsafePointer(to: self) { shard in
            for position in table.records.indices {
                guard let key = table.records[position].key else { continue }
                body(key, Self.snapshot(in: shard, at: position, now: now, expiry: expiry))
            }
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

extension FamilyShard: StripeReadable {
    @usableFromInline typealias StripeLocal = AccessBuffer

    /// Notes the hits that readers on one stripe answered (see ``AccessBuffer``), in order, as hits
    /// answered under the shard's lock are (``noteHit(_:hash:at:in:)``): in the policy and the last
    /// accesses, which readers never read (a hit's look-up reads the table, the entries' cells and
    /// the compact entries' metadata), so this may run while readers hold the shard's other stripes.
    /// The buffer samples from now on if the fold shows processors contending for the shard
    /// (``AccessBuffer/isSampling``).
    @inlinable
    static func absorb(_ local: inout AccessBuffer, into shard: UnsafeMutablePointer<Self>) {
        guard local.count > 0 else { return }
        local.isSampling = local.showsContention(
            previousStripe: shard.pointee.lastAbsorbedStripe, previousNewest: shard.pointee.lastAbsorbedAt)
        shard.pointee.lastAbsorbedStripe = local.stripe
        shard.pointee.lastAbsorbedAt = local.newestAccess()
        local.drain { access in noteHit(access.slot, position: nil, hash: access.hash, at: access.at, in: shard) }
    }
}
