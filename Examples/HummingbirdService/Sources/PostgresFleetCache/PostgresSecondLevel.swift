import AsyncStateKit
import Foundation
import Logging
import PostgresNIO

/// A second level (`AsyncStateSecondLevel`) in PostgreSQL, shared by every replica of a service
/// that uses one database: a family or state given it costs the source one call per key for the
/// whole fleet, and a replica that starts late reads what the others loaded.
///
/// ```swift
/// let level = PostgresSecondLevel(client: client, logger: logger)
/// let tenants = AsyncStateFamily<String, TenantConfig>(
///     expiry: .seconds(60),
///     secondLevel: AsyncStateSecondLevelOptions(level: level, namespace: "tenants", codec: .json))
/// ```
///
/// **Schema** (created on first use, serialized between replicas by an advisory lock):
///
/// ```sql
/// CREATE SEQUENCE async_state_versions;                 -- logged: survives a crash
/// CREATE UNLOGGED TABLE async_state_entries (
///     key text PRIMARY KEY,
///     payload bytea NOT NULL,                           -- '' for an invalidation's marker
///     succeeded_at float8 NOT NULL,                     -- seconds since 2001-01-01 (Foundation's
///     fresh_until float8 NOT NULL,                      -- reference date), exact for a `Date`
///     version bigint NOT NULL,
///     lease_token bigint,
///     lease_until timestamptz);                         -- on the server's clock
/// ```
///
/// - **Every version and every lease token is drawn from one sequence**, inside the statement that
///   stores it and after the row's lock is taken (a write through a replica, `put`, draws its
///   version first — the entry's seal covers it — and stores it unless a newer one landed since): a
///   key's versions only grow, every token is greater than every version stored before it, and an
///   invalidation's version is greater than every token given before it. The entries are in an UNLOGGED table (no write-ahead log: cheap
///   writes), which PostgreSQL empties after a crash; the sequence is logged and never goes back,
///   so versions never reset, even then: a replica that remembers a version gets a greater one
///   from the next load.
/// - **Leases** are columns of the key's row, expiring on the server's clock (`clock_timestamp()`),
///   so the replicas' clocks need not agree on them. Giving a lease back clears it only if the
///   token still holds it.
/// - **Bound parameters only**: keys, payloads and durations are never spliced into SQL; the table
///   and sequence names are fixed.
/// - **Nothing here is trusted by the family**: an entry it cannot decode is dropped and loaded
///   again (the envelope of `AsyncStateCodec`), and every call is bounded by the family's timeout.
///
/// **Grants.** The entries decide what every replica serves: only the service's role may touch
/// them. The role that runs the service creates (and so owns) the table and the sequence, in schema
/// `public` by name, and PostgreSQL gives other roles no privilege on a new table; before its first
/// query it checks that it owns both, and refuses them otherwise (``PostgresSchema/ForeignOwner``). Keep it so, and keep other roles off
/// the database altogether (`NOTIFY` cannot be restricted by a grant; the invalidation bus's
/// authenticator is its guard):
///
/// ```sql
/// REVOKE CONNECT ON DATABASE app FROM PUBLIC;
/// GRANT CONNECT ON DATABASE app TO app_service;
/// GRANT CREATE ON SCHEMA public TO app_service;   -- or create the two objects as app_service
/// ```
///
/// A row that holds only a lease is deleted when the lease is given back, so misses of keys that
/// never get an entry (a tenant that does not exist) leave no rows; a holder that dies leaves its
/// row until ``deleteAbandonedLeases(olderThan:)``, which the service runs now and then. A version
/// beyond the sequence's `last_value` was written by hand: such a row reads as garbage (never
/// served) and the next write replaces it. Other rows are kept: one per key ever cached (a marker
/// for an invalidated key that was never loaded). A periodic `DELETE FROM async_state_entries WHERE fresh_until < <now − a day>` is
/// safe once no load can take longer than that: a holder still loading with an older token would
/// otherwise land its write on a key whose marker was deleted.
public final class PostgresSecondLevel: AsyncStateSecondLevel {
    private let client: PostgresClient
    private let logger: Logger
    private let schema: PostgresSchema

    /// A second level in `client`'s database (run the client in the service group).
    public init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
        schema = PostgresSchema(
            client: client, logger: logger, lock: 7_160_232,
            owned: ["async_state_entries", "async_state_versions"],
            statements: [
                "CREATE SEQUENCE IF NOT EXISTS public.async_state_versions",
                """
                CREATE UNLOGGED TABLE IF NOT EXISTS public.async_state_entries (
                    key text PRIMARY KEY, payload bytea NOT NULL, succeeded_at float8 NOT NULL,
                    fresh_until float8 NOT NULL, version bigint NOT NULL, lease_token bigint,
                    lease_until timestamptz)
                """,
                // The payload's cap (AsyncStateStoredEntry.maximumPayloadBytes: the codec's, and a
                // seal) held by the table itself, also for a table made by an earlier release, whose
                // constraint of the same name (without room for the seal) is replaced — under the
                // same name, so that an earlier release starting during a rolling upgrade finds it
                // and adds no other: nobody stores a larger payload.
                """
                DO $$ BEGIN
                    IF EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'async_state_entries_payload_size'
                        AND conrelid = 'public.async_state_entries'::regclass
                        AND pg_get_constraintdef(oid) NOT LIKE '%<= \(AsyncStateStoredEntry.maximumPayloadBytes))%')
                    THEN
                        ALTER TABLE public.async_state_entries DROP CONSTRAINT async_state_entries_payload_size;
                    END IF;
                    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'async_state_entries_payload_size'
                        AND conrelid = 'public.async_state_entries'::regclass)
                    THEN
                        ALTER TABLE public.async_state_entries ADD CONSTRAINT async_state_entries_payload_size
                            CHECK (octet_length(payload) <= \(AsyncStateStoredEntry.maximumPayloadBytes));
                    END IF;
                END $$
                """,
            ])
    }

    /// What a marker (an invalidated key with no value) stores as its dates.
    private static let never = Date.distantPast.timeIntervalSinceReferenceDate

    /// Whether the version in `column` was planted: beyond what the sequence has handed out, so
    /// written by hand. The one statement of the rule, in every query that reads or overwrites a
    /// version (fixed SQL, no input in it).
    private static func planted(_ column: StaticString) -> String {
        "\(column) > (SELECT last_value FROM public.async_state_versions)"
    }

    /// A version or token as PostgreSQL's `bigint`, or `nil` beyond it (the sequence never goes there).
    private static func bigint(_ value: UInt64) -> Int64? { Int64(exactly: value) }

    /// A `bigint` read back; the sequence starts at 1, so never negative.
    /// An entry's payload and dates as the row stores them (dates as seconds since 2001).
    private static func columns(of entry: AsyncStateStoredEntry) -> (ByteBuffer, Double, Double) {
        (
            ByteBuffer(bytes: entry.payload), entry.succeededAt.timeIntervalSinceReferenceDate,
            entry.freshUntil.timeIntervalSinceReferenceDate
        )
    }

    private static func version(_ value: Int64) throws -> UInt64 {
        guard let version = UInt64(exactly: value) else { throw CorruptRow(column: "version") }
        return version
    }

    public func read(_ key: String) async throws -> AsyncStateStoredEntry? {
        try await prepare()
        // A version beyond what the sequence has handed out was written by hand (a planted entry,
        // with a version that would make replicas ignore every later change of the key): it reads
        // as garbage, version 0 — never served, counted by the family as undecodable, and replaced
        // by its next write (which ``write(_:for:)`` lets through over such a version).
        let rows = try await client.query(
            """
            SELECT CASE WHEN planted THEN '\\xff'::bytea ELSE payload END,
                CASE WHEN planted THEN \(Self.never) ELSE succeeded_at END,
                CASE WHEN planted THEN \(Self.never) ELSE fresh_until END, CASE WHEN planted THEN 0 ELSE version END
            FROM (SELECT *, \(unescaped: Self.planted("version")) AS planted
                FROM public.async_state_entries WHERE key = \(key)) AS row
            """,
            logger: logger)
        for try await (payload, succeededAt, freshUntil, version) in rows.decode(
            (ByteBuffer, Double, Double, Int64).self)
        {
            return AsyncStateStoredEntry(
                payload: Array(payload.readableBytesView),
                succeededAt: Date(timeIntervalSinceReferenceDate: succeededAt),
                freshUntil: Date(timeIntervalSinceReferenceDate: freshUntil), version: try Self.version(version))
        }
        return nil
    }

    public func write(_ entry: AsyncStateStoredEntry, for key: String) async throws -> Bool {
        guard let version = Self.bigint(entry.version) else { return false }
        try await prepare()
        let (payload, succeededAt, freshUntil) = Self.columns(of: entry)
        // The row's lock is taken before the condition is checked: of two writes racing, the older
        // version loses whichever commits first. The lease columns are left as they are.
        let rows = try await client.query(
            """
            INSERT INTO public.async_state_entries AS e (key, payload, succeeded_at, fresh_until, version)
            VALUES (\(key), \(payload), \(succeededAt), \(freshUntil), \(version))
            ON CONFLICT (key) DO UPDATE SET payload = EXCLUDED.payload, succeeded_at = EXCLUDED.succeeded_at,
                fresh_until = EXCLUDED.fresh_until, version = EXCLUDED.version
            WHERE e.version < EXCLUDED.version OR \(unescaped: Self.planted("e.version"))
            RETURNING 1
            """, logger: logger)
        for try await _ in rows.decode(Int.self) { return true }
        return false
    }

    public func acquireLease(on key: String, for duration: Duration) async throws -> AsyncStateLease {
        try await prepare()
        let seconds = Self.seconds(duration)
        // One statement: take the lease if it is free or expired (the token drawn under the row's
        // lock, with the version stored then: the holder reads again if another replica wrote
        // since its read), else report the holder's time left from the row as it was.
        let rows = try await client.query(
            """
            WITH taken AS (
                INSERT INTO public.async_state_entries AS e
                    (key, payload, succeeded_at, fresh_until, version, lease_token, lease_until)
                VALUES (\(key), '', \(Self.never), \(Self.never), 0, nextval('public.async_state_versions'),
                    clock_timestamp() + make_interval(secs => \(seconds)))
                ON CONFLICT (key) DO UPDATE SET lease_token = nextval('public.async_state_versions'),
                    lease_until = clock_timestamp() + make_interval(secs => \(seconds))
                WHERE e.lease_until IS NULL OR e.lease_until <= clock_timestamp()
                RETURNING e.lease_token,
                    CASE WHEN \(unescaped: Self.planted("e.version")) THEN 0 ELSE e.version END)
            SELECT lease_token, version, NULL::float8 FROM taken
            UNION ALL
            SELECT NULL::bigint, NULL::bigint, extract(epoch FROM lease_until - clock_timestamp())::float8
            FROM public.async_state_entries WHERE key = \(key) AND NOT EXISTS (SELECT 1 FROM taken)
            """, logger: logger)
        for try await (token, stored, left) in rows.decode((Int64?, Int64?, Double?).self) {
            if let token {
                return .acquired(token: try Self.version(token), storedVersion: try stored.map(Self.version))
            }
            return .held(expiresIn: left.map { .seconds(max(0, min($0, 86_400))) } ?? .zero)
        }
        // The lease was taken by a replica whose row this statement's snapshot predates: held, for
        // an unknown time (the family asks again at its next poll).
        return .held(expiresIn: .zero)
    }

    public func releaseLease(on key: String, token: UInt64) async throws {
        guard let token = Self.bigint(token) else { return }
        try await prepare()
        // A row that holds only the lease (version 0: no entry was ever written or invalidated for
        // the key, such as a tenant that does not exist) goes with it: misses of keys that never
        // get an entry leave no rows behind.
        try await run(
            """
            WITH gone AS (
                DELETE FROM public.async_state_entries WHERE key = \(key) AND lease_token = \(token) AND version = 0
                RETURNING 1)
            UPDATE public.async_state_entries SET lease_token = NULL, lease_until = NULL
            WHERE key = \(key) AND lease_token = \(token) AND NOT EXISTS (SELECT 1 FROM gone)
            """)
    }

    public func invalidate(_ key: String) async throws -> UInt64 {
        try await prepare()
        // A marker when there is no row; else the entry goes stale. The version is drawn under the
        // row's lock (`SET … = nextval`), so it is greater than whatever a racing statement stored.
        let rows = try await client.query(
            """
            INSERT INTO public.async_state_entries AS e (key, payload, succeeded_at, fresh_until, version)
            VALUES (\(key), '', \(Self.never), \(Self.never), nextval('public.async_state_versions'))
            ON CONFLICT (key) DO UPDATE SET version = nextval('public.async_state_versions'),
                fresh_until = \(Self.never), lease_token = NULL, lease_until = NULL
            RETURNING e.version
            """, logger: logger)
        for try await version in rows.decode(Int64.self) { return try Self.version(version) }
        throw CorruptRow(column: "version")
    }

    public func put(for key: String, entry: @Sendable (_ version: UInt64) throws -> AsyncStateStoredEntry)
        async throws -> UInt64
    {
        try await prepare()
        // The version first (the entry's seal covers it), from the sequence: greater than every
        // version stored and every token given so far. Then the value under it, the lease dropped
        // if it was given before (a holder that loaded before this write cannot overwrite it; one
        // given since keeps it) — unless a newer version landed in between (a lease granted
        // meanwhile, whose holder wrote first), which stays.
        let next = try await client.query("SELECT nextval('public.async_state_versions')", logger: logger)
        var drawn: Int64?
        for try await version in next.decode(Int64.self) { drawn = version }
        guard let drawn else { throw CorruptRow(column: "version") }
        let version = try Self.version(drawn)
        var made = try entry(version)
        made.version = version
        let (payload, succeededAt, freshUntil) = Self.columns(of: made)
        let rows = try await client.query(
            """
            INSERT INTO public.async_state_entries AS e (key, payload, succeeded_at, fresh_until, version)
            VALUES (\(key), \(payload), \(succeededAt), \(freshUntil), \(drawn))
            ON CONFLICT (key) DO UPDATE SET payload = EXCLUDED.payload, succeeded_at = EXCLUDED.succeeded_at,
                fresh_until = EXCLUDED.fresh_until, version = EXCLUDED.version,
                lease_token = CASE WHEN e.lease_token > EXCLUDED.version THEN e.lease_token END,
                lease_until = CASE WHEN e.lease_token > EXCLUDED.version THEN e.lease_until END
            WHERE e.version < EXCLUDED.version OR \(unescaped: Self.planted("e.version"))
            RETURNING 1
            """, logger: logger)
        for try await _ in rows.decode(Int.self) {}
        return version
    }

    public func invalidateAll(withPrefix prefix: String) async throws {
        try await prepare()
        try await run(
            """
            UPDATE public.async_state_entries SET version = nextval('public.async_state_versions'),
                fresh_until = \(Self.never), lease_token = NULL, lease_until = NULL
            WHERE starts_with(key, \(prefix))
            """)
    }

    /// Deletes the rows that hold only a lease that expired more than `age` ago (its holder died
    /// before giving it back); returns how many. Bounded per call (10,000 rows), so that it never
    /// holds the table long: run it every minute or so.
    @discardableResult
    public func deleteAbandonedLeases(olderThan age: Duration = .seconds(60)) async throws -> Int {
        try await prepare()
        let rows = try await client.query(
            """
            WITH gone AS (
                DELETE FROM public.async_state_entries WHERE key IN (
                    SELECT key FROM public.async_state_entries
                    WHERE version = 0 AND lease_until < clock_timestamp() - make_interval(secs => \(Self.seconds(age)))
                    LIMIT 10000)
                AND version = 0 AND lease_until < clock_timestamp() - make_interval(secs => \(Self.seconds(age)))
                RETURNING 1)
            SELECT count(*)::bigint FROM gone
            """, logger: logger)
        for try await count in rows.decode(Int64.self) { return Int(count) }
        return 0
    }

    /// Runs `query` to its end: an error the server sends with (or instead of) the rows is thrown
    /// here, not lost with a sequence nobody reads.
    private func run(_ query: PostgresQuery) async throws {
        for try await _ in try await client.query(query, logger: logger) {}
    }

    /// `duration` in seconds, within a day (a lease is never meant to last longer).
    private static func seconds(_ duration: Duration) -> Double {
        let (seconds, attoseconds) = duration.components
        guard seconds >= 0 else { return 0 }
        guard seconds < 86_400 else { return 86_400 }
        return Double(seconds) + Double(attoseconds) / 1e18
    }

    /// Creates the sequence and the table once per process (tried again after a failure), and checks
    /// that the service's role owns them (``PostgresSchema/ForeignOwner`` otherwise). Every call
    /// does it first; a service calls it at start too (its readiness probe), so that tables another
    /// role owns make it not ready, with the reason, before any request.
    public func prepare() async throws { try await schema.prepare() }

    /// A row whose version is not one the sequence gives (someone wrote the table by hand).
    public struct CorruptRow: Error, CustomStringConvertible {
        /// The column that held it.
        public var column: String
        public var description: String { "async_state_entries holds a \(column) the sequence never gives" }
    }
}
