import AsyncStateKit
import AsyncStateTesting
import Foundation
import Testing

/// Whether `condition` becomes true while other tasks run (checked between yields, up to a bound):
/// for deliveries that travel through `AsyncStream`s, out of the virtual clock's sight.
func soon(_ condition: () -> Bool) async -> Bool {
    for _ in 0..<1_000_000 {
        if condition() { return true }
        await Task.yield()
    }
    return condition()
}

/// One replica of a service: its own state over a shared source, its own invalidator and bus.
struct Replica {
    let bus: InMemoryInvalidationNetwork.Bus
    let invalidator: AsyncStateInvalidator
    let config: AsyncState<Int>
    let profiles: AsyncStateFamily<Int, String>
    let runner: Task<Void, Never>

    init(network: InMemoryInvalidationNetwork, clock: VirtualClock) async {
        bus = network.bus()
        // No rate limit on whole-topic invalidations here: these tests send them back to back
        // (`RateLimitTests` covers the limit).
        invalidator = AsyncStateInvalidator(bus: bus, invalidateAllInterval: .zero)
        config = AsyncState(wrappedValue: 0, expiry: .seconds(3600), clock: clock)
        profiles = AsyncStateFamily(expiry: .seconds(3600), clock: clock)
        invalidator.subscribe(config, to: "config")
        invalidator.subscribe(profiles, to: "profiles")
        let invalidator = invalidator
        runner = Task { await invalidator.run() }
        // Listening, and the stream's first delivery (`reconnected`) applied.
        _ = await soon { bus.listenerCount == 1 && invalidator.deliveriesApplied == 1 }
    }
}

@Suite struct InvalidationTests {
    @Test func aChangeThroughOneReplicaIsRefetchedByEveryReplica() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let database = LockedValue(1)
        let calls = LockedValue(0)
        let load: @Sendable () async throws -> Int = {
            calls.withLock { $0 += 1 }
            return database.withLock { $0 }
        }
        var replicas: [Replica] = []
        for _ in 0..<3 { replicas.append(await Replica(network: network, clock: clock)) }
        for replica in replicas { #expect(try await replica.config.value(load) == 1) }

        database.withLock { $0 = 2 }
        try await replicas[0].invalidator.invalidate("config")
        #expect(replicas[0].config.snapshot.isExpired)  // at once on the writer
        #expect(await soon { replicas.allSatisfy { $0.config.snapshot.isExpired } })
        for replica in replicas { #expect(try await replica.config.value(load) == 2) }
        #expect(calls.withLock { $0 } == 6)
        for replica in replicas { replica.runner.cancel() }
    }

    @Test func aMessageDeliveredTwiceInvalidatesOnceAsMuch() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        network.duplicatesDeliveries = true
        let (a, b) = (await Replica(network: network, clock: clock), await Replica(network: network, clock: clock))
        let calls = LockedValue(0)
        let load: @Sendable () async throws -> Int = {
            calls.withLock { count in
                count += 1
                return count
            }
        }
        _ = try await b.config.value(load)
        try await a.invalidator.invalidate("config")
        #expect(await soon { b.invalidator.deliveriesApplied == 1 + 2 })  // the first `reconnected`, then twice
        _ = try await b.config.value(load)
        _ = try await b.config.value(load)
        #expect(calls.withLock { $0 } == 2)  // one refetch
        a.runner.cancel()
        b.runner.cancel()
    }

    @Test func aReconnectInvalidatesEverySubscribedStateBecauseMessagesMayHaveBeenLost() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let (a, b) = (await Replica(network: network, clock: clock), await Replica(network: network, clock: clock))
        _ = try await b.config.value { 1 }
        _ = try await b.profiles.value(for: 7) { "user \($0)" }
        b.bus.disconnect()
        try await a.invalidator.invalidate("config")
        #expect(b.bus.counts.lost == 1)
        #expect(!b.config.snapshot.isExpired)  // the message was lost: served until the reconnect
        b.bus.reconnect()
        #expect(await soon { b.config.snapshot.isExpired && b.profiles.snapshot(for: 7)?.isExpired == true })
        // A disconnected replica cannot publish, but its own states are invalidated anyway, and the
        // message is kept to be sent again (`InvalidationRecoveryTests`).
        b.bus.disconnect()
        _ = try await b.config.value { 2 }
        #expect(try await b.invalidator.invalidate("config") == .queued)
        #expect(b.config.snapshot.isExpired)
        a.runner.cancel()
        b.runner.cancel()
    }

    @Test func aFamilyKeyIsInvalidatedAloneAndATopicWithoutKeyInvalidatesEveryEntry() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let (a, b) = (await Replica(network: network, clock: clock), await Replica(network: network, clock: clock))
        for id in 1...3 { _ = try await b.profiles.value(for: id) { "user \($0)" } }
        try await a.invalidator.invalidate("profiles", key: "2")
        #expect(await soon { b.profiles.snapshot(for: 2)?.isExpired == true })
        #expect(b.profiles.snapshot(for: 1)?.isExpired == false)
        try await a.invalidator.invalidate("profiles", key: "not a number")  // parses to no key
        try await a.invalidator.invalidate("profiles")
        #expect(await soon { (1...3).allSatisfy { b.profiles.snapshot(for: $0)?.isExpired == true } })
        a.runner.cancel()
        b.runner.cancel()
    }

    @Test func aKeyThatIsNotLosslessStringConvertibleIsFoundByItsDescriptionEveryKeyThatHasIt() async throws {
        /// A key whose description leaves out a field: two keys may describe alike.
        struct Tenant: Hashable, Sendable, CustomStringConvertible {
            var id: Int
            var region = "eu"
            var description: String { "tenant-\(id)" }
        }
        let clock = VirtualClock()
        let invalidator = AsyncStateInvalidator(bus: InMemoryInvalidationNetwork().bus())
        let tenants = AsyncStateFamily<Tenant, Int>(clock: clock)
        invalidator.subscribe(tenants, to: "tenants")
        let keys = [Tenant(id: 1), Tenant(id: 2), Tenant(id: 2, region: "us")]
        for key in keys { _ = try await tenants.value(for: key) { $0.id } }
        invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "tenants", key: "tenant-2")))
        #expect(tenants.snapshot(for: keys[1])?.isExpired == true)
        #expect(tenants.snapshot(for: keys[2])?.isExpired == true)  // describes alike: both, never one
        #expect(tenants.snapshot(for: keys[0])?.isExpired == false)
    }

    @Test func subscriptionsDoNotKeepTheirStatesAlive() async throws {
        let invalidator = AsyncStateInvalidator(bus: InMemoryInvalidationNetwork().bus())
        var state: AsyncState<Int>? = AsyncState(wrappedValue: 0, clock: VirtualClock())
        var family: AsyncStateFamily<Int, Int>? = AsyncStateFamily(clock: VirtualClock())
        invalidator.subscribe(state!, to: "config")
        invalidator.subscribe(family!, to: "numbers")
        #expect(invalidator.subscriberCount("config") == 1 && invalidator.subscriberCount("numbers") == 1)
        state = nil
        family = nil
        #expect(invalidator.subscriberCount("config") == 0 && invalidator.subscriberCount("numbers") == 0)
        invalidator.apply(.reconnected)  // nothing to invalidate, nothing breaks
    }

    @Test func runEndsWhenTheBusShutsDown() async throws {
        let bus = InMemoryInvalidationNetwork().bus()
        let invalidator = AsyncStateInvalidator(bus: bus)
        let runner = Task { await invalidator.run() }
        #expect(await soon { bus.listenerCount == 1 })
        bus.shutDown()
        await runner.value
        #expect(bus.listenerCount == 0)
    }

    @Test func anInvalidationIsCodableAndDescribesItself() throws {
        let message = AsyncStateInvalidation(topic: "profiles", key: "7")
        let decoded = try JSONDecoder().decode(AsyncStateInvalidation.self, from: JSONEncoder().encode(message))
        #expect(decoded == message)
        #expect("\(message)" == "profiles/7" && "\(AsyncStateInvalidation(topic: "config"))" == "config")
    }
}

/// The README's and the article's replicas example, run: two replicas, a change, a restart.
@Test func theTenantServiceExampleAgreesAcrossReplicasAndStartsWarm() async throws {
    let network = InMemoryInvalidationNetwork()
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tenants-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let file = AsyncStateArchiveFile(url: directory.appendingPathComponent("states.json"))
    let busB = network.bus()
    let (a, b) = (TenantService(bus: network.bus(), file: file), TenantService(bus: busB, file: file))
    let runner = Task { await b.invalidator.run() }
    #expect(await soon { busB.listenerCount == 1 })
    let plan = LockedValue("free")
    let load: @Sendable (String) async throws -> TenantConfig = { TenantConfig(tenant: $0, plan: plan.withLock { $0 }) }
    #expect(try await b.tenants.value(for: "acme", load).plan == "free")

    plan.withLock { $0 = "pro" }
    try await a.tenantChanged("acme")
    #expect(await soon { b.tenants.snapshot(for: "acme")?.isExpired == true })
    runner.cancel()

    // b saves on shutdown; the next process starts warm: the saved value at once (stale), refetched.
    try b.save()
    let restarted = TenantService(bus: network.bus(), file: file)
    try restarted.warmUp()
    #expect(restarted.tenants["acme"]?.plan == "free")
    #expect(try await restarted.tenants.value(for: "acme", load).plan == "free")  // stale, at once
    #expect(await soon { restarted.tenants["acme"]?.plan == "pro" })
}

/// What a bus sends: a payload that round-trips, and anything else refused with a clear error.
@Suite struct InvalidationPayloadTests {
    @Test func aMessageRoundTripsThroughItsPayload() throws {
        for message in [
            AsyncStateInvalidation(topic: "config"), AsyncStateInvalidation(topic: "tenants", key: "acme \"co\" / ü"),
        ] {
            #expect(try AsyncStateInvalidation(payload: message.payload()) == message)
        }
        #expect(try AsyncStateInvalidation(topic: "config", key: "7").payload() == #"{"key":"7","topic":"config"}"#)
    }

    @Test(arguments: [
        "", "null", "42", "[]", "{}", #"{"topic":""}"#, #"{"topic":7}"#, #"{"key":"1"}"#, "{\"topic\":\"con",
        "\u{0}\u{1}\u{2}", String(repeating: "x", count: 100),
    ])
    func aMalformedPayloadIsRefused(payload: String) {
        #expect(throws: AsyncStateInvalidation.PayloadError.self) { try AsyncStateInvalidation(payload: payload) }
    }

    @Test func anOversizedPayloadIsRefusedBothWays() {
        let long = String(repeating: "k", count: AsyncStateInvalidation.maximumPayloadBytes)
        let envelope = #"{"key":"","topic":"t"}"#.utf8.count
        #expect(throws: AsyncStateInvalidation.PayloadError.tooLong(bytes: long.utf8.count + envelope)) {
            try AsyncStateInvalidation(topic: "t", key: long).payload()
        }
        let payload = #"{"topic":"t","key":""# + long + #""}"#
        #expect(throws: AsyncStateInvalidation.PayloadError.tooLong(bytes: payload.utf8.count)) {
            try AsyncStateInvalidation(payload: payload)
        }
    }
}
