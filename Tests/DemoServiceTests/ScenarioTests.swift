import DemoService
import Foundation
import Synchronization
import Testing

/// The demo's scenario (`swift run asyncstate-demo --virtual`), run in virtual time.
@Suite struct ScenarioTests {
    /// Collects entries from the scenario's callback.
    final class Recorder: Sendable {
        private let entries = Mutex<[TimelineEntry]>([])
        func append(_ entry: TimelineEntry) { entries.withLock { $0.append(entry) } }
        var all: [TimelineEntry] { entries.withLock { $0 } }
    }

    static func runOnce() async throws -> (entries: [TimelineEntry], summary: ScenarioSummary) {
        let directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("asyncstate-demo-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let recorder = Recorder()
        let summary = try await Scenario.runInVirtualTime(directory: directory) { recorder.append($0) }
        return (recorder.all, summary)
    }

    @Test func timelineShowsExpiryInvalidationRetryAndFailure() async throws {
        let (entries, summary) = try await Self.runOnce()
        let quote = "price 100.75 (upstream call 3)"
        let retrying = "failed (upstream answered 503); retrying"
        // (milliseconds since the start, state, phase): what DESIGN.md's semantics predict.
        let expected: [(Int, String, String)] = [
            (0, "writer", "wrote settings.json v1"),
            // Five concurrent handlers, each asking for the three values in turn: one load of each
            // source (the local sources answer at once; the upstream takes 0.4 s).
            (0, "load", "loading"),
            (0, "load", "success  load 0.52 0.58 0.59, 1/389 runnable"),
            (0, "settings", "loading"),
            (0, "settings", "success  v1 \"hello\""),
            (0, "quote", "loading"),
            // The upstream fails twice; retries wait 0.5 s, then 1 s; the phase stays loading.
            (400, "quote", "loading  attempt 1 \(retrying)"),
            (1300, "quote", "loading  attempt 2 \(retrying)"),
            // The load averages are 2 s old at the 2 s request: expired (expiry 1.5 s).
            (2000, "load", "loading"),
            (2000, "load", "success  load 0.61 0.60 0.59, 2/391 runnable"),
            (2700, "quote", "success  \(quote)"),
            // The watcher sees the rewrite at its next poll and invalidates; the next request reloads.
            (3200, "writer", "wrote settings.json v2"),
            (3500, "watcher", "settings.json changed: invalidate"),
            (3500, "settings", "stale    invalidated; the next request reads it again"),
            (4000, "load", "loading"),
            (4000, "load", "success  load 0.74 0.63 0.60, 3/390 runnable"),
            (4000, "settings", "loading"),
            (4000, "settings", "success  v2 \"hello again\""),
            // The report walks the audit log: three pages, 0.2 s each, kept by the paged state.
            (5200, "audit", "page 1: entries 1–100, more to come"),
            (5400, "audit", "page 2: entries 101–200, more to come"),
            (5600, "audit", "page 3: entries 201–250, end of listing"),
            (5600, "audit", "walked 250 entries in 3 pages, 3 page reads"),
            (6000, "load", "loading"),
            (6000, "load", "success  load 0.70 0.63 0.60, 1/388 runnable"),
            (6200, "writer", "wrote settings.json v3"),
            (6500, "watcher", "settings.json changed: invalidate"),
            (6500, "settings", "stale    invalidated; the next request reads it again"),
            // The quote, 4.3 s old, has expired (4 s): the second fetch fails all three attempts.
            (7000, "settings", "loading"),
            (7000, "settings", "success  v3 \"goodbye\""),
            (7000, "quote", "loading"),
            (7400, "quote", "loading  attempt 1 \(retrying)"),
            // The second walk finds the list fresh: no read.
            (8000, "audit", "walked 250 entries in 3 pages, all kept (fresh)"),
            (8000, "load", "loading"),
            (8000, "load", "success  load 0.66 0.62 0.60, 1/389 runnable"),
            (8300, "quote", "loading  attempt 2 \(retrying)"),
            (9700, "quote", "failure  upstream answered 503 after 3 attempts; still serving \(quote)"),
        ]
        let actual = entries.map { ($0.elapsed, $0.source, $0.text) }
        #expect(actual.count == expected.count)
        for (index, (got, want)) in zip(actual, expected).enumerated() {
            #expect(got.0 == .milliseconds(want.0), "entry \(index): \(got)")
            #expect(got.1 == want.1, "entry \(index): \(got)")
            #expect(got.2 == want.2, "entry \(index): \(got)")
        }
        // Wall dates follow the virtual clock exactly.
        for entry in entries {
            #expect(
                entry.date
                    == Scenario.virtualStartDate.addingTimeInterval(Double(entry.elapsed / .milliseconds(1)) / 1000))
        }

        #expect(
            summary
                == ScenarioSummary(
                    requests: 50, loadReads: 5, settingsReads: 3, upstreamCalls: 6, quotesServed: 35, quoteErrors: 15,
                    lastQuote: Quote(price: 100.75, call: 3), auditReads: 3))
    }

    @Test func renderedLineHasTimeDateStateAndPhase() async throws {
        let entry = TimelineEntry(
            elapsed: .milliseconds(2700), date: Scenario.virtualStartDate.addingTimeInterval(2.7), source: "quote",
            text: "success  price 100.75 (upstream call 3)")
        #expect(
            entry.rendered == " +2.700s  2026-01-01 09:00:02.700  quote     success  price 100.75 (upstream call 3)")
    }

    @Test func timelineIsTheSameEveryRun() async throws {
        let first = try await Self.runOnce()
        for _ in 0..<20 {
            let again = try await Self.runOnce()
            #expect(again.entries.map(\.rendered) == first.entries.map(\.rendered))
            #expect(again.summary == first.summary)
        }
    }

    @Test func loadAverageParsesProcLinesAndRejectsGarbage() throws {
        let load = try LoadAverage(procLine: "0.52 0.58 0.59 1/389 12345\n")
        #expect(load == (try LoadAverage(procLine: "0.52   0.58 0.59 1/389")))
        #expect(load.description == "load 0.52 0.58 0.59, 1/389 runnable")
        #expect(throws: DemoError.self) { try LoadAverage(procLine: "") }
        #expect(throws: DemoError.self) { try LoadAverage(procLine: "0.52 0.58 high 1/389 12345") }
        #expect(throws: DemoError.self) { try LoadAverage(procLine: "0.52 0.58 0.59 1389 12345") }
    }

    @Test func unreadableSourcesBecomeFailures() throws {
        let missing = LoadAverageSource.proc(path: "/nonexistent/loadavg")
        #expect(throws: DemoError.unreadable("/nonexistent/loadavg")) { try missing.read() }
        #expect(throws: DemoError.unreadable("recorded load averages")) { try LoadAverageSource.recorded([]).read() }
        let recorded = LoadAverageSource.recorded(["0.1 0.2 0.3 1/10 1", "0.4 0.5 0.6 2/20 2"])
        #expect(try (0..<3).map { _ in try recorded.read().one } == [0.1, 0.4, 0.4])  // the last repeats
        #expect(recorded.readCount == 3)
        let file = SettingsFile(url: URL(fileURLWithPath: "/nonexistent/settings.json"))
        #expect(throws: DemoError.unreadable("settings.json")) { try file.read() }
    }
}
