// swift-format-ignore-file
// Verbatim from Sources/AsyncStateKit/AsyncStateKit.docc/RetryCancellationAndSingleFlight.md;
// .ci/doc-snippets checks that the article's block still matches this file.
import AsyncStateKit

struct Quote: Sendable { var symbol: String; var price: Double }
struct QuoteError: Error { var status: Int }

func loadQuotes() async throws -> [Quote] { [Quote(symbol: "ACME", price: 12.5)] }

actor QuoteService {
    @AsyncState(
        expiry: .seconds(30),
        retry: RetryPolicy
            .exponential(maxAttempts: 4, initial: .seconds(1), cap: .seconds(30), jitter: .full)
            .retrying { ($0 as? QuoteError)?.status != 404 },  // a 404 will not get better
        timeout: .seconds(5),           // after 5 s, callers get AsyncStateError.timedOut
        failureExpiry: .seconds(2),     // a failure is answered from memory for 2 s
        staleWhileRevalidate: true      // expired quotes are served at once while one refresh runs
    )
    var quotes: [Quote] = []

    func current() async throws -> [Quote] {
        try await $quotes.value { try await loadQuotes() }
    }

    func currentOrFailFast() async throws -> [Quote] {
        try await $quotes.value(retry: .never) { try await loadQuotes() }  // a per-call override
    }

    /// Refreshes the quotes every minute until its task is cancelled (say, by a ServiceGroup).
    func run() async throws {
        try await $quotes.run(every: .seconds(60)) { try await loadQuotes() }
    }
}
