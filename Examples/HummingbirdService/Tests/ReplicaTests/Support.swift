import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import PostgresInvalidation
import PostgresNIO
import StateService
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Every suite here, one at a time: they share a server (which one of them restarts), measure time,
/// and must not load the machine for each other.
@Suite(.serialized) enum RealServerTests {}

/// The PostgreSQL server these tests run against, from the environment `bash .ci/replicas` sets:
/// `ASYNCSTATE_POSTGRES_URL` (`postgres://user@host:port/database`) and `ASYNCSTATE_POSTGRES_DIR` (the
/// directory `.ci/postgres` made, for restarting the server). Without them the tests are skipped.
enum Server {
    static let url = ProcessInfo.processInfo.environment["ASYNCSTATE_POSTGRES_URL"]
    static let directory = ProcessInfo.processInfo.environment["ASYNCSTATE_POSTGRES_DIR"]
    static var isAvailable: Bool { url != nil }

    /// Where ``url`` points, parsed as the service parses `POSTGRES_URL`.
    static func settings() throws -> PostgresSettings {
        try PostgresSettings(url: try #require(Server.url, "ASYNCSTATE_POSTGRES_URL"))
    }

    /// The secret the replicas of a test share, and the token its writes present.
    static let secret = "replica-tests-secret-\(UUID().uuidString)"
    static let writeToken = "replica-tests-token-\(UUID().uuidString)"

    /// Stops the server (a fast shutdown: every connection is cut) and starts it again.
    static func restart() throws { try control("restart") }

    /// Stops the server (a fast shutdown) until ``start()``.
    static func stop() throws { try control("stop") }

    /// Starts the server ``stop()`` stopped, on the same port.
    static func start() throws {
        let directory = try #require(Server.directory, "ASYNCSTATE_POSTGRES_DIR")
        let port = try String(contentsOfFile: directory + "/port", encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        try control("start", port)
    }

    /// Runs `bash .ci/postgres COMMAND DIR [ARGUMENT]` and waits for it.
    private static func control(_ command: String, _ argument: String? = nil) throws {
        let directory = try #require(Server.directory, "ASYNCSTATE_POSTGRES_DIR")
        let script = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent(".ci/postgres")
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/bash")
        process.arguments = [script.path, command, directory] + (argument.map { [$0] } ?? [])
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0, "bash .ci/postgres \(command) failed")
    }
}

/// A channel no other test uses.
func uniqueChannel(_ prefix: String) -> String {
    "\(prefix)_\(UInt32.random(in: 0...UInt32.max))"
}

let quietLogger: Logger = {
    var logger = Logger(label: "replica-tests")
    logger.logLevel = .critical
    return logger
}()

/// Polls `condition` on the real clock every millisecond until it holds or `timeout` passes.
func eventually(timeout: Duration, _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: .milliseconds(1))
    }
    return try await condition()
}

/// A TCP socket bound to a port of the kernel's choice on 127.0.0.1 (listening if `listening`).
func loopbackSocket(listening: Bool = false) throws -> (descriptor: Int32, port: Int) {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    try #require(descriptor >= 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
            bind(descriptor, pointer, length) == 0 && (!listening || listen(descriptor, 16) == 0)
                && getsockname(descriptor, pointer, &length) == 0
        }
    }
    guard bound else {
        close(descriptor)
        throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
    }
    return (descriptor, Int(UInt16(bigEndian: address.sin_port)))
}

/// A TCP port on 127.0.0.1 that nothing listens on (the kernel's choice, released at once).
func freePort() throws -> Int {
    let (descriptor, port) = try loopbackSocket()
    close(descriptor)
    return port
}

/// A TCP server on 127.0.0.1 that accepts connections and never answers a byte (as a server behind
/// a black hole would look), counting them.
final class SilentServer: Sendable {
    let port: Int
    private let listener: Int32
    private let accepted = Accepted()

    private final class Accepted: Sendable {
        let connections = Mutex<[Int32]>([])
    }

    init() throws {
        let (descriptor, port) = try loopbackSocket(listening: true)
        listener = descriptor
        self.port = port
        let accepted = accepted
        Thread {
            while true {
                let connection = accept(descriptor, nil, nil)
                if connection < 0 { return }  // stopped
                accepted.connections.withLock { $0.append(connection) }
            }
        }.start()
    }

    /// Connections accepted so far.
    var connections: Int { accepted.connections.withLock { $0.count } }

    /// Stops accepting and closes every connection.
    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        for connection in accepted.connections.withLock({ $0 }) { close(connection) }
    }
}

/// A `hummingbird-service` process, its output in a file.
final class Replica {
    let port: Int
    let process: Process
    let log: URL
    /// Where the replica writes its spans (`TRACE_FILE`), as JSON lines.
    let trace: URL

    /// Starts the service built beside this test binary with `environment` added to this process's.
    init(name: String, environment: [String: String], directory: URL) throws {
        let binary = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
            .deletingLastPathComponent().appendingPathComponent("hummingbird-service")
        try #require(
            FileManager.default.isExecutableFile(atPath: binary.path),
            "build the service first: swift build --package-path Examples/HummingbirdService")
        port = try freePort()
        log = directory.appendingPathComponent("\(name).log")
        trace = directory.appendingPathComponent("\(name).spans.jsonl")
        try #require(FileManager.default.createFile(atPath: log.path, contents: nil))
        let output = try FileHandle(forWritingTo: log)
        process = Process()
        process.executableURL = binary
        process.environment = ProcessInfo.processInfo.environment.merging(
            environment.merging(["PORT": "\(port)", "TRACE_FILE": trace.path]) {
                $1
            }
        ) { $1 }
        process.standardOutput = output
        process.standardError = output
        try process.run()
    }

    var base: String { "http://127.0.0.1:\(port)" }

    /// Sends SIGTERM and waits for the exit; returns the exit status.
    func stop() async -> Int32 {
        if process.isRunning { process.terminate() }
        while process.isRunning { try? await Task.sleep(for: .milliseconds(5)) }
        return process.terminationStatus
    }

    /// The spans the replica wrote (read once it has stopped): each a JSON object (see `TraceExport`).
    func spans() throws -> [[String: Any]] {
        try String(contentsOf: trace, encoding: .utf8).split(separator: "\n").compactMap {
            try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    /// Waits up to a minute for the replica's bus to listen on `channel` (its gauge at 1).
    func waitUntilListening(on channel: String, client: HTTPClient) async throws {
        let up = try await eventually(timeout: .seconds(60)) {
            try await metric("async_state_bus_listening{channel=\"\(channel)\"}", client: client) == 1
        }
        try #require(up, "replica on port \(port) never listened; see \(log.path)")
    }

    /// Writes `settings` for `tenant` through this replica (retried for a minute while it refuses:
    /// 503 while PostgreSQL is down); the tenant's new version.
    func write(_ tenant: String, _ settings: [String: String], client: HTTPClient) async throws -> Int {
        let body = String(decoding: try JSONEncoder().encode(settings), as: UTF8.self)
        var version: Int?
        let written = try await eventually(timeout: .seconds(60)) {
            let (status, answer) = try await client.call(
                "\(base)/config/\(tenant)", method: .PUT, body: body, token: Server.writeToken)
            guard status == 200 else { return false }
            version = try JSONDecoder().decode(ServedConfig.self, from: Data(answer.utf8)).version
            return true
        }
        try #require(written, "a write of \(settings) to \(tenant) was not accepted for a minute")
        return try #require(version)
    }

    /// Whether the replica serves `version` of `tenant` (or a newer one) within `timeout`.
    func serves(_ tenant: String, version: Int, within timeout: Duration, client: HTTPClient) async throws -> Bool {
        try await eventually(timeout: timeout) {
            try await servedConfig(tenant, at: base, client: client)?.version ?? 0 >= version
        }
    }

    /// The sum of the values of the metric `name`'s lines (with any labels) that contain every one
    /// of `fragments` (`event="hit"`); 0 when there are none.
    func metricSum(_ name: String, containing fragments: [String] = [], client: HTTPClient) async throws -> Double {
        let (status, body) = try await client.call("\(base)/metrics")
        guard status == 200 else { return 0 }
        var sum = 0.0
        for line in body.split(separator: "\n") where line.hasPrefix(name + " ") || line.hasPrefix(name + "{") {
            guard fragments.allSatisfy({ line.contains($0) }), let value = line.split(separator: " ").last else {
                continue
            }
            sum += Double(value) ?? 0
        }
        return sum
    }

    /// The value of the metric line that starts with `series`, or `nil`.
    func metric(_ series: String, client: HTTPClient) async throws -> Double? {
        let (status, body) = try await client.call("\(base)/metrics")
        guard status == 200 else { return nil }
        for line in body.split(separator: "\n") where line.hasPrefix(series + " ") {
            return Double(line.dropFirst(series.count + 1))
        }
        return nil
    }
}

/// Runs `count` service processes (`replica-1`…) with `environment`, their output in `directory`,
/// each waited for until its bus listens on `channel`, for `body`; whichever still runs when `body`
/// returns or throws is terminated (`body` stops them itself to check how they exit).
func withReplicas<T>(
    _ count: Int, environment: [String: String], directory: URL, listeningOn channel: String, client: HTTPClient,
    _ body: ([Replica]) async throws -> T
) async throws -> T {
    let replicas = try (1...count).map {
        try Replica(name: "replica-\($0)", environment: environment, directory: directory)
    }
    defer { for replica in replicas where replica.process.isRunning { replica.process.terminate() } }
    for replica in replicas { try await replica.waitUntilListening(on: channel, client: client) }
    return try await body(replicas)
}

/// A tenant's configuration as a replica serves it (`GET` and `PUT /config/:tenant`).
struct ServedConfig: Decodable, Equatable {
    var version: Int
    var settings: [String: String]
}

/// What the replica at `base` serves for `tenant`, or `nil` for anything but a 200 with a
/// configuration.
func servedConfig(_ tenant: String, at base: String, client: HTTPClient) async throws -> ServedConfig? {
    let (status, body) = try await client.call("\(base)/config/\(tenant)")
    guard status == 200 else { return nil }
    return try? JSONDecoder().decode(ServedConfig.self, from: Data(body.utf8))
}

extension HTTPClient {
    /// One request: its status and body (status 0 when the server cannot be reached).
    func call(
        _ url: String, method: HTTPMethod = .GET, body: String? = nil, token: String? = nil
    ) async throws -> (Int, String) {
        var request = HTTPClientRequest(url: url)
        request.method = method
        if let body { request.body = .bytes(ByteBuffer(string: body)) }
        if let token { request.headers.add(name: "Authorization", value: "Bearer \(token)") }
        do {
            let response = try await execute(request, timeout: .seconds(10))
            let bytes = try await response.body.collect(upTo: 1 << 20)
            return (Int(response.status.code), String(buffer: bytes))
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            return (0, "\(error)")
        }
    }
}

/// The `p`-th percentile (0…100) of `values`, by the nearest-rank method.
func percentile(_ values: [Duration], _ p: Double) -> Duration {
    let sorted = values.sorted()
    let rank = max(1, Int((p / 100 * Double(sorted.count)).rounded(.up)))
    return sorted[min(rank, sorted.count) - 1]
}

extension Duration {
    var milliseconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) * 1_000 + Double(attoseconds) / 1e15
    }
}
