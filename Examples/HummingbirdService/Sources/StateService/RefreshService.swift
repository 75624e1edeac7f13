import AsyncStateKit
import Logging
import ServiceLifecycle

/// The states' background work, owned by the service group: it warms the states up at start and
/// keeps the critical configuration refreshed. On graceful shutdown (SIGTERM) its task is cancelled:
/// `run(every:)` returns, a fetch nobody else waits for is cancelled, and `run()` returns — nothing
/// refreshes after the server stops. With a `stateFile`, it loads the states' data from it before
/// anything else (a warm restart) and saves it there when it stops.
public struct RefreshService: Service {
    let catalog: Catalog
    let interval: Duration
    let stateFile: AsyncStateArchiveFile?
    /// How often the tenant store is probed for `/ready` (`nil`: never).
    let probeInterval: Duration?
    /// Housekeeping of the store, run every `every`, each run bounded by `timeout`.
    let maintenance: Maintenance?
    let logger: Logger

    /// Housekeeping the service runs now and then (the second level's abandoned leases).
    public struct Maintenance: Sendable {
        /// What it does, for its log line.
        public var name: String
        /// How often it runs.
        public var every: Duration
        /// How long one run may take before it is abandoned.
        public var timeout: Duration
        /// One run; returns how many things it cleaned.
        public var run: @Sendable () async throws -> Int

        public init(name: String, every: Duration, timeout: Duration, run: @escaping @Sendable () async throws -> Int) {
            (self.name, self.every, self.timeout, self.run) = (name, every, timeout, run)
        }
    }

    public init(
        catalog: Catalog, interval: Duration, stateFile: AsyncStateArchiveFile? = nil, probeInterval: Duration? = nil,
        maintenance: Maintenance? = nil, logger: Logger
    ) {
        self.catalog = catalog
        self.interval = interval
        self.stateFile = stateFile
        self.probeInterval = probeInterval
        self.maintenance = maintenance
        self.logger = logger
    }

    public func run() async throws {
        if let stateFile {
            do {
                let restored = try await catalog.restore(from: stateFile)
                logger.info("warm start", metadata: ["restored": "\(restored)", "file": "\(stateFile.url.path)"])
            } catch {
                logger.error("cold start: the state file cannot be used", metadata: ["error": "\(error)"])
            }
        }
        let (catalog, interval, probeInterval, logger) = (catalog, interval, probeInterval, logger)
        try await cancelWhenGracefulShutdown {
            try await withThrowingDiscardingTaskGroup { group in
                // Fetches the configuration now (the warm-up that `/ready` waits for), then every
                // `interval`; failures show in its phase and the next refresh comes an interval later.
                group.addTask {
                    try await catalog.config.run(every: interval) { try await catalog.upstream.config() }
                }
                // Not critical: warmed once, then kept fresh by requests (stale-while-revalidate).
                group.addTask {
                    await catalog.rates.fetch { try await catalog.upstream.rates() }
                }
                // Housekeeping, every `maintenance.every`, each run bounded by its timeout.
                if let maintenance = self.maintenance {
                    group.addTask {
                        while !Task.isCancelled {
                            try? await Task.sleep(for: maintenance.every)
                            guard !Task.isCancelled else { break }
                            do {
                                let cleaned = try await withStoreDeadline(
                                    maintenance.name, timeout: maintenance.timeout
                                ) {
                                    try await maintenance.run()
                                }
                                if cleaned > 0 {
                                    logger.info("\(maintenance.name)", metadata: ["cleaned": "\(cleaned)"])
                                }
                            } catch {
                                logger.warning("\(maintenance.name) failed", metadata: ["error": "\(error)"])
                            }
                        }
                    }
                }
                // The readiness probe of the tenant store: now, then every `probeInterval`.
                if let probeInterval {
                    group.addTask {
                        while !Task.isCancelled {
                            if let problem = await catalog.probeStore() {
                                logger.warning("not ready", metadata: ["reason": "\(problem)"])
                            }
                            // Cancelled at shutdown: the loop ends without an error.
                            try? await Task.sleep(for: probeInterval)
                        }
                    }
                }
            }
        }
        logger.info("state refreshes stopped")
        if let stateFile {
            do {
                try catalog.save(to: stateFile)
                logger.info("states saved", metadata: ["file": "\(stateFile.url.path)"])
            } catch {
                logger.error("could not save the states", metadata: ["error": "\(error)"])
            }
        }
    }
}
