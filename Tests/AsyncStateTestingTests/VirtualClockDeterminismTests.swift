import AsyncStateKit
import Testing

@testable import AsyncStateTesting

@Suite struct VirtualClockDeterminismTests {
    /// One run of a scenario with four dependent sleeps handed back and forth between two tasks
    /// (A sleeps, then B, then A, then B; each sleep starts only after the other task's wake),
    /// with an actor hop in the middle. The state is read synchronously right after each advance:
    /// no yields, no waits. Returns a description of the first mismatch, or nil.
    static func runChainOnce() async -> String? {
        actor Relay {
            var hops = 0
            func hop() { hops += 1 }
        }
        let clock = VirtualClock()
        let state = LockedValue((a: 0, b: 0))
        let relay = Relay()
        let (toB, bInbox) = AsyncStream.makeStream(of: Void.self)
        let (toA, aInbox) = AsyncStream.makeStream(of: Void.self)

        let taskA = clock.task {
            try await clock.sleep(for: .seconds(1))
            state.withLock { $0.a = 1 }
            bInbox.yield()
            for await _ in toA { break }
            try await clock.sleep(for: .seconds(1))
            await relay.hop()
            state.withLock { $0.a = 2 }
            bInbox.yield()
        }
        let taskB = clock.task {
            var inbox = toB.makeAsyncIterator()
            await inbox.next()
            try await clock.sleep(for: .seconds(1))
            state.withLock { $0.b = 1 }
            aInbox.yield()
            await inbox.next()
            try await clock.sleep(for: .seconds(1))
            state.withLock { $0.b = 2 }
        }

        let expected = [(1, 0), (1, 1), (2, 1), (2, 2)]
        for (step, (a, b)) in expected.enumerated() {
            await clock.advance(by: .seconds(1))
            let seen = state.withLock { $0 }
            guard seen.a == a, seen.b == b else {
                taskA.cancel()
                taskB.cancel()
                return "after advance \(step + 1): expected (a: \(a), b: \(b)), saw \(seen)"
            }
        }
        guard clock.pendingSleepers == 0 else { return "sleepers left: \(clock.pendingSleepers)" }
        return nil
    }

    @Test func aChainOfDependentSleepsIsExactTwoThousandTimes() async {
        var failures: [String] = []
        for iteration in 0..<2_000 {
            if let failure = await Self.runChainOnce() {
                failures.append("iteration \(iteration): \(failure)")
            }
        }
        #expect(failures.isEmpty, "\(failures.count) of 2000 runs failed; first: \(failures.first ?? "")")
    }

    @Test func manySleepersAtOneDeadlineAllSettleInOneAdvance() async {
        let clock = VirtualClock()
        let woken = LockedValue(0)
        for _ in 0..<1_000 {
            clock.task {
                try await clock.sleep(for: .seconds(1))
                woken.withLock { $0 += 1 }
            }
        }
        await clock.advance(by: .seconds(1))
        #expect(woken.withLock { $0 } == 1_000)
        #expect(clock.pendingSleepers == 0)
    }
}

@Suite struct SleeperHeapTests {
    @Test func popsInDeadlineThenRegistrationOrderUnderRandomPushesAndPops() {
        var generator = SplitMix64(seed: 0x5eed)
        var heap = SleeperHeap()
        var reference: [SleeperHeap.Key] = []
        var nextID: UInt64 = 0
        var mismatches = 0
        for _ in 0..<6_000 {
            if generator.next() % 3 != 0 || reference.isEmpty {
                nextID += 1
                let key = SleeperHeap.Key(deadline: .milliseconds(Int64(generator.next() % 50)), id: nextID)
                heap.push(key)
                reference.insert(key, at: reference.firstIndex { key < $0 } ?? reference.endIndex)
            } else if heap.popMin() != reference.removeFirst() {
                mismatches += 1
            }
        }
        #expect(mismatches == 0)
        #expect(heap.count == reference.count)
        heap.removeAll { $0.id % 2 == 0 }
        reference.removeAll { $0.id % 2 == 0 }
        var drained: [SleeperHeap.Key] = []
        while let key = heap.popMin() { drained.append(key) }
        #expect(drained == reference)
    }
}
