import Foundation

/// The first of a call's result, its timeout and its caller's cancellation to arrive resumes the
/// waiting caller; the others are dropped.
final class Race<T: Sendable>: Sendable {
    private struct State {
        var continuation: UnsafeContinuation<Result<T, any Error>, Never>?
        var result: Result<T, any Error>?
        var cleanup: (@Sendable () -> Void)?
        var finished = false
    }
    private let state = LockedValue(State())

    /// Registers the waiting caller (a result that came first is delivered now).
    func begin(_ continuation: UnsafeContinuation<Result<T, any Error>, Never>) {
        let early = state.withLock { state -> Result<T, any Error>? in
            if let result = state.result { return result }
            state.continuation = continuation
            return nil
        }
        if let early { continuation.resume(returning: early) }
    }

    /// Runs `cleanup` once the race is decided (now, if it is).
    func onFinish(_ cleanup: @escaping @Sendable () -> Void) {
        let now = state.withLock { state -> Bool in
            if state.finished { return true }
            state.cleanup = cleanup
            return false
        }
        if now { cleanup() }
    }

    /// Decides the race with `result` unless it is decided.
    func finish(_ result: Result<T, any Error>) {
        let (continuation, cleanup) = state.withLock {
            state -> (UnsafeContinuation<Result<T, any Error>, Never>?, (@Sendable () -> Void)?) in
            guard !state.finished else { return (nil, nil) }
            state.finished = true
            state.result = result
            defer { (state.continuation, state.cleanup) = (nil, nil) }
            return (state.continuation, state.cleanup)
        }
        continuation?.resume(returning: result)
        cleanup?()
    }
}
