import AsyncHTTPClient
import Foundation
import NIOCore
import PostgresNIO
import Synchronization
import Testing

extension RealServerTests {
    /// Three `hummingbird-service` processes (and a fourth started late) whose tenants go through the
    /// second level in PostgreSQL (`PostgresSecondLevel`): the fleet costs the tenant store one read
    /// per change, counted by the replicas' `upstream_tenant_reads_total`. Real processes, real time.
    @Suite(.enabled(if: Server.isAvailable, "needs ASYNCSTATE_POSTGRES_URL: run bash .ci/replicas"), .serialized)
    struct SecondLevelProcessTests {
        static let writes = 100
        /// Longer than the test: no read is an expiry's.
        static let expiry = Duration.seconds(600)
        static let outage = Duration.seconds(5)

        @Test(.timeLimit(.minutes(10)))
        func theFleetCostsTheTenantStoreOneReadPerChange() async throws {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("second-level-\(UUID())")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let channel = uniqueChannel("second_level")
            let tenant = "tenant-\(UInt32.random(in: 0...UInt32.max))"
            let environment = [
                "POSTGRES_URL": try #require(Server.url), "INVALIDATION_CHANNEL": channel,
                "INVALIDATION_SECRET": Server.secret, "WRITE_TOKEN": Server.writeToken,
                "TENANT_EXPIRY": "\(Self.expiry.components.seconds)", "LOG_LEVEL": "warning",
                // Generous on a loaded two-core machine: a second-level call that times out goes to
                // the store, and the counts below are exact.
                "SECOND_LEVEL_TIMEOUT": "3", "FETCH_TIMEOUT": "5",
                // A slow source: replicas that miss together overlap, and all but one wait.
                "TENANT_READ_LATENCY": "0.2",
            ]
            var replicas = try (1...3).map {
                try Replica(name: "replica-\($0)", environment: environment, directory: directory)
            }
            // Enough connections per replica for a thousand requests in flight to be concurrent.
            let client = HTTPClient(
                eventLoopGroupProvider: .singleton,
                configuration: HTTPClient.Configuration(
                    connectionPool: .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: 250)))
            do {
                for replica in replicas { try await replica.waitUntilListening(on: channel, client: client) }
                try await run(&replicas, tenant: tenant, environment: environment, directory: directory, client: client)
            } catch {
                for replica in replicas where replica.process.isRunning { replica.process.terminate() }
                try? await client.shutdown()
                throw error
            }
            for replica in replicas { #expect(await replica.stop() == 0) }
            try await client.shutdown()
            try? FileManager.default.removeItem(at: directory)
        }

        private func run(
            _ replicas: inout [Replica], tenant: String, environment: [String: String], directory: URL,
            client: HTTPClient
        ) async throws {
            // 1. A thousand concurrent cold requests on each replica: one read of the store. The
            // tenant is written into the store directly (a write through a replica would put it in
            // the second level too).
            let created = 1
            try await withClient { admin in
                // The replicas create the table at their first probe; this may come first.
                for try await _ in try await admin.query(
                    "CREATE TABLE IF NOT EXISTS tenant_configs (tenant text PRIMARY KEY, version bigint NOT NULL, settings text NOT NULL)",
                    logger: quietLogger)
                {}
                for try await _ in try await admin.query(
                    "INSERT INTO tenant_configs (tenant, version, settings) VALUES (\(tenant), 1, '{\"stage\":\"cold\"}')",
                    logger: quietLogger)
                {}
            }
            #expect(try await reads(replicas, client) == 0)
            let bases = replicas.map(\.base)
            let served = try await withThrowingTaskGroup(of: Int?.self) { group in
                // Round robin: the three replicas' first requests arrive together.
                for _ in 0..<1_000 {
                    for base in bases {
                        group.addTask { try await servedConfig(tenant, at: base, client: client)?.version }
                    }
                }
                return try await group.reduce(into: [Int?]()) { $0.append($1) }
            }
            #expect(served.count == 3_000 && served.allSatisfy { $0 == created })
            let coldReads = try await reads(replicas, client)
            #expect(coldReads == 1, "3 × 1,000 cold requests read the store \(coldReads) times")
            // One replica loaded; the other two took its entry (after waiting for its write, those
            // whose first request came while it loaded: the count of waits is printed).
            #expect(try await eventCount("loaded", replicas, client) == 1)
            #expect(try await eventCount("hit", replicas, client) == 2)
            print(
                "second level: 3 × 1,000 concurrent cold requests, \(coldReads) read of the tenant store; second level: \(try await events(replicas, client))"
            )

            // 2. Writes through rotating replicas: each goes through to the second level with a new
            // version, and every replica serves it from there, without a read of the store.
            var agreement: [Duration] = []
            var latest = created
            for write in 1...Self.writes {
                latest = try await replicas[write % replicas.count].write(tenant, ["write": "\(write)"], client: client)
                let start = ContinuousClock.now
                try await expectAllServe(tenant, version: latest, replicas, client: client)
                agreement.append(ContinuousClock.now - start)
            }
            let writeReads = try await reads(replicas, client) - coldReads
            #expect(writeReads == 0, "\(Self.writes) writes read the store \(writeReads) times")
            print(
                String(
                    format:
                        "second level: %d writes through 3 processes, %d reads of the tenant store; time until all three serve the new value (taken from the second level): p50 %.1f ms, p99 %.1f ms, max %.1f ms",
                    agreement.count, writeReads, percentile(agreement, 50).milliseconds,
                    percentile(agreement, 99).milliseconds, agreement.max()!.milliseconds))

            // 3. A replica started after the others serves from the second level, without a read.
            let late = try Replica(name: "replica-late", environment: environment, directory: directory)
            replicas.append(late)
            try await late.waitUntilListening(on: environment["INVALIDATION_CHANNEL"]!, client: client)
            #expect(try await servedConfig(tenant, at: late.base, client: client)?.version == latest)
            #expect(try await reads([late], client) == 0)
            #expect(
                try await late.metricSum(
                    "async_state_second_level_total", containing: [#"event="hit""#], client: client) == 1)

            // 4. Garbage in the table for a key: never served, the key read again once, replaced.
            let spoiled = tenant + "-g"
            let spoiledVersion = try await replicas[1].write(spoiled, ["stage": "garbage"], client: client)
            try await withClient { admin in
                let key = "tenants:\(spoiled)"
                let now = Date().timeIntervalSinceReferenceDate
                let garbage = ByteBuffer(bytes: Array("ASL2 but not what follows".utf8))
                for try await _ in try await admin.query(
                    """
                    UPDATE async_state_entries SET payload = \(garbage), succeeded_at = \(now),
                        fresh_until = \(now + 600), version = nextval('async_state_versions') WHERE key = \(key)
                    RETURNING 1
                    """, logger: quietLogger)
                {}
            }
            let beforeGarbage = try await reads(replicas, client)
            for replica in replicas {
                let config = try await servedConfig(spoiled, at: replica.base, client: client)
                #expect(config?.version == spoiledVersion && config?.settings == ["stage": "garbage"])
            }
            #expect(try await reads(replicas, client) - beforeGarbage == 1)
            #expect(try await eventCount("undecodable", replicas, client) >= 1)

            // 5. PostgreSQL stopped for five seconds under load: every request for data in memory is
            // answered; then the replicas reconnect and a write reaches all of them.
            let (answered, failed) = try await underLoad(of: [tenant, spoiled], on: replicas, client: client) {
                try Server.stop()
                try await Task.sleep(for: Self.outage)
                try Server.start()
                let channel = environment["INVALIDATION_CHANNEL"]!
                for replica in replicas {
                    let back = try await eventually(timeout: .seconds(60)) {
                        try await replica.metric(
                            "async_state_bus_reconnections_total{channel=\"\(channel)\"}", client: client)
                            ?? 0 >= 1
                    }
                    try #require(back, "replica on port \(replica.port) never reconnected; see \(replica.log.path)")
                }
                try await Task.sleep(for: .seconds(1))
            }
            print(
                "second level: PostgreSQL stopped for \(Self.outage): \(answered) requests answered, \(failed) failed")
            #expect(failed == 0)
            #expect(answered > 100)
            let after = try await replicas[2].write(tenant, ["stage": "after the outage"], client: client)
            try await expectAllServe(tenant, version: after, replicas, client: client)
        }

        /// Requires every replica to serve `version` of `tenant` (or newer) within 20 s.
        private func expectAllServe(_ tenant: String, version: Int, _ replicas: [Replica], client: HTTPClient)
            async throws
        {
            for replica in replicas {
                let serves = try await replica.serves(tenant, version: version, within: .seconds(20), client: client)
                try #require(serves, "replica on port \(replica.port) never served version \(version) of \(tenant)")
            }
        }

        /// The reads of the tenant store the replicas made, in all.
        private func reads(_ replicas: [Replica], _ client: HTTPClient) async throws -> Int {
            Int(try await replicas.asyncSum { try await $0.metricSum("upstream_tenant_reads_total", client: client) })
        }

        /// The second level's events on all replicas, by name.
        private func events(_ replicas: [Replica], _ client: HTTPClient) async throws -> String {
            var counts: [String] = []
            for event in ["hit", "loaded", "waiting", "fault", "skipped"] {
                counts.append("\(try await eventCount(event, replicas, client)) \(event)")
            }
            return counts.joined(separator: ", ")
        }

        /// How many times the replicas' second level reported `event`, in all.
        private func eventCount(_ event: String, _ replicas: [Replica], _ client: HTTPClient) async throws -> Int {
            Int(
                try await replicas.asyncSum {
                    try await $0.metricSum(
                        "async_state_second_level_total", containing: [#"event="\#(event)""#], client: client)
                })
        }

        /// Requests `tenants` from every replica, one after another on each, while `body` runs; how many
        /// were answered with a 200, and how many with anything else.
        private func underLoad(
            of tenants: [String], on replicas: [Replica], client: HTTPClient,
            _ body: () async throws -> Void
        ) async throws -> (answered: Int, failed: Int) {
            final class Load: Sendable {
                let counts = Mutex((answered: 0, failed: 0))
                let stopped = Mutex(false)
            }
            let load = Load()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for base in replicas.map(\.base) {
                    group.addTask {
                        var index = 0
                        while !load.stopped.withLock({ $0 }) {
                            let (status, _) = try await client.call("\(base)/config/\(tenants[index % tenants.count])")
                            load.counts.withLock { counts in
                                if status == 200 { counts.answered += 1 } else { counts.failed += 1 }
                            }
                            index += 1
                            try await Task.sleep(for: .milliseconds(2))
                        }
                    }
                }
                try await Task.sleep(for: .milliseconds(300))
                do {
                    try await body()
                } catch {
                    load.stopped.withLock { $0 = true }
                    throw error
                }
                load.stopped.withLock { $0 = true }
                try await group.waitForAll()
            }
            return load.counts.withLock { $0 }
        }
    }
}

extension Array {
    /// The sum of `value` over the elements, one after another.
    func asyncSum(_ value: (Element) async throws -> Double) async rethrows -> Double {
        var sum = 0.0
        for element in self { sum += try await value(element) }
        return sum
    }
}
