import AsyncStateKit
import Foundation
import Logging
import PostgresInvalidation
import PostgresNIO
import Synchronization
import Testing

/// Records what a logger logs: level, message and metadata.
final class LogRecorder: Sendable {
    struct Entry: Sendable {
        var level: Logger.Level
        var message: String
        var metadata: [String: String]
    }

    private let entries = Mutex<[Entry]>([])
    var all: [Entry] { entries.withLock { $0 } }

    var logger: Logger {
        var logger = Logger(label: "recorded") { _ in Handler(recorder: self) }
        logger.logLevel = .trace
        return logger
    }

    private struct Handler: LogHandler {
        let recorder: LogRecorder
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) {
            let metadata = (event.metadata ?? [:]).mapValues { "\($0)" }
            recorder.entries.withLock {
                $0.append(Entry(level: event.level, message: "\(event.message)", metadata: metadata))
            }
        }
    }
}

extension RealServerTests {
    /// The PostgreSQL bus, tried as an attacker who can connect to the database would (NOTIFY needs
    /// no permission), against a real server.
    @Suite(.enabled(if: Server.isAvailable, "needs ASYNCSTATE_POSTGRES_URL: run bash .ci/replicas"), .serialized)
    struct PostgresBusSecurityTests {
        @Test func anUnsignedNotificationIsDroppedAndCountedAndASignedOneApplied() async throws {
            try await withBuses(2) { buses, client in
                let secret = try HMACAuthenticator(secret: Server.secret)
                let writer = AsyncStateInvalidator(bus: buses[0], authenticator: secret)
                let (reader, tenants, applying) = try await startReader(on: buses[1], secret: secret)
                defer { applying.cancel() }
                // What anyone who can connect can send: a well-formed message, without a signature, or
                // with one made under another secret.
                let forged = try HMACAuthenticator(secret: String(repeating: "g", count: 32))
                var guessed = AsyncStateInvalidation(topic: "tenants", key: "acme")
                guessed.signature = forged.signature(for: guessed.signedContent)
                for payload in [#"{"topic":"tenants","key":"acme"}"#, try guessed.payload()] {
                    try await client.query("SELECT pg_notify(\(buses[0].channel), \(payload))", logger: quietLogger)
                }
                #expect(await eventually(timeout: .seconds(10)) { reader.deliveriesRejected == 2 })
                #expect(tenants.snapshot(for: "acme")?.isExpired == false)
                // A replica with the secret.
                try await writer.invalidate("tenants", key: "acme")
                #expect(await eventually(timeout: .seconds(10)) { tenants.snapshot(for: "acme")?.isExpired == true })
                #expect(reader.deliveriesRejected == 2)
            }
        }

        /// What anyone who can connect can do without the secret — another role with nothing but
        /// `CONNECT`, and the service's own login — 100,000 well-formed, unsigned notifications each.
        /// The bus checks each before buffering it: no overflow, so no `reconnected` and no
        /// invalidation, and no memory kept.
        @Test func unsignedNotificationsFromAnyLoginCostNoInvalidationAndNoMemory() async throws {
            let secret = try HMACAuthenticator(secret: Server.secret)
            let server = try Server.settings()
            let (role, password) = ("flood_\(String(UInt32.random(in: 0...UInt32.max), radix: 16))", UUID().uuidString)
            try await withClient { admin in
                for statement in [
                    "CREATE ROLE \(role) LOGIN PASSWORD '\(password)'",
                    "GRANT CONNECT ON DATABASE \"\(server.database)\" TO \(role)",
                ] {
                    try await admin.query(PostgresQuery(unsafeSQL: statement), logger: quietLogger)
                }
            }
            var other = server.client
            (other.username, other.password) = (role, password)
            // The role goes at the end, whatever happened (its connections are closed by then).
            let dropRole = {
                try? await withClient { admin in
                    for statement in [
                        "REVOKE CONNECT ON DATABASE \"\(server.database)\" FROM \(role)", "DROP ROLE IF EXISTS \(role)",
                    ] {
                        try await admin.query(PostgresQuery(unsafeSQL: statement), logger: quietLogger)
                    }
                }
            }
            do {
                try await flood(from: other, secret: secret)
            } catch {
                await dropRole()
                throw error
            }
            await dropRole()
        }

        private func flood(from other: PostgresClient.Configuration, secret: HMACAuthenticator) async throws {
            try await withBuses(1, deliveryBuffer: 16, authenticator: secret) { buses, client in
                let bus = buses[0]
                let (reader, tenants, applying) = try await startReader(on: bus, secret: secret)
                defer { applying.cancel() }
                let before = residentKilobytes()
                try await withClient(other) { otherClient in
                    for (login, sender) in [("another role", otherClient), ("the service's login", client)] {
                        let start = bus.unauthenticatedPayloads
                        for batch in 0..<10 {
                            let flood = try await sender.query(
                                """
                                SELECT pg_notify(\(bus.channel), '{"topic":"tenants","key":"' || i \
                                || '","metadata":{"pad":"' || repeat('x', 200) || '"}}')
                                FROM generate_series(\(batch * 10_000 + 1), \((batch + 1) * 10_000)) AS i
                                """, logger: quietLogger)
                            for try await _ in flood {}
                        }
                        let dropped = await eventually(timeout: .seconds(60)) {
                            bus.unauthenticatedPayloads - start == 100_000
                        }
                        #expect(dropped, "from \(login)")
                    }
                }
                let after = residentKilobytes()
                print(
                    "100,000 unsigned notifications from another role and 100,000 from the service's login: "
                        + "RSS \(before) kB before, \(after) kB after; \(bus.unauthenticatedPayloads) dropped "
                        + "unbuffered, \(bus.overflows) overflows, \(reader.deliveriesApplied - 1) applied")
                #expect(bus.overflows == 0)
                #expect(reader.deliveriesApplied == 1 && reader.deliveriesRejected == 0)
                #expect(tenants.snapshot(for: "acme")?.isExpired == false)
                // Bounded: 200,000 payloads of about 250 bytes would be 50 MB if they were kept.
                #expect(after - before < 16_000, "RSS grew \(after - before) kB")
            }
        }

        /// Anyone can LISTEN and capture a signed message; sent again, it is refused.
        @Test func aCapturedSignedMessageSentAgainIsRefused() async throws {
            let secret = try HMACAuthenticator(secret: Server.secret)
            try await withBuses(2, authenticator: secret) { buses, client in
                let writer = AsyncStateInvalidator(bus: buses[0], authenticator: secret)
                let (reader, tenants, applying) = try await startReader(on: buses[1], secret: secret)
                defer { applying.cancel() }
                // The attacker's capture: what goes over the channel, as any listener hears it.
                var captured = buses[1].deliveries().makeAsyncIterator()
                #expect(await captured.next() == .reconnected)
                try await writer.invalidate("tenants", key: "acme")
                guard case .invalidate(let message) = await captured.next() else {
                    Issue.record("nothing was captured")
                    return
                }
                #expect(await eventually(timeout: .seconds(10)) { tenants.snapshot(for: "acme")?.isExpired == true })
                _ = try await tenants.value(for: "acme") { _ in 2 }
                try await client.query(
                    "SELECT pg_notify(\(buses[0].channel), \(try message.payload()))", logger: quietLogger)
                #expect(await eventually(timeout: .seconds(10)) { reader.deliveriesRejected == 1 })
                print(
                    "a replayed signed message: refused (\(reader.deliveriesRejected) rejected), the tenant still fresh"
                )
                #expect(tenants.snapshot(for: "acme")?.isExpired == false)
            }
        }

        @Test func aFloodOutpacingItsSubscriberIsHeldInABoundedBufferAndBecomesOneReconnected() async throws {
            try await withBuses(1, deliveryBuffer: 16) { buses, client in
                let bus = buses[0]
                // A subscriber that reads nothing while the flood arrives.
                var deliveries = bus.deliveries().makeAsyncIterator()
                let flood = try await client.query(
                    """
                    SELECT pg_notify(\(bus.channel), '{"topic":"t","key":"' || i || '"}')
                    FROM generate_series(1, 5000) AS i
                    """, logger: quietLogger)
                for try await _ in flood {}
                #expect(await eventually(timeout: .seconds(30)) { bus.invalidationsReceived == 5_000 })
                #expect(bus.overflows >= 5_000 / 16 - 1)
                // What waits for it: at most 16 deliveries, starting with the one `reconnected` that
                // covers everything dropped.
                var waiting: [AsyncStateInvalidationDelivery] = []
                try await bus.publish(AsyncStateInvalidation(topic: "after"))
                while let delivery = await deliveries.next() {
                    waiting.append(delivery)
                    if delivery == .invalidate(AsyncStateInvalidation(topic: "after")) { break }
                }
                #expect(waiting.count <= 16)
                #expect(waiting.first == .reconnected)
                #expect(waiting.count { $0 == .reconnected } == 1)
            }
        }

        @Test func aConnectionThatDiesRightAfterListenKeepsBackingOff() async throws {
            let maximum = Duration.milliseconds(400)
            try await withBuses(1, backoff: .init(initial: .milliseconds(20), maximum: maximum), heartbeat: .seconds(5))
            {
                buses, client in
                let bus = buses[0]
                // A proxy's idle timeout, `pg_terminate_backend`: the session dies as soon as it listens,
                // eight times in a row.
                var gaps: [Duration] = []
                for round in 1...8 {
                    #expect(
                        await eventually(timeout: .seconds(20)) { bus.isListening && bus.reconnections == round - 1 })
                    let killed = ContinuousClock.now
                    let terminated = try await client.query(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = \("LISTEN \"\(bus.channel)\";")",
                        logger: quietLogger)
                    for try await _ in terminated {}
                    #expect(await eventually(timeout: .seconds(20)) { bus.reconnections == round && bus.isListening })
                    gaps.append(killed.duration(to: .now))
                }
                // The waits grew as the failures did (20, 40, 80 … ms, of which a random half or more),
                // where a backoff that started over at every LISTEN would wait 10–20 ms each time.
                #expect(gaps.suffix(3).allSatisfy { $0 >= maximum / 2 - .milliseconds(50) }, "\(gaps)")
            }
        }

        @Test func aMalformedPayloadCannotForgeALogLineAndAFloodOfThemIsThrottledInTheLog() async throws {
            let recorder = LogRecorder()
            try await withBuses(1, logger: recorder.logger) { buses, client in
                let bus = buses[0]
                let forged = "x\n2026-11-25T00:00:00+0000 critical state-service : [admin] password changed"
                for _ in 0..<10 {
                    try await client.query("SELECT pg_notify(\(bus.channel), \(forged))", logger: quietLogger)
                }
                #expect(await eventually(timeout: .seconds(10)) { bus.malformedPayloads == 10 })
                let ignored = recorder.all.filter { $0.message.hasPrefix("ignored a notification") }
                #expect(ignored.count == 10)
                #expect(ignored.count { $0.level == .warning } == 4)  // the 1st, 2nd, 4th and 8th
                for entry in ignored {
                    let error = try #require(entry.metadata["error"])
                    #expect(!error.contains("\n") && error.contains(#"\n2026-11-25"#))
                }
            }
        }
    }
}

/// A replica's reader on `bus`: its invalidator (checking with `secret`) applying deliveries until the
/// returned task is cancelled, the `tenants` family subscribed, and tenant "acme" loaded once the
/// bus's first `reconnected` has been applied.
func startReader(
    on bus: PostgresInvalidationBus, secret: HMACAuthenticator
) async throws -> (AsyncStateInvalidator, AsyncStateFamily<String, Int>, Task<Void, Never>) {
    let reader = AsyncStateInvalidator(bus: bus, authenticator: secret, invalidateAllInterval: .zero)
    let tenants = AsyncStateFamily<String, Int>(expiry: .seconds(600))
    reader.subscribe(tenants, to: "tenants")
    let applying = Task { await reader.run() }
    #expect(await eventually(timeout: .seconds(10)) { reader.deliveriesApplied == 1 })
    _ = try await tenants.value(for: "acme") { _ in 1 }
    return (reader, tenants, applying)
}

/// This process's resident memory in kB (`VmRSS` in `/proc/self/status`), 0 where there is none.
func residentKilobytes() -> Int {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") })
    else { return 0 }
    return Int(line.split(whereSeparator: \.isWhitespace).dropFirst().first ?? "") ?? 0
}
