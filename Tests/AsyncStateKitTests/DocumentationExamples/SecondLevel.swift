// swift-format-ignore-file
// Verbatim from Sources/AsyncStateKit/AsyncStateKit.docc/OneCacheForTheFleet.md; .ci/doc-snippets
// checks that its block still matches this file.
import AsyncStateKit

struct Account: Codable, Sendable, Equatable {
    var id: Int
    var name: String
}

/// A replica's accounts, shared with the other replicas through `secondLevel`.
func makeAccounts(secondLevel: any AsyncStateSecondLevel) -> AsyncStateFamily<Int, Account> {
    AsyncStateFamily<Int, Account>(
        expiry: .seconds(120),
        secondLevel: AsyncStateSecondLevelOptions(
            level: secondLevel, namespace: "accounts", codec: .json(tag: "account-v1"),
            timeout: .milliseconds(100), leaseDuration: .seconds(5)))
}

import AsyncStateTesting
import Testing

@Suite struct OneCacheForTheFleetExample {
    /// The article's family, on an in-memory second level: two replicas, one source call.
    @Test func twoReplicasShareOneLoad() async throws {
        let clock = VirtualClock()
        let level = InMemorySecondLevel(clock: clock)
        let calls = LockedValue(0)
        let (a, b) = (makeAccounts(secondLevel: level.replica()), makeAccounts(secondLevel: level.replica()))
        let load: @Sendable (Int) async throws -> Account = { id in
            calls.withLock { $0 += 1 }
            return Account(id: id, name: "Ada")
        }
        #expect(try await a.value(for: 1, load) == Account(id: 1, name: "Ada"))
        #expect(try await b.value(for: 1, load) == Account(id: 1, name: "Ada"))
        #expect(calls.withLock { $0 } == 1)
    }
}
