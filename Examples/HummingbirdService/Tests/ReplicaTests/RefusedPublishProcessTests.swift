import AsyncHTTPClient
import Foundation
import NIOCore
import PostgresNIO
import Testing

extension RealServerTests {
    /// A write whose invalidation the server refuses, alone: three `hummingbird-service` processes
    /// (as a role that is not a superuser) on their own database, where `pg_notify` is taken from
    /// them for a moment. The tenant and its second-level entry are written, the message is not
    /// (`X-Invalidation: queued`), the other two keep serving the old value, and once `pg_notify` is
    /// given back the writer's recovery sends it: both serve the write, with no read of the store.
    @Suite(.enabled(if: Server.isAvailable, "needs ASYNCSTATE_POSTGRES_URL: run bash .ci/replicas"), .serialized)
    struct RefusedPublishProcessTests {
        @Test(.timeLimit(.minutes(5)))
        func aWriteWhosePublishIsRefusedReachesTheOthersOnceItIsAllowed() async throws {
            try await PostgresSecondLevelTests().withTwoRoles("refused", otherMayConnect: false) { roles in
                try await run(roles)
            }
        }

        private func run(_ roles: PostgresSecondLevelTests.TwoRoles) async throws {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("refused-\(UUID())")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: directory) }
            let server = try Server.settings()
            let password = try #require(roles.service.password)
            let url = "postgres://\(roles.serviceName):\(password)@\(server.host):\(server.port)/\(roles.database)"
            let channel = uniqueChannel("refused")
            let tenant = "tenant-\(UInt32.random(in: 0...UInt32.max))"
            let environment = [
                "POSTGRES_URL": url, "INVALIDATION_CHANNEL": channel, "INVALIDATION_SECRET": Server.secret,
                "WRITE_TOKEN": Server.writeToken, "TENANT_EXPIRY": "600", "LOG_LEVEL": "warning",
            ]
            let client = HTTPClient.shared
            try await withReplicas(
                3, environment: environment, directory: directory, listeningOn: channel, client: client
            ) {
                replicas in
                // The superuser, in the replicas' database: it takes pg_notify from them and gives it back.
                var admin = server.client
                admin.database = roles.database
                func notify(_ statement: String) async throws {
                    try await withClient(admin) { client in
                        try await client.query(PostgresQuery(unsafeSQL: statement), logger: quietLogger)
                    }
                }
                let revoke = "REVOKE EXECUTE ON FUNCTION pg_notify(text, text) FROM PUBLIC"
                let grant = "GRANT EXECUTE ON FUNCTION pg_notify(text, text) TO PUBLIC"

                // Every replica serves the first write.
                let first = try await replicas[0].write(tenant, ["write": "1"], client: client)
                for replica in replicas {
                    #expect(try await replica.serves(tenant, version: first, within: .seconds(10), client: client))
                }
                func reads() async throws -> Double {
                    var sum = 0.0
                    for replica in replicas {
                        sum += try await replica.metricSum("upstream_tenant_reads_total", client: client)
                    }
                    return sum
                }
                let readsBefore = try await reads()

                // The second write, while pg_notify is refused: stored, its message queued.
                try await notify(revoke)
                var request = HTTPClientRequest(url: "\(replicas[0].base)/config/\(tenant)")
                request.method = .PUT
                request.body = .bytes(ByteBuffer(string: #"{"write":"2"}"#))
                request.headers.add(name: "Authorization", value: "Bearer \(Server.writeToken)")
                let response = try await client.execute(request, timeout: .seconds(10))
                let body = try await response.body.collect(upTo: 1 << 16)
                #expect(response.status == .ok, "\(String(buffer: body))")
                #expect(response.headers.first(name: "X-Invalidation") == "queued")
                let second = try JSONDecoder().decode(ServedConfig.self, from: Data(String(buffer: body).utf8)).version
                #expect(second > first)
                // The others heard nothing: a second later they still serve the first write.
                try await Task.sleep(for: .seconds(1))
                for replica in replicas.dropFirst() {
                    #expect(try await servedConfig(tenant, at: replica.base, client: client)?.version == first)
                }

                // pg_notify given back: the writer's recovery sends the message at its next round.
                try await notify(grant)
                let allowed = ContinuousClock.now
                for replica in replicas.dropFirst() {
                    #expect(try await replica.serves(tenant, version: second, within: .seconds(30), client: client))
                }
                let converged = ContinuousClock.now - allowed
                let storeReads = try await reads() - readsBefore
                let resent = try await replicas[0].metricSum(
                    "async_state_invalidator_messages_total", containing: [#"event="resent""#], client: client)
                print(
                    "a write whose publish PostgreSQL refused (pg_notify revoked for 1 s): answered X-Invalidation: queued; "
                        + "once allowed, all three served it after \(Int(converged.milliseconds)) ms; "
                        + "store reads for it: \(Int(storeReads)); resent: \(Int(resent))")
                #expect(storeReads == 0)
                for replica in replicas { #expect(await replica.stop() == 0) }
            }
        }
    }
}
