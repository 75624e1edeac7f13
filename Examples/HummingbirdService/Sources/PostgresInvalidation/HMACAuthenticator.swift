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
/// The signature covers the message's topic and key (`AsyncStateInvalidation.signedContent`), not
/// when it was sent: a message captured on the way can be sent again, and invalidates what it
/// invalidated the first time — at most one extra read of it, and whole-topic ones are rate-limited.
public struct HMACAuthenticator: AsyncStateInvalidationAuthenticator {
    private let key: SymmetricKey

    /// The shortest secret accepted, in UTF-8 bytes: 32, an HMAC-SHA256 key's length.
    public static var minimumSecretBytes: Int { 32 }

    /// A secret the authenticator refuses: too short to resist guessing.
    public struct SecretTooShort: Error, Equatable, CustomStringConvertible {
        /// Its length in UTF-8 bytes (never the secret itself: errors are logged).
        public var bytes: Int

        public var description: String {
            "an invalidation secret of \(bytes) bytes: at least \(HMACAuthenticator.minimumSecretBytes) are needed"
        }
    }

    /// An authenticator with `secret` as the HMAC key.
    ///
    /// - Throws: ``SecretTooShort`` for a secret under ``minimumSecretBytes``.
    public init(secret: String) throws(SecretTooShort) {
        guard secret.utf8.count >= Self.minimumSecretBytes else { throw SecretTooShort(bytes: secret.utf8.count) }
        key = SymmetricKey(data: Data(secret.utf8))
    }

    public func signature(for content: String) -> String {
        Data(HMAC<SHA256>.authenticationCode(for: Data(content.utf8), using: key)).base64EncodedString()
    }

    /// Compares in constant time (`HMAC.isValidAuthenticationCode`).
    public func isValid(_ signature: String, for content: String) -> Bool {
        guard let code = Data(base64Encoded: signature) else { return false }
        return HMAC<SHA256>.isValidAuthenticationCode(code, authenticating: Data(content.utf8), using: key)
    }
}
