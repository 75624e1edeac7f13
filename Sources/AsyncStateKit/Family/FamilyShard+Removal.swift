public import Foundation

/// How entries leave a shard: eviction as the policy chooses, the idle sweep, and removal.
extension FamilyShard {
    // MARK: Removing entries

    /// An entry as it leaves (or as it is listed): its key and entry.
    @usableFromInline struct Leaving {
        @usableFromInline var key: Key
        @usableFromInline var entry: Entry

        @inlinable
        init(key: Key, entry: Entry) {
            (self.key, self.entry) = (key, entry)
        }

        /// Its latest value.
        @inlinable var value: Value? {
            switch entry {
            case .compact(let data): return data.value
            case .live(let store): return store.cell.value
            }
        }
        /// What a warm restart saves of it (see ``StateData/archived``).
        @inlinable var archived: (value: Value?, isEmpty: Bool, lastSuccess: Date?)? {
            switch entry {
            case .compact(let data): return data.archived
            case .live(let store): return store.archived
            }
        }
    }

    /// Evicts one entry that is not busy, as the policy chooses, into `removed`; returns whether
    /// there was one. Busy entries (in use, or with a flight in flight) are skipped, and so is
    /// `sparing` (an entry just made or written, whose caller expects to find it).
    @inlinable mutating func evictOne(sparing: Key? = nil, into removed: inout Removals) -> Bool {
        policy.applyReads()
        var reprieves = 0
        var candidate: Int32?
        while true {
            let chosen: (slot: Int32, refused: Bool, candidate: Int32?)?
            do {
                // The closures read copies of the two tables (references, not their storage): capturing
                // `self` while `policy` is being read made the compiler copy the whole shard for each
                // call. The copies end here, before `remove` writes to the tables.
                let (table, users) = (table, users)
                chosen = policy.victim(
                    where: { table.key(at: Int($0)) != sparing && !Self.isInUse(Int($0), table: table, users: users) },
                    hash: { table.hash(at: Int($0)) }, candidate: candidate)
            }
            guard let chosen else { return false }
            let (slot, refused) = (chosen.slot, chosen.refused)
            candidate = chosen.candidate
            // Main's victim on probation, hit while its hit could not be noted, is used, not forgotten:
            // it moves to protected, as the hit would have moved it, and the next victim is chosen,
            // against the same candidate — at most ``reprieveLimit`` times an eviction, so that one
            // eviction stays short.
            let position = table.at(Int(slot))
            if !refused, reprieves < Self.reprieveLimit, table.records[position].referenced, policy.isOnProbation(slot)
            {
                table.records[position].referenced = false
                policy.promote(slot)
                reprieves += 1
                continue
            }
            return evict(slot, refused: refused, into: &removed)
        }
    }

    /// The most second chances one eviction gives (see ``evictOne(sparing:into:)``). Each is paid for
    /// by a hit that marked its entry, so their work is bounded by the hits; the limit bounds one
    /// eviction's (a hot set of 1,000 keys in 4 shards lost 97 of them to a scan with 8, 28 with 64,
    /// 20 without a limit — those the window held, whose marks are the window's).
    @inlinable static var reprieveLimit: Int { 64 }

    /// Evicts the entry at `slot`, chosen by the policy (`refused`: a candidate refused admission).
    @inlinable mutating func evict(_ slot: Int32, refused: Bool, into removed: inout Removals) -> Bool {
        removed.append(self.removed(at: Int(slot), reason: .evicted))
        policy.evicted(table.hash(at: Int(slot)), refused: refused, entries: table.count)
        remove(slot)
        return true
    }

    /// Evicts `key`'s entry if it is not busy and, given `maximum`, if it alone weighs more than
    /// that (the family could never hold it); returns whether it did. A busy one stays.
    @inlinable mutating func evict(_ key: Key, ifHeavierThan maximum: Int? = nil, into removed: inout Removals) -> Bool
    {
        guard let slot = table.slot(of: key), !isInUse(Int(slot)) else { return false }
        if let maximum, weigher == nil || weights[Int(slot)] <= maximum { return false }  // nothing weighed: no weight
        removed.append(self.removed(at: Int(slot), reason: .evicted))
        remove(slot)
        return true
    }

    /// Removes the entries last accessed at or before `deadline` (idle), in the heap's order. A busy
    /// one is in use: it counts as accessed `now` instead. An entry whose heap place is older than
    /// its last access is placed by its last access — those placed before `ahead` too, although not
    /// due yet, so that the sweeper wakes once for many of them rather than once for each. Looks at
    /// no more than `budget` entries, so that the caller can release the lock between calls.
    /// Returns how many it removed and whether it is done. Needs `tracksIdle`.
    @inlinable mutating func removeIdle(
        accessedBy deadline: Duration, placingUntil ahead: Duration, now: Duration, budget: Int,
        into removed: inout Removals
    ) -> (removed: Int, done: Bool) {
        var count = 0
        for _ in 0..<budget {
            guard let root = idle.root, root.since <= max(deadline, ahead) else { return (count, true) }
            let i = Int(root.slot)
            let lastUse = lastAccess[i]
            if lastUse > deadline {
                // Not idle: placed by its last use. Placed there already, it is due at its own idle
                // deadline, when the sweeper wakes next; the entries after it wait until then.
                guard lastUse > root.since else { return (count, true) }
                idle.raiseRoot(to: lastUse)
            } else if isInUse(i) {
                lastAccess[i] = now
                idle.raiseRoot(to: now)
            } else {
                removed.append(self.removed(at: i, reason: .idle))
                remove(root.slot)
                count += 1
            }
        }
        return (count, false)
    }

    /// A lower bound of the oldest last access in the shard (the idle heap's root), or `nil` when the
    /// shard is empty or does not track idle entries. The sweep is due when it becomes idle.
    @inlinable var oldestAccess: Duration? { idle.root?.since }

    /// Removes `key`'s entry; returns it.
    @inlinable mutating func remove(_ key: Key) -> Leaving? {
        guard let slot = table.slot(of: key) else { return nil }
        let leaving = Leaving(key: key, entry: entry(at: Int(slot)))
        remove(slot)
        return leaving
    }

    /// Removes every entry; returns them.
    @inlinable mutating func removeAll() -> [Leaving] {
        let all = entries
        ledger?.add(-totalWeight)
        self = FamilyShard(
            capacity: capacity, weigher: weigher, ledger: ledger, tracksIdle: tracksIdle, configuration: configuration,
            tagger: tagger)
        return all
    }

    /// Every entry, in no particular order.
    @inlinable var entries: [Leaving] {
        table.records.compactMap { record in
            record.key.map { Leaving(key: $0, entry: entry(at: Int(record.slot))) }
        }
    }
}
