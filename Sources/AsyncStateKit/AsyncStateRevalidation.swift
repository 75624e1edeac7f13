/// What a conditional operation answers: a new value, or that the value it was given is still
/// current — an HTTP `304 Not Modified` to a request that sent the entity tag stored with the value.
///
/// ```swift
/// let catalog = try await $catalog.value(revalidating: { previous in
///     let response = try await client.catalog(ifNoneMatch: previous?.etag)
///     return response.status == 304 ? .notModified : .modified(try response.decoded())
/// })
/// ```
///
/// "Not modified" is a success that keeps the value: its freshness starts again (as a new value's
/// would), the phase is a success dated now, and the value is not replaced — an observer hears
/// ``AsyncStateEvent/Kind/succeeded(duration:attempts:)`` then ``AsyncStateEvent/Kind/notModified``.
/// With no value to keep (the operation was given `nil`), the fetch fails with
/// ``AsyncStateError/notModifiedWithoutValue``.
public enum AsyncStateRevalidation<Value: Sendable>: Sendable {
    /// The source has a new value.
    case modified(Value)
    /// The value the operation was given is still current.
    case notModified

    /// What the attempt answered, for the machine (``AttemptResult``): "not modified" is a typed
    /// answer, never an error.
    @inlinable var result: AttemptResult<Value> {
        switch self {
        case .modified(let value): return .value(value)
        case .notModified: return .notModified
        }
    }
}

extension AsyncState {
    /// A conditional operation: given the value it would replace (`nil` when the state has none),
    /// it answers with a new value or ``AsyncStateRevalidation/notModified``.
    public typealias ConditionalOperation = @Sendable (Value?) async throws -> AsyncStateRevalidation<Value>

    /// Returns the value like ``value(retry:_:)``, fetching it, when needed, with a conditional
    /// operation (see ``AsyncStateRevalidation``): it is given the value it would replace, and may
    /// answer that it is still current, which renews its freshness without replacing it.
    ///
    /// - Parameters:
    ///   - retry: The retry policy for a fetch this call starts; `nil` for the state's.
    ///   - operation: Given the value it would replace, when it runs; answers a new one or
    ///     ``AsyncStateRevalidation/notModified``.
    /// - Throws: What ``value(retry:_:)`` throws; ``AsyncStateError/notModifiedWithoutValue`` when the
    ///   operation answered "not modified" with no value to keep.
    @inlinable
    public nonisolated(nonsending) func value(
        retry: RetryPolicy? = nil, revalidating operation: @escaping ConditionalOperation
    ) async throws -> Value {
        if let fresh = store.hit(\.value) { return fresh }
        return try await fetchFromStore(.value, conditional(operation), retry: retry)
    }

    /// Fetches now, fresh or not, like ``refresh(retry:_:)``, with a conditional operation (see
    /// ``value(retry:revalidating:)``).
    public nonisolated(nonsending) func refresh(
        retry: RetryPolicy? = nil, revalidating operation: @escaping ConditionalOperation
    ) async {
        _ = try? await store.fetch(.refresh, policy: retry, storeOperation(conditional(operation)))
    }

    /// Refreshes every `interval` like ``run(every:retry:_:)``, with a conditional operation (see
    /// ``value(retry:revalidating:)``): a poll that costs the source a `304` while nothing changed.
    public nonisolated(nonsending) func run(
        every interval: Duration, retry: RetryPolicy? = nil, revalidating operation: @escaping ConditionalOperation
    ) async throws {
        try await run(every: interval, retry: retry, operation: conditional(operation))
    }

    /// The operation a conditional one runs as: given the value its attempt replaces (the machine's
    /// ``AttemptInput/previous``), it answers a value or "not modified".
    @inlinable func conditional(_ operation: @escaping ConditionalOperation) -> AsyncStateStore<Value>.Operation {
        .reading { input in try await operation(input.previous).result }
    }
}

extension AsyncStateFamily {
    /// A conditional operation: given a key and the value it would replace (`nil` when the key has
    /// none), it answers with a new value or ``AsyncStateRevalidation/notModified``.
    public typealias ConditionalOperation = @Sendable (Key, Value?) async throws -> AsyncStateRevalidation<Value>

    /// Returns `key`'s value like ``value(for:retry:_:)``, fetching it, when needed, with a
    /// conditional operation, as ``AsyncState/value(retry:revalidating:)`` does.
    ///
    /// - Throws: What ``AsyncState/value(retry:revalidating:)`` throws.
    @inlinable
    public nonisolated(nonsending) func value(
        for key: Key, retry: RetryPolicy? = nil, revalidating operation: @escaping ConditionalOperation
    ) async throws -> Value {
        if let fresh = core.freshValue(of: key, at: core.clock.now()) { return fresh }
        return try await fetchFromStore(key, .value, retry: retry, conditional(operation))
    }

    /// Fetches `key` now, fresh or not, like ``refresh(for:retry:_:)``, with a conditional operation.
    public nonisolated(nonsending) func refresh(
        for key: Key, retry: RetryPolicy? = nil, revalidating operation: @escaping ConditionalOperation
    ) async {
        await core.using(key) { store in
            _ = try? await fetch(key, from: store, .refresh, retry: retry, .conditional(operation))
        }
    }

    /// The operation a conditional one runs as: it reads the value its attempt replaces (the
    /// machine's ``AttemptInput/previous``).
    @inlinable func conditional(_ operation: @escaping ConditionalOperation) -> KeyedOperation {
        .conditional(operation)
    }
}
