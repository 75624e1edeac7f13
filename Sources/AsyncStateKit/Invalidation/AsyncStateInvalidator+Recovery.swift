import Foundation

/// What a replica's own invalidations become: marked in the second levels, applied here at once,
/// published to the other replicas — and, what the bus or a second level did not take, kept and sent
/// again until it does (FusionCache's auto-recovery).
extension AsyncStateInvalidator {
    /// How an invalidator keeps what it could not send — a message its bus refused (the bus was
    /// down), or a second-level mark that failed — and sends it again.
    ///
    /// Kept messages are coalesced (a key's newest version wins; a whole-topic invalidation absorbs
    /// the topic's keys and tags), at most `capacity` of them: past that, every topic's messages
    /// become one whole-topic invalidation ("collapsed"), which invalidates more, never less. They are
    /// sent again by ``AsyncStateInvalidator/run()`` — at once when this replica's bus reconnects or a
    /// new message is queued, else after `backoff`, doubled after each failed round up to
    /// `maximumBackoff`. Each keeps its version, and a mark that failed is made before its message
    /// is sent again, so that the message carries the version the mark gives.
    ///
    /// The queue is in memory: a replica that stops with messages in it loses them, and the other
    /// replicas then serve the change no later than their own expiry, as they would without a bus.
    public struct Recovery: Sendable, Hashable {
        /// The most messages kept before they collapse into whole-topic invalidations. Values below
        /// 1 mean 1.
        public var capacity: Int
        /// How long after a failed round the queue is sent again.
        public var backoff: Duration
        /// The longest wait between two rounds.
        public var maximumBackoff: Duration

        /// Creates the policy. Durations are clamped to `AsyncStateLimits.maximumDuration`; a backoff
        /// below a millisecond is a millisecond (a queue never spins), and the maximum is at least
        /// the backoff.
        public init(
            capacity: Int = 1_024, backoff: Duration = .milliseconds(100), maximumBackoff: Duration = .seconds(10)
        ) {
            self.capacity = max(1, capacity)
            self.backoff = max(backoff.clampedToLimits, .milliseconds(1))
            self.maximumBackoff = max(maximumBackoff.clampedToLimits, self.backoff)
        }
    }

    /// What became of an invalidation this replica made (it was applied here at once either way).
    public enum Outcome: Sendable, Hashable {
        /// The second levels were marked and the bus took the message.
        case published
        /// Some of it — the message, or a second-level mark — was kept, to be sent again (see
        /// ``Recovery``); ``AsyncStateInvalidator/flush()`` waits until it is.
        case queued
    }

    /// Why a delivery was refused (only with an authenticator).
    public enum Rejection: Sendable, Hashable, CustomStringConvertible {
        /// Its signature is missing or wrong: it was not sent by a replica with the secret.
        case signature
        /// It is signed without a sender and a time (a release before they were signed): it could
        /// be a replay.
        case untimed
        /// It was sent further from this replica's wall clock than the replay window, either way: a
        /// replay, or a clock that is off.
        case outsideWindow
        /// It was already accepted once (or is older than what the replay guard had to forget).
        case replayed

        public var description: String {
            switch self {
            case .signature: "a missing or wrong signature"
            case .untimed: "no signed sender and time"
            case .outsideWindow: "sent outside the replay window"
            case .replayed: "already accepted once (a replay)"
            }
        }
    }

    /// What the queue of unsent messages did (see ``Recovery``), and the deliveries refused, for logs
    /// and metrics.
    public enum Event: Sendable {
        /// A delivery was refused, and why: nothing was invalidated.
        case rejected(AsyncStateInvalidation, Rejection)
        /// A message (or its second-level mark) could not be sent: it was queued.
        case queued(AsyncStateInvalidation)
        /// A queued message was sent.
        case resent(AsyncStateInvalidation)
        /// The queue was full: these topics' messages became one whole-topic invalidation each.
        case collapsed(topics: [String])
        /// More topics than the queue's capacity: these topics' messages were dropped (their
        /// receivers serve the change no later than their own expiry).
        case dropped(topics: [String])
    }

    /// What the queue counts.
    struct RecoveryCounts {
        var queued = 0
        var resent = 0
        var collapsed = 0
        var dropped = 0
    }

    /// How many messages were queued because the bus or a second level did not take them.
    public var messagesQueued: Int { state.withLock { $0.recoveryCounts.queued } }
    /// How many queued messages were sent later.
    public var messagesResent: Int { state.withLock { $0.recoveryCounts.resent } }
    /// How many times the queue was full and collapsed into whole-topic invalidations.
    public var queueCollapses: Int { state.withLock { $0.recoveryCounts.collapsed } }
    /// How many topics' messages were dropped (more topics than the queue's capacity).
    public var messagesDropped: Int { state.withLock { $0.recoveryCounts.dropped } }
    /// How many messages are waiting to be sent now.
    public var messagesPending: Int { state.withLock { $0.queue?.count ?? 0 } }

    /// Invalidates `topic` (or one `key` of it) here at once, and on the other replicas: it marks the
    /// key stale in the second levels of the families subscribed to `topic` first (see
    /// ``AsyncStateSecondLevelOptions``), so that no replica takes the old entry from there, then
    /// publishes the message, which carries the key's new version: a replica whose data is already
    /// that version ignores it, and the next read of the key on any replica loads it once for all of
    /// them (through the key's lease).
    ///
    /// What the bus or a second level does not take is kept and sent again (see ``Recovery``): the
    /// call then returns ``Outcome/queued``, and ``flush()`` waits until it is sent.
    ///
    /// - Returns: Whether everything was sent, or some of it queued.
    /// - Throws: Without a ``Recovery``, the bus's error when it could not publish; this replica is
    ///   invalidated anyway. With one, nothing.
    @discardableResult
    public func invalidate(_ topic: String, key: String? = nil) async throws -> Outcome {
        try await invalidate(AsyncStateInvalidation(topic: topic, key: key, metadata: metadata?()))
    }

    /// Invalidates the entries carrying `tag` in the families subscribed to `topic` (see
    /// ``AsyncStateFamily/invalidate(tag:)``; a single state subscribed to it is invalidated) here at
    /// once, then on the other replicas, which do the same; kept and sent again as
    /// ``invalidate(_:key:)``'s messages are.
    ///
    /// - Returns: Whether everything was sent, or some of it queued.
    /// - Throws: What ``invalidate(_:key:)`` throws.
    @discardableResult
    public func invalidate(_ topic: String, tag: String) async throws -> Outcome {
        try await invalidate(AsyncStateInvalidation(topic: topic, tag: tag, metadata: metadata?()))
    }

    /// Waits until nothing is queued (see ``Recovery``): every message this replica could not send
    /// has been sent. Returns at once when the queue is empty, and when the calling task is
    /// cancelled. The queue is sent by ``run()``, which must be running.
    public func flush() async {
        let id = state.withLock { state -> UInt64? in
            guard state.queue?.isEmpty == false else { return nil }
            state.nextFlush += 1
            return state.nextFlush
        }
        guard let id else { return }
        await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
                let done = state.withLock { state -> Bool in
                    guard state.queue?.isEmpty == false, !Task.isCancelled else { return true }
                    state.flushing[id] = continuation
                    return false
                }
                if done { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.flushing.removeValue(forKey: id) }?.resume()
        }
    }

    /// A replica's own invalidation: marked in the second levels, applied here, sent.
    private func invalidate(_ message: AsyncStateInvalidation) async throws -> Outcome {
        try await announce(message) { target, subscribers in await self.markSecondLevels(target, of: subscribers) }
    }

    /// A replica's own change: made in the second levels by `mark` (which gives a key's version, or
    /// fails), applied here — the topic's subscribers invalidated, then `write` given the version
    /// `mark` gave, to write a value here that the invalidation must not undo — and sent, queued if
    /// the bus refuses it (or a mark is still owed).
    func announce(
        _ message: AsyncStateInvalidation,
        marking mark: (_ target: Target, _ subscribers: [Subscription]) async -> SecondLevelMark,
        write: ((_ version: UInt64?) -> Void)? = nil
    ) async throws -> Outcome {
        var message = message
        let target = Target(message)
        let subscribers = subscribers(of: message.topic)
        let marked = await mark(target, subscribers)
        var version: UInt64?
        if case .marked(let given) = marked { version = given }
        if case .key = target { message.version = version }
        InvalidationCause.$message.withValue(message) {
            invalidate(target, version: message.version, in: subscribers)
            write?(version)
        }
        return try await send(message, marksSecondLevel: marked == .failed)
    }

    /// Marks `target` stale in the second levels of `subscribers`: with the key's new version when
    /// exactly one of them gave one (versions of different second levels are not comparable);
    /// ``SecondLevelMark/failed`` if any failed.
    func markSecondLevels(_ target: Target, of subscribers: [Subscription]) async -> SecondLevelMark {
        var versions: [UInt64?] = []
        var failed = false
        for subscriber in subscribers {
            guard let invalidateSecondLevel = subscriber.invalidateSecondLevel else { continue }
            switch await invalidateSecondLevel(target) {
            case .marked(let version): versions.append(version)
            case .failed: failed = true
            }
        }
        return failed ? .failed : .marked(version: SecondLevelVersion.single(of: versions))
    }

    /// Publishes `message` unless its second levels still owe their mark; what is not sent is queued
    /// (without a ``Recovery``, the bus's error is thrown instead).
    func send(_ message: AsyncStateInvalidation, marksSecondLevel: Bool) async throws -> Outcome {
        do {
            // The message goes out now even when a mark failed: the replicas drop their data at once.
            // The mark is made later, and the message sent again with the version it gives.
            try await publish(message)
            guard marksSecondLevel else { return .published }
        } catch {
            guard recovery != nil else { throw error }
        }
        enqueue(message, marksSecondLevel: marksSecondLevel)
        return .queued
    }

    /// Signs `message` if the invalidator has an authenticator, and publishes it.
    func publish(_ message: AsyncStateInvalidation) async throws {
        var message = message
        if let authenticator {
            // Who and when, signed with the rest: a receiver accepts it once, within its window.
            message.sender = senderID
            message.sentAt = clock.date().millisecondsSince1970
            message.signature = authenticator.signature(for: message.signedContent)
        }
        try await bus.publish(message)
    }

    /// Keeps `message` to be sent again, and wakes the task that sends the queue.
    private func enqueue(_ message: AsyncStateInvalidation, marksSecondLevel: Bool) {
        let (added, wake) = state.withLock { state -> (InvalidationQueue.Added?, AsyncStream<Void>.Continuation?) in
            guard state.queue != nil else { return (nil, nil) }
            let added = state.queue!.add(message, marksSecondLevel: marksSecondLevel)
            state.recoveryCounts.queued += 1
            if !added.collapsed.isEmpty { state.recoveryCounts.collapsed += 1 }
            state.recoveryCounts.dropped += added.dropped.count
            return (added, state.resendWake)
        }
        guard let added else { return }
        events?(.queued(message))
        if !added.collapsed.isEmpty { events?(.collapsed(topics: added.collapsed)) }
        if !added.dropped.isEmpty { events?(.dropped(topics: added.dropped)) }
        wake?.yield()
    }

    /// ``run()``'s task that sends the queue: a round when woken (a message queued, this replica's
    /// bus reconnected), then rounds after a backoff that doubles up to the maximum, until the queue
    /// is empty or the task is cancelled.
    func resendQueued(woken: AsyncStream<Void>) async {
        guard let recovery else { return }
        for await _ in woken {
            var backoff = recovery.backoff
            while !Task.isCancelled, await resendRound() {
                do {
                    try await clock.sleep(clock.now().saturatingAdd(backoff))
                } catch {
                    return
                }
                backoff = min(backoff.saturatingAdd(backoff), recovery.maximumBackoff)
            }
        }
    }

    /// Sends every queued message once, in order: its second-level mark first if it owes one, then
    /// the message. Returns whether anything is still owed. A round stops at the first message the
    /// bus refuses (it is down: the others would be refused too).
    private func resendRound() async -> Bool {
        let owed = state.withLock { $0.queue?.messages ?? [] }
        for (slot, pending) in owed {
            if Task.isCancelled { break }
            var message = pending.message
            if pending.marksSecondLevel {
                let subscribers = subscribers(of: message.topic)
                let mark = await markSecondLevels(Target(message), of: subscribers)
                guard case .marked(let version) = mark else { continue }
                // Only a key's message carries a version; sent as the queue holds it now (with what
                // was coalesced into it meanwhile).
                let keyVersion: UInt64? = if case .key = slot { version } else { nil }
                message = state.withLock { state in
                    state.queue?.marked(slot, generation: pending.generation, version: keyVersion)
                    return state.queue?.pending[slot]?.message ?? message
                }
                // Applied here again, with the version: until the mark, the second level still held
                // the old entry as fresh, and this replica may have taken it back since (a key it
                // evicted and read again) — as any other replica may, which the message tells.
                InvalidationCause.$message.withValue(message) {
                    invalidate(Target(message), version: message.version, in: subscribers)
                }
            }
            do {
                try await publish(message)
            } catch {
                break
            }
            let flushed = state.withLock { state -> [UnsafeContinuation<Void, Never>] in
                state.queue?.sent(slot, generation: pending.generation)
                state.recoveryCounts.resent += 1
                guard state.queue?.isEmpty == true else { return [] }
                defer { state.flushing = [:] }
                return Array(state.flushing.values)
            }
            events?(.resent(message))
            for waiter in flushed { waiter.resume() }
        }
        return state.withLock { $0.queue?.isEmpty == false }
    }
}

/// What marking a target stale in the second levels gave.
enum SecondLevelMark: Equatable {
    /// Every second level took the mark; the key's new version, when one second level gave one.
    case marked(version: UInt64?)
    /// A second level failed (or timed out, or was being skipped): the mark is owed.
    case failed

    /// The mark a second level's invalidation of one key gave: its version, or `nil` on a fault.
    init(_ version: UInt64?) {
        self = version.map { .marked(version: $0) } ?? .failed
    }
}

extension AsyncStateInvalidator.Target {
    /// What `message` invalidates in a subscriber: its key if it has one, else its tag, else the
    /// whole topic.
    init(_ message: AsyncStateInvalidation) {
        if let key = message.key {
            self = .key(key)
        } else if let tag = message.tag {
            self = .tag(tag)
        } else {
            self = .all
        }
    }
}
