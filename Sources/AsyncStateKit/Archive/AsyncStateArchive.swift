public import Foundation

/// A state's data saved for a warm restart: what a restarted process loads so that it starts with
/// data instead of stampeding its sources.
///
/// ``AsyncState/archive`` makes one (`nil` while the state has no value); ``AsyncState/restore(_:)``
/// loads one into a new state, where it counts as stale, expired for every reader: served at once
/// under stale-while-revalidate or refresh ahead (while one refetch runs), refetched before it is
/// served otherwise. An archive is `Codable` when its value is; ``AsyncStateArchiveFile`` keeps
/// archives on disk.
public struct AsyncStateArchive<Value: Sendable>: Sendable {
    /// The version of this format that this library writes and reads.
    public static var currentFormatVersion: Int { 1 }

    /// The format's version, checked by ``AsyncState/restore(_:)``.
    public var formatVersion: Int
    /// The value.
    public var value: Value
    /// The phase it was saved in: ``AsyncPhase/Kind/success`` or ``AsyncPhase/Kind/empty``.
    public var phase: AsyncPhase.Kind
    /// The wall date of the success that fetched it, if one did (a value that was only `set` has
    /// none).
    public var lastSuccess: Date?

    /// Creates an archive in the current format.
    public init(value: Value, phase: AsyncPhase.Kind, lastSuccess: Date?) {
        formatVersion = Self.currentFormatVersion
        self.value = value
        self.phase = phase
        self.lastSuccess = lastSuccess
    }

    /// Checks that this archive can be restored: its version is known, its phase is a success.
    func validated() throws(AsyncStateArchiveError) -> Self {
        guard formatVersion == Self.currentFormatVersion else {
            throw .unknownVersion(found: formatVersion, supported: Self.currentFormatVersion)
        }
        guard phase == .success || phase == .empty else {
            throw .corrupt("an archive's phase is success or empty, not \(phase)")
        }
        return self
    }
}

extension AsyncStateArchive: Codable where Value: Codable {}
extension AsyncStateArchive: Equatable where Value: Equatable {}

extension AsyncPhase.Kind: Codable {}

/// Why saved data could not be used, or saved. Each means a cold start for what it concerns, never a
/// crash.
public enum AsyncStateArchiveError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The data was written by a version of this format that this library does not know.
    case unknownVersion(found: Int, supported: Int)
    /// The data is not an archive: truncated, damaged, or written by something else.
    case corrupt(String)
    /// The file system refused to save `path`: `errno` is the system's error number (its reason,
    /// such as "Not a directory", is in ``description``).
    case cannotSave(path: String, errno: Int32)

    /// A readable explanation.
    public var description: String {
        switch self {
        case .unknownVersion(let found, let supported):
            return "saved data of format version \(found), this library reads versions up to \(supported)"
        case .corrupt(let reason):
            return "saved data is corrupt: \(reason)"
        case .cannotSave(let path, let code):
            return "cannot save \(path): \(String(cString: strerror(code)))"
        }
    }
}

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
public struct AsyncStateArchiveFile: Sendable {
    /// Where the data is kept.
    public let url: URL

    /// A file at `url` (its directory must exist).
    public init(url: URL) {
        self.url = url
    }

    /// Saves `contents`, replacing the previous data atomically. Dates are written in ISO 8601 with
    /// milliseconds, so that a save and a load give back every date to the millisecond.
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
        let descriptor = open(temporary.path, O_WRONLY | O_CREAT | O_EXCL, 0o644)
        guard descriptor >= 0 else { throw failure(errno) }
        let written = data.withUnsafeBytes { bytes -> Int32? in
            var offset = 0
            while offset < bytes.count {
                let count = write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
                if count < 0 {
                    if errno == EINTR { continue }
                    return errno
                }
                offset += count
            }
            return fsync(descriptor) == 0 ? nil : errno
        }
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

    /// Removes the temporary files of saves that died before their rename (a process killed
    /// mid-save): those of this target untouched for a minute — a save in progress elsewhere writes
    /// its own continuously.
    private func removeAbandonedTemporaryFiles() {
        let directory = url.deletingLastPathComponent()
        let prefix = ".\(url.lastPathComponent)."
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory.path) else { return }
        let cutoff = Date().addingTimeInterval(-60)
        for name in names where name.hasPrefix(prefix) && name.hasSuffix(".tmp") {
            let path = directory.appendingPathComponent(name).path
            let modified = (try? FileManager.default.attributesOfItem(atPath: path))?[.modificationDate] as? Date
            if let modified, modified < cutoff { try? FileManager.default.removeItem(atPath: path) }
        }
    }

    /// Loads what ``save(_:)`` saved.
    ///
    /// - Returns: The contents, or `nil` when there is no file.
    /// - Throws: ``AsyncStateArchiveError/unknownVersion(found:supported:)`` or
    ///   ``AsyncStateArchiveError/corrupt(_:)`` for a file that cannot be used; the file system's
    ///   error for one that cannot be read.
    public func load<Contents: Decodable>(_ type: Contents.Type) throws -> Contents? {
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        let data = try Data(contentsOf: url)
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
