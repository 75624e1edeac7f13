import AsyncStateTesting
import Foundation
import Testing

@Suite struct VirtualClockOrderingTests {
    @Test func startsAtZeroAndTheReferenceDate() {
        let clock = VirtualClock()
        #expect(clock.now == VirtualClock.Instant(offset: .zero))
        #expect(clock.minimumResolution == .zero)
        #expect(clock.date == Date(timeIntervalSinceReferenceDate: 0))
        #expect(clock.pendingSleepers == 0)
    }

    @Test func dateMovesWithTimeFromACustomStart() async {
        let start = Date(timeIntervalSince1970: 1_700_000_000)
        let clock = VirtualClock(startDate: start)
        await clock.advance(by: .milliseconds(120_500))
        #expect(clock.now.offset == .milliseconds(120_500))
        #expect(clock.date == start.addingTimeInterval(120.5))
    }

    @Test func wakesInDeadlineOrderWithNowAtEachDeadline() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        for seconds in [3, 1, 2] {
            clock.task {
                try await clock.sleep(for: .seconds(seconds))
                log.append("\(seconds)@\(clock.now.offset)")
            }
        }
        await clock.advance(by: .seconds(10))
        #expect(log.all == ["1@1.0 seconds", "2@2.0 seconds", "3@3.0 seconds"])
        #expect(clock.now.offset == .seconds(10))
        await clock.checkSuspension()
    }

    @Test func equalDeadlinesWakeInRegistrationOrder() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        for index in 0..<20 {
            clock.task {
                try await clock.sleep(until: .init(offset: .seconds(5)))
                log.append("\(index)")
            }
            // Registration order is the order of these waits, not of task start-up.
            await clock.waitForSleepers(index + 1)
        }
        await clock.advance(by: .seconds(5))
        #expect(log.all == (0..<20).map { "\($0)" })
    }

    @Test func advanceStopsShortOfLaterDeadlines() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        clock.task {
            try await clock.sleep(for: .seconds(2))
            log.append("woke")
        }
        await clock.advance(by: .milliseconds(1_999))
        #expect(log.all.isEmpty)
        #expect(clock.pendingSleepers == 1)
        await clock.advance(by: .milliseconds(1))
        #expect(log.all == ["woke"])
        #expect(clock.pendingSleepers == 0)
    }

    @Test func sleepAtOrBeforeNowReturnsWithoutSuspending() async throws {
        let clock = VirtualClock()
        await clock.advance(by: .seconds(5))
        // These run in the test's own task: if they suspended, nothing would ever wake them.
        try await clock.sleep(until: clock.now)
        try await clock.sleep(until: .init(offset: .seconds(1)))
        try await clock.sleep(for: .zero)
        try await clock.sleep(for: .seconds(-3))
        #expect(clock.pendingSleepers == 0)
        #expect(clock.now.offset == .seconds(5))
    }

    @Test func advanceIntoThePastMovesNothing() async {
        let clock = VirtualClock()
        await clock.advance(by: .seconds(5))
        await clock.advance(to: .init(offset: .seconds(1)))
        await clock.advance(by: .seconds(-2))
        #expect(clock.now.offset == .seconds(5))
    }

    @Test func sleepsRegisteredDuringAnAdvanceWakeInTheSameAdvance() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        clock.task {
            try await clock.sleep(for: .seconds(1))
            log.append("first@\(clock.now.offset)")
            clock.task {
                try await clock.sleep(for: .seconds(1))
                log.append("spawned@\(clock.now.offset)")
            }
            try await clock.sleep(for: .seconds(3))
            log.append("again@\(clock.now.offset)")
        }
        await clock.advance(by: .seconds(4))
        #expect(log.all == ["first@1.0 seconds", "spawned@2.0 seconds", "again@4.0 seconds"])
        await clock.checkSuspension()
    }

    @Test func aChainOfSleepsHandsOverBetweenTasks() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let (stream, baton) = AsyncStream.makeStream(of: Void.self)
        clock.task {
            try await clock.sleep(for: .seconds(1))
            log.append("A1@\(clock.now.offset)")
            baton.yield()
            try await clock.sleep(for: .seconds(1))
            log.append("A2@\(clock.now.offset)")
        }
        clock.task {
            for await _ in stream {
                try await clock.sleep(for: .milliseconds(500))
                log.append("B@\(clock.now.offset)")
                return
            }
        }
        await clock.advance(by: .seconds(1))
        #expect(log.all == ["A1@1.0 seconds"])
        await clock.advance(by: .milliseconds(500))
        #expect(log.all == ["A1@1.0 seconds", "B@1.5 seconds"])
        await clock.advance(by: .milliseconds(500))
        #expect(log.all == ["A1@1.0 seconds", "B@1.5 seconds", "A2@2.0 seconds"])
        baton.finish()
        await clock.checkSuspension()
    }

    @Test func childTasksOfAClockTaskSettleToo() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        clock.task {
            async let left: Void = {
                try await clock.sleep(for: .seconds(1))
                log.append("left")
            }()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<3 {
                    group.addTask {
                        try await clock.sleep(for: .seconds(2))
                        log.append("group\(index)")
                    }
                }
                try await group.waitForAll()
            }
            try await left
            log.append("done")
        }
        await clock.advance(by: .seconds(1))
        #expect(log.all == ["left"])
        await clock.advance(by: .seconds(1))
        #expect(log.all.count == 5)
        #expect(log.all.last == "done")
        #expect(Set(log.all.dropFirst().dropLast()) == ["group0", "group1", "group2"])
    }

    @Test func workThatHopsThroughAnActorSettles() async throws {
        actor Counter {
            var value = 0
            func bump() { value += 1 }
        }
        let clock = VirtualClock()
        let counter = Counter()
        clock.task {
            for _ in 0..<3 {
                try await clock.sleep(for: .seconds(1))
                await counter.bump()
            }
        }
        for expected in 1...3 {
            await clock.advance(by: .seconds(1))
            #expect(await counter.value == expected)
        }
    }

    @Test func theTaskReturnsItsBodysResult() async throws {
        let clock = VirtualClock()
        let task = clock.task {
            try await clock.sleep(for: .seconds(1))
            return 42
        }
        await clock.advance(by: .seconds(1))
        #expect(try await task.value == 42)
    }

    @Test func virtualShorthandMakesAFreshClock() {
        let clock: VirtualClock = .virtual
        #expect(clock.now.offset == .zero)
        #expect(clock !== VirtualClock.virtual)
    }
}
