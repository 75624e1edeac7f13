import AsyncHTTPClient
import Foundation
import NIOCore
import Testing

extension RealServerTests {
    /// The service as a new user deploys it, against a real server that is misconfigured or
    /// stopped: readiness says why, every request answers within its timeout with a message, SIGTERM
    /// ends within its bound, and every documented counter is there from the start. Real processes,
    /// real time.
    @Suite(.enabled(if: Server.isAvailable, "needs ASYNCSTATE_POSTGRES_URL: run bash .ci/replicas"), .serialized)
    struct StoreOutageProcessTests {
        /// The bound on one call to the store (`STORE_TIMEOUT`), and on an attempt (`FETCH_TIMEOUT`).
        static let storeTimeout = Duration.seconds(2)

        static func environment(_ url: String) -> [String: String] {
            [
                "POSTGRES_URL": url, "INVALIDATION_CHANNEL": uniqueChannel("outage"),
                "INVALIDATION_SECRET": Server.secret, "WRITE_TOKEN": Server.writeToken, "LOG_LEVEL": "error",
                "STORE_TIMEOUT": "2", "FETCH_TIMEOUT": "2", "RETRY_ATTEMPTS": "1", "STORE_PROBE_EVERY": "1",
            ]
        }

        /// A wrong password, a port nobody listens on, and `sslmode=require` against a server without
        /// TLS: `/ready` is 503 with the reason; a `PUT` and a `GET` of a tenant answer 503 with a
        /// message within their timeouts; SIGTERM ends the process at once.
        @Test(.timeLimit(.minutes(3)))
        func aMisconfiguredStoreMakesReadinessSayWhyAndEveryRequestAnswerInTime() async throws {
            let server = try Server.settings()
            let password = server.password.map { ":\($0)" } ?? ""
            let cases: [(name: String, url: String, reason: String)] = [
                (
                    "wrong password",
                    "postgres://\(server.username):wrong-\(UUID().uuidString)@\(server.host):\(server.port)/\(server.database)?sslmode=disable",
                    "authentication failed"
                ),
                (
                    "unreachable port",
                    "postgres://\(server.username)\(password)@127.0.0.1:\(try freePort())/\(server.database)?sslmode=disable",
                    "the connection was refused"
                ),
                (
                    "TLS mismatch",
                    "postgres://\(server.username)\(password)@\(server.host):\(server.port)/\(server.database)?sslmode=require",
                    "TLS"
                ),
            ]
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("outage-\(UUID())")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            defer { try? FileManager.default.removeItem(at: directory) }
            for (index, (name, url, reason)) in cases.enumerated() {
                let replica = try Replica(
                    name: "misconfigured-\(index)", environment: Self.environment(url), directory: directory)
                do {
                    // Not ready, with the reason.
                    var readiness = ""
                    let said = try await eventually(timeout: .seconds(30)) {
                        let (status, body) = try await client.call("\(replica.base)/ready")
                        readiness = body
                        return status == 503 && body.contains("tenant store") && body.contains(reason)
                    }
                    #expect(said, "\(name): /ready said \(readiness.debugDescription)")
                    #expect(!readiness.contains("wrong-"), "\(name): the password was shown")

                    // A write and a read answer 503 with a message, within their bounds.
                    let writeStart = ContinuousClock.now
                    let (writeStatus, writeBody) = try await client.call(
                        "\(replica.base)/config/acme", method: .PUT, body: #"{"plan":"pro"}"#,
                        token: Server.writeToken)
                    let writeTook = ContinuousClock.now - writeStart
                    let readStart = ContinuousClock.now
                    let (readStatus, readBody) = try await client.call("\(replica.base)/config/acme")
                    let readTook = ContinuousClock.now - readStart
                    #expect(writeStatus == 503 && writeBody.contains("tenant store"), "\(name): \(writeBody)")
                    #expect(readStatus == 503 && !readBody.isEmpty, "\(name): \(readBody)")
                    #expect(writeTook < Self.storeTimeout + .seconds(1), "\(name): the write took \(writeTook)")
                    #expect(readTook < Self.storeTimeout + .seconds(1), "\(name): the read took \(readTook)")

                    let stopStart = ContinuousClock.now
                    #expect(await replica.stop() == 0)
                    let stopTook = ContinuousClock.now - stopStart
                    print(
                        "store outage, \(name): /ready \(readiness.trimmingCharacters(in: .newlines).debugDescription); "
                            + "PUT 503 after \(writeTook.milliseconds) ms (\(writeBody.trimmingCharacters(in: .newlines).debugDescription)); "
                            + "GET 503 after \(readTook.milliseconds) ms; SIGTERM exit after \(stopTook.milliseconds) ms"
                    )
                } catch {
                    replica.process.terminate()
                    throw error
                }
            }
            try await client.shutdown()
        }

        /// A fresh replica lists every documented counter at 0; a `PUT` stuck on a stopped database
        /// does not hold SIGTERM past the store timeout (and a second).
        @Test(.timeLimit(.minutes(3)))
        func sigtermWithAWriteStuckOnAStoppedDatabaseEndsWithinTheBound() async throws {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("stuck-\(UUID())")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: directory) }
            let environment = Self.environment(try #require(Server.url))
            let replica = try Replica(name: "stuck", environment: environment, directory: directory)
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            do {
                try await replica.waitUntilListening(on: environment["INVALIDATION_CHANNEL"]!, client: client)
                let (_, metrics) = try await client.call("\(replica.base)/metrics")
                for counter in [
                    "async_state_fail_safe_serves_total{state=\"tenants\"} 0",
                    "async_state_soft_timeouts_total{state=\"tenants\"} 0",
                    "async_state_not_modified_total{state=\"tenants\"} 0",
                    "async_state_tag_invalidations_total{state=\"tenants\"} 0",
                    "async_state_failures_total{state=\"tenants\"} 0",
                    "async_state_evictions_total{state=\"tenants\",reason=\"evicted\"} 0",
                    "async_state_invalidator_messages_total{event=\"queued\"} 0",
                ] {
                    #expect(metrics.contains(counter), "a fresh replica's /metrics lacks \(counter)")
                }

                try Server.stop()
                let base = replica.base
                let write = Task { [client] in
                    try await client.call(
                        "\(base)/config/stuck", method: .PUT, body: #"{"plan":"pro"}"#, token: Server.writeToken)
                }
                try await Task.sleep(for: .milliseconds(300))
                let stopStart = ContinuousClock.now
                let status = await replica.stop()
                let stopTook = ContinuousClock.now - stopStart
                let answer = try? await write.value
                try Server.start()
                #expect(status == 0)
                #expect(stopTook < Self.storeTimeout + .seconds(1), "SIGTERM took \(stopTook)")
                print(
                    "store outage: SIGTERM with a PUT stuck on a stopped database: exit \(status) after "
                        + "\(stopTook.milliseconds) ms (bound: STORE_TIMEOUT \(Self.storeTimeout) and a second); the PUT "
                        + "answered \(answer.map { "\($0.0) \($0.1.trimmingCharacters(in: .newlines).debugDescription)" } ?? "nothing")"
                )
            } catch {
                replica.process.terminate()
                try? Server.start()
                try? await client.shutdown()
                throw error
            }
            try await client.shutdown()
        }
    }
}
