import Foundation

/// A message that data changed at its source: everything under `topic`, or one `key` of it, or the
/// entries carrying a `tag` (see ``AsyncStateFamily/invalidate(tag:)``).
///
/// Replicas of a service send these to each other through an ``AsyncStateInvalidationBus`` so that a
/// change made through one replica is refetched by all of them. Applying one marks data expired,
/// which is idempotent: a bus may deliver a message more than once.
public struct AsyncStateInvalidation: Sendable, Hashable, Codable, CustomStringConvertible {
    /// What changed: a name the states that hold it subscribed to (`"config"`, `"profiles"`).
    public var topic: String
    /// One key of a family subscribed to `topic` (its `String(describing:)`); `nil` for everything
    /// under the topic.
    public var key: String?
    /// The entries of a family subscribed to `topic` that carry this tag; `nil` for none. With a
    /// `key` as well, both are invalidated. An unsigned replica of a release before tags, which
    /// ignores this field, invalidates the whole topic for a message with a tag and no key (more,
    /// never less); a signed one refuses the message, whose signature covers a tag it does not read
    /// (see ``signedContent`` for rolling upgrades).
    public var tag: String?
    /// Who sent it, proved: what an ``AsyncStateInvalidationAuthenticator`` computed over
    /// ``signedContent`` when the message was sent; `nil` for an unsigned message. An invalidator
    /// with an authenticator drops a message without a valid one.
    public var signature: String?
    /// What the sender attached for observers, such as its request's trace context (`traceparent`,
    /// `tracestate`), as ``AsyncStateInvalidator``'s `metadata:` gives it; `nil` for none. The
    /// receiving replica's observer finds it in ``AsyncStateEvent/invalidation``. Signed with the
    /// rest, so that nobody without the secret can attach a trace link to a real message.
    public var metadata: [String: String]?
    /// Which invalidator sent it (an id each ``AsyncStateInvalidator`` draws when it is made), set
    /// when the message is signed; `nil` for an unsigned message. Signed.
    public var sender: String?
    /// When it was sent, in milliseconds since 1970 on the sender's wall clock, set when the message
    /// is signed (again at each attempt to send it); `nil` for an unsigned message. Signed: a
    /// receiver refuses a message sent outside its replay window, or one it has already accepted
    /// (see ``AsyncStateInvalidator/Rejection``).
    public var sentAt: Int64?
    /// The second-level version the change made current for `key` (see ``AsyncStateSecondLevel``):
    /// a replica whose data is that version or newer ignores the message, and one whose data is
    /// older takes no older entry from the second level afterwards. `nil`: no second level, or it
    /// failed. Signed, with the topic, key and tag.
    public var version: UInt64?

    /// A message about `topic`, or one `key` of it, or the entries carrying `tag`.
    public init(
        topic: String, key: String? = nil, tag: String? = nil, signature: String? = nil,
        metadata: [String: String]? = nil, version: UInt64? = nil, sender: String? = nil, sentAt: Int64? = nil
    ) {
        self.topic = topic
        self.key = key
        self.tag = tag
        self.signature = signature
        self.metadata = metadata
        self.version = version
        self.sender = sender
        self.sentAt = sentAt
    }

    /// `topic`, `topic/key`, `topic#tag` or `topic/key#tag`, then `@version` if it has one.
    public var description: String {
        (key.map { "\(topic)/\($0)" } ?? topic) + (tag.map { "#\($0)" } ?? "") + (version.map { "@\($0)" } ?? "")
    }

    /// What a signature covers: the topic, the key and the tag, each with its length in UTF-8 bytes, so that
    /// no two messages share it (`"t/a", "b"` and `"t", "a/b"` differ) and no encoding detail of
    /// the payload (its field order, its escapes) changes it; then the version, the sender, the time
    /// it was sent and the metadata (sorted by name, each name and value with its length).
    ///
    /// A field is appended only when the message has it. Replicas of releases before the sender and
    /// the time signed neither, and an invalidator with an authenticator now refuses a message
    /// without them (it could be replayed): during a rolling upgrade from such a release, replicas
    /// of the two releases refuse each other's messages, and each serves the other's changes no
    /// later than its own expiry (or its bus's next `reconnected`). Upgrade in one step, or accept
    /// that window.
    public var signedContent: String {
        // Unambiguous: each part starts with its own marker after a length-prefixed field or `-`,
        // and every text is length-prefixed.
        var content = "\(topic.utf8.count):\(topic)" + (key.map { "\($0.utf8.count):\($0)" } ?? "-")
        if let tag { content += "#\(tag.utf8.count):\(tag)" }
        if let version { content += "@\(version)" }
        if let sender { content += "!\(sender.utf8.count):\(sender)" }
        if let sentAt { content += "~\(sentAt)" }
        if let metadata {
            content += "^\(metadata.count)"
            for (name, value) in metadata.sorted(by: { $0.key < $1.key }) {
                content += "\(name.utf8.count):\(name)\(value.utf8.count):\(value)"
            }
        }
        return content
    }
}

/// Proves who sent an ``AsyncStateInvalidation``: anyone who can reach a bus (for PostgreSQL, anyone
/// who can connect to the database: `NOTIFY` needs no permission) could otherwise invalidate every
/// replica's data, again and again. Give one to ``AsyncStateInvalidator``: it signs what it publishes
/// and drops, and counts, every delivery whose signature is missing or wrong.
///
/// The library has no cryptography of its own (it depends on nothing); an HMAC over
/// ``AsyncStateInvalidation/signedContent`` under a secret the replicas share is the usual choice,
/// as the example service's `HMACAuthenticator` does with swift-crypto:
///
/// ```swift
/// struct HMACAuthenticator: AsyncStateInvalidationAuthenticator {
///     let key: SymmetricKey
///     func signature(for content: String) -> String {
///         Data(HMAC<SHA256>.authenticationCode(for: Data(content.utf8), using: key)).base64EncodedString()
///     }
///     func isValid(_ signature: String, for content: String) -> Bool {
///         guard let code = Data(base64Encoded: signature) else { return false }
///         return HMAC<SHA256>.isValidAuthenticationCode(code, authenticating: Data(content.utf8), using: key)
///     }
/// }
/// ```
public protocol AsyncStateInvalidationAuthenticator: Sendable {
    /// The signature of `content` (a message's ``AsyncStateInvalidation/signedContent``).
    func signature(for content: String) -> String
    /// Whether `signature` is a valid signature of `content`. Compare in constant time.
    func isValid(_ signature: String, for content: String) -> Bool
}

extension AsyncStateInvalidationAuthenticator {
    /// Whether `message` carries a valid signature of its ``AsyncStateInvalidation/signedContent``:
    /// the check ``AsyncStateInvalidator`` makes of every delivery, for a bus that checks before it
    /// buffers (whether the message is a replay is the invalidator's to tell).
    public func isAuthentic(_ message: AsyncStateInvalidation) -> Bool {
        guard let signature = message.signature else { return false }
        return isValid(signature, for: message.signedContent)
    }
}

extension AsyncStateInvalidation {
    /// The longest payload ``payload()`` writes and ``init(payload:)`` reads, in UTF-8 bytes: under
    /// PostgreSQL's 8,000-byte `NOTIFY` limit, and short enough for any pub/sub channel.
    public static var maximumPayloadBytes: Int { 7_900 }

    /// This message as a bus payload: compact JSON (`{"key":"…","signature":"…","topic":"…"}`, the
    /// key, the tag, the signature, the metadata and the version only if it has them).
    ///
    /// - Throws: ``PayloadError/tooLong(bytes:)`` when the topic and key are too long to send.
    public func payload() throws(PayloadError) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        guard let data = try? encoder.encode(self), let text = String(data: data, encoding: .utf8) else {
            throw .malformed("the message could not be encoded")
        }
        guard data.count <= Self.maximumPayloadBytes else { throw .tooLong(bytes: data.count) }
        return text
    }

    /// Reads a payload that another replica wrote with ``payload()``: a JSON object with a non-empty
    /// string `topic` and, optionally, a string `key`, `tag` and `signature` (which it reads, not
    /// checks: ``AsyncStateInvalidator`` does), a `metadata` object of strings, an unsigned
    /// 64-bit `version`, a string `sender` and a 64-bit `sentAt`. Fields it does not know are ignored, so that a
    /// replica of a newer release, which may send more, is still understood during a rolling
    /// upgrade. Anything else is refused: a bus that receives a payload it cannot read should log it
    /// and go on (it is someone else's message, or a damaged one), never crash.
    ///
    /// - Throws: ``PayloadError/tooLong(bytes:)`` for a payload over ``maximumPayloadBytes``;
    ///   ``PayloadError/malformed(_:)`` for one that is not such a message (not JSON, not an object,
    ///   no `topic`, a field of the wrong type), or has an empty topic.
    public init(payload: String) throws(PayloadError) {
        let bytes = payload.utf8.count
        guard bytes <= Self.maximumPayloadBytes else { throw .tooLong(bytes: bytes) }
        guard let message = try? JSONDecoder().decode(Self.self, from: Data(payload.utf8)) else {
            // Escaped (quotes, control characters as `\n`, `\u{…}`): the excerpt goes into logs, where
            // a raw line break would let a payload forge log lines.
            throw .malformed("not an invalidation: \(String(reflecting: String(payload.prefix(80))))")
        }
        guard !message.topic.isEmpty else { throw .malformed("an invalidation without a topic") }
        self = message
    }

    /// Why a payload could not be written or read.
    public enum PayloadError: Error, Sendable, Equatable, CustomStringConvertible {
        /// Longer than ``AsyncStateInvalidation/maximumPayloadBytes``.
        case tooLong(bytes: Int)
        /// Not a message this library wrote.
        case malformed(String)

        /// A readable explanation.
        public var description: String {
            switch self {
            case .tooLong(let bytes):
                return
                    "an invalidation payload of \(bytes) bytes (at most \(AsyncStateInvalidation.maximumPayloadBytes))"
            case .malformed(let reason):
                return "a malformed invalidation payload: \(reason)"
            }
        }
    }
}

/// What a bus delivers to its replica.
public enum AsyncStateInvalidationDelivery: Sendable, Hashable {
    /// Another replica invalidated this.
    case invalidate(AsyncStateInvalidation)
    /// The bus was disconnected and is connected again, or has just begun listening: messages sent
    /// meanwhile (or before) may be lost, so every subscribed state is invalidated.
    case reconnected
}

/// Carries invalidations between the replicas of a service: PostgreSQL's LISTEN/NOTIFY, a Redis
/// channel, or `InMemoryInvalidationNetwork` (in AsyncStateTesting) in tests. A bus is this library's only seam to them;
/// ``AsyncStateInvalidator`` does the rest.
///
/// A bus delivers at least once what other replicas publish (a replica does not need its own
/// messages: it applied them when it published), and ``AsyncStateInvalidationDelivery/reconnected``
/// after any gap in which messages may have been lost — including the time before a stream began:
/// every stream from ``deliveries()`` starts with `reconnected` once the bus listens for it, so a
/// replica that starts listening late (its states warmed before ``AsyncStateInvalidator/run()``)
/// refetches whatever another replica changed meanwhile.
public protocol AsyncStateInvalidationBus: Sendable {
    /// Sends `invalidation` to the other replicas.
    func publish(_ invalidation: AsyncStateInvalidation) async throws
    /// What the other replicas publish, and reconnections, in order, starting with
    /// ``AsyncStateInvalidationDelivery/reconnected`` as soon as the bus listens (nothing published
    /// before that was seen by this stream); the stream ends when the bus shuts down.
    func deliveries() -> AsyncStream<AsyncStateInvalidationDelivery>
}
