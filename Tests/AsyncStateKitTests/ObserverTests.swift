import AsyncStateTesting
import Testing

@testable import AsyncStateKit

/// Records every event as a line (`name key kind`), in the order it arrives; the ends of waits and a
/// batch's own events only if `waits` (they are checked apart).
final class EventLog: AsyncStateObserver {
    private let lines = LockedValue<[String]>([])
    private let waits: Bool
    var all: [String] { lines.withLock { $0 } }
    func clear() { lines.withLock { $0 = [] } }

    init(waits: Bool = false) {
        self.waits = waits
    }

    func observe(_ event: AsyncStateEvent) {
        let kind: String
        switch event.kind {
        case .waitEnded(let error):
            guard waits else { return }
            kind = "waitEnded(\(error.map { "\(type(of: $0))" } ?? "value"))"
        case .batchStarted(let fetches):
            guard waits else { return }
            kind = "batchStarted(\(fetches.count) keys)"
        case .batchEnded(let error):
            guard waits else { return }
            kind = "batchEnded(\(error.map { "\(type(of: $0))" } ?? "value"))"
        case .hit: kind = "hit"
        case .servedStale: kind = "servedStale"
        case .failSafe(let error): kind = "failSafe(\(type(of: error)))"
        case .softTimeout: kind = "softTimeout"
        case .notModified: kind = "notModified"
        case .joined: kind = "joined"
        case .started(let reason): kind = "started(\(reason))"
        case .attemptFailed(let error, let attempt, let retryIn):
            kind = "attemptFailed(\(type(of: error)), attempt \(attempt), retry in \(retryIn))"
        case .succeeded(let duration, let attempts): kind = "succeeded(\(duration), \(attempts) attempts)"
        case .failed(let error, let duration, let attempts):
            kind = "failed(\(type(of: error)), \(duration), \(attempts) attempts)"
        case .cancelled: kind = "cancelled"
        case .invalidated: kind = "invalidated"
        case .invalidatedTag(let tag, let entries): kind = "invalidatedTag(\(tag), \(entries) entries)"
        case .removed(let reason): kind = "removed(\(reason))"
        case .secondLevel(let event): kind = "secondLevel(\(event))"
        }
        lines.withLock { $0.append([event.name, event.key, kind].compactMap { $0 }.joined(separator: " ")) }
    }
}

@Suite struct ObserverTests {
    @Test func aStateReportsItsTransitionsInOrder() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let source = ScriptedSource(clock: clock, failures: 0, duration: .seconds(1))
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(10), clock: clock, name: "quote", observer: log)
        let callers = (0..<3).map { _ in clock.task { try await state.value(source.operation) } }
        await clock.advance(by: .seconds(1))
        for caller in callers { _ = try await caller.value }
        _ = try await state.value(source.operation)
        await state.invalidate()
        let refresh = clock.task { await state.refresh(source.operation) }
        await clock.advance(by: .zero)
        await state.cancel()
        _ = await refresh.result
        #expect(
            log.all == [
                "quote started(fetch)", "quote joined", "quote joined", "quote succeeded(1.0 seconds, 1 attempts)",
                "quote hit", "quote invalidated", "quote started(refresh)", "quote cancelled",
            ])
    }

    @Test func retriesAndFailuresCarryTheirErrorsAttemptsAndDurations() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let source = ScriptedSource(clock: clock, failures: nil, duration: .seconds(1))  // always fails
        let state = AsyncState<Int>(
            wrappedValue: 0, clock: clock, retry: .exponential(maxAttempts: 2, initial: .seconds(2)), name: "q",
            observer: log)
        let caller = clock.task { try await state.value(source.operation) }
        await clock.advance(by: .seconds(4))  // 0–1 fails, waits 2 s, 3–4 fails
        _ = await caller.result
        await state.retry { 5 }
        #expect(
            log.all == [
                "q started(fetch)", "q attemptFailed(SourceDown, attempt 1, retry in 2.0 seconds)",
                "q failed(SourceDown, 4.0 seconds, 2 attempts)", "q started(retry)",
                "q succeeded(0.0 seconds, 1 attempts)",
            ])
    }

    @Test func backgroundAndPeriodicFetchesSayWhy() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let source = ScriptedSource(clock: clock, failures: 0, duration: .zero)
        let ahead = AsyncState<Int>(
            wrappedValue: 0, expiry: .seconds(10), clock: clock, refreshAfter: .seconds(5), name: "ahead",
            observer: log)
        _ = try await ahead.value(source.operation)
        await clock.advance(by: .seconds(6))
        _ = try await ahead.value(source.operation)  // at once, and a refresh ahead
        await clock.advance(by: .zero)
        let periodic = AsyncState<Int>(wrappedValue: 0, clock: clock, name: "periodic", observer: log)
        let runner = clock.task { try await periodic.run(every: .seconds(1), source.operation) }
        await clock.advance(by: .seconds(1))
        runner.cancel()
        _ = await runner.result
        #expect(
            log.all == [
                "ahead started(fetch)", "ahead succeeded(0.0 seconds, 1 attempts)", "ahead hit",
                "ahead started(background)", "ahead succeeded(0.0 seconds, 1 attempts)",
                "periodic started(periodic)", "periodic succeeded(0.0 seconds, 1 attempts)",
                "periodic started(periodic)", "periodic succeeded(0.0 seconds, 1 attempts)",
            ])
    }

    @Test func aFamilyReportsEachEntryWithItsKeyAndItsRemovals() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let source = KeyedSource(clock: clock, duration: .zero)
        let family = AsyncStateFamily<Int, Int>(capacity: 2, clock: clock, name: "users", observer: log)
        _ = try await family.value(for: 1, source.operation)
        _ = try await family.value(for: 1, source.operation)  // a hit on a compact entry
        family.invalidate(1)
        family.set(20, for: 2)
        family.set(21, for: 2)
        family.set(30, for: 3)  // over capacity
        #expect(
            log.all.prefix(5) == [
                "users 1 started(fetch)", "users 1 succeeded(0.0 seconds, 1 attempts)", "users 1 hit",
                "users 1 invalidated", "users 2 removed(replaced)",
            ])
        #expect(log.all.count == 6)
        #expect(log.all.last?.hasSuffix("removed(evicted)") == true)
    }

    @Test func withoutAnObserverNothingIsRecorded() async throws {
        let state = AsyncState<Int>(wrappedValue: 0, clock: VirtualClock())
        #expect(state.store.observation == nil)
        _ = try await state.value { 1 }
    }
}
