/// An approximate count of how often each key was used recently: a count-min sketch of 4-bit
/// counters that halves every counter once it has counted ten times its capacity (so old popularity
/// fades), as TinyLFU describes (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache
/// Admission Policy", 2017).
///
/// A key's four counters lie in one 64-byte block (eight words of sixteen counters), one counter in
/// each of four of its words, so that counting a use touches one cache line. The estimate is the
/// smallest of the four: collisions only ever overestimate. A use raises only the counters equal to
/// that smallest one (a conservative update, Estan and Varghese 2002): a counter then never exceeds
/// the largest estimate among the keys that share it, where a plain count-min sketch adds up all
/// their uses (what that gains: Benchmarks/README.md, "Why the code is shaped so").
///
/// The sketch grows with the cache rather than being sized for its capacity up front (Caffeine's
/// `ensureCapacity`): it starts with room for ``minimumCapacity`` entries and doubles as entries
/// arrive (``grow(toHold:)``), up to the capacity, so that memory follows the entries held. Doubling
/// loses no count: a key's block is read from the low bits of its mixed hash and its counters from
/// the high ones, so the doubled table is the old one twice — each key finds its counters in the
/// copy its one more bit picks, with the values they had.
@usableFromInline
struct FrequencySketch {
    /// Eight words per block; a power of two of blocks.
    @usableFromInline var words: [UInt64]
    @usableFromInline var blockMask: Int
    /// Uses counted since the last halving, and how many trigger the next.
    @usableFromInline var counted = 0
    @usableFromInline let sampleSize: Int
    /// The most entries the sketch is ever sized for: the cache's capacity.
    let maximumCapacity: Int

    /// The entries a new sketch has room for.
    static var minimumCapacity: Int { 16 }

    /// A sketch for a cache of at most `capacity` entries, sized for ``minimumCapacity`` of them
    /// until it grows.
    init(capacity: Int) {
        maximumCapacity = max(capacity, Self.minimumCapacity)
        words = Array(repeating: 0, count: Self.minimumCapacity)
        blockMask = Self.minimumCapacity / 8 - 1
        sampleSize = Self.sampleSize(for: maximumCapacity)
    }

    /// How many uses are counted between two halvings: ten times the capacity (saturating), from the
    /// start. Counts only matter once the cache is full, and the sketch is full-sized by then; a
    /// smaller sample while it grows would age what it learned while the cache filled.
    static func sampleSize(for capacity: Int) -> Int {
        let (size, overflow) = capacity.multipliedReportingOverflow(by: 10)
        return overflow ? .max : size
    }

    /// How many entries the sketch is sized for now (a counter of each row per entry).
    var sizedFor: Int { words.count }

    /// How many times the entries held the sketch is sized for while it grows: a sketch no larger
    /// than the entries would count the uses seen while the cache fills with many collisions, and
    /// its estimates would carry them once it is full-sized.
    static var headroom: Int { 4 }

    /// Grows the sketch, doubling it, until it is sized for ``headroom`` times `count` entries, or
    /// for the capacity. Amortized O(1) per entry; the counts are kept (see the type's
    /// documentation).
    mutating func grow(toHold count: Int) {
        let target = min(count.multipliedReportingOverflow(by: Self.headroom).partialValue, maximumCapacity)
        while sizedFor < target, sizedFor <= Int.max / 4 {
            words.append(contentsOf: words)
            blockMask = blockMask &* 2 &+ 1
        }
    }

    /// Counts one use of the key with hash `hash`: raises its smallest counters (saturating at 15).
    @inlinable
    mutating func increment(_ hash: Int) {
        let spread = KeyHash.mix(hash)
        let base = (Int(truncatingIfNeeded: spread) & blockMask) &* 8
        let smallest = UInt64(estimate(hash))
        guard smallest != 0xF else { return }
        words.withUnsafeMutableBufferPointer { words in
            for row in 0..<4 {
                let (word, shift) = Self.position(spread, row: row)
                let counter = words.baseAddress! + (base &+ word)  // within the block: in bounds
                if (counter.pointee >> shift) & 0xF == smallest { counter.pointee &+= 1 << shift }
            }
        }
        counted += 1
        if counted >= sampleSize { halve() }
    }

    /// The estimated number of recent uses of the key with hash `hash` (0 to 15).
    @inlinable
    func estimate(_ hash: Int) -> Int {
        let spread = KeyHash.mix(hash)
        let block = Int(truncatingIfNeeded: spread) & blockMask
        var smallest = 15
        for row in 0..<4 {
            let (word, shift) = Self.position(spread, row: row)
            smallest = min(smallest, Int((words[block * 8 + word] >> shift) & 0xF))
        }
        return smallest
    }

    /// Halves every counter: recent uses weigh more than old ones.
    @usableFromInline
    mutating func halve() {
        for index in words.indices { words[index] = (words[index] >> 1) & 0x7777_7777_7777_7777 }
        counted /= 2
    }

    /// The word (0 to 7, a different pair per row) and bit shift of row `row`'s counter.
    @inlinable
    static func position(_ spread: UInt64, row: Int) -> (word: Int, shift: UInt64) {
        // Rows 0–3 use words 0–1, 2–3, 4–5, 6–7: one bit picks the word, four bits the counter.
        let bits = spread >> (32 + 5 * UInt64(row))
        return (row * 2 + Int(bits & 1), ((bits >> 1) & 0xF) * 4)
    }
}
