import AsyncStateKit
import Crypto
import Foundation

/// Signs and checks invalidations with HMAC-SHA256 under a secret every replica of the service
/// shares: PostgreSQL has no permission on `NOTIFY`, so anyone who can connect to the database can
/// send on the channel, and without a signature could make every replica drop its data again and
/// again. Give it to the `AsyncStateInvalidator`; it signs what it publishes and drops what fails.
///
/// ```swift
/// let invalidator = AsyncStateInvalidator(bus: bus, authenticator: try HMACAuthenticator(secret: secret))
/// ```
///
/// The signature covers the message's topic, key, tag, version and metadata, who sent it and when
/// (`AsyncStateInvalidation.signedContent`): the invalidator refuses a message sent again (a replay)
/// or sent outside its replay window.
///
/// ## Rotating the secret
///
/// Give it a list: it signs with the first secret and accepts a signature by any of them. A fleet
/// changes its secret without downtime in three rolling restarts: every replica gets `[old, new]`
/// (it accepts both, still signs with the old), then `[new, old]` (it signs with the new one, which
/// every replica now accepts), then `[new]`.
///
/// ## Second-level entries
///
/// It seals the entries a family writes to its second level too (give it as
/// `AsyncStateSecondLevelOptions`' `authenticator`): an entry planted by anyone with the database
/// login but not the secret is never served. Entries are sealed under a key derived from each
/// secret for that use alone, so that no signature of an invalidation is ever a valid seal, or the
/// reverse; rotation works as for invalidations.
public struct HMACAuthenticator: AsyncStateInvalidationAuthenticator, AsyncStateEntryAuthenticator {
    private let keys: [SymmetricKey]
    /// The keys entries are sealed with: derived from each secret by HKDF-SHA256 with a label of
    /// their own.
    private let entryKeys: [SymmetricKey]

    /// The shortest secret accepted, in UTF-8 bytes: 32, an HMAC-SHA256 key's length.
    public static var minimumSecretBytes: Int { 32 }

    /// A secret the authenticator refuses: too short to resist guessing.
    public struct SecretTooShort: Error, Equatable, CustomStringConvertible {
        /// Its length in UTF-8 bytes (never the secret itself: errors are logged).
        public var bytes: Int

        public var description: String {
            bytes == 0
                ? "no invalidation secret: at least one of \(HMACAuthenticator.minimumSecretBytes) bytes is needed"
                : "an invalidation secret of \(bytes) bytes: at least \(HMACAuthenticator.minimumSecretBytes) are needed"
        }
    }

    /// An authenticator with `secret` as the HMAC key.
    ///
    /// - Throws: ``SecretTooShort`` for a secret under ``minimumSecretBytes``.
    public init(secret: String) throws(SecretTooShort) {
        try self.init(secrets: [secret])
    }

    /// An authenticator that signs with the first of `secrets` and accepts a signature by any.
    ///
    /// - Throws: ``SecretTooShort`` for an empty list, or a secret under ``minimumSecretBytes``.
    public init(secrets: [String]) throws(SecretTooShort) {
        guard !secrets.isEmpty else { throw SecretTooShort(bytes: 0) }
        for secret in secrets where secret.utf8.count < Self.minimumSecretBytes {
            throw SecretTooShort(bytes: secret.utf8.count)
        }
        keys = secrets.map { SymmetricKey(data: Data($0.utf8)) }
        // HKDF with a label of its own: the entries' key is no signature a message could carry.
        entryKeys = keys.map { key in
            HKDF<SHA256>.deriveKey(
                inputKeyMaterial: key, info: Data("async-state second-level entries".utf8), outputByteCount: 32)
        }
    }

    public func signature(for content: String) -> String {
        Data(HMAC<SHA256>.authenticationCode(for: Data(content.utf8), using: keys[0])).base64EncodedString()
    }

    /// Compares in constant time (`HMAC.isValidAuthenticationCode`) with each secret in turn.
    public func isValid(_ signature: String, for content: String) -> Bool {
        guard let code = Data(base64Encoded: signature) else { return false }
        return Self.isValid(code, for: Data(content.utf8), under: keys)
    }

    /// An entry's seal: HMAC-SHA256 under the first secret's entry key (32 bytes).
    public func seal(_ content: [UInt8]) -> [UInt8] {
        Array(HMAC<SHA256>.authenticationCode(for: content, using: entryKeys[0]))
    }

    /// Compares in constant time with each secret's entry key in turn.
    public func isValid(_ seal: [UInt8], for content: [UInt8]) -> Bool {
        Self.isValid(Data(seal), for: Data(content), under: entryKeys)
    }

    /// Whether `code` authenticates `data` under any of `keys`. Every key is tried, whichever
    /// matches: the time taken does not say which one did.
    private static func isValid(_ code: Data, for data: Data, under keys: [SymmetricKey]) -> Bool {
        keys.reduce(false) { valid, key in
            HMAC<SHA256>.isValidAuthenticationCode(code, authenticating: data, using: key) || valid
        }
    }
}
