public import AsyncStateKit
import Foundation

/// A small service that holds three pieces of fetched data, the way a real one would: the host's load
/// averages (cheap, changes all the time: a short expiry), a settings file (changes rarely: invalidated
/// when the file changes) and a quote from a slow, flaky upstream (retried with backoff) — and a
/// paginated audit log, read page by page and kept.
public struct HostMonitor: Sendable {
    /// `/proc/loadavg`, fresh for 1.5 seconds.
    @AsyncState public var load: LoadAverage?
    /// The settings file, fresh until the file changes.
    @AsyncState public var settings: Settings?
    /// The upstream's quote, fresh for 4 seconds; up to 3 attempts, 0.5 s then 1 s apart.
    @AsyncState public var quote: Quote?
    /// The audit log's pages read so far, fresh for a minute.
    public let audit: AsyncPagedState<AuditEntry, Int>

    private let loadSource: LoadAverageSource
    private let settingsFile: SettingsFile
    private let upstream: FlakyUpstream
    private let auditLog: AuditLog
    private let clock: any Clock<Duration>

    /// The policy the quote is fetched with. No jitter, so that the demo's timeline is easy to read;
    /// a real service would add `jitter: .full`.
    public static let quoteRetry = RetryPolicy.exponential(
        maxAttempts: 3, initial: .milliseconds(500), multiplier: 2, cap: .seconds(4))

    /// Creates the monitor; `clock` is `ContinuousClock()` in production and a `VirtualClock` in tests.
    public init(
        clock: some Clock<Duration>, loadSource: LoadAverageSource, settingsFile: SettingsFile,
        upstream: FlakyUpstream, auditLog: AuditLog
    ) {
        _load = AsyncState(wrappedValue: nil, expiry: .milliseconds(1500), clock: clock)
        _settings = AsyncState(wrappedValue: nil, clock: clock)
        _quote = AsyncState(wrappedValue: nil, expiry: .seconds(4), clock: clock, retry: Self.quoteRetry)
        self.loadSource = loadSource
        self.settingsFile = settingsFile
        self.upstream = upstream
        self.auditLog = auditLog
        audit = AsyncPagedState(expiry: .seconds(60), clock: clock)
        self.clock = clock
    }

    /// The load averages: from memory while fresh, else read once for every concurrent caller.
    public func currentLoad() async throws -> LoadAverage? {
        try await $load.value { [loadSource] in try loadSource.read() }
    }

    /// The settings: from memory until ``settingsFileChanged()``.
    public func currentSettings() async throws -> Settings? {
        try await $settings.value { [settingsFile] in try settingsFile.read() }
    }

    /// The quote, retried by ``quoteRetry``; throws the last error once the attempts are used up.
    public func currentQuote() async throws -> Quote? {
        try await $quote.value { [upstream, clock] in try await upstream.fetchQuote(clock: clock) }
    }

    /// The audit log's pages, first to last: the kept ones at once while fresh, the others read (and
    /// kept) as the walk reaches them.
    public func auditPages() -> AsyncPagedSequence<AuditEntry, Int> {
        audit.allPages { [auditLog, clock] cursor in try await auditLog.page(at: cursor, clock: clock) }
    }

    /// Called by the file watcher: the next request reads the file again.
    public func settingsFileChanged() async {
        await $settings.invalidate()
    }

    /// A one-line summary of what is loading, for a live progress line.
    public func loadingSummary() -> String? {
        // One snapshot per state: each is a lock and a clock read.
        let (load, settings, quote) = ($load.snapshot, $settings.snapshot, $quote.snapshot)
        let loading = [
            ("load", load.phase, load.failureCount),
            ("settings", settings.phase, settings.failureCount),
            ("quote", quote.phase, quote.failureCount),
        ]
        .filter { $0.1.isLoading }
        .map { name, _, failures in failures == 0 ? name : "\(name) (attempt \(failures + 1))" }
        return loading.isEmpty ? nil : "loading: " + loading.joined(separator: ", ")
    }
}
