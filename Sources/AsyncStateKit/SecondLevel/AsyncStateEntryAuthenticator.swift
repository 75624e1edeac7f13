import Foundation

/// Seals the entries a family writes to its second level with the fleet's secret, and checks the
/// seal of every entry it reads (``AsyncStateSecondLevelOptions/authenticator``).
///
/// Anyone who can write the second level's store — its database login — could otherwise plant an
/// entry every replica serves. With an authenticator, each entry's payload ends with a seal (a MAC)
/// over the key (namespace included), the version, both dates (to the millisecond) and the encoded
/// value; an entry whose seal is missing or wrong is garbage: never served nor a fail-safe fallback,
/// counted as ``AsyncStateSecondLevelEvent/undecodable(error:)`` (with
/// ``AsyncStateSecondLevelUnauthenticatedEntry``), and replaced by the key's next load. The version
/// being sealed, a planted entry cannot take a legitimate entry's value to a newer version.
///
/// What a seal cannot stop: someone with the store's login can delete entries, or put back an older
/// sealed entry of the same key (its own version and dates) — which a replica that has heard of a
/// newer version refuses, which stays fresh no longer than it did when it was written, and which a
/// replica that has not may take as a fail-safe fallback while it is younger than `maxStaleAge`.
///
/// The library has no cryptography of its own: implement it with HMAC-SHA256 (swift-crypto's
/// `HMAC<SHA256>`, as the example service does), under a key used for nothing else (derive it from
/// the fleet's secret, as the example derives one from the invalidations' secret). To rotate the
/// secret, seal with the new key and accept a seal by any key the fleet may still use.
public protocol AsyncStateEntryAuthenticator: Sendable {
    /// The seal of `content`: 1 to 255 bytes (HMAC-SHA256's are 32). An entry whose seal is of
    /// another length is not written.
    func seal(_ content: [UInt8]) -> [UInt8]
    /// Whether `seal` is a valid seal of `content`. Compare in constant time.
    func isValid(_ seal: [UInt8], for content: [UInt8]) -> Bool
}

/// A second-level entry whose seal is missing or does not match its key, version, dates and payload
/// (see ``AsyncStateEntryAuthenticator``): written by someone without the fleet's secret, or altered
/// since. Treated as garbage.
public struct AsyncStateSecondLevelUnauthenticatedEntry: Error, Sendable, Hashable, CustomStringConvertible {
    /// The second level's key of the entry.
    public var key: String
    /// The version the entry claims.
    public var version: UInt64

    public var description: String {
        "the second-level entry of \(key) (version \(version)) has no valid seal: not written by a replica of this fleet"
    }
}

/// The one place an entry is sealed and opened: what the seal covers and where it is kept.
///
/// A sealed payload is the codec's envelope, the seal, and the seal's length in one byte. The
/// content sealed is a domain tag, then the key's length and bytes, the version, both dates in whole
/// milliseconds since 1970 (64-bit, big-endian), and the envelope. A sealed entry's dates are
/// written on whole milliseconds, so a store that keeps dates to the millisecond or better keeps the
/// seal valid.
enum EntrySeal {
    /// Tells an entry's content from anything else the same key might sign.
    private static var domain: [UInt8] { Array("async-state entry 1\u{0}".utf8) }

    /// `date` down to its millisecond, where a sealed entry's dates are kept: never later than
    /// `date`, so that a replica's own value — dated as its entry is (a load), or later (a write
    /// through the invalidator, dated as it lands) — is never older than its entry, whose version
    /// it knows: it does not take its own value back after an invalidation.
    static func rounded(_ date: Date) -> Date {
        let milliseconds = (date.timeIntervalSince1970 * 1000).rounded(.down)
        guard milliseconds.isFinite, abs(milliseconds) < 9e18 else { return date }
        return Date(timeIntervalSince1970: milliseconds / 1000)
    }

    /// The bytes a seal covers.
    static func content(key: String, version: UInt64, succeededAt: Date, freshUntil: Date, envelope: ArraySlice<UInt8>)
        -> [UInt8]
    {
        var content = domain
        let keyBytes = Array(key.utf8)
        content.reserveCapacity(content.count + 4 + keyBytes.count + 24 + envelope.count)
        append(UInt64(keyBytes.count), bytes: 4, to: &content)
        content.append(contentsOf: keyBytes)
        append(version, bytes: 8, to: &content)
        append(UInt64(bitPattern: succeededAt.millisecondsSince1970), bytes: 8, to: &content)
        append(UInt64(bitPattern: freshUntil.millisecondsSince1970), bytes: 8, to: &content)
        content.append(contentsOf: envelope)
        return content
    }

    private static func append(_ value: UInt64, bytes: Int, to content: inout [UInt8]) {
        for shift in stride(from: (bytes - 1) * 8, through: 0, by: -8) {
            content.append(UInt8(truncatingIfNeeded: value >> shift))
        }
    }

    /// The entry a replica writes for `key`: `envelope` (a codec's), and — with an authenticator —
    /// sealed, its dates down to the millisecond (so that a store that keeps them finer keeps the
    /// seal). `nil` when the authenticator's seal is not 1 to 255 bytes long: nothing is written
    /// (the entry could never be opened), as for a value that does not encode.
    static func entry(
        _ envelope: [UInt8], key: String, version: UInt64, succeededAt: Date, freshUntil: Date,
        authenticator: (any AsyncStateEntryAuthenticator)?
    ) -> AsyncStateStoredEntry? {
        var (succeededAt, freshUntil) = (succeededAt, freshUntil)
        var payload = envelope
        if let authenticator {
            (succeededAt, freshUntil) = (rounded(succeededAt), rounded(freshUntil))
            let seal = authenticator.seal(
                content(
                    key: key, version: version, succeededAt: succeededAt, freshUntil: freshUntil,
                    envelope: envelope[...]))
            guard (1...255).contains(seal.count) else { return nil }
            payload.append(contentsOf: seal)
            payload.append(UInt8(seal.count))
        }
        return AsyncStateStoredEntry(
            payload: payload, succeededAt: succeededAt, freshUntil: freshUntil, version: version)
    }

    /// The envelope of `entry`, read for `key`: its payload as it is without an authenticator; with
    /// one, the payload less its seal, if the seal is valid.
    ///
    /// - Throws: ``AsyncStateSecondLevelUnauthenticatedEntry`` when the seal is missing or wrong.
    static func envelope(
        of entry: AsyncStateStoredEntry, key: String, authenticator: (any AsyncStateEntryAuthenticator)?
    ) throws -> [UInt8] {
        guard let authenticator else { return entry.payload }
        let payload = entry.payload
        let refused = AsyncStateSecondLevelUnauthenticatedEntry(key: key, version: entry.version)
        guard let length = payload.last.map(Int.init), length > 0, payload.count > length else { throw refused }
        let sealStart = payload.count - 1 - length
        let envelope = payload[..<sealStart]
        let valid = authenticator.isValid(
            Array(payload[sealStart..<(payload.count - 1)]),
            for: content(
                key: key, version: entry.version, succeededAt: entry.succeededAt, freshUntil: entry.freshUntil,
                envelope: envelope))
        guard valid else { throw refused }
        return Array(envelope)
    }
}
