import AsyncStateKit
import Foundation
import HTTPTypes
import Hummingbird

/// Turns a state's snapshot into an HTTP response, in one exhaustive place (`fold` makes the compiler
/// check that every phase is handled):
///
/// | Phase | With a value to show | Without |
/// |---|---|---|
/// | success | 200, `Age` | — |
/// | loading (stale-while-revalidate) | 200, `Age` (stale) | 503, `Retry-After` |
/// | failure | 200, `Age` (the last good value) | 404 if not found, else 503, `Retry-After` (with a body naming what is unavailable, for the tenant store) |
/// | empty | 204 | 204 |
/// | initial | — | 503, `Retry-After` |
///
/// Every response carries `X-State-Phase` (the phase's kind) so that a client or a test can tell a
/// fresh answer from a stale one.
struct SnapshotResponder: Sendable {
    /// The date `Age` is measured at (`Date()`, or a virtual clock's date in tests).
    let now: @Sendable () -> Date
    /// What `Retry-After` says when there is nothing to show: the failure expiry, at least a second.
    let retryAfter: Duration

    func response<Value: Encodable>(for snapshot: AsyncSnapshot<Value>) -> Response {
        snapshot.fold(
            initial: { unavailable(.initial) },
            loading: { previous in previous.map { ok($0, snapshot) } ?? unavailable(.loading) },
            empty: { Response(status: .noContent, headers: [.statePhase: "empty"]) },
            success: { value, _ in ok(value, snapshot) },
            failure: { error, previous -> Response in
                if let previous { return ok(previous, snapshot) }
                if let error = error as? UpstreamError, error == .notFound {
                    return Response(status: .notFound, headers: [.statePhase: "failure"])
                }
                if let error = error as? TenantStoreUnavailable {
                    return .plain(
                        .serviceUnavailable, "\(error)", [.retryAfter: retryAfterSeconds, .statePhase: "failure"])
                }
                if case AsyncStateError.timedOut(let after)? = error as? AsyncStateError {
                    return .plain(
                        .serviceUnavailable, "the source did not answer within \(after)",
                        [.retryAfter: retryAfterSeconds, .statePhase: "failure"])
                }
                return unavailable(.failure)
            })
    }

    /// 200 with the value as JSON, and its `Age` when it came from a fetch.
    private func ok<Value: Encodable>(_ value: Value, _ snapshot: AsyncSnapshot<Value>) -> Response {
        var headers: HTTPFields = [.statePhase: snapshot.phase.kind.rawValue]
        if let fetched = snapshot.lastSuccess {
            headers[.age] = String(max(0, Int(now().timeIntervalSince(fetched))))
        }
        return .json(value, headers)
    }

    /// 503 with `Retry-After`.
    private func unavailable(_ kind: AsyncPhase.Kind) -> Response {
        Response(status: .serviceUnavailable, headers: [.retryAfter: retryAfterSeconds, .statePhase: kind.rawValue])
    }

    /// What `Retry-After` says: ``retryAfter`` in whole seconds, rounded up, at least 1.
    var retryAfterSeconds: String {
        let (whole, fraction) = retryAfter.components
        return String(max(1, Int((Double(whole) + Double(fraction) / 1e18).rounded(.up))))
    }
}

extension Response {
    /// 200 with `value` as JSON (`Content-Type` added to `headers`), or 500 if it cannot be encoded.
    static func json<Value: Encodable>(_ value: Value, _ headers: HTTPFields = [:]) -> Response {
        var headers = headers
        headers[.contentType] = "application/json"
        do {
            let body = try JSONEncoder().encode(value)
            return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: body)))
        } catch {
            headers[.contentType] = nil
            return Response(status: .internalServerError, headers: headers)
        }
    }
}

extension HTTPField.Name {
    /// `X-State-Phase`: the phase kind of the state a response came from.
    static var statePhase: Self { Self("X-State-Phase")! }
    /// How a write was announced to the other replicas (`published`, `failed`, `local`).
    static var invalidation: Self { Self("X-Invalidation")! }
}
