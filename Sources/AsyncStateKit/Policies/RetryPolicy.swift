import Foundation

/// How a failed fetch is retried: how many attempts, how long to wait between them, with how much
/// jitter, which errors are worth retrying, and within what overall budget.
///
/// The default is ``never``: one attempt, no retry — the server default of TanStack Query, where retry
/// storms hurt. Every wait happens on the state's clock, so a `VirtualClock` test sees the exact
/// instants; jitter is drawn from a generator seeded with ``seed``, so a schedule replays exactly.
///
/// ```swift
/// @AsyncState(retry: .exponential(maxAttempts: 4, initial: .seconds(1), cap: .seconds(30), jitter: .full))
/// var prices: [Price] = []
///
/// // Don't retry what retrying cannot fix:
/// let policy = RetryPolicy.exponential().retrying { error in (error as? HTTPError)?.status != 404 }
/// ```
///
/// Bad values are clamped, never trapped on: `maxAttempts` below 1 is 1; negative durations are
/// zero and durations longer than ``AsyncStateLimits/maximumDuration`` are that; a multiplier below 1
/// (or not a number) is 1; a `cap` below the initial delay caps every delay; a zero or negative
/// `budget` allows no retry.
public struct RetryPolicy: Sendable {
    /// The shape of the delay before each retry, before jitter.
    public enum Backoff: Sendable, Hashable {
        /// The same delay before every retry.
        case constant(Duration)
        /// `initial`, then `initial + increment`, `initial + 2·increment`, … at most `cap`.
        case linear(initial: Duration, increment: Duration, cap: Duration)
        /// `initial`, then `initial·multiplier`, `initial·multiplier²`, … at most `cap`.
        case exponential(initial: Duration, multiplier: Double, cap: Duration)

        /// The delay before retry number `retry` (1 for the first retry), clamped as the type says.
        ///
        /// Every duration is clamped to `0...AsyncStateLimits.maximumDuration` first, and the growth
        /// is capped before it can overflow: no backoff traps, whatever it is given.
        public func delay(beforeRetry retry: Int) -> Duration {
            let steps = max(1, retry) - 1
            switch self {
            case .constant(let delay):
                return delay.clampedToLimits
            case .linear(let initial, let increment, let cap):
                let (initial, increment, cap) = (
                    initial.clampedToLimits, increment.clampedToLimits, cap.clampedToLimits
                )
                // Compare the number of steps with how many fit under the cap before multiplying.
                guard initial < cap else { return cap }
                guard increment > .zero, Double(steps) < (cap - initial) / increment else {
                    return increment > .zero && steps > 0 ? cap : initial
                }
                return min(initial + increment * steps, cap)
            case .exponential(let initial, let multiplier, let cap):
                let cap = cap.clampedToLimits
                let seconds = initial.clampedToLimits.timeInterval * pow(max(1, multiplier), Double(steps))
                guard seconds.isFinite, seconds < cap.timeInterval else { return cap }
                return Duration.seconds(seconds).clampedToLimits
            }
        }
    }

    /// How the delay is randomized, so that many clients do not retry in lockstep (TanStack/query#372).
    public enum Jitter: Sendable, Hashable {
        /// The delay as the backoff computed it.
        case none
        /// Uniform between zero and the delay (AWS's "full jitter").
        case full
        /// Half the delay plus uniform between zero and the other half (AWS's "equal jitter").
        case equal
    }

    /// The fields, in one immutable box: a policy is stored in every state and every flight, and
    /// this keeps it one word wide. Setters replace the box.
    private final class Storage: Sendable {
        let maxAttempts: Int
        let backoff: Backoff
        let jitter: Jitter
        let seed: UInt64?
        let budget: Duration?
        let shouldRetry: @Sendable (any Error) -> Bool

        init(
            maxAttempts: Int, backoff: Backoff, jitter: Jitter, seed: UInt64?, budget: Duration?,
            shouldRetry: @escaping @Sendable (any Error) -> Bool
        ) {
            self.maxAttempts = max(1, maxAttempts)
            self.backoff = backoff
            self.jitter = jitter
            self.seed = seed
            self.budget = budget.map { $0 > .zero ? $0.clampedToLimits : .zero }
            self.shouldRetry = shouldRetry
        }

        func with(
            maxAttempts: Int? = nil, backoff: Backoff? = nil, jitter: Jitter? = nil, seed: UInt64?? = nil,
            budget: Duration?? = nil, shouldRetry: (@Sendable (any Error) -> Bool)? = nil
        ) -> Storage {
            Storage(
                maxAttempts: maxAttempts ?? self.maxAttempts, backoff: backoff ?? self.backoff,
                jitter: jitter ?? self.jitter, seed: seed ?? self.seed, budget: budget ?? self.budget,
                shouldRetry: shouldRetry ?? self.shouldRetry)
        }
    }

    private var storage: Storage

    /// How many attempts in all, the first included; at least 1 (smaller values are clamped to 1).
    public var maxAttempts: Int {
        get { storage.maxAttempts }
        set { storage = storage.with(maxAttempts: newValue) }
    }
    /// The delay before each retry.
    public var backoff: Backoff {
        get { storage.backoff }
        set { storage = storage.with(backoff: newValue) }
    }
    /// How the delay is randomized.
    public var jitter: Jitter {
        get { storage.jitter }
        set { storage = storage.with(jitter: newValue) }
    }
    /// The seed of the jitter generator: the same seed gives the same schedule. `nil` (the default)
    /// draws a fresh seed for every fetch, so that many states do not retry in lockstep.
    public var seed: UInt64? {
        get { storage.seed }
        set { storage = storage.with(seed: .some(newValue)) }
    }
    /// The longest time from the start of a fetch within which a retry may still start; `nil` for
    /// no limit.
    public var budget: Duration? {
        get { storage.budget }
        set { storage = storage.with(budget: .some(newValue)) }
    }
    /// Whether an error is worth retrying. `CancellationError` is never retried (cancellation is
    /// not a failure).
    public var shouldRetry: @Sendable (any Error) -> Bool {
        get { storage.shouldRetry }
        set { storage = storage.with(shouldRetry: newValue) }
    }

    /// Creates a policy.
    ///
    /// - Parameters:
    ///   - maxAttempts: Attempts in all, the first included. Values below 1 mean 1.
    ///   - backoff: The delay before each retry. Defaults to a constant second.
    ///   - jitter: How the delay is randomized. Defaults to ``Jitter/none``.
    ///   - seed: The jitter generator's seed, for schedules that replay exactly (tests). Defaults to
    ///     `nil`: a fresh seed for every fetch.
    ///   - budget: The longest time from the start of a fetch within which a retry may start.
    ///   - shouldRetry: Whether an error is worth retrying. Defaults to every error.
    public init(
        maxAttempts: Int,
        backoff: Backoff = .constant(.seconds(1)),
        jitter: Jitter = .none,
        seed: UInt64? = nil,
        budget: Duration? = nil,
        shouldRetry: @escaping @Sendable (any Error) -> Bool = { _ in true }
    ) {
        storage = Storage(
            maxAttempts: maxAttempts, backoff: backoff, jitter: jitter, seed: seed, budget: budget,
            shouldRetry: shouldRetry)
    }

    /// No retry: one attempt. The default.
    public static var never: RetryPolicy { noRetry }

    /// The one ``never`` every state shares, rather than a box of its own (its storage is immutable).
    private static let noRetry = RetryPolicy(maxAttempts: 1)

    /// TanStack Query's client default: 3 retries (4 attempts), waiting `min(1 s · 2ⁿ, 30 s)`.
    public static var tanStack: RetryPolicy {
        exponential(maxAttempts: 4, initial: .seconds(1), multiplier: 2, cap: .seconds(30))
    }

    /// Exponential backoff: `initial`, `initial·multiplier`, … at most `cap`.
    public static func exponential(
        maxAttempts: Int = 4, initial: Duration = .seconds(1), multiplier: Double = 2, cap: Duration = .seconds(30),
        jitter: Jitter = .none, seed: UInt64? = nil, budget: Duration? = nil
    ) -> RetryPolicy {
        RetryPolicy(
            maxAttempts: maxAttempts, backoff: .exponential(initial: initial, multiplier: multiplier, cap: cap),
            jitter: jitter, seed: seed, budget: budget)
    }

    /// This policy, retrying only the errors for which `predicate` is true.
    public func retrying(when predicate: @escaping @Sendable (any Error) -> Bool) -> RetryPolicy {
        var policy = self
        policy.shouldRetry = predicate
        return policy
    }

    /// The delay before retry number `retry`, with jitter drawn from `generator`.
    @usableFromInline
    func delay(beforeRetry retry: Int, using generator: inout some RandomNumberGenerator) -> Duration {
        let delay = backoff.delay(beforeRetry: retry)
        let nanoseconds = delay.wholeNanoseconds
        switch jitter {
        case .none:
            return delay
        case .full:
            return .nanoseconds(Int64.random(in: 0...nanoseconds, using: &generator))
        case .equal:
            let half = nanoseconds / 2
            return .nanoseconds(nanoseconds - half + Int64.random(in: 0...half, using: &generator))
        }
    }
}
