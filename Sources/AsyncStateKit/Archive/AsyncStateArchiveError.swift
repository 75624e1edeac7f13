import Foundation

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
    /// The file system refused to read `path`: `errno` is the system's error number.
    case cannotLoad(path: String, errno: Int32)
    /// The file at `path` was not read, for the reason given: a file this process did not write
    /// (see ``AsyncStateArchiveFile``).
    case refused(path: String, Refusal)

    /// Why ``AsyncStateArchiveFile/load(_:)`` refused a file without reading it.
    public enum Refusal: Sendable, Equatable, CustomStringConvertible {
        /// It is a symbolic link (which may point anywhere: another file, a device).
        case symbolicLink
        /// It is not a regular file (a directory, a FIFO that would block, a device).
        case notARegularFile
        /// It belongs to another user than this process's (`uid`): someone else could have written it.
        case ownedByAnotherUser(uid: UInt32)
        /// It is larger than the file's maximum size.
        case tooLarge(bytes: Int, maximum: Int)

        /// A readable explanation.
        public var description: String {
            switch self {
            case .symbolicLink: return "it is a symbolic link"
            case .notARegularFile: return "it is not a regular file"
            case .ownedByAnotherUser(let uid): return "it belongs to user \(uid), not to this process's"
            case .tooLarge(let bytes, let maximum): return "it holds \(bytes) bytes, more than the \(maximum) allowed"
            }
        }
    }

    /// A readable explanation.
    public var description: String {
        switch self {
        case .unknownVersion(let found, let supported):
            return "saved data of format version \(found), this library reads versions up to \(supported)"
        case .corrupt(let reason):
            return "saved data is corrupt: \(reason)"
        case .cannotSave(let path, let code):
            return "cannot save \(path): \(String(cString: strerror(code)))"
        case .cannotLoad(let path, let code):
            return "cannot load \(path): \(String(cString: strerror(code)))"
        case .refused(let path, let refusal):
            return "not loading \(path): \(refusal)"
        }
    }
}
