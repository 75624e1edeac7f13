import AsyncStateKit
import Foundation
import Hummingbird
import Logging
import Metrics
import Prometheus
import StateService

// Configuration from the environment: a bad variable stops the service with a message (exit 78,
// EX_CONFIG) instead of running it with a surprise.
let settings: Settings
do {
    settings = try Settings(environment: ProcessInfo.processInfo.environment)
} catch {
    FileHandle.standardError.write(Data("hummingbird-service: \(error)\n".utf8))
    exit(78)
}

LoggingSystem.bootstrap { label in
    var handler = StreamLogHandler.standardError(label: label)
    handler.logLevel = settings.logLevel
    return handler
}
let registry = PrometheusCollectorRegistry()
MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))

let logger = Logger(label: "state-service")
let observer = ObserverGroup([LoggingObserver(logger: logger), MetricsObserver()])
let catalog = Catalog(
    settings: settings, upstream: SimulatedUpstream(latency: settings.upstreamLatency, clock: ContinuousClock()),
    observer: observer)
let app = buildApplication(catalog: catalog, settings: settings, registry: registry, logger: logger)
try await app.runService()
