import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// A family's key behaves as an `@AsyncState` declared with the same arguments, in the places where
/// it once did not: reentrant batches and the default emptiness of collections and optionals.
@Suite struct FamilyKeyIsAStateTests {
    @Test func aBatchOperationThatAsksForItsOwnKeyIsRefusedAtOnce() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<Int, Int>(clock: clock)
        let inner = LockedValue<[String]>([])
        let results = await family.values(for: [2, 3]) { keys in
            do {
                _ = try await family.value(for: 2) { _ in 0 }
                inner.withLock { $0.append("value: answered") }
            } catch {
                inner.withLock { $0.append("value: \(error)") }
            }
            let nested = await family.values(for: [3]) { _ in [3: 0] }
            do {
                _ = try nested[3]!.get()
                inner.withLock { $0.append("values: answered") }
            } catch {
                inner.withLock { $0.append("values: \(error)") }
            }
            return Dictionary(uniqueKeysWithValues: keys.map { ($0, $0 * 10) })
        }
        #expect(try results[2]?.get() == 20 && results[3]?.get() == 30)
        let reentrant = "\(AsyncStateError.reentrantCall)"
        #expect(inner.withLock { $0 } == ["value: \(reentrant)", "values: \(reentrant)"])

        // The single-key path, for comparison: the same error.
        await #expect(throws: AsyncStateError.reentrantCall) {
            try await family.value(for: 9) { _ in try await family.value(for: 9) { _ in 0 } }
        }

        // With a timeout, the same: at once, not at the deadline.
        let timed = AsyncStateFamily<Int, Int>(clock: clock, timeout: .seconds(30))
        let task = clock.task {
            await timed.values(for: [1]) { _ in [1: try await timed.value(for: 1) { _ in 0 }] }
        }
        await clock.advance(by: .zero)
        let answered = try await task.value
        #expect(throws: AsyncStateError.reentrantCall) { try answered[1]?.get() }
        #expect(clock.now.offset == .zero)
    }

    @Test func aBatchsKeyMayBeUsedFromATaskItStartedOnceTheBatchHasAnswered() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<Int, Int>(clock: clock)
        let later = LockedValue<Task<Int, any Error>?>(nil)
        _ = await family.values(for: [1]) { _ in
            later.withLock {
                $0 = clock.task {
                    try await clock.sleep(for: .seconds(1))
                    return try await family.value(for: 1) { _ in 99 }
                }
            }
            return [1: 10]
        }
        // The task inherited the batch's mark, but its attempt is over: it reads the value.
        await clock.advance(by: .seconds(1))
        #expect(try await later.withLock { $0 }!.value == 10)
    }

    /// A task an operation started carries the operation's mark after the operation's store is gone.
    /// The next store made on the same thread usually takes the freed store's address (it did in
    /// every round when this test was written), and its first flight had the same attempt number:
    /// the task's call was refused as reentrant instead of joining that flight.
    @Test func aTaskAnOperationStartedJoinsAnotherKeysFlightAfterTheOperationsStoreIsGone() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<Int, Int>(clock: clock)
        for round in 0..<50 {
            let (old, new) = (2 * round, 2 * round + 1)
            let child = LockedValue<Task<Int, any Error>?>(nil)
            // One task frees `old`'s store (its entry becomes compact) and makes `new`'s.
            let flight = clock.task {
                _ = try await family.value(for: old) { _ in
                    child.withLock {
                        $0 = clock.task {
                            try await clock.sleep(for: .seconds(1))
                            return try await family.value(for: new) { _ in -1 }
                        }
                    }
                    return 0
                }
                return try await family.value(for: new) { _ in
                    try await clock.sleep(for: .seconds(2))
                    return 7
                }
            }
            await clock.advance(by: .seconds(1))  // the child asks while `new`'s flight runs
            await clock.advance(by: .seconds(1))
            #expect(try await flight.value == 7)
            let childTask = child.withLock { $0 }!
            switch await childTask.result {
            case .success(let value): #expect(value == 7, "round \(round)")
            case .failure(let error): Issue.record("round \(round): \(error)")
            }
        }
    }

    @Test func aFamilyOfCollectionsOrOptionalsTreatsEmptyAsAStateDoes() async throws {
        let clock = VirtualClock()
        let lists = AsyncStateFamily<Int, [Int]>(clock: clock)
        let list = AsyncState<[Int]>(wrappedValue: [1], clock: clock)
        _ = try await lists.value(for: 1) { _ in [] }
        _ = try await list.value { [] }
        #expect(lists.snapshot(for: 1)?.phase.name == "empty")
        #expect(list.phase.name == "empty")
        _ = try await lists.value(for: 2) { _ in [1] }
        #expect(lists.snapshot(for: 2)?.phase.name == "success")

        let optionals = AsyncStateFamily<Int, String?>(clock: clock)
        _ = try await optionals.value(for: 1) { _ in nil }
        #expect(optionals.snapshot(for: 1)?.phase.name == "empty")
        _ = try await optionals.value(for: 2) { _ in "x" }
        #expect(optionals.snapshot(for: 2)?.phase.name == "success")

        // `isEmpty:` overrides the default, as for a state; a family declared with values too.
        let overridden = AsyncStateFamily<Int, [Int]>(clock: clock, isEmpty: { $0.count < 2 })
        _ = try await overridden.value(for: 1) { _ in [1] }
        #expect(overridden.snapshot(for: 1)?.phase.name == "empty")
        let seeded = AsyncStateFamily<Int, [Int]>(wrappedValue: [1: [], 2: [2]], clock: clock)
        #expect(seeded.snapshot(for: 1)?.phase.name == "empty" && seeded.snapshot(for: 2)?.phase.name == "success")
        let seededOptionals = AsyncStateFamily<Int, Int?>(wrappedValue: [1: nil], clock: clock)
        #expect(seededOptionals.snapshot(for: 1)?.phase.name == "empty")
    }
}
