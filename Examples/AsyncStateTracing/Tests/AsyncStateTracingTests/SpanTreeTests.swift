import AsyncStateKit
import AsyncStateTesting
import AsyncStateTracing
import InMemoryTracing
import Synchronization
import Testing
import Tracing

/// A tracer, its observer and the test's requests: each request is a root span, and its calls run
/// in its context, as a server's handlers do.
struct Trace {
    let clock = VirtualClock()
    let tracer = InMemoryTracer(recordInjections: false, recordExtractions: false)
    let observer: TracingObserver

    init(maximumLinks: Int = 128) {
        observer = TracingObserver(tracer: tracer, maximumLinks: maximumLinks)
    }

    /// Starts a request named `name` and runs `body` in its context, on the clock.
    func request<T: Sendable>(_ name: String, _ body: @escaping @Sendable () async throws -> T) -> Request<T> {
        let span = tracer.startSpan(name, context: ServiceContext.topLevel)
        let task = ServiceContext.withValue(span.context) { clock.task(body) }
        return Request(span: span, task: task)
    }

    struct Request<T: Sendable> {
        let span: InMemorySpan
        let task: Task<T, any Error>

        /// The request's answer; ends its span.
        func finish() async throws -> T {
            defer { span.end() }
            return try await task.value
        }
    }

    /// The finished spans named `name`.
    func spans(_ name: String) -> [FinishedInMemorySpan] { tracer.finishedSpans.filter { $0.operationName == name } }

    /// The spans that have not ended.
    var unfinished: [InMemorySpan] { tracer.activeSpans }
}

extension FinishedInMemorySpan {
    /// The span ids this span links to.
    var linkedSpans: [String] { links.compactMap { $0.context.inMemorySpanContext?.spanID } }
}

@Suite struct SpanTreeTests {
    @Test func tenThousandJoinersWaitForOneLoadThatIsTheFirstCallersChild() async throws {
        let trace = Trace()
        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(120), clock: trace.clock, name: "config", observer: trace.observer)
        let clock = trace.clock
        let load: @Sendable () async throws -> Int = {
            try await clock.sleep(for: .seconds(1))
            return 42
        }
        let first = trace.request("request 0") { try await state.value(load) }
        await clock.advance(by: .zero)
        let joiners = (1...10_000).map { index in trace.request("request \(index)") { try await state.value(load) } }
        await clock.advance(by: .zero)
        await clock.advance(by: .seconds(1))
        #expect(try await first.finish() == 42)
        var answers: [Int] = []
        for joiner in joiners { answers.append(try await joiner.finish()) }
        #expect(answers == Array(repeating: 42, count: 10_000))

        // One load: a child of the request that started it, in its trace.
        let loads = trace.spans("async_state.load")
        try #require(loads.count == 1)
        let loaded = loads[0]
        #expect(loaded.parentSpanID == first.span.spanID && loaded.traceID == first.span.traceID)
        #expect(loaded.attributes.get("async_state.name") == .string("config"))
        #expect(loaded.attributes.get("async_state.reason") == .string("fetch"))
        #expect(loaded.attributes.get("async_state.outcome") == .string("success"))
        #expect(loaded.attributes.get("async_state.attempts") == .int64(1))
        #expect(loaded.attributes.get("async_state.joiners") == .int64(10_000))

        // One wait per joiner: a child of that joiner's request, linked to the load.
        let waits = trace.spans("async_state.wait")
        #expect(waits.count == 10_000)
        let parents = Dictionary(grouping: waits, by: { $0.parentSpanID ?? "" })
        #expect(Set(parents.keys) == Set(joiners.map(\.span.spanID)))
        #expect(parents.values.allSatisfy { $0.count == 1 })
        let traces = Dictionary(uniqueKeysWithValues: joiners.map { ($0.span.spanID, $0.span.traceID) })
        #expect(waits.filter { $0.linkedSpans != [loaded.spanID] }.isEmpty)
        #expect(waits.filter { $0.traceID != traces[$0.parentSpanID ?? ""] }.isEmpty)
        #expect(waits.filter { $0.attributes.get("async_state.outcome") != .string("success") }.isEmpty)
        // The load links back to its joiners' waits, capped.
        #expect(loaded.links.count == 128)
        #expect(Set(loaded.linkedSpans).isSubset(of: Set(waits.map(\.spanID))))
        #expect(Set(loaded.linkedSpans).count == 128)
        // Nothing else, and nothing left open.
        #expect(trace.tracer.finishedSpans.count == 10_001 + 1 + 10_000)
        #expect(trace.unfinished.isEmpty)
    }

    @Test func aBatchOfOneHundredKeysFromTenCallersIsOneSpanLinkedToEachCaller() async throws {
        let trace = Trace()
        let clock = trace.clock
        let family = AsyncStateFamily<Int, String>(
            expiry: .seconds(120), clock: clock, name: "profiles", observer: trace.observer)
        let calls = Counter()
        let batch: @Sendable ([Int]) async throws -> [Int: String] = { keys in
            calls.increment()
            try await clock.sleep(for: .milliseconds(10))
            return Dictionary(uniqueKeysWithValues: keys.map { ($0, "user \($0)") })
        }
        let callers = (0..<10).map { caller in
            trace.request("caller \(caller)") {
                try await withThrowingTaskGroup(of: String.self) { group in
                    for key in caller * 10..<caller * 10 + 10 {
                        group.addTask {
                            try await family.value(for: key, batchWindow: .milliseconds(2), maxBatchSize: 100, batch)
                        }
                    }
                    return try await group.reduce(into: 0) { count, _ in count += 1 }
                }
            }
        }
        await clock.advance(by: .zero)
        await clock.advance(by: .milliseconds(2))
        await clock.advance(by: .milliseconds(10))
        for caller in callers { #expect(try await caller.finish() == 10) }
        #expect(calls.value == 1)

        // One batch span, a root, linked to each of the ten callers.
        let batches = trace.spans("async_state.batch")
        try #require(batches.count == 1)
        let run = batches[0]
        #expect(run.parentSpanID == nil)
        #expect(Set(run.linkedSpans) == Set(callers.map(\.span.spanID)) && run.links.count == 10)
        #expect(run.attributes.get("async_state.batch.keys") == .int64(100))
        #expect(run.attributes.get("async_state.batch.callers") == .int64(10))
        // One load per key, a child of the caller that missed it, linked to the batch.
        let loads = trace.spans("async_state.load")
        #expect(loads.count == 100)
        for caller in callers {
            let own = loads.filter { $0.parentSpanID == caller.span.spanID }
            #expect(own.count == 10 && own.allSatisfy { $0.traceID == caller.span.traceID })
        }
        #expect(loads.allSatisfy { $0.linkedSpans == [run.spanID] })
        let keys = loads.compactMap { span -> String? in
            guard case .string(let key) = span.attributes.get("async_state.key") else { return nil }
            return key
        }
        #expect(Set(keys) == Set((0..<100).map { "\($0)" }))
        // No caller joined another's fetch: no waits.
        #expect(trace.spans("async_state.wait").isEmpty && trace.unfinished.isEmpty)
    }

    @Test func aRefreshAheadIsARootSpanLinkedToTheRequestThatTriggeredIt() async throws {
        let trace = Trace()
        let clock = trace.clock
        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(60), clock: clock, refreshAfter: .seconds(50), name: "rates",
            observer: trace.observer)
        let version = Counter()
        let load: @Sendable () async throws -> Int = {
            try await clock.sleep(for: .seconds(1))
            version.increment()
            return version.value
        }
        let first = trace.request("first") { try await state.value(load) }
        await clock.advance(by: .seconds(1))
        #expect(try await first.finish() == 1)
        await clock.advance(by: .seconds(55))
        // Fresh, but past `refreshAfter`: answered at once, refreshed behind the answer.
        let trigger = trace.request("trigger") { try await state.value(load) }
        #expect(try await trigger.finish() == 1)
        await clock.advance(by: .seconds(1))
        #expect(state.wrappedValue == 2)

        let loads = trace.spans("async_state.load")
        try #require(loads.count == 2)
        #expect(loads[0].parentSpanID == first.span.spanID)
        #expect(loads[0].attributes.get("async_state.reason") == .string("fetch"))
        let ahead = loads[1]
        #expect(ahead.parentSpanID == nil && ahead.traceID != trigger.span.traceID)
        #expect(ahead.attributes.get("async_state.reason") == .string("background"))
        #expect(ahead.linkedSpans == [trigger.span.spanID])
        #expect(ahead.attributes.get("async_state.outcome") == .string("success"))
        #expect(trace.spans("async_state.wait").isEmpty && trace.unfinished.isEmpty)
    }

    @Test func anInvalidationOnAnotherReplicaLinksToTheWritersRequest() async throws {
        let trace = Trace()
        let clock = trace.clock
        let network = InMemoryInvalidationNetwork()
        let (writerBus, readerBus) = (network.bus(), network.bus())
        let writer = AsyncStateInvalidator(bus: writerBus, clock: clock, metadata: trace.observer.invalidationMetadata)
        let reader = AsyncStateInvalidator(bus: readerBus, invalidateAllInterval: .zero, clock: clock)
        let writerProfiles = AsyncStateFamily<Int, String>(clock: clock, name: "profiles", observer: trace.observer)
        let readerProfiles = AsyncStateFamily<Int, String>(clock: clock, name: "profiles", observer: trace.observer)
        writer.subscribe(writerProfiles, to: "profiles")
        reader.subscribe(readerProfiles, to: "profiles")
        var deliveries = readerBus.deliveries().makeAsyncIterator()
        #expect(await deliveries.next() == .reconnected)
        for family in [writerProfiles, readerProfiles] { _ = try await family.value(for: 1) { "v1 \($0)" } }
        trace.tracer.clearAll()

        // A write on one replica: invalidated here as a child of the writing request, and published
        // with its trace context.
        let write = trace.request("write") { try await writer.invalidate("profiles", key: "1") }
        #expect(try await write.finish() == .published)
        guard case .invalidate(let message) = await deliveries.next() else {
            Issue.record("the message did not arrive")
            return
        }
        reader.apply(.invalidate(message))
        // The next read on the other replica refetches, in its own request.
        let read = trace.request("read") { try await readerProfiles.value(for: 1) { "v2 \($0)" } }
        await clock.advance(by: .zero)
        #expect(try await read.finish() == "v2 1")

        let invalidations = trace.spans("async_state.invalidate")
        try #require(invalidations.count == 2)
        let (local, remote) = (invalidations[0], invalidations[1])
        #expect(local.parentSpanID == write.span.spanID && local.traceID == write.span.traceID)
        #expect(remote.parentSpanID == nil && remote.traceID != write.span.traceID)
        #expect(remote.linkedSpans == [write.span.spanID])
        #expect(remote.links.first?.context.inMemorySpanContext?.traceID == write.span.traceID)
        for span in invalidations {
            #expect(span.attributes.get("async_state.topic") == .string("profiles"))
            #expect(span.attributes.get("async_state.key") == .string("1"))
        }
        let refetch = try #require(trace.spans("async_state.load").first)
        #expect(refetch.parentSpanID == read.span.spanID)
        #expect(trace.tracer.finishedSpans.count == 2 + 2 + 1 && trace.unfinished.isEmpty)
    }

    @Test func aFailedAttemptIsAnEventAndAFailureAnErrorOnTheLoad() async throws {
        let trace = Trace()
        let clock = trace.clock
        let state = AsyncState<Int>(
            wrappedValue: 0, clock: clock, retry: RetryPolicy(maxAttempts: 2),
            name: "quote", observer: trace.observer)
        struct SourceDown: Error {}
        let failing: @Sendable () async throws -> Int = { throw SourceDown() }
        let first = trace.request("first") { try await state.value(failing) }
        await clock.advance(by: .zero)
        let joiner = trace.request("joiner") { try await state.value(failing) }
        await clock.advance(by: .zero)
        await clock.advance(by: .seconds(1))
        await #expect(throws: SourceDown.self) { try await first.finish() }
        await #expect(throws: SourceDown.self) { try await joiner.finish() }

        let load = try #require(trace.spans("async_state.load").first)
        #expect(load.events.map(\.name) == ["async_state.attempt_failed"])
        #expect(load.events.first?.attributes.get("async_state.attempt") == .int64(1))
        #expect(load.events.first?.attributes.get("async_state.retry_in") == .double(1))
        #expect(load.attributes.get("async_state.outcome") == .string("failure"))
        #expect(load.attributes.get("async_state.attempts") == .int64(2))
        #expect(load.errors.count == 1 && load.status?.code == .error)
        let wait = try #require(trace.spans("async_state.wait").first)
        #expect(wait.parentSpanID == joiner.span.spanID && wait.errors.count == 1)
        #expect(wait.attributes.get("async_state.outcome") == .string("failure"))
    }
}

/// A count shared with an operation.
final class Counter: Sendable {
    private let count = Atomic(0)
    var value: Int { count.load(ordering: .sequentiallyConsistent) }
    func increment() { count.add(1, ordering: .sequentiallyConsistent) }
}
