import AsyncStateKit
import Foundation
import Logging
import PostgresFleetCache
import PostgresInvalidation
import PostgresNIO
import StateService
import Synchronization
import Testing

/// Runs `body` with a client of the test server (or of `configuration`), running for its duration.
@discardableResult
func withClient<T: Sendable>(
    _ configuration: PostgresClient.Configuration? = nil, _ body: @Sendable (PostgresClient) async throws -> T
) async throws -> T {
    let client = PostgresClient(
        configuration: try configuration ?? Server.settings().client, backgroundLogger: quietLogger)
    return try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask {
            await client.run()
            return nil
        }
        defer { group.cancelAll() }
        return try await body(client)
    }
}

/// A key prefix no other test uses.
func uniquePrefix(_ name: String) -> String { "\(name)\(UInt32.random(in: 0...UInt32.max)):" }

extension RealServerTests {
    /// `PostgresSecondLevel` against a real server: the protocol's rules, statements that race, a
    /// table emptied as a crash empties it, and the grants.
    @Suite(.enabled(if: Server.isAvailable, "needs ASYNCSTATE_POSTGRES_URL: run bash .ci/replicas"), .serialized)
    struct PostgresSecondLevelTests {
        /// A family of `Int`s on `level` under `namespace`, with a five-second timeout for each call
        /// (generous on a loaded machine: a call that times out would go to the source instead).
        static func family(
            on level: PostgresSecondLevel, namespace: String, capacity: Int = 10_000,
            authenticator: HMACAuthenticator? = nil
        ) -> AsyncStateFamily<String, Int> {
            AsyncStateFamily<String, Int>(
                expiry: .seconds(600), capacity: capacity,
                secondLevel: AsyncStateSecondLevelOptions(
                    level: level, namespace: namespace, codec: .json, timeout: .seconds(5),
                    authenticator: authenticator))
        }

        static func entry(_ text: String, version: UInt64, freshFor seconds: Double = 60) -> AsyncStateStoredEntry {
            let now = Date()
            return AsyncStateStoredEntry(
                payload: Array(text.utf8), succeededAt: now, freshUntil: now.addingTimeInterval(seconds),
                version: version)
        }

        @Test func writesLeasesAndInvalidationsKeepTheProtocolsRules() async throws {
            try await withClient { client in
                let level = PostgresSecondLevel(client: client, logger: quietLogger)
                let prefix = uniquePrefix("rules")
                // Bound parameters: a key is data, whatever it holds.
                let key = prefix + "'; DROP TABLE async_state_entries; --"
                #expect(try await level.read(key) == nil)

                // Each grant names the version stored as it was given (0: none yet), which tells a
                // holder whether another replica wrote since its read.
                guard case .acquired(let first, 0?) = try await level.acquireLease(on: key, for: .seconds(10)) else {
                    Issue.record("a free lease was not given")
                    return
                }
                guard case .held(let left) = try await level.acquireLease(on: key, for: .seconds(10)) else {
                    Issue.record("a held lease was given again")
                    return
                }
                #expect(left > .seconds(9) && left <= .seconds(10))

                // A write stores only a newer version; dates and bytes come back exactly.
                let written = Self.entry("one", version: first)
                #expect(try await level.write(written, for: key))
                #expect(try await level.read(key) == written)
                #expect(try await !level.write(Self.entry("same", version: first), for: key))
                #expect(try await !level.write(Self.entry("older", version: first - 1), for: key))
                #expect(try await level.read(key) == written)

                // Only the holder's token gives the lease back.
                try await level.releaseLease(on: key, token: first + 1_000)
                guard case .held = try await level.acquireLease(on: key, for: .seconds(10)) else {
                    Issue.record("another token gave the lease back")
                    return
                }
                try await level.releaseLease(on: key, token: first)
                guard case .acquired(let second, first?) = try await level.acquireLease(on: key, for: .seconds(10))
                else {
                    Issue.record("a lease given back was not given again")
                    return
                }
                #expect(second > first)

                // An invalidation: a greater version, the entry stale, the lease dropped; the holder
                // that loaded before it cannot write.
                let version = try await level.invalidate(key)
                #expect(version > second)
                let marked = try #require(try await level.read(key))
                #expect(marked.version == version && marked.freshUntil < Date() && marked.payload == written.payload)
                #expect(try await !level.write(Self.entry("before the change", version: second), for: key))
                guard case .acquired(let third, version?) = try await level.acquireLease(on: key, for: .seconds(10))
                else {
                    Issue.record("an invalidation left the lease held")
                    return
                }
                #expect(third > version)
                #expect(try await level.write(Self.entry("after the change", version: third), for: key))

                // A key never seen gets a marker: no payload, stale, a version above all others.
                let unseen = prefix + "unseen"
                let markerVersion = try await level.invalidate(unseen)
                let marker = try #require(try await level.read(unseen))
                #expect(marker.payload.isEmpty && marker.freshUntil < Date() && markerVersion > third)

                // A put (a value written through a replica): stored whatever is there, under a new
                // version, the lease dropped; a holder that loaded before it cannot overwrite it.
                let putKey = prefix + "put"
                guard case .acquired(let holder, _) = try await level.acquireLease(on: putKey, for: .seconds(10)) else {
                    Issue.record("a free lease was not given")
                    return
                }
                let made = Mutex<AsyncStateStoredEntry?>(nil)
                let put = try await level.put(for: putKey) { version in
                    let entry = Self.entry("written at \(version)", version: version)
                    made.withLock { $0 = entry }
                    return entry
                }
                #expect(put > holder && put > markerVersion && made.withLock { $0?.version } == put)
                #expect(try await level.read(putKey) == made.withLock { $0 })
                #expect(try await !level.write(Self.entry("loaded before", version: holder), for: putKey))
                guard case .acquired(_, put?) = try await level.acquireLease(on: putKey, for: .seconds(10)) else {
                    Issue.record("a put left the lease held, or the grant did not name its version")
                    return
                }

                // A lease expires on the server's clock.
                let short = prefix + "short"
                guard case .acquired = try await level.acquireLease(on: short, for: .milliseconds(50)) else {
                    Issue.record("a free lease was not given")
                    return
                }
                let expired = try await eventually(timeout: .seconds(10)) {
                    if case .acquired = try await level.acquireLease(on: short, for: .seconds(10)) { return true }
                    return false
                }
                #expect(expired, "a 50 ms lease never expired")
            }
        }

        @Test func invalidatingAPrefixFencesEveryKeyUnderItAndNoOther() async throws {
            try await withClient { client in
                let level = PostgresSecondLevel(client: client, logger: quietLogger)
                let prefix = uniquePrefix("prefix")
                // A namespace that starts like the other one, and characters LIKE would read.
                let neighbour = prefix.dropLast() + "x:"
                let keys = [prefix + "a", prefix + "b%", prefix + "_c"]
                var versions: [String: UInt64] = [:]
                for key in keys + [neighbour + "a"] {
                    guard case .acquired(let token, _) = try await level.acquireLease(on: key, for: .seconds(10)) else {
                        Issue.record("a free lease was not given")
                        return
                    }
                    #expect(try await level.write(Self.entry(key, version: token), for: key))
                    versions[key] = token
                }
                try await level.invalidateAll(withPrefix: prefix)
                for key in keys {
                    let entry = try #require(try await level.read(key))
                    #expect(entry.version > versions.values.max()! && entry.freshUntil < Date())
                    // The lease is gone too: a new load may start at once.
                    guard case .acquired = try await level.acquireLease(on: key, for: .seconds(10)) else {
                        Issue.record("\(key)'s lease survived the invalidation")
                        return
                    }
                }
                let other = try #require(try await level.read(neighbour + "a"))
                #expect(other.version == versions[neighbour + "a"] && other.freshUntil > Date())
            }
        }

        /// Statements racing on one key: every invalidation gets its own version, the stored version
        /// is the greatest any statement stored (none went back), and one lease is given at a time.
        @Test func racingStatementsNeverStoreAnOlderVersion() async throws {
            try await withClient { client in
                let level = PostgresSecondLevel(client: client, logger: quietLogger)
                let key = uniquePrefix("race") + "k"
                let results = try await withThrowingTaskGroup(of: (invalidated: UInt64?, written: UInt64?).self) {
                    group in
                    for index in 0..<60 {
                        group.addTask {
                            if index % 2 == 0 { return (try await level.invalidate(key), nil) }
                            guard
                                case .acquired(let token, _) = try await level.acquireLease(on: key, for: .seconds(10))
                            else { return (nil, nil) }
                            let stored = try await level.write(Self.entry("\(index)", version: token), for: key)
                            try await level.releaseLease(on: key, token: token)
                            return (nil, stored ? token : nil)
                        }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
                let invalidations = results.compactMap(\.invalidated)
                #expect(Set(invalidations).count == 30)
                let stored = try #require(try await level.read(key))
                #expect(stored.version == (invalidations + results.compactMap(\.written)).max())

                let other = uniquePrefix("race") + "lease"
                let leases = try await withThrowingTaskGroup(of: Bool.self) { group in
                    for _ in 0..<30 {
                        group.addTask {
                            if case .acquired = try await level.acquireLease(on: other, for: .seconds(60)) {
                                return true
                            }
                            return false
                        }
                    }
                    return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
                }
                #expect(leases == 1)
            }
        }

        /// PostgreSQL empties an UNLOGGED table after a crash; the versions come from a logged
        /// sequence, so the next token and invalidation are still above every version a replica may
        /// remember.
        @Test func anEmptiedTableDoesNotResetVersions() async throws {
            try await withClient { client in
                let level = PostgresSecondLevel(client: client, logger: quietLogger)
                let key = uniquePrefix("crash") + "k"
                let remembered = try await level.invalidate(key)
                try await client.query("TRUNCATE async_state_entries", logger: quietLogger)
                #expect(try await level.read(key) == nil)
                guard case .acquired(let token, _) = try await level.acquireLease(on: key, for: .seconds(10)) else {
                    Issue.record("a free lease was not given")
                    return
                }
                #expect(token > remembered)
                #expect(try await level.invalidate(key) > token)
            }
        }

        /// A family on the PostgreSQL second level: garbage in its row is never served, the key is
        /// loaded again (once), and the garbage is replaced by an entry that decodes.
        @Test func garbageInTheTableIsReplacedNotServed() async throws {
            try await withClient { client in
                let level = PostgresSecondLevel(client: client, logger: quietLogger)
                let namespace = String(uniquePrefix("garbage").dropLast())
                let calls = Mutex(0)
                let family = Self.family(on: level, namespace: namespace)
                let key = "\(namespace):k"
                let version = try await level.invalidate(key)
                let future = Date().addingTimeInterval(600).timeIntervalSinceReferenceDate
                let garbage = ByteBuffer(bytes: [0x41, 0x53, 0x4C, 0x32, 0xFF, 0x00, 0x13])  // "ASL2", then nonsense
                try await client.query(
                    """
                    UPDATE async_state_entries SET payload = \(garbage), succeeded_at = \(future - 600),
                        fresh_until = \(future) WHERE key = \(key) AND version = \(Int64(version))
                    """, logger: quietLogger)
                let value = try await family.value(for: "k") { _ in
                    calls.withLock { $0 += 1 }
                    return 42
                }
                #expect(value == 42 && calls.withLock { $0 } == 1)
                #expect(family.secondLevelStatistics?.undecodable == 1)
                let entry = try #require(try await level.read(key))
                #expect(try AsyncStateCodec<Int>.json.decode(entry.payload) == 42 && entry.version > version)
            }
        }

        /// As the service's own login without the secret would: a well-formed entry with a version of
        /// `Int64.max` (which would make replicas ignore every later change), and one dated an hour
        /// ahead (fresh for its whole life from a date not yet come), are each never served, are
        /// counted, and do not stop the next write.
        @Test(arguments: ["version Int64.max", "success date an hour ahead"])
        func aPlantedEntryIsNeverServedAndDoesNotBlockTheNextWrite(planting: String) async throws {
            try await withClient { client in
                let level = PostgresSecondLevel(client: client, logger: quietLogger)
                let namespace = String(uniquePrefix("planted").dropLast())
                let family = Self.family(on: level, namespace: namespace)
                let key = "\(namespace):k"
                let inRange = try await level.invalidate(key)
                // The planted entry decodes (a real envelope) and is fresh for two hours.
                let now = Date()
                let future = planting == "version Int64.max" ? now : now.addingTimeInterval(3_600)
                let version = planting == "version Int64.max" ? Int64.max : Int64(inRange)
                let planted = try AsyncStateCodec<Int>.json.encode(666)
                try await client.query(
                    """
                    UPDATE async_state_entries SET payload = \(ByteBuffer(bytes: planted)),
                        succeeded_at = \(future.timeIntervalSinceReferenceDate),
                        fresh_until = \(now.addingTimeInterval(7_200).timeIntervalSinceReferenceDate),
                        version = \(version) WHERE key = \(key)
                    """, logger: quietLogger)
                let value = try await family.value(for: "k") { _ in 42 }
                #expect(value == 42)
                #expect(family.secondLevelStatistics?.undecodable == 1)
                let entry = try #require(try await level.read(key))
                #expect(try AsyncStateCodec<Int>.json.decode(entry.payload) == 42)
                #expect(entry.version < UInt64(Int64.max) && entry.version > inRange)
                print(
                    "a planted entry (\(planting)): not served (\(value) from the source), "
                        + "counted (undecodable \(family.secondLevelStatistics?.undecodable ?? 0)), "
                        + "replaced by the next write (version \(entry.version))")
            }
        }

        /// As the service's own login without the secret would: entries the replicas' seal does not
        /// cover — a well-formed envelope with no seal, one sealed under another secret, a real
        /// sealed entry copied to another key — are never served, are counted, and are replaced by
        /// the next load's sealed entry.
        @Test func anEntryWithoutAValidSealIsNeverServedAndIsReplaced() async throws {
            try await withClient { client in
                let level = PostgresSecondLevel(client: client, logger: quietLogger)
                let namespace = String(uniquePrefix("sealed").dropLast())
                let fleet = try HMACAuthenticator(secret: Server.secret)
                func family(_ authenticator: HMACAuthenticator?) -> AsyncStateFamily<String, Int> {
                    Self.family(on: level, namespace: namespace, authenticator: authenticator)
                }
                // A real sealed entry, for key "real".
                #expect(try await family(fleet).value(for: "real") { _ in 7 } == 7)
                let now = Date()
                let plain = ByteBuffer(bytes: try AsyncStateCodec<Int>.json.encode(666))
                // Planted with the service's login: a fresh envelope without a seal, fresh for an hour.
                try await client.query(
                    """
                    INSERT INTO public.async_state_entries (key, payload, succeeded_at, fresh_until, version)
                    VALUES (\("\(namespace):unsealed"), \(plain), \(now.timeIntervalSinceReferenceDate),
                        \(now.addingTimeInterval(3_600).timeIntervalSinceReferenceDate),
                        nextval('public.async_state_versions'))
                    """, logger: quietLogger)
                // Sealed under another secret (a replica of another fleet, or a guess).
                let other = try HMACAuthenticator(secret: String(repeating: "o", count: 32))
                #expect(try await family(other).value(for: "other") { _ in 666 } == 666)
                // The real entry of "real", copied to "copied" with a version of its own.
                try await client.query(
                    """
                    INSERT INTO public.async_state_entries (key, payload, succeeded_at, fresh_until, version)
                    SELECT \("\(namespace):copied"), payload, succeeded_at, fresh_until,
                        nextval('public.async_state_versions')
                    FROM public.async_state_entries WHERE key = \("\(namespace):real")
                    """, logger: quietLogger)
                for key in ["unsealed", "other", "copied"] {
                    let reader = family(fleet)
                    let calls = Mutex(0)
                    let value = try await reader.value(for: key) { _ in
                        calls.withLock { $0 += 1 }
                        return 42
                    }
                    #expect(value == 42 && calls.withLock { $0 } == 1, "\(key)")
                    #expect(reader.secondLevelStatistics?.undecodable == 1, "\(key)")
                    // The next replica takes the replacement: sealed, no source call.
                    #expect(try await family(fleet).value(for: key) { _ in 0 } == 42, "\(key)")
                }
                print(
                    "entries planted without the secret (no seal, another secret's, a real seal on another key): "
                        + "each not served, counted as undecodable, and replaced by a sealed load")
            }
        }

        /// The table holds the payload's cap (a codec's and a seal): a payload one byte larger cannot
        /// be stored, by anyone.
        @Test func aPayloadPastTheCapIsRefusedByTheTable() async throws {
            try await withClient { client in
                let level = PostgresSecondLevel(client: client, logger: quietLogger)
                let key = uniquePrefix("cap") + "k"
                let cap = AsyncStateStoredEntry.maximumPayloadBytes
                var entry = Self.entry("", version: 1)
                entry.payload = Array(repeating: 0x61, count: cap)
                #expect(try await level.write(entry, for: key))
                entry.payload.append(0x61)
                entry.version = 2
                do {
                    _ = try await level.write(entry, for: key)
                    Issue.record("a payload of \(cap + 1) bytes was stored")
                } catch let error as PSQLError {
                    #expect(error.serverInfo?[.sqlState] == "23514", "\(String(reflecting: error))")
                }
            }
        }

        /// A table made by the release before sealed entries holds the codec's cap alone: its
        /// constraint is replaced, under its own name, by one with room for a seal.
        @Test func anEarlierReleasesPayloadCapIsReplaced() async throws {
            try await withTwoRoles("cap", otherMayConnect: false) { roles in
                for statement in [
                    "CREATE SEQUENCE public.async_state_versions",
                    """
                    CREATE UNLOGGED TABLE public.async_state_entries (key text PRIMARY KEY, payload bytea NOT NULL,
                        succeeded_at float8 NOT NULL, fresh_until float8 NOT NULL, version bigint NOT NULL,
                        lease_token bigint, lease_until timestamptz)
                    """,
                    """
                    ALTER TABLE public.async_state_entries ADD CONSTRAINT async_state_entries_payload_size
                        CHECK (octet_length(payload) <= \(AsyncStateCodec<Never>.maximumPayloadBytes))
                    """,
                ] {
                    try await Self.connectAndQuery(roles.service, statement)
                }
                try await withClient(roles.service) { client in
                    let level = PostgresSecondLevel(client: client, logger: quietLogger)
                    try await level.prepare()
                    let rows = try await client.query(
                        """
                        SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
                        WHERE conrelid = 'public.async_state_entries'::regclass AND contype = 'c'
                        """, logger: quietLogger)
                    var constraints: [String: String] = [:]
                    for try await (name, definition) in rows.decode((String, String).self) {
                        constraints[name] = definition
                    }
                    #expect(
                        constraints == [
                            "async_state_entries_payload_size":
                                "CHECK ((octet_length(payload) <= \(AsyncStateStoredEntry.maximumPayloadBytes)))"
                        ])
                    var entry = Self.entry("", version: 1)
                    entry.payload = Array(repeating: 0x61, count: AsyncStateStoredEntry.maximumPayloadBytes)
                    #expect(try await level.write(entry, for: "tenants:large"))
                }
            }
        }

        /// Misses of keys that never get an entry (tenants that do not exist) leave no rows: the
        /// lease's row goes with the lease; one whose holder died goes with the periodic clean-up.
        @Test func missesOfKeysWithoutEntriesLeaveNoRows() async throws {
            try await withClient { client in
                let level = PostgresSecondLevel(client: client, logger: quietLogger)
                let namespace = String(uniquePrefix("absent").dropLast())
                let family = Self.family(on: level, namespace: namespace, capacity: 100)
                struct NoSuchTenant: Error {}
                let misses = 10_000
                await withTaskGroup(of: Void.self) { group in
                    for worker in 0..<16 {
                        group.addTask {
                            for index in stride(from: worker, to: misses, by: 16) {
                                _ = try? await family.value(for: "nobody-\(index)") { _ in throw NoSuchTenant() }
                            }
                        }
                    }
                }
                // A lease is given back in a task of its own once its miss has answered: the last ones
                // may still be on their way.
                let count = Mutex<Int64>(-1)
                let emptied = try await eventually(timeout: .seconds(10)) {
                    let rows = try await client.query(
                        "SELECT count(*)::bigint FROM async_state_entries WHERE starts_with(key, \(namespace + ":"))",
                        logger: quietLogger)
                    for try await value in rows.decode(Int64.self) { count.withLock { $0 = value } }
                    return count.withLock { $0 } == 0
                }
                print(
                    "\(misses) misses of keys without entries: \(count.withLock { $0 }) rows left in async_state_entries"
                )
                #expect(emptied)
                // A holder that died: its row stays until the clean-up.
                let dead = "\(namespace):dead"
                guard case .acquired = try await level.acquireLease(on: dead, for: .milliseconds(1)) else {
                    Issue.record("no lease")
                    return
                }
                try await Task.sleep(for: .milliseconds(50))
                #expect(try await level.deleteAbandonedLeases(olderThan: .zero) >= 1)
                #expect(try await level.read(dead) == nil)
            }
        }

        /// The grants the type's documentation gives: a role other than the service's cannot connect
        /// to the service's database, and one allowed to connect (a reporting role) can neither read
        /// nor write the entries nor draw a version.
        @Test func anotherRoleIsRefused() async throws {
            try await withTwoRoles("l2", otherMayConnect: false) { roles in
                // The service's role creates, and so owns, the table and the sequence.
                try await withClient(roles.service) { client in
                    let level = PostgresSecondLevel(client: client, logger: quietLogger)
                    let stored = try await level.write(Self.entry("v", version: 1), for: "tenants:acme")
                    #expect(stored)
                }
                // Another role cannot even connect.
                await #expect(throws: PSQLError.self) {
                    try await Self.connectAndQuery(roles.other, "SELECT 1")
                }
                // Allowed to connect, it still has no privilege on the entries or the sequence.
                try await withClient { admin in
                    try await admin.query(
                        PostgresQuery(unsafeSQL: "GRANT CONNECT ON DATABASE \(roles.database) TO \(roles.otherName)"),
                        logger: quietLogger)
                }
                for statement in [
                    "SELECT payload FROM async_state_entries",
                    "UPDATE async_state_entries SET fresh_until = 'Infinity'",
                    "INSERT INTO async_state_entries VALUES ('tenants:x', '', 0, 0, 1)",
                    "DELETE FROM async_state_entries",
                    "SELECT nextval('async_state_versions')",
                ] {
                    do {
                        try await Self.connectAndQuery(roles.other, statement)
                        Issue.record("another role could run: \(statement)")
                    } catch let error as PSQLError {
                        #expect(error.serverInfo?[.sqlState] == "42501", "\(statement): \(String(reflecting: error))")
                    }
                }
                try await Self.connectAndQuery(roles.other, "SELECT 1")  // it did connect
            }
        }

        /// Where another role may create in `public`, it creates the entries' table and sequence
        /// before the service and grants the service everything on them: the service refuses to
        /// use what it does not own (the other role could read, change and grant its data).
        @Test func tablesAnotherRoleCreatedFirstAreRefused() async throws {
            try await withTwoRoles("own", otherMayConnect: true) { roles in
                try await Self.connectAndQuery(
                    roles.service, "GRANT CREATE ON SCHEMA public TO \(roles.otherName)")
                for statement in [
                    "CREATE SEQUENCE public.async_state_versions",
                    """
                    CREATE UNLOGGED TABLE public.async_state_entries (key text PRIMARY KEY, payload bytea NOT NULL,
                        succeeded_at float8 NOT NULL, fresh_until float8 NOT NULL, version bigint NOT NULL,
                        lease_token bigint, lease_until timestamptz)
                    """,
                    "GRANT ALL ON public.async_state_entries, public.async_state_versions TO \(roles.serviceName)",
                ] {
                    try await Self.connectAndQuery(roles.other, statement)
                }
                try await withClient(roles.service) { client in
                    let level = PostgresSecondLevel(client: client, logger: quietLogger)
                    do {
                        _ = try await level.write(Self.entry("v", version: 1), for: "tenants:acme")
                        Issue.record("the service wrote into a table another role owns")
                    } catch let error as PostgresSchema.ForeignOwner {
                        #expect(Set(error.objects.map(\.name)) == ["async_state_entries", "async_state_versions"])
                        #expect(error.objects.allSatisfy { $0.owner == roles.otherName })
                        print("tables another role created first: \(error)")
                    }
                    // The service's readiness probe prepares them at start: not ready, with the reason.
                    let store = BoundedTenantStore(
                        PostgresTenantStore(
                            client: client, logger: quietLogger, preparing: [{ try await level.prepare() }]),
                        timeout: .seconds(10))
                    do {
                        try await store.probe()
                        Issue.record("the probe passed with tables another role owns")
                    } catch let error as TenantStoreUnavailable {
                        #expect(error.reason.hasPrefix("refusing to use public.async_state_"), "\(error)")
                        #expect(error.reason.contains("owned by \(roles.otherName)"), "\(error)")
                    }
                }
            }
        }

        /// The service's role and another, each with a client configuration, and a database the
        /// service's role owns (`otherMayConnect`: whether PUBLIC keeps `CONNECT` on it), for `body`;
        /// all dropped afterwards, whatever happened.
        func withTwoRoles(
            _ prefix: String, otherMayConnect: Bool, _ body: (TwoRoles) async throws -> Void
        ) async throws {
            let suffix = String(UInt32.random(in: 0...UInt32.max), radix: 16)
            let (service, other, database) = (
                "\(prefix)_service_\(suffix)", "\(prefix)_other_\(suffix)", "\(prefix)_db_\(suffix)"
            )
            let (servicePassword, otherPassword) = (UUID().uuidString, UUID().uuidString)
            let server = try Server.settings()
            func configuration(_ user: String, _ password: String) -> PostgresClient.Configuration {
                var configuration = server.client
                (configuration.username, configuration.password, configuration.database) = (user, password, database)
                return configuration
            }
            // Role and database names cannot be bound: these are made here, of hex digits.
            try await withClient { admin in
                for statement in [
                    "CREATE ROLE \(service) LOGIN PASSWORD '\(servicePassword)'",
                    "CREATE ROLE \(other) LOGIN PASSWORD '\(otherPassword)'",
                    "CREATE DATABASE \(database) OWNER \(service)",
                ] + (otherMayConnect ? [] : ["REVOKE CONNECT ON DATABASE \(database) FROM PUBLIC"]) {
                    try await admin.query(PostgresQuery(unsafeSQL: statement), logger: quietLogger)
                }
            }
            let roles = TwoRoles(
                service: configuration(service, servicePassword), other: configuration(other, otherPassword),
                serviceName: service, otherName: other, database: database)
            do {
                try await body(roles)
            } catch {
                try await Self.dropEverything(database: database, roles: [service, other])
                throw error
            }
            try await Self.dropEverything(database: database, roles: [service, other])
        }

        /// What ``withTwoRoles(_:otherMayConnect:_:)`` made.
        struct TwoRoles {
            let service: PostgresClient.Configuration
            let other: PostgresClient.Configuration
            let serviceName: String
            let otherName: String
            let database: String
        }

        /// One connection of `configuration`'s role (its refusal is an error at once, where a pool
        /// would keep trying), running `statement`.
        static func connectAndQuery(_ configuration: PostgresClient.Configuration, _ statement: String) async throws {
            var single = try Server.settings().connection()
            (single.username, single.password, single.database) = (
                configuration.username, configuration.password, configuration.database
            )
            let connection = try await PostgresConnection.connect(configuration: single, id: 9, logger: quietLogger)
            do {
                // A statement's error may come with its rows: read them all.
                for try await _ in try await connection.query(PostgresQuery(unsafeSQL: statement), logger: quietLogger)
                {}
            } catch {
                try? await connection.close()
                throw error
            }
            try await connection.close()
        }

        static func dropEverything(database: String, roles: [String]) async throws {
            try await withClient { admin in
                try await admin.query(
                    PostgresQuery(unsafeSQL: "DROP DATABASE IF EXISTS \(database) WITH (FORCE)"), logger: quietLogger)
                for role in roles {
                    try await admin.query(PostgresQuery(unsafeSQL: "DROP ROLE IF EXISTS \(role)"), logger: quietLogger)
                }
            }
        }
    }
}
