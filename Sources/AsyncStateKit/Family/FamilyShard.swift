public import Foundation

/// One shard of a family: its entries (each key's record near the key's home in an open-addressed
/// table, with a hash index to find the few that are not; see ``position(of:hash:)``) and its
/// eviction policy, W-TinyLFU (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache
/// Admission Policy", 2017; the policy of Java's Caffeine). Guarded by the shard's lock; every
/// operation is O(1) amortized except the trims, which are O(entries removed + busy entries
/// skipped).
///
/// The entries are on three lists, each in order of last access (most recent first):
/// - the **window** (1 % of the shard's capacity) takes every new entry, so that a new key is not
///   judged before it has had a chance to be used again;
/// - an entry pushed out of the window goes to **probation**; used again there, it moves to
///   **protected** (80 % of the rest), whose least recently used entries fall back to probation;
/// - to make room, the newest entry of probation (the one the window just pushed out: the
///   candidate) and its least recently used one (the victim) are compared by how often their keys
///   were used recently (a ``FrequencySketch``), and the less popular goes. A scan of keys used once,
///   or a burst of one-hit wonders, so never pushes out the keys that are used again and again.
///
/// A hit does not reorder the lists itself: it writes its instant (with an idle expiry) and notes the
/// entry in a small buffer, which is applied (sketch counts and list moves, in the order of the hits) before
/// anything that reads or changes the lists — a new entry, an eviction, a removal, a pin — and once
/// every ``readBatch`` hits. A run of hits with none of those notes the first ``readBufferSize`` of
/// every ``readBatch`` and drops the rest from the policy (the hit still counts for idle expiry), as
/// Caffeine's read buffer drops reads it has no room for: the lists and counts are then a sample, which
/// is all W-TinyLFU needs, and a hit costs no list or sketch work.
///
/// Idle expiry therefore does not read the lists. With an idle expiry, a binary heap holds every entry
/// by a lower bound of its last access (when it was made, or when the sweep last looked at it): its
/// root tells when the sweep may next find an idle entry — never later than the first one, maybe
/// earlier — and the sweep removes the entries idle by their true last access and places the others
/// by it. Each entry is so looked at about once per idle expiry, however often it is hit.
///
/// An entry is **live** — a store, as an ``AsyncState`` has — while someone uses it (a caller between
/// ``pin(_:at:make:)`` and ``unpin(_:)``, a fetch in flight, an `updates` subscriber) or while its
/// state is not settled data (never fetched, failed). An entry nobody uses with settled data is
/// **compact**: its value, dates and counts only, a few dozen bytes besides the key and value; a
/// hit on it reads the shard alone. Pinning a compact entry makes its store again, in the state it
/// had, so every per-key behaviour is the store's.
///
/// The hit path (``hit(_:hash:at:hitWindow:live:compact:)``) is inlinable, so that it is specialized for the
/// caller's key and value types: unspecialized, every step would look up generic metadata.
@usableFromInline
struct FamilyShard<Key: Hashable & Sendable, Value: Sendable> {
    @usableFromInline typealias Store = AsyncStateStore<Value?>
    /// A key's data: what a compact entry is, packed (see ``Metadata``).
    @usableFromInline typealias Data = StateData<Value?>

    /// What an entry holds (see ``entry(at:)``).
    @usableFromInline
    enum Entry {
        /// Data at rest, nobody using it.
        case compact(Data)
        /// Its store.
        case live(Store)
    }

    /// What the hit path reads of an entry, together: its key, its slot, and its store or its value
    /// and freshness. A free position has no key. (56 bytes with an `Int` key and value: the
    /// freshness is a `Duration` with a value for "none" rather than an optional, which would take
    /// 8 more, and the fields are in the order that packs them.)
    @usableFromInline
    struct Record {
        /// When a compact entry's data became fresh, or ``notFresh`` (see ``freshness``).
        @usableFromInline var freshSince: Duration = Self.notFresh
        /// A live entry's store.
        @usableFromInline var store: Store?
        @usableFromInline var key: Key?
        /// The entry's slot: its place in the lists and in the shard's other arrays.
        @usableFromInline var slot: Int32
        /// A compact entry's value (`nil` for a live entry, whose store has it).
        @usableFromInline var value: Value?

        @usableFromInline
        init(key: Key?, slot: Int32) {
            self.key = key
            self.slot = slot
        }

        /// A free position.
        @usableFromInline static var free: Record { Record(key: nil, slot: -1) }

        /// ``freshSince`` when the data is not fresh: earlier than any instant a clock gives.
        @usableFromInline static var notFresh: Duration { .seconds(Int64.min) }

        /// When a compact entry's data became fresh: `nil` if it is not (never fetched, invalidated,
        /// failed) or the entry is live.
        @inlinable
        var freshness: Duration? {
            // Compared in attoseconds: `Duration`'s `==` is a call into the standard library.
            get { freshSince.attoseconds == Self.notFresh.attoseconds ? nil : freshSince }
            set { freshSince = newValue ?? Self.notFresh }
        }
    }

    /// An entry's place on its list, how many callers use it now and its key's hash: plain data, read
    /// and changed off the hit path.
    @usableFromInline
    struct Link {
        @usableFromInline var newer: Int32 = -1
        @usableFromInline var older: Int32 = -1
        /// Callers between `pin` and `unpin`.
        @usableFromInline var users: Int32 = 0
        /// Its position in the idle heap (-1 without an idle expiry).
        @usableFromInline var heapPosition: Int32 = -1
        /// Its list (see ``Segment``).
        @usableFromInline var segment: UInt8 = Segment.window
        /// Its key's hash, for the frequency sketch.
        @usableFromInline var hash: Int

        @usableFromInline
        init(hash: Int) {
            self.hash = hash
        }
    }

    /// What a compact entry keeps besides its value and freshness (read off the hit path): the rest
    /// of its ``StateData``, which is at rest (so its failure fields are empty, and whether its value
    /// is empty is what its phase says). Its optionals are kept as values with a sentinel for "none": as
    /// optionals, each would take a byte more, and with alignment eight (112 bytes in all, not 136).
    @usableFromInline
    struct Metadata {
        @usableFromInline var phase: AsyncPhase
        @usableFromInline var lastError: (any Error)?
        /// ``lastSuccess`` as seconds since the reference date (what a `Date` holds), NaN for none.
        @usableFromInline var lastSuccessSeconds: Double
        @usableFromInline var successCount: Int
        /// ``restoredUntil``, ``Record/notFresh`` for none.
        @usableFromInline var restoredUntilInstant: Duration

        init(_ data: Data) {
            phase = data.phase
            lastError = data.lastError
            lastSuccessSeconds = data.lastSuccess?.timeIntervalSinceReferenceDate ?? .nan
            successCount = data.successCount
            restoredUntilInstant = data.restoredUntil ?? Record.notFresh
        }

        /// The wall date of the entry's last success, if any.
        @inlinable
        var lastSuccess: Date? {
            lastSuccessSeconds.isNaN ? nil : Date(timeIntervalSinceReferenceDate: lastSuccessSeconds)
        }

        /// See ``StateData/restoredUntil``.
        @inlinable
        var restoredUntil: Duration? {
            restoredUntilInstant.attoseconds == Record.notFresh.attoseconds ? nil : restoredUntilInstant
        }
    }

    /// An entry in the idle heap: its slot, and a lower bound of its last access (see the type's
    /// documentation).
    struct IdleNode {
        var since: Duration
        var slot: Int32
    }

    /// An entry that left the shard, for the removal callback (called after the lock is released).
    struct Removed {
        var key: Key
        var value: Value?
        var reason: AsyncStateFamilyRemovalReason
    }

    // What the hit path reads is in `records`, each at a position near its key's home (see
    // ``position(of:hash:)``), which moves when the array grows. The rest is by slot, a place that
    // does not move, in parallel arrays: the record's position, the lists, the last accesses (with
    // an idle expiry), what a compact entry keeps off the hit path, and the weights.
    @usableFromInline var index = SlotIndex()
    /// A power of two of positions, at most three quarters used (see ``growRecords()``); one free
    /// position in an empty shard, so that memory follows the entries held.
    @usableFromInline var records = [Record.free]
    /// Each slot's position in `records` (-1 for a sentinel or a free slot).
    @usableFromInline var positions: [Int32] = []
    /// Each entry's last access, when `tracksIdle` (empty otherwise: nothing reads it).
    @usableFromInline var lastAccess: [Duration] = []
    @usableFromInline var links: [Link] = []
    @usableFromInline var metadata: [Metadata?] = []
    /// Each entry's weight (0 without a weigher or a value; never negative), and their sum: in
    /// `Int128`, so that no number of entries of any weight overflows it. Every change is also
    /// added to the family's ``WeightLedger``, which holds the sum over every shard.
    var weights: [Int] = []
    private(set) var totalWeight: Int128 = 0
    @usableFromInline var freeSlots: [Int32] = []
    /// Slots 0, 1 and 2 are the sentinels of the window, probation and protected lists: each list is
    /// circular through its sentinel, whose `older` is the list's most recently used entry and whose
    /// `newer` its least recently used one (the sentinel itself when the list is empty). Made with the
    /// first entry (``prepareForEntries()``).
    @usableFromInline static var sentinels: Int32 { 3 }
    /// The lengths of the window and protected lists.
    @usableFromInline var windowCount = 0
    @usableFromInline var protectedCount = 0
    /// The most entries the window and protected lists hold (the shard's share of the capacity sets
    /// them; probation holds the rest).
    @usableFromInline let windowLimit: Int
    @usableFromInline let protectedLimit: Int
    @usableFromInline var sketch: FrequencySketch
    /// The hits noted since the policy last applied them (the first `pendingReads` slots, and their
    /// keys' hashes), and every hit since then, noted or not. Allocated with the first entry (a hit
    /// needs an entry; see ``prepareForEntries()``).
    @usableFromInline var reads: [Int32] = []
    @usableFromInline var readHashes: [Int] = []
    @usableFromInline var pendingReads = 0
    @usableFromInline var hitsSinceApplied = 0
    /// How many hits the buffer notes, and after how many hits a hit applies it.
    @usableFromInline static var readBufferSize: Int { 64 }
    @usableFromInline static var readBatch: Int { 1_024 }
    /// Every entry by a lower bound of its last access, least first (a binary heap), when
    /// `tracksIdle`.
    var idleHeap: [IdleNode] = []
    @usableFromInline let tracksIdle: Bool
    /// The share of the family's capacity this shard is sized for.
    let capacity: Int
    /// How an entry is weighed, and the family's total weight; `nil` without a maximum weight.
    let weigher: (@Sendable (Key, Value) -> Int)?
    let ledger: WeightLedger?
    /// The family's policies: the emptiness test and expiry of a compact entry's writes and
    /// invalidations (see ``settle(_:_:)``).
    let configuration: StoreConfiguration<Value?>

    init(
        capacity: Int, weigher: (@Sendable (Key, Value) -> Int)? = nil, ledger: WeightLedger? = nil,
        tracksIdle: Bool = false,
        configuration: StoreConfiguration<Value?> = StoreConfiguration(expiry: .seconds(120), isEmpty: { _ in false })
    ) {
        self.configuration = configuration
        self.weigher = ledger == nil ? nil : weigher
        self.ledger = ledger
        self.tracksIdle = tracksIdle
        self.capacity = max(1, capacity)
        windowLimit = max(1, self.capacity / 100)
        // In Int128: 8 × a capacity near `Int.max` would overflow.
        protectedLimit = Int(Int128(self.capacity - windowLimit) * 8 / 10)
        sketch = FrequencySketch(capacity: self.capacity)
    }

    var count: Int { index.count }

    /// The bytes this shard's buffers hold (by their capacity): what memory follows, for tests that
    /// an empty shard costs the same whatever its capacity, and that it grows with its entries.
    var bufferBytes: Int {
        func bytes<Element>(_ array: [Element]) -> Int { array.capacity * MemoryLayout<Element>.stride }
        return bytes(records) + bytes(index.buckets) + bytes(positions) + bytes(lastAccess) + bytes(links)
            + bytes(metadata) + bytes(weights) + bytes(freeSlots) + bytes(sketch.words) + bytes(reads)
            + bytes(readHashes) + bytes(idleHeap)
    }

    /// How many positions from its home a lookup tries before it asks the index.
    @usableFromInline static var nearby: Int { 4 }

    /// The position of `key`'s record, whose hash is `hash`. The records are kept as linear probing
    /// keeps keys: each is put at the first free position from its key's home (which the key's hash
    /// gives), and moved back when a removal frees a position before it (see ``vacate(_:)``), so that
    /// no free position ever lies between a record and its home. A lookup so finds the record at its
    /// home or a few positions on — a read of memory whose address needs no other read first — or
    /// meets a free position first, and then the key has none. Only when the ``nearby`` positions
    /// from the home all hold other keys (for about 3 keys in 100 when half the positions are used,
    /// 12 when three quarters are, the most) does it read the index, which holds every record's
    /// position. At a million keys a hit is then one cache miss, not the index's and then the
    /// record's in a chain.
    ///
    /// Always inlined: called, it was given a copy of the whole shard (240 bytes) on every hit.
    @inlinable @inline(__always)
    func position(of key: Key, hash: Int) -> Int? {
        records.withUnsafeBufferPointer { records in
            let mask = records.count &- 1
            var position = home(of: hash, mask: mask)
            for _ in 0..<Self.nearby {
                guard let found = records[position].key else { return nil }
                if found == key { return position }
                position = (position &+ 1) & mask
            }
            return index.find(hash) { records[Int($0)].key == key }.map { Int($0) }
        }
    }

    /// The slot of `key`, whose hash is `hash`.
    @inlinable
    func slot(of key: Key, hash: Int) -> Int32? {
        position(of: key, hash: hash).map { records[$0].slot }
    }

    /// The home of a key whose hash is `hash` in `records` (`mask + 1` positions): where a lookup
    /// starts, where a new record is placed from, and what a removal's move back keeps each record
    /// after — one definition for the three, or records would be lost.
    @inlinable @inline(__always)
    func home(of hash: Int, mask: Int) -> Int { index.home(SlotIndex.tag(hash), mask: mask) }

    /// The position of the record of the entry at `slot`.
    @inlinable
    func at(_ slot: Int) -> Int { Int(positions[slot]) }

    /// The slot of `key`.
    func slot(of key: Key) -> Int32? { slot(of: key, hash: key.hashValue) }

    // MARK: Hits

    /// The hit path of every read of a family that answers fresh data at once: if `key` has an entry,
    /// records the access at `now`; then, if its data is fresh and was not fresh for `hitWindow` or
    /// longer (see ``StoreConfiguration/hitWindow``), returns `live` of a live entry's published
    /// contents, or `compact` of the shard and the compact entry's position. A live entry is read
    /// without being retained.
    @inlinable @inline(__always)
    mutating func hit<Result>(
        _ key: Key, hash: Int, at now: Duration, hitWindow: Duration,
        live: (SnapshotCell<Value?>.Contents) -> Result, compact: (Self, Int) -> Result
    ) -> Result? {
        guard let position = position(of: key, hash: hash) else { return nil }
        hit(records[position].slot, hash: hash, at: now)
        let live = records.withUnsafeBufferPointer { records in
            records[position].store.map { $0.cell.read(ifFreshAt: now, live) }
        }
        if let live { return live }
        guard isWithinExpiry(since: records[position].freshness, at: now, expiry: hitWindow) else { return nil }
        return compact(self, position)
    }

    /// `key`'s value if its data is fresh at `now` and within `hitWindow` (see ``hit(_:hash:at:hitWindow:live:compact:)``).
    @inlinable
    mutating func freshValue(of key: Key, hash: Int, at now: Duration, hitWindow: Duration) -> Value? {
        hit(key, hash: hash, at: now, hitWindow: hitWindow, live: \.value, compact: { $0.compactValue(at: $1) }) ?? nil
    }

    /// `key`'s snapshot if its data is fresh at `now` and within `hitWindow`, for data that stays fresh
    /// for `expiry` (see ``hit(_:hash:at:hitWindow:live:compact:)``).
    @inlinable
    mutating func freshSnapshot(of key: Key, hash: Int, at now: Duration, hitWindow: Duration, expiry: Duration)
        -> AsyncSnapshot<Value?>?
    {
        hit(
            key, hash: hash, at: now, hitWindow: hitWindow, live: \.freshSnapshot,
            compact: { $0.compactData(at: $1).snapshot(at: now, expiry: expiry) })
    }

    /// The value of the compact entry whose record is at `position`.
    @inlinable
    func compactValue(at position: Int) -> Value? { records[position].value }

    /// The data of the compact entry whose record is at `position`: the one place a compact entry is
    /// unpacked (for a hit's snapshot, a read's, every entry's, a write's, a pin's).
    @inlinable
    func compactData(at position: Int) -> Data {
        let metadata = metadata[Int(records[position].slot)]!
        return Data(
            atRest: records[position].value, phase: metadata.phase, freshSince: records[position].freshness,
            lastError: metadata.lastError, lastSuccess: metadata.lastSuccess, successCount: metadata.successCount,
            restoredUntil: metadata.restoredUntil)
    }

    // MARK: Reads that are not uses

    /// The latest value of `key`, whose hash is `hash`, if it has an entry with a value; no access
    /// is recorded. Inlinable, as the hit paths are, so that it is specialized in the caller's module.
    @inlinable
    func latestValue(of key: Key, hash: Int) -> Value? {
        guard let position = position(of: key, hash: hash) else { return nil }
        return records.withUnsafeBufferPointer { records in
            if let store = records[position].store { return store.cell.value }
            return records[position].value
        }
    }

    /// The snapshot of `key`'s entry at `now`, whose data stays fresh for `expiry`; `nil` without an
    /// entry. No access is recorded. Inlinable, as ``latestValue(of:hash:)``.
    @inlinable
    func snapshot(of key: Key, hash: Int, at now: Duration, expiry: Duration) -> AsyncSnapshot<Value?>? {
        guard let position = position(of: key, hash: hash) else { return nil }
        return snapshot(at: position, now: now, expiry: expiry)
    }

    /// The snapshot at `now` of the entry whose record is at `position`.
    @inlinable
    func snapshot(at position: Int, now: Duration, expiry: Duration) -> AsyncSnapshot<Value?> {
        if let store = records[position].store { return store.cell.snapshot(at: now) }
        return compactData(at: position).snapshot(at: now, expiry: expiry)
    }

    /// Calls `body` with every entry's key and snapshot at `now` (see ``snapshot(at:now:expiry:)``).
    @inlinable
    func forEachSnapshot(at now: Duration, expiry: Duration, _ body: (Key, AsyncSnapshot<Value?>) -> Void) {
        for position in records.indices {
            if let key = records[position].key { body(key, snapshot(at: position, now: now, expiry: expiry)) }
        }
    }

    /// Calls `body` with every entry's key and latest value, for the entries that have one.
    @inlinable
    func forEachValue(_ body: (Key, Value) -> Void) {
        for position in records.indices {
            guard let key = records[position].key else { continue }
            let value = records[position].store.map { $0.cell.value } ?? records[position].value
            if let value { body(key, value) }
        }
    }

    /// A hit on the entry at `slot`, whose key's hash is `hash`, at `now`: its last access is written
    /// (with an idle expiry); the policy's work is noted in the read buffer if it has room (see the
    /// type's documentation).
    @inlinable
    mutating func hit(_ slot: Int32, hash: Int, at now: Duration) {
        recordAccess(slot, at: now)
        if pendingReads < Self.readBufferSize {
            reads[pendingReads] = slot
            readHashes[pendingReads] = hash
            pendingReads &+= 1
        }
        hitsSinceApplied &+= 1
        if hitsSinceApplied >= Self.readBatch { applyReads() }
    }

    /// Applies the hits noted in the read buffer to the policy, in their order: all their counts in
    /// the sketch, then all their moves in the lists (neither reads the other). In a pass of counts,
    /// each reads a block of the sketch whose address no other count's read gives, so the
    /// processor can overlap their cache misses. (At a million keys, in `perf`, the policy's share
    /// of a hit went from 6.3 to 5.0 % when the counts moved out of the loop of moves.)
    @inlinable
    mutating func applyReads() {
        for position in 0..<pendingReads { sketch.increment(readHashes[position]) }
        for position in 0..<pendingReads { move(reads[position]) }
        pendingReads = 0
        hitsSinceApplied = 0
    }

    // MARK: Entries

    /// The entry at `slot`.
    func entry(at slot: Int) -> Entry {
        let position = at(slot)
        if let store = records[position].store { return .live(store) }
        return .compact(compactData(at: position))
    }

    /// The latest value of the entry at `slot`.
    func value(at slot: Int) -> Value? {
        let position = at(slot)
        return records[position].store.map { $0.cell.value } ?? records[position].value
    }

    /// Whether the entry at `slot` is in use: never evicted nor dropped as idle then.
    func isBusy(_ slot: Int) -> Bool {
        links[slot].users > 0 || records[at(slot)].store?.isBusy == true
    }

    /// Makes the entry at `slot` live with `store`.
    private mutating func makeLive(_ slot: Int, _ store: Store) {
        let position = at(slot)
        records[position].store = store
        records[position].value = nil
        records[position].freshness = nil
        metadata[slot] = nil
    }

    /// Makes the entry at `slot` compact with `data`, which is at rest: packs it.
    private mutating func makeCompact(_ slot: Int, _ data: Data) {
        let position = at(slot)
        records[position].store = nil
        records[position].value = data.value
        records[position].freshness = data.freshSince
        metadata[slot] = Metadata(data)
    }

    // MARK: Using an entry

    /// `key`'s store, for a caller that will use it until ``unpin(_:)``: made with `make` for a new
    /// key, restored with `restore` from a compact entry. The access at `now` makes the entry the
    /// most recently used. Returns whether the key's entry is new.
    mutating func pin(
        _ key: Key, at now: Duration, make: () -> Store, restore: (Data) -> Store
    ) -> (store: Store, inserted: Bool) {
        let hash = key.hashValue
        if let slot = slot(of: key, hash: hash) {
            touch(slot, at: now)
            let i = Int(slot)
            links[i].users += 1
            if let store = records[at(i)].store { return (store, false) }
            let store = restore(compactData(at: at(i)))
            makeLive(i, store)
            return (store, false)
        }
        let store = make()
        let slot = allocate(key, hash: hash, at: now)
        makeLive(Int(slot), store)
        links[Int(slot)].users = 1
        return (store, true)
    }

    /// A caller is done with `key`'s store: if nobody else uses it and its store may rest (see
    /// ``AsyncStateStore/restingData``), the entry becomes compact.
    mutating func unpin(_ key: Key) {
        guard let slot = slot(of: key) else { return }  // removed meanwhile
        let i = Int(slot)
        links[i].users -= 1
        weigh(i)
        guard links[i].users == 0, let store = records[at(i)].store, let data = store.restingData else { return }
        makeCompact(i, data)
    }

    /// Weighs the entry at `slot` again (its value may have changed). Without a weigher, nothing.
    private mutating func weigh(_ slot: Int) {
        guard let weigher else { return }
        let weight = value(at: slot).map { max(0, weigher(records[at(slot)].key!, $0)) } ?? 0
        setWeight(weight, of: slot)
    }

    /// Sets the weight of the entry at `slot`, in this shard's total and the family's ledger.
    private mutating func setWeight(_ weight: Int, of slot: Int) {
        let change = Int128(weight) - Int128(weights[slot])
        guard change != 0 else { return }
        weights[slot] = weight
        totalWeight += change
        ledger?.add(change)
    }

    /// Writes `value` if `key` has no entry or a compact one that nobody uses: returns `done`,
    /// whether it made the entry, and the value it replaced. Otherwise returns `done == false` and
    /// changes nothing (the caller sets through the store). The write is the data's own
    /// (``StateData/set(_:isEmpty:now:date:)``, as a store's; see ``settle(_:_:)``).
    mutating func setIfCompact(_ value: Value, for key: Key, at now: Duration, date: Date) -> (
        done: Bool, inserted: Bool, replaced: Value?
    ) {
        let hash = key.hashValue
        guard let slot = slot(of: key, hash: hash) else {
            let slot = Int(allocate(key, hash: hash, at: now))
            var data = Data(initialValue: nil)
            data.set(value, isEmpty: configuration.isEmpty(value), now: now, date: date)
            makeCompact(slot, data)
            weigh(slot)
            return (true, true, nil)
        }
        let i = Int(slot)
        let position = at(i)
        guard links[i].users == 0, records[position].store == nil else { return (false, false, nil) }
        let replaced = records[position].value
        let isEmpty = configuration.isEmpty(value)
        settle(i) { $0.set(value, isEmpty: isEmpty, now: now, date: date) }
        weigh(i)
        touch(slot, at: now)
        return (true, false, replaced)
    }

    /// Marks `key`'s compact data expired (``StateData/invalidate(now:expiry:)``, as a store's), and returns
    /// `.compact`; returns a live entry's store instead (for the caller to invalidate); `nil` without
    /// an entry.
    mutating func invalidateIfCompact(_ key: Key, at now: Duration) -> Entry? {
        guard let slot = slot(of: key) else { return nil }
        let position = at(Int(slot))
        if let store = records[position].store { return .live(store) }
        let expiry = configuration.expiry
        settle(Int(slot)) { _ = $0.invalidate(now: now, expiry: expiry) }
        return entry(at: Int(slot))
    }

    /// Marks expired, as ``invalidateIfCompact(_:at:)`` does each, the entries that `isIncluded`
    /// accepts among at most `budget` slots from `start` (so that the caller can release the lock
    /// between calls): the compact ones here, their keys added to `compact`; the live ones' stores
    /// added to `live`, for the caller to invalidate. By slot, which does not move while an entry
    /// lives (its record may), so no entry is missed across calls. Returns the next slot, or `nil`
    /// when done.
    mutating func invalidate(
        fromSlot start: Int, budget: Int, at now: Duration, where isIncluded: (Key) throws -> Bool,
        compact: inout [Key], live: inout [Store]
    ) rethrows -> Int? {
        let end = min(links.count, start + budget)
        let expiry = configuration.expiry
        for slot in start..<end where positions[slot] >= 0 {
            let position = at(slot)
            guard let key = records[position].key, try isIncluded(key) else { continue }
            if let store = records[position].store {
                live.append(store)
            } else {
                settle(slot) { _ = $0.invalidate(now: now, expiry: expiry) }
                compact.append(key)
            }
        }
        return end < links.count ? end : nil
    }

    /// Applies `change` to the data of the compact entry at `slot` and packs the result: a compact
    /// entry changes by the data's own methods, as a store's machine does. The change must leave the
    /// data at rest (a write, an invalidation).
    private mutating func settle(_ slot: Int, _ change: (inout Data) -> Void) {
        var data = compactData(at: at(slot))
        change(&data)
        makeCompact(slot, data)
    }

    /// The entry of `key`, if any (no access is recorded).
    func peek(_ key: Key) -> Entry? {
        slot(of: key).map { entry(at: Int($0)) }
    }

    // MARK: Removing entries

    /// An entry as it leaves: its key, entry and latest value.
    struct Leaving {
        var key: Key
        var entry: Entry
        var value: Value? {
            switch entry {
            case .compact(let data): return data.value
            case .live(let store): return store.cell.value
            }
        }
    }

    /// Evicts one entry that is not busy, as W-TinyLFU chooses, into `removed`; returns whether
    /// there was one. Busy entries (in use, or with a flight in flight) are skipped, and so is
    /// `sparing` (an entry just made or written, whose caller expects to find it).
    mutating func evictOne(sparing: Key? = nil, into removed: inout [Removed]) -> Bool {
        applyReads()
        guard let slot = evictionChoice(sparing: sparing) else { return false }
        removed.append(Removed(key: records[at(Int(slot))].key!, value: value(at: Int(slot)), reason: .evicted))
        remove(slot)
        return true
    }

    /// Evicts `key`'s entry if it is not busy and, given `maximum`, if it alone weighs more than
    /// that (the family could never hold it); returns whether it did. A busy one stays.
    mutating func evict(_ key: Key, ifHeavierThan maximum: Int? = nil, into removed: inout [Removed]) -> Bool {
        guard let slot = slot(of: key), !isBusy(Int(slot)) else { return false }
        if let maximum, weights[Int(slot)] <= maximum { return false }
        removed.append(Removed(key: key, value: value(at: Int(slot)), reason: .evicted))
        remove(slot)
        return true
    }

    /// The entry to evict: of probation's newest (the candidate the window pushed out) and least
    /// recently used (the victim) entries that may go, the one whose key was used less often
    /// recently (the candidate on a tie: the incumbent stays). With nothing in probation that may
    /// go, the least recently used of protected, then of the window. `nil` when every entry is busy.
    private func evictionChoice(sparing: Key?) -> Int32? {
        guard index.count > 0 else { return nil }  // and so, maybe, no lists yet
        func mayGo(_ slot: Int32) -> Bool { records[at(Int(slot))].key! != sparing && !isBusy(Int(slot)) }
        func first(in segment: UInt8, fromOldest: Bool, where include: (Int32) -> Bool) -> Int32? {
            let sentinel = Int32(segment)
            var slot = fromOldest ? links[Int(sentinel)].newer : links[Int(sentinel)].older
            while slot != sentinel {
                if include(slot) { return slot }
                slot = fromOldest ? links[Int(slot)].newer : links[Int(slot)].older
            }
            return nil
        }
        if let victim = first(in: Segment.probation, fromOldest: true, where: mayGo) {
            guard
                let candidate = first(in: Segment.probation, fromOldest: false, where: { $0 != victim && mayGo($0) })
            else { return victim }
            let candidateUses = sketch.estimate(links[Int(candidate)].hash)
            let victimUses = sketch.estimate(links[Int(victim)].hash)
            return candidateUses > victimUses ? victim : candidate
        }
        return first(in: Segment.protected, fromOldest: true, where: mayGo)
            ?? first(in: Segment.window, fromOldest: true, where: mayGo)
    }

    /// Removes the entries last accessed at or before `deadline` (idle), in the heap's order. A busy
    /// one is in use: it counts as accessed `now` instead. An entry whose heap place is older than
    /// its last access is placed by its last access — those placed before `ahead` too, although not
    /// due yet, so that the sweeper wakes once for many of them rather than once for each. Looks at
    /// no more than `budget` entries, so that the caller can release the lock between calls.
    /// Returns how many it removed and whether it is done. Needs `tracksIdle`.
    mutating func removeIdle(
        accessedBy deadline: Duration, placingUntil ahead: Duration, now: Duration, budget: Int,
        into removed: inout [Removed]
    ) -> (removed: Int, done: Bool) {
        var count = 0
        for _ in 0..<budget {
            guard let root = idleHeap.first, root.since <= max(deadline, ahead) else { return (count, true) }
            let i = Int(root.slot)
            let lastUse = lastAccess[i]
            if lastUse > deadline {
                // Not idle: placed by its last use. Placed there already, it is due at its own idle
                // deadline, when the sweeper wakes next; the entries after it wait until then.
                guard lastUse > root.since else { return (count, true) }
                raiseRoot(to: lastUse)
            } else if isBusy(i) {
                lastAccess[i] = now
                raiseRoot(to: now)
            } else {
                removed.append(Removed(key: records[at(i)].key!, value: value(at: i), reason: .idle))
                remove(root.slot)
                count += 1
            }
        }
        return (count, false)
    }

    /// A lower bound of the oldest last access in the shard (the idle heap's root), or `nil` when the
    /// shard is empty or does not track idle entries. The sweep is due when it becomes idle.
    var oldestAccess: Duration? { idleHeap.first?.since }

    /// Removes `key`'s entry; returns it.
    mutating func remove(_ key: Key) -> Leaving? {
        guard let slot = slot(of: key) else { return nil }
        let leaving = Leaving(key: key, entry: entry(at: Int(slot)))
        remove(slot)
        return leaving
    }

    /// Removes every entry; returns them.
    mutating func removeAll() -> [Leaving] {
        let all = entries
        ledger?.add(-totalWeight)
        self = FamilyShard(
            capacity: capacity, weigher: weigher, ledger: ledger, tracksIdle: tracksIdle, configuration: configuration)
        return all
    }

    /// Every entry, in no particular order.
    var entries: [Leaving] {
        records.compactMap { record in
            record.key.map { Leaving(key: $0, entry: entry(at: Int(record.slot))) }
        }
    }

    // MARK: The list

    /// A slot for a new entry of `key` (whose hash is `hash`), used at `now`, as the most recently used
    /// (its contents are set by the caller).
    mutating func allocate(_ key: Key, hash: Int, at now: Duration) -> Int32 {
        applyReads()
        if links.isEmpty { prepareForEntries() }
        sketch.grow(toHold: index.count + 1)
        let slot: Int32
        if let free = freeSlots.popLast() {
            slot = free
            links[Int(slot)] = Link(hash: hash)
        } else {
            slot = Int32(links.count)
            links.append(Link(hash: hash))
            positions.append(-1)
            if tracksIdle { lastAccess.append(.zero) }
            metadata.append(nil)
            weights.append(0)
        }
        if (index.count + 1) * 4 > records.count * 3 { growRecords() }
        let position = freePosition(from: hash)
        records[position] = Record(key: key, slot: slot)
        positions[Int(slot)] = Int32(position)
        index.insert(hash, position: Int32(position))
        if tracksIdle {
            lastAccess[Int(slot)] = now
            pushIdle(slot, since: now)
        }
        sketch.increment(hash)
        link(slot, into: Segment.window)
        // The window is full: its least recently used entry goes to probation, as a candidate.
        if windowCount > windowLimit, case let pushed = links[Int(Segment.window)].newer, pushed != slot {
            unlink(pushed)
            link(pushed, into: Segment.probation)
        }
        return slot
    }

    mutating func remove(_ slot: Int32) {
        applyReads()
        unlink(slot)
        let i = Int(slot)
        if tracksIdle { removeIdleNode(at: Int(links[i].heapPosition)) }
        let position = at(i)
        index.remove(links[i].hash, position: Int32(position))
        vacate(position)
        positions[i] = -1
        metadata[i] = nil
        setWeight(0, of: i)
        freeSlots.append(slot)
    }

    /// Makes what only a shard with entries needs: the lists' sentinels (slots 0, 1, 2) and the read
    /// buffer. Called with the first entry, so that an empty shard holds no more than its one free
    /// record and its index: memory follows the entries, whatever the capacity.
    private mutating func prepareForEntries() {
        for segment in 0..<Self.sentinels {
            positions.append(-1)
            if tracksIdle { lastAccess.append(.zero) }
            var sentinel = Link(hash: 0)
            (sentinel.newer, sentinel.older, sentinel.segment) = (segment, segment, UInt8(segment))
            links.append(sentinel)
            metadata.append(nil)
            weights.append(0)
        }
        reads = Array(repeating: 0, count: Self.readBufferSize)
        readHashes = Array(repeating: 0, count: Self.readBufferSize)
    }

    /// A use of the entry at `slot` at `now` other than a hit (a pin, a `set`): the hits noted before
    /// it are applied, then it is, at once.
    mutating func touch(_ slot: Int32, at now: Duration) {
        applyReads()
        recordAccess(slot, at: now)
        reorder(slot)
    }

    /// Writes a use of the entry at `slot` at `now` as its last access, with an idle expiry (nothing
    /// reads it otherwise). The clock was read before the lock: a later use may have been recorded
    /// meanwhile, so the later of the two stays.
    @inlinable
    mutating func recordAccess(_ slot: Int32, at now: Duration) {
        if tracksIdle { lastAccess[Int(slot)] = max(lastAccess[Int(slot)], now) }
    }

    /// The first free position from the home of a key whose hash is `hash`.
    private func freePosition(from hash: Int) -> Int {
        let mask = records.count - 1
        var position = home(of: hash, mask: mask)
        while records[position].key != nil { position = (position + 1) & mask }
        return position
    }

    /// Frees the record at `position`, and moves back each following record of its run that may
    /// move into the freed place (its home is not between that place and it), as the index does
    /// with its buckets: no free position is left between a record and its home, and records stay
    /// as near their homes as if the removed one had never been placed. (Only freed, positions
    /// would drift: in a model of a table three quarters used, with a removal for each new record,
    /// the records within ``nearby`` positions of their home fell from 89 to 61 %.)
    private mutating func vacate(_ position: Int) {
        let mask = records.count - 1
        records[position] = .free
        var hole = position
        var next = position
        while true {
            next = (next + 1) & mask
            guard records[next].key != nil else { return }
            let slot = Int(records[next].slot)
            let hash = links[slot].hash
            let home = home(of: hash, mask: mask)
            if (next - home) & mask >= (next - hole) & mask {
                records.swapAt(hole, next)
                positions[slot] = Int32(hole)
                index.move(hash, from: Int32(next), to: Int32(hole))
                hole = next
            }
        }
    }

    /// Doubles `records`, and puts each record at the first free position from its home in the new
    /// size (which is not the old one's for half of them); the index is made again to match. O(n),
    /// as growing the index alone was. Called when a new entry would fill more than three quarters
    /// of the positions, so that a shard that has only grown uses between three eighths and three
    /// quarters of them (the table never shrinks: after removals it may be emptier). Kept at
    /// most half used, the records would be nearer their homes (97 % within ``nearby`` positions of
    /// it rather than 88 % at the fullest), but just after a doubling they would take twice the
    /// memory they need: 410 resident bytes per entry at 540,000 `Int` entries, against 248 at
    /// 1,000,000.
    private mutating func growRecords() {
        let old = records
        records = Array(repeating: .free, count: old.count * 2)
        index = SlotIndex(bucketCount: records.count)
        for record in old where record.key != nil {
            let hash = links[Int(record.slot)].hash
            let position = freePosition(from: hash)
            records[position] = record
            positions[Int(record.slot)] = Int32(position)
            index.insert(hash, position: Int32(position))
        }
    }

    /// The policy's work for a use of the entry at `slot`: counted in the sketch, and moved (see
    /// ``move(_:)``).
    @inlinable
    mutating func reorder(_ slot: Int32) {
        sketch.increment(links[Int(slot)].hash)
        move(slot)
    }

    /// The entry at `slot` becomes the most recently used of its list — or, from probation, of
    /// protected (whose least recently used entry then falls back to probation if protected is
    /// full).
    @inlinable
    mutating func move(_ slot: Int32) {
        let i = Int(slot)
        let segment = links[i].segment
        if segment == Segment.probation {
            unlink(slot)
            link(slot, into: Segment.protected)
            if protectedCount > protectedLimit {
                let demoted = links[Int(Segment.protected)].newer
                unlink(demoted)
                link(demoted, into: Segment.probation)
            }
        } else if slot != links[Int(segment)].older {
            unlink(slot)
            link(slot, into: segment)
        }
    }

    /// Puts the entry at `slot` at the most recent end of list `segment`.
    @inlinable
    mutating func link(_ slot: Int32, into segment: UInt8) {
        let (i, sentinel) = (Int(slot), Int32(segment))
        let newest = links[Int(sentinel)].older
        links[i].segment = segment
        links[i].older = newest
        links[i].newer = sentinel
        links[Int(newest)].newer = slot
        links[Int(sentinel)].older = slot
        count(segment, 1)
    }

    /// Takes the entry at `slot` off its list.
    @inlinable
    mutating func unlink(_ slot: Int32) {
        let i = Int(slot)
        let (newer, older) = (links[i].newer, links[i].older)
        links[Int(newer)].older = older
        links[Int(older)].newer = newer
        count(links[i].segment, -1)
    }

    /// Counts `change` entries on list `segment` (only the window's and protected's are kept).
    @inlinable
    mutating func count(_ segment: UInt8, _ change: Int) {
        if segment == Segment.window {
            windowCount += change
        } else if segment == Segment.protected {
            protectedCount += change
        }
    }

    // MARK: The idle heap

    /// Adds the entry at `slot` to the idle heap, as last accessed at `since`.
    private mutating func pushIdle(_ slot: Int32, since: Duration) {
        idleHeap.append(IdleNode(since: since, slot: slot))
        links[Int(slot)].heapPosition = Int32(idleHeap.count - 1)
        siftUp(idleHeap.count - 1)
    }

    /// Takes the node at `position` out of the idle heap.
    private mutating func removeIdleNode(at position: Int) {
        let last = idleHeap.count - 1
        links[Int(idleHeap[position].slot)].heapPosition = -1
        guard position != last else {
            idleHeap.removeLast()
            return
        }
        idleHeap[position] = idleHeap.removeLast()
        links[Int(idleHeap[position].slot)].heapPosition = Int32(position)
        siftDown(siftUp(position))
    }

    /// Places the root of the idle heap by `since`, a later instant than its own.
    private mutating func raiseRoot(to since: Duration) {
        idleHeap[0].since = since
        siftDown(0)
    }

    /// Moves the node at `position` up while it is older than its parent; returns where it ends.
    @discardableResult
    private mutating func siftUp(_ position: Int) -> Int {
        var position = position
        while position > 0 {
            let parent = (position - 1) / 2
            guard idleHeap[position].since < idleHeap[parent].since else { break }
            swapIdleNodes(position, parent)
            position = parent
        }
        return position
    }

    /// Moves the node at `position` down while a child is older.
    private mutating func siftDown(_ position: Int) {
        var position = position
        while true {
            let (left, right) = (2 * position + 1, 2 * position + 2)
            var least = position
            if left < idleHeap.count, idleHeap[left].since < idleHeap[least].since { least = left }
            if right < idleHeap.count, idleHeap[right].since < idleHeap[least].since { least = right }
            guard least != position else { return }
            swapIdleNodes(position, least)
            position = least
        }
    }

    private mutating func swapIdleNodes(_ a: Int, _ b: Int) {
        idleHeap.swapAt(a, b)
        links[Int(idleHeap[a].slot)].heapPosition = Int32(a)
        links[Int(idleHeap[b].slot)].heapPosition = Int32(b)
    }
}

/// The three lists of a ``FamilyShard``.
@usableFromInline
enum Segment {
    @usableFromInline static let window: UInt8 = 0
    @usableFromInline static let probation: UInt8 = 1
    @usableFromInline static let protected: UInt8 = 2
}
