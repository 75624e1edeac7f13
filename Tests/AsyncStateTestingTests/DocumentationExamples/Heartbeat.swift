// swift-format-ignore-file
// Verbatim from Sources/AsyncStateTesting/AsyncStateTesting.docc/TestingInVirtualTime.md;
// .ci/doc-snippets checks that the article's block still matches this file.
import AsyncStateTesting
import Testing

actor Heartbeat {
    var beats = 0
    func run(on clock: some Clock<Duration>) async throws {
        while true {
            try await clock.sleep(for: .seconds(30))
            beats += 1
        }
    }
}

@Test func beatsEveryThirtySeconds() async throws {
    let clock = VirtualClock()
    let heartbeat = Heartbeat()
    let task = clock.task { try await heartbeat.run(on: clock) }  // a task the clock waits for

    await clock.advance(by: .seconds(29))
    #expect(await heartbeat.beats == 0)
    await clock.advance(by: .seconds(1))
    #expect(await heartbeat.beats == 1)
    await clock.advance(by: .seconds(300))
    #expect(await heartbeat.beats == 11)

    task.cancel()
    await clock.checkSuspension()  // fails the test if a sleeper was left behind
}
