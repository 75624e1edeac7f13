import AsyncStateKit
import Foundation
import Logging
import PostgresInvalidation
import PostgresNIO
import Synchronization
import Testing

/// Buses on one channel, with a client to publish through and send raw notifications with, run for
/// the duration of `body` (the real clock, a real server).
func withBuses(
    _ count: Int, channel: String = uniqueChannel("bus"), backoff: PostgresInvalidationBus.Backoff = .init(),
    _ body: @Sendable ([PostgresInvalidationBus], PostgresClient) async throws -> Void
) async throws {
    let client = PostgresClient(configuration: try Server.clientConfiguration(), backgroundLogger: quietLogger)
    let listening = try Server.connectionConfiguration()
    let buses = try (0..<count).map { _ in
        try PostgresInvalidationBus(
            client: client, listening: listening, channel: channel, backoff: backoff,
            heartbeat: .milliseconds(500), logger: quietLogger)
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
            #expect(received.reconnections >= 1)
            // Listening again: messages arrive as before.
            try await buses[0].publish(AsyncStateInvalidation(topic: "numbers", key: "two"))
            #expect(await eventually(timeout: .seconds(10)) { received.invalidations.contains { $0.key == "two" } })
        }
    }

    @Test func aSubscriberThatJoinsWhileListeningStartsWithReconnectedAndStreamsEndWithTheBus() async throws {
        let client = PostgresClient(configuration: try Server.clientConfiguration(), backgroundLogger: quietLogger)
        let bus = try PostgresInvalidationBus(
            client: client, listening: try Server.connectionConfiguration(), channel: uniqueChannel("end"),
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
