// swift-format-ignore-file
// Verbatim from Sources/AsyncStateTesting/AsyncStateTesting.docc/TestingInVirtualTime.md;
// .ci/doc-snippets checks that the article's block still matches this file.
import AsyncStateKit
import AsyncStateTesting
import Testing

struct SourceIsDown: Error {}

@Test func retriesWithBackoffThenFails() async throws {
    let clock = VirtualClock()
    let quotes = AsyncState<[Double]>(
        wrappedValue: [], clock: clock,
        retry: .exponential(maxAttempts: 3, initial: .seconds(1), cap: .seconds(10)))

    let caller = clock.task { try await quotes.value { throw SourceIsDown() } }
    await clock.settle()  // the first attempt has failed; a retry is due in 1 s
    #expect(quotes.phase.isLoading)
    #expect(quotes.snapshot.failureCount == 1)

    await clock.advance(by: .milliseconds(999))
    #expect(quotes.snapshot.failureCount == 1)  // not yet
    await clock.advance(by: .milliseconds(1))
    #expect(quotes.snapshot.failureCount == 2)  // the second attempt failed; the next is due in 2 s

    await clock.advance(by: .seconds(2))
    #expect(quotes.phase.error is SourceIsDown)  // three attempts: the state gives up
    await #expect(throws: SourceIsDown.self) { try await caller.value }
    await clock.checkSuspension()  // nothing left asleep
}
