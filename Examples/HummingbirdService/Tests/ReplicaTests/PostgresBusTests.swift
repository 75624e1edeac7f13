import AsyncStateKit
import Foundation
import Logging
import PostgresInvalidation
import PostgresNIO
import StateService
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Buses on one channel, with a client to publish through and send raw notifications with, run for
/// the duration of `body` (the real clock, a real server).
func withBuses(
    _ count: Int, channel: String = uniqueChannel("bus"), backoff: PostgresInvalidationBus.Backoff = .init(),
    heartbeat: Duration = .milliseconds(500), deliveryBuffer: Int = 1_024,
    authenticator: (any AsyncStateInvalidationAuthenticator)? = nil, logger: Logger = quietLogger,
    _ body: @Sendable ([PostgresInvalidationBus], PostgresClient) async throws -> Void
) async throws {
    let server = try Server.settings()
    let client = PostgresClient(configuration: server.client, backgroundLogger: quietLogger)
    let listening = try server.connection()
    let buses = try (0..<count).map { _ in
        try PostgresInvalidationBus(
            client: client, listening: listening, channel: channel, backoff: backoff,
            heartbeat: heartbeat, deliveryBuffer: deliveryBuffer, authenticator: authenticator, logger: logger)
    }
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { await client.run() }
        for bus in buses { group.addTask { try await bus.run() } }
        defer { group.cancelAll() }
        let listening = await eventually(timeout: .seconds(30)) { buses.allSatisfy(\.isListening) }
        try #require(listening, "the buses never started listening")
        try await body(buses, client)
    }
}

/// Collects a bus's deliveries in the background.
final class Received: Sendable {
    private final class Log: Sendable {
        let deliveries = Mutex<[AsyncStateInvalidationDelivery]>([])
    }
    private let log = Log()
    private let task: Task<Void, Never>

    init(_ bus: PostgresInvalidationBus) {
        let stream = bus.deliveries()
        let log = log
        task = Task { for await delivery in stream { log.deliveries.withLock { $0.append(delivery) } } }
    }

    deinit { task.cancel() }

    var all: [AsyncStateInvalidationDelivery] { log.deliveries.withLock { $0 } }
    var invalidations: [AsyncStateInvalidation] {
        all.compactMap { if case .invalidate(let message) = $0 { message } else { nil } }
    }
    var reconnections: Int { all.count { $0 == .reconnected } }
}

extension RealServerTests {
    @Suite(.enabled(if: Server.isAvailable, "needs ASYNCSTATE_POSTGRES_URL: run bash .ci/replicas"), .serialized)
    struct PostgresBusTests {
        @Test func invalidationsReachTheOtherReplicasExactlyAsPublishedWhateverTheyContain() async throws {
            try await withBuses(2) { buses, _ in
                let received = Received(buses[1])
                let messages = [
                    AsyncStateInvalidation(topic: "tenants", key: "acme"),
                    AsyncStateInvalidation(topic: "tenants"),
                    // Quotes, a statement separator, a comment, a NUL-free control character, non-ASCII:
                    // sent as bound parameters and JSON, they arrive as they were.
                    AsyncStateInvalidation(topic: "t'; DROP TABLE tenant_configs; --", key: "\"quoted\"\t$1 \\ 数据 😀"),
                    AsyncStateInvalidation(
                        topic: String(repeating: "x", count: 3_000), key: String(repeating: "y", count: 3_000)),
                ]
                for message in messages { try await buses[0].publish(message) }
                let arrived = await eventually(timeout: .seconds(10)) { received.invalidations.count == messages.count }
                #expect(arrived)
                #expect(received.invalidations == messages)
                // The publisher hears its own messages too (harmless: invalidation is idempotent).
                #expect(await eventually(timeout: .seconds(10)) { buses[0].invalidationsReceived == messages.count })
                #expect(buses[1].malformedPayloads == 0)
            }
        }

        @Test func malformedAndOversizedNotificationsAreCountedAndIgnoredAndTheBusGoesOn() async throws {
            try await withBuses(1) { buses, client in
                let bus = buses[0]
                let received = Received(bus)
                let oversized = #"{"topic":""# + String(repeating: "a", count: 7_950) + #""}"#
                let malformed = [
                    "", "not json", "{\"key\":\"no topic\"}", "{\"topic\":\"\"}", "[1,2,3]", "{\"topic\":\"trunc",
                    "{\"topic\":42}", oversized,
                ]
                for payload in malformed {
                    try await client.query("SELECT pg_notify(\(bus.channel), \(payload))", logger: quietLogger)
                }
                try await bus.publish(AsyncStateInvalidation(topic: "after", key: "all"))
                #expect(await eventually(timeout: .seconds(10)) { received.invalidations.count == 1 })
                #expect(received.invalidations == [AsyncStateInvalidation(topic: "after", key: "all")])
                #expect(bus.malformedPayloads == malformed.count)
                #expect(bus.isListening)
                // Too long to send: refused before it reaches the server.
                await #expect(throws: AsyncStateInvalidation.PayloadError.self) {
                    try await bus.publish(AsyncStateInvalidation(topic: String(repeating: "z", count: 8_000)))
                }
            }
        }

        @Test func aLostConnectionIsReconnectedAndEveryStateIsInvalidated() async throws {
            try await withBuses(2, backoff: .init(initial: .milliseconds(20), maximum: .milliseconds(200))) {
                buses, client in
                let received = Received(buses[1])
                // A family behind the second bus, holding a fresh entry.
                let family = AsyncStateFamily<String, Int>(expiry: .seconds(600))
                let invalidator = AsyncStateInvalidator(bus: buses[1])
                invalidator.subscribe(family, to: "numbers")
                let applying = Task { await invalidator.run() }
                defer { applying.cancel() }
                // A subscriber that joins a listening bus starts with `.reconnected` (it may have missed
                // something): wait for that one before reading.
                #expect(await eventually(timeout: .seconds(10)) { invalidator.deliveriesApplied == 1 })
                _ = try await family.value(for: "one") { _ in 1 }
                #expect(family.snapshot(for: "one")?.isExpired == false)

                // The server drops the listening sessions (as a restart or a network cut would).
                let terminated = try await client.query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = \("LISTEN \"\(buses[1].channel)\";")",
                    logger: quietLogger)
                var count = 0
                for try await _ in terminated { count += 1 }
                #expect(count == 2)

                #expect(await eventually(timeout: .seconds(20)) { buses[1].reconnections == 1 && buses[1].isListening })
                #expect(await eventually(timeout: .seconds(5)) { family.snapshot(for: "one")?.isExpired == true })
                // The bus counts its reconnection before its subscribers' tasks take the delivery.
                #expect(await eventually(timeout: .seconds(10)) { received.reconnections >= 1 })
                // Listening again: messages arrive as before.
                try await buses[0].publish(AsyncStateInvalidation(topic: "numbers", key: "two"))
                #expect(await eventually(timeout: .seconds(10)) { received.invalidations.contains { $0.key == "two" } })
            }
        }

        @Test func pingsKeepAHealthyConnectionListening() async throws {
            try await withBuses(2, heartbeat: .milliseconds(200)) { buses, client in
                let received = Received(buses[1])
                // Ten heartbeats: each ping runs on the listening connection beside LISTEN.
                try await Task.sleep(for: .seconds(2))
                #expect(buses[1].isListening)
                #expect(buses[1].reconnections == 0)
                // Both listening sessions last ran a ping (their last statement was LISTEN otherwise).
                let pinging = try await client.query(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT 1'", logger: quietLogger)
                var sessions = 0
                for try await count in pinging.decode(Int.self) { sessions = count }
                #expect(sessions == 2)
                try await buses[0].publish(AsyncStateInvalidation(topic: "still", key: "here"))
                #expect(await eventually(timeout: .seconds(10)) { received.invalidations.count == 1 })
            }
        }

        @Test func aListeningConnectionThatStopsAnsweringIsReplaced() async throws {
            try await withBuses(
                1, backoff: .init(initial: .milliseconds(20), maximum: .milliseconds(200)),
                heartbeat: .milliseconds(100)
            ) {
                buses, client in
                let bus = buses[0]
                let received = Received(bus)
                // The server process behind the listening session freezes (as behind a network cut: the
                // TCP connection stays open, nothing answers).
                let backends = try await client.query(
                    "SELECT pid FROM pg_stat_activity WHERE query = \("LISTEN \"\(bus.channel)\";") OR query = 'SELECT 1'",
                    logger: quietLogger)
                var pids: [Int32] = []
                for try await pid in backends.decode(Int32.self) { pids.append(pid) }
                try #require(pids.count == 1)
                #expect(kill(pids[0], SIGSTOP) == 0)
                defer { kill(pids[0], SIGCONT) }
                // A ping goes unanswered for a heartbeat: the bus connects again and says so.
                #expect(await eventually(timeout: .seconds(10)) { bus.reconnections == 1 && bus.isListening })
                // The bus counts its reconnection before `received`'s task takes the delivery.
                #expect(await eventually(timeout: .seconds(10)) { received.reconnections >= 2 })
                try await bus.publish(AsyncStateInvalidation(topic: "after", key: "freeze"))
                #expect(await eventually(timeout: .seconds(10)) { received.invalidations.count == 1 })
            }
        }

        @Test func aSubscriberThatJoinsWhileListeningStartsWithReconnectedAndStreamsEndWithTheBus() async throws {
            let server = try Server.settings()
            let client = PostgresClient(configuration: server.client, backgroundLogger: quietLogger)
            let bus = try PostgresInvalidationBus(
                client: client, listening: try server.connection(), channel: uniqueChannel("end"),
                logger: quietLogger)
            let running = Task { try await bus.run() }
            #expect(await eventually(timeout: .seconds(30)) { bus.isListening })
            var deliveries = bus.deliveries().makeAsyncIterator()
            #expect(await deliveries.next() == .reconnected)
            running.cancel()
            try await running.value
            #expect(await deliveries.next() == nil)
            #expect(!bus.isListening)
            var late = bus.deliveries().makeAsyncIterator()
            #expect(await late.next() == nil)
        }
    }
}

/// Without a server: the bus keeps trying, and stops as soon as it is cancelled.
extension RealServerTests {
    @Suite(.timeLimit(.minutes(1))) struct UnreachableServerTests {
        /// A bus (fast backoff) and its client, for a server on `port` of 127.0.0.1.
        static func bus(port: Int, heartbeat: Duration = .seconds(5)) throws -> PostgresInvalidationBus {
            let server = try PostgresSettings(url: "postgres://nobody@127.0.0.1:\(port)/none")
            return try PostgresInvalidationBus(
                client: PostgresClient(configuration: server.client, backgroundLogger: quietLogger),
                listening: try server.connection(),
                backoff: .init(initial: .milliseconds(10), maximum: .milliseconds(50)),
                heartbeat: heartbeat, logger: quietLogger)
        }

        @Test func aBusWithoutAServerRetriesAndStopsAtOnceWhenCancelled() async throws {
            let port = try freePort()  // nothing listens there
            let bus = try Self.bus(port: port)
            let running = Task { try await bus.run() }
            var deliveries = bus.deliveries().makeAsyncIterator()
            try await Task.sleep(for: .milliseconds(300))
            #expect(!bus.isListening)
            let stopping = ContinuousClock.now
            running.cancel()
            try await running.value
            #expect(ContinuousClock.now - stopping < .seconds(5))
            #expect(await deliveries.next() == nil)
            // Publishing fails (the client is not running): an error, not a hang.
            let publishing = Task { try await bus.publish(AsyncStateInvalidation(topic: "t")) }
            try await Task.sleep(for: .milliseconds(100))
            publishing.cancel()
            await #expect(throws: (any Error).self) { try await publishing.value }
        }
    }
}

extension RealServerTests.UnreachableServerTests {
    @Test func aServerThatAcceptsAndNeverAnswersDoesNotStallTheBus() async throws {
        let server = try SilentServer()
        defer { server.stop() }
        // A heartbeat of 100 ms: connecting and LISTEN get 2 s (the floor) before the bus gives up.
        let bus = try Self.bus(port: server.port, heartbeat: .milliseconds(100))
        let running = Task { try await bus.run() }
        // A stalled connection is abandoned after the setup timeout and another one is tried.
        #expect(await eventually(timeout: .seconds(10)) { server.connections >= 2 })
        #expect(!bus.isListening)
        let stopping = ContinuousClock.now
        running.cancel()
        try await running.value
        #expect(ContinuousClock.now - stopping < .seconds(5))
    }
}

extension RealServerTests {
    @Suite struct ChannelNameTests {
        @Test(arguments: [
            "", "1abc", "Upper", "with space", "quote\"d", "semi;colon", "ünï", String(repeating: "a", count: 64),
        ])
        func aChannelThatWouldNeedQuotingIsRefused(name: String) {
            #expect(!PostgresInvalidationBus.isValidChannel(name))
        }

        @Test(arguments: ["a", "_x", "async_state_invalidations", "tenants_2", String(repeating: "a", count: 63)])
        func plainChannelsAreAccepted(name: String) {
            #expect(PostgresInvalidationBus.isValidChannel(name))
        }
    }
}
