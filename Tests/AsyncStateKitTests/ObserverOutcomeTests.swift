import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// Checks an observer's promises as events arrive: every `started` is followed by exactly one outcome
/// (succeeded, failed or cancelled) of that fetch — the same `fetch` object — before the next
/// `started` of the same state or key; and every waiting caller (a `joined`, or a `started` with a
/// waiter) by exactly one `waitEnded`.
final class FlightLedger: AsyncStateObserver {
    private let state = LockedValue(
        (
            inFlight: [String: AsyncStateFetch?](), waiting: Set<AsyncStateEvent.Waiter>(), problems: [String](),
            events: 0
        ))

    /// What broke a promise, in order.
    var problems: [String] { state.withLock { $0.problems } }
    /// The states (by key; "" for a single state) whose last `started` has no outcome yet.
    var open: Set<String> { state.withLock { Set($0.inFlight.keys) } }
    /// The callers that wait, or whose end of waiting was not reported.
    var waiting: Set<AsyncStateEvent.Waiter> { state.withLock { $0.waiting } }
    /// How many events arrived.
    var count: Int { state.withLock { $0.events } }

    func observe(_ event: AsyncStateEvent) {
        let key = event.key ?? ""
        state.withLock { state in
            state.events += 1
            switch event.kind {
            case .started(let reason):
                if state.inFlight[key] != nil {
                    state.problems.append("\(key): started(\(reason)) before an outcome")
                }
                if event.fetch == nil { state.problems.append("\(key): started(\(reason)) without its fetch") }
                state.inFlight[key] = event.fetch
                if let waiter = event.waiter { wait(waiter, in: &state.waiting, &state.problems) }
            case .succeeded, .failed, .cancelled:
                guard let fetch = state.inFlight.removeValue(forKey: key) else {
                    state.problems.append("\(key): \(event.kind) without a start")
                    return
                }
                if fetch != event.fetch { state.problems.append("\(key): \(event.kind) of another fetch") }
            case .joined:
                if let waiter = event.waiter {
                    wait(waiter, in: &state.waiting, &state.problems)
                } else {
                    state.problems.append("\(key): joined without its waiter")
                }
            case .waitEnded:
                if let waiter = event.waiter, state.waiting.remove(waiter) != nil { return }
                state.problems.append("\(key): waitEnded of \(event.waiter.map(String.init(describing:)) ?? "nobody")")
            case .secondLevel:
                if event.fetch == nil || state.inFlight[key] != event.fetch {
                    state.problems.append("\(key): \(event.kind) outside its fetch")
                }
            case .hit, .servedStale, .failSafe, .softTimeout, .notModified, .attemptFailed, .invalidated,
                .invalidatedTag, .removed, .batchStarted, .batchEnded:
                break
            }
        }
    }

    private func wait(
        _ waiter: AsyncStateEvent.Waiter, in waiting: inout Set<AsyncStateEvent.Waiter>, _ problems: inout [String]
    ) {
        if !waiting.insert(waiter).inserted { problems.append("\(waiter) waits twice") }
    }
}

@Suite struct ObserverOutcomeTests {
    @Test func aFlightEndedByASetReportsThatItWasCancelled() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, name: "s", observer: log)
        let slow = Source<Int>().operation(on: clock, delay: .seconds(10), value: 1)
        let caller = clock.task { try await state.value(slow) }
        await clock.advance(by: .zero)
        await state.set(5)
        #expect(try await caller.value == 5)  // its callers get the written value
        #expect(log.all == ["s started(fetch)", "s cancelled"])

        // The family's twin.
        let family = AsyncStateFamily<Int, Int>(clock: clock, name: "f", observer: log)
        log.clear()
        let keyed = clock.task { try await family.value(for: 1) { _ in try await slow() } }
        await clock.advance(by: .zero)
        family.set(5, for: 1)
        #expect(try await keyed.value == 5)
        #expect(log.all == ["f 1 started(fetch)", "f 1 cancelled"])
        await clock.advance(by: .seconds(10))
        #expect(log.all.count == 2)  // the cancelled operation's end reports nothing
    }

    @Test func aFlightReplacedByARefreshReportsItsOutcomeBeforeTheNewStart() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, name: "s", observer: log)
        let operation = Source<Int>().operation(on: clock, value: 1)
        let first = clock.task { try await state.value(operation) }
        await clock.advance(by: .zero)
        let second = clock.task { await state.refresh(operation) }
        await clock.advance(by: .seconds(1))
        #expect(try await first.value == 1)
        _ = try await second.value
        #expect(
            log.all == [
                "s started(fetch)", "s cancelled", "s started(refresh)", "s succeeded(1.0 seconds, 1 attempts)",
            ])
    }

    @Test func aStaleServeIsReportedAsSuchNeverAsAHit() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(10), clock: clock, staleWhileRevalidate: true, name: "s", observer: log)
        let family = AsyncStateFamily<Int, Int>(
            expiry: .seconds(10), clock: clock, staleWhileRevalidate: true, name: "f", observer: log)
        _ = try await state.value { 1 }
        _ = try await family.value(for: 1) { $0 }
        _ = try await state.value { 1 }
        _ = try await family.value(for: 1) { $0 }
        await clock.advance(by: .seconds(11))
        log.clear()
        #expect(try await state.value { 2 } == 1)  // stale, at once
        await clock.advance(by: .zero)
        #expect(try await family.value(for: 1) { _ in 2 } == 1)
        await clock.advance(by: .zero)
        #expect(
            log.all == [
                "s servedStale", "s started(background)", "s succeeded(0.0 seconds, 1 attempts)",
                "f 1 servedStale", "f 1 started(background)", "f 1 succeeded(0.0 seconds, 1 attempts)",
            ])
        log.clear()
        _ = try await state.value { 3 }
        _ = try await family.value(for: 1) { _ in 3 }
        #expect(log.all == ["s hit", "f 1 hit"])

        // Restored data under refresh ahead is answered at once, stale: a stale serve too.
        let restored = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(10), clock: clock, refreshAfter: .seconds(5), name: "r", observer: log)
        try await restored.restore(AsyncStateArchive(value: 7, phase: .success, lastSuccess: nil))
        log.clear()
        #expect(try await restored.value { 8 } == 7)
        await clock.advance(by: .zero)
        #expect(log.all == ["r servedStale", "r started(background)", "r succeeded(0.0 seconds, 1 attempts)"])
    }

    /// A seeded random sequence of calls on a state or a family, with an observer that checks that
    /// every start has exactly one outcome; `nil` when it held.
    static func runSequence(seed: UInt64, family isFamily: Bool, steps: Int) async -> String? {
        var random = SplitMix64(seed: seed)
        func pick(_ count: UInt64) -> Int { Int(random.next() % count) }
        let clock = VirtualClock()
        let ledger = FlightLedger()
        let policies = RandomPolicies(&random)
        let state = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(2), clock: clock, retry: policies.retry, timeout: policies.timeout,
            softTimeout: policies.softTimeout,
            failureExpiry: policies.failureExpiry, staleWhileRevalidate: policies.staleWhileRevalidate,
            refreshAfter: policies.refreshAfter, maxStaleAge: policies.maxStaleAge, name: "s", observer: ledger)
        let family = AsyncStateFamily<Int, Int>(
            expiry: .seconds(2), capacity: 2, idleExpiry: pick(2) == 0 ? .seconds(3) : nil, clock: clock,
            retry: policies.retry, timeout: policies.timeout, softTimeout: policies.softTimeout,
            failureExpiry: policies.failureExpiry,
            staleWhileRevalidate: policies.staleWhileRevalidate, refreshAfter: policies.refreshAfter,
            maxStaleAge: policies.maxStaleAge, name: "f",
            observer: ledger)
        var tasks: [Task<Void, any Error>] = []
        var log: [String] = []

        for _ in 0..<steps {
            let key = pick(3)
            let result = pick(5)
            let fails = pick(4) == 0
            let duration = Duration.milliseconds(500 * Int64(pick(5)))
            let operation: @Sendable () async throws -> Int = {
                try await clock.sleep(for: duration)
                if fails { throw SourceDown() }
                return result
            }
            let keyed: @Sendable (Int) async throws -> Int = { _ in try await operation() }
            let action = pick(12)
            log.append("\(action)/\(key)/\(result)\(fails ? "!" : "")/\(duration)")
            switch action {
            case 0, 1:
                tasks.append(
                    clock.task {
                        _ = isFamily ? try await family.value(for: key, keyed) : try await state.value(operation)
                    })
            case 2:
                tasks.append(
                    clock.task {
                        if isFamily { await family.fetch(for: key, keyed) } else { await state.fetch(operation) }
                    })
            case 3:
                tasks.append(
                    clock.task {
                        if isFamily { await family.refresh(for: key, keyed) } else { await state.refresh(operation) }
                    })
            case 4:
                tasks.append(
                    clock.task {
                        if isFamily { await family.retry(for: key, keyed) } else { await state.retry(operation) }
                    })
            case 5:
                if isFamily { family.set(result, for: key) } else { await state.set(result) }
            case 6:
                if isFamily { family.invalidate(key) } else { await state.invalidate() }
            case 7:
                if isFamily { family.cancel(key) } else { await state.cancel() }
            case 8:
                if isFamily { family.remove(key) } else { await state.reset() }
            case 9:
                if let victim = tasks.indices.randomElement(using: &random) { tasks[victim].cancel() }
            case 10 where isFamily:
                let keys = [key, (key + 1) % 3]
                tasks.append(
                    clock.task {
                        _ = await family.values(for: keys) { keys in
                            try await clock.sleep(for: duration)
                            if fails { throw SourceDown() }
                            return Dictionary(uniqueKeysWithValues: keys.map { ($0, result) })
                        }
                    })
            default:
                await clock.advance(by: duration)
            }
            await clock.advance(by: .zero)
            if let problem = ledger.problems.first {
                return "seed \(seed) \(isFamily ? "family" : "state") [\(log.joined(separator: " "))]: \(problem)"
            }
        }
        for task in tasks { task.cancel() }
        await clock.advance(by: .seconds(30))  // background fetches and retries run out
        for task in tasks { _ = await task.result }
        if let problem = ledger.problems.first { return "seed \(seed) [\(log.joined(separator: " "))]: \(problem)" }
        guard ledger.open.isEmpty else {
            return "seed \(seed) \(isFamily ? "family" : "state") [\(log.joined(separator: " "))]: "
                + "started without an outcome: \(ledger.open.sorted())"
        }
        guard ledger.waiting.isEmpty else {
            return "seed \(seed) \(isFamily ? "family" : "state") [\(log.joined(separator: " "))]: "
                + "waited without an end: \(ledger.waiting.map(\.number).sorted())"
        }
        return nil
    }

    @Test(arguments: [false, true])
    func everyStartHasExactlyOneOutcomeOverRandomSequences(family: Bool) async {
        await expectEverySeedHolds(from: 20_261_125, count: 300) { seed in
            await Self.runSequence(seed: seed, family: family, steps: 30)
        }
    }
}
