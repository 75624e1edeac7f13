// swift-format-ignore-file
// Verbatim from Sources/AsyncStateKit/AsyncStateKit.docc/CachingAndExpiry.md; .ci/doc-snippets
// checks that its block still matches this file.
import AsyncStateKit

struct Headlines: Sendable, AsyncStateExpiring {
    var titles: [String]
    var maxAge: Int  // seconds, from the response's Cache-Control header
    var timeToLive: Duration? { .seconds(maxAge) }
}

enum NewsSource {
    static func fetch() async throws -> Headlines { Headlines(titles: ["Rain at noon"], maxAge: 30) }
}

actor NewsService {
    // Fresh for as long as each answer's max-age says (a `nil` timeToLive would mean 300 s).
    @AsyncState(expiry: .seconds(300)) var headlines = Headlines(titles: [], maxAge: 0)

    func current() async throws -> Headlines {
        try await $headlines.value { try await NewsSource.fetch() }
    }
}
