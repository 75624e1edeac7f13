/// What a ``TinyLFUPolicy`` remembers of the keys it evicted lately, to size its window: the hashes of
/// the last few keys it **refused** (a candidate the window pushed out that lost to main's victim) and
/// of the last few it **displaced** from main (a victim that lost to a candidate, or main's least
/// recently used entry). A key that comes back while remembered is a mistake of the current split: a
/// refused key back would have still been in a larger window; a displaced key back would have still
/// been in a larger main. The policy moves the boundary one entry towards the side that would have
/// kept it (see ``TinyLFUPolicy/admit(_:hash:entries:)``). This is ARC's rule (Megiddo and Modha,
/// "ARC: A Self-Tuning, Low Overhead Replacement Cache", FAST 2003), with its ghost lists turned from
/// recency-vs-frequency lists into the window-vs-main split of W-TinyLFU.
///
/// Each side is a ring of ``limit`` hashes, the oldest overwritten first, and one ``SlotIndex`` finds
/// a hash in either ring (ring positions `0..<limit` are the refused keys', `limit..<2 × limit` the
/// displaced ones'). Hashes stand for keys: two keys with the same hash are one key here, which only
/// ever moves the boundary by one entry more or less. Made at the first eviction, sized for the
/// entries held then (a family below its capacity never evicts, and pays nothing for it).
struct EvictionHistory {
    /// The remembered hashes: the refused keys' ring, then the displaced keys' ring.
    private var hashes: [Int]
    /// Where each ring writes next (a position in `0..<limit`).
    private var next = (refused: 0, displaced: 0)
    /// The ring position of each remembered hash.
    private var index = SlotIndex()
    /// How many keys each side remembers.
    let limit: Int

    /// A history that remembers `limit` (at least one) keys of each side.
    init(limit: Int) {
        self.limit = max(1, limit)
        hashes = Array(repeating: 0, count: self.limit * 2)
    }

    /// How many keys each side remembers for a shard of `entries` entries: a tenth of them. A key
    /// that comes back after more evictions than that of its side is not seen as a mistake, so the
    /// window does not grow for reuse that far apart. Measured on the real traces (Benchmarks/README.md,
    /// "Why the code is shaped so"): from a hundredth to a tenth of the entries did as well; a quarter
    /// and more did worse (they remember mistakes too old to say anything about the traffic now).
    static func limit(forEntries entries: Int) -> Int { max(1, entries / 10) }

    /// Remembers the key with `hash`, evicted: refused at admission if `refused`, else displaced from
    /// main. Its side's oldest key is forgotten if that side is full.
    mutating func remember(_ hash: Int, refused: Bool) {
        let position = refused ? next.refused : limit + next.displaced
        if refused { next.refused = (next.refused + 1) % limit } else { next.displaced = (next.displaced + 1) % limit }
        // Forget what was at the position (nothing if it was taken back already).
        index.remove(hashes[position], position: Int32(position))
        if let earlier = index.find(hash, where: { hashes[Int($0)] == hash }) {
            index.remove(hash, position: earlier)
        }
        hashes[position] = hash
        index.insert(hash, position: Int32(position))
    }

    /// Whether the key with `hash` was remembered, and on which side (`true`: refused); it is
    /// forgotten (one return counts once). `nil` for a key not remembered.
    mutating func takeBack(_ hash: Int) -> Bool? {
        guard let position = index.find(hash, where: { hashes[Int($0)] == hash }) else { return nil }
        index.remove(hash, position: position)
        return Int(position) < limit
    }

    /// The bytes the history holds (by capacity).
    var bufferBytes: Int { bytes(of: hashes) + bytes(of: index.buckets) }
}
