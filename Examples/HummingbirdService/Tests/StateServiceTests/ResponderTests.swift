import AsyncStateKit
import Foundation
import HTTPTypes
import Hummingbird
import Testing

@testable import StateService

@Suite struct ResponderTests {
    let fetched = Date(timeIntervalSince1970: 1_000)
    var responder: SnapshotResponder {
        SnapshotResponder(now: { Date(timeIntervalSince1970: 1_042) }, retryAfter: .milliseconds(1500))
    }

    func respond(_ phase: AsyncPhase, hasValue: Bool, lastSuccess: Date? = nil) -> Response {
        responder.response(
            for: AsyncSnapshot(
                value: [1, 2], phase: phase, isExpired: true, lastSuccess: lastSuccess, hasValue: hasValue))
    }

    @Test func everyPhaseHasItsStatusAndHeaders() {
        var response = respond(.initial, hasValue: false)
        #expect(response.status == .serviceUnavailable && response.headers[.retryAfter] == "2")
        response = respond(.loading, hasValue: false)
        #expect(response.status == .serviceUnavailable && response.headers[.retryAfter] == "2")
        response = respond(.loading, hasValue: true, lastSuccess: fetched)
        #expect(response.status == .ok && response.headers[.age] == "42")
        response = respond(.empty, hasValue: true, lastSuccess: fetched)
        #expect(response.status == .noContent)
        response = respond(.success(fetched), hasValue: true, lastSuccess: fetched)
        #expect(response.status == .ok && response.headers[.age] == "42")
        #expect(response.headers[HTTPField.Name("X-State-Phase")!] == "success")
        response = respond(.failure(UpstreamError.unavailable), hasValue: true, lastSuccess: fetched)
        #expect(response.status == .ok && response.headers[.age] == "42")
        #expect(response.headers[HTTPField.Name("X-State-Phase")!] == "failure")
        response = respond(.failure(UpstreamError.unavailable), hasValue: false)
        #expect(response.status == .serviceUnavailable && response.headers[.retryAfter] == "2")
        response = respond(.failure(UpstreamError.notFound), hasValue: false)
        #expect(response.status == .notFound)
        // A value that was set, never fetched, has no fetch date: no Age.
        response = respond(.success(fetched), hasValue: true)
        #expect(response.status == .ok && response.headers[.age] == nil)
    }
}
