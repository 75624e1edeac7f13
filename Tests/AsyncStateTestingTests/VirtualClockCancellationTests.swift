import AsyncStateTesting
import Testing

@Suite struct VirtualClockCancellationTests {
    @Test func cancellingASleeperThrowsAtOnceAndRemovesIt() async throws {
        let clock = VirtualClock()
        let task = clock.task { try await clock.sleep(for: .seconds(60)) }
        await clock.waitForSleepers(1)
        task.cancel()
        await #expect(throws: CancellationError.self) { try await task.value }
        #expect(clock.pendingSleepers == 0)
        #expect(clock.now.offset == .zero)  // no time had to pass
        await clock.checkSuspension()
    }

    @Test func aCancelThatArrivesBeforeTheSleepRegistersStillWins() async throws {
        let clock = VirtualClock()
        // The task is cancelled before its body runs: the sleep must throw without ever waiting.
        let (gate, open) = AsyncStream.makeStream(of: Void.self)
        let task = Task {
            for await _ in gate { break }
            try await clock.sleep(for: .seconds(60))
        }
        task.cancel()
        open.yield()
        await #expect(throws: CancellationError.self) { try await task.value }
        #expect(clock.pendingSleepers == 0)
    }

    @Test func cancellationDuringRegistrationIsNeverLost() async throws {
        // Races the cancel against the registration many times; every sleep must end in
        // CancellationError and none may stay pending.
        let clock = VirtualClock()
        for _ in 0..<500 {
            let task = Task { try await clock.sleep(for: .seconds(1)) }
            task.cancel()
            await #expect(throws: CancellationError.self) { try await task.value }
        }
        #expect(clock.pendingSleepers == 0)
    }

    @Test func cancellingOneOfManyLeavesTheOthersInOrder() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        var tasks: [Task<Void, any Error>] = []
        for index in 0..<5 {
            tasks.append(
                clock.task {
                    try await clock.sleep(for: .seconds(1))
                    log.append("\(index)")
                })
            await clock.waitForSleepers(index + 1)
        }
        tasks[2].cancel()
        await #expect(throws: CancellationError.self) { try await tasks[2].value }
        #expect(clock.pendingSleepers == 4)
        await clock.advance(by: .seconds(1))
        #expect(log.all == ["0", "1", "3", "4"])
    }

    @Test func manyCancelledSleepersDoNotLinger() async throws {
        let clock = VirtualClock()
        var tasks: [Task<Void, any Error>] = []
        for index in 0..<300 {
            tasks.append(clock.task { try await clock.sleep(for: .seconds(Int64(1_000 + index))) })
        }
        await clock.waitForSleepers(300)
        for task in tasks { task.cancel() }
        for task in tasks { _ = await task.result }
        #expect(clock.pendingSleepers == 0)
        let survivor = clock.task { try await clock.sleep(for: .seconds(5)) }
        await clock.advance(by: .seconds(5))
        try await survivor.value
        await clock.checkSuspension()
    }
}
