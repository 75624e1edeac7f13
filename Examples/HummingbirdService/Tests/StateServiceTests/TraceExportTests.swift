import Foundation
import InMemoryTracing
import Testing
import Tracing

@testable import StateService

@Suite struct TraceExportTests {
    @Test func eachFinishedSpanIsOneJSONLineWithItsParentLinksEventsAndErrors() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("trace-\(UUID()).jsonl").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let export = try TraceExport(path: path)
        let tracer = export.tracer
        let request = tracer.startSpan("GET /users/{id}", context: ServiceContext.topLevel)
        let load = tracer.startSpan("async_state.load", context: request.context)
        load.attributes["async_state.joiners"] = 2
        load.attributes["async_state.key"] = "7"
        load.addEvent(SpanEvent(name: "async_state.attempt_failed", attributes: ["async_state.attempt": 1]))
        load.recordError(CancellationError())
        let batch = tracer.startSpan("async_state.batch", context: ServiceContext.topLevel)
        load.addLink(SpanLink(context: batch.context, attributes: [:]))
        load.end()
        #expect(export.flush() == 1)
        request.end()
        batch.end()
        #expect(export.flush() == 2)
        #expect(export.flush() == 0)

        let lines = try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n")
        let spans = try lines.map { try #require(JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]) }
        #expect(spans.map { $0["name"] as? String } == ["async_state.load", "GET /users/{id}", "async_state.batch"])
        let (loaded, root) = (spans[0], spans[1])
        #expect(loaded["parent"] as? String == root["span"] as? String && root["parent"] == nil)
        #expect(loaded["trace"] as? String == root["trace"] as? String)
        let attributes = try #require(loaded["attributes"] as? [String: Any])
        #expect(attributes["async_state.joiners"] as? Int == 2 && attributes["async_state.key"] as? String == "7")
        let links = try #require(loaded["links"] as? [[String: String]])
        #expect(links == [["trace": spans[2]["trace"] as! String, "span": spans[2]["span"] as! String]])
        let events = try #require(loaded["events"] as? [[String: Any]])
        #expect(events.first?["name"] as? String == "async_state.attempt_failed")
        #expect((loaded["errors"] as? [String])?.count == 1)
        let (start, end) = (try #require(loaded["start_ns"] as? UInt64), try #require(loaded["end_ns"] as? UInt64))
        #expect(start > 0 && end >= start)
    }

    @Test func aFileThatCannotBeCreatedIsAnError() {
        #expect(throws: (any Error).self) { try TraceExport(path: "/nonexistent-directory/trace.jsonl") }
    }

    /// The trace is the owner's alone, and a symbolic link planted at its path is refused, not
    /// followed: the file it points to is neither truncated nor written.
    @Test func theTraceFileIsTheOwnersAndALinkIsNeverFollowed() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("trace-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let previous = umask(0o022)
        defer { umask(previous) }
        let path = directory.appendingPathComponent("trace.jsonl").path
        #expect(FileManager.default.createFile(atPath: path, contents: Data("old trace\n".utf8)))
        chmod(path, 0o644)
        _ = try TraceExport(path: path)
        var status = stat()
        #expect(stat(path, &status) == 0 && status.st_mode & 0o777 == 0o600 && status.st_size == 0)
        // A link to a file that must not be touched.
        let victim = directory.appendingPathComponent("victim").path
        #expect(FileManager.default.createFile(atPath: victim, contents: Data("keep me".utf8)))
        let link = directory.appendingPathComponent("link.jsonl").path
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: victim)
        #expect(throws: (any Error).self) { try TraceExport(path: link) }
        #expect(FileManager.default.contents(atPath: victim) == Data("keep me".utf8))
    }
}
