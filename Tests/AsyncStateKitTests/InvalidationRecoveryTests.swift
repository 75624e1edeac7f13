import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// Auto-recovery: what a replica could not send — its bus was down, a second level failed — is kept,
/// coalesced, and sent again until it is taken.
@Suite struct InvalidationRecoveryTests {
    /// A replica whose invalidator runs on the virtual clock (its backoff is virtual time).
    struct Node {
        let bus: InMemoryInvalidationNetwork.Bus
        let invalidator: AsyncStateInvalidator
        let profiles: AsyncStateFamily<Int, String>
        let runner: Task<Void, any Error>

        init(
            network: InMemoryInvalidationNetwork, clock: VirtualClock,
            recovery: AsyncStateInvalidator.Recovery? = .init(),
            events: (@Sendable (AsyncStateInvalidator.Event) -> Void)? = nil,
            secondLevel: AsyncStateSecondLevelOptions<String>? = nil
        ) async {
            bus = network.bus()
            invalidator = AsyncStateInvalidator(
                bus: bus, invalidateAllInterval: .zero, clock: clock, recovery: recovery, events: events)
            profiles = AsyncStateFamily(expiry: .seconds(3_600), clock: clock, secondLevel: secondLevel)
            invalidator.subscribe(profiles, to: "profiles")
            let invalidator = invalidator
            runner = clock.task { await invalidator.run() }
            _ = await soon { bus.listenerCount == 1 && invalidator.deliveriesApplied == 1 }
        }
    }

    /// The source: a value per key, and the calls made.
    final class Source: Sendable {
        let values = LockedValue<[Int: String]>([:])
        let calls = LockedValue(0)
        var operation: AsyncStateFamily<Int, String>.Operation {
            { [self] key in
                calls.withLock { $0 += 1 }
                return values.withLock { $0[key] ?? "none" }
            }
        }
        func write(_ value: String, for key: Int) { values.withLock { $0[key] = value } }
    }

    @Test func aChangeMadeWhileTheWritersBusIsDownReachesTheOthersOnceItIsBack() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let source = Source()
        source.write("v0", for: 1)
        let writer = await Node(network: network, clock: clock)
        let reader = await Node(network: network, clock: clock)
        #expect(try await reader.profiles.value(for: 1, source.operation) == "v0")

        writer.bus.disconnect()
        for version in 1...10 {
            source.write("v\(version)", for: 1)
            #expect(try await writer.invalidator.invalidate("profiles", key: "1") == .queued)
            await clock.advance(by: .seconds(3))
        }
        // Ten writes, one message owed: a key's messages coalesce.
        #expect(writer.invalidator.messagesQueued == 10)
        #expect(writer.invalidator.messagesPending == 1)
        #expect(try await reader.profiles.value(for: 1, source.operation) == "v0")  // not told yet

        writer.bus.reconnect()
        // Within one backoff of the bus's return (the backoff has reached its maximum, 10 s).
        await clock.advance(by: .seconds(10))
        #expect(await soon { writer.invalidator.messagesPending == 0 })
        #expect(await soon { reader.profiles.snapshot(for: 1)?.isExpired == true })
        #expect(try await reader.profiles.value(for: 1, source.operation) == "v10")
        #expect(writer.invalidator.messagesResent == 1)
        // The reader's source calls: its first load, and one for the ten writes.
        #expect(source.calls.withLock { $0 } == 2)
        writer.runner.cancel()
        reader.runner.cancel()
    }

    /// Writes through the invalidator with a second level: each stores its value there under a new
    /// version; with the writer's bus down for 30 s the ten messages coalesce into one, and once the
    /// bus is back every replica serves the last write — the others taken from the second level, with
    /// no source call. The writer's own bus, reconnecting, invalidates the writer too (it may have
    /// missed the others' messages): it does not take back the value it holds (the entry of its own
    /// date and version), and reads it from the source once; the others then take that entry.
    @Test func writesDuringTheWritersOutageReachTheFleetWithoutASourceCall() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let level = InMemorySecondLevel(clock: clock)
        let source = Source()
        source.write("v0", for: 1)
        var nodes: [Node] = []
        for _ in 0..<3 {
            nodes.append(
                await Node(
                    network: network, clock: clock,
                    secondLevel: AsyncStateSecondLevelOptions(level: level.replica(), namespace: "p", codec: .json)))
        }
        for node in nodes { #expect(try await node.profiles.value(for: 1, source.operation) == "v0") }
        #expect(source.calls.withLock { $0 } == 1)

        let writer = nodes[0]
        writer.bus.disconnect()
        for version in 1...10 {
            source.write("w\(version)", for: 1)  // the service writes its source, then the fleet
            #expect(
                try await writer.invalidator.set("w\(version)", for: 1, in: writer.profiles, topic: "profiles")
                    == .queued)
            #expect(writer.profiles.snapshot(for: 1)?.value == "w\(version)")
            await clock.advance(by: .seconds(3))
        }
        #expect(level.entry(for: "p:1").map { try? AsyncStateCodec<String>.json.decode($0.payload) } == "w10")
        #expect(writer.invalidator.messagesPending == 1)
        #expect(try await nodes[1].profiles.value(for: 1, source.operation) == "v0")  // not told yet

        writer.bus.reconnect()
        await clock.advance(by: .seconds(10))
        #expect(await soon { writer.invalidator.messagesPending == 0 })
        for node in nodes {
            #expect(
                await soon {
                    node.profiles.snapshot(for: 1)?.value == "w10" || node.profiles.snapshot(for: 1)?.isExpired == true
                })
            #expect(try await node.profiles.value(for: 1, source.operation) == "w10")
        }
        // The first load, and the writer's after its own reconnection; none for the others.
        #expect(source.calls.withLock { $0 } == 2)
        #expect(writer.profiles.snapshot(for: 1)?.isExpired == false)
        for node in nodes { node.runner.cancel() }
    }

    /// How the replicas of a test share a second level.
    enum SecondLevelSetting: CaseIterable, Sendable {
        /// They have none.
        case none
        /// One, its entries unsealed.
        case plain
        /// One, its entries sealed (``AsyncStateEntryAuthenticator``).
        case sealed
    }

    /// A write through the invalidator while every part is up: the others take it from the second
    /// level (0 source calls) — sealed, with the version the second level chose for it, when the
    /// replicas seal their entries; without a second level they load it from the source once each.
    @Test(arguments: SecondLevelSetting.allCases)
    func aWriteThroughOneReplicaCostsTheOthersNoSourceCall(secondLevel: SecondLevelSetting) async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let level = InMemorySecondLevel(clock: clock)
        let source = Source()
        source.write("v0", for: 5)
        let sealer = secondLevel == .sealed ? SecondLevelSealTests.fleet : nil
        var nodes: [Node] = []
        for _ in 0..<3 {
            let options =
                secondLevel == .none
                ? nil
                : AsyncStateSecondLevelOptions<String>(
                    level: level.replica(), namespace: "p", codec: .json, authenticator: sealer)
            nodes.append(await Node(network: network, clock: clock, secondLevel: options))
        }
        for node in nodes { _ = try await node.profiles.value(for: 5, source.operation) }
        let before = source.calls.withLock { $0 }
        // A second later: a write dated as the value a replica holds, at the version it was told of,
        // is taken for that value (the one a replica must not take back), and loaded from the source.
        await clock.advance(by: .seconds(1))
        source.write("v1", for: 5)
        #expect(
            try await nodes[0].invalidator.set("v1", for: 5, in: nodes[0].profiles, topic: "profiles") == .published)
        if let sealer {
            let entry = try #require(level.entry(for: "p:5"))
            let envelope = try EntrySeal.envelope(of: entry, key: "p:5", authenticator: sealer)
            #expect(try AsyncStateCodec<String>.json.decode(envelope) == "v1")
        }
        for node in nodes.dropFirst() {
            #expect(await soon { node.profiles.snapshot(for: 5)?.isExpired == true })
            #expect(try await node.profiles.value(for: 5, source.operation) == "v1")
        }
        #expect(try await nodes[0].profiles.value(for: 5, source.operation) == "v1")
        #expect(source.calls.withLock { $0 } - before == (secondLevel == .none ? 2 : 0))
        if secondLevel != .none {
            #expect(nodes.allSatisfy { $0.profiles.secondLevelStatistics?.undecodable == 0 })
        }
        for node in nodes { node.runner.cancel() }
    }

    @Test func flushWaitsUntilTheQueueIsSent() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let writer = await Node(network: network, clock: clock)
        let reader = await Node(network: network, clock: clock)
        writer.bus.disconnect()
        #expect(try await writer.invalidator.invalidate("profiles", key: "7") == .queued)
        let flushed = LockedValue(false)
        let flushing = clock.task {
            await writer.invalidator.flush()
            flushed.withLock { $0 = true }
        }
        await clock.advance(by: .seconds(60))
        #expect(!flushed.withLock { $0 })  // the bus is still down
        writer.bus.reconnect()
        await clock.advance(by: .seconds(10))
        _ = try await flushing.value
        #expect(flushed.withLock { $0 })
        #expect(await soon { reader.invalidator.deliveriesApplied == 2 })
        await writer.invalidator.flush()  // nothing owed: at once
        writer.runner.cancel()
        reader.runner.cancel()
    }

    @Test func aFullQueueCollapsesIntoWholeTopicInvalidations() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let events = LockedValue<[String]>([])
        let writer = await Node(
            network: network, clock: clock, recovery: .init(capacity: 2),
            events: { event in
                let line: String
                switch event {
                case .queued(let message): line = "queued \(message)"
                case .resent(let message): line = "resent \(message)"
                case .collapsed(let topics): line = "collapsed \(topics)"
                case .dropped(let topics): line = "dropped \(topics)"
                case .rejected(let message, let why): line = "rejected \(message): \(why)"
                }
                events.withLock { $0.append(line) }
            })
        let reader = await Node(network: network, clock: clock)
        let source = Source()
        for key in 1...3 { _ = try await reader.profiles.value(for: key, source.operation) }
        writer.bus.disconnect()
        for key in 1...3 { try await writer.invalidator.invalidate("profiles", key: "\(key)") }
        #expect(writer.invalidator.messagesPending == 1)  // the whole topic
        #expect(writer.invalidator.queueCollapses == 1)
        #expect(
            events.withLock { $0 } == [
                "queued profiles/1", "queued profiles/2", "queued profiles/3", "collapsed [\"profiles\"]",
            ])
        writer.bus.reconnect()
        await clock.advance(by: .seconds(10))
        #expect(await soon { (1...3).allSatisfy { reader.profiles.snapshot(for: $0)?.isExpired == true } })
        #expect(events.withLock { $0.last } == "resent profiles")
        writer.runner.cancel()
        reader.runner.cancel()
    }

    @Test func aWholeTopicInvalidationAbsorbsTheKeysQueuedBeforeIt() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let writer = await Node(network: network, clock: clock)
        writer.bus.disconnect()
        try await writer.invalidator.invalidate("profiles", key: "1")
        try await writer.invalidator.invalidate("profiles", tag: "tenant-a")
        try await writer.invalidator.invalidate("profiles")
        try await writer.invalidator.invalidate("profiles", key: "2")  // covered by the whole topic
        #expect(writer.invalidator.messagesPending == 1)
        #expect(writer.invalidator.queueCollapses == 0)
        writer.runner.cancel()
    }

    @Test func withoutRecoveryABusErrorIsThrown() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let writer = await Node(network: network, clock: clock, recovery: nil)
        writer.bus.disconnect()
        await #expect(throws: InMemoryInvalidationNetwork.Disconnected.self) {
            try await writer.invalidator.invalidate("profiles", key: "1")
        }
        #expect(writer.invalidator.messagesPending == 0)
        writer.runner.cancel()
    }

    /// A second level that cannot be marked: the message goes out at once (the replicas drop their
    /// data), and the mark is made once the second level is back, then the message is sent again
    /// with the version it gave.
    @Test func aFailedSecondLevelMarkIsMadeLaterAndTheMessageSentAgainWithItsVersion() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let level = InMemorySecondLevel(clock: clock)
        func options() -> AsyncStateSecondLevelOptions<String> {
            AsyncStateSecondLevelOptions(level: level.replica(), namespace: "profiles", codec: .json)
        }
        let writer = await Node(network: network, clock: clock, secondLevel: options())
        let reader = await Node(network: network, clock: clock, secondLevel: options())
        let source = Source()
        source.write("old", for: 1)
        #expect(try await reader.profiles.value(for: 1, source.operation) == "old")

        level.isDown = true
        source.write("new", for: 1)
        #expect(try await writer.invalidator.invalidate("profiles", key: "1") == .queued)
        #expect(await soon { reader.profiles.snapshot(for: 1)?.isExpired == true })  // told at once
        #expect(writer.invalidator.messagesPending == 1)  // the mark is owed

        level.isDown = false
        await clock.advance(by: .seconds(10))
        #expect(await soon { writer.invalidator.messagesPending == 0 })
        #expect(level.entry(for: "profiles:1")?.freshUntil == .distantPast)  // marked stale
        // The resent message carries the mark's version: the reader learns it, and takes no older
        // entry afterwards.
        #expect(await soon { reader.invalidator.deliveriesApplied == 3 })
        #expect(try await reader.profiles.value(for: 1, source.operation) == "new")
        writer.runner.cancel()
        reader.runner.cancel()
    }

    /// While its mark is owed, the second level still holds the old entry as fresh; the writer itself
    /// may take it back (a key it no longer holds, read again). When the mark is made, the message
    /// is applied here again with its version: the writer drops the old entry too. (Found by the
    /// fleet simulator: a replica served the old value until its expiry.)
    @Test func theWriterThatTookTheOldEntryBackMeanwhileIsInvalidatedWhenTheMarkIsMade() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let level = InMemorySecondLevel(clock: clock)
        let writer = await Node(
            network: network, clock: clock,
            secondLevel: AsyncStateSecondLevelOptions(
                level: level.replica(), namespace: "profiles", codec: .json, faultBackoff: .zero))
        let source = Source()
        source.write("old", for: 1)
        #expect(try await writer.profiles.value(for: 1, source.operation) == "old")

        level.isDown = true
        source.write("new", for: 1)
        #expect(try await writer.invalidator.invalidate("profiles", key: "1") == .queued)
        #expect(writer.invalidator.messagesPending == 1)  // the mark is owed
        // The queue's first round (at once) fails while the second level is down; the next is a
        // backoff of virtual time away.
        await clock.advance(by: .zero)
        level.isDown = false
        // The key leaves the writer's memory and is read again before the queue is sent: the old
        // entry, still fresh there, is taken.
        _ = writer.profiles.remove(1)
        #expect(try await writer.profiles.value(for: 1, source.operation) == "old")

        await clock.advance(by: .seconds(10))
        #expect(await soon { writer.invalidator.messagesPending == 0 })
        #expect(writer.profiles.snapshot(for: 1)?.isExpired == true)
        #expect(try await writer.profiles.value(for: 1, source.operation) == "new")
        writer.runner.cancel()
    }
}
