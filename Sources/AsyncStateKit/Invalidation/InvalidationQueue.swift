/// What an ``AsyncStateInvalidator`` could not send yet — its bus refused the message, or a second
/// level could not be marked — kept to be sent again (FusionCache's auto-recovery): coalesced, so
/// that a burst during an outage costs one message a key, and bounded.
///
/// Coalescing keeps what a receiver must learn and never less:
/// - a key's messages become one, with the newest version either carried (versions only grow) and a
///   second-level mark still owed if either owed one;
/// - a tag's messages become one;
/// - a whole-topic invalidation absorbs the topic's keys and tags (it invalidates all of them), and
///   the marks they owed (marking the whole topic covers each key);
/// - past ``capacity`` messages the queue **collapses**: every topic's messages become one
///   whole-topic invalidation. Past `capacity` topics even then, the oldest topics are **dropped**,
///   and counted: a receiver then serves the change no later than its own expiry, as it would have
///   without a bus.
///
/// Messages are sent in the order they were first queued. Pure: the invalidator holds it under its
/// lock and does the sending.
struct InvalidationQueue {
    /// What a queued message invalidates, which is what coalesces it with another.
    enum Slot: Hashable {
        case whole(topic: String)
        case key(topic: String, key: String)
        case tag(topic: String, tag: String)

        var topic: String {
            switch self {
            case .whole(let topic), .key(let topic, _), .tag(let topic, _): topic
            }
        }

        init(_ message: AsyncStateInvalidation) {
            if let key = message.key {
                self = .key(topic: message.topic, key: key)
            } else if let tag = message.tag {
                self = .tag(topic: message.topic, tag: tag)
            } else {
                self = .whole(topic: message.topic)
            }
        }
    }

    /// A message owed to the fleet.
    struct Pending: Equatable {
        /// The message, as it will be sent.
        var message: AsyncStateInvalidation
        /// Whether the second levels must be marked first (their mark failed): the message then gets
        /// the version the mark gives.
        var marksSecondLevel: Bool
        /// Changed by every add that coalesces into it: a send of an older generation does not
        /// remove it (what was added meanwhile is still owed).
        var generation: UInt64
    }

    /// The most messages kept.
    let capacity: Int
    /// The messages, by slot, and the order their slots were first queued in.
    private(set) var pending: [Slot: Pending] = [:]
    private var order: [Slot] = []
    private var nextGeneration: UInt64 = 0

    init(capacity: Int) {
        self.capacity = max(1, capacity)
    }

    var isEmpty: Bool { pending.isEmpty }
    var count: Int { pending.count }

    /// What an ``add(_:marksSecondLevel:)`` did besides keeping the message.
    struct Added: Equatable {
        /// The topics whose messages collapsed into one whole-topic invalidation each.
        var collapsed: [String] = []
        /// The topics dropped (more topics than the capacity).
        var dropped: [String] = []
    }

    /// Keeps `message` (owing a second-level mark first if `marksSecondLevel`), coalesced with what
    /// is queued.
    mutating func add(_ message: AsyncStateInvalidation, marksSecondLevel: Bool) -> Added {
        nextGeneration += 1
        let slot = Slot(message)
        var incoming = Pending(message: message, marksSecondLevel: marksSecondLevel, generation: nextGeneration)
        // A whole topic queued already covers the message.
        if case .whole = slot {
        } else if let whole = pending[.whole(topic: slot.topic)] {
            merge(into: .whole(topic: slot.topic), whole, marks: marksSecondLevel, metadata: message.metadata)
            return Added()
        }
        if case .whole(let topic) = slot {
            // It absorbs the topic's keys and tags.
            for absorbed in order where absorbed.topic == topic && absorbed != slot {
                incoming.marksSecondLevel = incoming.marksSecondLevel || pending[absorbed]!.marksSecondLevel
                pending[absorbed] = nil
            }
            order.removeAll { $0.topic == topic && $0 != slot }
        }
        if let queued = pending[slot] {
            incoming.message.version = Self.newest(queued.message.version, message.version)
            incoming.marksSecondLevel = incoming.marksSecondLevel || queued.marksSecondLevel
            incoming.message.metadata = message.metadata ?? queued.message.metadata
            pending[slot] = incoming
            return Added()
        }
        pending[slot] = incoming
        order.append(slot)
        return pending.count > capacity ? collapse() : Added()
    }

    /// Coalesces an add into the queued `existing` at `slot`.
    private mutating func merge(into slot: Slot, _ existing: Pending, marks: Bool, metadata: [String: String]?) {
        var merged = existing
        merged.marksSecondLevel = merged.marksSecondLevel || marks
        merged.message.metadata = metadata ?? merged.message.metadata
        merged.generation = nextGeneration
        pending[slot] = merged
    }

    /// Every topic's messages become one whole-topic invalidation, in the order of the topics' first
    /// messages; past the capacity, the oldest topics go.
    private mutating func collapse() -> Added {
        var added = Added()
        var topics: [String] = []
        var marks: [String: Bool] = [:]
        var metadata: [String: [String: String]] = [:]
        for slot in order {
            let topic = slot.topic
            if marks[topic] == nil { topics.append(topic) }
            marks[topic] = (marks[topic] ?? false) || pending[slot]!.marksSecondLevel
            metadata[topic] = pending[slot]!.message.metadata ?? metadata[topic]
        }
        added.collapsed = topics
        if topics.count > capacity {
            added.dropped = Array(topics.prefix(topics.count - capacity))
            topics.removeFirst(topics.count - capacity)
        }
        pending = [:]
        order = []
        for topic in topics {
            let slot = Slot.whole(topic: topic)
            pending[slot] = Pending(
                message: AsyncStateInvalidation(topic: topic, metadata: metadata[topic]),
                marksSecondLevel: marks[topic]!, generation: nextGeneration)
            order.append(slot)
        }
        return added
    }

    /// The messages owed, in the order they were first queued.
    var messages: [(slot: Slot, pending: Pending)] { order.map { ($0, pending[$0]!) } }

    /// The message at `slot` was sent (as it was at `generation`): it is no longer owed, unless
    /// something was coalesced into it since.
    mutating func sent(_ slot: Slot, generation: UInt64) {
        guard pending[slot]?.generation == generation else { return }
        pending[slot] = nil
        order.removeAll { $0 == slot }
    }

    /// The second levels of the message at `slot` (as it was at `generation`) were marked, at
    /// `version`: it is sent with it from now on, owing no mark.
    mutating func marked(_ slot: Slot, generation: UInt64, version: UInt64?) {
        guard var queued = pending[slot] else { return }
        queued.message.version = Self.newest(queued.message.version, version)
        if queued.generation == generation { queued.marksSecondLevel = false }
        pending[slot] = queued
    }

    /// The newer of two versions (`nil` for none).
    private static func newest(_ a: UInt64?, _ b: UInt64?) -> UInt64? {
        switch (a, b) {
        case (let a?, let b?): SecondLevelVersion.merged(a, known: b)
        case (let a?, nil): a
        case (nil, let b): b
        }
    }
}
