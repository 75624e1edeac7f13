/// Connects states and families to an ``AsyncStateInvalidationBus``: subscribes them to topics,
/// invalidates them when another replica says so — every one of them when the bus reconnects after a
/// gap — and publishes this replica's invalidations.
///
/// ```swift
/// let invalidator = AsyncStateInvalidator(bus: bus)
/// invalidator.subscribe($config, to: "config")
/// invalidator.subscribe($tenants, to: "tenants")        // a family: a message may name one key
///
/// // A write through this replica: invalidate here and on every other replica.
/// try await invalidator.invalidate("tenants", key: "\(tenantID)")
///
/// // In a service's run(): applies deliveries until cancelled.
/// await invalidator.run()
/// ```
///
/// Subscriptions do not keep their states alive: a state that is gone is dropped from its topic.
/// What a reader may see: a replica serves the old value until the message reaches it (for a lost
/// message, until the bus reconnects), and never past the state's own expiry.
public final class AsyncStateInvalidator: Sendable {
    /// The bus.
    public let bus: any AsyncStateInvalidationBus
    private let subscriptions = LockedValue<[String: [Subscription]]>([:])
    private let applied = LockedValue(0)

    /// How many deliveries this invalidator has applied (from the bus or ``apply(_:)``), for metrics
    /// and tests.
    public var deliveriesApplied: Int { applied.withLock { $0 } }

    /// One subscribed state or family, held weakly.
    private struct Subscription: Sendable {
        /// Whether the subscriber still exists.
        let isAlive: @Sendable () -> Bool
        /// Invalidates the subscriber: one key, or all; `false` once it is gone.
        let invalidate: @Sendable (_ key: String?) -> Bool
    }

    /// An invalidator over `bus`.
    public init(bus: any AsyncStateInvalidationBus) {
        self.bus = bus
    }

    /// Subscribes `state` to `topic`: a message about the topic (with or without a key) invalidates it.
    public func subscribe<Value>(_ state: AsyncState<Value>, to topic: String) {
        let store = WeakBox(state.store)
        add(
            topic, isAlive: { store.value != nil },
            invalidate: { _ in
                guard let store = store.value else { return false }
                store.invalidate()
                return true
            })
    }

    /// Subscribes `family` to `topic`: a message with a key invalidates every entry whose key
    /// describes as it (`String(describing:)`, which every entry is compared with — two keys that
    /// describe alike are both invalidated, never one left stale); one without, every entry.
    public func subscribe<Key, Value>(_ family: AsyncStateFamily<Key, Value>, to topic: String) {
        subscribe(family, to: topic) { key, core in core.entries.lazy.map(\.key).filter { "\($0)" == key } }
    }

    /// Subscribes `family` to `topic`, reading a message's key with `Key(_:)` (one lookup, whatever
    /// the family's size); a key that does not parse invalidates nothing.
    public func subscribe<Key: LosslessStringConvertible, Value>(
        _ family: AsyncStateFamily<Key, Value>, to topic: String
    ) {
        subscribe(family, to: topic) { key, _ in Key(key).map { [$0] } ?? [] }
    }

    private func subscribe<Key, Value>(
        _ family: AsyncStateFamily<Key, Value>, to topic: String,
        parse: @escaping @Sendable (String, FamilyCore<Key, Value>) -> [Key]
    ) {
        let core = WeakBox(family.core)
        add(
            topic, isAlive: { core.value != nil },
            invalidate: { key in
                guard let core = core.value else { return false }
                if let key {
                    for parsed in parse(key, core) { core.invalidate(parsed) }
                } else {
                    for node in core.entries { core.invalidate(node.key) }
                }
                return true
            })
    }

    /// Invalidates `topic` (or one `key` of it) here at once, then publishes it to the other
    /// replicas.
    ///
    /// - Throws: The bus's error when it could not publish; this replica is invalidated anyway.
    public func invalidate(_ topic: String, key: String? = nil) async throws {
        apply(.invalidate(AsyncStateInvalidation(topic: topic, key: key)))
        try await bus.publish(AsyncStateInvalidation(topic: topic, key: key))
    }

    /// Applies what the bus delivers until the calling task is cancelled or the bus's stream ends:
    /// run it from a service's `run()`. The stream starts with
    /// ``AsyncStateInvalidationDelivery/reconnected`` (see ``AsyncStateInvalidationBus``), so every
    /// subscribed state is invalidated once the bus listens: what this replica fetched before then
    /// may have changed on another replica, unseen.
    public func run() async {
        for await delivery in bus.deliveries() {
            apply(delivery)
            if Task.isCancelled { return }
        }
    }

    /// Applies one delivery (for buses and tests that drive the invalidator themselves).
    public func apply(_ delivery: AsyncStateInvalidationDelivery) {
        let targets: [(String?, [Subscription])]
        switch delivery {
        case .invalidate(let message):
            targets = [(message.key, subscriptions.withLock { $0[message.topic] ?? [] })]
        case .reconnected:
            targets = subscriptions.withLock { $0.values.map { (nil, $0) } }
        }
        // Outside the lock: invalidating runs the states' observers.
        var gone = false
        for (key, subscribers) in targets {
            for subscriber in subscribers where !subscriber.invalidate(key) { gone = true }
        }
        if gone { prune() }
        applied.withLock { $0 += 1 }
    }

    /// The number of live subscriptions to `topic` (for tests).
    public func subscriberCount(_ topic: String) -> Int {
        prune()
        return subscriptions.withLock { $0[topic]?.count ?? 0 }
    }

    private func add(
        _ topic: String, isAlive: @escaping @Sendable () -> Bool, invalidate: @escaping @Sendable (String?) -> Bool
    ) {
        prune()
        subscriptions.withLock {
            $0[topic, default: []].append(Subscription(isAlive: isAlive, invalidate: invalidate))
        }
    }

    /// Drops the subscriptions whose subscriber is gone.
    private func prune() {
        subscriptions.withLock { subscriptions in
            for topic in Array(subscriptions.keys) {
                let live = subscriptions[topic]!.filter { $0.isAlive() }
                subscriptions[topic] = live.isEmpty ? nil : live
            }
        }
    }
}

/// A weak reference that can be sent across tasks.
final class WeakBox<Object: AnyObject & Sendable>: Sendable {
    private let reference: LockedValue<Weak>
    private struct Weak: Sendable {
        weak var object: Object?
    }

    init(_ object: Object) {
        reference = LockedValue(Weak(object: object))
    }

    var value: Object? { reference.withLock { $0.object } }
}
