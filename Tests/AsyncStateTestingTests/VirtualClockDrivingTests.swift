import AsyncStateKit
import AsyncStateTesting
import Testing

@Suite struct VirtualClockDrivingTests {
    @Test func runUntilIdleRunsEveryChainToTheEnd() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        clock.task {
            for step in 1...3 {
                try await clock.sleep(for: .seconds(10))
                log.append("a\(step)@\(clock.now.offset)")
            }
        }
        clock.task {
            try await clock.sleep(for: .seconds(15))
            log.append("b@\(clock.now.offset)")
        }
        await clock.runUntilIdle()
        #expect(log.all == ["a1@10.0 seconds", "b@15.0 seconds", "a2@20.0 seconds", "a3@30.0 seconds"])
        #expect(clock.now.offset == .seconds(30))
        #expect(clock.pendingSleepers == 0)
    }

    @Test func runUntilIdleGivesUpOnATimerThatNeverStops() async throws {
        let stalls = StallRecorder()
        let clock = clockRecordingStalls(stalls)
        let ticker = clock.task {
            while true { try await clock.sleep(for: .seconds(1)) }
        }
        await clock.runUntilIdle(maxWakes: 50)
        #expect(clock.now.offset == .seconds(50))
        #expect(stalls.all.count == 1)
        #expect(stalls.all.first?.operation == "runUntilIdle()")
        #expect(stalls.all.first?.pendingSleepers == [.init(offset: .seconds(51))])
        ticker.cancel()
        _ = await ticker.result
        await clock.checkSuspension()
    }

    @Test func waitForSleepersSeesSleepsFromTasksTheClockDoesNotWatch() async throws {
        // A task on a queue of its own, not the cooperative pool, which the suite's other tests can
        // hold for a minute under ThreadSanitizer on two cores (a plain Task then never started
        // within the stall timeout); and a longer stall timeout than the default 10 s (the wait
        // returns as soon as both sleeps have begun).
        let clock = VirtualClock(stallTimeout: .seconds(60))
        let log = EventLog()
        // The clock cannot count this task's work, so the test waits for its sleeps instead.
        let task = Task(executorPreference: OwnQueueExecutor()) {
            async let one: Void = clock.sleep(for: .seconds(1))
            async let two: Void = clock.sleep(for: .seconds(2))
            try await one
            try await two
            log.append("done")
        }
        await clock.waitForSleepers(2)
        #expect(clock.pendingSleepers == 2)
        // If the wait timed out (the task did not start within the clock's stall timeout: the
        // cooperative pool starved), the sleeps would begin after the advance below and never end:
        // cancel the task rather than hang (the failure is recorded above).
        guard clock.pendingSleepers == 2 else {
            task.cancel()
            _ = await task.result
            return
        }
        await clock.advance(by: .seconds(2))
        try await task.value
        #expect(log.all == ["done"])
    }

    @Test func waitForSleepersReturnsAtOnceWhenEnoughArePending() async {
        let clock = VirtualClock()
        await clock.waitForSleepers(0)
        await clock.waitForSleepers(-1)
        #expect(clock.pendingSleepers == 0)
    }

    @Test func checkSuspensionPassesWhenNothingIsLeft() async {
        let clock = VirtualClock()
        #expect(await clock.checkSuspension())
    }

    @Test func checkSuspensionReportsALeftoverSleeper() async throws {
        let stalls = StallRecorder()
        let clock = clockRecordingStalls(stalls)
        let task = clock.task { try await clock.sleep(for: .seconds(3)) }
        #expect(await clock.checkSuspension() == false)
        #expect(stalls.all.map(\.operation) == ["checkSuspension()"])
        #expect(stalls.all.first?.pendingSleepers == [.init(offset: .seconds(3))])
        task.cancel()
        _ = await task.result
    }
}

@Suite struct VirtualClockWatchdogTests {
    @Test func workThatNeverSettlesIsReportedNotHung() async throws {
        let stalls = StallRecorder()
        let clock = clockRecordingStalls(stalls, timeout: .milliseconds(100))
        let release = LockedFlag()
        clock.task { try await clock.sleep(for: .seconds(1)) }
        clock.task {
            // Busy on the executor in real time: the clock cannot settle until it ends.
            while !release.isSet { await Task.yield() }
        }
        await clock.advance(by: .seconds(5))
        release.set()
        let stall = try #require(stalls.all.first)
        #expect(stall.operation == "advance(by: 5.0 seconds)")
        #expect(stall.pendingSleepers == [.init(offset: .seconds(1))])
        #expect(stall.runningJobs >= 1)
        #expect(stall.description.contains("pending sleepers (1): +1.0 seconds"))
        #expect(stall.location.fileID.hasSuffix("VirtualClockDrivingTests.swift"))
        await clock.advance(by: .seconds(5))
        #expect(clock.pendingSleepers == 0)
    }

    @Test func waitingForSleepersThatNeverComeIsReported() async {
        let stalls = StallRecorder()
        let clock = clockRecordingStalls(stalls, timeout: .milliseconds(50))
        await clock.waitForSleepers(1)
        #expect(stalls.all.map(\.operation) == ["waitForSleepers(1)"])
        #expect(stalls.all.first?.reason.contains("fewer than 1 sleepers had arrived") == true)
    }

    @Test func advancingFromInsideAClockTaskIsReportedNotDeadlocked() async throws {
        let stalls = StallRecorder()
        let clock = clockRecordingStalls(stalls, timeout: .seconds(60))
        let task = clock.task { await clock.advance(by: .seconds(1)) }
        try await task.value
        #expect(stalls.all.count == 1)
        #expect(stalls.all.first?.reason.contains("would wait for itself") == true)
    }
}

/// A flag one task sets and another polls.
final class LockedFlag: Sendable {
    private let flag = LockedValue(false)
    func set() { flag.withLock { $0 = true } }
    var isSet: Bool { flag.withLock { $0 } }
}
