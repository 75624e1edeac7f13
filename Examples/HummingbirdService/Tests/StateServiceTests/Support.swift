import AsyncStateKit
import AsyncStateTesting
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import Prometheus
import Synchronization
import Testing

@testable import StateService

/// An upstream the test scripts: each call sleeps `latency` on the virtual clock (none when zero),
/// counts itself, and answers — or throws ``UpstreamError/unavailable`` while `isDown`.
final class ScriptedUpstream: Upstream {
    struct Script {
        var latency: Duration = .zero
        var isDown = false
        var configVersion = 1
        var calls: [String: Int] = [:]
        var cancelled: [String: Int] = [:]
        var batchSizes: [Int] = []
    }

    let clock: VirtualClock
    let script = Mutex(Script())

    init(clock: VirtualClock, latency: Duration = .zero) {
        self.clock = clock
        script.withLock { $0.latency = latency }
    }

    func calls(_ name: String) -> Int { script.withLock { $0.calls[name, default: 0] } }
    func cancellations(_ name: String) -> Int { script.withLock { $0.cancelled[name, default: 0] } }
    func setDown(_ down: Bool) { script.withLock { $0.isDown = down } }

    func config() async throws -> ServiceConfig {
        let version = try await call("config")
        return ServiceConfig(version: version, features: ["search": true])
    }

    func rates() async throws -> Rates {
        _ = try await call("rates")
        return Rates(base: "EUR", rates: ["USD": 1.08])
    }

    func profile(_ id: Int) async throws -> Profile {
        _ = try await call("profile")
        guard let profile = Self.profile(id) else { throw UpstreamError.notFound }
        return profile
    }

    func profiles(_ ids: [Int]) async throws -> [Int: Profile] {
        script.withLock { $0.batchSizes.append(ids.count) }
        _ = try await call("profiles")
        var profiles: [Int: Profile] = [:]
        for id in ids { profiles[id] = Self.profile(id) }
        return profiles
    }

    /// The profile of user `id`, or `nil` above 1,000,000 (unknown ids).
    private static func profile(_ id: Int) -> Profile? {
        id <= 1_000_000 ? Profile(id: id, name: "user \(id)") : nil
    }

    /// The number of ids each batch call asked for, in order.
    var batchSizes: [Int] { script.withLock { $0.batchSizes } }

    private func call(_ name: String) async throws -> Int {
        let latency = script.withLock { script in
            script.calls[name, default: 0] += 1
            return script.latency
        }
        if latency > .zero {
            do {
                try await clock.sleep(for: latency)
            } catch {
                script.withLock { $0.cancelled[name, default: 0] += 1 }
                throw error
            }
        }
        return try script.withLock { script in
            if script.isDown { throw UpstreamError.unavailable }
            return script.configVersion
        }
    }
}

/// A service on a virtual clock with a scripted upstream and its own metrics registry.
struct Fixture {
    let clock: VirtualClock
    let upstream: ScriptedUpstream
    let settings: Settings
    let registry = PrometheusCollectorRegistry()
    let catalog: Catalog

    init(
        clock: VirtualClock = VirtualClock(), latency: Duration = .zero,
        tenantStore: any TenantStore = InMemoryTenantStore(), bus: (any AsyncStateInvalidationBus)? = nil,
        _ configure: (inout Settings) -> Void = { _ in }
    ) {
        self.clock = clock
        var settings = Settings()
        settings.retryAttempts = 1
        settings.failureExpiry = .seconds(1)
        settings.writeToken = Fixture.writeToken
        configure(&settings)
        self.settings = settings
        upstream = ScriptedUpstream(clock: clock, latency: latency)
        catalog = Catalog(
            settings: settings, upstream: upstream, clock: clock,
            observer: MetricsObserver(factory: PrometheusMetricsFactory(registry: registry)), tenantStore: tenantStore,
            bus: bus, metrics: PrometheusMetricsFactory(registry: registry))
    }

    /// The token the fixture's writes present (``TestClientProtocol/put(_:_:)``).
    static let writeToken = "test-write-token-0123456789"

    /// The routes alone (no background refreshes).
    func routes() -> some ApplicationProtocol {
        let clock = clock
        return Application(
            router: buildRouter(catalog: catalog, settings: settings, registry: registry, now: { clock.date }))
    }

    /// The whole service, background refreshes included.
    func service() -> some ApplicationProtocol {
        let clock = clock
        return buildApplication(
            catalog: catalog, settings: settings, registry: registry, logger: Logger(label: "test"),
            now: { clock.date })
    }

    /// The value of the metric line that starts with `series` (name and labels), or 0 if absent.
    func metric(_ series: String) -> Double {
        for line in registry.emitToString().split(separator: "\n") where line.hasPrefix(series + " ") {
            return Double(line.dropFirst(series.count + 1)) ?? .nan
        }
        return 0
    }
}

extension TestClientProtocol {
    func get(_ uri: String) async throws -> TestResponse {
        try await execute(uri: uri, method: .get)
    }
}

extension TestResponse {
    var phase: String? { headers[HTTPField.Name("X-State-Phase")!] }
    var text: String { String(buffer: body) }
}

/// Whether `condition` becomes true while other tasks run (it is checked between yields, up to a
/// bound): for effects that happen on threads the virtual clock does not watch. No real time passes.
func eventually(yields: Int = 1_000_000, _ condition: () -> Bool) async -> Bool {
    for _ in 0..<yields {
        if condition() { return true }
        await Task.yield()
    }
    return condition()
}

/// As ``eventually(yields:_:)``, letting `clock`'s work settle between checks (for tasks that run on
/// its executor).
func eventually(settling clock: VirtualClock, _ condition: () -> Bool) async -> Bool {
    for _ in 0..<10_000 {
        if condition() { return true }
        await clock.settle()
        await Task.yield()
    }
    return condition()
}

/// A value shared between tasks.
final class LockedBox<Value: Sendable>: Sendable {
    private let storage: Mutex<Value>
    init(_ value: Value) { storage = Mutex(value) }
    var value: Value { storage.withLock { $0 } }
    func set(_ value: Value) { storage.withLock { $0 = value } }
    func update(_ change: (inout Value) -> Void) { storage.withLock { change(&$0) } }
}

/// GETs every one of `uris` at once and moves `clock` on in steps of `step`, letting other threads
/// run between them, until each has its answer (at most `steps` steps): for handlers that run on
/// threads the clock does not watch, beside other sleepers, so that each reaches its sleeps whenever
/// its thread runs and is woken by a later step. Returns the answers in the order of `uris`.
func getAll(
    _ uris: [String], from client: any TestClientProtocol, advancing clock: VirtualClock,
    by step: Duration = .milliseconds(100), steps: Int = 100
) async throws -> [TestResponse] {
    let answered = LockedBox(0)
    return try await withThrowingTaskGroup(of: (Int, TestResponse).self) { group in
        for (index, uri) in uris.enumerated() {
            group.addTask {
                let response = try await client.get(uri)
                answered.update { $0 += 1 }
                return (index, response)
            }
        }
        for _ in 0..<steps where answered.value < uris.count {
            await clock.advance(by: step)
            _ = await eventually(yields: 10_000) { answered.value == uris.count }
        }
        #expect(answered.value == uris.count, "answered \(answered.value) of \(uris.count) within \(steps) steps")
        var responses = [TestResponse?](repeating: nil, count: uris.count)
        for try await (index, response) in group { responses[index] = response }
        return responses.map { $0! }
    }
}
