import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// Warm restarts keep what they saved: the dates to the millisecond, and a failed save says which
/// file and why (the file's fixture is ``ArchiveFileTests``'s).
extension ArchiveFileTests {
    @Test func aSaveAndALoadKeepEveryDateToTheMillisecond() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let dates = [
            Date(timeIntervalSinceReferenceDate: 600.25), Date(timeIntervalSinceReferenceDate: 1_000_000.999),
            Date(timeIntervalSince1970: 1_700_000_000.001), Date(timeIntervalSinceReferenceDate: -1.5),
        ]
        let saved = Saved(
            config: AsyncStateArchive(value: "flags", phase: .success, lastSuccess: dates[0]),
            profiles: Dictionary(
                uniqueKeysWithValues: dates.enumerated().map {
                    ($0.offset, AsyncStateArchive(value: "user", phase: .success, lastSuccess: $0.element))
                }))
        try file.save(saved)
        let loaded = try #require(try file.load(Saved.self))
        #expect(loaded.config?.lastSuccess == dates[0])  // exactly: a quarter second is a whole millisecond
        for (index, date) in dates.enumerated() {
            let back = try #require(loaded.profiles[index]?.lastSuccess)
            #expect(abs(back.timeIntervalSince(date)) < 0.001, "\(date) came back as \(back)")
        }
        let text = try String(contentsOf: file.url, encoding: .utf8)
        #expect(text.contains(#""version":2"#))
        #expect(text.contains("2001-01-01T00:10:00.250Z"))
    }

    @Test func aFileOfVersionOneStillLoads() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let version1 = #"""
            {"format":"swift-async-state","version":1,"contents":{"config":{"formatVersion":1,"value":"flags",\#
            "phase":"success","lastSuccess":"2001-01-01T00:10:00Z"},"profiles":{"7":{"formatVersion":1,\#
            "value":"user 7","phase":"empty"}}}}
            """#
        try Data(version1.utf8).write(to: file.url)
        let loaded = try #require(try file.load(Saved.self))
        #expect(loaded.config?.lastSuccess == Date(timeIntervalSinceReferenceDate: 600))
        #expect(loaded.profiles == [7: AsyncStateArchive(value: "user 7", phase: .empty, lastSuccess: nil)])
    }

    @Test func aFailedSaveNamesTheFileAndTheSystemsReasonAndKeepsThePreviousFile() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let saved = Saved(config: AsyncStateArchive(value: "v1", phase: .success, lastSuccess: nil), profiles: [:])
        try file.save(saved)
        // A "directory" that is a regular file.
        let blocker = directory.appendingPathComponent("blocker")
        try Data("x".utf8).write(to: blocker)
        let target = blocker.appendingPathComponent("states.json")
        let misplaced = AsyncStateArchiveFile(url: target)
        #expect(throws: AsyncStateArchiveError.cannotSave(path: target.path, errno: ENOTDIR)) {
            try misplaced.save(saved)
        }
        do {
            try misplaced.save(saved)
        } catch {
            #expect("\(error)" == "cannot save \(target.path): Not a directory")
        }
        // A directory that does not exist.
        let missing = directory.appendingPathComponent("missing/states.json")
        #expect(throws: AsyncStateArchiveError.cannotSave(path: missing.path, errno: ENOENT)) {
            try AsyncStateArchiveFile(url: missing).save(saved)
        }
        // A target that cannot be replaced (a directory in its place): the rename fails, and the
        // temporary file is removed.
        let occupied = directory.appendingPathComponent("occupied")
        try FileManager.default.createDirectory(
            at: occupied.appendingPathComponent("inside"), withIntermediateDirectories: true)
        #expect(throws: AsyncStateArchiveError.self) { try AsyncStateArchiveFile(url: occupied).save(saved) }
        // The good file is untouched, and no temporary file is left.
        #expect(try file.load(Saved.self) == saved)
        #expect(
            try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted()
                == ["blocker", "occupied", "states.json"])
    }

}

/// Warm restarts keep the phase they saved.
@Suite struct WarmRestartTests {
    @Test func theArchiveSaysWhatThePhaseSaysHoweverTheEntryIsStored() async throws {
        let clock = VirtualClock()
        // An archive saved as empty, restored under an emptiness test that changed since.
        let saved = AsyncStateArchive(value: 5, phase: .empty, lastSuccess: nil)
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock, isEmpty: { $0 == 0 })
        try await state.restore(saved)
        #expect(state.phase.name == "empty")
        #expect(state.archive?.phase == .empty)
        // While a fetch loads, and after it fails, the archive still says what the data was.
        let failing = clock.task {
            await state.refresh {
                try await clock.sleep(for: .seconds(1))
                throw SourceDown()
            }
        }
        await clock.advance(by: .zero)
        #expect(state.archive?.phase == .empty)
        await clock.advance(by: .seconds(1))
        _ = await failing.result
        #expect(state.phase.name == "failure")
        #expect(state.archive?.phase == .empty)

        let family = AsyncStateFamily<Int, Int>(clock: clock, isEmpty: { $0 == 0 })
        try family.restore([1: saved])
        #expect(family.archive[1]?.phase == .empty)  // compact
        let subscriber = family.updates(for: 1)  // live
        #expect(family.snapshot(for: 1)?.phase.name == "empty")
        #expect(family.archive[1]?.phase == .empty)
        withExtendedLifetime(subscriber) {}
    }
}
