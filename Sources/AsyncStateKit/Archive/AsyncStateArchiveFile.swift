public import Foundation

/// A file that holds saved data for warm restarts — typically one `Codable` struct of the service's
/// ``AsyncStateArchive``s — written atomically.
///
/// ```swift
/// struct Saved: Codable {
///     var config: AsyncStateArchive<Config>?
///     var profiles: [UserID: AsyncStateArchive<Profile>]
/// }
/// let file = AsyncStateArchiveFile(url: URL(fileURLWithPath: "/var/lib/service/states.json"))
/// try file.save(Saved(config: $config.archive, profiles: $profiles.archive))   // on SIGTERM
/// if let saved = try? file.load(Saved.self) { … restore … }                     // at start
/// ```
///
/// ``save(_:)`` writes a temporary file beside the target, flushes it to disk and renames it over
/// the target: a process killed during a save leaves the previous file whole (and a temporary file,
/// which a later save removes once it is a minute old). ``load(_:)`` returns
/// `nil` when there is no file, and throws ``AsyncStateArchiveError`` for a file it cannot use (a
/// torn or foreign file, an unknown version): start cold then.
///
/// ## Who may read and write it
///
/// The file holds what the service cached — tenants' settings, users' profiles — so it is the
/// service's alone:
/// - A save leaves the file readable and writable by its owner only (mode 0600), whatever the mode
///   of the file it replaces: a file an older release (or an operator) left readable by others
///   becomes the owner's alone at the next save. An operator's narrower mode (0400) stays.
/// - A load reads only a regular file that this process's user owns, no larger than
///   ``maximumSize``, and never follows a symbolic link: a link to a huge file, a FIFO that would
///   block start-up, or a file another user put there is refused with
///   ``AsyncStateArchiveError/refused(path:_:)``, and the service starts cold.
/// - The clean-up of abandoned temporary files removes only regular files of this user, one at a
///   time.
public struct AsyncStateArchiveFile: Sendable {
    /// Where the data is kept.
    public let url: URL
    /// The largest file ``load(_:)`` reads, in bytes; a larger one is refused unread.
    public let maximumSize: Int

    /// ``maximumSize`` unless told otherwise: 64 MiB.
    public static var defaultMaximumSize: Int { 64 << 20 }

    /// A file at `url` (its directory must exist).
    ///
    /// - Parameters:
    ///   - url: Where the data is kept.
    ///   - maximumSize: The largest file ``load(_:)`` reads, in bytes (at least 0).
    public init(url: URL, maximumSize: Int = defaultMaximumSize) {
        self.url = url
        self.maximumSize = max(0, maximumSize)
    }

    /// Saves `contents`, replacing the previous data atomically. Dates are written in ISO 8601 with
    /// milliseconds, so that a save and a load give back every date to the millisecond. The file is
    /// readable by its owner only (mode 0600, or the owner's part of the mode of the file it
    /// replaces when that is narrower): never by anyone else.
    ///
    /// - Throws: The encoder's error, or ``AsyncStateArchiveError/cannotSave(path:errno:)`` naming
    ///   this file and the system's reason (the previous data is then untouched).
    public func save<Contents: Encodable>(_ contents: Contents) throws {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .custom { date, encoder in
            var container = encoder.singleValueContainer()
            try container.encode(date.formatted(Self.dateFormat))
        }
        let data = try encoder.encode(Saving(version: Self.formatVersion, contents: contents))
        let temporary = url.deletingLastPathComponent()
            .appendingPathComponent(".\(url.lastPathComponent).\(UUID().uuidString).tmp")
        let failure = { (code: Int32) in AsyncStateArchiveError.cannotSave(path: url.path, errno: code) }
        // open(2) rather than FileManager.createFile, which itself writes through a temporary file
        // of its own that a killed process would leave behind.
        let descriptor = open(temporary.path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw failure(errno) }
        // The mode exactly, whatever the umask: the owner's alone — the previous file's owner bits
        // when they are narrower, never its group's or others' (an older release wrote 0644).
        let mode = Self.ownRegularFile(at: url.path).map { $0.st_mode & 0o600 } ?? 0o600
        let written = fchmod(descriptor, mode) != 0 ? errno : Self.write(data, to: descriptor)
        let closed = close(descriptor) == 0 ? nil : errno
        if let code = written ?? closed {
            unlink(temporary.path)
            throw failure(code)
        }
        // rename(2) replaces the target atomically: readers see the old file or the new one.
        guard rename(temporary.path, url.path) == 0 else {
            let code = errno
            unlink(temporary.path)
            throw failure(code)
        }
        removeAbandonedTemporaryFiles()
    }

    /// Writes all of `data` to `descriptor` and flushes it to disk; returns the `errno` of a failure.
    private static func write(_ data: Data, to descriptor: Int32) -> Int32? {
        data.withUnsafeBytes { bytes -> Int32? in
            var offset = 0
            while offset < bytes.count {
                let count = Foundation.write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
                if count < 0 {
                    if errno == EINTR { continue }
                    return errno
                }
                offset += count
            }
            return fsync(descriptor) == 0 ? nil : errno
        }
    }

    /// The status of the file at `path` if it is a regular file (not followed through a link) that
    /// this process's user owns; `nil` otherwise.
    private static func ownRegularFile(at path: String) -> stat? {
        var status = stat()
        guard lstat(path, &status) == 0, status.st_mode & S_IFMT == S_IFREG, status.st_uid == geteuid() else {
            return nil
        }
        return status
    }

    /// Removes the temporary files of saves that died before their rename (a process killed
    /// mid-save): those of this target untouched for a minute — a save in progress elsewhere writes
    /// its own continuously — and only regular files of this process's user, one at a time.
    private func removeAbandonedTemporaryFiles() {
        let directory = url.deletingLastPathComponent()
        let prefix = ".\(url.lastPathComponent)."
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory.path) else { return }
        let cutoff = Int(Date().timeIntervalSince1970) - 60
        for name in names where name.hasPrefix(prefix) && name.hasSuffix(".tmp") {
            let path = directory.appendingPathComponent(name).path
            guard let status = Self.ownRegularFile(at: path), status.st_mtim.tv_sec < cutoff else { continue }
            unlink(path)
        }
    }

    /// Loads what ``save(_:)`` saved.
    ///
    /// - Returns: The contents, or `nil` when there is no file.
    /// - Throws: ``AsyncStateArchiveError/refused(path:_:)`` for a file that is a symbolic link, not a
    ///   regular file, another user's, or larger than ``maximumSize`` (none of them is read);
    ///   ``AsyncStateArchiveError/cannotLoad(path:errno:)`` for one that cannot be read;
    ///   ``AsyncStateArchiveError/unknownVersion(found:supported:)`` or
    ///   ``AsyncStateArchiveError/corrupt(_:)`` for one that cannot be used.
    public func load<Contents: Decodable>(_ type: Contents.Type) throws -> Contents? {
        guard let data = try read() else { return nil }
        let decoder = JSONDecoder()
        let header: Header
        do {
            header = try decoder.decode(Header.self, from: data)
        } catch {
            throw AsyncStateArchiveError.corrupt("\(url.lastPathComponent) is not a saved-state file (\(error))")
        }
        guard header.format == Self.formatName else {
            throw AsyncStateArchiveError.corrupt("\(url.lastPathComponent) holds \(header.format), not saved states")
        }
        switch header.version {
        case 1:
            // Version 1 wrote dates in ISO 8601 to the second.
            decoder.dateDecodingStrategy = .iso8601
        case Self.formatVersion:
            decoder.dateDecodingStrategy = .custom { decoder in
                let text = try decoder.singleValueContainer().decode(String.self)
                guard let date = try? Self.dateFormat.parse(text) else {
                    throw DecodingError.dataCorrupted(
                        .init(codingPath: decoder.codingPath, debugDescription: "not an ISO 8601 date: \(text)"))
                }
                return date
            }
        default:
            throw AsyncStateArchiveError.unknownVersion(found: header.version, supported: Self.formatVersion)
        }
        do {
            return try decoder.decode(Loading<Contents>.self, from: data).contents
        } catch {
            throw AsyncStateArchiveError.corrupt("\(url.lastPathComponent): \(error)")
        }
    }

    /// The file's bytes, or `nil` when there is none; refused unread unless it is a regular file of
    /// this process's user no larger than ``maximumSize``. Opened without following a link, and
    /// without blocking (a FIFO would otherwise wait for a writer), then checked on what was opened:
    /// nothing can be swapped in between.
    private func read() throws(AsyncStateArchiveError) -> Data? {
        let path = url.path
        let descriptor = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard descriptor >= 0 else {
            switch errno {
            case ENOENT: return nil
            case ELOOP: throw .refused(path: path, .symbolicLink)
            case let code: throw .cannotLoad(path: path, errno: code)
            }
        }
        defer { close(descriptor) }
        var status = stat()
        guard fstat(descriptor, &status) == 0 else { throw .cannotLoad(path: path, errno: errno) }
        guard status.st_mode & S_IFMT == S_IFREG else { throw .refused(path: path, .notARegularFile) }
        guard status.st_uid == geteuid() else { throw .refused(path: path, .ownedByAnotherUser(uid: status.st_uid)) }
        guard status.st_size <= maximumSize else {
            throw .refused(path: path, .tooLarge(bytes: Int(status.st_size), maximum: maximumSize))
        }
        // Read at most one byte more than allowed: a file that grew since is refused too.
        var data = Data(count: Int(status.st_size) + 1)
        var length = 0
        let failure = data.withUnsafeMutableBytes { buffer -> Int32? in
            while length < buffer.count {
                let count = Foundation.read(descriptor, buffer.baseAddress! + length, buffer.count - length)
                if count < 0 {
                    if errno == EINTR { continue }
                    return errno
                }
                if count == 0 { return nil }
                length += count
                if length > maximumSize { return nil }
            }
            return nil
        }
        if let failure { throw .cannotLoad(path: path, errno: failure) }
        guard length <= maximumSize else {
            throw .refused(path: path, .tooLarge(bytes: length, maximum: maximumSize))
        }
        data.count = length
        return data
    }

    static var formatName: String { "swift-async-state" }
    /// The version this library writes: 2, whose dates keep their milliseconds. It also reads 1,
    /// whose dates were whole seconds.
    static var formatVersion: Int { 2 }
    /// How version 2 writes dates: ISO 8601, in UTC, with milliseconds.
    static var dateFormat: Date.ISO8601FormatStyle { Date.ISO8601FormatStyle(includingFractionalSeconds: true) }

    /// What the file holds, as written.
    private struct Saving<Contents: Encodable>: Encodable {
        var format = AsyncStateArchiveFile.formatName
        var version: Int
        var contents: Contents
    }

    /// What the file holds, as read.
    private struct Loading<Contents: Decodable>: Decodable {
        var contents: Contents
    }

    /// The part of the file read first, to check what it is.
    private struct Header: Decodable {
        var format: String
        var version: Int
    }
}
