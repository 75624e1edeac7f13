import Foundation

/// What a shard's entries weigh: each entry's weight by slot, the shard's sum, and the family's
/// ``WeightLedger``, kept in step (see ``FamilyCore/trim(after:)``).
extension FamilyShard {
    /// Weighs the entry at `slot` again (its value may have changed). Without a weigher, nothing.
    @inlinable mutating func weigh(_ slot: Int) {
        guard let weigher else { return }
        let weight = value(at: slot).map { max(0, weigher(table.key(at: slot), $0)) } ?? 0
        setWeight(weight, of: slot)
    }

    /// Sets the weight of the entry at `slot`, in this shard's total and the family's ledger.
    @inlinable mutating func setWeight(_ weight: Int, of slot: Int) {
        guard weigher != nil else { return }
        let change = Int128(weight) - Int128(weights[slot])
        guard change != 0 else { return }
        weights[slot] = weight
        totalWeight += change
        ledger?.add(change)
    }
}
