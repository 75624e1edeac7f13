public import Foundation

/// A clock that knows the wall date matching its `now`.
///
/// `@AsyncState` stamps ``AsyncPhase/success(_:)`` with the clock's ``date`` when the clock has one, so
/// that under a test clock (`VirtualClock` conforms) the date is exact and assertable. For other clocks
/// it uses `Date()`.
public protocol DatedClock: Clock {
    /// The wall date at this clock's `now`.
    var date: Date { get }
}
