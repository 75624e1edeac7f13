import AsyncStateKit
import AsyncStateTesting
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Testing

@testable import StateService

/// Replicas in one process, on one virtual clock, sharing a tenant store and an in-memory network.
struct Replicas {
    let clock = VirtualClock()
    let store = InMemoryTenantStore()
    let network = InMemoryInvalidationNetwork()
    let replicas: [(catalog: Catalog, bus: InMemoryInvalidationNetwork.Bus, fixture: Fixture)]

    init(count: Int, tenantExpiry: Duration = .seconds(60)) {
        var replicas: [(Catalog, InMemoryInvalidationNetwork.Bus, Fixture)] = []
        for _ in 0..<count {
            let bus = network.bus()
            let fixture = Fixture(clock: clock, tenantStore: store, bus: bus) { $0.tenantExpiry = tenantExpiry }
            replicas.append((fixture.catalog, bus, fixture))
        }
        self.replicas = replicas
    }

    /// Runs every replica's invalidator while `body` runs.
    func run(_ body: () async throws -> Void) async throws {
        let tasks = replicas.map { replica in Task { await replica.catalog.invalidator!.run() } }
        defer { for task in tasks { task.cancel() } }
        // Subscribed before anything is published (a message sent earlier would be lost), and each
        // stream's first delivery (`reconnected`) applied: every count of deliveries below starts at 1.
        #expect(
            await eventually {
                replicas.allSatisfy { $0.bus.listenerCount == 1 && $0.catalog.invalidator!.deliveriesApplied == 1 }
            })
        try await body()
    }
}

extension TestClientProtocol {
    /// A write with the fixture's token (or `token`, or none when it is `nil`).
    func put(_ uri: String, _ json: String, token: String? = Fixture.writeToken) async throws -> TestResponse {
        var headers: HTTPFields = [:]
        if let token { headers[.authorization] = "Bearer \(token)" }
        return try await execute(uri: uri, method: .put, headers: headers, body: ByteBuffer(string: json))
    }
}

func version(_ response: TestResponse) throws -> Int {
    try JSONDecoder().decode(TenantConfig.self, from: Data(response.text.utf8)).version
}

@Suite(.timeLimit(.minutes(1))) struct TenantTests {
    @Test func aWriteThroughOneReplicaIsServedByTheOthersAtOnce() async throws {
        let replicas = Replicas(count: 3)
        try await replicas.run {
            try await replicas.replicas[0].fixture.routes().test(.router) { a in
                try await replicas.replicas[1].fixture.routes().test(.router) { b in
                    #expect(try await b.get("/config/acme").status == .notFound)

                    let written = try await a.put("/config/acme", #"{"theme":"dark"}"#)
                    #expect(written.status == .ok)
                    #expect(written.headers[HTTPField.Name("X-Invalidation")!] == "published")
                    #expect(try version(written) == 1)
                    // B cached "not found" as a failure: the message made it refetch.
                    #expect(await eventually { replicas.replicas[1].catalog.invalidator!.deliveriesApplied == 2 })
                    var read = try await b.get("/config/acme")
                    #expect(read.status == .ok)
                    #expect(try version(read) == 1)

                    _ = try await a.put("/config/acme", #"{"theme":"light"}"#)
                    #expect(await eventually { replicas.replicas[1].catalog.invalidator!.deliveriesApplied == 3 })
                    read = try await b.get("/config/acme")
                    #expect(try version(read) == 2)
                    #expect(read.text.contains("light"))
                    // The writer reads its own write.
                    #expect(try version(try await a.get("/config/acme")) == 2)
                }
            }
        }
    }

    @Test func aTagInvalidationExpiresTheTenantsOnAPlanOnEveryReplicaAndIsCounted() async throws {
        let replicas = Replicas(count: 2)
        let (a, b) = (replicas.replicas[0], replicas.replicas[1])
        try await replicas.run {
            let plans = ["acme": "pro", "globex": "free", "initech": "pro"]
            for (tenant, plan) in plans { _ = try await a.catalog.writeTenant(tenant, settings: ["plan": plan]) }
            #expect(await eventually { b.catalog.invalidator!.deliveriesApplied == 4 })
            for tenant in plans.keys {
                for replica in [a, b] { #expect(try await replica.catalog.tenantSnapshot(tenant).value != nil) }
            }
            #expect(await a.catalog.invalidateTenants(tag: "plan:pro") == .published)
            #expect(await eventually { b.catalog.invalidator!.deliveriesApplied == 5 })
            let expired = { (catalog: Catalog) in
                plans.keys.filter { catalog.tenants.snapshot(for: $0)?.isExpired == true }.sorted()
            }
            #expect(expired(b.catalog) == ["acme", "initech"])
            #expect(expired(a.catalog) == ["acme", "initech"])
            for replica in [a, b] {
                #expect(replica.fixture.metric(#"async_state_tag_invalidations_total{state="tenants"}"#) == 1)
            }
        }
    }

    @Test func aReplicaThatMissedMessagesCatchesUpWhenItsBusReconnectsOrAtTheExpiry() async throws {
        let replicas = Replicas(count: 2, tenantExpiry: .seconds(30))
        let (a, b) = (replicas.replicas[0], replicas.replicas[1])
        try await replicas.run {
            _ = try await a.catalog.writeTenant("acme", settings: ["v": "1"])
            #expect(await eventually { b.catalog.invalidator!.deliveriesApplied == 2 })
            #expect(try await b.catalog.tenantSnapshot("acme").value?.version == 1)

            // B's bus is cut off: it misses the second write and serves version 1 meanwhile.
            b.bus.disconnect()
            let (_, announcement) = try await a.catalog.writeTenant("acme", settings: ["v": "2"])
            #expect(announcement == .published)
            #expect(try await b.catalog.tenantSnapshot("acme").value?.version == 1)
            // Back: every subscribed state is invalidated, so B refetches — at the end of the
            // second since the last invalidation of every tenant (the one its stream opened with):
            // whole-topic invalidations are coalesced to one a second.
            let applied = b.catalog.invalidator!.deliveriesApplied
            b.bus.reconnect()
            #expect(await eventually { b.catalog.invalidator!.deliveriesApplied > applied })
            #expect(try await b.catalog.tenantSnapshot("acme").value?.version == 1)
            await replicas.clock.advance(by: .seconds(1))
            #expect(try await b.catalog.tenantSnapshot("acme").value?.version == 2)

            // Cut off for good: the expiry bounds how long B serves an old version.
            b.bus.disconnect()
            _ = try await a.catalog.writeTenant("acme", settings: ["v": "3"])
            #expect(try await b.catalog.tenantSnapshot("acme").value?.version == 2)
            await replicas.clock.advance(by: .seconds(30))
            #expect(try await b.catalog.tenantSnapshot("acme").value?.version == 3)
        }
    }

    @Test func aWriteWhoseMessageCannotBeSentSaysSoAndStillInvalidatesTheWriter() async throws {
        let replicas = Replicas(count: 2)
        let a = replicas.replicas[0]
        try await replicas.run {
            _ = try await a.catalog.writeTenant("acme", settings: ["v": "1"])
            #expect(try await a.catalog.tenantSnapshot("acme").value?.version == 1)
            a.bus.disconnect()
            let (config, announcement) = try await a.catalog.writeTenant("acme", settings: ["v": "2"])
            #expect(config.version == 2)
            #expect(announcement == .queued)  // kept, and sent again once the bus is back
            #expect(try await a.catalog.tenantSnapshot("acme").value?.version == 2)
        }
    }

    @Test func badRequestsAndAFailingStore() async throws {
        let fixture = Fixture(tenantStore: FailingTenantStore())
        try await fixture.routes().test(.router) { client in
            #expect(try await client.put("/config/a%20b", "{}").status == .badRequest)
            #expect(try await client.put("/config/\(String(repeating: "x", count: 65))", "{}").status == .badRequest)
            #expect(try await client.put("/config/acme", "not json").status == .badRequest)
            #expect(try await client.put("/config/acme", #"{"n":1}"#).status == .badRequest)
            let failed = try await client.put("/config/acme", #"{"theme":"dark"}"#)
            #expect(failed.status == .serviceUnavailable)
            #expect(failed.headers[.retryAfter] == "1")
            #expect(try await client.get("/config/acme").status == .serviceUnavailable)
        }
        // Without a bus, a write invalidates this process only.
        let single = Fixture()
        let (_, announcement) = try await single.catalog.writeTenant("acme", settings: [:])
        #expect(announcement == .local)
    }

    @Test func tenantIDs() {
        #expect(TenantConfig.isValidID("acme-eu_1"))
        #expect(!TenantConfig.isValidID(""))
        #expect(!TenantConfig.isValidID("a/b"))
        #expect(!TenantConfig.isValidID("ünï"))
        #expect(TenantConfig.isValidID(String(repeating: "x", count: 64)))
        #expect(!TenantConfig.isValidID(String(repeating: "x", count: 65)))
    }
}

/// A store whose every call fails.
struct FailingTenantStore: TenantStore {
    func tenant(_ tenant: String) async throws -> TenantConfig { throw UpstreamError.unavailable }
    func write(_ tenant: String, settings: [String: String]) async throws -> TenantConfig {
        throw UpstreamError.unavailable
    }
}
