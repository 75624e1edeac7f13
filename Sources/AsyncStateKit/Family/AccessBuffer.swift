/// What readers on one stripe of a family's shard saw, once the shard's lock has spread (see
/// ``ReadMostlyLock``): the hits they answered, for the shard to note in their order
/// (``FamilyShard/absorb(_:into:)``), as Caffeine's striped read buffers are.
///
/// A reader on a stripe may not change the shard, which readers on other stripes read at the same
/// time: it writes its hit here, on memory no other processor writes. Once the buffer is half full,
/// the reader that holds it folds it into the shard if the shard's mutex is free; if a writer or
/// another stripe's reader has it, the reader goes on, and once the buffer is full, further hits are
/// dropped until it is folded in: under contention the policy works from a sample of the hits, as it
/// does from its own read buffer (see ``TinyLFUPolicy``). A shard with an idle expiry drops none:
/// a dropped hit would be an access its idle expiry missed, an entry in use removed as idle. The
/// next reader of a full buffer waits for the mutex and folds it in before it reads (holding the
/// stripe from then on, so that no other reader fills it meanwhile). Every writer folds every
/// buffer in first, so no change to the shard and no eviction or idle sweep decides on a shard that
/// is missing a hit still held here.
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

    @inlinable init() {
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

    /// Notes a hit on `slot` at `now`, or drops it if the buffer is full. `lossless` says whether the
    /// shard may lose none (then a full buffer is folded in before the next hit: ``mustAbsorb``).
    @inlinable @inline(__always)
    mutating func append(_ slot: Int32, hash: Int, at now: Duration, lossless: Bool) {
        isLossless = lossless
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
}

extension FamilyShard: StripeReadable {
    @usableFromInline typealias StripeLocal = AccessBuffer

    /// Notes the hits that readers on one stripe answered (see ``AccessBuffer``), in order, as hits
    /// answered under the shard's lock are (``noteHit(_:hash:at:in:)``): in the policy and the last
    /// accesses, which readers never read (a hit's look-up reads the table, the entries' cells and
    /// the compact entries' metadata), so this may run while readers hold the shard's other stripes.
    @inlinable
    static func absorb(_ local: inout AccessBuffer, into shard: UnsafeMutablePointer<Self>) {
        guard local.count > 0 else { return }
        local.drain { access in noteHit(access.slot, hash: access.hash, at: access.at, in: shard) }
    }
}
