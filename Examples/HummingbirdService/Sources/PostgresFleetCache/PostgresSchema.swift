import Logging
import PostgresNIO
import Synchronization

/// Statements that create what a type needs in the database (`CREATE … IF NOT EXISTS`), run once per
/// process before its first query, and again after a failure.
///
/// Replicas starting together serialize on an advisory lock (`lock`): concurrent `CREATE TABLE IF
/// NOT EXISTS` can otherwise fail. Each statement is read to its end, so that an error the server
/// sends after the statement began is thrown here.
public final class PostgresSchema: Sendable {
    private let client: PostgresClient
    private let logger: Logger
    private let lock: Int64
    private let statements: [String]
    private let task = Mutex<Task<Void, any Error>?>(nil)

    /// `statements` (fixed SQL, with no input in it), run in one transaction holding advisory lock
    /// `lock` (a number no other schema uses).
    public init(client: PostgresClient, logger: Logger, lock: Int64, statements: [String]) {
        (self.client, self.logger, self.lock, self.statements) = (client, logger, lock, statements)
    }

    /// Returns once the statements have run in this process; throws their error (the next call then
    /// tries again).
    public func prepare() async throws {
        let task = task.withLock { task in
            if let task { return task }
            let (client, logger, lock, statements) = (client, logger, lock, statements)
            let created = Task {
                try await client.withTransaction(logger: logger) { connection in
                    for try await _ in try await connection.query(
                        "SELECT pg_advisory_xact_lock(\(lock))", logger: logger)
                    {}
                    for statement in statements {
                        for try await _ in try await connection.query(
                            PostgresQuery(unsafeSQL: statement), logger: logger)
                        {}
                    }
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
}
