import AsyncStateKit
import Foundation
import Hummingbird
import Logging
import Prometheus

/// The routes:
///
/// - `GET /config`, `GET /rates`: a state each; `GET /users/:id`: the `profiles` family.
///   Snapshots become responses through ``SnapshotResponder`` (status, `Age`, `Retry-After`).
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
/// (which handles SIGTERM and SIGINT with a graceful shutdown).
public func buildApplication(
    catalog: Catalog, settings: Settings, registry: PrometheusCollectorRegistry, logger: Logger,
    now: @escaping @Sendable () -> Date = { Date() }
) -> some ApplicationProtocol {
    Application(
        router: buildRouter(catalog: catalog, settings: settings, registry: registry, now: now),
        configuration: .init(address: .hostname(settings.host, port: settings.port), serverName: "state-service"),
        services: [
            RefreshService(
                catalog: catalog, interval: settings.configRefreshInterval,
                stateFile: settings.stateFile.map { AsyncStateArchiveFile(url: URL(fileURLWithPath: $0)) },
                logger: logger)
        ],
        logger: logger)
}
