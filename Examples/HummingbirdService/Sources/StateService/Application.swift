import AsyncStateKit
import Foundation
import Hummingbird
import Logging
import Prometheus
import ServiceLifecycle

/// The routes:
///
/// - `GET /config`, `GET /rates`: a state each; `GET /users/:id`: the `profiles` family.
///   Snapshots become responses through ``SnapshotResponder`` (status, `Age`, `Retry-After`).
/// - `GET /config/:tenant`: the `tenants` family. `PUT /config/:tenant` with a JSON object of
///   strings replaces the tenant's settings and answers the new configuration, with
///   `X-Invalidation` saying how the other replicas were told (`published`, `failed`, `local`); 503
///   when the store cannot be written.
/// - `GET /ready`: 503 until the critical states have data; `GET /health`: 200 while running.
/// - `GET /metrics`: the Prometheus registry, state metrics included.
public func buildRouter(
    catalog: Catalog, settings: Settings, registry: PrometheusCollectorRegistry,
    now: @escaping @Sendable () -> Date = { Date() }
) -> Router<BasicRequestContext> {
    let responder = SnapshotResponder(now: now, retryAfter: settings.failureExpiry)
    let router = Router()
    router.get("/config") { _, _ in responder.response(for: try await catalog.configSnapshot()) }
    router.get("/rates") { _, _ in responder.response(for: try await catalog.ratesSnapshot()) }
    router.get("/users/{id}") { _, context -> Response in
        guard let id = context.parameters.get("id", as: Int.self) else {
            return Response(status: .badRequest)
        }
        return responder.response(for: try await catalog.profileSnapshot(id))
    }
    /// The `{tenant}` parameter, if it is a valid tenant id.
    @Sendable func tenantID(_ context: BasicRequestContext) -> String? {
        context.parameters.get("tenant").flatMap { TenantConfig.isValidID($0) ? $0 : nil }
    }
    router.get("/config/{tenant}") { _, context -> Response in
        guard let id = tenantID(context) else { return Response(status: .badRequest) }
        return responder.response(for: try await catalog.tenantSnapshot(id))
    }
    router.put("/config/{tenant}") { request, context -> Response in
        guard let id = tenantID(context) else { return Response(status: .badRequest) }
        let settings = try await request.decode(as: [String: String].self, context: context)
        let written: (TenantConfig, Catalog.Announcement)
        do {
            written = try await catalog.writeTenant(id, settings: settings)
        } catch {
            context.logger.error("tenant write failed", metadata: ["tenant": "\(id)", "error": "\(error)"])
            return Response(status: .serviceUnavailable, headers: [.retryAfter: "1"])
        }
        return Response(
            status: .ok,
            headers: [.contentType: "application/json", .invalidation: written.1.rawValue],
            body: ResponseBody(byteBuffer: ByteBuffer(bytes: try JSONEncoder().encode(written.0))))
    }
    router.get("/ready") { _, _ -> Response in
        catalog.isReady ? Response(status: .ok) : Response(status: .serviceUnavailable, headers: [.retryAfter: "1"])
    }
    router.get("/health") { _, _ in HTTPResponse.Status.ok }
    router.get("/metrics") { _, _ -> Response in
        Response(
            status: .ok, headers: [.contentType: "text/plain; version=0.0.4"],
            body: ResponseBody(byteBuffer: ByteBuffer(bytes: registry.emitToBuffer())))
    }
    return router
}

/// The whole service: the router, and the ``RefreshService`` run by the application's service group
/// (which handles SIGTERM and SIGINT with a graceful shutdown), after `services` (a database client,
/// an invalidation bus), which are shut down last, after the server and the refreshes.
public func buildApplication(
    catalog: Catalog, settings: Settings, registry: PrometheusCollectorRegistry, logger: Logger,
    services: [any Service] = [], now: @escaping @Sendable () -> Date = { Date() }
) -> some ApplicationProtocol {
    Application(
        router: buildRouter(catalog: catalog, settings: settings, registry: registry, now: now),
        configuration: .init(address: .hostname(settings.host, port: settings.port), serverName: "state-service"),
        services: services + [
            RefreshService(
                catalog: catalog, interval: settings.configRefreshInterval,
                stateFile: settings.stateFile.map { AsyncStateArchiveFile(url: URL(fileURLWithPath: $0)) },
                logger: logger)
        ],
        logger: logger)
}

/// Applies an invalidator's deliveries until graceful shutdown (or until its bus stops).
public struct InvalidationService: Service {
    let invalidator: AsyncStateInvalidator

    public init(invalidator: AsyncStateInvalidator) {
        self.invalidator = invalidator
    }

    public func run() async throws {
        await cancelWhenGracefulShutdown { await invalidator.run() }
    }
}
