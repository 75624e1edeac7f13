import AsyncHTTPClient
import Foundation
import PostgresNIO
import Synchronization
import Testing

extension RealServerTests {
    /// Unauthenticated GETs of tenants that do not exist, through a `hummingbird-service` process
    /// with the second level on: each takes and gives back a lease in the second level's table, and
    /// none may leave a row there.
    @Suite(.enabled(if: Server.isAvailable, "needs ASYNCSTATE_POSTGRES_URL: run bash .ci/replicas"), .serialized)
    struct AbsentTenantsProcessTests {
        /// 10,000 in `.ci/replicas` (17 s with debug builds); `ASYNCSTATE_ABSENT_GETS=100000` for the
        /// issue's figure (three minutes on a two-core machine).
        static let requests =
            ProcessInfo.processInfo.environment["ASYNCSTATE_ABSENT_GETS"].flatMap { Int($0) } ?? 10_000

        @Test(.timeLimit(.minutes(10)))
        func getsOfTenantsThatDoNotExistLeaveNoRows() async throws {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("absent-\(UUID())")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let channel = uniqueChannel("absent")
            let prefix = "nobody\(UInt32.random(in: 0...UInt32.max))-"
            let replica = try Replica(
                name: "replica",
                environment: [
                    "POSTGRES_URL": try #require(Server.url), "INVALIDATION_CHANNEL": channel,
                    "INVALIDATION_SECRET": Server.secret, "LOG_LEVEL": "error", "SECOND_LEVEL_TIMEOUT": "3",
                    "FETCH_TIMEOUT": "5",
                ], directory: directory)
            let client = HTTPClient(
                eventLoopGroupProvider: .singleton,
                configuration: HTTPClient.Configuration(
                    connectionPool: .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: 64)))
            defer { try? FileManager.default.removeItem(at: directory) }
            do {
                try await replica.waitUntilListening(on: channel, client: client)
                let base = replica.base
                let started = ContinuousClock.now
                let answered = try await withThrowingTaskGroup(of: [Int: Int].self) { group in
                    for worker in 0..<32 {
                        group.addTask {
                            var counted: [Int: Int] = [:]
                            for index in stride(from: worker, to: Self.requests, by: 32) {
                                let (status, _) = try await client.call("\(base)/config/\(prefix)\(index)")
                                counted[status, default: 0] += 1
                            }
                            return counted
                        }
                    }
                    return try await group.reduce(into: [Int: Int]()) { $0.merge($1, uniquingKeysWith: +) }
                }
                let elapsed = ContinuousClock.now - started
                // A lease is given back in a task of its own once its miss has answered: the last
                // ones may still be on their way.
                let rows = Mutex<Int64>(-1)
                let emptied = try await eventually(timeout: .seconds(10)) {
                    try await withClient { database in
                        let counted = try await database.query(
                            "SELECT count(*)::bigint FROM public.async_state_entries WHERE starts_with(key, \("tenants:" + prefix))",
                            logger: quietLogger)
                        for try await value in counted.decode(Int64.self) { rows.withLock { $0 = value } }
                    }
                    return rows.withLock { $0 } == 0
                }
                print(
                    "\(Self.requests) GETs of tenants that do not exist through one service (\(elapsed)): "
                        + "answers \(answered.sorted { $0.key < $1.key }), "
                        + "\(rows.withLock { $0 }) rows left in async_state_entries")
                #expect(answered[404] == Self.requests, "\(answered)")
                #expect(emptied)
            } catch {
                if replica.process.isRunning { replica.process.terminate() }
                try? await client.shutdown()
                throw error
            }
            #expect(await replica.stop() == 0)
            try await client.shutdown()
        }
    }
}
