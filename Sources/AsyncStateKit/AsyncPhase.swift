public import Foundation

/// Where a fetched value stands: never fetched, being fetched, fetched and empty, fetched, or failed.
///
/// One enum instead of `isLoading`, `error` and `data` flags that can contradict each other (the idea
/// of Elm's `RemoteData`). The phase says what the *last fetch* did; the value is kept separately, so
/// during ``loading`` and after ``failure(_:)`` the previous value stays readable.
///
/// ```swift
/// switch $forecast.phase {
/// case .initial: print("not fetched yet")
/// case .loading: print("fetching…")
/// case .empty: print("no forecast today")
/// case .success(let date): print("forecast from \(date): \(forecast)")
/// case .failure(let error): print("failed: \(error); showing \(forecast)")
/// }
/// ```
public enum AsyncPhase: Sendable {
    /// Never fetched (or reset since).
    case initial
    /// A fetch is in flight; the previous value stays readable.
    case loading
    /// The last fetch succeeded with an empty value (an empty collection, `nil`, or what the state's
    /// `isEmpty` predicate says). Empty is an answer, not "still loading": it stays fresh like success.
    case empty
    /// The last fetch succeeded at this wall date (under `VirtualClock`, the clock's `date`).
    case success(Date)
    /// The last fetch failed with this error (after any automatic retries).
    case failure(any Error)

    /// Whether a fetch is in flight.
    public var isLoading: Bool {
        if case .loading = self { return true }
        return false
    }

    /// The date of the success this phase reports, if it is ``success(_:)``.
    public var lastUpdated: Date? {
        if case .success(let date) = self { return date }
        return nil
    }

    /// The error this phase reports, if it is ``failure(_:)``.
    public var error: (any Error)? {
        if case .failure(let error) = self { return error }
        return nil
    }

    /// The phase without its payload: equatable, hashable and enumerable, for comparisons, `switch`es
    /// and metric labels (the error of ``failure(_:)`` is not comparable, so the phase itself is not
    /// `Equatable`).
    public var kind: Kind {
        switch self {
        case .initial: return .initial
        case .loading: return .loading
        case .empty: return .empty
        case .success: return .success
        case .failure: return .failure
        }
    }

    /// The kinds of ``AsyncPhase``, without their payloads (see ``AsyncPhase/kind``). The raw value is
    /// the case's name, for labels and logs: `"initial"`, `"loading"`, `"empty"`, `"success"`,
    /// `"failure"`.
    public enum Kind: String, Hashable, CaseIterable, Sendable, CustomStringConvertible {
        /// ``AsyncPhase/initial``.
        case initial
        /// ``AsyncPhase/loading``.
        case loading
        /// ``AsyncPhase/empty``.
        case empty
        /// ``AsyncPhase/success(_:)``, whatever its date.
        case success
        /// ``AsyncPhase/failure(_:)``, whatever its error.
        case failure

        /// The case's name.
        public var description: String { rawValue }
    }

    /// Whether the last fetch succeeded (``success(_:)`` or ``empty``).
    public var hasSucceeded: Bool {
        switch self {
        case .success, .empty: return true
        case .initial, .loading, .failure: return false
        }
    }
}

extension AsyncPhase: CustomStringConvertible {
    /// A short form for logs: `initial`, `loading`, `empty`, `success(<date>)`, `failure(<error>)`.
    public var description: String {
        switch self {
        case .initial: return "initial"
        case .loading: return "loading"
        case .empty: return "empty"
        case .success(let date): return "success(\(date))"
        case .failure(let error): return "failure(\(error))"
        }
    }
}
