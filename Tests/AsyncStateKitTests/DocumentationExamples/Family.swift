// swift-format-ignore-file
// Verbatim from README.md and Sources/AsyncStateKit/AsyncStateKit.docc/ManyKeys.md; .ci/doc-snippets
// checks that their blocks still match this file.
import AsyncStateKit

typealias UserID = Int
struct Profile: Sendable, Equatable { var id: UserID; var name: String }

final class ProfileDatabase: Sendable {
    func profile(_ id: UserID) async throws -> Profile { Profile(id: id, name: "user \(id)") }
    func profiles(_ ids: [UserID]) async throws -> [UserID: Profile] {
        Dictionary(uniqueKeysWithValues: ids.map { ($0, Profile(id: $0, name: "user \($0)")) })
    }
}

actor ProfileService {
    let database = ProfileDatabase()

    // One state per user id: fresh for 60 s and refreshed ahead from 45 s; at most 10,000 users
    // held; a user nobody asked for in 10 minutes is dropped.
    @AsyncStateFamily(expiry: .seconds(60), capacity: 10_000, idleExpiry: .seconds(600), refreshAfter: .seconds(45))
    var profiles: [UserID: Profile]

    func profile(_ id: UserID) async throws -> Profile {
        try await $profiles.value(for: id) { id in try await self.database.profile(id) }
    }

    // Many at once: one database call for every id neither fresh nor already loading.
    func profiles(_ ids: [UserID]) async -> [UserID: Result<Profile, any Error>] {
        await $profiles.values(for: ids) { missing in try await self.database.profiles(missing) }
    }
}
