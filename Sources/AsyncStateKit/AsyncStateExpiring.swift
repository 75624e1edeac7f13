/// A value that says how long it stays fresh: an HTTP response's `Cache-Control: max-age`, a token's
/// remaining lifetime, a feed's own refresh interval.
///
/// A state, a family or a paged state whose value conforms uses the value's ``timeToLive`` instead
/// of its declared `expiry`, for that value, from the instant it arrives (a fetch's success, a `set`,
/// a "not modified" that keeps it). No parameter turns it on: conforming is the opt-in, and a type
/// that does not conform pays nothing. `Optional` conforms when its wrapped type does (a `nil` value
/// has none), and so does ``AsyncPages`` (the first page's ``AsyncPage/timeToLive``).
///
/// ```swift
/// struct Quote: Sendable, AsyncStateExpiring {
///     var price: Decimal
///     var maxAge: Int  // seconds, from the response's Cache-Control header
///     var timeToLive: Duration? { .seconds(maxAge) }
/// }
/// ```
///
/// The rules:
/// - `nil` means the declared `expiry`. Zero or less means never fresh (as an `expiry` of zero: every
///   read fetches); a longer lifetime than ``AsyncStateLimits/maximumDuration`` is that maximum.
/// - It is read once per value arrival, under the state's lock, so it must be quick and must not
///   call back into the state. A lifetime computed from a date (`expiresAt.timeIntervalSinceNow`) is
///   measured then, on the wall clock, not on the state's clock.
/// - Refresh ahead (`refreshAfter:`) starts as long before the value's own expiry as it would before
///   the declared one (`expiry − refreshAfter` before it). A value whose lifetime is not longer than
///   that lead is not refreshed ahead: it expires, and the next read fetches.
/// - `hasExpired(in:)` still measures the data's age, and fail-safe's `maxStaleAge` the value's age:
///   neither depends on how long the value said it stays fresh.
/// - A family's compact entries keep a value's own expiry at no cost in memory.
public protocol AsyncStateExpiring {
    /// How long this value stays fresh from its arrival; `nil` for the state's declared `expiry`.
    var timeToLive: Duration? { get }
}

extension Optional: AsyncStateExpiring where Wrapped: AsyncStateExpiring {
    /// The wrapped value's time to live; `nil` for `nil`.
    public var timeToLive: Duration? { self?.timeToLive }
}
