import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// Warm restarts: a state's data saved by one process and loaded by the next, as stale data.
@Suite struct ArchiveTests {
    /// A round trip through JSON, as a file would make it.
    func roundTrip<Value: Codable>(_ archive: AsyncStateArchive<Value>) throws -> AsyncStateArchive<Value> {
        try JSONDecoder().decode(AsyncStateArchive<Value>.self, from: JSONEncoder().encode(archive))
    }

    @Test func aRestoredValueIsStaleAndRefetchedBeforeItIsServed() async throws {
        let clock = VirtualClock()
        let before = AsyncState<[Int]>(wrappedValue: [], clock: clock)
        #expect(before.archive == nil)
        _ = try await before.value { [1, 2] }
        let saved = try roundTrip(try #require(before.archive))
        #expect(saved == AsyncStateArchive(value: [1, 2], phase: .success, lastSuccess: clock.date))

        // The next process: a new state, a later date.
        await clock.advance(by: .seconds(3600))
        let after = AsyncState<[Int]>(wrappedValue: [], clock: clock)
        #expect(try await after.restore(saved))
        #expect(after.wrappedValue == [1, 2])
        #expect(after.phase.lastUpdated == saved.lastSuccess)
        #expect(after.snapshot.isExpired && after.snapshot.hasValue)
        let source = Source<[Int]>()
        let caller = clock.task { try await after.value(source.operation(on: clock, value: [3])) }
        await clock.advance(by: .seconds(1))
        #expect(try await caller.value == [3])
        #expect(source.runs == 1)
    }

    @Test func underStaleWhileRevalidateTheRestoredValueIsServedAtOnce() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(10), clock: clock, staleWhileRevalidate: true)
        try await state.restore(AsyncStateArchive(value: 7, phase: .success, lastSuccess: clock.date))
        let source = Source<Int>()
        #expect(try await state.value(source.operation(on: clock, value: 8)) == 7)
        #expect(state.phase.isLoading)
        await clock.advance(by: .seconds(1))
        #expect(state.wrappedValue == 8 && source.runs == 1)
    }

    @Test func underRefreshAheadTheRestoredValueIsServedAtOnceWhileOneRefetchRuns() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(10), clock: clock, refreshAfter: .seconds(8))
        try await state.restore(AsyncStateArchive(value: 7, phase: .success, lastSuccess: nil))
        let source = Source<Int>()
        let load = source.operation(on: clock, value: 8)
        #expect(try await state.value(load) == 7)
        #expect(try await state.value(load) == 7)
        await clock.settle()
        #expect(source.runs == 1)
        await clock.advance(by: .seconds(1))
        #expect(state.wrappedValue == 8 && !state.snapshot.isExpired)
    }

    @Test func newerDataWinsOverARestore() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        await state.set(5)
        #expect(try await !state.restore(AsyncStateArchive(value: 1, phase: .success, lastSuccess: nil)))
        #expect(state.wrappedValue == 5)
        // A fetch in flight wins too.
        let fresh = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let caller = clock.task { try await fresh.value(Source<Int>().operation(on: clock, value: 9)) }
        await clock.settle()
        #expect(try await !fresh.restore(AsyncStateArchive(value: 1, phase: .success, lastSuccess: nil)))
        await clock.advance(by: .seconds(1))
        #expect(try await caller.value == 9)
    }

    @Test func anEmptyValueIsRestoredAsEmpty() async throws {
        let state = AsyncState<[Int]>(wrappedValue: [9], clock: VirtualClock())
        _ = try await state.value { [] }
        let saved = try #require(state.archive)
        #expect(saved.phase == .empty)
        let restored = AsyncState<[Int]>(wrappedValue: [9], clock: VirtualClock())
        try await restored.restore(saved)
        #expect(restored.phase.kind == .empty && restored.wrappedValue == [])
    }

    @Test func anArchiveOfAnUnknownVersionOrPhaseIsRefusedAndChangesNothing() async throws {
        let state = AsyncState<Int>(wrappedValue: 0, clock: VirtualClock())
        var future = AsyncStateArchive(value: 1, phase: .success, lastSuccess: nil)
        future.formatVersion = 2
        await #expect(throws: AsyncStateArchiveError.unknownVersion(found: 2, supported: 1)) {
            try await state.restore(future)
        }
        let loading = AsyncStateArchive(value: 1, phase: .loading, lastSuccess: nil)
        await #expect(throws: AsyncStateArchiveError.self) { try await state.restore(loading) }
        #expect(state.phase.kind == .initial && state.wrappedValue == 0)
    }

    @Test func aFamilySavesEveryEntryWithAValueAndRestoresWithinItsCapacity() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<Int, String>(clock: clock)
        for key in 1...3 { _ = try await family.value(for: key) { "v\($0)" } }
        _ = try? await family.value(for: 4) { _ in throw SourceDown(code: 1) }  // no value: not saved
        let saved = family.archive
        #expect(saved.keys.sorted() == [1, 2, 3])
        #expect(saved[2] == AsyncStateArchive(value: "v2", phase: .success, lastSuccess: clock.date))
        let decoded = try JSONDecoder().decode(
            [Int: AsyncStateArchive<String>].self, from: JSONEncoder().encode(saved))

        let next = AsyncStateFamily<Int, String>(capacity: 2, clock: clock)
        next.set("newer", for: 1)
        #expect(try next.restore(decoded) == 2)  // key 1 keeps its newer value
        #expect(next.count == 2)
        #expect(next[1] == "newer")
        let restored = try #require(next.snapshots.first { $0.key != 1 })
        #expect(restored.value.isExpired && restored.value.hasValue)

        var bad = decoded
        bad[9] = AsyncStateArchive(value: "x", phase: .failure, lastSuccess: nil)
        let untouched = AsyncStateFamily<Int, String>(clock: clock)
        #expect(throws: AsyncStateArchiveError.self) { try untouched.restore(bad) }
        #expect(untouched.count == 0)
    }
}

/// The file that keeps archives between processes.
@Suite struct ArchiveFileTests {
    struct Saved: Codable, Equatable {
        var config: AsyncStateArchive<String>?
        var profiles: [Int: AsyncStateArchive<String>]
    }

    let directory: URL
    let file: AsyncStateArchiveFile

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("archive-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        file = AsyncStateArchiveFile(url: directory.appendingPathComponent("states.json"))
    }

    var sample: Saved {
        Saved(
            config: AsyncStateArchive(value: "flags", phase: .success, lastSuccess: Date(timeIntervalSince1970: 1e9)),
            profiles: [7: AsyncStateArchive(value: "user 7", phase: .success, lastSuccess: nil)])
    }

    @Test func savesAndLoadsAndAMissingFileIsAColdStart() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        #expect(try file.load(Saved.self) == nil)
        try file.save(sample)
        #expect(try file.load(Saved.self) == sample)
        var second = sample
        second.config = nil
        try file.save(second)
        #expect(try file.load(Saved.self) == second)
        // No temporary file is left beside it.
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["states.json"])
    }

    @Test(arguments: [
        ("", "empty"), ("{\"format\":\"swift-async-state\",\"version\":1,\"contents\":{\"prof", "torn"),
        ("\u{0}\u{1}garbage", "binary"), ("{\"format\":\"something-else\",\"version\":1}", "foreign"),
        ("{\"format\":\"swift-async-state\",\"version\":1,\"contents\":{\"profiles\":7}}", "wrong shape"),
    ])
    func aFileThatCannotBeUsedIsAClearErrorNeverACrash(contents: String, label: String) throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        try Data(contents.utf8).write(to: file.url)
        #expect(throws: AsyncStateArchiveError.self, "\(label)") { try file.load(Saved.self) }
        do {
            _ = try file.load(Saved.self)
        } catch let error as AsyncStateArchiveError {
            guard case .corrupt = error else {
                Issue.record("\(label): \(error)")
                return
            }
        }
    }

    @Test func aFileOfAnUnknownVersionSaysSo() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        try Data(#"{"format":"swift-async-state","version":9,"contents":{}}"#.utf8).write(to: file.url)
        #expect(throws: AsyncStateArchiveError.unknownVersion(found: 9, supported: 2)) { try file.load(Saved.self) }
    }

    @Test func aWriteThatDiesBeforeItsRenameLeavesThePreviousFileWhole() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        try file.save(sample)
        // What a writer killed mid-write leaves: a partial temporary file beside the target.
        let torn = directory.appendingPathComponent(".states.json.dead-writer.tmp")
        try Data(#"{"format":"swift-async-state","version":1,"contents":{"pro"#.utf8).write(to: torn)
        #expect(try file.load(Saved.self) == sample)
        // A save into a directory that is gone fails and changes nothing that exists.
        let elsewhere = AsyncStateArchiveFile(url: directory.appendingPathComponent("missing/states.json"))
        #expect(throws: (any Error).self) { try elsewhere.save(sample) }
        #expect(try file.load(Saved.self) == sample)
    }
}

/// A writer killed with SIGKILL at a random moment of a save: the file is always a whole save.
@Suite struct ArchiveCrashTests {
    static let writerVariable = "ASYNCSTATE_ARCHIVE_WRITER"

    struct Payload: Codable {
        var generation: Int
        var text: String
    }

    /// The body of the writer process that the test below starts and kills: saves a 200 KB payload,
    /// generation after generation, until killed, from the generation after the one saved last (so
    /// that each round needs one save to be new, not as many as all the rounds before made: under
    /// ThreadSanitizer on a loaded machine, catching up took longer than the wait). Enabled only in
    /// that process.
    @Test(.enabled(if: ProcessInfo.processInfo.environment[writerVariable] != nil))
    func writerProcess() throws {
        let file = AsyncStateArchiveFile(
            url: URL(fileURLWithPath: ProcessInfo.processInfo.environment[Self.writerVariable]!))
        let text = String(repeating: "x", count: 200_000)
        let last = (try? file.load(Payload.self))??.generation ?? 0
        for generation in (last + 1)... { try file.save(Payload(generation: generation, text: text)) }
    }

    /// Async, and waiting with `Task.sleep`: a synchronous test that blocks its thread with
    /// `Thread.sleep` for seconds holds one of the cooperative pool's threads (two on a 2-core
    /// machine), and starved the tests running beside it under ThreadSanitizer.
    @Test func aWriterKilledDuringASaveLeavesTheLastWholeSave() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("crash-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let file = AsyncStateArchiveFile(url: directory.appendingPathComponent("states.json"))
        let executable = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        var lastGeneration = 0
        for round in 0..<8 {
            let writer = Process()
            writer.executableURL = URL(fileURLWithPath: executable)
            writer.arguments = ["--testing-library", "swift-testing", "--filter", "writerProcess"]
            writer.environment = ProcessInfo.processInfo.environment.merging([Self.writerVariable: file.url.path]) {
                $1
            }
            writer.standardOutput = FileHandle.nullDevice
            writer.standardError = FileHandle.nullDevice
            try writer.run()
            // Real time, deliberately: a real process, killed while it writes.
            let deadline = ContinuousClock.now + .seconds(30)
            while ContinuousClock.now < deadline,
                (try? file.load(Payload.self))?.map({ $0.generation > lastGeneration }) != true
            {
                try await Task.sleep(for: .milliseconds(5))
            }
            try await Task.sleep(for: .milliseconds(Int.random(in: 1...30)))
            kill(writer.processIdentifier, SIGKILL)
            writer.waitUntilExit()
            let saved = try #require(try file.load(Payload.self), "round \(round)")
            #expect(saved.generation > lastGeneration && saved.text.count == 200_000, "round \(round)")
            lastGeneration = saved.generation
        }
        #expect(lastGeneration > 8)
        // The writers left their temporary files; a save removes those a minute old.
        let temporaries = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter {
            $0.hasSuffix(".tmp")
        }
        for name in temporaries {
            try FileManager.default.setAttributes(
                [.modificationDate: Date().addingTimeInterval(-120)],
                ofItemAtPath: directory.appendingPathComponent(name).path)
        }
        try file.save(Payload(generation: 0, text: ""))
        let left = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        #expect(left == ["states.json"], "backdated \(temporaries)")
    }
}
