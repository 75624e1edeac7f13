// swift-format-ignore-file
// Verbatim from README.md and Sources/AsyncStateKit/AsyncStateKit.docc/PagingAndPresenting.md;
// .ci/doc-snippets checks that their blocks still match this file.
import AsyncStateKit
import Foundation

struct HTTPAnswer: Equatable {
    var status: Int
    var headers: [String: String] = [:]
}

// A snapshot as an HTTP status and headers, in one exhaustive place.
func answer<Value>(for snapshot: AsyncSnapshot<Value>, now: Date) -> HTTPAnswer {
    let age = snapshot.lastSuccess.map { ["Age": String(Int(now.timeIntervalSince($0)))] } ?? [:]
    let unavailable = HTTPAnswer(status: 503, headers: ["Retry-After": "1"])
    return snapshot.fold(
        initial: { unavailable },
        loading: { previous in previous == nil ? unavailable : HTTPAnswer(status: 200, headers: age) },
        empty: { HTTPAnswer(status: 204) },
        success: { _, _ in HTTPAnswer(status: 200, headers: age) },
        failure: { _, previous in previous == nil ? unavailable : HTTPAnswer(status: 200, headers: age) })
}

// In a handler: the value and its metadata come from one read, answered like `value`.
func handle(_ config: AsyncState<String>, load: @escaping @Sendable () async throws -> String) async throws
    -> HTTPAnswer
{
    answer(for: try await config.snapshot(load), now: Date())
}

// A state made from run-time configuration: assign the wrapper itself in `init`.
struct TenantConfigService {
    @AsyncState var config: String

    init(expiry: Duration, clock: some Clock<Duration> = ContinuousClock()) {
        _config = AsyncState(wrappedValue: "", expiry: expiry, clock: clock)
    }
}
