import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// A stand-in for an HMAC (the library has no cryptography; the example service uses swift-crypto's
/// HMAC-SHA256): FNV-1a over the secret and the content. It checks the plumbing, not the strength.
struct TestAuthenticator: AsyncStateInvalidationAuthenticator {
    var secret: String

    func signature(for content: String) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in (secret + "|" + content).utf8 { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        return String(hash, radix: 16)
    }

    func isValid(_ signature: String, for content: String) -> Bool { signature == self.signature(for: content) }
}

/// Counts the `invalidated` events of each key (or "" for a state).
final class InvalidationCounter: AsyncStateObserver {
    private let counts = LockedValue<[String: Int]>([:])
    subscript(key: String) -> Int { counts.withLock { $0[key] ?? 0 } }
    func observe(_ event: AsyncStateEvent) {
        if case .invalidated = event.kind { counts.withLock { $0[event.key ?? "", default: 0] += 1 } }
    }
}

/// The invalidation bus, tried as an attacker who can reach it would: forged messages, floods of
/// whole-topic invalidations, floods of random keys, and payloads written to forge log lines.
@Suite struct InvalidationSecurityTests {
    @Test func anUnsignedOrBadlySignedMessageIsDroppedAndCounted() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let (busA, busB) = (network.bus(), network.bus())
        let secret = TestAuthenticator(secret: "shared")
        let writer = AsyncStateInvalidator(bus: busA, authenticator: secret)
        let reader = AsyncStateInvalidator(bus: busB, authenticator: secret, invalidateAllInterval: .zero)
        let profiles = AsyncStateFamily<Int, String>(expiry: .seconds(3_600), clock: clock)
        reader.subscribe(profiles, to: "profiles")
        for id in 1...3 { _ = try await profiles.value(for: id) { "user \($0)" } }

        // An attacker with access to the bus, without the secret.
        reader.apply(.invalidate(AsyncStateInvalidation(topic: "profiles", key: "1")))
        reader.apply(.invalidate(AsyncStateInvalidation(topic: "profiles", key: "2", signature: "forged")))
        let wrongSecret = TestAuthenticator(secret: "guessed")
        var guessed = AsyncStateInvalidation(topic: "profiles")
        guessed.signature = wrongSecret.signature(for: guessed.signedContent)
        reader.apply(.invalidate(guessed))
        // A signature copied from another message does not fit this one.
        var replayed = AsyncStateInvalidation(topic: "profiles", key: "3")
        replayed.signature = secret.signature(for: AsyncStateInvalidation(topic: "profiles", key: "1").signedContent)
        reader.apply(.invalidate(replayed))
        #expect(reader.deliveriesRejected == 4 && reader.deliveriesApplied == 0)
        #expect((1...3).allSatisfy { profiles.snapshot(for: $0)?.isExpired == false })

        // A replica that shares it: signed on the way out, checked and applied on the way in.
        let runner = Task { await reader.run() }
        #expect(await soon { reader.deliveriesApplied == 1 })  // the stream's first `reconnected`
        for id in 1...3 { _ = try await profiles.value(for: id) { "user \($0)" } }
        try await writer.invalidate("profiles", key: "2")
        #expect(await soon { reader.deliveriesApplied == 2 })
        #expect(profiles.snapshot(for: 2)?.isExpired == true && profiles.snapshot(for: 1)?.isExpired == false)
        #expect(reader.deliveriesRejected == 4)
        runner.cancel()
    }

    @Test func aFloodOfWholeTopicInvalidationsIsCoalescedToOnePerInterval() async throws {
        let clock = VirtualClock()
        let bus = InMemoryInvalidationNetwork().bus()
        let counter = InvalidationCounter()
        let invalidator = AsyncStateInvalidator(bus: bus, invalidateAllInterval: .seconds(1), clock: clock)
        let tenants = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), clock: clock, observer: counter)
        invalidator.subscribe(tenants, to: "tenants")
        for id in 1...100 { tenants.set(id, for: id) }
        let runner = clock.task { await invalidator.run() }
        await clock.advance(by: .zero)
        #expect(counter["1"] == 1)  // the stream's first `reconnected`: applied at once

        // A thousand keyless messages within the second: none applied now, one at its end.
        for _ in 0..<1_000 { invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "tenants"))) }
        #expect(counter["1"] == 1 && counter["100"] == 1)
        #expect(invalidator.invalidationsCoalesced == 999 && invalidator.deliveriesApplied == 1_001)
        await clock.advance(by: .milliseconds(999))
        #expect(counter["1"] == 1)
        await clock.advance(by: .milliseconds(1))
        #expect(counter["1"] == 2 && counter["100"] == 2)
        // The next second: the same again, and `reconnected` counts as one for every topic.
        invalidator.apply(.reconnected)
        invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "tenants")))
        await clock.advance(by: .seconds(1))
        #expect(counter["1"] == 3)
        // A keyed message is never held back; a second later a whole one applies at once.
        invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "tenants", key: "7")))
        #expect(counter["7"] == 4 && counter["1"] == 3)
        await clock.advance(by: .seconds(1))
        invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "tenants")))
        #expect(counter["1"] == 4)
        // This replica's own writes are never held back.
        try await invalidator.invalidate("tenants")
        #expect(counter["1"] == 5)
        runner.cancel()
        _ = await runner.result
    }

    @Test func aFloodOfRandomKeysCostsOneLookupEachWithAParser() async throws {
        let clock = VirtualClock()
        let invalidator = AsyncStateInvalidator(bus: InMemoryInvalidationNetwork().bus(), clock: clock)
        let parsed = AsyncStateFamily<UUID, Int>(expiry: .seconds(3_600), clock: clock)
        let scanned = AsyncStateFamily<UUID, Int>(expiry: .seconds(3_600), clock: clock)
        invalidator.subscribe(parsed, to: "parsed", parse: UUID.init(uuidString:))
        invalidator.subscribe(scanned, to: "scanned")
        let known = (0..<1_000).map { _ in UUID() }
        for (index, id) in known.enumerated() {
            parsed.set(index, for: id)
            scanned.set(index, for: id)
        }
        for _ in 0..<1_000 {
            let random = UUID().uuidString
            invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "parsed", key: random)))
            invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "parsed", key: "not a uuid")))
        }
        #expect(invalidator.keyScans == 0)  // no message compared every entry
        invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "parsed", key: known[5].uuidString)))
        #expect(parsed.snapshot(for: known[5])?.isExpired == true && parsed.snapshot(for: known[6])?.isExpired == false)
        // Without a parser, each keyed message compares every entry: the cost the parser avoids.
        invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "scanned", key: known[5].uuidString)))
        #expect(invalidator.keyScans == 1)
        #expect(scanned.snapshot(for: known[5])?.isExpired == true)
    }

    @Test func aWholeFamilyIsInvalidatedInPassesOverItsShardsReachingEveryEntry() async throws {
        let clock = VirtualClock()
        // 16 shards of about 1,250 entries: more than one pass of 1,024 each.
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: 20_000, clock: clock)
        for key in 0..<20_000 { family.set(key, for: key) }
        let live = family.updates(for: 7)  // one entry live, with its store
        family.invalidate { $0 % 2 == 1 }
        var snapshots = family.snapshots
        #expect(snapshots.count == 20_000)
        #expect(snapshots.filter { $0.value.isExpired != ($0.key % 2 == 1) }.isEmpty)
        family.invalidateAll()
        snapshots = family.snapshots
        #expect(snapshots.values.filter { !$0.isExpired }.isEmpty)
        withExtendedLifetime(live) {}
    }

    @Test func aMalformedPayloadCannotForgeALogLine() {
        let forged = "not json\n2026-11-25T00:00:00Z critical: [admin] password changed\u{1B}[2J"
        do {
            _ = try AsyncStateInvalidation(payload: forged)
            Issue.record("a malformed payload was read")
        } catch {
            let line = "\(error)"
            #expect(!line.contains("\n") && !line.contains("\u{1B}"))
            #expect(line.contains(#"\n2026-11-25"#))  // escaped, still readable
        }
    }

    @Test func aSignatureTravelsInThePayload() throws {
        let message = AsyncStateInvalidation(topic: "tenants", key: "acme", signature: "c2ln")
        #expect(try message.payload() == #"{"key":"acme","signature":"c2ln","topic":"tenants"}"#)
        #expect(try AsyncStateInvalidation(payload: message.payload()) == message)
        // What it signs cannot be shifted between the topic and the key.
        #expect(
            AsyncStateInvalidation(topic: "t/a", key: "b").signedContent
                != AsyncStateInvalidation(topic: "t", key: "a/b").signedContent)
        #expect(
            AsyncStateInvalidation(topic: "t").signedContent
                != AsyncStateInvalidation(topic: "t", key: "").signedContent)
    }
}
