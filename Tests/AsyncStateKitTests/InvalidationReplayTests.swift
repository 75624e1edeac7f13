import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// A stand-in for an authenticator with a list of secrets, as a fleet rotating its secret runs it:
/// signs with the first, accepts a signature by any (``TestAuthenticator`` for each).
struct KeyListAuthenticator: AsyncStateInvalidationAuthenticator {
    var secrets: [String]

    func signature(for content: String) -> String { TestAuthenticator(secret: secrets[0]).signature(for: content) }

    func isValid(_ signature: String, for content: String) -> Bool {
        secrets.contains { TestAuthenticator(secret: $0).isValid(signature, for: content) }
    }
}

/// Records the deliveries an invalidator refused, with why.
final class RejectionLog: Sendable {
    private let log = LockedValue<[AsyncStateInvalidator.Rejection]>([])
    var all: [AsyncStateInvalidator.Rejection] { log.withLock { $0 } }
    func record(_ event: AsyncStateInvalidator.Event) {
        if case .rejected(_, let rejection) = event { log.withLock { $0.append(rejection) } }
    }
}

/// Signed messages captured on the way and sent again, forged trace links, and a secret rotated
/// across a fleet: as an attacker who can LISTEN (and NOTIFY) would try, in virtual time.
@Suite struct InvalidationReplayTests {
    /// A writer and a reader on one network and one virtual clock; the reader is driven by hand.
    struct Pair {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let writer: AsyncStateInvalidator
        let reader: AsyncStateInvalidator
        let rejections = RejectionLog()
        let profiles: AsyncStateFamily<Int, String>
        let deliveries: InMemoryInvalidationNetwork.Bus

        init(writerSecrets: [String] = ["shared"], readerSecrets: [String] = ["shared"]) {
            deliveries = network.bus()
            writer = AsyncStateInvalidator(
                bus: network.bus(), authenticator: KeyListAuthenticator(secrets: writerSecrets), clock: clock)
            let rejections = rejections
            reader = AsyncStateInvalidator(
                bus: deliveries, authenticator: KeyListAuthenticator(secrets: readerSecrets),
                invalidateAllInterval: .zero, clock: clock, events: { rejections.record($0) })
            profiles = AsyncStateFamily<Int, String>(expiry: .seconds(3_600), clock: clock)
            reader.subscribe(profiles, to: "profiles")
        }

        /// What the writer publishes, as the reader's bus receives it.
        func sent(_ send: () async throws -> Void) async throws -> AsyncStateInvalidation {
            var stream = deliveries.deliveries().makeAsyncIterator()
            #expect(await stream.next() == .reconnected)
            try await send()
            guard case .invalidate(let message) = await stream.next() else { throw CaptureFailed() }
            return message
        }

        struct CaptureFailed: Error {}

        func load(_ ids: ClosedRange<Int>) async throws {
            for id in ids { _ = try await profiles.value(for: id) { "user \($0)" } }
        }

        func isExpired(_ id: Int) -> Bool { profiles.snapshot(for: id)?.isExpired == true }
    }

    @Test func aSignedMessageIsAcceptedOnceWithinItsWindow() async throws {
        let pair = Pair()
        try await pair.load(1...2)
        let message = try await pair.sent { try await pair.writer.invalidate("profiles", key: "1") }
        #expect(message.sender != nil && message.sentAt == pair.clock.date.millisecondsSince1970)

        pair.reader.apply(.invalidate(message))
        #expect(pair.isExpired(1) && pair.reader.deliveriesApplied == 1)

        // Sent again by whoever captured it: at once, and later within the window.
        try await pair.load(1...1)
        pair.reader.apply(.invalidate(message))
        await pair.clock.advance(by: .seconds(90))
        pair.reader.apply(.invalidate(message))
        // After the window: refused by its time.
        await pair.clock.advance(by: .seconds(60))
        pair.reader.apply(.invalidate(message))
        #expect(!pair.isExpired(1))
        #expect(pair.rejections.all == [.replayed, .replayed, .outsideWindow])
        #expect(pair.reader.deliveriesRejected == 3 && pair.reader.deliveriesApplied == 1)
        // Once the window has passed, the signature is no longer kept: refused by its time alone.
        pair.reader.apply(.invalidate(AsyncStateInvalidation(topic: "unrelated")))
        #expect(pair.reader.replaysRemembered <= 1)
    }

    @Test func aTimeOrSenderChangedOrLeftOutIsRefused() async throws {
        let pair = Pair()
        try await pair.load(1...3)
        let message = try await pair.sent { try await pair.writer.invalidate("profiles", key: "1") }

        // A message from the future (a replica's clock far ahead, or a forged time) breaks the signature.
        var later = message
        later.sentAt = message.sentAt.map { $0 + 1 }
        pair.reader.apply(.invalidate(later))
        var otherSender = message
        otherSender.sender = "someone"
        pair.reader.apply(.invalidate(otherSender))
        // Signed with the secret but without a sender and a time (as a release before them signed).
        let secret = KeyListAuthenticator(secrets: ["shared"])
        var untimed = AsyncStateInvalidation(topic: "profiles", key: "2")
        untimed.signature = secret.signature(for: untimed.signedContent)
        pair.reader.apply(.invalidate(untimed))
        // Signed, with a time outside the window either way.
        for offset: Int64 in [-121_000, 121_000] {
            var skewed = AsyncStateInvalidation(
                topic: "profiles", key: "3", sender: "r", sentAt: message.sentAt! + offset)
            skewed.signature = secret.signature(for: skewed.signedContent)
            pair.reader.apply(.invalidate(skewed))
        }
        #expect(pair.rejections.all == [.signature, .signature, .untimed, .outsideWindow, .outsideWindow])
        #expect(!pair.isExpired(1) && !pair.isExpired(2) && !pair.isExpired(3))
    }

    @Test func metadataIsSignedSoATraceLinkCannotBeForged() async throws {
        let pair = Pair()
        let writer = AsyncStateInvalidator(
            bus: pair.network.bus(), authenticator: KeyListAuthenticator(secrets: ["shared"]), clock: pair.clock,
            metadata: { ["traceparent": "00-aaaa-01"] })
        try await pair.load(1...1)
        let message = try await pair.sent { try await writer.invalidate("profiles", key: "1") }
        #expect(message.metadata == ["traceparent": "00-aaaa-01"])
        var forged = message
        forged.metadata = ["traceparent": "00-ffff-01"]
        pair.reader.apply(.invalidate(forged))
        var stripped = message
        stripped.metadata = nil
        pair.reader.apply(.invalidate(stripped))
        #expect(pair.rejections.all == [.signature, .signature] && !pair.isExpired(1))
        pair.reader.apply(.invalidate(message))
        #expect(pair.isExpired(1))
    }

    /// A rolling change of the secret: every replica first accepts both (signing with the old),
    /// then signs with the new, then drops the old. At each step, replicas a step apart accept each
    /// other's messages; only one that never learned the new secret refuses what is signed with it.
    @Test func aSecretIsRotatedWithoutDowntime() async throws {
        let steps: [(writer: [String], reader: [String], accepted: Bool)] = [
            (["old"], ["old", "new"], true),  // the reader was restarted first
            (["old", "new"], ["new", "old"], true),  // the reader signs with the new one now
            (["new", "old"], ["old", "new"], true),
            (["new", "old"], ["new"], true),  // the old one dropped once every replica signs with the new
            (["new"], ["old"], false),  // a replica left behind
        ]
        for (index, step) in steps.enumerated() {
            let pair = Pair(writerSecrets: step.writer, readerSecrets: step.reader)
            try await pair.load(1...1)
            let message = try await pair.sent { try await pair.writer.invalidate("profiles", key: "1") }
            pair.reader.apply(.invalidate(message))
            #expect(pair.isExpired(1) == step.accepted, "step \(index): \(step)")
            #expect(pair.rejections.all == (step.accepted ? [] : [.signature]), "step \(index)")
        }
    }

    /// Whatever arrives, what the replay guard keeps stays under its capacity, and a message it had
    /// to forget is still refused (by the floor of times it forgot).
    @Test func theReplayGuardsMemoryIsBoundedAndForgettingLetsNoReplayIn() {
        var guardian = ReplayGuard(window: .seconds(120), capacity: 1_000)
        let now: Int64 = 1_000_000
        for index in 0..<5_000 {
            #expect(guardian.admit(signature: "s\(index)", sentAt: now - 5_000 + Int64(index), now: now) == nil)
        }
        #expect(guardian.count == 1_000)
        #expect(guardian.admit(signature: "s0", sentAt: now - 5_000, now: now) == .replayed)
        #expect(guardian.admit(signature: "s3999", sentAt: now - 1_001, now: now) == .replayed)
        #expect(guardian.admit(signature: "s4999", sentAt: now - 1, now: now) == .replayed)
        #expect(guardian.admit(signature: "new", sentAt: now, now: now) == nil)
        // Time passes: what left the window is forgotten, and refused by its time.
        #expect(guardian.admit(signature: "later", sentAt: now + 200_000, now: now + 200_000) == nil)
        #expect(guardian.count == 1)
        #expect(guardian.admit(signature: "new", sentAt: now, now: now + 200_000) == .outsideWindow)
        // Extreme times never trap.
        #expect(guardian.admit(signature: "x", sentAt: .min, now: .max) == .outsideWindow)
        #expect(guardian.admit(signature: "y", sentAt: .max, now: .min) == .outsideWindow)
        var forever = ReplayGuard(window: .seconds(Int64.max), capacity: 1)
        #expect(forever.admit(signature: "z", sentAt: 0, now: 0) == nil)
        #expect(forever.admit(signature: "z", sentAt: .min + 1, now: .max) == .outsideWindow)
    }

    /// The rate limit keeps state only for topics this replica subscribed to: a flood of messages
    /// about other topics remembers nothing, and a topic whose last subscriber is gone is forgotten.
    @Test func theRateLimitRemembersSubscribedTopicsOnly() async {
        let clock = VirtualClock()
        let invalidator = AsyncStateInvalidator(bus: InMemoryInvalidationNetwork().bus(), clock: clock)
        var tenants: AsyncStateFamily<Int, Int>? = AsyncStateFamily<Int, Int>(clock: clock)
        invalidator.subscribe(tenants!, to: "tenants")
        for index in 0..<10_000 { invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "flood-\(index)"))) }
        #expect(invalidator.rateLimitedTopics == 0)
        invalidator.apply(.invalidate(AsyncStateInvalidation(topic: "tenants")))
        #expect(invalidator.rateLimitedTopics == 1)
        tenants = nil
        #expect(invalidator.subscriberCount("tenants") == 0)
        #expect(invalidator.rateLimitedTopics == 0)
    }
}
