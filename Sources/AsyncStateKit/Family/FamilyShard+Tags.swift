import Foundation

/// A shard's tag index: which compact entries carry each tag, and the live entries, whose tags are
/// read when a tag is invalidated (see ``AsyncStateFamily/invalidate(tag:)``).
extension FamilyShard {
    // MARK: Tags

    /// Files the compact entry at `slot` under `tags` (without duplicates).
    @inlinable mutating func tag(_ slot: Int32, with tags: [String]) {
        guard !tags.isEmpty else { return }
        tagsBySlot[slot] = tags
        for tag in tags { tagged[tag, default: []].insert(slot) }
    }

    /// Takes the entry at `slot` out of the tag index.
    @inlinable mutating func untag(_ slot: Int32) {
        guard let tags = tagsBySlot.removeValue(forKey: slot) else { return }
        for tag in tags {
            tagged[tag]?.remove(slot)
            if tagged[tag]?.isEmpty == true { tagged[tag] = nil }
        }
    }

    /// Marks expired every entry carrying `tag`: the compact ones here (their keys added to
    /// `compact`), found in the index; the live ones' stores added to `live`, for the caller to
    /// invalidate: those whose current value carries the tag, and those with a fetch in flight, whose
    /// result may (as a key's invalidation expires the fetch in flight). O(compact entries tagged +
    /// live entries).
    @inlinable mutating func invalidate(
        tag: String, at now: Duration, compact: inout [Key], live: inout [Store]
    ) {
        guard let tagger else { return }
        let expiry = configuration.expiry
        for slot in tagged[tag] ?? [] {
            settle(Int(slot)) { _ = $0.invalidate(now: now, expiry: expiry) }
            compact.append(table.key(at: Int(slot)))
        }
        for slot in liveSlots {
            guard let store = table.records[table.at(Int(slot))].store else { continue }
            if store.hasFlight || store.cell.value.map({ tagger(table.key(at: Int(slot)), $0).contains(tag) }) == true {
                live.append(store)
            }
        }
    }

    /// The number of compact entries filed under each tag and the live entries tracked (for tests).
    @inlinable var tagIndexSizes: (tags: Int, filed: Int, live: Int) {
        (tagged.count, tagsBySlot.count, liveSlots.count)
    }
}
