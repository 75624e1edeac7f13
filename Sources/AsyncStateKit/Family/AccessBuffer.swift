/// What readers on one stripe of a family's shard saw, once the shard's lock has spread (see
/// ``ReadMostlyLock``): the hits they answered, for the next writer to note in the shard, in their
/// order (``FamilyShard/absorb(_:)``), as Caffeine's striped read buffers are.
///
/// A reader on a stripe may not change the shard, which readers on other stripes read at the same
/// time: it writes its hit here, on memory no other processor writes. The buffer holds
/// ``capacity`` hits; once full, the reader that filled it has a writer absorb every stripe if the
/// shard's mutex is free, and further hits are dropped until one does. A dropped hit is one access
/// the policy and the idle expiry do not see, as the policy's own read buffer drops the hits it has
/// no room for (see ``TinyLFUPolicy``): under contention the policy works from a sample of the hits.
/// Every writer absorbs the buffers first, so no change to the shard and no eviction or idle sweep
/// decides on a shard that is missing a hit still held here.
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

    /// Whether the buffer is full.
    @inlinable var wantsAbsorbing: Bool { count >= Self.capacity }

    /// Notes a hit on `slot` at `now`, or drops it if the buffer is full.
    @inlinable @inline(__always)
    mutating func append(_ slot: Int32, hash: Int, at now: Duration) {
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

    /// A full buffer is absorbed under the mutex every few hits, which would cost every reader a
    /// cache miss if the mutex shared a line with what they read.
    @inlinable static var isolatesMutex: Bool { true }

    /// Notes the hits that readers on one stripe answered (see ``AccessBuffer``): in the policy and
    /// the last accesses, which readers never read (the look-up reads the table, the entries' cells
    /// and their metadata), so this may run while readers hold the shard's other stripes.
    @inlinable
    mutating func absorb(_ local: inout AccessBuffer) {
        guard local.count > 0 else { return }
        local.drain { access in hit(access.slot, hash: access.hash, at: access.at) }
    }
}
