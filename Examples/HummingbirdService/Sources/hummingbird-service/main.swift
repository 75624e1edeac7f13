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
// Every documented counter of every state exists from the start, at 0.
let metrics = MetricsObserver(states: Catalog.stateNames)
let observer = ObserverGroup([LoggingObserver(logger: logger), metrics, tracing])

// With POSTGRES_URL, tenants live in PostgreSQL, the replicas invalidate each other through it, and
// (unless SECOND_LEVEL=off) they share the tenants they load there. The one secret signs the
// invalidations and seals the second level's entries (under a key derived for that use).
var tenantStore: any TenantStore = InMemoryTenantStore()
var bus: PostgresInvalidationBus?
var authenticator: HMACAuthenticator?
var secondLevel: PostgresSecondLevel?
if let postgres = settings.postgres {
    let client = PostgresClient(configuration: postgres.client, backgroundLogger: logger)
    // Settings guarantee a secret with POSTGRES_URL.
    authenticator = try settings.invalidationSecrets.map { try HMACAuthenticator(secrets: $0) }
    let postgresBus = try PostgresInvalidationBus(
        client: client, listening: try postgres.connection(), channel: settings.invalidationChannel,
        authenticator: authenticator, logger: logger)
    if settings.secondLevel { secondLevel = PostgresSecondLevel(client: client, logger: logger) }
    // The readiness probe also prepares the tables and checks that the service's role owns them,
    // at start (and at each probe until that succeeds once): another role's make it not ready,
    // with the reason.
    tenantStore = PostgresTenantStore(
        client: client, logger: logger, probing: try postgres.connection(),
        preparing: secondLevel.map { level in [{ try await level.prepare() }] } ?? [])
    bus = postgresBus
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
    entryAuthenticator: authenticator,
    invalidationMetadata: tracing.invalidationMetadata,
    invalidatorEvents: RejectionLog(logger: logger).events(then: metrics.invalidatorEvents()))
if let invalidator = catalog.invalidator {
    services.append(InvalidationService(invalidator: invalidator))
}
// One line that says what this replica runs with (never a password or a token).
logger.info(
    "starting",
    metadata: [
        "address": "\(settings.host):\(settings.port)",
        "store":
            "\(settings.postgres.map { "postgres \($0.host):\($0.port)/\($0.database) as \($0.username)" } ?? "memory")",
        "sslmode": "\(settings.postgres.map(\.sslMode.rawValue) ?? "n/a")",
        "second_level":
            "\(settings.postgres != nil && settings.secondLevel ? "on, entries sealed, writes \(settings.secondLevelWritesInBackground ? "in the background" : "before the answer")" : "off")",
        "invalidation":
            "\(settings.postgres != nil ? "postgres channel \(settings.invalidationChannel), signed" : "none")",
        "writes": "\(settings.writeToken != nil ? "enabled" : "disabled (no WRITE_TOKEN)")",
        "store_timeout": "\(settings.storeTimeout)",
    ])
let app = buildApplication(
    catalog: catalog, settings: settings, registry: registry, logger: logger, services: services, refreshes: false)
// The refreshes run after the application in one group, so that SIGTERM stops them first, at once
// (a group shuts its services down in reverse order); then the server, which lets its requests end
// (each call to the store is bounded by STORE_TIMEOUT), then the bus and the database client.
let group = ServiceGroup(
    configuration: .init(
        services: [
            app,
            buildRefreshService(
                catalog: catalog, settings: settings,
                // The rows of leases whose holder died before giving them back, once a minute.
                maintenance: secondLevel.map { level in
                    RefreshService.Maintenance(
                        name: "second level: abandoned leases deleted", every: .seconds(60),
                        timeout: settings.storeTimeout
                    ) { try await level.deleteAbandonedLeases() }
                }, logger: logger),
        ],
        gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
try await group.run()
traceExport?.flush()  // the spans that ended as the server stopped
