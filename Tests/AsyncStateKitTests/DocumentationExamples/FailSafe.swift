// swift-format-ignore-file
// Verbatim from Sources/AsyncStateKit/AsyncStateKit.docc/WhenTheSourceIsDown.md; .ci/doc-snippets
// checks that its block still matches this file.
import AsyncStateKit

struct Rates: Sendable { var euro: Double }

enum RatesSource {
    static func fetch() async throws -> Rates { Rates(euro: 1.08) }
}

actor RatesService {
    // Fresh for 60 s. If the source fails, the last rates are answered for up to 10 minutes after
    // they arrived; a failure is answered from memory for 5 s, so a dead source is asked at most
    // once every 5 s meanwhile.
    @AsyncState(expiry: .seconds(60), failureExpiry: .seconds(5), maxStaleAge: .seconds(600))
    var rates = Rates(euro: 1)

    func current() async throws -> Rates {
        try await $rates.value { try await RatesSource.fetch() }
    }
}
