import AsyncStateKit
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Testing

@testable import StateService

/// The routes, tried as an unauthenticated client or a careless one would.
@Suite struct RouteSecurityTests {
    @Test func aWriteNeedsTheBearerToken() async throws {
        let fixture = Fixture()
        try await fixture.routes().test(.router) { client async throws in
            var response = try await client.put("/config/acme", #"{"theme":"dark"}"#, token: nil)
            #expect(response.status == .unauthorized)
            #expect(response.headers[.wwwAuthenticate] == "Bearer")
            response = try await client.put("/config/acme", #"{"theme":"dark"}"#, token: "guessed-token-0000000000")
            #expect(response.status == .unauthorized)
            response = try await client.execute(
                uri: "/config/acme", method: .put, headers: [.authorization: "Basic \(Fixture.writeToken)"],
                body: ByteBuffer(string: "{}"))
            #expect(response.status == .unauthorized)
            #expect(try await client.get("/config/acme").status == .notFound)  // nothing was written
            #expect(try await client.put("/config/acme", #"{"theme":"dark"}"#).status == .ok)
        }
        // Without a configured token, no write is accepted at all.
        let closed = Fixture { $0.writeToken = nil }
        try await closed.routes().test(.router) { client async throws in
            let response = try await client.put("/config/acme", "{}")
            #expect(response.status == .forbidden)
            #expect(response.text.contains("WRITE_TOKEN"))
        }
    }

    @Test func anOversizedBodyOrTooManySettingsAreRefused() async throws {
        let fixture = Fixture()
        try await fixture.routes().test(.router) { client async throws in
            let huge = #"{"blob":""# + String(repeating: "x", count: 2 << 20) + #""}"#
            #expect(try await client.put("/config/acme", huge).status == .contentTooLarge)
            let just = #"{"blob":""# + String(repeating: "x", count: 17 << 10) + #""}"#
            #expect(try await client.put("/config/acme", just).status == .contentTooLarge)
            let many = "{" + (0..<65).map { #""k\#($0)":"v""# }.joined(separator: ",") + "}"
            var response = try await client.put("/config/acme", many)
            #expect(response.status == .badRequest)
            #expect(response.text == "at most 64 settings\n")
            let longValue = #"{"k":""# + String(repeating: "v", count: 1_025) + #""}"#
            #expect(try await client.put("/config/acme", longValue).status == .badRequest)
            let longKey = #"{""# + String(repeating: "k", count: 65) + #"":"v"}"#
            #expect(try await client.put("/config/acme", longKey).status == .badRequest)
            response = try await client.put("/config/acme", #"["not","an","object"]"#)
            #expect(response.status == .badRequest)
            #expect(response.text == "the body is a JSON object of strings\n")
            #expect(try await client.get("/config/acme").status == .notFound)
        }
    }

    @Test func aBadRequestSaysWhatWasWrongWithoutEchoingIt() async throws {
        let fixture = Fixture()
        try await fixture.routes().test(.router) { client async throws in
            var response = try await client.get("/users/abc<script>")
            #expect(response.status == .badRequest)
            #expect(response.text == "a user id is an integer\n")
            #expect(response.headers[.contentType] == "text/plain; charset=utf-8")
            response = try await client.get("/config/a%20b")
            #expect(response.status == .badRequest)
            #expect(response.text == "a tenant id is 1 to 64 letters, digits, - and _\n")
        }
    }

    @Test func theCachedTenantsAreBoundedByWeight() async throws {
        let fixture = Fixture { $0.tenantMaximumBytes = 4_000 }
        try await fixture.routes().test(.router) { client async throws in
            let settings =
                "{"
                + (0..<10).map { #""k\#($0)":"\#(String(repeating: "v", count: 100))""# }
                .joined(separator: ",") + "}"
            for tenant in 0..<20 {
                #expect(try await client.put("/config/t\(tenant)", settings).status == .ok)
                #expect(try await client.get("/config/t\(tenant)").status == .ok)
                #expect(fixture.catalog.tenants.weight <= 4_000)
            }
            #expect(fixture.catalog.tenants.count < 20)
        }
    }
}
