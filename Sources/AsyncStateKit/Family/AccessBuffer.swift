/// What readers on one stripe of a family's shard saw, once the shard's lock has spread (see
/// ``ReadMostlyLock``): the hits they answered, for the shard to note in their order
/// (``FamilyShard/absorb(_:into:)``), as Caffeine's striped read buffers are.
///
/// A reader on a stripe may not change the shard, which readers on other stripes read at the same
/// time: it writes its hit here, on memory no other processor writes. Once the buffer is half full,
/// the reader that holds it folds it into the shard if the shard's mutex is free; if a writer or
/// another stripe's reader has it, the reader goes on, and once the buffer is full, further hits are
/// dropped until it is folded in. A shard with an idle expiry drops none: a dropped hit would be an
/// access its idle expiry missed, an entry in use removed as idle. The next reader of a full buffer
/// waits for the mutex and folds it in before it reads (holding the stripe from then on, so that no
/// other reader fills it meanwhile). Every writer folds every buffer in first, so no change to the
/// shard and no eviction or idle sweep decides on a shard that is missing a hit still held here.
///
/// **Sampling while processors contend.** Folding hits in writes the policy's memory, which then
/// moves from processor to processor with every fold: with two processors reading one hot shard,
/// the policy's share of a hit took a quarter of the throughput (`HitScaling family-1k`). So while
/// processors contend for the shard, a buffer notes one hit in ``sampleInterval``, drawn at random
/// (a fixed stride would always skip the same keys of a loop over them), and the policy works from
/// a sample of the hits, as Caffeine's does once its read buffers overflow. Contention is judged at
/// each fold: the buffer folded in before this one, with hits, was another stripe's, and its newest
/// hit was less than ``contendedGap`` before this one's (``FamilyShard/lastAbsorbedStripe``): hits
/// arriving from several processors faster than a buffer's worth in that time. A fold that follows
/// the same stripe's, or comes later, turns sampling off again, so a shard read on many processors
/// at a modest rate notes every hit. A shard with an idle expiry never samples.
@usableFromInline
struct AccessBuffer: StripeLocalStorage {
    /// A hit: the entry's slot, its key's hash, and when.
    @usableFromInline
    struct Access {
        @usableFromInline var slot: Int32
        @usableFromInline var hash: Int
        @usableFromInline var at: Duration

        @inlinable init(slot: Int32, hash: Int, at: Duration) {
            (self.slot, self.hash, self.at) = (slot, hash, at)
        }
    }

    /// The hits a buffer holds.
    @inlinable static var capacity: Int { 64 }

    /// The number of hits held.
    @usableFromInline var count = 0
    /// The hits, in the first `count` places (a tuple: the stripe's memory, not an array's).
    @usableFromInline var entries: (Sixteen, Sixteen, Sixteen, Sixteen)
    /// Sixteen hits.
    @usableFromInline typealias Sixteen = (
        Access, Access, Access, Access, Access, Access, Access, Access, Access, Access, Access, Access, Access,
        Access, Access, Access
    )

    @inlinable init(stripe: Int) {
        self.stripe = Int32(truncatingIfNeeded: stripe)
        let none = Access(slot: 0, hash: 0, at: .zero)
        let sixteen: Sixteen = (
            none, none, none, none, none, none, none, none, none, none, none, none, none, none, none, none
        )
        entries = (sixteen, sixteen, sixteen, sixteen)
    }

    /// Whether the hits noted may not be dropped (the shard has an idle expiry).
    @usableFromInline var isLossless = false

    /// Whether the buffer is half full.
    @inlinable var wantsAbsorbing: Bool { count >= Self.capacity / 2 }

    /// Whether the buffer is full and its hits may not be dropped.
    @inlinable var mustAbsorb: Bool { isLossless && count >= Self.capacity }

    /// The stripe this buffer belongs to.
    @usableFromInline let stripe: Int32
    /// Whether the buffer notes one hit in ``sampleInterval``: set at each fold (see the type's
    /// documentation).
    @usableFromInline var isSampling = false
    /// The state of the random draws that choose which hits a sampling buffer notes (xorshift64:
    /// any state but 0).
    @usableFromInline var draws: UInt64 = 0x9E37_79B9_7F4A_7C15
    /// One hit in this many is noted while sampling (a power of two).
    @inlinable static var sampleInterval: UInt64 { 8 }
    /// Folds from different stripes closer than this mean contention (see the type's
    /// documentation): with half a buffer a fold, hits from several processors at over about
    /// 640,000 a second.
    @inlinable static var contendedGap: Duration { .microseconds(50) }

    /// The instant of the newest hit held (the buffer holds some). Mutating only so that the hits
    /// are read in place, not copied.
    @inlinable
    mutating func newestAccess() -> Duration {
        let newest = count - 1
        return withUnsafeMutableBytes(of: &entries) { bytes in
            bytes.baseAddress.unsafelyUnwrapped.assumingMemoryBound(to: Access.self)[newest].at
        }
    }

    /// Notes a hit on `slot` at `now`, or drops it if the buffer is full, or if it samples and the
    /// draw skips it. `lossless` says whether the shard may lose none (then a full buffer is folded in
    /// before the next hit: ``mustAbsorb``, and it never samples).
    @inlinable @inline(__always)
    mutating func append(_ slot: Int32, hash: Int, at now: Duration, lossless: Bool) {
        isLossless = lossless
        if isSampling && !lossless {
            draws ^= draws << 13
            draws ^= draws >> 7
            draws ^= draws << 17
            guard draws & (Self.sampleInterval - 1) == 0 else { return }
        }
        guard count < Self.capacity else { return }
        withUnsafeMutableBytes(of: &entries) { bytes in
            bytes.baseAddress.unsafelyUnwrapped.assumingMemoryBound(to: Access.self)[count] =
                Access(slot: slot, hash: hash, at: now)
        }
        count &+= 1
    }

    /// Calls `body` with every hit held, in order, and empties the buffer.
    @inlinable
    mutating func drain(_ body: (Access) -> Void) {
        let held = count
        count = 0
        withUnsafeBytes(of: &entries) { bytes in
            let accesses = bytes.baseAddress.unsafelyUnwrapped.assumingMemoryBound(to: Access.self)
            for index in 0..<held { body(accesses[index]) }
        }
    }

    /// Whether this buffer, folded in now, shows processors contending for its shard (see the type's
    /// documentation): the buffer folded in before it, with hits, was another stripe's
    /// (`previousStripe`, -1 for none), and that one's newest hit (`previousNewest`) was less than
    /// ``contendedGap`` before this one's. The one rule of when a buffer samples.
    @inlinable
    mutating func showsContention(previousStripe: Int32, previousNewest: Duration) -> Bool {
        previousStripe >= 0 && previousStripe != stripe && newestAccess() - previousNewest < Self.contendedGap
    }
}
