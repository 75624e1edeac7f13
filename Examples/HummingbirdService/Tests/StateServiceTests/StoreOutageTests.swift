import AsyncStateKit
import AsyncStateTesting
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Prometheus
import Testing

@testable import StateService

/// The service as a template to deploy: every call to the tenant store bounded and explained,
/// readiness that reflects the store, every documented counter from the start.
@Suite struct StoreOutageTests {
    /// A store that never answers, and ignores cancellation (a connection stuck on an unreachable
    /// server): a write answers 503 with what is unreachable within the store timeout. On the real
    /// clock (the deadline is real time), 200 ms.
    @Test func aWriteToAStoreThatNeverAnswersEndsWithinTheStoreTimeout() async throws {
        let fixture = Fixture(tenantStore: HangingTenantStore()) { $0.storeTimeout = .milliseconds(200) }
        try await fixture.routes().test(.router) { client in
            let start = ContinuousClock.now
            let response = try await client.put("/config/acme", #"{"theme":"dark"}"#)
            let took = ContinuousClock.now - start
            #expect(response.status == .serviceUnavailable)
            #expect(response.text == "the tenant store is unavailable (write): no answer within 0.2 seconds\n")
            #expect(took >= .milliseconds(200) && took < .seconds(5), "took \(took)")
        }
    }

    /// The probe's reasons: a store that refuses sign-in, or has no such database, or does not speak
    /// TLS, makes `/ready` 503 with the reason; once it answers, 200.
    @Test(arguments: [
        ("PSQLError(code: server, serverInfo: [sqlState: 28P01])", "authentication failed (wrong password)"),
        ("PSQLError(code: server, serverInfo: [sqlState: 3D000])", "the database does not exist"),
        ("PSQLError(code: sslUnsupported)", "the server does not offer TLS, and sslmode requires it"),
        ("connect(descriptor:addr:size:): Connection refused (errno: 111)", "the connection was refused"),
        ("something else", "it failed (ProbeFailure)"),
    ])
    func readinessSaysWhyTheStoreIsNotUsable(failure: String, reason: String) async throws {
        let store = ProbedTenantStore()
        let fixture = Fixture(tenantStore: store)
        _ = try await fixture.catalog.config.value { try await fixture.upstream.config() }
        try await fixture.routes().test(.router) { client in
            #expect(try await client.get("/ready").status == .ok)
            store.failure.set(ProbeFailure(text: failure))
            await fixture.catalog.probeStore()
            let notReady = try await client.get("/ready")
            #expect(notReady.status == .serviceUnavailable)
            #expect(notReady.text == "not ready: the tenant store is unavailable (probe): \(reason)\n")
            store.failure.set(nil)
            await fixture.catalog.probeStore()
            #expect(try await client.get("/ready").status == .ok)
        }
    }

    /// Before anything happened, `/metrics` lists every documented counter of every state at 0, and
    /// the invalidator's.
    @Test func everyDocumentedCounterIsExportedFromTheStartAtZero() async throws {
        let registry = PrometheusCollectorRegistry()
        let metrics = MetricsObserver(
            factory: PrometheusMetricsFactory(registry: registry), states: Catalog.stateNames)
        _ = metrics.invalidatorEvents()
        let exported = registry.emitToString()
        for state in Catalog.stateNames {
            for name in [
                "async_state_hits_total", "async_state_stale_serves_total", "async_state_fail_safe_serves_total",
                "async_state_soft_timeouts_total", "async_state_not_modified_total",
                "async_state_tag_invalidations_total", "async_state_failures_total", "async_state_misses_total",
                "async_state_batches_total",
            ] {
                #expect(exported.contains("\(name){state=\"\(state)\"} 0"), "\(name) for \(state)")
            }
            #expect(exported.contains("async_state_evictions_total{state=\"\(state)\",reason=\"evicted\"} 0"))
            #expect(exported.contains("async_state_runs_total{state=\"\(state)\",reason=\"periodic\"} 0"))
        }
        for event in ["queued", "resent", "collapsed", "dropped"] {
            #expect(exported.contains("async_state_invalidator_messages_total{event=\"\(event)\"} 0"))
        }
    }
}

/// A store whose calls never return, cancelled or not.
struct HangingTenantStore: TenantStore {
    func tenant(_ tenant: String) async throws -> TenantConfig { await Self.never() }
    func write(_ tenant: String, settings: [String: String]) async throws -> TenantConfig { await Self.never() }
    private static func never() async -> Never {
        await withUnsafeContinuation { (_: UnsafeContinuation<Void, Never>) in }
        fatalError("never resumed")
    }
}

/// An error whose text is `text` (as a driver's error would read).
struct ProbeFailure: Error, CustomDebugStringConvertible {
    var text: String
    var debugDescription: String { text }
}

/// A store in memory whose probe fails with `failure` while it is set.
final class ProbedTenantStore: TenantStore {
    let base = InMemoryTenantStore()
    let failure = LockedBox<ProbeFailure?>(nil)
    func tenant(_ tenant: String) async throws -> TenantConfig { try await base.tenant(tenant) }
    func write(_ tenant: String, settings: [String: String]) async throws -> TenantConfig {
        try await base.write(tenant, settings: settings)
    }
    func probe() async throws { if let failure = failure.value { throw failure } }
}
