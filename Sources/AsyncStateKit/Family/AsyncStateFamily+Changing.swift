import Foundation

extension AsyncStateFamily {
    // MARK: Warm restarts

    /// Every entry's data saved for a warm restart, by key (entries without a value are left out),
    /// like ``AsyncState/archive``.
    @inlinable
    public var archive: [Key: AsyncStateArchive<Value>] {
        var archives: [Key: AsyncStateArchive<Value>] = [:]
        for node in core.entries {
            guard let saved = node.archived, let value = saved.value else { continue }
            archives[node.key] = AsyncStateArchive(
                value: value, phase: saved.isEmpty ? .empty : .success, lastSuccess: saved.lastSuccess)
        }
        return archives
    }

    /// Loads data saved by ``archive`` as stale data, like ``AsyncState/restore(_:)``: a key that
    /// already has a value or a fetch in flight keeps it. The family's capacity holds: restoring more
    /// keys than it holds evicts as using them would.
    ///
    /// - Returns: How many keys were restored.
    /// - Throws: ``AsyncStateArchiveError`` if any archive has an unknown format version or phase;
    ///   then none is restored.
    @discardableResult
    @inlinable
    public func restore(_ archives: [Key: AsyncStateArchive<Value>]) throws(AsyncStateArchiveError) -> Int {
        var valid: [(Key, AsyncStateArchive<Value>)] = []
        valid.reserveCapacity(archives.count)
        for (key, archive) in archives { valid.append((key, try archive.validated())) }
        var restored = 0
        for (key, archive) in valid {
            let done = core.usingNow(key) { store in
                store.restore(archive.value, isEmpty: archive.phase == .empty, lastSuccess: archive.lastSuccess)
            }
            if done { restored += 1 }
        }
        return restored
    }

    /// Writes `value` for `key`, fresh from now, like ``AsyncState/set(_:)`` (a fetch in flight for the
    /// key ends and its callers get `value`). Reports the value it replaced, if any, as
    /// ``AsyncStateFamilyRemovalReason/replaced``.
    ///
    /// This replica's memory only: to write the value into the second level too and announce it to
    /// the other replicas, use ``AsyncStateInvalidator/set(_:for:in:topic:)``.
    @inlinable
    public func set(_ value: Value, for key: Key) {
        if let previous = core.set(value, for: key, version: 0) { core.reportReplaced(key, previous) }
    }

    /// Marks `key`'s data expired, like ``AsyncState/invalidate()``; no entry, nothing to do.
    @inlinable
    public func invalidate(_ key: Key) {
        core.invalidate(key)
    }

    /// Cancels `key`'s fetch in flight, like ``AsyncState/cancel()``.
    @inlinable
    public func cancel(_ key: Key) {
        core.cancel(key)
    }

    /// Removes `key`'s entry: its fetch in flight is cancelled (its callers get `CancellationError`),
    /// its `updates(for:)` streams finish, and `onRemoval` is told. Returns whether there was one.
    @discardableResult
    @inlinable
    public func remove(_ key: Key) -> Bool {
        core.remove(key)
    }

    // MARK: Changing every key

    /// Marks the data of every key that `isIncluded` accepts expired.
    @inlinable
    public func invalidate(where isIncluded: (Key) throws -> Bool) rethrows {
        try core.invalidate(where: isIncluded)
    }

    /// Marks expired the data of every entry carrying `tag` (see the family's `tags:`), like
    /// ``invalidate(_:)`` does each, and returns how many entries that was. A tag no entry carries,
    /// or a family without `tags:`, changes nothing.
    ///
    /// It costs O(entries carrying the tag + entries in use): compact entries are found in the
    /// family's tag index; entries in use (live), whose values change in their own stores, are each
    /// asked for their current tags. An entry in use with a fetch in flight is expired too, as
    /// ``invalidate(_:)`` expires a fetch in flight: its result may carry the tag.
    ///
    /// The observer hears ``AsyncStateEvent/Kind/invalidated`` for each entry, then one
    /// ``AsyncStateEvent/Kind/invalidatedTag(_:entries:)``.
    @discardableResult
    @inlinable
    public func invalidate(tag: String) -> Int {
        core.invalidate(tag: tag)
    }

    /// Marks every key's data expired.
    @inlinable
    public func invalidateAll() {
        core.invalidate { _ in true }
    }

    /// Removes every entry, as ``remove(_:)`` does each.
    @inlinable
    public func removeAll() {
        core.removeAll()
    }
}
