// swift-format-ignore-file
// Verbatim from Sources/AsyncStateKit/AsyncStateKit.docc/ObservingAService.md; .ci/doc-snippets
// checks that its block still matches this file.
import AsyncStateKit
import Synchronization

/// The request a handler serves, as a tracer's context would be.
enum RequestID {
    @TaskLocal static var current: String?
}

/// Notes which request started each fetch, and which requests waited for it.
final class WhoWaited: AsyncStateObserver {
    let lines = Mutex<[String]>([])

    // Called in the caller's task: the events that caller causes carry what it returns.
    func callerContext() -> (any Sendable)? { RequestID.current }

    func observe(_ event: AsyncStateEvent) {
        guard let fetch = event.fetch, let request = event.callerContext as? String else { return }
        switch event.kind {
        case .started: lines.withLock { $0.append("\(request) started fetch \(fetch.id)") }
        case .joined: lines.withLock { $0.append("\(request) waited for fetch \(fetch.id)") }
        default: break
        }
    }
}

// MARK: The article's claim

import AsyncStateTesting
import Testing

@Suite struct ObservingAServiceExample {
    @Test func threeRequestsAtOnceMakeOneFetchThatTwoWaitedFor() async throws {
        let clock = VirtualClock()
        let observer = WhoWaited()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, name: "answer", observer: observer)
        let requests = ["a", "b", "c"].map { request in
            RequestID.$current.withValue(request) {
                clock.task {
                    try await state.value {
                        try await clock.sleep(for: .milliseconds(50))
                        return 42
                    }
                }
            }
        }
        for _ in requests { await clock.advance(by: .zero) }
        await clock.advance(by: .milliseconds(50))
        for request in requests { #expect(try await request.value == 42) }
        let lines = observer.lines.withLock { $0 }
        let id = try #require(lines.first?.split(separator: " ").last)
        #expect(lines == ["a started fetch \(id)", "b waited for fetch \(id)", "c waited for fetch \(id)"])
    }
}
