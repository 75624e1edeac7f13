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
/// - `GET /profiles/:id`: the same profiles, a miss loaded in a batch with the others missed within
///   the batch window (``Catalog/coalescedProfile(_:)``): 200 with the profile, 404 for an unknown
///   id, 503 with `Retry-After` when the upstream fails.
/// - `GET /config/:tenant`: the `tenants` family. `PUT /config/:tenant` with a JSON object of
///   strings replaces the tenant's settings and answers the new configuration, with
///   `X-Invalidation` saying how the other replicas were told (`published`, `failed`, `local`); 503
///   when the store cannot be written. A write needs `Authorization: Bearer <WRITE_TOKEN>` (401
///   without it, 403 when the service has no token), a body of at most 16 KiB (413), and settings
///   within ``TenantConfig/validate(_:)`` (400).
/// - A request the service cannot read gets 400 with a fixed message, which never echoes the input.
/// - `GET /ready`: 503, with the reason as its body, until the critical states have data and while
///   the tenant store does not answer its probe (a wrong password, a missing database, a TLS
///   mismatch, an unreachable server); `GET /health`: 200 while running.
/// - `GET /metrics`: the Prometheus registry, state metrics included.
/// - Every request is a span (`TracingMiddleware`), the parent of the loads it starts and the waits
///   it joins.
public func buildRouter(
    catalog: Catalog, settings: Settings, registry: PrometheusCollectorRegistry,
    now: @escaping @Sendable () -> Date = { Date() }
) -> Router<BasicRequestContext> {
    let responder = SnapshotResponder(now: now, retryAfter: settings.failureExpiry)
    let router = Router()
    // A span per request (with the bootstrapped tracer; none: no cost), in whose context the states'
    // loads and waits are traced (`TracingObserver`).
    router.add(middleware: TracingMiddleware())
    router.get("/config") { _, _ in responder.response(for: try await catalog.configSnapshot()) }
    router.get("/rates") { _, _ in responder.response(for: try await catalog.ratesSnapshot()) }
    router.get("/users/{id}") { _, context -> Response in
        guard let id = context.parameters.get("id", as: Int.self) else {
            return .badRequest("a user id is an integer")
        }
        return responder.response(for: try await catalog.profileSnapshot(id))
    }
    router.get("/profiles/{id}") { _, context -> Response in
        guard let id = context.parameters.get("id", as: Int.self) else {
            return .badRequest("a user id is an integer")
        }
        do {
            return .json(try await catalog.coalescedProfile(id))
        } catch AsyncStateError.missingFromBatch {
            return Response(status: .notFound)
        } catch let error as UpstreamError where error == .notFound {
            return Response(status: .notFound)
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            return Response(status: .serviceUnavailable, headers: [.retryAfter: responder.retryAfterSeconds])
        }
    }
    /// The `{tenant}` parameter, if it is a valid tenant id.
    @Sendable func tenantID(_ context: BasicRequestContext) -> String? {
        context.parameters.get("tenant").flatMap { TenantConfig.isValidID($0) ? $0 : nil }
    }
    router.get("/config/{tenant}") { _, context -> Response in
        guard let id = tenantID(context) else { return .badRequest(tenantIDRule) }
        return responder.response(for: try await catalog.tenantSnapshot(id))
    }
    router.put("/config/{tenant}") { request, context -> Response in
        guard let token = settings.writeToken else {
            return .plain(.forbidden, "writes are disabled: the service has no WRITE_TOKEN")
        }
        guard let presented = request.headers[.authorization].flatMap(bearerToken),
            equalInConstantTime(presented, token)
        else {
            return .plain(.unauthorized, "a write needs Authorization: Bearer <token>", [.wwwAuthenticate: "Bearer"])
        }
        guard let id = tenantID(context) else { return .badRequest(tenantIDRule) }
        let body = try await request.body.collect(upTo: maximumWriteBytes)  // 413 beyond it
        guard let tenantSettings = try? JSONDecoder().decode([String: String].self, from: body) else {
            return .badRequest("the body is a JSON object of strings")
        }
        if let problem = TenantConfig.validate(tenantSettings) { return .badRequest(problem) }
        let written: (TenantConfig, Catalog.Announcement)
        do {
            written = try await catalog.writeTenant(id, settings: tenantSettings)
        } catch let error as TenantStoreUnavailable {
            context.logger.error("tenant write failed", metadata: ["tenant": "\(id)", "error": "\(error)"])
            return .plain(.serviceUnavailable, "\(error)", [.retryAfter: "1"])
        } catch {
            context.logger.error("tenant write failed", metadata: ["tenant": "\(id)", "error": "\(error)"])
            return .plain(.serviceUnavailable, "the tenant store could not be written", [.retryAfter: "1"])
        }
        return Response(
            status: .ok,
            headers: [.contentType: "application/json", .invalidation: written.1.rawValue],
            body: ResponseBody(byteBuffer: ByteBuffer(bytes: try JSONEncoder().encode(written.0))))
    }
    router.get("/ready") { _, _ -> Response in
        guard let reason = catalog.notReadyReason else { return Response(status: .ok) }
        return .plain(.serviceUnavailable, "not ready: \(reason)", [.retryAfter: "1"])
    }
    router.get("/health") { _, _ in HTTPResponse.Status.ok }
    router.get("/metrics") { _, _ -> Response in
        Response(
            status: .ok, headers: [.contentType: "text/plain; version=0.0.4"],
            body: ResponseBody(byteBuffer: ByteBuffer(bytes: registry.emitToBuffer())))
    }
    return router
}

/// The largest body `PUT /config/:tenant` reads: 16 KiB (a tenant's settings are far smaller).
let maximumWriteBytes = 16 << 10

/// What a valid tenant id is, for a 400.
let tenantIDRule = "a tenant id is 1 to 64 letters, digits, - and _"

/// The token of an `Authorization: Bearer <token>` header, if it is one.
@Sendable func bearerToken(_ header: String) -> String? {
    let parts = header.split(separator: " ", maxSplits: 1)
    guard parts.count == 2, parts[0].lowercased() == "bearer", !parts[1].isEmpty else { return nil }
    return String(parts[1])
}

/// Whether `a` and `b` are equal, comparing every byte whatever differs first (the time taken does
/// not tell an attacker how much of a guess was right; only the length may).
@Sendable func equalInConstantTime(_ a: String, _ b: String) -> Bool {
    let (x, y) = (Array(a.utf8), Array(b.utf8))
    guard x.count == y.count else { return false }
    return zip(x, y).reduce(UInt8(0)) { $0 | ($1.0 ^ $1.1) } == 0
}

extension Response {
    /// A response with a short plain-text explanation (a fixed message: never the request's input).
    static func plain(_ status: HTTPResponse.Status, _ message: String, _ headers: HTTPFields = [:]) -> Response {
        var headers = headers
        headers[.contentType] = "text/plain; charset=utf-8"
        return Response(
            status: status, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(string: message + "\n")))
    }

    /// 400 with `message`.
    static func badRequest(_ message: String) -> Response { .plain(.badRequest, message) }
}

/// The whole service: the router, and the ``RefreshService`` (unless `refreshes` is false: the
/// caller runs ``buildRefreshService(catalog:settings:logger:)`` itself) run by the application's
/// service group after `services` (a database client, an invalidation bus), which are shut down
/// last, after the server and the refreshes.
public func buildApplication(
    catalog: Catalog, settings: Settings, registry: PrometheusCollectorRegistry, logger: Logger,
    services: [any Service] = [], refreshes: Bool = true, now: @escaping @Sendable () -> Date = { Date() }
) -> some ApplicationProtocol {
    Application(
        router: buildRouter(catalog: catalog, settings: settings, registry: registry, now: now),
        configuration: .init(address: .hostname(settings.host, port: settings.port), serverName: "state-service"),
        services: services
            + (refreshes ? [buildRefreshService(catalog: catalog, settings: settings, logger: logger)] : []),
        logger: logger)
}

/// The states' background work (``RefreshService``) as `settings` configure it: the refresh
/// interval, the state file, the tenant store's readiness probe (with `POSTGRES_URL`) and its
/// housekeeping (`maintenance`).
public func buildRefreshService(
    catalog: Catalog, settings: Settings, maintenance: RefreshService.Maintenance? = nil, logger: Logger
) -> RefreshService {
    RefreshService(
        catalog: catalog, interval: settings.configRefreshInterval,
        stateFile: settings.stateFile.map { AsyncStateArchiveFile(url: URL(fileURLWithPath: $0)) },
        probeInterval: settings.postgres == nil ? nil : settings.storeProbeInterval, maintenance: maintenance,
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
