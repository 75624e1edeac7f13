import AsyncStateKit
import AsyncStateTesting
public import Foundation

/// One line of the demo's timeline: a phase transition of one of the monitor's states, or something
/// the scenario did.
public struct TimelineEntry: Sendable, Equatable {
    /// Time since the scenario started, on the scenario's clock.
    public var elapsed: Duration
    /// The wall date (the clock's, for a `VirtualClock`).
    public var date: Date
    /// `load`, `settings`, `quote`, or `writer` / `watcher` for the scenario's own actions.
    public var source: String
    /// What happened.
    public var text: String

    public init(elapsed: Duration, date: Date, source: String, text: String) {
        self.elapsed = elapsed
        self.date = date
        self.source = source
        self.text = text
    }

    /// ` +2.700s  2026-01-01 09:00:02.700  quote     success  price 100.75 (upstream call 3)`
    public var rendered: String {
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let time = String(format: "+%.3fs", seconds)
        let paddedTime = String(repeating: " ", count: max(0, 8 - time.count)) + time
        let padded = source.padding(toLength: 9, withPad: " ", startingAt: 0)
        return "\(paddedTime)  \(Self.format(date))  \(padded) \(text)"
    }

    /// `2026-01-01 09:00:02.700`, in UTC.
    public static func format(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyy-MM-dd HH:mm:ss.SSS"
        return formatter.string(from: date)
    }
}

/// What the scenario's requests got, and how little work the sources did for them.
public struct ScenarioSummary: Sendable, Equatable {
    /// Requests made; each asks for all three values at once.
    public var requests: Int
    /// Reads of the load-average source.
    public var loadReads: Int
    /// Reads of the settings file.
    public var settingsReads: Int
    /// Calls to the upstream.
    public var upstreamCalls: Int
    /// Requests that got a quote, and requests that got the upstream's error.
    public var quotesServed: Int, quoteErrors: Int
    /// The quote still readable at the end (`monitor.quote`), after the last fetch failed.
    public var lastQuote: Quote?
    /// Pages of the audit log read for its two walks.
    public var auditReads: Int

    public init(
        requests: Int, loadReads: Int, settingsReads: Int, upstreamCalls: Int, quotesServed: Int, quoteErrors: Int,
        lastQuote: Quote?, auditReads: Int
    ) {
        (self.requests, self.loadReads, self.settingsReads, self.upstreamCalls) =
            (requests, loadReads, settingsReads, upstreamCalls)
        (self.quotesServed, self.quoteErrors, self.lastQuote) = (quotesServed, quoteErrors, lastQuote)
        self.auditReads = auditReads
    }

    /// The summary in words, as the demo prints it.
    public var lines: [String] {
        [
            "\(requests) requests, each asking for all three values (\(requests / Scenario.ticks) at a time, once a second):",
            "  load averages read \(loadReads) times (fresh for 1.5 s)",
            "  settings.json read \(settingsReads) times (read again only after the watcher saw a change)",
            "  upstream called \(upstreamCalls) times, retries included; \(quotesServed) requests got a quote, "
                + "\(quoteErrors) got its error",
            "  the last good quote is still readable: \(lastQuote.map(String.init(describing:)) ?? "none")",
            "  the audit log (250 entries, 100 a page) walked twice: \(auditReads) page reads (kept for a minute)",
        ]
    }
}

/// The demo's script, the same on a real and on a virtual clock:
///
/// - every second for ten seconds, five request handlers ask for all three values at once;
/// - `/proc/loadavg` is fresh for 1.5 s, so it is read at 0, 2, 4, 6 and 8 s, once each time;
/// - a writer rewrites `settings.json` at 3.2 s and 6.2 s; a watcher polling every 0.5 s notices the
///   change and invalidates the settings, which the next request reads again;
/// - the upstream takes 0.4 s a call and fails its calls 1, 2, 4, 5 and 6: the first fetch succeeds on
///   its third attempt at 2.7 s, the second (at 7 s, once the quote is 4 s old) fails all three and
///   ends in `failure`, while the last good quote stays readable.
public struct Scenario: Sendable {
    /// Seconds the requests run for.
    public static let ticks = 10
    /// Request handlers started each second.
    public static let handlersPerTick = 5
    /// The upstream calls that fail.
    public static let failingUpstreamCalls: Set<Int> = [1, 2, 4, 5, 6]
    /// The virtual clock's wall date at the start: 2026-01-01 09:00:00 UTC.
    public static let virtualStartDate = Date(timeIntervalSince1970: 1_767_258_000)
    /// Recorded `/proc/loadavg` lines, read in turn in virtual time.
    public static let recordedLoad = [
        "0.52 0.58 0.59 1/389 12345", "0.61 0.60 0.59 2/391 12351", "0.74 0.63 0.60 3/390 12360",
        "0.70 0.63 0.60 1/388 12371", "0.66 0.62 0.60 1/389 12380",
    ]

    /// The service under demonstration.
    public let monitor: HostMonitor
    /// The settings file the writer rewrites.
    public let settingsFile: SettingsFile
    private let loadSource: LoadAverageSource
    private let upstream: FlakyUpstream
    private let auditLog: AuditLog

    /// A scenario over `loadSource`, with its settings file in `directory` and its own flaky upstream.
    public init(clock: some Clock<Duration>, loadSource: LoadAverageSource, directory: URL) {
        self.loadSource = loadSource
        settingsFile = SettingsFile(url: directory.appendingPathComponent("settings.json"))
        upstream = FlakyUpstream(latency: .milliseconds(400), failingCalls: Self.failingUpstreamCalls)
        auditLog = AuditLog(count: 250, pageSize: 100, latency: .milliseconds(200))
        monitor = HostMonitor(
            clock: clock, loadSource: loadSource, settingsFile: settingsFile, upstream: upstream, auditLog: auditLog)
    }

    /// Runs the script on `clock`, calling `onEntry` for each timeline entry as it happens.
    ///
    /// - Parameters:
    ///   - clock: The clock the monitor was created with.
    ///   - date: The wall date now (`clock.date` for a `VirtualClock`).
    ///   - onEntry: Called for each entry, in order.
    public func run<C: Clock<Duration>>(
        clock: C, date: @escaping @Sendable () -> Date,
        onEntry: @escaping @Sendable (TimelineEntry) -> Void
    ) async throws -> ScenarioSummary {
        let start = clock.now
        let record: @Sendable (String, String) -> Void = { source, text in
            onEntry(TimelineEntry(elapsed: start.duration(to: clock.now), date: date(), source: source, text: text))
        }
        // Subscribe before anything happens, so that no transition is missed.
        let streams = (monitor.$load.updates, monitor.$settings.updates, monitor.$quote.updates)

        try settingsFile.write(Settings(version: 1, motd: "hello"))
        record("writer", "wrote settings.json v1")

        var (served, errors) = (0, 0)
        try await withThrowingTaskGroup(of: Void.self) { background in
            background.addTask { await Self.record(streams.0, as: "load", record) }
            background.addTask { await Self.record(streams.1, as: "settings", record) }
            background.addTask { await Self.record(streams.2, as: "quote", record) }
            background.addTask { try await self.rewriteSettings(clock: clock, from: start, record) }
            background.addTask { try await self.watchSettings(clock: clock, record) }
            background.addTask { try await self.report(clock: clock, from: start, record) }

            (served, errors) = try await withThrowingTaskGroup(of: Bool.self) { requests in
                for tick in 0..<Self.ticks {
                    try await clock.sleep(until: start.advanced(by: .seconds(tick)), tolerance: nil)
                    for _ in 0..<Self.handlersPerTick {
                        requests.addTask { await self.handleRequest() }
                    }
                }
                var outcomes = (served: 0, errors: 0)
                for try await served in requests {
                    if served { outcomes.served += 1 } else { outcomes.errors += 1 }
                }
                return outcomes
            }
            background.cancelAll()
        }
        return ScenarioSummary(
            requests: Self.ticks * Self.handlersPerTick, loadReads: loadSource.readCount,
            settingsReads: settingsFile.readCount, upstreamCalls: upstream.callCount, quotesServed: served,
            quoteErrors: errors, lastQuote: monitor.quote, auditReads: auditLog.readCount)
    }

    /// What a request handler does: asks for all three values at once. Returns whether it got a quote.
    private func handleRequest() async -> Bool {
        async let load = try? monitor.currentLoad()
        async let settings = try? monitor.currentSettings()
        async let quote = try? monitor.currentQuote()
        _ = await (load, settings)
        return await quote != nil
    }

    /// The writer: rewrites the settings file at 3.2 s and 6.2 s.
    private func rewriteSettings<C: Clock<Duration>>(
        clock: C, from start: C.Instant, _ record: @Sendable (String, String) -> Void
    ) async throws {
        for (version, at) in [(2, Duration.milliseconds(3200)), (3, .milliseconds(6200))] {
            try await clock.sleep(until: start.advanced(by: at), tolerance: nil)
            do {
                try settingsFile.write(Settings(version: version, motd: version == 2 ? "hello again" : "goodbye"))
                record("writer", "wrote settings.json v\(version)")
            } catch {
                record("writer", "could not write settings.json: \(error)")
            }
        }
    }

    /// The report: walks the audit log to its end at 5 s (reading its three pages) and again at 8 s
    /// (the list is fresh: no read).
    private func report<C: Clock<Duration>>(
        clock: C, from start: C.Instant, _ record: @Sendable (String, String) -> Void
    ) async throws {
        for at in [Duration.seconds(5), .seconds(8)] {
            try await clock.sleep(until: start.advanced(by: at), tolerance: nil)
            var (entries, pages) = (0, 0)
            let readsBefore = auditLog.readCount
            do {
                for try await page in monitor.auditPages() {
                    (entries, pages) = (entries + page.count, pages + 1)
                    if auditLog.readCount > readsBefore {
                        let range =
                            page.first.map { "entries \($0.number)–\($0.number + page.count - 1)" } ?? "no entry"
                        record(
                            "audit",
                            "page \(pages): \(range)\(monitor.audit.hasMore ? ", more to come" : ", end of listing")")
                    }
                }
                let reads = auditLog.readCount - readsBefore
                record(
                    "audit",
                    "walked \(entries) entries in \(pages) pages, \(reads == 0 ? "all kept (fresh)" : "\(reads) page reads")"
                )
            } catch {
                record("audit", "walk failed: \(error)")
            }
        }
    }

    /// The watcher: polls the file's bytes every 0.5 s and invalidates the settings when they change
    /// (a file that cannot be read counts as a change too: the next read will report why).
    private func watchSettings<C: Clock<Duration>>(
        clock: C, _ record: @Sendable (String, String) -> Void
    ) async throws {
        var seen = try? settingsFile.contents()
        while true {
            try await clock.sleep(for: .milliseconds(500))
            let current = try? settingsFile.contents()
            guard current != seen else { continue }
            seen = current
            record(
                "watcher", current == nil ? "settings.json unreadable: invalidate" : "settings.json changed: invalidate"
            )
            await monitor.settingsFileChanged()
        }
    }

    /// Turns a state's updates into timeline entries, one per visible change.
    private static func record<Value: Sendable>(
        _ updates: AsyncStream<AsyncSnapshot<Value?>>, as source: String,
        _ record: @Sendable (String, String) -> Void
    ) async {
        var last: String?
        for await snapshot in updates {
            guard let text = describe(snapshot), text != last else { continue }
            last = text
            record(source, text)
        }
    }

    /// A snapshot in words, through the one exhaustive presentation (`fold`); `nil` for the initial
    /// phase.
    static func describe<Value>(_ snapshot: AsyncSnapshot<Value?>) -> String? {
        let value = snapshot.value.map { String(describing: $0) } ?? "nothing"
        return snapshot.fold(
            initial: { nil },
            loading: { _ in
                guard snapshot.failureCount > 0 else { return "loading" }
                let error = snapshot.lastError.map { String(describing: $0) } ?? "error"
                return "loading  attempt \(snapshot.failureCount) failed (\(error)); retrying"
            },
            empty: { "empty" },
            success: { _, _ in
                snapshot.isExpired ? "stale    invalidated; the next request reads it again" : "success  \(value)"
            },
            failure: { error, _ in
                "failure  \(error) after \(snapshot.failureCount) attempts; still serving \(value)"
            })
    }
}

extension Scenario {
    /// Runs the scenario on a `VirtualClock`, with recorded load averages: it takes microseconds and
    /// gives the same timeline every time. This is what `asyncstate-demo --virtual` runs.
    public static func runInVirtualTime(
        directory: URL, onEntry: @escaping @Sendable (TimelineEntry) -> Void
    ) async throws -> ScenarioSummary {
        let clock = VirtualClock(startDate: virtualStartDate)
        let scenario = Scenario(clock: clock, loadSource: .recorded(recordedLoad), directory: directory)
        let run = clock.task { try await scenario.run(clock: clock, date: { clock.date }, onEntry: onEntry) }
        await clock.runUntilIdle()
        return try await run.value
    }
}
