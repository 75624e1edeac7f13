public import AsyncStateKit
public import Foundation
import Synchronization

/// The host's load averages, as `/proc/loadavg` gives them.
public struct LoadAverage: Sendable, Equatable, CustomStringConvertible {
    /// The 1, 5 and 15-minute load averages.
    public var one, five, fifteen: Double
    /// Runnable and total scheduling entities (`1/389`).
    public var runnable, total: Int

    /// Parses a `/proc/loadavg` line: `0.52 0.58 0.59 1/389 12345`.
    public init(procLine line: String) throws {
        let fields = line.split(whereSeparator: \.isWhitespace)
        guard fields.count >= 4,
            let one = Double(fields[0]), let five = Double(fields[1]), let fifteen = Double(fields[2])
        else { throw DemoError.malformed("/proc/loadavg", line) }
        let tasks = fields[3].split(separator: "/")
        guard tasks.count == 2, let runnable = Int(tasks[0]), let total = Int(tasks[1]) else {
            throw DemoError.malformed("/proc/loadavg", line)
        }
        (self.one, self.five, self.fifteen, self.runnable, self.total) = (one, five, fifteen, runnable, total)
    }

    public var description: String {
        String(format: "load %.2f %.2f %.2f, %d/%d runnable", one, five, fifteen, runnable, total)
    }
}

/// Settings read from a JSON file that another task rewrites.
public struct Settings: Sendable, Equatable, Codable, CustomStringConvertible {
    /// Bumped on every rewrite.
    public var version: Int
    /// The message of the day.
    public var motd: String

    public init(version: Int, motd: String) {
        self.version = version
        self.motd = motd
    }

    public var description: String { "v\(version) \"\(motd)\"" }
}

/// A price from the flaky upstream.
public struct Quote: Sendable, Equatable, CustomStringConvertible {
    /// The price.
    public var price: Double
    /// Which call to the upstream answered it (1-based).
    public var call: Int

    public init(price: Double, call: Int) {
        self.price = price
        self.call = call
    }

    public var description: String { String(format: "price %.2f (upstream call %d)", price, call) }
}

/// What the demo's sources throw.
public enum DemoError: Error, Equatable, CustomStringConvertible {
    /// A source could not be read.
    case unreadable(String)
    /// A source was read but made no sense.
    case malformed(String, String)
    /// The upstream answered with an HTTP-like error status.
    case upstream(status: Int)

    public var description: String {
        switch self {
        case .unreadable(let path): "cannot read \(path)"
        case .malformed(let path, let content): "\(path) is malformed: \(content.prefix(40))"
        case .upstream(let status): "upstream answered \(status)"
        }
    }
}

/// Reads the load averages: the real `/proc/loadavg`, or (in virtual time, where the timeline must
/// be the same on every run) recorded lines in the same format, one per read.
public final class LoadAverageSource: Sendable {
    /// Returns the text of read number `index` (0-based).
    private let readLine: @Sendable (_ index: Int) throws -> String
    private let reads = Mutex(0)

    /// The host's `/proc/loadavg`.
    public static func proc(path: String = "/proc/loadavg") -> LoadAverageSource {
        LoadAverageSource { _ in
            guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
                throw DemoError.unreadable(path)
            }
            return text
        }
    }

    /// Recorded `/proc/loadavg` lines, returned in turn (the last one repeats; none: every read fails).
    public static func recorded(_ lines: [String]) -> LoadAverageSource {
        LoadAverageSource { index in
            guard let last = lines.indices.last else { throw DemoError.unreadable("recorded load averages") }
            return lines[min(index, last)]
        }
    }

    private init(readLine: @escaping @Sendable (_ index: Int) throws -> String) {
        self.readLine = readLine
    }

    /// How many times the source was read.
    public var readCount: Int { reads.withLock { $0 } }

    /// Reads and parses one line.
    public func read() throws -> LoadAverage {
        let index = reads.withLock { count in
            defer { count += 1 }
            return count
        }
        return try LoadAverage(procLine: readLine(index))
    }
}

/// A JSON settings file on disk.
public final class SettingsFile: Sendable {
    /// Where the file is.
    public let url: URL
    private let reads = Mutex(0)

    /// A settings file at `url` (not created until ``write(_:)``).
    public init(url: URL) {
        self.url = url
    }

    /// How many times the file was read by ``read()``.
    public var readCount: Int { reads.withLock { $0 } }

    /// Reads and decodes the file.
    public func read() throws -> Settings {
        reads.withLock { $0 += 1 }
        let data = try contents()
        do {
            return try JSONDecoder().decode(Settings.self, from: data)
        } catch {
            throw DemoError.malformed(url.lastPathComponent, String(decoding: data, as: UTF8.self))
        }
    }

    /// The file's bytes, for noticing changes.
    public func contents() throws -> Data {
        do {
            return try Data(contentsOf: url)
        } catch {
            throw DemoError.unreadable(url.lastPathComponent)
        }
    }

    /// Rewrites the file atomically.
    public func write(_ settings: Settings) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        try encoder.encode(settings).write(to: url, options: .atomic)
    }
}

/// A slow upstream that fails some of its calls: every call takes `latency` on the given clock, and
/// the calls numbered in `failingCalls` answer 503.
public final class FlakyUpstream: Sendable {
    /// How long each call takes.
    public let latency: Duration
    /// The 1-based calls that fail.
    public let failingCalls: Set<Int>
    private let calls = Mutex(0)

    public init(latency: Duration, failingCalls: Set<Int>) {
        self.latency = latency
        self.failingCalls = failingCalls
    }

    /// How many calls were made.
    public var callCount: Int { calls.withLock { $0 } }

    /// Makes one call.
    public func fetchQuote(clock: any Clock<Duration>) async throws -> Quote {
        let call = calls.withLock { count in
            count += 1
            return count
        }
        try await clock.sleep(for: latency)
        if failingCalls.contains(call) { throw DemoError.upstream(status: 503) }
        return Quote(price: 100 + Double(call) * 0.25, call: call)
    }
}

/// One entry of the audit log.
public struct AuditEntry: Sendable, Equatable {
    /// 1-based, in the log's order.
    public var number: Int
}

/// An upstream listing read page by page: an audit log of `count` entries, `pageSize` per page, the
/// cursor being the offset of the page's first entry. Each page takes `latency` on the given clock.
public final class AuditLog: Sendable {
    /// Entries in the log.
    public let count: Int
    /// Entries per page.
    public let pageSize: Int
    /// How long each page read takes.
    public let latency: Duration
    private let reads = Mutex(0)

    public init(count: Int, pageSize: Int, latency: Duration) {
        (self.count, self.pageSize, self.latency) = (count, pageSize, latency)
    }

    /// How many pages were read.
    public var readCount: Int { reads.withLock { $0 } }

    /// Reads the page that starts at `cursor` (`nil`: the first).
    public func page(at cursor: Int?, clock: any Clock<Duration>) async throws -> AsyncPage<AuditEntry, Int> {
        reads.withLock { $0 += 1 }
        try await clock.sleep(for: latency)
        let start = max(0, cursor ?? 0)
        let end = min(start + pageSize, count)
        let entries = (start..<max(start, end)).map { AuditEntry(number: $0 + 1) }
        return AsyncPage(items: entries, next: end < count ? end : nil)
    }
}
