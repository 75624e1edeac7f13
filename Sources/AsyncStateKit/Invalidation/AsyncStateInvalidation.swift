/// A message that data changed at its source: everything under `topic`, or one `key` of it.
///
/// Replicas of a service send these to each other through an ``AsyncStateInvalidationBus`` so that a
/// change made through one replica is refetched by all of them. Applying one marks data expired,
/// which is idempotent: a bus may deliver a message more than once.
public struct AsyncStateInvalidation: Sendable, Hashable, Codable, CustomStringConvertible {
    /// What changed: a name the states that hold it subscribed to (`"config"`, `"profiles"`).
    public var topic: String
    /// One key of a family subscribed to `topic` (its `String(describing:)`); `nil` for everything
    /// under the topic.
    public var key: String?

    /// A message about `topic`, or one `key` of it.
    public init(topic: String, key: String? = nil) {
        self.topic = topic
        self.key = key
    }

    /// `topic` or `topic/key`.
    public var description: String { key.map { "\(topic)/\($0)" } ?? topic }
}

/// What a bus delivers to its replica.
public enum AsyncStateInvalidationDelivery: Sendable, Hashable {
    /// Another replica invalidated this.
    case invalidate(AsyncStateInvalidation)
    /// The bus was disconnected and is connected again: messages sent meanwhile may be lost, so every
    /// subscribed state is invalidated.
    case reconnected
}

/// Carries invalidations between the replicas of a service: PostgreSQL's LISTEN/NOTIFY, a Redis
/// channel, or `InMemoryInvalidationNetwork` (in AsyncStateTesting) in tests. A bus is this library's only seam to them;
/// ``AsyncStateInvalidator`` does the rest.
///
/// A bus delivers at least once what other replicas publish (a replica does not need its own
/// messages: it applied them when it published), and ``AsyncStateInvalidationDelivery/reconnected``
/// after any gap in which messages may have been lost.
public protocol AsyncStateInvalidationBus: Sendable {
    /// Sends `invalidation` to the other replicas.
    func publish(_ invalidation: AsyncStateInvalidation) async throws
    /// What the other replicas publish, and reconnections, in order; the stream ends when the bus
    /// shuts down.
    func deliveries() -> AsyncStream<AsyncStateInvalidationDelivery>
}
