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
    @usableFromInline func validated() throws(AsyncStateArchiveError) -> Self {
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
