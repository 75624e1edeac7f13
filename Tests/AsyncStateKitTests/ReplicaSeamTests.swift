import AsyncStateKit
import AsyncStateTesting
import Foundation
import Testing

/// Replicas miss nothing: a replica that starts listening late catches up, deliveries are counted as
/// they happened, and payloads from newer releases are read (keys that describe alike: in
/// ``InvalidationTests``).
@Suite struct ReplicaSeamTests {
    @Test func aReplicaThatStartsListeningLateRefetchesWhatItMissed() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let (busA, busB) = (network.bus(), network.bus())
        let (writer, late) = (AsyncStateInvalidator(bus: busA), AsyncStateInvalidator(bus: busB))
        let config = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(3_600), clock: clock)
        let profiles = AsyncStateFamily<Int, String>(expiry: .seconds(3_600), clock: clock)
        late.subscribe(config, to: "config")
        late.subscribe(profiles, to: "profiles")
        let version = LockedValue(1)
        // The late replica warms its states, then another replica writes, before it listens.
        #expect(try await config.value { version.withLock { $0 } } == 1)
        #expect(try await profiles.value(for: 7) { _ in "v\(version.withLock { $0 })" } == "v1")
        version.withLock { $0 = 2 }
        try await writer.invalidate("config")
        try await writer.invalidate("profiles", key: "7")
        #expect(busB.counts.delivered == 0 && busB.counts.dropped == 2)  // nobody listened: not delivered
        #expect(!config.snapshot.isExpired)

        // It starts listening: its stream's first delivery is `reconnected`, which covers the gap.
        let runner = Task { await late.run() }
        #expect(await soon { late.deliveriesApplied == 1 })
        #expect(busB.counts.delivered == 1)
        #expect(config.snapshot.isExpired && profiles.snapshot(for: 7)?.isExpired == true)
        #expect(try await config.value { version.withLock { $0 } } == 2)
        #expect(try await profiles.value(for: 7) { _ in "v\(version.withLock { $0 })" } == "v2")
        runner.cancel()
    }

    @Test func everyStreamStartsWithReconnectedAndOnlyWhatReachedAListenerIsDelivered() async throws {
        let network = InMemoryInvalidationNetwork()
        let (sender, receiver) = (network.bus(), network.bus())
        try await sender.publish(AsyncStateInvalidation(topic: "config"))  // nobody listens yet
        #expect(receiver.counts == (delivered: 0, lost: 0, dropped: 1))
        var first = receiver.deliveries().makeAsyncIterator()
        #expect(await first.next() == .reconnected)
        try await sender.publish(AsyncStateInvalidation(topic: "config"))
        #expect(await first.next() == .invalidate(AsyncStateInvalidation(topic: "config")))
        receiver.disconnect()
        try await sender.publish(AsyncStateInvalidation(topic: "config"))
        #expect(receiver.counts == (delivered: 2, lost: 1, dropped: 1))
    }

    @Test func aPayloadWithFieldsThisReleaseDoesNotKnowIsReadWithoutThem() throws {
        let newer = #"{"topic":"tenants","key":"acme","epoch":7,"origin":{"replica":"b"}}"#
        #expect(try AsyncStateInvalidation(payload: newer) == AsyncStateInvalidation(topic: "tenants", key: "acme"))
        // A second level's version is read; one that is not an unsigned 64-bit integer is refused.
        let versioned = AsyncStateInvalidation(topic: "tenants", key: "acme", version: 7)
        #expect(try versioned.payload() == #"{"key":"acme","topic":"tenants","version":7}"#)
        #expect(try AsyncStateInvalidation(payload: versioned.payload()) == versioned)
        #expect(throws: AsyncStateInvalidation.PayloadError.self) {
            try AsyncStateInvalidation(payload: #"{"topic":"tenants","version":-1}"#)
        }
        #expect(
            try AsyncStateInvalidation(payload: #"{"topic":"config","traceparent":"00-x"}"#)
                == AsyncStateInvalidation(topic: "config"))
        // What it knows must still be right.
        #expect(throws: AsyncStateInvalidation.PayloadError.self) {
            try AsyncStateInvalidation(payload: #"{"topic":"t","key":7,"extra":1}"#)
        }
    }
}
