import AsyncStateKit
import AsyncStateTracing
import Foundation
import Hummingbird
import Logging
import Metrics
import PostgresFleetCache
import PostgresInvalidation
import PostgresNIO
import Prometheus
import ServiceLifecycle
import StateService
import Tracing

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
// With TRACE_FILE, spans are recorded in memory and written there; a production service bootstraps
// its exporter (swift-otel) here instead.
var services: [any Service] = []
var traceExport: TraceExport?
if let path = settings.traceFile {
    let export = try TraceExport(path: path)
    InstrumentationSystem.bootstrap(export.tracer)
    traceExport = export
    services.append(export)
}
let tracing = TracingObserver()
let observer = ObserverGroup([LoggingObserver(logger: logger), MetricsObserver(), tracing])

// With POSTGRES_URL, tenants live in PostgreSQL, the replicas invalidate each other through it, and
// (unless SECOND_LEVEL=off) they share the tenants they load there.
var tenantStore: any TenantStore = InMemoryTenantStore()
var bus: PostgresInvalidationBus?
var authenticator: HMACAuthenticator?
var secondLevel: PostgresSecondLevel?
if let postgres = settings.postgres {
    let client = PostgresClient(configuration: postgres.client, backgroundLogger: logger)
    let postgresBus = try PostgresInvalidationBus(
        client: client, listening: try postgres.connection(), channel: settings.invalidationChannel, logger: logger)
    tenantStore = PostgresTenantStore(client: client, logger: logger)
    if settings.secondLevel { secondLevel = PostgresSecondLevel(client: client, logger: logger) }
    bus = postgresBus
    // Settings guarantee a secret with POSTGRES_URL.
    authenticator = try settings.invalidationSecret.map { try HMACAuthenticator(secret: $0) }
    services += [client, postgresBus]
}
if settings.tenantReadLatency > .zero {
    tenantStore = DelayedTenantStore(tenantStore, latency: settings.tenantReadLatency, clock: ContinuousClock())
}
let catalog = Catalog(
    settings: settings,
    upstream: SimulatedUpstream(
        latency: settings.upstreamLatency, clock: ContinuousClock(), outage: settings.upstreamOutage),
    observer: observer, tenantStore: tenantStore, bus: bus, authenticator: authenticator, secondLevel: secondLevel,
    invalidationMetadata: tracing.invalidationMetadata)
if let invalidator = catalog.invalidator {
    services.append(InvalidationService(invalidator: invalidator))
}
let app = buildApplication(
    catalog: catalog, settings: settings, registry: registry, logger: logger, services: services)
try await app.runService()
traceExport?.flush()  // the spans that ended as the server stopped
