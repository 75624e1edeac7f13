/// A shard's eviction policy: W-TinyLFU (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient
/// Cache Admission Policy", 2017; the policy of Java's Caffeine). It knows entries by their slot (see
/// ``RecordTable``) and their key's hash, nothing else: which entries may go is the shard's to say.
///
/// The entries are on three lists (``Segment``), each in order of last access (most recent first):
/// - the **window** takes every new entry, so that a new key is not judged before it has had a
///   chance to be used again. It starts at 1 % of the capacity and adapts to the traffic (see
///   ``EvictionHistory``): a key refused at admission that comes back grows it by one entry, a key
///   displaced from main that comes back shrinks it by one — from a recency cache close to an LRU
///   (a window of all but one entry) to a frequency cache (a window of one);
/// - an entry pushed out of the window goes to **probation**; used again there, it moves to
///   **protected** (80 % of the rest), whose least recently used entries fall back to probation;
/// - to make room, the newest entry of probation (the one the window just pushed out: the
///   candidate) and its least recently used one (the victim) are compared by how often their keys
///   were used recently (a ``FrequencySketch``), and the less popular goes. A scan of keys used once,
///   or a burst of one-hit wonders, so never pushes out the keys that are used again and again.
///
/// A hit does not reorder the lists itself: it notes the entry in a small read buffer
/// (``noteHit(_:hash:)``), which is applied (sketch counts and list moves, in the order of the hits)
/// before anything that reads or changes the lists — a new entry, an eviction, a removal, a use that
/// is not a hit — and once every ``readBatch`` hits. A run of hits with none of those notes the first
/// ``readBufferSize`` of every ``readBatch`` and drops the rest, as Caffeine's read buffer drops reads
/// it has no room for: the lists and counts are then a sample, which is all W-TinyLFU needs, and a
/// hit costs no list or sketch work.
@usableFromInline
struct TinyLFUPolicy {
    /// The three lists.
    @usableFromInline
    enum Segment: UInt8 {
        case window, probation, protected

        /// The node of the list's sentinel.
        @inlinable var sentinel: Int { Int(rawValue) }
    }

    /// An entry's place on its list (or a list's sentinel). Each list is circular through its
    /// sentinel, whose `older` is the list's most recently used entry and whose `newer` its least
    /// recently used one (the sentinel itself when the list is empty). Links are node numbers.
    @usableFromInline
    struct Node {
        @usableFromInline var newer: Int32 = -1
        @usableFromInline var older: Int32 = -1
        @usableFromInline var segment = Segment.window

        @inlinable init() {}
    }

    /// The sentinels of the three lists (nodes 0, 1 and 2), then one node per slot: the entry at slot
    /// `s` is node `s + 3` (see ``node(_:)``). Made with the first entry (``prepare()``).
    @usableFromInline var nodes: [Node] = []
    /// The lengths of the window and protected lists.
    @usableFromInline var windowCount = 0
    @usableFromInline var protectedCount = 0
    /// The most entries the window and protected lists hold (probation holds the rest): the window's
    /// moves with the traffic, protected's is 80 % of the rest.
    @usableFromInline var windowLimit: Int
    @usableFromInline var protectedLimit: Int
    /// The capacity the lists share.
    let capacity: Int
    /// The keys evicted lately, which size the window; made at the first eviction.
    var history: EvictionHistory?
    @usableFromInline var sketch: FrequencySketch
    /// The hits noted since the policy last applied them (the first `pendingReads` slots, and their
    /// keys' hashes), and every hit since then, noted or not. Allocated with the first entry.
    @usableFromInline var reads: [Int32] = []
    @usableFromInline var readHashes: [Int] = []
    @usableFromInline var pendingReads = 0
    @usableFromInline var hitsSinceApplied = 0
    /// How many hits the buffer notes, and after how many hits a hit applies it.
    @usableFromInline static var readBufferSize: Int { 64 }
    @usableFromInline static var readBatch: Int { 1_024 }

    /// A policy for at most `capacity` entries.
    @usableFromInline init(capacity: Int) {
        self.capacity = capacity
        windowLimit = max(1, capacity / 100)
        protectedLimit = Self.protectedLimit(capacity: capacity, window: windowLimit)
        sketch = FrequencySketch(capacity: capacity)
    }

    /// The node of the entry at `slot`.
    @inlinable @inline(__always)
    static func node(_ slot: Int32) -> Int { Int(slot) &+ 3 }

    /// The slot of the entry at node `node`.
    static func slot(_ node: Int32) -> Int32 { node - 3 }

    /// Makes what only a policy with entries needs: the sentinels and the read buffer. Called with
    /// the first entry, so that an empty shard's memory does not depend on its capacity.
    private mutating func prepare() {
        for segment in [Segment.window, .probation, .protected] {
            var sentinel = Node()
            (sentinel.newer, sentinel.older, sentinel.segment) = (
                Int32(segment.sentinel), Int32(segment.sentinel), segment
            )
            nodes.append(sentinel)
        }
        reads = Array(repeating: 0, count: Self.readBufferSize)
        readHashes = Array(repeating: 0, count: Self.readBufferSize)
    }

    /// A new entry at `slot`, whose key's hash is `hash`, the `entries`-th: counted, and the most
    /// recently used of the window, whose least recently used entry goes to probation (a candidate)
    /// if the window is full.
    /// If the key was evicted lately, the window first moves one entry towards the list that would
    /// have kept it (see ``EvictionHistory``). Returns the slot of the entry pushed to probation, if
    /// one was.
    @discardableResult
    @usableFromInline mutating func admit(_ slot: Int32, hash: Int, entries: Int) -> Int32? {
        applyReads()
        if let refused = history?.takeBack(hash) { resizeWindow(by: refused ? 1 : -1) }
        if nodes.isEmpty { prepare() }
        sketch.grow(toHold: entries)
        let node = Self.node(slot)
        while nodes.count <= node { nodes.append(Node()) }
        nodes[node] = Node()
        sketch.increment(hash)
        link(node, into: .window)
        if windowCount > windowLimit, case let pushed = Int(nodes[Segment.window.sentinel].newer), pushed != node {
            unlink(pushed)
            link(pushed, into: .probation)
            return Self.slot(Int32(pushed))
        }
        return nil
    }

    /// A hit on the entry at `slot`, whose key's hash is `hash`: noted in the read buffer if it has
    /// room (see the type's documentation). Returns whether it was; the shard marks a hit that was
    /// not on its entry's record, for a second chance (see ``isOnProbation(_:)``, ``promote(_:)``).
    @inlinable @inline(__always)
    mutating func noteHit(_ slot: Int32, hash: Int) -> Bool {
        let noted = pendingReads < Self.readBufferSize
        if noted {
            reads[pendingReads] = slot
            readHashes[pendingReads] = hash
            pendingReads &+= 1
        }
        hitsSinceApplied &+= 1
        if hitsSinceApplied >= Self.readBatch { applyReads() }
        return noted
    }

    /// Applies the hits noted in the read buffer, in their order: all their counts in the sketch,
    /// then all their moves in the lists (neither reads the other). In a pass of counts, each reads a
    /// block of the sketch whose address no other count's read gives, so the processor can overlap
    /// their cache misses.
    @inlinable
    mutating func applyReads() {
        for position in 0..<pendingReads { sketch.increment(readHashes[position]) }
        for position in 0..<pendingReads { move(Self.node(reads[position])) }
        pendingReads = 0
        hitsSinceApplied = 0
    }

    /// A use of the entry at `slot` other than a hit (a pin, a write): the hits noted before it are
    /// applied, then it is, at once.
    @usableFromInline mutating func touch(_ slot: Int32, hash: Int) {
        applyReads()
        sketch.increment(hash)
        move(Self.node(slot))
    }

    /// Whether the entry at `slot` is on probation.
    @usableFromInline func isOnProbation(_ slot: Int32) -> Bool { nodes[Self.node(slot)].segment == .probation }

    /// The entry at `slot`, on probation, moves to protected as a hit would move it: its second
    /// chance, when the victim chosen was hit while the read buffer had no room for the hit (without
    /// it, the keys of a hot set served from memory for a long run of hits stay on probation,
    /// counted once, and a scan's keys, counted once too, push them out once the sketch halves).
    @usableFromInline mutating func promote(_ slot: Int32) {
        move(Self.node(slot))
    }

    /// The entry at `slot` leaves.
    @usableFromInline mutating func remove(_ slot: Int32) {
        applyReads()
        unlink(Self.node(slot))
    }

    /// The entry to evict among those `mayGo` accepts: of probation's newest (the candidate the window
    /// pushed out) and least recently used (the victim), the one whose key (its hash by `hash`) was
    /// used less often recently (the candidate on a tie: the incumbent stays). With nothing in
    /// probation that may go, the least recently used of protected, then of the window. `nil` when
    /// none may go. `refused` says whether it is a candidate refused at admission. Apply the reads
    /// first; call ``evicted(_:refused:entries:)`` as it goes.
    /// With `candidate`, that entry is the candidate (if it is still on probation and may go): the
    /// one an eviction compared first, kept while it gives second chances (see
    /// ``FamilyShard/evictOne(sparing:into:)``), whose promotions may put another entry at probation's
    /// newest end. Returns the candidate compared, if any.
    @usableFromInline func victim(
        where mayGo: (Int32) -> Bool, hash: (Int32) -> Int, candidate fixed: Int32? = nil
    ) -> (slot: Int32, refused: Bool, candidate: Int32?)? {
        guard !nodes.isEmpty else { return nil }
        func first(in segment: Segment, fromOldest: Bool, where include: (Int32) -> Bool) -> Int32? {
            let sentinel = Int32(segment.sentinel)
            var node = fromOldest ? nodes[Int(sentinel)].newer : nodes[Int(sentinel)].older
            while node != sentinel {
                if include(Self.slot(node)) { return Self.slot(node) }
                node = fromOldest ? nodes[Int(node)].newer : nodes[Int(node)].older
            }
            return nil
        }
        if let victim = first(in: .probation, fromOldest: true, where: { $0 != fixed && mayGo($0) }) {
            let candidate =
                fixed.flatMap { isOnProbation($0) && mayGo($0) ? $0 : nil }
                ?? first(in: .probation, fromOldest: false, where: { $0 != victim && mayGo($0) })
            guard let candidate else { return (victim, false, nil) }
            return sketch.estimate(hash(candidate)) > sketch.estimate(hash(victim))
                ? (victim, false, candidate) : (candidate, true, candidate)
        }
        return
            (first(in: .protected, fromOldest: true, where: mayGo)
            ?? first(in: .window, fromOldest: true, where: mayGo)).map { ($0, false, nil) }
    }

    /// The key with `hash` is evicted (``victim(where:hash:)`` chose it, `refused` as it said), from a
    /// shard of `entries` entries: remembered, to size the window.
    @usableFromInline mutating func evicted(_ hash: Int, refused: Bool, entries: Int) {
        let limit = EvictionHistory.limit(forEntries: entries)
        // Made at the first eviction; remade (forgetting) if the shard has grown far past the size it
        // was made for, as one bounded only by weight may.
        if history == nil || history!.limit * 2 < limit { history = EvictionHistory(limit: limit) }
        history!.remember(hash, refused: refused)
    }

    // MARK: The adaptive window

    /// The most entries protected holds beside a window of `window` (80 % of the rest).
    static func protectedLimit(capacity: Int, window: Int) -> Int {
        // In Int128: 8 × a capacity near `Int.max` would overflow.
        Int(Int128(capacity - window) * 8 / 10)
    }

    /// Grows (or shrinks) the window by `change` entries, within one entry and the capacity less one.
    /// A smaller window's least recently used entries go to probation (the newest there); a larger
    /// window takes main's least recently used entries (probation's, then protected's), so that it
    /// is full at once. Protected, whose limit follows, demotes its own to probation.
    mutating func resizeWindow(by change: Int) {
        let limit = min(max(1, windowLimit + change), max(1, capacity - 1))
        guard limit != windowLimit, !nodes.isEmpty else { return }
        windowLimit = limit
        protectedLimit = Self.protectedLimit(capacity: capacity, window: limit)
        while windowCount > windowLimit { moveOldest(of: .window, to: .probation) }
        while protectedCount > protectedLimit { moveOldest(of: .protected, to: .probation) }
        while windowCount < windowLimit {
            if !isEmpty(.probation) {
                moveOldest(of: .probation, to: .window)
            } else if !isEmpty(.protected) {
                moveOldest(of: .protected, to: .window)
            } else {
                break
            }
        }
    }

    // MARK: The lists

    /// The entry at `node` becomes the most recently used of its list — or, from probation, of
    /// protected (whose least recently used entry then falls back to probation if protected is full).
    @inlinable
    mutating func move(_ node: Int) {
        let segment = nodes[node].segment
        if segment == .probation {
            unlink(node)
            link(node, into: .protected)
            if protectedCount > protectedLimit { moveOldest(of: .protected, to: .probation) }
        } else if node != Int(nodes[segment.sentinel].older) {
            unlink(node)
            link(node, into: segment)
        }
    }

    /// Moves the least recently used entry of list `from` (not empty) to the most recent end of `to`.
    @inlinable
    mutating func moveOldest(of from: Segment, to: Segment) {
        let oldest = Int(nodes[from.sentinel].newer)
        unlink(oldest)
        link(oldest, into: to)
    }

    /// Whether list `segment` holds no entry.
    func isEmpty(_ segment: Segment) -> Bool { nodes[segment.sentinel].newer == Int32(segment.sentinel) }

    /// Puts the entry at `node` at the most recent end of list `segment`.
    @inlinable
    mutating func link(_ node: Int, into segment: Segment) {
        let sentinel = segment.sentinel
        let newest = nodes[sentinel].older
        nodes[node].segment = segment
        nodes[node].older = newest
        nodes[node].newer = Int32(sentinel)
        nodes[Int(newest)].newer = Int32(node)
        nodes[sentinel].older = Int32(node)
        count(segment, 1)
    }

    /// Takes the entry at `node` off its list.
    @inlinable
    mutating func unlink(_ node: Int) {
        let (newer, older) = (nodes[node].newer, nodes[node].older)
        nodes[Int(newer)].older = older
        nodes[Int(older)].newer = newer
        count(nodes[node].segment, -1)
    }

    /// Counts `change` entries on list `segment` (only the window's and protected's are kept).
    @inlinable
    mutating func count(_ segment: Segment, _ change: Int) {
        if segment == .window {
            windowCount += change
        } else if segment == .protected {
            protectedCount += change
        }
    }

    /// The bytes the policy's buffers hold (by their capacity).
    @usableFromInline var bufferBytes: Int {
        bytes(of: nodes) + bytes(of: sketch.words) + bytes(of: reads) + bytes(of: readHashes)
            + (history?.bufferBytes ?? 0)
    }
}
