import AsyncStateTesting
import Testing

@testable import AsyncStateKit

@Suite struct UpdatesTests {
    static func describe(_ snapshot: AsyncSnapshot<Int>) -> String {
        "\(snapshot.phase.name) \(snapshot.value)\(snapshot.isExpired ? " expired" : "")"
    }

    @Test func twoSubscribersSeeTheCurrentSnapshotThenEveryTransitionInOrder() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let expected = [
            "initial 0 expired", "loading 0 expired", "success 1", "success 1 expired", "loading 1 expired",
            "failure 1 expired", "success 5", "initial 0 expired",
        ]
        let subscribers = (0..<2).map { _ in
            let stream = state.updates  // subscribed now: before any transition
            return clock.task {
                var seen: [String] = []
                for await snapshot in stream {
                    seen.append(Self.describe(snapshot))
                    if seen.count == expected.count { break }
                }
                return seen
            }
        }
        clock.task {
            await state.fetch {
                try await clock.sleep(for: .seconds(1))
                return 1
            }
        }
        await clock.advance(by: .seconds(1))
        await state.invalidate()
        clock.task {
            await state.fetch {
                try await clock.sleep(for: .seconds(1))
                throw SourceDown()
            }
        }
        await clock.advance(by: .seconds(1))
        await state.set(5)
        await state.reset()
        for subscriber in subscribers {
            #expect(try await subscriber.value == expected)
        }
    }

    @Test func aLateSubscriberStartsWithTheCurrentSnapshot() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        await state.set(9)
        var iterator = state.updates.makeAsyncIterator()
        let first = try #require(await iterator.next())
        #expect(Self.describe(first) == "success 9")
    }

    @Test func aSlowSubscriberKeepsOnlyTheNewestSnapshots() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let stream = state.updates
        for value in 1...1_000 { await state.set(value) }
        var values: [Int] = []
        for await snapshot in stream {
            values.append(snapshot.value)
            if snapshot.value == 1_000 { break }
        }
        #expect(values.count <= 64)
        #expect(values == Array((1_001 - values.count)...1_000))  // the newest, in order
    }

    @Test func streamsFinishWhenTheStateIsFreed() async throws {
        let clock = VirtualClock()
        var state: AsyncState<Int>? = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let stream = try #require(state?.updates)
        let consumer = clock.task {
            var count = 0
            for await _ in stream { count += 1 }
            return count  // reached only if the stream finishes
        }
        await state?.set(1)
        state = nil
        #expect(try await consumer.value == 2)
    }
}

@Suite struct SubscriberListTests {
    @Test func aSubscriberLeavesTheListWhenItEndsNotAtTheNextPublish() async throws {
        let state = AsyncState<Int>(wrappedValue: 0, clock: VirtualClock())
        let consumer = Task {
            var seen = 0
            for await _ in state.updates { seen += 1 }
            return seen
        }
        while state.store.cell.subscriberCount == 0 { await Task.yield() }
        consumer.cancel()
        #expect(await consumer.value >= 1)
        #expect(state.store.cell.subscriberCount == 0)  // no publish happened in between

        do { _ = state.updates }  // a stream dropped unread ends too
        #expect(state.store.cell.subscriberCount == 0)
    }

    @Test func aThousandSubscribersEachGetEveryTransitionInOrder() async throws {
        let state = AsyncState<Int>(wrappedValue: 0, clock: VirtualClock())
        var streams = (0..<1_000).map { _ in state.updates }
        for value in 1...5 { await state.set(value) }
        for stream in streams {
            var values: [Int] = []
            for await snapshot in stream {
                values.append(snapshot.value)
                if values.count == 6 { break }
            }
            #expect(values == [0, 1, 2, 3, 4, 5])
        }
        #expect(state.store.cell.subscriberCount == 1_000)  // the streams are still held
        streams = []
        #expect(state.store.cell.subscriberCount == 0)  // each left when its stream was dropped
    }
}

@Suite struct ReentrancyTests {
    @Test func anOperationThatAsksItsOwnStateForTheValueGetsAClearError() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let inner = LockedValue<(any Error)?>(nil)
        await state.fetch {
            do {
                _ = try await state.value { 1 }
            } catch {
                inner.withLock { $0 = error }
            }
            return 2
        }
        #expect(inner.withLock { $0 } as? AsyncStateError == .reentrantCall)
        #expect(state.wrappedValue == 2)
        #expect(state.phase.name == "success")
    }

    @Test func fetchRefreshAndRetryFromInsideTheOperationAreNoOps() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let runs = LockedValue(0)
        await state.fetch {
            runs.withLock { $0 += 1 }
            await state.fetch { 10 }
            await state.refresh { 11 }
            await state.retry { 12 }
            await state.retry()
            return 3
        }
        #expect(runs.withLock { $0 } == 1)
        #expect(state.wrappedValue == 3)
    }

    @Test func aCycleThroughTwoStatesIsRefusedNotHung() async throws {
        let clock = VirtualClock()
        let a = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let b = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let result = try await a.value {
            let fromB = try await b.value {
                (try? await a.value { 100 }) ?? -1  // a waits for b, which would wait for a
            }
            return fromB + 1
        }
        #expect(result == 0)
        #expect(b.wrappedValue == -1)
    }

    @Test func anOperationMayWriteToItsOwnState() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let caller = clock.task {
            try await state.value {
                await state.set(50)  // the write wins; this operation's result will be dropped
                return 60
            }
        }
        #expect(try await caller.value == 50)
        await clock.settle()
        #expect(state.wrappedValue == 50)
    }
}
