import AsyncStateKit
import Logging
import Metrics
import PostgresNIO
import ServiceLifecycle
import Synchronization

/// An `AsyncStateInvalidationBus` over PostgreSQL's `LISTEN`/`NOTIFY`: every replica of a service
/// that shares a database hears the invalidations the others publish, within milliseconds.
///
/// ```swift
/// let bus = try PostgresInvalidationBus(client: client, listening: connectionConfiguration, logger: logger)
/// let invalidator = AsyncStateInvalidator(bus: bus)
/// invalidator.subscribe(catalog.tenants, to: "tenants")
/// // The service group runs `client`, `bus` and `invalidator.run()`.
/// ```
///
/// - **Publishing** runs `SELECT pg_notify($1, $2)` through `client`'s pool, the channel and the
///   payload as bound parameters: nothing a topic or key holds is ever spliced into SQL.
/// - **Listening** holds one dedicated connection (made from the `listening` configuration, outside
///   the pool) with `LISTEN` on the channel. It pings the server every `heartbeat` and treats a ping
///   that fails, or goes unanswered for a heartbeat with no notification arriving either, as a lost
///   connection, so a half-open TCP connection is noticed too — and a flood of notifications, behind
///   which the ping's answer waits, is not (reconnecting would invalidate everything).
/// - **A lost connection** (a server restart, a network cut) is retried with exponential backoff and
///   jitter until ``run()`` is cancelled. The backoff starts over only once a connection has stayed
///   up for two heartbeats: a connection that dies just after `LISTEN` (a proxy's idle timeout,
///   `pg_terminate_backend`, pings timing out on an overloaded server) keeps backing off, where
///   retrying every 50–100 ms would make every replica invalidate everything, again and again,
///   against a struggling database. Connecting and putting `LISTEN` in place must take less
///   than twice the heartbeat (at least 2 s), so that a server that accepts a connection and never
///   answers does not stall the bus either. Once `LISTEN` is in place again the bus delivers
///   `.reconnected`: notifications sent meanwhile are lost (PostgreSQL keeps none for absent
///   listeners), so the invalidator invalidates everything it holds. `.reconnected` also follows the
///   first `LISTEN`, and opens every stream made by ``deliveries()`` while the bus listens, because a
///   state may have read before the bus (or that subscriber) was listening.
/// - **A malformed payload** — one another program sent on the channel, or one over the size limit —
///   is counted in ``malformedPayloads`` and ignored; it is logged at `warning` the first time and
///   then at each power of two (at `debug` otherwise), with an escaped excerpt, so a flood of them
///   neither floods the log nor forges lines in it.
/// - **With an authenticator, a message is checked before it takes a buffer slot:** one whose
///   signature is missing or wrong is counted in ``unauthenticatedPayloads`` and dropped, so an
///   unsigned flood — anyone who can connect to the database can send one — costs a counter, never
///   an overflow, and so never the `.reconnected` that invalidates everything. (The invalidator
///   checks again, and refuses replays: the bus does not know the time window.)
/// - **Each subscriber's deliveries wait in a bounded buffer** (`deliveryBuffer`, a ring whose
///   memory is bounded by its capacity): when a flood of authentic messages outpaces the
///   subscriber, what is buffered is replaced by one `.reconnected` (invalidating everything is
///   always safe), counted in ``overflows``. Memory stays bounded whatever arrives.
/// - **Metrics** (swift-metrics, labelled with the channel): `async_state_bus_received_total`,
///   `async_state_bus_malformed_total`, `async_state_bus_reconnections_total`,
///   `async_state_bus_overflows_total`, `async_state_bus_unauthenticated_total`, and the gauge `async_state_bus_listening` (1 while `LISTEN`
///   is in place).
///
/// A replica hears its own notifications too (PostgreSQL sends a notification to every listening
/// session); applying one again is harmless, invalidation being idempotent, and costs at most one
/// extra read of the key.
public final class PostgresInvalidationBus: AsyncStateInvalidationBus, Service {
    /// The `NOTIFY` channel.
    public let channel: String
    private let client: PostgresClient
    private let listening: PostgresConnection.Configuration
    private let backoff: Backoff
    private let heartbeat: Duration
    private let deliveryBuffer: Int
    private let authenticator: (any AsyncStateInvalidationAuthenticator)?
    /// How long connecting and putting `LISTEN` in place may take: twice the heartbeat, at least 2 s.
    private var setupTimeout: Duration { max(heartbeat * 2, .seconds(2)) }
    private let logger: Logger
    private let state = Mutex(State())
    private let metrics: BusMetrics

    private struct BusMetrics {
        let received: Counter
        let malformed: Counter
        let reconnections: Counter
        let overflows: Counter
        let unauthenticated: Counter
        let listening: Gauge

        init(channel: String) {
            let dimensions = [("channel", channel)]
            received = Counter(label: "async_state_bus_received_total", dimensions: dimensions)
            malformed = Counter(label: "async_state_bus_malformed_total", dimensions: dimensions)
            reconnections = Counter(label: "async_state_bus_reconnections_total", dimensions: dimensions)
            overflows = Counter(label: "async_state_bus_overflows_total", dimensions: dimensions)
            unauthenticated = Counter(label: "async_state_bus_unauthenticated_total", dimensions: dimensions)
            listening = Gauge(label: "async_state_bus_listening", dimensions: dimensions)
        }
    }

    private struct State {
        var subscribers: [Int: DeliveryQueue] = [:]
        var nextSubscriber = 0
        var isListening = false
        var hasEnded = false
        var malformed = 0
        var reconnections = 0
        var received = 0
        var overflows = 0
        var unauthenticated = 0
    }

    /// How long the bus waits before connecting again after attempt `n` failed:
    /// `min(maximum, initial × 2ⁿ⁻¹)`, of which a random half is waited (so that replicas that lost
    /// the server together do not reconnect in lockstep).
    public struct Backoff: Sendable, Equatable {
        /// The wait after the first failure.
        public var initial: Duration
        /// The longest wait.
        public var maximum: Duration

        /// A backoff from `initial` doubling up to `maximum`.
        public init(initial: Duration = .milliseconds(100), maximum: Duration = .seconds(5)) {
            self.initial = initial
            self.maximum = maximum
        }

        /// The wait after `attempt` (1 or more) consecutive failures.
        func delay(afterAttempt attempt: Int) -> Duration {
            let doubled = initial * Double(1 << min(max(attempt - 1, 0), 20))
            let capped = min(doubled, maximum)
            return capped / 2 + capped / 2 * Double.random(in: 0...1)
        }
    }

    /// A channel name the bus refuses.
    public struct ChannelNameError: Error, Equatable, CustomStringConvertible {
        /// The name given.
        public var channel: String

        public var description: String {
            "invalid NOTIFY channel \"\(channel)\": use 1 to 63 lowercase ASCII letters, digits and underscores, not starting with a digit"
        }
    }

    /// A bus on `channel`.
    ///
    /// - Parameters:
    ///   - client: Publishes; run it in the service group.
    ///   - listening: The server the listening connection connects to (the same database as `client`).
    ///   - channel: The `NOTIFY` channel every replica of the service uses: 1 to 63 characters (a
    ///     PostgreSQL identifier's length), lowercase ASCII letters, digits and underscores, not
    ///     starting with a digit, so that it needs no quoting anywhere.
    ///   - backoff: The waits between connection attempts.
    ///   - heartbeat: How often the listening connection is pinged.
    ///   - deliveryBuffer: How many deliveries each subscriber's buffer holds before it overflows
    ///     into one `.reconnected` (at least 1).
    ///   - authenticator: The invalidator's: a message whose signature it does not accept is dropped
    ///     before it is buffered. `nil`: every message is buffered.
    /// - Throws: ``ChannelNameError`` for any other channel name.
    public init(
        client: PostgresClient, listening: PostgresConnection.Configuration,
        channel: String = "async_state_invalidations", backoff: Backoff = Backoff(),
        heartbeat: Duration = .seconds(5), deliveryBuffer: Int = 1_024,
        authenticator: (any AsyncStateInvalidationAuthenticator)? = nil, logger: Logger
    ) throws(ChannelNameError) {
        guard Self.isValidChannel(channel) else { throw ChannelNameError(channel: channel) }
        self.client = client
        self.listening = listening
        self.channel = channel
        self.backoff = backoff
        self.heartbeat = heartbeat
        self.deliveryBuffer = max(1, deliveryBuffer)
        self.authenticator = authenticator
        self.logger = logger
        metrics = BusMetrics(channel: channel)
    }

    /// Whether `name` is a channel name the bus accepts.
    public static func isValidChannel(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard (1...63).contains(bytes.count), !(UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[0]) else {
            return false
        }
        return bytes.allSatisfy {
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains($0) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0)
                || $0 == UInt8(ascii: "_")
        }
    }

    // MARK: Counters

    /// Whether the listening connection currently has `LISTEN` in place.
    public var isListening: Bool { state.withLock { $0.isListening } }
    /// Notifications ignored because their payload was not an invalidation.
    public var malformedPayloads: Int { state.withLock { $0.malformed } }
    /// Invalidations received and delivered.
    public var invalidationsReceived: Int { state.withLock { $0.received } }
    /// Times `LISTEN` was put in place again after a lost connection.
    public var reconnections: Int { state.withLock { $0.reconnections } }
    /// Notifications dropped before buffering because their signature was missing or wrong (with an
    /// authenticator).
    public var unauthenticatedPayloads: Int { state.withLock { $0.unauthenticated } }
    /// Times a subscriber's buffer overflowed and was replaced by one `.reconnected`.
    public var overflows: Int { state.withLock { $0.overflows } }

    // MARK: AsyncStateInvalidationBus

    /// Sends `invalidation` on the channel to every listening replica (this one included).
    ///
    /// - Throws: `AsyncStateInvalidation.PayloadError` when the topic and key are too long for a
    ///   notification; the driver's error when the server cannot be reached.
    public func publish(_ invalidation: AsyncStateInvalidation) async throws {
        let payload = try invalidation.payload()
        // Read to its end: an error the server sends with the row (a refused notification) is
        // thrown here rather than lost with a sequence nobody reads.
        for try await _ in try await client.query("SELECT pg_notify(\(channel), \(payload))", logger: logger) {}
    }

    /// The invalidations other replicas publish, and `.reconnected` after every (re)connection, until
    /// ``run()`` returns; buffered up to `deliveryBuffer` (see the type's documentation). The stream
    /// leaves the bus when its consumer's task is cancelled.
    public func deliveries() -> AsyncStream<AsyncStateInvalidationDelivery> {
        let queue = DeliveryQueue(capacity: deliveryBuffer)
        let id: Int? = state.withLock { state in
            guard !state.hasEnded else { return nil }
            let id = state.nextSubscriber
            state.nextSubscriber += 1
            state.subscribers[id] = queue
            if state.isListening { queue.push(.reconnected) }
            return id
        }
        guard let id else {
            queue.finish()
            return queue.stream {}
        }
        return queue.stream { [weak self] in _ = self?.state.withLock { $0.subscribers.removeValue(forKey: id) } }
    }

    /// Delivers `delivery` to every subscriber, counting the buffers it overflows.
    private func broadcast(_ delivery: AsyncStateInvalidationDelivery, to subscribers: [DeliveryQueue]) {
        let overflowed = subscribers.count { !$0.push(delivery) }
        guard overflowed > 0 else { return }
        state.withLock { $0.overflows += overflowed }
        metrics.overflows.increment(by: overflowed)
        logger.debug(
            "a subscriber's invalidations overflowed its buffer: replaced by one reconnected",
            metadata: ["channel": "\(channel)"])
    }

    // MARK: Service

    /// Keeps `LISTEN` in place — connecting, and reconnecting with backoff — until the task is
    /// cancelled or the service group shuts down gracefully; then ends every delivery stream.
    public func run() async throws {
        await cancelWhenGracefulShutdown { await self.listen() }
        metrics.listening.record(0)
        let ended = state.withLock { state in
            state.hasEnded = true
            state.isListening = false
            defer { state.subscribers = [:] }
            return Array(state.subscribers.values)
        }
        for queue in ended { queue.finish() }
    }

    private func listen() async {
        var failures = 0
        var hasListened = false
        // When `LISTEN` was last put in place: the backoff starts over only if it then held for two
        // heartbeats (a connection that dies at once is a failure like one that never connects).
        let listenedAt = Mutex<ContinuousClock.Instant?>(nil)
        while !Task.isCancelled {
            do {
                let connection = try await withDeadline(setupTimeout) { [listening, logger] in
                    try await PostgresConnection.connect(configuration: listening, id: 1, logger: logger)
                } discard: { late in
                    try? await late.close()
                }
                do {
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        // LISTEN must be in place within the setup timeout, or this connection is
                        // not answering: closing it fails the LISTEN (which ignores cancellation).
                        group.addTask { [setupTimeout] in
                            try await Task.sleep(for: setupTimeout)
                            if !self.isListening { try? await connection.close() }
                        }
                        defer { group.cancelAll() }
                        try await connection.listen(on: channel) { notifications in
                            listenedAt.withLock { $0 = .now }
                            self.listeningStarted(afterGap: hasListened)
                            hasListened = true
                            try await self.receive(notifications, pinging: connection)
                        }
                    }
                } catch {
                    try? await connection.close()
                    throw error
                }
                try? await connection.close()
            } catch {
                state.withLock { $0.isListening = false }
                metrics.listening.record(0)
                guard !Task.isCancelled else { return }
                let heldFor = listenedAt.withLock { at in
                    defer { at = nil }
                    return at.map { $0.duration(to: .now) }
                }
                if let heldFor, heldFor >= heartbeat * 2 { failures = 0 }
                failures += 1
                let delay = backoff.delay(afterAttempt: failures)
                // Every failure at debug; the first, and then fewer and fewer, at warning.
                let level: Logger.Level = failures & (failures - 1) == 0 ? .warning : .debug
                let message: Logger.Message =
                    hasListened && failures == 1
                    ? "invalidation listener lost its connection" : "invalidation listener cannot connect"
                logger.log(
                    level: level, message,
                    metadata: [
                        "channel": "\(channel)", "attempt": "\(failures)", "retry_in": "\(delay)",
                        "error": "\(String(reflecting: error))",
                    ])
                try? await Task.sleep(for: delay)
                continue
            }
            // The connection ended without an error: only when cancelled.
            state.withLock { $0.isListening = false }
            metrics.listening.record(0)
        }
    }

    private func listeningStarted(afterGap: Bool) {
        let subscribers = state.withLock { state in
            state.isListening = true
            if afterGap { state.reconnections += 1 }
            return Array(state.subscribers.values)
        }
        metrics.listening.record(1)
        if afterGap { metrics.reconnections.increment() }
        logger.info("invalidation listener is listening", metadata: ["channel": "\(channel)"])
        broadcast(.reconnected, to: subscribers)
    }

    /// Delivers notifications until the stream ends or a ping fails (both throw, to reconnect).
    private func receive(_ notifications: PostgresNotificationSequence, pinging connection: PostgresConnection)
        async throws
    {
        let heard = LastHeard()
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                for try await notification in notifications {
                    heard.now()
                    self.deliver(notification.payload)
                }
                throw ListenerEnded()
            }
            group.addTask { [heartbeat, logger] in
                while true {
                    try await Task.sleep(for: heartbeat)
                    try await withThrowingTaskGroup(of: Bool.self) { ping in
                        ping.addTask {
                            try await connection.query("SELECT 1", logger: logger)
                            return true
                        }
                        ping.addTask {
                            // No answer within a heartbeat of the last sign of life: close the
                            // connection, which fails the ping (a query in flight does not end on
                            // cancellation) and the notification stream. Notifications arriving
                            // are such signs: under a flood the ping's answer waits behind them, and
                            // a connection that delivers is not lost (closing it would mean a
                            // `reconnected`, which invalidates everything: what a flood is after).
                            repeat {
                                try await Task.sleep(for: heartbeat)
                            } while heard.within(heartbeat)
                            if !Task.isCancelled { try? await connection.close() }
                            return false
                        }
                        defer { ping.cancelAll() }
                        guard try await ping.next() == true else { throw ListenerEnded() }
                    }
                }
            }
            defer { group.cancelAll() }
            do {
                try await group.next()
            } catch {
                // The group waits for both children before it rethrows. The ping's failure alone did
                // not always end the notification stream: in one CI run (2026-11-28) two replicas'
                // listeners never reported losing their connection after PostgreSQL restarted, while
                // they kept serving requests. Closing the connection ends the stream whatever it
                // waits for, as the ping's own timeout does.
                try? await connection.close()
                throw error
            }
        }
    }

    /// Delivers one payload, or logs and counts it when it is not an invalidation.
    func deliver(_ payload: String) {
        let invalidation: AsyncStateInvalidation
        do {
            invalidation = try AsyncStateInvalidation(payload: payload)
        } catch {
            let count = state.withLock { state in
                state.malformed += 1
                return state.malformed
            }
            metrics.malformed.increment()
            // The first, then fewer and fewer, at warning: a flood must not flood the log. (The
            // error's excerpt of the payload is escaped: it cannot forge a line.)
            logger.log(
                level: count & (count - 1) == 0 ? .warning : .debug,
                "ignored a notification that is not an invalidation",
                metadata: ["channel": "\(channel)", "error": "\(error)", "count": "\(count)"])
            return
        }
        // Checked before it takes a slot in any buffer: an unsigned flood never overflows one.
        if let authenticator, !authenticator.isAuthentic(invalidation) {
            state.withLock { $0.unauthenticated += 1 }
            metrics.unauthenticated.increment()
            return
        }
        let subscribers = state.withLock { state in
            state.received += 1
            return Array(state.subscribers.values)
        }
        metrics.received.increment()
        broadcast(.invalidate(invalidation), to: subscribers)
    }

    /// `operation`'s result, or a `DeadlineExceeded` error after `timeout` (it is cancelled then).
    /// A result that `operation` still makes after losing — to the deadline, to cancellation, or at
    /// the same instant — is handed to `discard` (a connection must be closed: dropped open, it
    /// leaks, and PostgresNIO's debug builds trap on it). A task group waits for all its children
    /// anyway, so this waits no longer than before.
    private func withDeadline<Result: Sendable>(
        _ timeout: Duration, _ operation: @escaping @Sendable () async throws -> Result,
        discard: @escaping @Sendable (Result) async -> Void
    ) async throws -> Result {
        try await withThrowingTaskGroup(of: Result?.self) { group in
            group.addTask { try await operation() }
            group.addTask {
                try await Task.sleep(for: timeout)
                return nil
            }
            let first: Swift.Result<Result?, any Error>
            do { first = .success(try await group.next() ?? nil) } catch { first = .failure(error) }
            group.cancelAll()
            if case .success(let result?) = first { return result }
            while !group.isEmpty {
                if case .some(.some(let late)) = try? await group.next() { await discard(late) }
            }
            _ = try first.get()  // the operation's error, or the sleep's on cancellation
            throw DeadlineExceeded(timeout: timeout)
        }
    }

    /// Connecting took longer than the setup timeout.
    private struct DeadlineExceeded: Error, CustomStringConvertible {
        var timeout: Duration
        var description: String { "the server did not answer within \(timeout)" }
    }

    /// The notification stream ended or a ping failed: the connection is gone.
    private struct ListenerEnded: Error, CustomStringConvertible {
        var description: String { "the listening connection stopped answering" }
    }
}

/// When the listening connection last delivered a notification, for its ping's timeout.
private final class LastHeard: Sendable {
    private let start = ContinuousClock.now
    private let nanoseconds = Atomic<Int64>(.min)

    /// Notes a notification now.
    func now() {
        let elapsed = start.duration(to: .now).components
        nanoseconds.store(elapsed.seconds &* 1_000_000_000 &+ elapsed.attoseconds / 1_000_000_000, ordering: .relaxed)
    }

    /// Whether one arrived within `interval` before now.
    func within(_ interval: Duration) -> Bool {
        let last = nanoseconds.load(ordering: .relaxed)
        guard last != .min else { return false }
        let since = start.duration(to: .now) - .nanoseconds(last)
        return since < interval
    }
}
