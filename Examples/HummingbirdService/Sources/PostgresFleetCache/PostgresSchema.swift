import Logging
import PostgresNIO
import Synchronization

/// Statements that create what a type needs in the database (`CREATE … IF NOT EXISTS`), run once per
/// process before its first query, and again after a failure.
///
/// Replicas starting together serialize on an advisory lock (`lock`): concurrent `CREATE TABLE IF
/// NOT EXISTS` can otherwise fail. Each statement is read to its end, so that an error the server
/// sends after the statement began is thrown here.
///
/// The statements name their objects in schema `public` (never through `search_path`), and once
/// they have run, every object named in `owned` must belong to the role the service connects as:
/// where `PUBLIC` may create in `public` (before PostgreSQL 15), another role could have created
/// the table first, `IF NOT EXISTS` would then use it, and that role would own — read, change,
/// grant — the service's data. Such an object is refused with ``ForeignOwner``, and nothing is used.
public final class PostgresSchema: Sendable {
    private let client: PostgresClient
    private let logger: Logger
    private let lock: Int64
    private let statements: [String]
    private let owned: [String]
    private let task = Mutex<Task<Void, any Error>?>(nil)

    /// `statements` (fixed SQL, with no input in it), run in one transaction holding advisory lock
    /// `lock` (a number no other schema uses); then the objects named `owned` (tables, sequences
    /// in `public`) must be the connecting role's.
    public init(client: PostgresClient, logger: Logger, lock: Int64, owned: [String], statements: [String]) {
        (self.client, self.logger, self.lock, self.owned, self.statements) = (client, logger, lock, owned, statements)
    }

    /// Objects the service would use that another role owns.
    public struct ForeignOwner: Error, CustomStringConvertible {
        /// Each object, with the role that owns it.
        public var objects: [(name: String, owner: String)]
        public var description: String {
            let list = objects.map { "public.\($0.name) (owned by \($0.owner))" }.joined(separator: ", ")
            return "refusing to use \(list): the service's role must own its tables and sequences"
        }
    }

    /// Returns once the statements have run in this process; throws their error (the next call then
    /// tries again).
    public func prepare() async throws {
        let task = task.withLock { task in
            if let task { return task }
            let (client, logger, lock, statements, owned) = (client, logger, lock, statements, owned)
            let created = Task {
                do {
                    try await Self.create(statements, owned: owned, lock: lock, client: client, logger: logger)
                } catch let error as PostgresTransactionError {
                    // The refusal as itself, not wrapped in the transaction's error.
                    if let foreign = error.closureError as? ForeignOwner { throw foreign }
                    throw error
                }
            }
            task = created
            return created
        }
        do {
            try await task.value
        } catch {
            self.task.withLock { if $0 == task { $0 = nil } }
            throw error
        }
    }

    /// Runs `statements` in one transaction under advisory lock `lock`, then checks `owned`.
    private static func create(
        _ statements: [String], owned: [String], lock: Int64, client: PostgresClient, logger: Logger
    ) async throws {
        try await client.withTransaction(logger: logger) { connection in
            for try await _ in try await connection.query(
                "SELECT pg_advisory_xact_lock(\(lock))", logger: logger)
            {}
            // Before (what exists is not altered if it is another role's) and after (what was made).
            try await checkOwnership(owned, on: connection, logger: logger)
            for statement in statements {
                for try await _ in try await connection.query(
                    PostgresQuery(unsafeSQL: statement), logger: logger)
                {}
            }
            try await checkOwnership(owned, on: connection, logger: logger)
        }
    }

    /// Throws ``ForeignOwner`` when any of `owned` (in `public`) belongs to another role.
    private static func checkOwnership(_ owned: [String], on connection: PostgresConnection, logger: Logger)
        async throws
    {
        let rows = try await connection.query(
            """
            SELECT c.relname, pg_get_userbyid(c.relowner) FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relname = ANY(\(owned)) AND c.relowner <> (
                SELECT oid FROM pg_roles WHERE rolname = current_user)
            """, logger: logger)
        var foreign: [(name: String, owner: String)] = []
        for try await (name, owner) in rows.decode((String, String).self) { foreign.append((name, owner)) }
        if !foreign.isEmpty { throw ForeignOwner(objects: foreign) }
    }
}
