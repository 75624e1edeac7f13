// swift-format-ignore-file
// Verbatim from README.md and Sources/AsyncStateKit/AsyncStateKit.docc/Replicas.md;
// .ci/doc-snippets checks that their blocks still match this file.
import AsyncStateKit
import Foundation

struct TenantConfig: Codable, Sendable, Equatable { var tenant: String; var plan: String }

// What this service saves on SIGTERM and loads at start.
struct SavedStates: Codable {
    var tenants: [String: AsyncStateArchive<TenantConfig>]
}

final class TenantService: Sendable {
    let tenants = AsyncStateFamily<String, TenantConfig>(expiry: .seconds(300), staleWhileRevalidate: true)
    let invalidator: AsyncStateInvalidator
    let file: AsyncStateArchiveFile

    init(bus: any AsyncStateInvalidationBus, file: AsyncStateArchiveFile) {
        invalidator = AsyncStateInvalidator(bus: bus)
        self.file = file
        invalidator.subscribe(tenants, to: "tenants")
    }

    // At start: the last process's data, served stale while it is refetched.
    func warmUp() throws {
        if let saved = try file.load(SavedStates.self) { try tenants.restore(saved.tenants) }
    }

    // A write through this replica: every replica refetches this tenant.
    func tenantChanged(_ tenant: String) async throws {
        try await invalidator.invalidate("tenants", key: tenant)
    }

    // On SIGTERM.
    func save() throws {
        try file.save(SavedStates(tenants: tenants.archive))
    }
}
