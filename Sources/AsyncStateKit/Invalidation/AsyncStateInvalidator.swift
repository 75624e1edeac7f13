import Foundation

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
///
/// ## What a delivery may cost
///
/// Whoever can reach the bus can send messages. Two defences bound what they cost:
/// - With an ``AsyncStateInvalidationAuthenticator``, a message whose signature is missing or wrong
///   is dropped and counted (``deliveriesRejected``): only replicas that share the secret can
///   invalidate. What is signed includes who sent it and when, so a signed message captured on the
///   way and sent again is refused too: outside `replayWindow` of this replica's wall clock, or
///   when it was already accepted (see ``Rejection``). (`reconnected` comes from the bus itself, not
///   from a message.)
/// - An invalidation of every entry of a topic — a message without a key, or `reconnected` — is
///   applied at most once per `invalidateAllInterval` for each topic: those that arrive within it
///   are coalesced into one, applied when the interval ends (``invalidationsCoalesced``). A flood so
///   costs one pass over each subscribed family per interval; what it delays is stale by at most the
///   interval. This replica's own ``invalidate(_:key:)`` is never delayed.
public final class AsyncStateInvalidator: Sendable {
    /// The bus.
    public let bus: any AsyncStateInvalidationBus
    let authenticator: (any AsyncStateInvalidationAuthenticator)?
    let metadata: (@Sendable () -> [String: String])?
    let invalidateAllInterval: Duration
    let clock: StoreClock
    let subscriptions = LockedValue<[String: [Subscription]]>([:])
    let state: LockedValue<State>
    /// How what could not be sent is kept (see ``Recovery``); `nil`: not kept.
    let recovery: Recovery?
    /// Told of what the queue does and of refused deliveries (see ``Event``).
    let events: (@Sendable (Event) -> Void)?
    /// Who this invalidator is in what it signs (``AsyncStateInvalidation/sender``).
    let senderID = String(UInt64.random(in: .min ... .max), radix: 16)

    /// What the invalidator counts, and the invalidations of whole topics it holds back.
    struct State {
        var applied = 0
        var rejected = 0
        /// The signed messages accepted (with an authenticator).
        var replays: ReplayGuard
        var coalesced = 0
        /// Keyed messages for a family without a parser, each of which compared every entry.
        var scans = 0
        /// When each topic was last invalidated whole, on the invalidator's clock.
        var lastWhole: [String: Duration] = [:]
        /// Topics whose whole invalidation waits for its interval to end.
        var held: Set<String> = []
        /// Wakes ``run()``'s task that applies held invalidations, while it waits for one.
        var wake: AsyncStream<Void>.Continuation?
        /// What could not be sent yet (with a ``Recovery``), and its counts.
        var queue: InvalidationQueue?
        var recoveryCounts = RecoveryCounts()
        /// Wakes ``run()``'s task that sends the queue again, while it waits for a message.
        var resendWake: AsyncStream<Void>.Continuation?
        /// The callers of ``flush()`` waiting for the queue to empty, by id.
        var flushing: [UInt64: UnsafeContinuation<Void, Never>] = [:]
        var nextFlush: UInt64 = 0
    }

    /// How many deliveries this invalidator has applied (from the bus or ``apply(_:)``), for metrics
    /// and tests; a whole-topic invalidation held back to be coalesced counts when it arrives.
    public var deliveriesApplied: Int { state.withLock { $0.applied } }

    /// How many messages were dropped because their signature was missing or wrong (only with an
    /// authenticator).
    public var deliveriesRejected: Int { state.withLock { $0.rejected } }

    /// How many whole-topic invalidations were folded into a later one by the rate limit.
    public var invalidationsCoalesced: Int { state.withLock { $0.coalesced } }

    /// How many keyed messages for a family without a parser compared every entry's description
    /// (the `subscribe(_:to:)` that takes no parser), for tests.
    var keyScans: Int { state.withLock { $0.scans } }

    /// One subscribed state or family, held weakly.
    struct Subscription: Sendable {
        /// Whether the subscriber still exists.
        let isAlive: @Sendable () -> Bool
        /// Invalidates the subscriber: what `target` names, unless its data is that second-level
        /// `version` or newer; `false` once it is gone.
        let invalidate: @Sendable (_ target: Target, _ version: UInt64?) -> Bool
        /// For a state or family with a second level: marks `target` stale there before a change made
        /// here is announced.
        var invalidateSecondLevel: (@Sendable (_ target: Target) async -> SecondLevelMark)?
    }

    /// What a message invalidates in a subscriber.
    enum Target: Sendable {
        /// Everything.
        case all
        /// One key (its description).
        case key(String)
        /// The entries carrying a tag.
        case tag(String)
    }

    /// An invalidator over `bus`.
    ///
    /// - Parameters:
    ///   - bus: What carries the messages between replicas.
    ///   - authenticator: Signs what this replica publishes and checks what it receives: a message
    ///     whose signature is missing or wrong is dropped and counted (``deliveriesRejected``). `nil`
    ///     (the default): every message is applied.
    ///   - invalidateAllInterval: The shortest time between two invalidations of every entry of one
    ///     topic caused by deliveries (messages without a key, `reconnected`); those in between are
    ///     coalesced into one, applied at the interval's end. Zero or less: no limit. Defaults to one
    ///     second.
    ///   - clock: The clock the interval is measured on. Defaults to `ContinuousClock()`.
    ///   - metadata: Called in the task of each ``invalidate(_:key:)`` (and tag) to fill the message's
    ///     ``AsyncStateInvalidation/metadata``: inject the current trace context there, and the
    ///     observers of every replica's states see which request caused the invalidation. `nil` (the
    ///     default): messages carry none.
    ///   - recovery: How what could not be sent is kept and sent again (see ``Recovery``); `nil`: it
    ///     is not, and ``invalidate(_:key:)`` throws the bus's error instead. Defaults to
    ///     ``Recovery/init(capacity:backoff:maximumBackoff:)``'s defaults.
    ///   - events: Told of each message queued, sent again, collapsed or dropped, and of each delivery
    ///     refused (see ``Event``), for logs and metrics; on the thread that caused it, after every
    ///     lock. `nil` (the default): nobody.
    ///   - replayWindow: With an authenticator, how far the time a message was sent may be from this
    ///     replica's wall clock, either way: allow for the replicas' clock skew and the bus's delay.
    ///     A message is accepted once within it (see ``Rejection``). Defaults to two minutes.
    public init(
        bus: any AsyncStateInvalidationBus, authenticator: (any AsyncStateInvalidationAuthenticator)? = nil,
        invalidateAllInterval: Duration = .seconds(1), clock: some Clock<Duration> = ContinuousClock(),
        metadata: (@Sendable () -> [String: String])? = nil, recovery: Recovery? = Recovery(),
        events: (@Sendable (Event) -> Void)? = nil, replayWindow: Duration = .seconds(120)
    ) {
        state = LockedValue(
            State(
                replays: ReplayGuard(window: replayWindow.clampedToLimits, capacity: Self.replayCapacity),
                queue: recovery.map { InvalidationQueue(capacity: $0.capacity) }))
        self.bus = bus
        self.authenticator = authenticator
        self.metadata = metadata
        self.invalidateAllInterval = invalidateAllInterval > .zero ? invalidateAllInterval.clampedToLimits : .zero
        self.clock = StoreClock(clock)
        self.recovery = recovery
        self.events = events
    }

    /// Subscribes `state` to `topic`: a message about the topic (with or without a key or a tag)
    /// invalidates it.
    public func subscribe<Value>(_ state: AsyncState<Value>, to topic: String) {
        let store = WeakBox(state.store)
        // With a second level (held weakly too: it lives as long as the state's store), a message's
        // version applies, and a change made here is marked there first.
        let secondLevel = state.secondLevel.map(WeakBox.init)
        var invalidateSecondLevel: (@Sendable (Target) async -> SecondLevelMark)?
        if let secondLevel {
            invalidateSecondLevel = { _ in
                guard let secondLevel = secondLevel.value else { return .marked(version: nil) }
                return SecondLevelMark(await secondLevel.invalidate(secondLevel.stateKey))
            }
        }
        add(
            topic, isAlive: { store.value != nil },
            invalidate: { _, version in
                guard let store = store.value else { return false }
                store.invalidate(version: version)
                return true
            },
            invalidateSecondLevel: invalidateSecondLevel)
    }

    /// Subscribes `family` to `topic`: a message with a key invalidates every entry whose key
    /// describes as it (`String(describing:)`, which every entry is compared with — two keys that
    /// describe alike are both invalidated, never one left stale); one without, every entry.
    ///
    /// Each keyed message so costs a pass over every entry, with no rate limit (a limit would have
    /// to invalidate more under a busy but legitimate stream of writes): whoever can send messages
    /// this invalidator accepts can make a flood of them expensive. With an authenticator that is
    /// only the replicas that hold the secret (an unsigned, forged or replayed message is refused
    /// before any scan); without one, anyone who can reach the bus. Prefer
    /// ``subscribe(_:to:parse:)``, which reads the key back in one step (`UUID(uuidString:)` for a
    /// `UUID` key), or a key type that is `LosslessStringConvertible`.
    public func subscribe<Key, Value>(_ family: AsyncStateFamily<Key, Value>, to topic: String) {
        subscribe(family, to: topic) { [state] key, core in
            state.withLock { $0.scans += 1 }
            return core.entries.lazy.map(\.key).filter { "\($0)" == key }
        }
    }

    /// Subscribes `family` to `topic`, reading a message's key with `Key(_:)` (one lookup, whatever
    /// the family's size); a key that does not parse invalidates nothing.
    public func subscribe<Key: LosslessStringConvertible, Value>(
        _ family: AsyncStateFamily<Key, Value>, to topic: String
    ) {
        subscribe(family, to: topic, parse: Key.init)
    }

    /// Subscribes `family` to `topic`, reading a message's key with `parse` (one lookup, whatever the
    /// family's size): give it the inverse of the key's description, such as `UUID(uuidString:)`. A
    /// key that does not parse (`nil`) invalidates nothing.
    ///
    /// ```swift
    /// invalidator.subscribe($sessions, to: "sessions", parse: UUID.init(uuidString:))
    /// ```
    public func subscribe<Key, Value>(
        _ family: AsyncStateFamily<Key, Value>, to topic: String, parse: @escaping @Sendable (String) -> Key?
    ) {
        subscribe(family, to: topic) { key, _ in parse(key).map { [$0] } ?? [] }
    }

    private func subscribe<Key, Value>(
        _ family: AsyncStateFamily<Key, Value>, to topic: String,
        keys: @escaping @Sendable (String, FamilyCore<Key, Value>) -> [Key]
    ) {
        let core = WeakBox(family.core)
        // With a second level, a keyed message's version applies, and a change made here is marked
        // there first.
        var invalidateSecondLevel: (@Sendable (Target) async -> SecondLevelMark)?
        if family.core.secondLevel != nil {
            invalidateSecondLevel = { target in
                guard let family = core.value, let secondLevel = family.secondLevel else {
                    return .marked(version: nil)
                }
                switch target {
                case .key(let key):
                    // Named as the family's loads name it (``SecondLevelLoader/key(of:)``): the key
                    // the message parses to (`"007"` is key 7), or the message's key when it names none.
                    let matches = keys(key, family).map(secondLevel.key(of:))
                    var versions: [UInt64?] = []
                    for name in Set(matches.isEmpty ? [secondLevel.key(for: key)] : matches) {
                        guard let version = await secondLevel.invalidate(name) else { return .failed }
                        versions.append(version)
                    }
                    return .marked(version: SecondLevelVersion.single(of: versions))
                case .tag, .all:
                    // The second level knows no tags: every entry of the family goes stale there.
                    return await secondLevel.invalidateAll() ? .marked(version: nil) : .failed
                }
            }
        }
        add(
            topic, isAlive: { core.value != nil },
            invalidate: { target, version in
                guard let core = core.value else { return false }
                switch target {
                case .key(let key):
                    for match in keys(key, core) { core.invalidate(match, version: version) }
                case .tag(let tag): core.invalidate(tag: tag)
                case .all: core.invalidate { _ in true }
                }
                return true
            },
            invalidateSecondLevel: invalidateSecondLevel)
    }

    /// Applies what the bus delivers until the calling task is cancelled or the bus's stream ends:
    /// run it from a service's `run()`. It also sends again what this replica could not send (see
    /// ``Recovery``). The stream starts with
    /// ``AsyncStateInvalidationDelivery/reconnected`` (see ``AsyncStateInvalidationBus``), so every
    /// subscribed state is invalidated once the bus listens: what this replica fetched before then
    /// may have changed on another replica, unseen. While it runs, it also applies the whole-topic
    /// invalidations the rate limit held back, each when its interval ends.
    public func run() async {
        let (wakes, wake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let (resends, resendWake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let owesMessages = state.withLock { state in
            state.wake = wake
            state.resendWake = resendWake
            return state.queue?.isEmpty == false
        }
        // Messages queued before it ran are sent at once.
        if owesMessages { resendWake.yield() }
        await withTaskGroup(of: Void.self) { group in
            group.addTask(executorPreference: clock.executor) { [self] in
                for await _ in wakes {
                    while let due = nextRelease() {
                        do { try await clock.sleep(due) } catch { return }
                        releaseHeld()
                    }
                }
            }
            group.addTask(executorPreference: clock.executor) { [self] in await resendQueued(woken: resends) }
            for await delivery in bus.deliveries() {
                apply(delivery)
                // This replica's bus is back: what it owes is sent now, not at the end of a backoff.
                if delivery == .reconnected { resendWake.yield() }
                if Task.isCancelled { break }
            }
            group.cancelAll()
        }
        state.withLock { state in
            state.wake = nil
            state.resendWake = nil
        }
        wake.finish()
        resendWake.finish()
    }

    /// Applies one delivery (for buses and tests that drive the invalidator themselves): a message
    /// that fails authentication is dropped, and an invalidation of whole topics may be held back by
    /// the rate limit (``run()`` applies it when its interval ends; without `run()`, the next
    /// delivery does).
    public func apply(_ delivery: AsyncStateInvalidationDelivery) {
        releaseHeld()
        switch delivery {
        case .invalidate(let message):
            if let authenticator, let rejection = admit(message, authenticator) {
                state.withLock { $0.rejected += 1 }
                events?(.rejected(message, rejection))
                return
            }
            // A key, a tag, or both, each applied as this replica's own invalidation would; neither:
            // the whole topic. The states' observers see the message (a whole topic held back by the
            // rate limit is applied later without it).
            InvalidationCause.$message.withValue(message) {
                if let key = message.key {
                    invalidate(.key(key), version: message.version, in: subscribers(of: message.topic))
                }
                if let tag = message.tag { invalidate(.tag(tag), in: subscribers(of: message.topic)) }
                if message.key == nil, message.tag == nil { invalidateWhole([message.topic]) }
            }
        case .reconnected:
            invalidateWhole(subscriptions.withLock { Array($0.keys) })
        }
        state.withLock { $0.applied += 1 }
    }

    /// Why `message` is refused — its signature, or its time and whether it was seen (see
    /// ``ReplayGuard``) — or `nil` when it is accepted.
    private func admit(
        _ message: AsyncStateInvalidation, _ authenticator: any AsyncStateInvalidationAuthenticator
    ) -> Rejection? {
        guard authenticator.isAuthentic(message), let signature = message.signature else { return .signature }
        guard message.sender != nil, let sentAt = message.sentAt else { return .untimed }
        let now = clock.date().millisecondsSince1970
        return state.withLock { $0.replays.admit(signature: signature, sentAt: sentAt, now: now) }
    }

    /// The most signatures an invalidator keeps to refuse replays (see ``ReplayGuard``): about 6 MB
    /// at most, and a fleet sending more than 500 messages a second within a two-minute window has
    /// its oldest ones refused by time rather than by signature, never accepted twice.
    static var replayCapacity: Int { 65_536 }

    /// The number of signed messages remembered to refuse replays (for tests).
    var replaysRemembered: Int { state.withLock { $0.replays.count } }

    /// Invalidates every entry of `topics` now, or holds back those invalidated whole within the
    /// interval, to be applied once when it ends.
    private func invalidateWhole(_ topics: [String]) {
        let now = clock.now()
        let interval = invalidateAllInterval
        // The rate limit keeps state for subscribed topics only: a flood of messages about topics
        // nobody here subscribed to costs nothing, and remembers nothing.
        let subscribed = subscriptions.withLock { subscriptions in topics.filter { subscriptions[$0] != nil } }
        guard !subscribed.isEmpty else { return }
        let (due, wake) = state.withLock { state -> ([String], AsyncStream<Void>.Continuation?) in
            var due: [String] = []
            for topic in subscribed {
                if interval > .zero, let last = state.lastWhole[topic], now - last < interval {
                    if !state.held.insert(topic).inserted { state.coalesced += 1 }
                } else {
                    state.lastWhole[topic] = now
                    due.append(topic)
                }
            }
            return (due, state.held.isEmpty ? nil : state.wake)
        }
        for topic in due { invalidate(.all, in: subscribers(of: topic)) }
        wake?.yield()
    }

    /// When the first held topic's interval ends; `nil` when none is held.
    private func nextRelease() -> Duration? {
        state.withLock { state in state.held.compactMap { state.lastWhole[$0] }.min() }
            .map { $0.saturatingAdd(invalidateAllInterval) }
    }

    /// Applies the held whole-topic invalidations whose interval has ended.
    private func releaseHeld() {
        let now = clock.now()
        let interval = invalidateAllInterval
        let due = state.withLock { state -> [String] in
            guard !state.held.isEmpty else { return [] }
            let due = Array(state.held.filter { state.lastWhole[$0].map { now - $0 >= interval } ?? true })
            for topic in due {
                state.held.remove(topic)
                state.lastWhole[topic] = now
            }
            return due
        }
        for topic in due { invalidate(.all, in: subscribers(of: topic)) }
    }

    /// The live subscribers of `topic`.
    func subscribers(of topic: String) -> [Subscription] {
        subscriptions.withLock { $0[topic] ?? [] }
    }

    /// Invalidates `target` of `subscribers`, outside every lock (invalidating runs the states'
    /// observers); drops the subscriptions whose subscriber is gone.
    func invalidate(_ target: Target, version: UInt64? = nil, in subscribers: [Subscription]) {
        var gone = false
        for subscriber in subscribers where !subscriber.invalidate(target, version) { gone = true }
        if gone { prune() }
    }

    /// The number of live subscriptions to `topic` (for tests).
    public func subscriberCount(_ topic: String) -> Int {
        prune()
        return subscriptions.withLock { $0[topic]?.count ?? 0 }
    }

    private func add(
        _ topic: String, isAlive: @escaping @Sendable () -> Bool,
        invalidate: @escaping @Sendable (Target, UInt64?) -> Bool,
        invalidateSecondLevel: (@Sendable (Target) async -> SecondLevelMark)? = nil
    ) {
        prune()
        // A message's version is the second level's: to a subscriber without one it means nothing,
        // and it gets none (its data's version stays 0, and the message always applies).
        var applying = invalidate
        if invalidateSecondLevel == nil { applying = { target, _ in invalidate(target, nil) } }
        let subscription = Subscription(
            isAlive: isAlive, invalidate: applying, invalidateSecondLevel: invalidateSecondLevel)
        subscriptions.withLock { $0[topic, default: []].append(subscription) }
    }

    /// Drops the subscriptions whose subscriber is gone, and what the rate limit kept for topics
    /// that have none left.
    private func prune() {
        let gone = subscriptions.withLock { subscriptions -> [String] in
            var gone: [String] = []
            for topic in Array(subscriptions.keys) {
                let live = subscriptions[topic]!.filter { $0.isAlive() }
                subscriptions[topic] = live.isEmpty ? nil : live
                if live.isEmpty { gone.append(topic) }
            }
            return gone
        }
        guard !gone.isEmpty else { return }
        state.withLock { state in
            for topic in gone {
                state.lastWhole[topic] = nil
                state.held.remove(topic)
            }
        }
    }

    /// The number of topics the rate limit keeps state for (for tests).
    var rateLimitedTopics: Int { state.withLock { $0.lastWhole.count } }
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
