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
    let logger: Logger

    public init(
        catalog: Catalog, interval: Duration, stateFile: AsyncStateArchiveFile? = nil, probeInterval: Duration? = nil,
        logger: Logger
    ) {
        self.catalog = catalog
        self.interval = interval
        self.stateFile = stateFile
        self.probeInterval = probeInterval
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
