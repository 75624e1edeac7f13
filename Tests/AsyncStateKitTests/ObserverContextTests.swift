import AsyncStateTesting
import Testing

@testable import AsyncStateKit

/// The request a test caller stands for, as a tracer's context would be.
enum TestRequest {
    @TaskLocal static var id: String?
}

/// Records every event with what a tracing adapter reads from it: the caller context (the
/// ``TestRequest`` its caller ran in), the fetch and the waiter.
final class ContextLog: AsyncStateObserver {
    struct Line: Sendable {
        var key: String?
        var kind: AsyncStateEvent.Kind
        var context: String?
        var fetch: AsyncStateFetch?
        var waiter: AsyncStateEvent.Waiter?
        var metadata: [String: String]?
        /// The request of the task that delivered it (hits are delivered in their caller's).
        var deliveredIn: String?

        var name: String {
            switch kind {
            case .started(let reason): "started(\(reason))"
            case .joined: "joined"
            case .waitEnded(let error): error == nil ? "waitEnded" : "waitEnded(\(type(of: error!)))"
            case .succeeded: "succeeded"
            case .cancelled: "cancelled"
            case .hit: "hit"
            case .servedStale: "servedStale"
            case .invalidated: "invalidated"
            case .batchStarted(let fetches): "batchStarted(\(fetches.count))"
            case .batchEnded: "batchEnded"
            default: "\(kind)"
            }
        }
    }

    private let lines = LockedValue<[Line]>([])
    var all: [Line] { lines.withLock { $0 } }
    func clear() { lines.withLock { $0 = [] } }

    func observe(_ event: AsyncStateEvent) {
        let line = Line(
            key: event.key, kind: event.kind, context: event.callerContext as? String, fetch: event.fetch,
            waiter: event.waiter, metadata: event.invalidation?.metadata, deliveredIn: TestRequest.id)
        lines.withLock { $0.append(line) }
    }

    func callerContext() -> (any Sendable)? { TestRequest.id }
}

@Suite struct ObserverContextTests {
    @Test func eventsCarryTheirCallersContextTheirFetchAndTheirWaiters() async throws {
        let clock = VirtualClock()
        let log = ContextLog()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(10), clock: clock, name: "s", observer: log)
        let slow = Source<Int>().operation(on: clock, delay: .seconds(1), value: 1)
        let callers = ["A", "B", "C"].map { id in
            TestRequest.$id.withValue(id) { clock.task { try await state.value(slow) } }
        }
        for caller in callers {
            await clock.advance(by: .zero)
            _ = caller
        }
        await clock.advance(by: .seconds(1))
        for caller in callers { #expect(try await caller.value == 1) }
        _ = try await TestRequest.$id.withValue("D") { try await state.value(slow) }

        let lines = log.all
        #expect(
            lines.map(\.name) == [
                "started(fetch)", "joined", "joined", "succeeded", "waitEnded", "waitEnded", "waitEnded", "hit",
            ])
        #expect(lines.map(\.context) == ["A", "B", "C", nil, nil, nil, nil, nil])
        // One fetch object from its start to its outcome and its waiters' ends.
        let fetch = try #require(lines[0].fetch)
        #expect(lines[0..<7].allSatisfy { $0.fetch === fetch } && lines[7].fetch == nil)
        #expect(fetch.reason == .fetch)
        // Each waiter's start (or join) is matched by exactly one end, in the order they came.
        let waits = lines[0..<3].map(\.waiter)
        #expect(Set(waits.compactMap { $0 }).count == 3)
        #expect(lines[4..<7].map(\.waiter) == waits)
        // A hit is delivered in its caller's task, which reads its own context.
        #expect(lines[7].deliveredIn == "D")

        // Each observer keeps what it needs with the fetch, apart from the others.
        let other = ContextLog()
        fetch.annotate("span 1", for: log)
        fetch.annotate("span 2", for: other)
        #expect(
            fetch.annotation(for: log) as? String == "span 1" && fetch.annotation(for: other) as? String == "span 2")
        fetch.annotate(nil, for: log)
        #expect(fetch.annotation(for: log) == nil && fetch.annotation(for: other) != nil)
        #expect(fetch.id > 0 && fetch != AsyncStateFetch(reason: .fetch))
    }

    /// An owner freed while the fetch lives leaves its annotation behind; an object made later at the
    /// same address (malloc hands the freed block back at once) must not read it as its own.
    @Test func anAnnotationIsNotReadByAnObjectMadeWhereItsFreedOwnerWas() {
        final class Owner {}
        let fetch = AsyncStateFetch(reason: .fetch)
        var reusedAnAddress = false
        // Many rounds: the annotations' own allocations may take the freed block first in some.
        for round in 0..<2_000 {
            var owner: Owner? = Owner()
            let address = ObjectIdentifier(owner!)
            fetch.annotate("round \(round)", for: owner!)
            #expect(fetch.annotation(for: owner!) as? String == "round \(round)")
            owner = nil
            let next = Owner()
            reusedAnAddress = reusedAnAddress || ObjectIdentifier(next) == address
            #expect(fetch.annotation(for: next) == nil)
            fetch.annotate("kept", for: next)
            #expect(fetch.annotation(for: next) as? String == "kept")
        }
        // The test means something only if the allocator did reuse an address.
        #expect(reusedAnAddress)
    }

    @Test func aCancelledWaiterEndsItsWaitOnceAndAStaleServeStartsABackgroundFetchWithItsContext() async throws {
        let clock = VirtualClock()
        let log = ContextLog()
        let family = AsyncStateFamily<Int, Int>(
            expiry: .seconds(10), clock: clock, staleWhileRevalidate: true, name: "f", observer: log)
        let slow: @Sendable (Int) async throws -> Int = { key in
            try await clock.sleep(for: .seconds(1))
            return key * 10
        }
        let first = TestRequest.$id.withValue("A") { clock.task { try await family.value(for: 1, slow) } }
        await clock.advance(by: .zero)
        let leaving = TestRequest.$id.withValue("B") { clock.task { try await family.value(for: 1, slow) } }
        await clock.advance(by: .zero)
        leaving.cancel()
        await #expect(throws: CancellationError.self) { try await leaving.value }
        await clock.advance(by: .seconds(1))
        #expect(try await first.value == 10)
        #expect(
            log.all.map(\.name) == [
                "started(fetch)", "joined", "waitEnded(CancellationError)", "succeeded", "waitEnded",
            ])
        #expect(log.all[2].waiter == log.all[1].waiter && log.all[2].context == nil)

        // Stale data served at once starts a fetch behind it, which carries the serving call's context.
        log.clear()
        await clock.advance(by: .seconds(11))
        #expect(try await TestRequest.$id.withValue("C") { try await family.value(for: 1, slow) } == 10)
        await clock.advance(by: .seconds(1))
        let lines = log.all
        #expect(lines.map(\.name) == ["servedStale", "started(background)", "succeeded"])
        #expect(lines[1].context == "C" && lines[1].waiter == nil && lines[1].fetch?.reason == .background)
    }

    @Test func aBatchReportsItsKeysFetchesAndItsOwnStartAndEnd() async throws {
        let clock = VirtualClock()
        let log = ContextLog()
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(10), clock: clock, name: "f", observer: log)
        let batch: @Sendable ([Int]) async throws -> [Int: Int] = { keys in
            try await clock.sleep(for: .seconds(1))
            return Dictionary(uniqueKeysWithValues: keys.map { ($0, $0) })
        }
        let callers = (0..<4).map { key in
            TestRequest.$id.withValue("R\(key)") {
                clock.task { try await family.value(for: key, batchWindow: .milliseconds(5), batch) }
            }
        }
        await clock.advance(by: .milliseconds(5))
        await clock.advance(by: .seconds(1))
        for (key, caller) in callers.enumerated() { #expect(try await caller.value == key) }

        let lines = log.all
        let started = lines.filter { $0.name == "started(fetch)" }
        let batchStart = try #require(lines.first { $0.name == "batchStarted(4)" })
        guard case .batchStarted(let fetches) = batchStart.kind else { return }
        #expect(fetches == started.compactMap(\.fetch))
        #expect(started.map(\.context) == ["R0", "R1", "R2", "R3"])
        // The batch is a fetch of its own, reported without a key.
        let own = try #require(batchStart.fetch)
        #expect(!fetches.contains(own) && batchStart.key == nil)
        let end = try #require(lines.firstIndex { $0.name == "batchEnded" })
        #expect(lines[end].fetch === own)
        #expect(
            lines.filter { $0.name == "succeeded" }.count == 4 && lines.filter { $0.name == "waitEnded" }.count == 4)

        // The same for one call's batch.
        log.clear()
        let results = try await TestRequest.$id.withValue("V") {
            let task = clock.task { await family.values(for: [7, 8, 1], batch) }
            await clock.advance(by: .seconds(1))
            return try await task.value
        }
        #expect(results.count == 3)
        let ownBatch = try #require(log.all.first { $0.name == "batchStarted(2)" })
        #expect(ownBatch.fetch != nil && log.all.filter { $0.name == "started(fetch)" }.map(\.context) == ["V", "V"])
    }

    @Test func anInvalidationCarriesItsMessageAndTheSendersMetadataToEveryReplica() async throws {
        let clock = VirtualClock()
        let network = InMemoryInvalidationNetwork()
        let (busA, busB) = (network.bus(), network.bus())
        let (writerLog, readerLog) = (ContextLog(), ContextLog())
        let writer = AsyncStateInvalidator(
            bus: busA, clock: clock, metadata: { ["traceparent": TestRequest.id ?? "none"] })
        let reader = AsyncStateInvalidator(bus: busB, invalidateAllInterval: .zero, clock: clock)
        let writerProfiles = AsyncStateFamily<Int, String>(clock: clock, name: "p", observer: writerLog)
        let readerProfiles = AsyncStateFamily<Int, String>(clock: clock, name: "p", observer: readerLog)
        writer.subscribe(writerProfiles, to: "profiles")
        reader.subscribe(readerProfiles, to: "profiles")
        for family in [writerProfiles, readerProfiles] { _ = try await family.value(for: 1) { "user \($0)" } }
        var deliveries = busB.deliveries().makeAsyncIterator()
        #expect(await deliveries.next() == .reconnected)

        try await TestRequest.$id.withValue("W") { try await writer.invalidate("profiles", key: "1") }
        let invalidated = try #require(writerLog.all.last)
        #expect(invalidated.name == "invalidated" && invalidated.context == "W")
        #expect(invalidated.metadata == ["traceparent": "W"])

        // The other replica receives the message with the sender's metadata, and its observer sees it.
        guard case .invalidate(let message) = await deliveries.next() else {
            Issue.record("no message")
            return
        }
        #expect(message.metadata == ["traceparent": "W"])
        let payload = try message.payload()
        #expect(try AsyncStateInvalidation(payload: payload) == message)
        reader.apply(.invalidate(message))
        let received = try #require(readerLog.all.last)
        #expect(received.name == "invalidated" && received.key == "1" && received.metadata == ["traceparent": "W"])
        // A direct invalidation carries no message.
        readerProfiles.invalidate(1)
        #expect(readerLog.all.last?.name == "invalidated" && readerLog.all.last?.metadata == nil)
    }

    @Test func aFamilyEventDescribesItsKeyOnlyWhenTheObserverReadsIt() async throws {
        let clock = VirtualClock()
        let described = LockedValue(0)
        struct Key: Hashable, Sendable, CustomStringConvertible {
            var id: Int
            let counter: Counter
            var description: String {
                counter.count()
                return "key \(id)"
            }
            static func == (lhs: Key, rhs: Key) -> Bool { lhs.id == rhs.id }
            func hash(into hasher: inout Hasher) { hasher.combine(id) }
        }
        final class Counter: Sendable {
            let value: LockedValue<Int>
            init(_ value: LockedValue<Int>) { self.value = value }
            func count() { value.withLock { $0 += 1 } }
        }
        final class Kinds: AsyncStateObserver {
            let keys = LockedValue<[String?]>([])
            let readsKeys: Bool
            init(readsKeys: Bool) { self.readsKeys = readsKeys }
            func observe(_ event: AsyncStateEvent) {
                guard case .hit = event.kind else { return }
                if readsKeys { keys.withLock { $0.append(event.key) } }
            }
        }
        let key = Key(id: 7, counter: Counter(described))
        for readsKeys in [false, true] {
            let observer = Kinds(readsKeys: readsKeys)
            let family = AsyncStateFamily<Key, Int>(expiry: .seconds(60), clock: clock, name: "f", observer: observer)
            family.set(1, for: key)
            described.withLock { $0 = 0 }
            for _ in 0..<3 { #expect(try await family.value(for: key) { _ in 0 } == 1) }
            #expect(described.withLock { $0 } == (readsKeys ? 3 : 0))
            #expect(observer.keys.withLock { $0 } == (readsKeys ? ["key 7", "key 7", "key 7"] : []))
        }
        // A key set by hand is kept as given.
        var event = AsyncStateEvent(name: "f", key: "a", kind: .hit)
        #expect(event.key == "a")
        event.key = nil
        #expect(event.key == nil)
    }
}
