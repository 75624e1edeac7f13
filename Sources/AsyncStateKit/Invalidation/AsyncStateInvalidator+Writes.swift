import Foundation

/// Writes that reach the fleet: a value written through one replica is stored in the second level
/// under a new version and announced with that version, so that the other replicas take it from
/// there without asking their source.
extension AsyncStateInvalidator {
    /// Writes `value` for `key` in `family` here, in the family's second level, and on the other
    /// replicas: for a service that changed its source and knows the new value.
    ///
    /// The value is stored in the family's second level under a new version
    /// (``AsyncStateSecondLevel/put(for:entry:)``), written here at that version (as
    /// ``AsyncStateFamily/set(_:for:)`` writes, fresh from now), and announced on `topic` with it, as
    /// ``invalidate(_:key:)`` announces a change: every replica subscribed to `topic` drops its older
    /// data for the key, and its next read takes the written value from the second level — no source
    /// call on any replica. A replica that already holds that version (or a newer one) ignores the
    /// message. Other subscribers of `topic` on this replica are invalidated as the message
    /// invalidates them.
    ///
    /// Without a second level, or when it fails or cannot `put`, the key is marked stale there as
    /// ``invalidate(_:key:)`` marks it: this replica still holds `value`, and the others load the key
    /// from the source once for the fleet. What the bus or the second level does not take is kept
    /// and sent again, as ``invalidate(_:key:)``'s messages are (see ``Recovery``).
    ///
    /// - Returns: Whether everything was sent, or some of it queued.
    /// - Throws: Without a ``Recovery``, the bus's error when it could not publish; the value is
    ///   written here, and in the second level if it could be, anyway.
    @discardableResult
    public func set<Key, Value>(
        _ value: Value, for key: Key, in family: AsyncStateFamily<Key, Value>, topic: String
    ) async throws -> Outcome {
        let core = family.core
        let message = AsyncStateInvalidation(topic: topic, key: String(describing: key), metadata: metadata?())
        return try await announce(message) { target, subscribers in
            if let secondLevel = core.secondLevel,
                let version = await secondLevel.put(value, key: secondLevel.key(of: key))
            {
                return .marked(version: version)
            }
            return await self.markSecondLevels(target, of: subscribers)
        } write: { version in
            if let previous = core.set(value, for: key, version: version ?? 0) { core.reportReplaced(key, previous) }
        }
    }

    /// Writes `value` into `state` here, into its second level, and on the other replicas: as
    /// ``set(_:for:in:topic:)`` does for a family's key. The message names no key (a state is a
    /// topic's whole content), so a family subscribed to `topic` drops every entry.
    ///
    /// - Returns: Whether everything was sent, or some of it queued.
    /// - Throws: Without a ``Recovery``, the bus's error when it could not publish.
    @discardableResult
    public func set<Value>(_ value: Value, in state: AsyncState<Value>, topic: String) async throws -> Outcome {
        let (store, secondLevel) = (state.store, state.secondLevel)
        let message = AsyncStateInvalidation(topic: topic, metadata: metadata?())
        return try await announce(message) { target, subscribers in
            if let secondLevel, let version = await secondLevel.put(value, key: secondLevel.stateKey) {
                return .marked(version: version)
            }
            return await self.markSecondLevels(target, of: subscribers)
        } write: { version in
            store.set(value, version: version ?? 0)
        }
    }
}
