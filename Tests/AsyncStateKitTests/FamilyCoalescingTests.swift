import AsyncStateTesting
import Testing

@testable import AsyncStateKit

/// `value(for:batchWindow:maxBatchSize:retry:_:)`: concurrent misses of single keys become batches,
/// at exact instants in virtual time.
@Suite struct FamilyCoalescingTests {
    /// A clock for the tests that start hundreds of callers at once: under ThreadSanitizer, beside
    /// the rest of the suite on two cores, settling them has taken more than the default 10 s of real
    /// time, which the clock reports as a stall. A test that finds the clock short of its target
    /// after an advance (a stall) cancels its callers instead of waiting for them.
    static func busyClock() -> VirtualClock { VirtualClock(stallTimeout: .seconds(60)) }

    /// A batch operation that records each run's keys and instant, takes a second and answers
    /// `key * 100` (leaving out `omitting`).
    final class BatchSource: Sendable {
        let clock: VirtualClock
        let omitting: Set<Int>
        private let log = LockedValue<[(keys: [Int], at: Duration)]>([])

        init(clock: VirtualClock, omitting: Set<Int> = []) {
            self.clock = clock
            self.omitting = omitting
        }

        var runs: [(keys: [Int], at: Duration)] { log.withLock { $0 } }

        /// A caller on the clock: `key`'s coalesced `value(for:batchWindow:maxBatchSize:)` on `family`,
        /// with this source's operation.
        func ask(
            _ family: AsyncStateFamily<Int, Int>, _ key: Int, window: Duration, maxBatchSize: Int = 100
        ) -> Task<Int, any Error> {
            clock.task { [operation] in
                try await family.value(for: key, batchWindow: window, maxBatchSize: maxBatchSize, operation)
            }
        }

        var operation: @Sendable ([Int]) async throws -> [Int: Int] {
            { [self] keys in
                log.withLock { $0.append((keys, clock.now.offset)) }
                try await clock.sleep(for: .seconds(1))
                var values: [Int: Int] = [:]
                for key in keys where !omitting.contains(key) { values[key] = key * 100 }
                return values
            }
        }
    }

    /// 525 concurrent misses of distinct keys, each key asked by two callers, `maxBatchSize: 50`:
    /// ten full batches start at once, the last 25 keys at the end of the window (5 ms), not a
    /// nanosecond before: ⌈525 / 50⌉ = 11 operation calls, each key loaded once.
    @Test func concurrentMissesMakeOneCallPerMaxBatchSizeKeys() async throws {
        let clock = Self.busyClock()
        let source = BatchSource(clock: clock)
        let family = AsyncStateFamily<Int, Int>(capacity: 10_000, clock: clock)
        let callers = (0..<1_050).map { source.ask(family, $0 % 525, window: .milliseconds(5), maxBatchSize: 50) }
        await clock.advance(by: .zero)
        #expect(source.runs.count == 10)
        #expect(source.runs.allSatisfy { $0.keys.count == 50 && $0.at == .zero })
        await clock.advance(by: .milliseconds(5) - .nanoseconds(1))
        #expect(source.runs.count == 10)
        await clock.advance(by: .nanoseconds(1))
        #expect(source.runs.count == 11)
        #expect(source.runs.last?.keys.count == 25)
        #expect(source.runs.last?.at == .milliseconds(5))
        await clock.advance(by: .seconds(1))
        guard source.runs.count == 11, clock.now.offset == .seconds(1) + .milliseconds(5) else {
            for caller in callers { caller.cancel() }  // the clock stalled: do not wait for them
            return
        }
        for (caller, task) in callers.enumerated() { #expect(try await task.value == (caller % 525) * 100) }
        #expect(source.runs.flatMap(\.keys).sorted() == Array(0..<525))
        #expect(family.count == 525)
    }

    /// A fresh key is answered at once and a key in flight is joined: neither is in a batch. Once
    /// loaded, the keys are fresh: asked again, nothing runs.
    @Test func aHitIsAnsweredAndAFlightJoinedWithoutABatch() async throws {
        let clock = VirtualClock()
        let source = BatchSource(clock: clock)
        let keyed = KeyedSource(clock: clock)
        let family = AsyncStateFamily<Int, Int>(clock: clock)
        family.set(7, for: 1)
        let inFlight = clock.task { try await family.value(for: 2, keyed.operation) }
        await clock.advance(by: .zero)
        #expect(try await family.value(for: 1, batchWindow: .milliseconds(5)) { try await source.operation($0) } == 7)
        let callers = [2, 3, 4].map { source.ask(family, $0, window: .milliseconds(5)) }
        await clock.advance(by: .milliseconds(5))
        #expect(source.runs.map(\.keys) == [[3, 4]])
        await clock.advance(by: .seconds(1))
        #expect(try await callers.asyncMap { try await $0.value } == [21, 300, 400])
        #expect(try await inFlight.value == 21)
        for key in [3, 4] {
            #expect(
                try await family.value(for: key, batchWindow: .zero) { try await source.operation($0) } == key * 100)
        }
        #expect(source.runs.count == 1)
    }

    /// Each key has its own outcome: one left out of the answer fails with `missingFromBatch`, and
    /// its retry (the family's policy) loads it alone, a second after the failure. (A window of zero
    /// would close the batch when its task runs, which may be before the second caller's miss: a
    /// test that needs both keys in one batch gives the window a length.)
    @Test func aKeyLeftOutFailsAndItsRetryRunsAlone() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<Int, Int>(clock: clock)
        let omitting = BatchSource(clock: clock, omitting: [2])
        let callers = [1, 2].map { omitting.ask(family, $0, window: .milliseconds(1)) }
        await clock.advance(by: .seconds(1) + .milliseconds(1))
        #expect(try await callers[0].value == 100)
        await #expect(throws: AsyncStateError.missingFromBatch) { try await callers[1].value }
        #expect(omitting.runs.map(\.keys) == [[1, 2]])

        let retrying = AsyncStateFamily<Int, Int>(
            clock: clock, retry: .exponential(maxAttempts: 2, initial: .seconds(1)))
        let runs = LockedValue<[[Int]]>([])
        let retried = [1, 2].map { key in
            clock.task {
                try await retrying.value(for: key, batchWindow: .milliseconds(1)) { keys in
                    let run = runs.withLock {
                        $0.append(keys)
                        return $0.count
                    }
                    try await clock.sleep(for: .seconds(1))
                    return Dictionary(uniqueKeysWithValues: keys.filter { run > 1 || $0 != 2 }.map { ($0, $0 * 100) })
                }
            }
        }
        // The batch from 1 ms for a second; key 2's retry a second after that, for a second.
        await clock.advance(by: .seconds(3) + .milliseconds(1))
        #expect(try await retried.asyncMap { try await $0.value } == [100, 200])
        #expect(runs.withLock { $0 } == [[1, 2], [2]])
    }

    /// A call that throws at once (here a failure answered from the failure expiry) opens no batch:
    /// the next key's batch still closes at the end of its window.
    @Test func aCallThatThrowsAtOnceLeavesNoBatchOpen() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<Int, Int>(clock: clock, failureExpiry: .seconds(60))
        let omitting = BatchSource(clock: clock, omitting: [1])
        let first = omitting.ask(family, 1, window: .milliseconds(1))
        await clock.advance(by: .seconds(2))
        await #expect(throws: AsyncStateError.missingFromBatch) { try await first.value }
        // Key 1's failure is answered from memory: this call throws without entering a batch.
        await #expect(throws: AsyncStateError.missingFromBatch) {
            try await family.value(for: 1, batchWindow: .milliseconds(1)) { try await omitting.operation($0) }
        }
        let second = omitting.ask(family, 2, window: .milliseconds(1))
        await clock.advance(by: .milliseconds(1))
        #expect(omitting.runs.map(\.keys) == [[1], [2]])
        guard omitting.runs.count == 2 else {
            second.cancel()  // the batch never closed: do not wait for it
            return
        }
        await clock.advance(by: .seconds(1))
        #expect(try await second.value == 200)
    }

    /// Callers that all leave before their batch closes cancel it: the operation, started at the end
    /// of the window, sees the cancellation, answers nobody, and the entries stay as they were.
    @Test func cancellingEveryCallerCancelsTheBatch() async throws {
        let clock = VirtualClock()
        let sawCancellation = LockedValue<Bool?>(nil)
        let family = AsyncStateFamily<Int, Int>(clock: clock)
        let callers = [1, 2, 3].map { key in
            clock.task {
                try await family.value(for: key, batchWindow: .seconds(1)) { keys in
                    sawCancellation.withLock { $0 = Task.isCancelled }
                    try await clock.sleep(for: .seconds(10))
                    return [:]
                }
            }
        }
        await clock.advance(by: .milliseconds(500))
        for caller in callers { caller.cancel() }
        for caller in callers { await #expect(throws: CancellationError.self) { try await caller.value } }
        await clock.advance(by: .seconds(1))
        #expect(sawCancellation.withLock { $0 } == true)
        #expect(family.snapshots.values.allSatisfy { $0.phase.name == "initial" })
    }

    /// Bad sizes and windows are clamped: a size below 1 is 1 (a call per key), a negative window is
    /// zero. A window past what a real clock can represent does not trap: on `ContinuousClock`, a batch
    /// that fills closes at once whatever its window.
    @Test func badSizesAndWindowsAreClamped() async throws {
        let clock = VirtualClock()
        let source = BatchSource(clock: clock)
        let family = AsyncStateFamily<Int, Int>(clock: clock)
        let callers = [1, 2, 3].map { source.ask(family, $0, window: .seconds(-5), maxBatchSize: 0) }
        await clock.advance(by: .zero)
        #expect(source.runs.map(\.keys).sorted { $0[0] < $1[0] } == [[1], [2], [3]])
        await clock.advance(by: .seconds(1))
        #expect(try await callers.asyncMap { try await $0.value } == [100, 200, 300])

        let real = AsyncStateFamily<Int, Int>()
        let answers = try await withThrowingTaskGroup(of: Int.self) { group in
            for key in [1, 2] {
                group.addTask {
                    try await real.value(for: key, batchWindow: .seconds(Int64.max), maxBatchSize: 2) { keys in
                        Dictionary(uniqueKeysWithValues: keys.map { ($0, $0 * 100) })
                    }
                }
            }
            return try await group.reduce(0, +)
        }
        #expect(answers == 300)
    }

    /// The family's capacity holds: 300 keys missed in batches through a family of 30.
    @Test func theCapacityHolds() async throws {
        let clock = Self.busyClock()
        let source = BatchSource(clock: clock)
        let family = AsyncStateFamily<Int, Int>(capacity: 30, clock: clock)
        let callers = (0..<300).map { source.ask(family, $0, window: .milliseconds(1), maxBatchSize: 75) }
        await clock.advance(by: .seconds(2))
        #expect(source.runs.count == 4)
        guard source.runs.count == 4, clock.now.offset == .seconds(2) else {
            for caller in callers { caller.cancel() }  // the clock stalled: do not wait for them
            return
        }
        for (key, caller) in callers.enumerated() { #expect(try await caller.value == key * 100) }
        #expect(family.count <= 30)
    }
}

extension Array where Element: Sendable {
    /// The elements transformed in order, awaiting each.
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var results: [T] = []
        for element in self { results.append(try await transform(element)) }
        return results
    }
}
