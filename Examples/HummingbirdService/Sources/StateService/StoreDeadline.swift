import Foundation
import PostgresFleetCache
import Synchronization

/// A call to the tenant store that did not answer in time, or failed: what a client and the
/// readiness probe are told — which store, what it was doing, and why, never a secret (the error's
/// own text is not included: a driver's error may quote its connection string).
public struct TenantStoreUnavailable: Error, Sendable, Equatable, CustomStringConvertible {
    /// What was asked: `read`, `write` or `probe`.
    public var operation: String
    /// Why, in a short fixed phrase (``TenantStoreUnavailable/reason(of:)``).
    public var reason: String

    public var description: String { "the tenant store is unavailable (\(operation)): \(reason)" }

    /// A short reason for `error` that names what is wrong without quoting it: the kinds a
    /// PostgreSQL client meets when the store is misconfigured or down.
    public static func reason(of error: any Error) -> String {
        // Names the tables and the role that owns them: no secret.
        if let foreign = error as? PostgresSchema.ForeignOwner { return foreign.description }
        let text = String(reflecting: error)
        let known: [(needle: String, reason: String)] = [
            ("28P01", "authentication failed (wrong password)"),
            ("28000", "authentication failed (role not allowed)"),
            ("3D000", "the database does not exist"),
            ("sslUnsupported", "the server does not offer TLS, and sslmode requires it"),
            ("TLS", "the TLS handshake failed"),
            ("SSL", "the TLS handshake failed"),
            ("connectionRefused", "the connection was refused"),
            ("Connection refused", "the connection was refused"),
            ("connectTimeout", "the connection timed out"),
            ("unknownHost", "the host name does not resolve"),
        ]
        for (needle, reason) in known where text.contains(needle) { return reason }
        return "it failed (\(type(of: error)))"
    }
}

/// Runs `body`, giving up after `timeout` with ``TenantStoreUnavailable``: the caller is released
/// at the deadline even when `body` ignores cancellation (it is cancelled and left behind). An
/// ``UpstreamError`` (the store's own answer: not found) passes through; any other error becomes a
/// ``TenantStoreUnavailable`` with its reason; the caller's cancellation ends the wait at once.
func withStoreDeadline<T: Sendable>(
    _ operation: String, timeout: Duration, _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    let race = DeadlineRace<T>()
    let work = Task {
        do {
            race.finish(.success(try await body()))
        } catch let error as UpstreamError {
            race.finish(.failure(error))
        } catch let error as TenantStoreUnavailable {
            race.finish(.failure(error))
        } catch is CancellationError {
            race.finish(.failure(CancellationError()))
        } catch {
            race.finish(
                .failure(TenantStoreUnavailable(operation: operation, reason: TenantStoreUnavailable.reason(of: error)))
            )
        }
    }
    let timer = Task {
        try? await Task.sleep(for: timeout)
        race.finish(.failure(TenantStoreUnavailable(operation: operation, reason: "no answer within \(timeout)")))
    }
    defer {
        work.cancel()
        timer.cancel()
    }
    return try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation { race.wait($0) }
    } onCancel: {
        race.finish(.failure(CancellationError()))
    }
}

/// The first of a call's result, its deadline and its caller's cancellation: the one the waiting
/// caller gets.
private final class DeadlineRace<T: Sendable>: Sendable {
    private let state = Mutex<(waiter: CheckedContinuation<T, any Error>?, result: Result<T, any Error>?)>((nil, nil))

    /// Settles the race with `result`, unless it is settled.
    func finish(_ result: Result<T, any Error>) {
        let waiter = state.withLock { state -> CheckedContinuation<T, any Error>? in
            guard state.result == nil else { return nil }
            state.result = result
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(with: result)
    }

    /// Resumes `waiter` with the result, now or when it comes.
    func wait(_ waiter: CheckedContinuation<T, any Error>) {
        let settled = state.withLock { state -> Result<T, any Error>? in
            if state.result == nil { state.waiter = waiter }
            return state.result
        }
        if let settled { waiter.resume(with: settled) }
    }
}

/// A tenant store whose every call is bounded by `timeout` (``withStoreDeadline(_:timeout:_:)``).
public struct BoundedTenantStore: TenantStore {
    /// The store called.
    public var base: any TenantStore
    /// The longest one call may take.
    public var timeout: Duration

    public init(_ base: any TenantStore, timeout: Duration) { (self.base, self.timeout) = (base, timeout) }

    public func tenant(_ tenant: String) async throws -> TenantConfig {
        let base = base
        return try await withStoreDeadline("read", timeout: timeout) { try await base.tenant(tenant) }
    }

    public func write(_ tenant: String, settings: [String: String]) async throws -> TenantConfig {
        let base = base
        return try await withStoreDeadline("write", timeout: timeout) {
            try await base.write(tenant, settings: settings)
        }
    }

    public func probe() async throws {
        let base = base
        try await withStoreDeadline("probe", timeout: timeout) { try await base.probe() }
    }
}
