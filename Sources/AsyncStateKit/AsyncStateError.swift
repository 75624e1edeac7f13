/// Errors ``AsyncState`` itself reports (as opposed to errors thrown by your operations).
public enum AsyncStateError: Error, Sendable, Hashable, CustomStringConvertible {
    /// An operation called ``AsyncState/value(retry:_:)`` on the state it is fetching for (directly
    /// or through other states). Waiting for its own result would never end, so the call throws this
    /// at once.
    case reentrantCall

    /// An attempt ran longer than the state's `timeout` and was cancelled. It counts as a failure,
    /// which the retry policy may retry.
    case timedOut(after: Duration)

    /// The state did not start its operation because ``AsyncStateLimits/abandonedOperations``
    /// operations that timed out are still running (they ignore cancellation). It starts operations
    /// again as soon as one of them returns.
    case tooManyAbandonedOperations(limit: Int)

    /// ``AsyncState/run(every:retry:_:)`` was given a zero or negative interval, which would refresh
    /// without pause.
    case invalidInterval(Duration)

    /// A batch operation (``AsyncStateFamily/values(for:retry:_:)``) returned no value for a key it
    /// was asked for. That key's fetch fails with this error; the other keys are unaffected.
    case missingFromBatch

    /// A conditional operation (``AsyncState/value(retry:revalidating:)``) answered
    /// ``AsyncStateRevalidation/notModified`` when the state had no value to keep. The fetch fails
    /// with this error, which the retry policy may retry (the operation is then given no value again).
    case notModifiedWithoutValue

    /// A walk over a paged state's listing (``AsyncPagedState/allPages(retry:_:)``) needed the page at
    /// this index, which the state no longer keeps: its `maxPages` dropped it after other callers
    /// read further.
    case pageNoLongerKept(Int)

    /// A readable explanation.
    public var description: String {
        switch self {
        case .reentrantCall:
            return
                "AsyncState.value(_:) was called from inside an operation of the same state; it would wait for itself"
        case .timedOut(let timeout):
            return "the operation did not finish within its timeout of \(timeout)"
        case .tooManyAbandonedOperations(let limit):
            return "not started: \(limit) operations that timed out are still running (they ignore cancellation)"
        case .invalidInterval(let interval):
            return "run(every:) needs a positive interval, not \(interval)"
        case .missingFromBatch:
            return "the batch operation returned no value for this key"
        case .notModifiedWithoutValue:
            return "the operation answered “not modified” but there was no value to keep"
        case .pageNoLongerKept(let index):
            return "page \(index) of the listing is no longer kept (maxPages dropped it)"
        }
    }
}

/// What `snapshot(retry:_:)` throws of an error its fetch ended with: `CancellationError` when the
/// caller's task is cancelled, and the errors no fetch ran to put in the phase (a reentrant call, too
/// many abandoned operations). The others are in the snapshot's phase.
@usableFromInline
func rethrowIfNotInPhase(_ error: any Error) throws {
    try Task.checkCancellation()
    switch error as? AsyncStateError {
    case .reentrantCall, .tooManyAbandonedOperations: throw error
    default: return
    }
}
