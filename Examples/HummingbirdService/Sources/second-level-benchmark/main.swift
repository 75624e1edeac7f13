// A miss that the second level answers, against what a hand-written cache would do instead: query
// the same row of the same table through the same client and decode it. Both run one after the
// other, in rounds that alternate which goes first, on one PostgreSQL server; the figures are each
// round's mean per key, and the ratio of the medians.
//
//   POSTGRES_URL=postgres://user:password@127.0.0.1:port/database \
//       swift run -c release --package-path Examples/HummingbirdService second-level-benchmark [KEYS] [ROUNDS]
//
// (`bash .ci/replicas` runs it against its throwaway server.) A plain connection, for a server on
// the loopback interface only.
import AsyncStateKit
import Foundation
import Logging
import PostgresFleetCache
import PostgresNIO
import Synchronization

/// A value the size of a tenant's configuration.
struct Item: Codable, Sendable, Equatable {
    var id: String
    var version: Int
    var settings: [String: String]

    init(id: String) {
        self.id = id
        version = 1
        settings = ["plan": "team", "region": "eu-west-1", "limit": "1000", "theme": "dark"]
    }
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("second-level-benchmark: \(message)\n".utf8))
    exit(1)
}

let arguments = CommandLine.arguments.dropFirst().map { Int($0) }
guard arguments.allSatisfy({ ($0 ?? 0) > 0 }) else { fail("usage: second-level-benchmark [KEYS] [ROUNDS]") }
let keyCount = arguments.first.flatMap { $0 } ?? 2_000
let rounds = arguments.dropFirst().first.flatMap { $0 } ?? 7

guard let text = ProcessInfo.processInfo.environment["POSTGRES_URL"], let url = URLComponents(string: text),
    let host = url.host, ["127.0.0.1", "localhost", "::1"].contains(host), let user = url.user
else { fail("POSTGRES_URL must be postgres://user:password@127.0.0.1:port/database (a loopback server)") }
let configuration = PostgresClient.Configuration(
    host: host, port: url.port ?? 5432, username: user, password: url.password,
    database: String(url.path.dropFirst()), tls: .disable)
var logger = Logger(label: "second-level-benchmark")
logger.logLevel = .warning
let client = PostgresClient(configuration: configuration, backgroundLogger: logger)
let benchmark = Benchmark(
    client: client, level: PostgresSecondLevel(client: client, logger: logger),
    namespace: "benchmark\(UInt32.random(in: 0...UInt32.max))", keys: (0..<keyCount).map { "item-\($0)" },
    rounds: rounds, logger: logger)
try await withThrowingTaskGroup(of: Void.self) { group in
    group.addTask { await client.run() }
    defer { group.cancelAll() }
    // Off the main actor, as a request handler runs: both sides hop between the same executors.
    print(try await Task.detached { try await benchmark.run() }.value)
}

/// The source calls of the cold replicas (there must be none).
final class Calls: Sendable {
    let count = Mutex(0)
}

/// Both sides, for every key, in rounds.
struct Benchmark: Sendable {
    let client: PostgresClient
    let level: PostgresSecondLevel
    let namespace: String
    let keys: [String]
    let rounds: Int
    let logger: Logger
    let codec = AsyncStateCodec<Item>.json(tag: "Item")

    /// A family of this process's memory on the shared second level: a new one is cold.
    func family() -> AsyncStateFamily<String, Item> {
        AsyncStateFamily(
            expiry: .seconds(3_600), capacity: keys.count * 2,
            secondLevel: AsyncStateSecondLevelOptions(level: level, namespace: namespace, codec: codec))
    }

    /// The mean time per key of `body` run for every key.
    func timed(_ body: (String) async throws -> Void) async throws -> Duration {
        let start = ContinuousClock.now
        for key in keys { try await body(key) }
        return (ContinuousClock.now - start) / keys.count
    }

    /// A cold replica: every key a miss, answered by the second level (no source call).
    func throughTheFamily(calls: Calls) async throws -> Duration {
        let reader = family()
        return try await timed { key in
            let item = try await reader.value(for: key) { id in
                calls.count.withLock { $0 += 1 }
                return Item(id: id)
            }
            guard item.id == key else { fail("the family answered \(item.id) for \(key)") }
        }
    }

    /// By hand: the row, its freshness, its payload decoded.
    func directly() async throws -> Duration {
        try await timed { key in
            let rows = try await client.query(
                "SELECT payload, succeeded_at, fresh_until, version FROM async_state_entries WHERE key = \(namespace + ":" + key)",
                logger: logger)
            var found: Item?
            for try await (payload, _, freshUntil, _) in rows.decode((ByteBuffer, Double, Double, Int64).self) {
                guard freshUntil > Date().timeIntervalSinceReferenceDate else { break }
                found = try codec.decode(Array(payload.readableBytesView))
            }
            guard found?.id == key else { fail("the query found no fresh \(key)") }
        }
    }

    func run() async throws -> String {
        // One replica loads every key: each is then in the table, fresh for an hour.
        let writer = family()
        for key in keys { _ = try await writer.value(for: key) { Item(id: $0) } }
        guard writer.secondLevelStatistics?.loads == keys.count else {
            fail(
                "the writer loaded \(writer.secondLevelStatistics?.loads ?? 0) of \(keys.count) keys through the second level"
            )
        }
        var (family, direct): ([Duration], [Duration]) = ([], [])
        let calls = Calls()
        for round in 0..<rounds {
            if round.isMultiple(of: 2) {
                family.append(try await throughTheFamily(calls: calls))
                direct.append(try await directly())
            } else {
                direct.append(try await directly())
                family.append(try await throughTheFamily(calls: calls))
            }
        }
        let called = calls.count.withLock { $0 }
        guard called == 0 else { fail("a cold replica called the source \(called) times") }
        // The rows stay behind otherwise (one per key): take them out.
        for try await _ in try await client.query(
            "DELETE FROM async_state_entries WHERE starts_with(key, \(namespace + ":"))", logger: logger)
        {}
        func figures(_ rounds: [Duration]) -> String {
            let each = rounds.map { String(format: "%.0f", microseconds($0)) }.joined(separator: " ")
            return String(format: "%.1f µs per key (rounds: ", microseconds(median(rounds))) + each + ")"
        }
        let ratio = microseconds(median(family)) / microseconds(median(direct))
        return
            "second-level-benchmark: \(keys.count) keys × \(rounds) rounds, medians of the rounds: a miss answered by "
            + "the second level \(figures(family)); a direct query of the same row, decoded, \(figures(direct)); "
            + String(format: "ratio %.2f", ratio)
    }
}

func microseconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) * 1e6 + Double(duration.components.attoseconds) / 1e12
}

func median(_ values: [Duration]) -> Duration { values.sorted()[values.count / 2] }
