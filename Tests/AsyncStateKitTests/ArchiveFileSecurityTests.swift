import AsyncStateKit
import Foundation
import Testing

/// The archive file, tried as another local user or a careless operator would: who may read it,
/// and what a load refuses to read.
extension ArchiveFileTests {
    /// The permission bits of the file at `path`.
    func mode(_ path: String) -> mode_t {
        var status = stat()
        _ = lstat(path, &status)
        return status.st_mode & 0o7777
    }

    @Test func aSaveIsReadableByItsOwnerOnlyWhateverTheModeItReplaces() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let previous = umask(0o022)  // the usual umask, which gave 0644 before
        defer { umask(previous) }
        try file.save(sample)
        #expect(mode(file.url.path) == 0o600)
        // A file an older release wrote readable by others, or one an operator opened up, becomes
        // the owner's alone at the next save.
        for wider: mode_t in [0o644, 0o640, 0o666, 0o777] {
            chmod(file.url.path, wider)
            try file.save(sample)
            #expect(mode(file.url.path) == 0o600, "replacing a file of mode \(String(wider, radix: 8))")
        }
        // A narrower choice stays.
        chmod(file.url.path, 0o400)
        try file.save(sample)
        #expect(mode(file.url.path) == 0o400)
        #expect(try file.load(Saved.self) == sample)
    }

    @Test func aSymbolicLinkIsRefusedUnread() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let elsewhere = directory.appendingPathComponent("elsewhere.json")
        try AsyncStateArchiveFile(url: elsewhere).save(sample)
        try FileManager.default.createSymbolicLink(atPath: file.url.path, withDestinationPath: elsewhere.path)
        #expect(throws: AsyncStateArchiveError.refused(path: file.url.path, .symbolicLink)) {
            try file.load(Saved.self)
        }
    }

    @Test func aFileLargerThanTheMaximumIsRefusedUnread() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        try file.save(sample)
        let size = try #require(try FileManager.default.attributesOfItem(atPath: file.url.path)[.size] as? Int)
        let small = AsyncStateArchiveFile(url: file.url, maximumSize: size - 1)
        #expect(throws: AsyncStateArchiveError.refused(path: file.url.path, .tooLarge(bytes: size, maximum: size - 1)))
        {
            try small.load(Saved.self)
        }
        #expect(try AsyncStateArchiveFile(url: file.url, maximumSize: size).load(Saved.self) == sample)
        #expect(AsyncStateArchiveFile(url: file.url).maximumSize == 64 << 20)
    }

    @Test func aFIFOOrADirectoryIsRefusedWithoutBlocking() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        #expect(mkfifo(file.url.path, 0o600) == 0)
        // Opening a FIFO for reading would wait for a writer: start-up would hang.
        #expect(throws: AsyncStateArchiveError.refused(path: file.url.path, .notARegularFile)) {
            try file.load(Saved.self)
        }
        unlink(file.url.path)
        try FileManager.default.createDirectory(at: file.url, withIntermediateDirectories: false)
        #expect(throws: AsyncStateArchiveError.refused(path: file.url.path, .notARegularFile)) {
            try file.load(Saved.self)
        }
    }

    /// Needs root, to give a file to another user (as CI runs); skipped otherwise.
    @Test(.enabled(if: geteuid() == 0)) func aFileOfAnotherUserIsRefusedAndItsTemporaryFilesAreLeft() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        try file.save(sample)
        let nobody: uid_t = 65_534
        #expect(chown(file.url.path, nobody, nobody) == 0)
        #expect(throws: AsyncStateArchiveError.refused(path: file.url.path, .ownedByAnotherUser(uid: nobody))) {
            try file.load(Saved.self)
        }

        // What a later save's clean-up finds beside the target, all a minute old: only the regular
        // file of this process's user goes.
        let names = ["mine", "theirs", "directory", "link"].map { ".states.json.\($0).tmp" }
        let paths = names.map { directory.appendingPathComponent($0).path }
        try Data("x".utf8).write(to: URL(fileURLWithPath: paths[0]))
        try Data("x".utf8).write(to: URL(fileURLWithPath: paths[1]))
        #expect(chown(paths[1], nobody, nobody) == 0)
        try FileManager.default.createDirectory(atPath: paths[2], withIntermediateDirectories: false)
        try Data("keep".utf8).write(to: directory.appendingPathComponent("target"))
        try FileManager.default.createSymbolicLink(
            atPath: paths[3], withDestinationPath: directory.appendingPathComponent("target").path)
        for path in paths {
            var times = [timeval(tv_sec: time(nil) - 120, tv_usec: 0), timeval(tv_sec: time(nil) - 120, tv_usec: 0)]
            #expect(lutimes(path, &times) == 0)
        }
        try AsyncStateArchiveFile(url: directory.appendingPathComponent("other.json")).save(sample)
        try AsyncStateArchiveFile(url: file.url.deletingLastPathComponent().appendingPathComponent("states.json"))
            .save(sample)
        let left = Set(try FileManager.default.contentsOfDirectory(atPath: directory.path))
        #expect(!left.contains(names[0]))
        #expect(left.isSuperset(of: names.dropFirst()))
        #expect(try Data(contentsOf: directory.appendingPathComponent("target")) == Data("keep".utf8))
    }
}
