import AsyncStateKit
import AsyncStateTesting
import Foundation
import Hummingbird
import HummingbirdTesting
import Logging
import ServiceLifecycle
import Testing

@testable import StateService

@Suite(.timeLimit(.minutes(1))) struct LifecycleTests {
    @Test func readyOnlyOnceTheCriticalStateHasDataThenRefreshedInTheBackground() async throws {
        let fixture = Fixture(latency: .seconds(1)) { $0.configRefreshInterval = .seconds(30) }
        let (clock, upstream) = (fixture.clock, fixture.upstream)
        try await fixture.service().test(.router) { client async throws in
            // The refresh service is fetching the configuration (and warming the rates).
            let notReady = try await client.get("/ready")
            #expect(notReady.status == .serviceUnavailable)
            #expect(notReady.headers[.retryAfter] == "1")
            await clock.waitForSleepers(2)
            await clock.advance(by: .seconds(1))
            #expect(try await client.get("/ready").status == .ok)
            #expect(try await client.get("/config").headers[.age] == "0")
            // Every 30 s after a fetch settles, the configuration is refreshed without a request.
            // (The refresh runs in the service group's task, which the clock does not watch: wait
            // for it to reach the upstream's sleep, then for the loop's next 30 s sleep.)
            await clock.advance(by: .seconds(30))
            await clock.waitForSleepers(1)
            #expect(upstream.calls("config") == 2)
            await clock.advance(by: .seconds(1))
            await clock.waitForSleepers(1)
            #expect(try await client.get("/config").headers[.age] == "0")
        }
        // The test framework shut the service group down gracefully: the refresh loop ended, and
        // nothing fetches any more however far time goes.
        #expect(fixture.metric(#"async_state_runs_total{state="config",reason="periodic"}"#) == 2)
        await clock.advance(by: .seconds(3600))
        #expect(upstream.calls("config") == 2)
        #expect(clock.pendingSleepers == 0)
    }

    @Test func gracefulShutdownCancelsARefreshInFlightAndReturns() async throws {
        let fixture = Fixture(latency: .seconds(10))
        let (clock, upstream) = (fixture.clock, fixture.upstream)
        let service = RefreshService(catalog: fixture.catalog, interval: .seconds(30), logger: Logger(label: "test"))
        let group = ServiceGroup(
            configuration: .init(services: [service], gracefulShutdownSignals: [], logger: Logger(label: "test")))
        let running = Task { try await group.run() }
        await clock.waitForSleepers(2)  // the configuration and the rates, each 10 s away
        await group.triggerGracefulShutdown()
        try await running.value
        // The operations were cancelled; each notices in its own task (which runs on the clock's
        // executor), a moment later.
        #expect(await eventually(settling: clock) { upstream.cancellations("config") == 1 })
        #expect(await eventually(settling: clock) { upstream.cancellations("rates") == 1 })
        #expect(fixture.catalog.config.phase.kind == .initial)  // cancelled: back where it was
        #expect(!fixture.catalog.isReady)
        #expect(clock.pendingSleepers == 0)
    }
}

@Suite(.timeLimit(.minutes(1))) struct WarmRestartTests {
    @Test func theStatesAreSavedOnShutdownAndTheNextProcessStartsWarm() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("service-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("states.json").path

        // The first process: warms up from the upstream, serves a profile, shuts down gracefully.
        let first = Fixture(latency: .seconds(1)) { $0.stateFile = path }
        try await first.service().test(.router) { client async throws in
            await first.clock.waitForSleepers(2)
            await first.clock.advance(by: .seconds(1))
            #expect(await eventually { first.catalog.isReady })
            // The handler runs out of the clock's sight, beside other sleepers (the refresh loop, the
            // family's idle sweeper): time moves in steps until it has its answer.
            let profile = try await getAll(["/users/5"], from: client, advancing: first.clock)[0]
            #expect(profile.status == .ok)
        }
        let saved = try #require(try AsyncStateArchiveFile(url: URL(fileURLWithPath: path)).load(Catalog.Saved.self))
        #expect(saved.config?.value.version == 1)
        #expect(saved.profiles.keys.sorted() == [5])

        // The next process: ready at once, serving the saved data while it refetches.
        let second = Fixture(latency: .seconds(1)) { $0.stateFile = path }
        try await second.service().test(.router) { client async throws in
            // Restored before the refresh loop starts (the profiles last).
            #expect(await eventually { second.catalog.isReady && second.catalog.profiles[5] != nil })
            #expect(second.upstream.calls("config") <= 1)
            let config = try await client.get("/config")
            #expect(config.status == .ok)
            #expect(config.text.contains("\"version\":1"))
            let profile = try await client.get("/users/5")
            #expect(profile.status == .ok && profile.text.contains("user 5"))
            #expect(second.upstream.calls("profile") <= 1)  // served at once; refreshed ahead
        }
    }

    @Test func aStateFileThatCannotBeUsedIsAColdStart() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("service-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("states.json").path
        try Data("{ torn".utf8).write(to: URL(fileURLWithPath: path))
        let fixture = Fixture { $0.stateFile = path }
        try await fixture.service().test(.router) { client async throws in
            #expect(await eventually { fixture.catalog.isReady })  // fetched, not restored
            #expect(try await client.get("/config").status == .ok)
            #expect(fixture.upstream.calls("config") == 1)
        }
    }
}
