/// A key's hash as the family's structures use it: mixed, so that every bit depends on every bit of
/// the key's `hashValue`. A `Hasher` value is already well mixed, but a key type's own `hashValue`
/// may not be (it may leave the upper bits zero, as may a 32-bit `Int`). The record table takes a
/// key's home and its index tag from it, and the frequency sketch its block and counters: one mixer,
/// so that no structure depends on how well a key type hashes.
@usableFromInline
enum KeyHash {
    /// `hash`, mixed (the finalizer of MurmurHash3's 64-bit variant).
    @inlinable
    static func mix(_ hash: Int) -> UInt64 {
        var x = UInt64(bitPattern: Int64(hash))
        x = (x ^ (x >> 33)) &* 0xFF51_AFD7_ED55_8CCD
        x = (x ^ (x >> 33)) &* 0xC4CE_B9FE_1A85_EC53
        return x ^ (x >> 33)
    }
}
