import AsyncStateKit
import Logging
import ServiceLifecycle

/// The states' background work, owned by the service group: it warms the states up at start and
/// keeps the critical configuration refreshed. On graceful shutdown (SIGTERM) its task is cancelled:
/// `run(every:)` returns, a fetch nobody else waits for is cancelled, and `run()` returns — nothing
/// refreshes after the server stops.
public struct RefreshService: Service {
    let catalog: Catalog
    let interval: Duration
    let logger: Logger

    public init(catalog: Catalog, interval: Duration, logger: Logger) {
        self.catalog = catalog
        self.interval = interval
        self.logger = logger
    }

    public func run() async throws {
        let (catalog, interval) = (catalog, interval)
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
            }
        }
        logger.info("state refreshes stopped")
    }
}
