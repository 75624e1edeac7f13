import Foundation

/// How a family's values are written to a second level and read back: an encoder and a decoder,
/// with a tag that names the format and the schema.
///
/// Every payload goes in an envelope: four magic bytes, the envelope's format, the tag, then the
/// encoded value. A payload whose envelope is not this codec's — truncated, written by another
/// program, by an envelope format this library does not know, or under another tag (an older schema
/// of the value) — fails to decode with ``AsyncStateCodecError``; the family then drops it and loads
/// the key from its source. Change the tag when the value's encoding changes incompatibly, so that
/// replicas running the new code never read what the old ones wrote.
///
/// ```swift
/// let codec = AsyncStateCodec<Profile>.json                 // JSONEncoder / JSONDecoder, tag "json"
/// let versioned = AsyncStateCodec<Profile>.json(tag: "profile-v2")
/// ```
public struct AsyncStateCodec<Value: Sendable>: Sendable {
    /// Names the format and schema of the encoded values; at most 255 UTF-8 bytes are kept.
    public let tag: String
    private let tagBytes: [UInt8]
    private let encodeValue: @Sendable (Value) throws -> [UInt8]
    private let decodeValue: @Sendable ([UInt8]) throws -> Value

    /// The envelope's magic bytes, "ASL2".
    static var magic: [UInt8] { [0x41, 0x53, 0x4C, 0x32] }
    /// The envelope's format.
    static var format: UInt8 { 1 }

    /// The largest payload a codec writes or reads, envelope included: 1 MiB. A value that encodes
    /// larger is not stored in the second level (its replica serves it from memory, the others load
    /// it from the source); a larger payload found there is garbage, refused before it is parsed.
    /// The example's PostgreSQL table holds the same limit as a constraint.
    public static var maximumPayloadBytes: Int { 1 << 20 }

    /// Creates a codec from an encoder and a decoder of the bare value (the envelope is added and
    /// checked around them).
    ///
    /// - Parameters:
    ///   - tag: Names the format and schema; payloads written under another tag do not decode. Only
    ///     its first 255 UTF-8 bytes count.
    ///   - encode: The value's bytes.
    ///   - decode: The value from its bytes; it may throw.
    public init(
        tag: String, encode: @escaping @Sendable (Value) throws -> [UInt8],
        decode: @escaping @Sendable ([UInt8]) throws -> Value
    ) {
        let bytes = Array(tag.utf8.prefix(255))
        self.tag = String(decoding: bytes, as: UTF8.self)
        tagBytes = bytes
        (encodeValue, decodeValue) = (encode, decode)
    }

    /// `value` in its envelope.
    ///
    /// - Throws: The encoder's error, or ``AsyncStateCodecError/tooLarge(bytes:)`` past
    ///   ``maximumPayloadBytes``.
    public func encode(_ value: Value) throws -> [UInt8] {
        let body = try encodeValue(value)
        var payload = Self.magic
        payload.reserveCapacity(6 + tagBytes.count + body.count)
        payload.append(Self.format)
        payload.append(UInt8(tagBytes.count))
        payload.append(contentsOf: tagBytes)
        payload.append(contentsOf: body)
        guard payload.count <= Self.maximumPayloadBytes else {
            throw AsyncStateCodecError.tooLarge(bytes: payload.count)
        }
        return payload
    }

    /// The value in `payload`'s envelope.
    ///
    /// - Throws: ``AsyncStateCodecError`` when the payload is larger than ``maximumPayloadBytes`` or
    ///   its envelope is not this codec's, or the decoder's error wrapped in
    ///   ``AsyncStateCodecError/undecodable(_:)``.
    public func decode(_ payload: [UInt8]) throws -> Value {
        guard payload.count <= Self.maximumPayloadBytes else {
            throw AsyncStateCodecError.tooLarge(bytes: payload.count)
        }
        guard payload.count >= 6, payload.starts(with: Self.magic) else { throw AsyncStateCodecError.notAnEnvelope }
        guard payload[4] == Self.format else { throw AsyncStateCodecError.unknownFormat(payload[4]) }
        let tagEnd = 6 + Int(payload[5])
        guard payload.count >= tagEnd else { throw AsyncStateCodecError.notAnEnvelope }
        guard payload[6..<tagEnd].elementsEqual(tagBytes) else {
            throw AsyncStateCodecError.otherTag(String(decoding: payload[6..<tagEnd], as: UTF8.self))
        }
        do {
            return try decodeValue(Array(payload[tagEnd...]))
        } catch {
            throw AsyncStateCodecError.undecodable(String(describing: error))
        }
    }
}

extension AsyncStateCodec where Value: Codable {
    /// JSON through Foundation's `JSONEncoder` and `JSONDecoder`, under the tag `"json"`.
    public static var json: AsyncStateCodec { json(tag: "json") }

    /// JSON through Foundation's `JSONEncoder` and `JSONDecoder`, under `tag` (name the value's
    /// schema in it, to change it when the schema changes).
    public static func json(tag: String) -> AsyncStateCodec {
        AsyncStateCodec(
            tag: tag, encode: { try Array(JSONEncoder().encode($0)) },
            decode: { try JSONDecoder().decode(Value.self, from: Data($0)) })
    }
}

/// Why a second level's payload did not decode.
public enum AsyncStateCodecError: Error, Sendable, Hashable {
    /// Too short, or without the envelope's magic bytes.
    case notAnEnvelope
    /// An envelope format this library does not know.
    case unknownFormat(UInt8)
    /// Written under another tag (another format or schema), named here.
    case otherTag(String)
    /// The envelope is this codec's, but its decoder failed, with this description of its error.
    case undecodable(String)
    /// Larger than ``AsyncStateCodec/maximumPayloadBytes`` (this many bytes): not written, or not
    /// read.
    case tooLarge(bytes: Int)
}
